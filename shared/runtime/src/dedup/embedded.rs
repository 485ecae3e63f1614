//! [`EmbeddedDedup`]: a subscriber group's handled keys in its redb file under `store.path`
//! (`store.kind = embedded`), kept across restarts, with the bounds of the in-process set: each
//! key forgotten `dedup.ttl` after it was marked, at most `dedup.capacity` keys (the oldest
//! marked go first).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redb::{ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};

use super::{Dedup, DedupError};
use crate::clock::Clock;
use crate::embedded::EmbeddedDb;

/// Handled key → (marked at, Unix ms; its place in [`ORDER`]).
const MARKED: TableDefinition<&str, (u64, u64)> = TableDefinition::new("dedup");
/// Marking order (a sequence number) → key: the oldest marked first.
const ORDER: TableDefinition<u64, &str> = TableDefinition::new("dedup_order");

/// Handled keys of one subscriber group in its embedded database file (see the module docs).
#[derive(Debug, Clone)]
pub struct EmbeddedDedup {
    db: EmbeddedDb,
    ttl_ms: u64,
    capacity: u64,
    clock: Arc<dyn Clock>,
}

impl EmbeddedDedup {
    /// The keys in `db` (created when new), each forgotten `ttl` after it was marked by
    /// `clock`, at most `capacity` of them.
    pub async fn open(
        db: EmbeddedDb,
        ttl: Duration,
        capacity: usize,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, DedupError> {
        db.write("creating the dedup tables", |txn| {
            txn.open_table(MARKED)?;
            txn.open_table(ORDER)?;
            Ok(())
        })
        .await
        .map_err(DedupError::Embedded)?;
        let ttl_ms = crate::clock::millis(ttl).max(1);
        let capacity = u64::try_from(capacity).unwrap_or(u64::MAX).max(1);
        Ok(Self { db, ttl_ms, capacity, clock })
    }

    /// The database file the keys are in, for a store that marks an event inside its own
    /// transaction ([`EmbeddedDedup::mark_in`]).
    pub fn db(&self) -> &EmbeddedDb {
        &self.db
    }

    /// Whether a key marked at `marked_at` is still remembered at `now` (Unix ms).
    fn remembered(&self, marked_at: u64, now: u64) -> bool {
        now < marked_at.saturating_add(self.ttl_ms)
    }

    /// Marks `key` done inside `txn`, a write transaction on [`EmbeddedDedup::db`]; `false`
    /// when it already was. A store that marks an event in the same transaction as its effect
    /// cannot apply it twice, even when its caller retries after a failure it did not see.
    pub fn mark_in(&self, txn: &WriteTransaction, key: &str) -> Result<bool, redb::Error> {
        let now = self.clock.unix_ms();
        let mut marked = txn.open_table(MARKED)?;
        let mut order = txn.open_table(ORDER)?;
        let previous = marked.get(key)?.map(|entry| entry.value());
        if let Some((at, seq)) = previous {
            if self.remembered(at, now) {
                return Ok(false);
            }
            order.remove(seq)?;
        }
        let seq = order.last()?.map_or(0, |(seq, _)| seq.value() + 1);
        marked.insert(key, (now, seq))?;
        order.insert(seq, key)?;
        // Forget the expired and, beyond the capacity, the oldest.
        loop {
            let over = order.len()? > self.capacity;
            let Some((seq, oldest)) = order.first()?.map(|(seq, key)| (seq.value(), key.value().to_owned())) else {
                break;
            };
            let at = marked.get(oldest.as_str())?.map_or(0, |entry| entry.value().0);
            if !over && self.remembered(at, now) {
                break;
            }
            order.remove(seq)?;
            marked.remove(oldest.as_str())?;
        }
        Ok(true)
    }
}

#[async_trait]
impl Dedup for EmbeddedDedup {
    async fn is_done(&self, key: &str) -> Result<bool, DedupError> {
        let (key, now) = (key.to_owned(), self.clock.unix_ms());
        let read =
            move |txn: &redb::ReadTransaction| Ok(txn.open_table(MARKED)?.get(key.as_str())?.map(|e| e.value().0));
        let at = self.db.read("reading a handled key", read).await.map_err(DedupError::Embedded)?;
        Ok(at.is_some_and(|at| self.remembered(at, now)))
    }

    async fn mark_done(&self, key: &str) -> Result<bool, DedupError> {
        // Most marks follow an is_done that said no, but a store marking in its own
        // transaction may have marked it already: look first, so that case writes nothing.
        if self.is_done(key).await? {
            return Ok(false);
        }
        let (key, this) = (key.to_owned(), self.clone());
        self.db.write("marking a handled key", move |txn| this.mark_in(txn, &key)).await.map_err(DedupError::Embedded)
    }
}
