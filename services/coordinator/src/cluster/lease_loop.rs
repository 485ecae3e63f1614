//! The lease loop: each period it announces this replica, works out the share-out of shards
//! ([`balance::plan`]), gives up what the plan gives others (after the intake stopped reading
//! it), renews what it keeps and takes what the plan gives it once free; leases that ran out
//! before they were renewed (the store failed or hung) are let go at once, so the intake stops
//! reading their shards; on shutdown it hands every shard over (release, not expiry) and
//! withdraws the replica.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use imagepipe_runtime::clock::Clock;
use imagepipe_runtime::error_text::error_chain;
use imagepipe_runtime::shutdown::Shutdown;
use metrics::counter;

use super::balance::{plan, share_of};
use super::{ClusterConfig, Ownership};
use crate::metrics as m;
use crate::store::{Handover, Lease, Replica, StoreError, TaskStore};

/// Why a shard changed hands (a [`Handover`]'s `reason`).
pub mod reasons {
    /// Its owner gave it up to rebalance.
    pub const RELEASED: &str = "released";
    /// Its owner gave it up as it stopped.
    pub const SHUTDOWN: &str = "shutdown";
    /// Its owner stopped renewing the lease (died, paused or cut off).
    pub const EXPIRED: &str = "expired";
    /// Nobody held it.
    pub const FREE: &str = "free";
}

/// Runs one replica's leases (see the module docs).
pub struct LeaseLoop {
    store: Arc<dyn TaskStore>,
    ownership: Ownership,
    clock: Arc<dyn Clock>,
    config: ClusterConfig,
    started_at: u64,
}

impl LeaseLoop {
    /// The lease loop of `ownership`'s replica over `store`.
    pub fn new(store: Arc<dyn TaskStore>, ownership: Ownership, clock: Arc<dyn Clock>, config: ClusterConfig) -> Self {
        let started_at = clock.unix_ms();
        Self { store, ownership, clock, config, started_at }
    }

