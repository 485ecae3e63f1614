//! The Redis key of each record and index (the table in the module's docs).

use imagepipe_contracts::shard::shard_of;

use super::RedisStore;
use crate::task::TaskState;

impl RedisStore {
    /// The shard of task `id` under the store's shard count.
    pub(super) fn shard(&self, id: &str) -> u16 {
        shard_of(id, self.shards)
    }

    /// The start of every key in shard `shard`'s hash slot: `P:{P:s<shard>}`.
    fn shard_slot(&self, shard: u16) -> String {
        format!("{p}:{{{p}:s{shard}}}", p = self.prefix)
    }

    pub(super) fn task_key(&self, id: &str) -> String {
        format!("{}:task:{id}", self.shard_slot(self.shard(id)))
    }

    /// The history list of a store written before the task hash's `hist` field kept it.
    pub(super) fn history_key(&self, id: &str) -> String {
        format!("{}:hist:{id}", self.shard_slot(self.shard(id)))
    }

    /// The history stream of a store written before [`history_key`](Self::history_key) lists.
    pub(super) fn legacy_history_key(&self, id: &str) -> String {
        format!("{}:history:{id}", self.shard_slot(self.shard(id)))
    }

    pub(super) fn outbox_key(&self, id: &str) -> String {
        format!("{}:outbox:{id}", self.shard_slot(self.shard(id)))
    }

    /// The lease on shard `shard`, in the slot of the shard's tasks (the transition script
    /// checks it as it writes).
    pub(super) fn lease_key(&self, shard: u16) -> String {
        format!("{}:lease", self.shard_slot(shard))
    }

    /// The keys of task `id` in the layout before shards (layout 1): `P:<kind>:{<id>}`, with
    /// `kind` one of `task`, `hist`, `history`, `outbox`.
    pub(super) fn unsharded_key(&self, kind: &str, id: &str) -> String {
        format!("{}:{kind}:{{{id}}}", self.prefix)
    }

    pub(super) fn idem_key(&self, key: &str) -> String {
        format!("{}:idem:{{{key}}}", self.prefix)
    }

    pub(super) fn index_key(&self, name: &str) -> String {
        format!("{p}:{{{p}:idx}}:{name}", p = self.prefix)
    }

    /// Shard `shard`'s part of index `name` (`due`, `claimed`, `queued`), in the index slot.
    pub(super) fn shard_index_key(&self, name: &str, shard: u16) -> String {
        self.index_key(&format!("{name}:s{shard}"))
    }

    pub(super) fn blob_key(&self, key: &str) -> String {
        self.index_key(&format!("blob:{key}"))
    }

    /// The set of the blobs task `id` referenced, as a store written before the `gone` field
    /// kept it (the expiry reads and deletes it).
    pub(super) fn task_blobs_key(&self, id: &str) -> String {
        self.index_key(&format!("task_blobs:{id}"))
    }

    pub(super) fn state_key(&self, state: TaskState) -> String {
        self.index_key(&format!("state:{}", state.as_str()))
    }

    pub(super) fn dlq_key(&self, name: &str) -> String {
        format!("{p}:{{{p}:dlq}}:{name}", p = self.prefix)
    }

    /// A key of the cluster slot: replicas and handovers.
    pub(super) fn cluster_key(&self, name: &str) -> String {
        format!("{p}:{{{p}:cluster}}:{name}", p = self.prefix)
    }
}
