//! The shards this replica holds: written by the lease loop, read by the engine (which
//! fences every write with the lease's token) and by the intake (which reads the partitions
//! of exactly these shards).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use imagepipe_contracts::shard::shard_of;
use tokio::sync::watch;

use crate::machine::Fence;
use crate::store::Lease;

/// A set of owned shards, numbered: each change of the set has a higher generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owned {
    /// Bumped on every change of `shards`.
    pub generation: u64,
    /// The shards.
    pub shards: Arc<BTreeSet<u16>>,
}

/// The leases this replica holds, shared by its lease loop, engine and intake. Cheap to clone.
#[derive(Clone)]
pub struct Ownership(Arc<Inner>);

struct Inner {
    replica: String,
    shards: u16,
    leases: RwLock<BTreeMap<u16, Lease>>,
    owned: watch::Sender<Owned>,
    /// The generation the intake reads by: it stopped reading every shard not in that set.
    drained: watch::Sender<u64>,
}

impl Ownership {
    /// Replica `replica`'s view of `shards` shards, holding none yet.
    pub fn new(replica: impl Into<String>, shards: u16) -> Self {
        Self(Arc::new(Inner {
            replica: replica.into(),
            shards,
            leases: RwLock::default(),
            owned: watch::Sender::new(Owned::default()),
            drained: watch::Sender::new(0),
        }))
    }

    /// This replica's id.
    pub fn replica(&self) -> &str {
        &self.0.replica
    }

    /// How many shards there are.
    pub fn shard_count(&self) -> u16 {
        self.0.shards
    }

    /// The shard of task `id`.
    pub fn shard_of(&self, id: &str) -> u16 {
        shard_of(id, self.0.shards)
    }

    /// The fence a write of task `id` carries at `now`, or the task's shard when this
    /// replica does not hold its lease (or holds one that has run out by its clock).
    pub fn fence(&self, id: &str, now: u64) -> Result<Fence, u16> {
        let shard = self.shard_of(id);
        let leases = self.0.leases.read().unwrap_or_else(PoisonError::into_inner);
        match leases.get(&shard) {
            Some(lease) if lease.expires_at > now => Ok(Fence { shard, token: lease.token, now }),
            _ => Err(shard),
        }
    }

    /// Whether this replica holds shard `shard`'s lease (its last renewal said so).
    pub fn owns(&self, shard: u16) -> bool {
        self.0.leases.read().unwrap_or_else(PoisonError::into_inner).contains_key(&shard)
    }

    /// The leases held, by shard.
    pub fn leases(&self) -> BTreeMap<u16, Lease> {
        self.0.leases.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The owned shards, as a watch that changes with them.
    pub fn watch(&self) -> watch::Receiver<Owned> {
        self.0.owned.subscribe()
    }

    /// The owned shards now, in order (what a store call over this replica's shards takes).
    pub fn shards(&self) -> Vec<u16> {
        self.0.owned.borrow().shards.iter().copied().collect()
    }

    /// The owned shards now.
    pub fn owned(&self) -> Owned {
        self.0.owned.borrow().clone()
    }

    /// Holds exactly `leases` from now on; returns the generation of the owned set (a new one
    /// when the set of shards changed).
    pub fn hold(&self, leases: BTreeMap<u16, Lease>) -> u64 {
        let shards: BTreeSet<u16> = leases.keys().copied().collect();
        metrics::gauge!(crate::metrics::SHARDS_OWNED).set(shards.len() as f64);
        *self.0.leases.write().unwrap_or_else(PoisonError::into_inner) = leases;
        let mut generation = 0;
        self.0.owned.send_if_modified(|owned| {
            generation = owned.generation;
            if *owned.shards == shards {
                return false;
            }
            owned.generation += 1;
            owned.shards = Arc::new(shards);
            generation = owned.generation;
            true
        });
        generation
    }

    /// Forgets the lease on `shard` at once (the store refused a write under it: another
    /// replica took it).
    pub fn lose(&self, shard: u16) {
        let mut leases = self.leases();
        if leases.remove(&shard).is_some() {
            tracing::warn!(shard, "lease on shard lost: another replica took it");
            self.hold(leases);
        }
    }

    /// Lets go of the leases that ran out by `now` (this replica's clock) before they were
    /// renewed (the store failed or did not answer), so that the intake stops pulling the inputs
    /// of shards another replica may own by now; the lease loop's next period that reaches the
    /// store takes its share again. Returns how many were let go.
    pub fn lapse(&self, now: u64) -> usize {
        let mut leases = self.leases();
        let before = leases.len();
        leases.retain(|_, lease| lease.expires_at > now);
        let lapsed = before - leases.len();
        if lapsed > 0 {
            tracing::warn!(lapsed, "leases ran out before they were renewed; their shards are no longer read here");
            self.hold(leases);
        }
        lapsed
    }

    /// The intake reads by generation `generation` now.
    pub fn drained(&self, generation: u64) {
        self.0.drained.send_if_modified(|at| {
            let newer = generation > *at;
            if newer {
                *at = generation;
            }
            newer
        });
    }

    /// Waits until the intake reads by generation `generation` or a later one, at most
    /// `timeout`; whether it does.
    pub async fn wait_drained(&self, generation: u64, timeout: Duration) -> bool {
        let mut drained = self.0.drained.subscribe();
        tokio::time::timeout(timeout, drained.wait_for(|at| *at >= generation)).await.is_ok_and(|r| r.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(shard: u16, token: u64, expires_at: u64) -> Lease {
        Lease { shard, owner: "a".into(), token, expires_at }
    }

    #[test]
    fn a_write_is_fenced_by_the_lease_of_its_tasks_shard() {
        let ownership = Ownership::new("a", 4);
        let id = "tsk_1";
        let shard = ownership.shard_of(id);
        assert_eq!(ownership.fence(id, 10), Err(shard));
        ownership.hold(BTreeMap::from([(shard, lease(shard, 7, 100))]));
        assert_eq!(ownership.fence(id, 10), Ok(Fence { shard, token: 7, now: 10 }));
        assert_eq!(ownership.fence(id, 100), Err(shard), "a lease run out by this replica's clock fences nothing");
        ownership.lose(shard);
        assert_eq!(ownership.fence(id, 10), Err(shard));
    }

    #[test]
    fn the_generation_moves_only_when_the_shards_change() {
        let ownership = Ownership::new("a", 4);
        let first = ownership.hold(BTreeMap::from([(1, lease(1, 1, 100))]));
        let renewed = ownership.hold(BTreeMap::from([(1, lease(1, 1, 200))]));
        assert_eq!(first, renewed);
        let more = ownership.hold(BTreeMap::from([(1, lease(1, 1, 200)), (2, lease(2, 1, 200))]));
        assert_eq!(more, first + 1);
    }

    #[tokio::test]
    async fn waiting_for_the_intake_ends_when_it_reports_or_times_out() {
        let ownership = Ownership::new("a", 4);
        assert!(!ownership.wait_drained(1, Duration::from_millis(10)).await);
        ownership.drained(2);
        assert!(ownership.wait_drained(1, Duration::from_millis(10)).await);
    }
}