    /// Runs until `shutdown`, then hands every shard over.
    pub async fn run(self, shutdown: Shutdown) {
        // The first period only announces: replicas started together see each other before
        // any of them takes shards, instead of one taking all and handing most back.
        let mut announced_only = true;
        loop {
            // A period that outlasts a lease (a store that does not answer) gives up waiting:
            // the leases it was to renew ran out meanwhile, and the others may hold them now.
            let failed = match tokio::time::timeout(self.config.lease, self.tick(announced_only)).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(error_chain(&e)),
                Err(_) => Some(format!("the store did not answer within a lease ({:?})", self.config.lease)),
            };
            if let Some(error) = failed {
                counter!(m::LEASE_ERRORS).increment(1);
                tracing::warn!(%error, "shard leases not renewed this period");
            }
            self.ownership.lapse(self.clock.unix_ms());
            announced_only = false;
            if !shutdown.sleep(self.config.renew_every()).await {
                break;
            }
        }
        self.hand_over().await;
    }

    fn me(&self) -> Replica {
        Replica {
            id: self.ownership.replica().to_owned(),
            address: self.config.address.clone(),
            started_at: self.started_at,
            heartbeat_at: self.clock.unix_ms(),
        }
    }

    /// One period: announce, plan, release, renew and take.
    pub async fn tick(&self, announce_only: bool) -> Result<(), StoreError> {
        let me = self.me();
        let now = me.heartbeat_at;
        self.store.heartbeat(&me, self.config.lease).await?;
        if announce_only {
            return Ok(());
        }
        let mut replicas: BTreeSet<String> = self.store.replicas(now).await?.into_iter().map(|r| r.id).collect();
        replicas.insert(me.id.clone());
        let leases: BTreeMap<u16, Lease> = self.store.leases().await?.into_iter().map(|l| (l.shard, l)).collect();
        let owners = leases.iter().filter(|(_, l)| l.is_held(now)).map(|(s, l)| (*s, l.owner.clone())).collect();
        let target = share_of(&plan(self.config.shards, &replicas, &owners), &me.id);

        let mut held = self.ownership.leases();
        // A lease this replica let run out (it was paused) is not its to give: only dropped.
        let giving: Vec<Lease> =
            held.values().filter(|l| !target.contains(&l.shard) && l.expires_at > now).cloned().collect();
        if held.keys().any(|shard| !target.contains(shard)) {
            held.retain(|shard, _| target.contains(shard));
            self.give_up(&giving, held.clone(), reasons::RELEASED).await?;
        }

        let wanted: Vec<u16> = target
            .iter()
            .copied()
            .filter(|s| held.contains_key(s) || !leases.get(s).is_some_and(|l| l.is_held(now) && l.owner != me.id))
            .collect();
        let taken = self.store.acquire_shards(&me.id, &wanted, now, self.config.lease).await?;
        let mut holding = BTreeMap::new();
        let mut handovers = Vec::new();
        for (shard, lease) in wanted.into_iter().zip(taken) {
            let Some(lease) = lease else { continue };
            // A new token is a new lease: also one this replica thought it still held (it was
            // paused, another took the shard and gave it back).
            if held.get(&shard).is_none_or(|h| h.token != lease.token) {
                let before = leases.get(&shard);
                let from = before.map(|l| l.owner.clone()).filter(|o| !o.is_empty() && *o != me.id);
                let reason = match (before, &from) {
                    (_, Some(_)) => reasons::EXPIRED,
                    (Some(l), None) if l.token > 0 => reasons::RELEASED,
                    _ => reasons::FREE,
                };
                counter!(m::HANDOVERS, "reason" => reason).increment(1);
                handovers.push(Handover { shard, from, to: Some(me.id.clone()), at: now, reason: reason.to_owned() });
            }
            holding.insert(shard, lease);
        }
        let lost = held.keys().filter(|s| !holding.contains_key(s)).count();
        if lost > 0 {
            tracing::warn!(lost, "leases another replica took while this one was not renewing");
        }
        self.ownership.hold(holding);
        if !handovers.is_empty() {
            tracing::info!(taken = handovers.len(), "shards taken over");
            self.store.record_handovers(&handovers).await?;
        }
        Ok(())
    }

    /// Stops the intake reading `giving` (holding `keep` instead), then releases their leases.
    async fn give_up(&self, giving: &[Lease], keep: BTreeMap<u16, Lease>, reason: &str) -> Result<(), StoreError> {
        let generation = self.ownership.hold(keep);
        if giving.is_empty() {
            return Ok(());
        }
        if !self.ownership.wait_drained(generation, self.config.drain_timeout()).await {
            tracing::warn!(generation, "the intake did not stop reading the shards given up in time; releasing anyway");
        }
        self.store.release_shards(self.ownership.replica(), giving).await?;
        let now = self.clock.unix_ms();
        let from = Some(self.ownership.replica().to_owned());
        let handovers: Vec<Handover> = giving
            .iter()
            .map(|l| Handover { shard: l.shard, from: from.clone(), to: None, at: now, reason: reason.to_owned() })
            .collect();
        counter!(m::HANDOVERS, "reason" => reason.to_owned()).increment(giving.len() as u64);
        tracing::info!(released = giving.len(), reason, "shards handed over");
        self.store.record_handovers(&handovers).await
    }

    /// Releases every lease held (the intake stopped first) and withdraws the replica.
    pub async fn hand_over(&self) {
        let giving: Vec<Lease> = self.ownership.leases().into_values().collect();
        if let Err(e) = self.give_up(&giving, BTreeMap::new(), reasons::SHUTDOWN).await {
            tracing::warn!(error = %error_chain(&e), "shards not released; the others take them when the leases run out");
        }
        if let Err(e) = self.store.leave(self.ownership.replica()).await {
            tracing::warn!(error = %error_chain(&e), "replica not withdrawn; it is forgotten when its announcement runs out");
        }
    }
}
