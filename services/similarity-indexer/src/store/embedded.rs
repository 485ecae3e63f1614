//! [`EmbeddedStore`]: the similarity store in the similarity indexer group's redb file under
//! `store.path` (`similarity-indexer.redb`), beside the group's dedup set.

use async_trait::async_trait;
use imagepipe_runtime::embedded::EmbeddedDb;
use redb::{ReadableTable, TableDefinition, WriteTransaction};

use super::{Change, Changed, Changes, Entry, SimilarityStore, StoreError, TOMBSTONE_TTL_MS, decode, encode};

/// Task → its entry's JSON.
const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("similarity_entries");
/// Sequence number → the task changed.
const LOG: TableDefinition<u64, &str> = TableDefinition::new("similarity_log");
/// Task → its latest sequence number.
const SEQ_OF: TableDefinition<&str, u64> = TableDefinition::new("similarity_seq_of");
/// (latest event time, task): entries oldest first, for expiry.
const BY_AT: TableDefinition<(u64, &str), ()> = TableDefinition::new("similarity_by_at");
/// (removal time, task): removals still in the log.
const GONE: TableDefinition<(u64, &str), ()> = TableDefinition::new("similarity_gone");
/// `seq` (the last sequence number) and `epoch`.
const META: TableDefinition<&str, u64> = TableDefinition::new("similarity_meta");

/// The store in an embedded database file (see the module docs).
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    db: EmbeddedDb,
}

impl EmbeddedStore {
    /// The store in `db` (its tables created when new).
    pub async fn open(db: EmbeddedDb) -> Result<Self, StoreError> {
        db.write("creating the similarity tables", |txn| {
            txn.open_table(ENTRIES)?;
            txn.open_table(LOG)?;
            txn.open_table(SEQ_OF)?;
            txn.open_table(BY_AT)?;
            txn.open_table(GONE)?;
            txn.open_table(META)?;
            Ok(())
        })
        .await
        .map_err(StoreError::Embedded)?;
        Ok(Self { db })
    }
}

/// Gives `task_id` the next sequence number of the log.
fn log(txn: &WriteTransaction, task_id: &str) -> Result<(), redb::Error> {
    let mut meta = txn.open_table(META)?;
    let seq = meta.get("seq")?.map_or(0, |v| v.value()) + 1;
    meta.insert("seq", seq)?;
    let mut seq_of = txn.open_table(SEQ_OF)?;
    let mut log = txn.open_table(LOG)?;
    if let Some(previous) = seq_of.insert(task_id, seq)?.map(|v| v.value()) {
        log.remove(previous)?;
    }
    log.insert(seq, task_id)?;
    Ok(())
}

#[async_trait]
impl SimilarityStore for EmbeddedStore {
    async fn update(&self, task_id: &str, at: u64, change: Change) -> Result<Entry, StoreError> {
        let task_id = task_id.to_owned();
        self.db
            .write("updating an entry", move |txn| {
                let mut entries = txn.open_table(ENTRIES)?;
                let stored = entries.get(task_id.as_str())?.map(|v| v.value().to_vec());
                let mut entry = match stored.as_deref().map(|bytes| decode(&task_id, bytes)) {
                    Some(Ok(entry)) => entry,
                    Some(Err(error)) => {
                        tracing::warn!(%error, "an unreadable similarity entry is replaced");
                        Entry { task_id: task_id.clone(), ..Entry::default() }
                    }
                    None => Entry { task_id: task_id.clone(), ..Entry::default() },
                };
                let before = entry.at;
                change.apply(&mut entry, at);
                entries.insert(task_id.as_str(), encode(&entry).as_slice())?;
                let mut by_at = txn.open_table(BY_AT)?;
                if before != entry.at {
                    by_at.remove((before, task_id.as_str()))?;
                }
                by_at.insert((entry.at, task_id.as_str()), ())?;
                drop((entries, by_at));
                log(txn, &task_id)?;
                Ok(entry)
            })
            .await
            .map_err(StoreError::Embedded)
    }

