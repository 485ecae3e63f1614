use redb::{ReadableTableMetadata, TableHandle};

use super::tables::BLOB_REFS;
use super::*;
use crate::store::suite;

async fn make(_name: &'static str) -> (EmbeddedStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    (EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap(), dir)
}

crate::store_suite!(make);

#[tokio::test]
async fn an_expired_task_leaves_no_row_behind() {
    let (store, _dir) = make("expired").await;
    suite::expire_the_only_task(&store).await;
    let txn = store.db.database().begin_read().unwrap();
    let mut rows = Vec::new();
    for table in [TASKS, HISTORY, OUTBOX, DEAD_LETTERS] {
        rows.push((table.name().to_owned(), txn.open_table(table).unwrap().len().unwrap()));
    }
    for table in [BY_STATE, BY_CREATION, DUE_ORDER, CLAIMED_ORDER, DEAD_LETTER_ORDER, FINISHED, BLOB_REFS, TASK_BLOBS] {
        rows.push((table.name().to_owned(), txn.open_table(table).unwrap().len().unwrap()));
    }
    for table in [DUE, CLAIMED] {
        rows.push((table.name().to_owned(), txn.open_table(table).unwrap().len().unwrap()));
    }
    rows.push((IDEMPOTENCY.name().to_owned(), txn.open_table(IDEMPOTENCY).unwrap().len().unwrap()));
    assert!(rows.iter().all(|(_, n)| *n == 0), "rows left: {rows:?}");
}

#[tokio::test]
async fn tasks_finished_before_the_finished_table_was_kept_expire_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap();
    suite::write_a_cancelled_task(&store).await;
    let txn = store.db.database().begin_write().unwrap();
    txn.delete_table(FINISHED).unwrap();
    txn.commit().unwrap();
    drop(store);
    let reopened = EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap();
    suite::check_the_cancelled_task_expires(&reopened).await;
}

/// Timings of listings at 100,000 tasks: `cargo nextest run --all-features -p
/// imagepipe-coordinator --run-ignored only --no-capture -E 'test(listing_timings)'`.
#[tokio::test]
#[ignore = "a timing, not a check: run by hand"]
async fn listing_timings_at_100_000_tasks() {
    let (store, _dir) = make("timings").await;
    let timings = suite::time_listings(&store, 100_000).await;
    assert!(timings[0].1 < 50.0, "{timings:?}");
}

#[tokio::test]
async fn tasks_written_before_blob_references_were_kept_keep_their_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap();
    let keys = suite::write_a_blob_task(&store).await;
    let txn = store.db.database().begin_write().unwrap();
    txn.delete_table(BLOB_REFS).unwrap();
    txn.delete_table(TASK_BLOBS).unwrap();
    txn.commit().unwrap();
    drop(store);
    let reopened = EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap();
    suite::check_blobs_referenced(&reopened, &keys).await;
}

#[tokio::test]
async fn survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let id = suite::write_a_started_task(&EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap()).await;
    let reopened = EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap();
    suite::check_a_started_task(&reopened, &id).await;
}
