//! Sharded coordination (docs/design.md, "Shards, leases and routing"): tasks are spread over
//! a fixed number of shards by a stable hash of their id; each coordinator replica owns a
//! share of the shards through leases in the store ([`LeaseLoop`], shared out by
//! [`balance::plan`]), handles only its shards' inputs, and fences every write with its
//! lease's token ([`Ownership::fence`]), so that a replica whose lease is gone writes nothing.

pub mod balance;
mod lease_loop;
mod ownership;
mod view;

#[cfg(test)]
mod tests;

use std::time::Duration;

pub use lease_loop::{LeaseLoop, reasons};
pub use ownership::{Owned, Ownership};
pub use view::{COUNT_LIMIT, ClusterView, ReplicaView, ShardView, cluster_view};

/// How a replica takes part in the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// How many shards there are (`coordinator.shards`).
    pub shards: u16,
    /// How long a lease lasts unless renewed (`coordinator.shard_lease`).
    pub lease: Duration,
    /// Where this replica's API is reached, as announced.
    pub address: Option<String>,
}

impl ClusterConfig {
    /// How often leases are renewed: five times per lease.
    pub fn renew_every(&self) -> Duration {
        self.lease / 5
    }

    /// How long a handover waits for the intake to stop reading the shards given up.
    pub fn drain_timeout(&self) -> Duration {
        self.lease / 2
    }
}

/// A new replica id: unique per process start, readable in logs (`<host>-<8 hex>`).
pub fn replica_id() -> String {
    let host = hostname();
    format!("{host}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// This machine's name (or `coordinator`), as replica ids and default addresses use it.
pub fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "coordinator".to_owned())
}
