//! The dead-letter archive: `dead_letters` (id → letter) and `dead_letter_order`.

use redb::{ReadableDatabase, ReadableTableMetadata};

use super::tables::{DEAD_LETTER_ORDER, DEAD_LETTERS, SEP_END, at_key, at_of, id_of, range_keys, write};
use super::{EmbeddedStore, err};
use crate::store::{DeadLetter, DeadLetterPage, StoreError, decode, encode, make_cursor, parse_cursor};

/// The store's [`TaskStore::put_dead_letter`](crate::store::TaskStore::put_dead_letter).
pub(super) async fn put(store: &EmbeddedStore, letter: &DeadLetter) -> Result<(), StoreError> {
    let letter = letter.capped().into_owned();
    store
        .run("archiving a dead letter", move |db, _| {
            write(db, "archiving a dead letter", |txn| {
                let op = "archiving a dead letter";
                let mut table = txn.open_table(DEAD_LETTERS).map_err(|e| err(op, e))?;
                let previous =
                    table.insert(letter.id.as_str(), encode(&letter).as_bytes()).map_err(|e| err(op, e))?.is_some();
                if !previous {
                    let mut order = txn.open_table(DEAD_LETTER_ORDER).map_err(|e| err(op, e))?;
                    order.insert(at_key(letter.dead_lettered_at, &letter.id).as_str(), ()).map_err(|e| err(op, e))?;
                }
                Ok(())
            })
        })
        .await
}

/// The store's [`TaskStore::trim_dead_letters`](crate::store::TaskStore::trim_dead_letters).
pub(super) async fn trim(
    store: &EmbeddedStore,
    before: u64,
    max_entries: u64,
    max: usize,
) -> Result<usize, StoreError> {
    store
        .run("trimming dead letters", move |db, _| {
            write(db, "trimming dead letters", |txn| {
                let op = "trimming dead letters";
                let mut order = txn.open_table(DEAD_LETTER_ORDER).map_err(|e| err(op, e))?;
                let (mut doomed, _) = range_keys(&order, "", &format!("{before:020}{SEP_END}"), max)?;
                let count = order.len().map_err(|e| err(op, e))?;
                let excess = count.saturating_sub(doomed.len() as u64).saturating_sub(max_entries);
                let room = max.saturating_sub(doomed.len());
                if excess > 0 && room > 0 {
                    let take = room.min(usize::try_from(excess).unwrap_or(usize::MAX));
                    let (oldest, _) = range_keys(&order, "", "\u{10ffff}", doomed.len() + take)?;
                    doomed = oldest;
                }
                let mut letters = txn.open_table(DEAD_LETTERS).map_err(|e| err(op, e))?;
                for key in &doomed {
                    order.remove(key.as_str()).map_err(|e| err(op, e))?;
                    letters.remove(id_of(key)).map_err(|e| err(op, e))?;
                }
                Ok(doomed.len())
            })
        })
        .await
}

/// The store's [`TaskStore::dead_letters`](crate::store::TaskStore::dead_letters).
pub(super) async fn page(
    store: &EmbeddedStore,
    limit: usize,
    cursor: Option<&str>,
) -> Result<DeadLetterPage, StoreError> {
    let after = match cursor {
        Some(c) => {
            let (at, id) = parse_cursor(c)?;
            format!("{}{SEP_END}", at_key(at, id))
        }
        None => String::new(),
    };
    store
        .run("listing dead letters", move |db, _| {
            let op = "listing dead letters";
            let txn = db.begin_read().map_err(|e| err(op, e))?;
            let order = txn.open_table(DEAD_LETTER_ORDER).map_err(|e| err(op, e))?;
            let table = txn.open_table(DEAD_LETTERS).map_err(|e| err(op, e))?;
            let (keys, more) = range_keys(&order, &after, "\u{10ffff}", limit)?;
            let mut entries = Vec::with_capacity(keys.len());
            for key in &keys {
                if let Some(bytes) = table.get(id_of(key)).map_err(|e| err(op, e))? {
                    entries.push(decode::<DeadLetter>("dead letter", id_of(key), bytes.value())?);
                }
            }
            let next_cursor = more.then(|| keys.last().map(|k| make_cursor(at_of(k), id_of(k)))).flatten();
            Ok(DeadLetterPage { entries, next_cursor })
        })
        .await
}

/// The store's [`TaskStore::dead_letter`](crate::store::TaskStore::dead_letter).
pub(super) async fn get(store: &EmbeddedStore, id: &str) -> Result<Option<DeadLetter>, StoreError> {
    let id = id.to_owned();
    store
        .run("reading a dead letter", move |db, _| {
            let txn = db.begin_read().map_err(|e| err("reading a dead letter", e))?;
            let table = txn.open_table(DEAD_LETTERS).map_err(|e| err("reading a dead letter", e))?;
            match table.get(id.as_str()).map_err(|e| err("reading a dead letter", e))? {
                Some(bytes) => decode("dead letter", &id, bytes.value()).map(Some),
                None => Ok(None),
            }
        })
        .await
}

/// The store's [`TaskStore::remove_dead_letter`](crate::store::TaskStore::remove_dead_letter).
pub(super) async fn remove(store: &EmbeddedStore, id: &str) -> Result<bool, StoreError> {
    let id = id.to_owned();
    store
        .run("removing a dead letter", move |db, _| {
            write(db, "removing a dead letter", |txn| {
                let op = "removing a dead letter";
                let mut table = txn.open_table(DEAD_LETTERS).map_err(|e| err(op, e))?;
                let Some(bytes) = table.remove(id.as_str()).map_err(|e| err(op, e))? else { return Ok(false) };
                let letter: DeadLetter = decode("dead letter", &id, bytes.value())?;
                drop(bytes);
                let mut order = txn.open_table(DEAD_LETTER_ORDER).map_err(|e| err(op, e))?;
                order.remove(at_key(letter.dead_lettered_at, &id).as_str()).map_err(|e| err(op, e))?;
                Ok(true)
            })
        })
        .await
}

/// The store's [`TaskStore::count_dead_letters`](crate::store::TaskStore::count_dead_letters).
pub(super) async fn count(store: &EmbeddedStore) -> Result<u64, StoreError> {
    store
        .run("counting dead letters", |db, _| {
            let op = "counting dead letters";
            let txn = db.begin_read().map_err(|e| err(op, e))?;
            txn.open_table(DEAD_LETTERS).map_err(|e| err(op, e))?.len().map_err(|e| err(op, e))
        })
        .await
}
