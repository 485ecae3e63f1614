//! The Redis key of each record and index (the table in the module's docs).

use std::sync::Arc;

use imagepipe_contracts::shard::shard_of;
use imagepipe_runtime::dedup::slot::{hash_slot, tag_of_slot};

use super::RedisStore;
use crate::task::TaskState;

impl RedisStore {
    /// The shard of task `id` under the store's shard count.
    pub(super) fn shard(&self, id: &str) -> u16 {
        shard_of(id, self.shards)
    }

    /// The hash tag of shard `shard`'s lease, `{P:s<shard>}`: its slot is the shard's.
    fn shard_tag(&self, shard: u16) -> String {
        shard_tag(&self.prefix, shard)
    }

    /// The start of the keys of each of `shards` shards' tasks: `P:{<tag>}`, `<tag>` the
    /// shortest hash tag of the shard's slot ([`tag_of_slot`]), so that the prefix is in a
    /// task's keys once. Tags of two shards in one slot are the same: a task's keys are told
    /// apart by its id.
    pub(super) fn slot_prefixes(prefix: &str, shards: u16) -> Arc<[String]> {
        (0..shards)
            .map(|shard| format!("{prefix}:{{{}}}", tag_of_slot(hash_slot(shard_tag(prefix, shard).as_bytes()))))
            .collect()
    }

    /// The start of the keys of shard `shard`'s tasks (see [`slot_prefixes`](Self::slot_prefixes)).
    fn shard_slot(&self, shard: u16) -> &str {
        &self.slot_prefixes[usize::from(shard)]
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

    /// The lease on shard `shard`, `P:{P:s<shard>}:lease`, in the slot of the shard's tasks (the
    /// transition script checks it as it writes).
    pub(super) fn lease_key(&self, shard: u16) -> String {
        format!("{}:{}:lease", self.prefix, self.shard_tag(shard))
    }

    /// The key `kind` (`task`, `hist`, `history`, `outbox`) of task `id` in layout 2, tagged with
    /// its shard's lease tag: `P:{P:s<shard>}:<kind>:<id>`.
    pub(super) fn layout_2_key(&self, kind: &str, id: &str) -> String {
        format!("{}:{}:{kind}:{id}", self.prefix, self.shard_tag(self.shard(id)))
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

/// The hash tag of shard `shard`'s lease under `prefix`, `{P:s<shard>}`.
fn shard_tag(prefix: &str, shard: u16) -> String {
    format!("{{{prefix}:s{shard}}}")
}