    async fn entry(&self, task_id: &str) -> Result<Option<Entry>, StoreError> {
        let key = task_id.to_owned();
        let bytes = self
            .db
            .read("reading an entry", move |txn| {
                Ok(txn.open_table(ENTRIES)?.get(key.as_str())?.map(|v| v.value().to_vec()))
            })
            .await
            .map_err(StoreError::Embedded)?;
        bytes.map(|bytes| decode(task_id, &bytes)).transpose()
    }

    async fn changes(&self, after: u64, limit: usize) -> Result<Changes, StoreError> {
        let (epoch, rows) = self
            .db
            .read("reading the change log", move |txn| {
                let epoch = txn.open_table(META)?.get("epoch")?.map_or(0, |v| v.value());
                let log = txn.open_table(LOG)?;
                let entries = txn.open_table(ENTRIES)?;
                let mut rows = Vec::new();
                for row in log.range(after + 1..)?.take(limit) {
                    let (seq, task_id) = row?;
                    let task_id = task_id.value().to_owned();
                    let bytes = entries.get(task_id.as_str())?.map(|v| v.value().to_vec());
                    rows.push((seq.value(), task_id, bytes));
                }
                Ok((epoch, rows))
            })
            .await
            .map_err(StoreError::Embedded)?;
        let mut items = Vec::with_capacity(rows.len());
        for (seq, task_id, bytes) in rows {
            let entry = bytes.map(|bytes| decode(&task_id, &bytes)).transpose()?;
            items.push(Changed { seq, task_id, entry });
        }
        Ok(Changes { epoch, items })
    }

    async fn expire(&self, before: u64, now: u64, max: usize) -> Result<usize, StoreError> {
        self.db
            .write("expiring old entries", move |txn| {
                let mut by_at = txn.open_table(BY_AT)?;
                let mut old = Vec::new();
                for row in by_at.iter()?.take(max) {
                    let (key, _) = row?;
                    let (at, task_id) = key.value();
                    if at > before {
                        break;
                    }
                    old.push((at, task_id.to_owned()));
                }
                let mut entries = txn.open_table(ENTRIES)?;
                let mut gone = txn.open_table(GONE)?;
                for (at, task_id) in &old {
                    entries.remove(task_id.as_str())?;
                    by_at.remove((*at, task_id.as_str()))?;
                    gone.insert((now, task_id.as_str()), ())?;
                }
                drop((entries, by_at, gone));
                for (_, task_id) in &old {
                    log(txn, task_id)?;
                }
                let mut gone = txn.open_table(GONE)?;
                let entries = txn.open_table(ENTRIES)?;
                let mut seq_of = txn.open_table(SEQ_OF)?;
                let mut log = txn.open_table(LOG)?;
                let cutoff = now.saturating_sub(TOMBSTONE_TTL_MS);
                let forgotten: Vec<(u64, String)> = gone
                    .range(..(cutoff, ""))?
                    .filter_map(Result::ok)
                    .map(|(key, _)| (key.value().0, key.value().1.to_owned()))
                    .collect();
                for (removed, task_id) in forgotten {
                    gone.remove((removed, task_id.as_str()))?;
                    // Written again since it was removed: its log entry is a live one.
                    if entries.get(task_id.as_str())?.is_some() {
                        continue;
                    }
                    if let Some(seq) = seq_of.remove(task_id.as_str())? {
                        log.remove(seq.value())?;
                    }
                }
                Ok(old.len())
            })
            .await
            .map_err(StoreError::Embedded)
    }

    async fn clear(&self) -> Result<u64, StoreError> {
        self.db
            .write("clearing the store", |txn| {
                txn.delete_table(ENTRIES)?;
                txn.delete_table(LOG)?;
                txn.delete_table(SEQ_OF)?;
                txn.delete_table(BY_AT)?;
                txn.delete_table(GONE)?;
                txn.open_table(ENTRIES)?;
                txn.open_table(LOG)?;
                txn.open_table(SEQ_OF)?;
                txn.open_table(BY_AT)?;
                txn.open_table(GONE)?;
                let mut meta = txn.open_table(META)?;
                let epoch = meta.get("epoch")?.map_or(0, |v| v.value()) + 1;
                meta.insert("epoch", epoch)?;
                Ok(epoch)
            })
            .await
            .map_err(StoreError::Embedded)
    }
}
