//! What the store keeps about the coordinator's cluster: the replicas that announce
//! themselves, the lease on each shard (with its fencing token), and the recent handovers
//! (docs/design.md, "Shards, leases and routing").

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A coordinator replica, as its last heartbeat announced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Replica {
    /// Its id (unique per process start).
    pub id: String,
    /// Where its HTTP API listens, as others can reach it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// When it started, Unix ms.
    pub started_at: u64,
    /// Its last heartbeat, Unix ms.
    pub heartbeat_at: u64,
}

/// The lease on one shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The shard.
    pub shard: u16,
    /// The replica holding it (empty once released).
    pub owner: String,
    /// The fencing token: one more each time the shard changes hands; a write carries it.
    pub token: u64,
    /// When it runs out unless renewed, Unix ms (0 once released).
    pub expires_at: u64,
}

impl Lease {
    /// Whether `owner` holds it at `now`.
    pub fn held_by(&self, owner: &str, now: u64) -> bool {
        self.owner == owner && self.expires_at > now
    }

    /// Whether anyone holds it at `now`.
    pub fn is_held(&self, now: u64) -> bool {
        !self.owner.is_empty() && self.expires_at > now
    }
}

/// A shard changing hands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    /// The shard.
    pub shard: u16,
    /// The replica that had it (none: it was free).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The replica that has it now (none: released and not yet taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// When, Unix ms.
    pub at: u64,
    /// Why: `released` (a graceful handover: rebalancing or shutdown), `expired` (the owner
    /// stopped renewing: it died or was cut off), `free` (no owner before).
    pub reason: String,
}

/// How many handovers the store keeps (the newest).
pub const HANDOVERS_KEPT: usize = 256;
