//! Listing tasks through the `by_creation` and `by_state` tables, and counting them.

use redb::ReadableDatabase;

use super::tables::{BY_CREATION, BY_STATE, SEP, SEP_END, TASKS, at_key, at_of, id_of};
use super::{EmbeddedStore, err};
use crate::store::{ListOrder, ListQuery, Listing, StoreError, TaskPage, decode};
use crate::task::TaskState;

/// The store's [`TaskStore::list`](crate::store::TaskStore::list).
pub(super) async fn tasks(store: &EmbeddedStore, query: &ListQuery) -> Result<TaskPage, StoreError> {
    let query = query.clone();
    store
        .run("listing tasks", move |db, _| {
            let op = "listing tasks";
            let mut listing = Listing::new(&query)?;
            let Some((lo, hi)) = listing.range() else { return Ok(listing.finish()) };
            let prefix = query.state.map_or_else(String::new, |s| format!("{}{SEP}", s.as_str()));
            let mut from = format!("{prefix}{lo:020}");
            let mut until = format!("{prefix}{hi:020}{SEP_END}");
            if let Some((at, id)) = listing.cursor() {
                match query.order {
                    ListOrder::Oldest => from = from.max(format!("{prefix}{}{SEP_END}", at_key(at, id))),
                    ListOrder::Newest => until = until.min(format!("{prefix}{}", at_key(at, id))),
                }
            }
            if from >= until {
                return Ok(listing.finish());
            }
            let txn = db.begin_read().map_err(|e| err(op, e))?;
            let index =
                txn.open_table(if query.state.is_some() { BY_STATE } else { BY_CREATION }).map_err(|e| err(op, e))?;
            let tasks = txn.open_table(TASKS).map_err(|e| err(op, e))?;
            let rows = index.range(from.as_str()..until.as_str()).map_err(|e| err(op, e))?;
            let rows: Box<dyn Iterator<Item = _>> =
                if query.order == ListOrder::Newest { Box::new(rows.rev()) } else { Box::new(rows) };
            for row in rows {
                let (key, _) = row.map_err(|e| err(op, e))?;
                let entry = &key.value()[prefix.len()..];
                let id = id_of(entry);
                let task = match tasks.get(id).map_err(|e| err(op, e))? {
                    Some(json) if listing.may_match(json.value()) => Some(decode("task", id, json.value())?),
                    _ => None,
                };
                if !listing.offer(at_of(entry), id, task) {
                    break;
                }
            }
            Ok(listing.finish())
        })
        .await
}

/// The store's [`TaskStore::count_in_flight`](crate::store::TaskStore::count_in_flight).
pub(super) async fn count_in_flight(store: &EmbeddedStore) -> Result<u64, StoreError> {
    store
        .run("counting tasks", move |db, _| {
            let txn = db.begin_read().map_err(|e| err("counting tasks", e))?;
            let table = txn.open_table(BY_STATE).map_err(|e| err("counting tasks", e))?;
            let mut n = 0;
            for state in TaskState::IN_FLIGHT {
                let (lo, hi) = (format!("{}{SEP}", state.as_str()), format!("{}{SEP_END}", state.as_str()));
                n += table.range(lo.as_str()..hi.as_str()).map_err(|e| err("counting tasks", e))?.count() as u64;
            }
            Ok(n)
        })
        .await
}

/// The store's [`TaskStore::count_queued`](crate::store::TaskStore::count_queued).
pub(super) async fn count_queued(store: &EmbeddedStore) -> Result<u64, StoreError> {
    store
        .run("counting tasks", move |db, _| {
            let txn = db.begin_read().map_err(|e| err("counting tasks", e))?;
            let table = txn.open_table(BY_STATE).map_err(|e| err("counting tasks", e))?;
            let queued = TaskState::Queued.as_str();
            let (lo, hi) = (format!("{queued}{SEP}"), format!("{queued}{SEP_END}"));
            Ok(table.range(lo.as_str()..hi.as_str()).map_err(|e| err("counting tasks", e))?.count() as u64)
        })
        .await
}
