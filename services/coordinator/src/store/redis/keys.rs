//! The Redis key of each record and index (the table in the module's docs).

use super::RedisStore;
use crate::task::TaskState;

impl RedisStore {
    pub(super) fn task_key(&self, id: &str) -> String {
        format!("{}:task:{{{id}}}", self.prefix)
    }

    pub(super) fn history_key(&self, id: &str) -> String {
        format!("{}:hist:{{{id}}}", self.prefix)
    }

    /// The history stream of a store written before [`history_key`](Self::history_key) lists.
    pub(super) fn legacy_history_key(&self, id: &str) -> String {
        format!("{}:history:{{{id}}}", self.prefix)
    }

    pub(super) fn outbox_key(&self, id: &str) -> String {
        format!("{}:outbox:{{{id}}}", self.prefix)
    }

    pub(super) fn idem_key(&self, key: &str) -> String {
        format!("{}:idem:{{{key}}}", self.prefix)
    }

    pub(super) fn index_key(&self, name: &str) -> String {
        format!("{p}:{{{p}:idx}}:{name}", p = self.prefix)
    }

    pub(super) fn blob_key(&self, key: &str) -> String {
        self.index_key(&format!("blob:{key}"))
    }

    pub(super) fn task_blobs_key(&self, id: &str) -> String {
        self.index_key(&format!("task_blobs:{id}"))
    }

    pub(super) fn state_key(&self, state: TaskState) -> String {
        self.index_key(&format!("state:{}", state.as_str()))
    }

    pub(super) fn dlq_key(&self, name: &str) -> String {
        format!("{p}:{{{p}:dlq}}:{name}", p = self.prefix)
    }
}
