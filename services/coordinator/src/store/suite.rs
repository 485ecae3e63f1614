//! The one test suite every [`TaskStore`] passes. [`store_suite!`](crate::store_suite) expands
//! to one test per case, each on a fresh store from the backend's `make(name)`.

use std::time::Duration;

use imagepipe_contracts::shard::{DEFAULT_SHARDS, shard_of};
use imagepipe_contracts::{Priority, StepOutcome, StepResult, SubmitTask, TraceId};

use super::{
    Applied, Created, DeadLetter, HANDOVERS_KEPT, Handover, LABEL_SCAN_LIMIT, LabelFilter, Lease, ListOrder, ListQuery,
    Replica, Settled, StoreError, TaskStore,
};
use crate::machine::{self, Context, Decision, Fence, Input, Policy, Verdict};
use crate::task::{Task, TaskState, TimerKind};

/// The relay grace every suite store is opened with.
pub const RELAY_GRACE: Duration = Duration::from_secs(10);
const T0: u64 = 1_700_000_000_000;

/// Expands to one `#[tokio::test]` per suite case; `$make(name).await` returns a fresh store
/// and a guard that cleans it up when dropped. With `optional`, it returns them in an `Option`:
/// `None` when the backend's server is missing and skipping is allowed
/// ([`imagepipe_contracts::testing::environment_missing`]), and the case does nothing.
#[macro_export]
#[doc(hidden)]
macro_rules! store_suite {
    ($make:path) => {
        $crate::store_suite!(@list [$make, required]);
    };
    (optional $make:path) => {
        $crate::store_suite!(@list [$make, optional]);
    };
    (@list $how:tt) => {
        $crate::store_suite!(@cases $how;
            create_is_idempotent_by_id_and_key,
            apply_is_a_compare_and_set_on_the_version,
            a_batch_applies_each_compare_and_set_on_its_own,
            history_keeps_every_transition_in_order,
            outbox_entries_stay_until_removed,
            lists_page_by_creation_and_filter_by_state,
            lists_newest_first_across_pages_with_equal_times,
            lists_within_creation_time_bounds,
            lists_by_label_within_the_scan_bound,
            state_filtered_lists_take_order_and_time_bounds,
            counts_tasks_in_flight,
            wake_index_hands_each_due_task_to_one_claimer,
            expired_leases_make_a_task_due_again,
            release_reindexes_from_the_stored_timer,
            a_write_during_a_lease_keeps_the_task_indexed,
            concurrent_claims_are_disjoint,
            dead_letters_are_archived_paged_and_removed,
            finished_tasks_expire_after_retention,
            expiry_takes_batches_and_spares_unfinished_tasks,
            dead_letters_are_capped_by_age_count_and_body_size,
            blob_references_follow_their_tasks,
            blobs_a_task_replaced_are_released_when_it_expires,
            leases_are_taken_renewed_released_and_run_out,
            owners_racing_for_a_shard_get_it_once,
            a_write_under_a_lost_lease_is_fenced_and_writes_nothing,
            pinning_another_shard_count_is_refused,
            replicas_are_forgotten_when_their_announcement_runs_out,
            handovers_are_capped_and_newest_first,
            claims_and_queues_per_shard_return_only_those_shards,
        );
    };
    (@cases [$make:path, required]; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let (store, _guard) = $make(stringify!($case)).await;
                $crate::store::suite::$case(&store).await;
            }
        )*
    };
    (@cases [$make:path, optional]; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let Some((store, _guard)) = $make(stringify!($case)).await else { return };
                $crate::store::suite::$case(&store).await;
            }
        )*
    };
}

fn submit(key: Option<&str>) -> SubmitTask {
    SubmitTask { idempotency_key: key.map(str::to_owned), ..SubmitTask::url("https://example.com/a.jpg") }
}

fn created(id: &str, key: Option<&str>, at: u64) -> Decision {
    let s = submit(key);
    machine::create(id.into(), &s, s.validate().unwrap(), TraceId::random(), at)
}

fn next(task: &Task, input: Input, now: u64) -> Decision {
    match machine::decide(task, &input, &Context { now, seed: 1, ..Context::default() }, &Policy::default()).unwrap() {
        Verdict::Apply(d) => *d,
        Verdict::Ignore(why) => panic!("ignored: {why:?}"),
    }
}

async fn create_new(store: &impl TaskStore, id: &str, at: u64) -> Task {
    let d = created(id, None, at);
    assert_eq!(store.create(&d).await.unwrap(), Created::New);
    d.task
}

async fn start(store: &impl TaskStore, task: &Task, now: u64) -> Task {
    let d = next(task, Input::Start, now);
    assert_eq!(store.apply(&d).await.unwrap(), Applied::Yes);
    d.task
}

pub async fn create_is_idempotent_by_id_and_key(store: &impl TaskStore) {
    let first = created("tsk_a", Some("order-1"), T0);
    assert_eq!(store.create(&first).await.unwrap(), Created::New);
    assert_eq!(store.get("tsk_a").await.unwrap().unwrap(), first.task);

    let same_id = created("tsk_a", None, T0 + 1);
    assert_eq!(store.create(&same_id).await.unwrap(), Created::Existing(Box::new(first.task.clone())));

    let same_key = created("tsk_b", Some("order-1"), T0 + 2);
    assert_eq!(store.create(&same_key).await.unwrap(), Created::Existing(Box::new(first.task.clone())));
    assert!(store.get("tsk_b").await.unwrap().is_none());
    assert_eq!(store.find_by_idempotency_key("order-1").await.unwrap().as_deref(), Some("tsk_a"));
    assert_eq!(store.find_by_idempotency_key("order-2").await.unwrap(), None);
    assert!(store.get("tsk_missing").await.unwrap().is_none());
}

pub async fn apply_is_a_compare_and_set_on_the_version(store: &impl TaskStore) {
    let task = create_new(store, "tsk_cas", T0).await;
    let a = next(&task, Input::Start, T0 + 1);
    let b = next(&task, Input::Cancel { reason: None }, T0 + 1);
    assert_eq!(store.apply(&a).await.unwrap(), Applied::Yes);
    assert_eq!(store.apply(&b).await.unwrap(), Applied::Conflict);
    assert_eq!(store.apply(&a).await.unwrap(), Applied::Conflict, "a transition applies once");
    let stored = store.get("tsk_cas").await.unwrap().unwrap();
    assert_eq!((stored.version, stored.state), (2, TaskState::Downloading));

    let ghost = next(&created("tsk_ghost", None, T0).task, Input::Start, T0);
    assert_eq!(store.apply(&ghost).await.unwrap(), Applied::Conflict);
    assert!(store.get("tsk_ghost").await.unwrap().is_none());
}

pub async fn a_batch_applies_each_compare_and_set_on_its_own(store: &impl TaskStore) {
    let stale = create_new(store, "tsk_b_stale", T0).await;
    let moved = start(store, &stale, T0 + 1).await;
    let fresh = create_new(store, "tsk_b_fresh", T0 + 2).await;
    let new = created("tsk_b_new", None, T0 + 3);
    let taken = created("tsk_b_fresh", None, T0 + 4);
    let batch = [
        next(&stale, Input::Cancel { reason: None }, T0 + 5),
        next(&fresh, Input::Start, T0 + 5),
        new.clone(),
        taken,
        next(&created("tsk_b_ghost", None, T0).task, Input::Start, T0 + 5),
    ];
    let applied = store.apply_many(&batch).await.unwrap();
    assert_eq!(applied, [Applied::Conflict, Applied::Yes, Applied::Yes, Applied::Conflict, Applied::Conflict]);
    assert!(store.apply_many(&[]).await.unwrap().is_empty());

    let ids = ["tsk_b_stale", "tsk_b_fresh", "tsk_b_new", "tsk_b_ghost"];
    let stored = store.get_many(&ids).await.unwrap();
    assert_eq!(stored[0].as_ref(), Some(&moved), "a lost compare-and-set writes nothing");
    assert_eq!(stored[1].as_ref(), Some(&batch[1].task));
    assert_eq!(stored[2].as_ref(), Some(&new.task), "a version-1 decision creates its task");
    assert_eq!(stored[3], None);
    assert_eq!(store.history("tsk_b_fresh").await.unwrap().len(), 2);
    assert_eq!(listed(store, Some(TaskState::Downloading)).await, ["tsk_b_stale", "tsk_b_fresh"]);
    assert_eq!(listed(store, Some(TaskState::Queued)).await, ["tsk_b_new"]);
    assert_eq!(store.count_in_flight().await.unwrap(), 2);

    let fresh_outbox: Vec<String> = store.outbox("tsk_b_fresh").await.unwrap().iter().map(|e| e.id.clone()).collect();
    let new_outbox: Vec<String> = new.outbox.iter().map(|e| e.id.clone()).collect();
    assert_eq!(fresh_outbox.len(), 2, "task.created and the download command");
    let settled = [
        Settled { task: "tsk_b_fresh", relayed: &fresh_outbox[..1], state: Some(TaskState::Downloading) },
        Settled { task: "tsk_b_new", relayed: &new_outbox, state: None },
    ];
    store.settle(&settled).await.unwrap();
    assert_eq!(listed(store, Some(TaskState::Queued)).await, ["tsk_b_new"]);
    assert_eq!(store.count_queued().await.unwrap(), 1, "the started task's queued entry is settled");
    assert_eq!(store.outbox("tsk_b_fresh").await.unwrap(), batch[1].outbox);
    assert!(store.outbox("tsk_b_new").await.unwrap().is_empty());
}

pub async fn history_keeps_every_transition_in_order(store: &impl TaskStore) {
    let task = create_new(store, "tsk_hist", T0).await;
    let task = start(store, &task, T0 + 5).await;
    let cancel = next(&task, Input::Cancel { reason: Some("stop".into()) }, T0 + 9);
    store.apply(&cancel).await.unwrap();
    let history = store.history("tsk_hist").await.unwrap();
    let summary: Vec<_> = history.iter().map(|h| (h.version, h.at, h.to)).collect();
    assert_eq!(
        summary,
        [(1, T0, TaskState::Queued), (2, T0 + 5, TaskState::Downloading), (3, T0 + 9, TaskState::Downloading)]
    );
    assert!(store.history("tsk_none").await.unwrap().is_empty());
}

pub async fn outbox_entries_stay_until_removed(store: &impl TaskStore) {
    let d = created("tsk_out", None, T0);
    store.create(&d).await.unwrap();
    let started = next(&d.task, Input::Start, T0 + 1);
    store.apply(&started).await.unwrap();
    let pending = store.outbox("tsk_out").await.unwrap();
    let expected: Vec<_> = d.outbox.iter().chain(&started.outbox).cloned().collect();
    assert_eq!(pending, expected);
    store.remove_outbox("tsk_out", &[pending[0].id.clone()]).await.unwrap();
    assert_eq!(store.outbox("tsk_out").await.unwrap(), started.outbox);
    store.remove_outbox("tsk_out", &[pending[1].id.clone(), "no-such-entry".into()]).await.unwrap();
    assert!(store.outbox("tsk_out").await.unwrap().is_empty());
}

pub async fn lists_page_by_creation_and_filter_by_state(store: &impl TaskStore) {
    let mut tasks = Vec::new();
    for i in 0..5u64 {
        tasks.push(create_new(store, &format!("tsk_list_{i}"), T0 + i).await);
    }
    start(store, &tasks[1], T0 + 10).await;
    start(store, &tasks[3], T0 + 10).await;

    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.list(&ListQuery { limit: 2, cursor, ..ListQuery::default() }).await.unwrap();
        assert!(page.tasks.len() <= 2);
        seen.extend(page.tasks.iter().map(|t| t.id.clone()));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let all: Vec<_> = (0..5).map(|i| format!("tsk_list_{i}")).collect();
    assert_eq!(seen, all);

    let downloading = store
        .list(&ListQuery { state: Some(TaskState::Downloading), limit: 10, ..ListQuery::default() })
        .await
        .unwrap();
    let ids: Vec<_> = downloading.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["tsk_list_1", "tsk_list_3"]);
    assert!(downloading.tasks.iter().all(|t| t.state == TaskState::Downloading));
    let queued =
        store.list(&ListQuery { state: Some(TaskState::Queued), limit: 1, ..ListQuery::default() }).await.unwrap();
    assert_eq!(queued.tasks[0].id, "tsk_list_0");
    let rest = store
        .list(&ListQuery {
            state: Some(TaskState::Queued),
            limit: 10,
            cursor: queued.next_cursor,
            ..ListQuery::default()
        })
        .await
        .unwrap();
    let ids: Vec<_> = rest.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["tsk_list_2", "tsk_list_4"]);
    assert_eq!(rest.next_cursor, None);

    let bad = store.list(&ListQuery { limit: 1, cursor: Some("garbage".into()), ..ListQuery::default() }).await;
    assert!(matches!(bad, Err(StoreError::InvalidCursor(_))), "{bad:?}");
}

/// Creates task `id` at `at` with `labels` and `priority`, without waiting for a disk sync of
/// its own: a decision of a new task, for [`TaskStore::apply_many`] batches.
fn created_with(id: &str, at: u64, labels: &[(&str, &str)], priority: Priority) -> Decision {
    let s = SubmitTask {
        labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        priority,
        ..SubmitTask::url("https://example.com/a.jpg")
    };
    machine::create(id.into(), &s, s.validate().unwrap(), TraceId::random(), at)
}

/// Every page of `query` (from its cursor on): the ids of each page, and whether each page but
/// the last had a cursor.
async fn pages(store: &impl TaskStore, query: ListQuery) -> Vec<Vec<String>> {
    let mut query = query;
    let mut pages = Vec::new();
    loop {
        let page = store.list(&query).await.unwrap();
        assert!(page.tasks.len() <= query.limit);
        pages.push(page.tasks.into_iter().map(|t| t.id).collect());
        match page.next_cursor {
            Some(c) => query.cursor = Some(c),
            None => return pages,
        }
    }
}

fn ids(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

pub async fn lists_newest_first_across_pages_with_equal_times(store: &impl TaskStore) {
    // Created out of id order, four of them in the same millisecond.
    let made = [("tsk_eq_c", 1), ("tsk_eq_a", 0), ("tsk_eq_e", 1), ("tsk_eq_b", 1), ("tsk_eq_d", 1), ("tsk_eq_f", 2)];
    for (id, at) in made {
        create_new(store, id, T0 + at).await;
    }
    let oldest = ["tsk_eq_a", "tsk_eq_b", "tsk_eq_c", "tsk_eq_d", "tsk_eq_e", "tsk_eq_f"];
    let newest: Vec<&str> = oldest.iter().rev().copied().collect();
    for limit in [1, 2, 4, 6, 50] {
        let query = ListQuery { limit, order: ListOrder::Newest, ..ListQuery::default() };
        let seen: Vec<String> = pages(store, query).await.concat();
        assert_eq!(seen, ids(&newest), "newest first, {limit} a page");
        let seen: Vec<String> = pages(store, ListQuery { limit, ..ListQuery::default() }).await.concat();
        assert_eq!(seen, ids(&oldest), "oldest first, {limit} a page");
    }
    let first = store.list(&ListQuery { limit: 2, order: ListOrder::Newest, ..ListQuery::default() }).await.unwrap();
    assert_eq!(first.tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["tsk_eq_f", "tsk_eq_e"]);
    let full = store.list(&ListQuery { limit: 6, order: ListOrder::Newest, ..ListQuery::default() }).await.unwrap();
    assert_eq!((full.tasks.len(), full.next_cursor), (6, None), "a page that takes the last task is the last");

    // A cursor is a position in the index: the other order goes on from it the other way.
    let back = ListQuery { limit: 10, cursor: first.next_cursor.clone(), ..ListQuery::default() };
    assert_eq!(pages(store, back).await.concat(), ids(&["tsk_eq_f"]));
    let oldest_first = store.list(&ListQuery { limit: 3, ..ListQuery::default() }).await.unwrap();
    let back =
        ListQuery { limit: 10, order: ListOrder::Newest, cursor: oldest_first.next_cursor, ..ListQuery::default() };
    assert_eq!(pages(store, back).await.concat(), ids(&["tsk_eq_b", "tsk_eq_a"]));

    let bad = ListQuery { limit: 1, order: ListOrder::Newest, cursor: Some("12:".into()), ..ListQuery::default() };
    assert!(matches!(store.list(&bad).await, Err(StoreError::InvalidCursor(_))));
}

pub async fn lists_within_creation_time_bounds(store: &impl TaskStore) {
    let batch: Vec<Decision> =
        (0..10u64).map(|i| created_with(&format!("tsk_time_{i}"), T0 + i, &[], Priority::Normal)).collect();
    assert!(store.apply_many(&batch).await.unwrap().iter().all(|a| *a == Applied::Yes));
    let named = |range: &[u64]| -> Vec<String> { range.iter().map(|i| format!("tsk_time_{i}")).collect() };
    let between = ListQuery { created_after: Some(T0 + 3), created_before: Some(T0 + 7), ..ListQuery::default() };
    for limit in [1, 3, 4, 50] {
        let oldest = pages(store, ListQuery { limit, ..between.clone() }).await;
        assert_eq!(oldest.concat(), named(&[3, 4, 5, 6]), "after inclusive, before exclusive; {limit} a page");
        assert!(oldest.iter().all(|p| !p.is_empty()), "range bounds never leave a page empty: {oldest:?}");
        let newest = pages(store, ListQuery { limit, order: ListOrder::Newest, ..between.clone() }).await;
        assert_eq!(newest.concat(), named(&[6, 5, 4, 3]), "{limit} a page");
    }
    let after = ListQuery { limit: 50, created_after: Some(T0 + 8), ..ListQuery::default() };
    assert_eq!(pages(store, after).await.concat(), named(&[8, 9]));
    let before = ListQuery { limit: 2, order: ListOrder::Newest, created_before: Some(T0 + 2), ..ListQuery::default() };
    assert_eq!(pages(store, before).await.concat(), named(&[1, 0]));
    for (after, before) in
        [(Some(T0 + 5), Some(T0 + 5)), (Some(T0 + 6), Some(T0 + 5)), (None, Some(0)), (Some(T0 + 10), None)]
    {
        for order in [ListOrder::Oldest, ListOrder::Newest] {
            let query =
                ListQuery { limit: 5, order, created_after: after, created_before: before, ..ListQuery::default() };
            let page = store.list(&query).await.unwrap();
            assert!(page.tasks.is_empty() && page.next_cursor.is_none(), "{after:?}..{before:?}: {page:?}");
        }
    }
    // A cursor from outside the bounds: the bounds still hold.
    let first = store.list(&ListQuery { limit: 1, ..ListQuery::default() }).await.unwrap();
    let query = ListQuery { cursor: first.next_cursor, limit: 50, ..between.clone() };
    assert_eq!(pages(store, query).await.concat(), named(&[3, 4, 5, 6]));
}

pub async fn lists_by_label_within_the_scan_bound(store: &impl TaskStore) {
    let n = LABEL_SCAN_LIMIT as u64 + 10;
    let labels = |i: u64| -> &'static [(&'static str, &'static str)] {
        match i {
            2 | 7 => &[("album", "summer"), ("camera", "x100")],
            3 => &[("album", "winter")],
            4 => &[("albums", "summer")],
            i if i == n - 5 => &[("album", "summer")],
            _ => &[],
        }
    };
    let all: Vec<Decision> =
        (0..n).map(|i| created_with(&format!("tsk_lbl_{i:05}"), T0 + i, labels(i), Priority::Normal)).collect();
    for batch in all.chunks(500) {
        assert!(store.apply_many(batch).await.unwrap().iter().all(|a| *a == Applied::Yes));
    }
    let summer = Some(LabelFilter { key: "album".into(), value: "summer".into() });
    let late = format!("tsk_lbl_{:05}", n - 5);

    // The first page scans the bound (tasks 0 to 4,999), short of the limit: a cursor anyway.
    let query = ListQuery { limit: 10, label: summer.clone(), ..ListQuery::default() };
    let first = store.list(&query).await.unwrap();
    assert_eq!(first.tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["tsk_lbl_00002", "tsk_lbl_00007"]);
    assert!(first.next_cursor.is_some(), "the scan stopped at its bound with entries left");
    assert_eq!(pages(store, query.clone()).await, [ids(&["tsk_lbl_00002", "tsk_lbl_00007"]), vec![late.clone()]]);
    let newest = pages(store, ListQuery { order: ListOrder::Newest, ..query.clone() }).await;
    assert_eq!(newest, [vec![late.clone()], ids(&["tsk_lbl_00007", "tsk_lbl_00002"])]);
    // A full page ends where its look for one more match stopped.
    let one = ListQuery { limit: 1, label: summer.clone(), ..ListQuery::default() };
    assert_eq!(pages(store, one).await, [ids(&["tsk_lbl_00002"]), ids(&["tsk_lbl_00007"]), vec![late]]);
    // No match among the first entries scanned: an empty page, with a cursor.
    let winter = Some(LabelFilter { key: "album".into(), value: "winter".into() });
    let newest_winter =
        ListQuery { limit: 10, order: ListOrder::Newest, label: winter.clone(), ..ListQuery::default() };
    assert_eq!(pages(store, newest_winter).await, [vec![], ids(&["tsk_lbl_00003"])]);

    // Within time bounds, the scan is within them too: no bound reached, no cursor.
    let early = ListQuery { created_before: Some(T0 + 100), ..query.clone() };
    let page = store.list(&early).await.unwrap();
    assert_eq!(page.tasks.len(), 2);
    assert_eq!(page.next_cursor, None);
    let winter = ListQuery { label: winter, ..early };
    assert_eq!(pages(store, winter).await.concat(), ids(&["tsk_lbl_00003"]));
    let empty = ListQuery { label: Some(LabelFilter { key: "camera".into(), value: String::new() }), ..query };
    assert!(pages(store, empty).await.concat().is_empty(), "an empty value matches only an empty value");
}

pub async fn state_filtered_lists_take_order_and_time_bounds(store: &impl TaskStore) {
    let mut tasks = Vec::new();
    for i in 0..6u64 {
        tasks.push(create_new(store, &format!("tsk_st_{i}"), T0 + i).await);
    }
    for i in [1, 2, 4] {
        start(store, &tasks[i], T0 + 10).await;
    }
    // A high-priority task created last lists first among the queued, oldest first.
    let urgent = created_with("tsk_st_urgent", T0 + 6, &[("album", "summer")], Priority::High);
    assert_eq!(store.create(&urgent).await.unwrap(), Created::New);
    let q = |state: TaskState, order: ListOrder, after: Option<u64>, before: Option<u64>, limit: usize| ListQuery {
        state: Some(state),
        order,
        limit,
        created_after: after.map(|a| T0 + a),
        created_before: before.map(|b| T0 + b),
        ..ListQuery::default()
    };
    let named = |names: &[&str]| -> Vec<String> { names.iter().map(|n| format!("tsk_st_{n}")).collect() };
    use ListOrder::{Newest, Oldest};
    use TaskState::{Downloading, Queued};
    for limit in [1, 2, 50] {
        let downloading =
            |order, after: Option<u64>, before: Option<u64>| pages(store, q(Downloading, order, after, before, limit));
        assert_eq!(downloading(Oldest, None, None).await.concat(), named(&["1", "2", "4"]));
        assert_eq!(downloading(Newest, None, None).await.concat(), named(&["4", "2", "1"]));
        assert_eq!(downloading(Newest, Some(2), None).await.concat(), named(&["4", "2"]));
        assert_eq!(downloading(Oldest, Some(2), Some(4)).await.concat(), named(&["2"]));
        let queued =
            |order, after: Option<u64>, before: Option<u64>| pages(store, q(Queued, order, after, before, limit));
        assert_eq!(queued(Oldest, None, None).await.concat(), named(&["urgent", "0", "3", "5"]));
        assert_eq!(queued(Newest, None, None).await.concat(), named(&["5", "3", "0", "urgent"]));
        assert_eq!(queued(Newest, Some(3), None).await.concat(), named(&["5", "3", "urgent"]));
        assert_eq!(queued(Oldest, Some(1), Some(6)).await.concat(), named(&["3", "5"]));
        assert_eq!(queued(Oldest, Some(6), None).await.concat(), named(&["urgent"]));
    }
    let summer = Some(LabelFilter { key: "album".into(), value: "summer".into() });
    let labelled = ListQuery { label: summer.clone(), ..q(Queued, Newest, None, None, 10) };
    assert_eq!(pages(store, labelled).await.concat(), named(&["urgent"]));
    let labelled = ListQuery { label: summer, ..q(Downloading, Newest, None, None, 10) };
    assert!(pages(store, labelled).await.concat().is_empty());
}

pub async fn counts_tasks_in_flight(store: &impl TaskStore) {
    assert_eq!(store.count_in_flight().await.unwrap(), 0);
    let a = create_new(store, "tsk_if_a", T0).await;
    let b = create_new(store, "tsk_if_b", T0).await;
    create_new(store, "tsk_if_c", T0).await;
    assert_eq!(store.count_in_flight().await.unwrap(), 0, "queued tasks are not in flight");
    let a = start(store, &a, T0 + 1).await;
    start(store, &b, T0 + 1).await;
    assert_eq!(store.count_in_flight().await.unwrap(), 2);
    let asked = next(&a, Input::Cancel { reason: None }, T0 + 2);
    store.apply(&asked).await.unwrap();
    let done = next(&asked.task, ok_download(&asked.task), T0 + 3);
    store.apply(&done).await.unwrap();
    assert_eq!(store.get("tsk_if_a").await.unwrap().unwrap().state, TaskState::Cancelled);
    assert_eq!(store.count_in_flight().await.unwrap(), 1);
}

fn ok_download(task: &Task) -> Input {
    ok(task, imagepipe_contracts::Step::Download)
}

/// The success of `task`'s running `step`.
fn ok(task: &Task, step: imagepipe_contracts::Step) -> Input {
    Input::Result(Box::new(StepResult {
        task_id: task.id.clone(),
        step,
        attempt: task.current_attempt(),
        outcome: StepOutcome::Ok { output: crate::machine::tests::output(step) },
    }))
}

/// Creates task `id` (with idempotency key `key`) at `at` and runs every step to completion,
/// the last transition at `done`; the outbox is relayed (removed) as the engine would.
async fn complete(store: &impl TaskStore, id: &str, key: Option<&str>, at: u64, done: u64) -> Task {
    let d = created(id, key, at);
    assert_eq!(store.create(&d).await.unwrap(), Created::New);
    let mut task = start(store, &d.task, at).await;
    for step in imagepipe_contracts::Step::ALL {
        let now = if step == imagepipe_contracts::Step::Analyze { done } else { at };
        let d = next(&task, ok(&task, step), now);
        assert_eq!(store.apply(&d).await.unwrap(), Applied::Yes);
        task = d.task;
    }
    assert_eq!((task.state, task.updated_at), (TaskState::Completed, done));
    let relayed: Vec<_> = store.outbox(id).await.unwrap().into_iter().map(|e| e.id).collect();
    store.remove_outbox(id, &relayed).await.unwrap();
    task
}

/// Ids of every task a listing shows, page by page.
async fn listed(store: &impl TaskStore, state: Option<TaskState>) -> Vec<String> {
    let (mut ids, mut cursor) = (Vec::new(), None);
    loop {
        let page = store.list(&ListQuery { state, limit: 50, cursor, ..ListQuery::default() }).await.unwrap();
        ids.extend(page.tasks.into_iter().map(|t| t.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return ids,
        }
    }
}

pub async fn wake_index_hands_each_due_task_to_one_claimer(store: &impl TaskStore) {
    let lease = Duration::from_secs(30);
    create_new(store, "tsk_wake", T0).await;
    let grace = RELAY_GRACE.as_millis() as u64;
    assert!(store.claim_due(T0 + grace - 1, lease, 10).await.unwrap().is_empty(), "not before the relay grace");
    assert_eq!(store.claim_due(T0 + grace, lease, 10).await.unwrap(), ["tsk_wake"]);
    assert!(store.claim_due(T0 + grace, lease, 10).await.unwrap().is_empty(), "claimed once");
    let outbox: Vec<_> = store.outbox("tsk_wake").await.unwrap().into_iter().map(|e| e.id).collect();
    store.remove_outbox("tsk_wake", &outbox).await.unwrap();
    store.release("tsk_wake", T0 + grace).await.unwrap();
    assert!(store.claim_due(u64::MAX / 2, lease, 10).await.unwrap().is_empty(), "nothing left to do");
}

pub async fn expired_leases_make_a_task_due_again(store: &impl TaskStore) {
    let lease = Duration::from_secs(30);
    create_new(store, "tsk_lease", T0).await;
    let due = T0 + RELAY_GRACE.as_millis() as u64;
    assert_eq!(store.claim_due(due, lease, 10).await.unwrap(), ["tsk_lease"]);
    assert!(store.claim_due(due + 29_999, lease, 10).await.unwrap().is_empty());
    assert_eq!(store.claim_due(due + 30_000, lease, 10).await.unwrap(), ["tsk_lease"], "the claimer died");
}

pub async fn release_reindexes_from_the_stored_timer(store: &impl TaskStore) {
    let lease = Duration::from_secs(30);
    let task = create_new(store, "tsk_timer", T0).await;
    let task = start(store, &task, T0).await;
    let deadline = task.timer.unwrap();
    assert_eq!(deadline.kind, TimerKind::Deadline);
    let relay_due = T0 + RELAY_GRACE.as_millis() as u64;
    assert_eq!(store.claim_due(relay_due, lease, 10).await.unwrap(), ["tsk_timer"]);
    let outbox: Vec<_> = store.outbox("tsk_timer").await.unwrap().into_iter().map(|e| e.id).collect();
    store.remove_outbox("tsk_timer", &outbox).await.unwrap();
    store.release("tsk_timer", relay_due).await.unwrap();
    assert!(store.claim_due(deadline.due_at - 1, lease, 10).await.unwrap().is_empty());
    assert_eq!(store.claim_due(deadline.due_at, lease, 10).await.unwrap(), ["tsk_timer"]);
}

pub async fn a_write_during_a_lease_keeps_the_task_indexed(store: &impl TaskStore) {
    let lease = Duration::from_secs(30);
    let task = create_new(store, "tsk_race", T0).await;
    let relay_due = T0 + RELAY_GRACE.as_millis() as u64;
    assert_eq!(store.claim_due(relay_due, lease, 10).await.unwrap(), ["tsk_race"]);
    // another replica starts the task while this one holds the lease
    let started = start(store, &task, relay_due).await;
    let outbox: Vec<_> = store.outbox("tsk_race").await.unwrap().into_iter().map(|e| e.id).collect();
    store.remove_outbox("tsk_race", &outbox).await.unwrap();
    store.release("tsk_race", relay_due).await.unwrap();
    let deadline = started.timer.unwrap().due_at;
    let due = store.claim_due(deadline, lease, 10).await.unwrap();
    assert_eq!(due, ["tsk_race"], "the new deadline is indexed");
}

pub async fn concurrent_claims_are_disjoint(store: &impl TaskStore) {
    for i in 0..20 {
        create_new(store, &format!("tsk_cc_{i:02}"), T0).await;
    }
    let now = T0 + RELAY_GRACE.as_millis() as u64;
    let lease = Duration::from_secs(30);
    let (a, b) = tokio::join!(store.claim_due(now, lease, 7), store.claim_due(now, lease, 7));
    let (a, b) = (a.unwrap(), b.unwrap());
    let c = store.claim_due(now, lease, 100).await.unwrap();
    let mut all: Vec<_> = a.iter().chain(&b).chain(&c).cloned().collect();
    assert_eq!(all.len(), 20);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 20, "no task claimed twice");
}

pub async fn dead_letters_are_archived_paged_and_removed(store: &impl TaskStore) {
    for i in 0..3u64 {
        let letter = DeadLetter {
            id: format!("dl_{i}"),
            source: "tasks.submit".into(),
            dlq: "dlq.tasks.submit".into(),
            reason: format!("bad {i}"),
            delivery_count: 1,
            dead_lettered_at: T0 + i,
            key: None,
            message_id: Some(format!("m{i}")),
            headers: vec![("traceparent".into(), "00-x".into())],
            body: "{".into(),
        };
        store.put_dead_letter(&letter).await.unwrap();
        store.put_dead_letter(&letter).await.unwrap();
    }
    let first = store.dead_letters(2, None).await.unwrap();
    let ids: Vec<_> = first.entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["dl_0", "dl_1"]);
    let rest = store.dead_letters(2, first.next_cursor.as_deref()).await.unwrap();
    assert_eq!(rest.entries.len(), 1);
    assert_eq!(rest.next_cursor, None);
    assert_eq!(store.dead_letter("dl_2").await.unwrap().unwrap().reason, "bad 2");
    assert!(store.remove_dead_letter("dl_1").await.unwrap());
    assert!(!store.remove_dead_letter("dl_1").await.unwrap());
    assert!(store.dead_letter("dl_1").await.unwrap().is_none());
    assert_eq!(store.dead_letters(10, None).await.unwrap().entries.len(), 2);
    assert_eq!(store.count_dead_letters().await.unwrap(), 2);
}

pub async fn finished_tasks_expire_after_retention(store: &impl TaskStore) {
    let retention = 7 * 24 * 3_600_000;
    complete(store, "tsk_old", Some("order-old"), T0, T0 + 10).await;
    let cancel = next(&create_new(store, "tsk_cancelled", T0 + 1).await, Input::Cancel { reason: None }, T0 + 20);
    store.apply(&cancel).await.unwrap();
    assert_eq!(cancel.task.state, TaskState::Cancelled);
    let running = start(store, &create_new(store, "tsk_running", T0 + 2).await, T0 + 3).await;

    assert_eq!(store.expire_finished(T0 + 9, 100).await.unwrap(), 0, "nothing finished that early");
    assert_eq!(store.expire_finished(T0 + 10, 100).await.unwrap(), 1, "finished at the cut-off: expired");
    assert!(store.get("tsk_old").await.unwrap().is_none());
    assert!(store.history("tsk_old").await.unwrap().is_empty());
    assert!(store.outbox("tsk_old").await.unwrap().is_empty());
    assert_eq!(store.find_by_idempotency_key("order-old").await.unwrap(), None);
    assert_eq!(listed(store, None).await, ["tsk_cancelled", "tsk_running"]);
    assert!(listed(store, Some(TaskState::Completed)).await.is_empty());
    assert_eq!(store.expire_finished(T0 + 10, 100).await.unwrap(), 0, "expiry is repeatable");

    assert_eq!(store.expire_finished(T0 + 20 + retention, 100).await.unwrap(), 1);
    assert!(store.get("tsk_cancelled").await.unwrap().is_none());
    assert!(listed(store, Some(TaskState::Cancelled)).await.is_empty());
    assert_eq!(store.get("tsk_running").await.unwrap().unwrap(), running, "an unfinished task never expires");
    assert_eq!(store.count_in_flight().await.unwrap(), 1);
    assert_eq!(listed(store, Some(TaskState::Downloading)).await, ["tsk_running"]);

    // The id and the idempotency key are free again.
    let again = created("tsk_old", Some("order-old"), T0 + 30);
    assert_eq!(store.create(&again).await.unwrap(), Created::New);
    assert_eq!(store.find_by_idempotency_key("order-old").await.unwrap().as_deref(), Some("tsk_old"));
    assert_eq!(store.history("tsk_old").await.unwrap().len(), 1, "no history of the expired task is left");
    assert_eq!(listed(store, Some(TaskState::Queued)).await, ["tsk_old"]);
}

pub async fn expiry_takes_batches_and_spares_unfinished_tasks(store: &impl TaskStore) {
    for i in 0..5u64 {
        complete(store, &format!("tsk_batch_{i}"), None, T0, T0 + 100 + i).await;
    }
    // A task whose terminal transition lost its compare-and-set to a start: never finished.
    let queued = create_new(store, "tsk_lost", T0).await;
    let lost = next(&queued, Input::Cancel { reason: None }, T0 + 500);
    start(store, &queued, T0 + 500).await;
    assert_eq!(store.apply(&lost).await.unwrap(), Applied::Conflict);

    let cutoff = T0 + 1_000;
    assert_eq!(store.expire_finished(cutoff, 2).await.unwrap(), 2, "at most the batch");
    assert_eq!(store.expire_finished(cutoff, 2).await.unwrap(), 2);
    let mut left = 0;
    for _ in 0..3 {
        left += store.expire_finished(cutoff, 2).await.unwrap();
    }
    assert_eq!(left, 1, "the last finished task, and nothing else");
    assert_eq!(listed(store, None).await, ["tsk_lost"]);
    assert_eq!(store.get("tsk_lost").await.unwrap().unwrap().state, TaskState::Downloading);
    assert_eq!(store.expire_finished(u64::MAX / 2, 100).await.unwrap(), 0);
}

pub async fn dead_letters_are_capped_by_age_count_and_body_size(store: &impl TaskStore) {
    let letter = |i: u64, body: String| DeadLetter {
        id: format!("dl_cap_{i}"),
        source: "tasks.download".into(),
        dlq: "dlq.tasks.download".into(),
        reason: "bad".into(),
        delivery_count: 5,
        dead_lettered_at: T0 + i,
        key: None,
        message_id: None,
        headers: vec![],
        body,
    };
    // 'é' is two bytes: the cut lands inside one and moves back to a character boundary.
    let big = format!("x{}", "é".repeat(super::DEAD_LETTER_BODY_BYTES));
    for i in 0..6 {
        let body = if i == 5 { big.clone() } else { format!("{{\"n\":{i}}}") };
        store.put_dead_letter(&letter(i, body)).await.unwrap();
    }
    let kept = store.dead_letter("dl_cap_5").await.unwrap().unwrap();
    assert!(kept.body.len() <= super::DEAD_LETTER_BODY_BYTES && kept.body.len() > super::DEAD_LETTER_BODY_BYTES - 2);
    assert!(big.starts_with(&kept.body));
    assert!(kept.body_was_cut());
    assert_eq!(kept.headers, [(super::BODY_CUT_HEADER.to_owned(), big.len().to_string())]);
    assert!(!store.dead_letter("dl_cap_4").await.unwrap().unwrap().body_was_cut());

    assert_eq!(store.trim_dead_letters(T0 + 1, 100, 100).await.unwrap(), 2, "as old as the age limit or older");
    assert_eq!(store.trim_dead_letters(T0 + 1, 3, 100).await.unwrap(), 1, "the oldest beyond the count");
    assert_eq!(store.trim_dead_letters(T0, 1, 1).await.unwrap(), 1, "at most `max` per call");
    let ids: Vec<_> = store.dead_letters(10, None).await.unwrap().entries.into_iter().map(|e| e.id).collect();
    assert_eq!(ids, ["dl_cap_4", "dl_cap_5"]);
    assert_eq!(store.trim_dead_letters(T0, 2, 100).await.unwrap(), 0);
}

/// Runs one task with an idempotency key to completion, lets the sweeper claim and release it
/// as it would right after, and expires it; the store should hold nothing afterwards.
pub async fn expire_the_only_task(store: &impl TaskStore) {
    complete(store, "tsk_gone", Some("order-gone"), T0, T0 + 10).await;
    let relay_due = T0 + 10 + RELAY_GRACE.as_millis() as u64;
    for id in store.claim_due(relay_due, Duration::from_secs(30), 10).await.unwrap() {
        store.release(&id, relay_due).await.unwrap();
    }
    assert_eq!(store.expire_finished(T0 + 10, 10).await.unwrap(), 1);
    assert!(store.get("tsk_gone").await.unwrap().is_none());
}

/// Writes a task cancelled while queued: created at `T0`, cancelled at `T0 + 50`.
pub async fn write_a_cancelled_task(store: &impl TaskStore) {
    let cancel = next(&create_new(store, "tsk_cancelled_early", T0).await, Input::Cancel { reason: None }, T0 + 50);
    assert_eq!(store.apply(&cancel).await.unwrap(), Applied::Yes);
    assert_eq!(cancel.task.state, TaskState::Cancelled);
}

/// Checks that the task of [`write_a_cancelled_task`] expires by the time it was cancelled,
/// not the time it was created.
pub async fn check_the_cancelled_task_expires(store: &impl TaskStore) {
    assert_eq!(store.expire_finished(T0 + 49, 10).await.unwrap(), 0, "expires by its finish, not its creation");
    assert!(store.get("tsk_cancelled_early").await.unwrap().is_some());
    assert_eq!(store.expire_finished(T0 + 50, 10).await.unwrap(), 1);
    assert!(store.get("tsk_cancelled_early").await.unwrap().is_none());
}

/// Writes a created and started task; returns its id (for restart tests).
pub async fn write_a_started_task(store: &impl TaskStore) -> String {
    let task = create_new(store, "tsk_durable", T0).await;
    start(store, &task, T0 + 1).await;
    task.id
}

/// Checks what [`write_a_started_task`] wrote is all still there.
pub async fn check_a_started_task(store: &impl TaskStore, id: &str) {
    let task = store.get(id).await.unwrap().unwrap();
    assert_eq!((task.version, task.state), (2, TaskState::Downloading));
    assert_eq!(store.history(id).await.unwrap().len(), 2);
    assert_eq!(store.outbox(id).await.unwrap().len(), 2);
    assert_eq!(store.count_in_flight().await.unwrap(), 1);
    let due = T0 + 1 + RELAY_GRACE.as_millis() as u64;
    assert_eq!(store.claim_due(due, Duration::from_secs(1), 10).await.unwrap(), [id]);
}

/// Writes `n` tasks (one in 100 labelled `album=summer`, one created per ms from `T0`) and
/// times listings of them: the median of 20 runs of each, in ms, printed and returned as
/// `(name, ms)`. For the ignored timing tests of the backends.
pub async fn time_listings(store: &impl TaskStore, n: u64) -> Vec<(&'static str, f64)> {
    let write = std::time::Instant::now();
    let mut i = 0;
    while i < n {
        let batch: Vec<Decision> = (i..n.min(i + 1_000))
            .map(|i| {
                let labels: &[(&str, &str)] = if i % 100 == 0 { &[("album", "summer")] } else { &[] };
                created_with(&format!("tsk_perf_{i:07}"), T0 + i, labels, Priority::Normal)
            })
            .collect();
        assert!(store.apply_many(&batch).await.unwrap().iter().all(|a| *a == Applied::Yes));
        i += 1_000;
    }
    println!("wrote {n} tasks in {:.1} s", write.elapsed().as_secs_f64());
    let summer = Some(LabelFilter { key: "album".into(), value: "summer".into() });
    let newest = ListQuery { limit: 50, order: ListOrder::Newest, ..ListQuery::default() };
    let deep = store.list(&ListQuery { limit: 500, cursor: None, ..newest.clone() }).await.unwrap().next_cursor;
    let cases = [
        ("newest first, first page of 50", newest.clone()),
        ("oldest first, first page of 50", ListQuery { order: ListOrder::Oldest, ..newest.clone() }),
        ("newest first, page of 50 after a cursor", ListQuery { cursor: deep, ..newest.clone() }),
        (
            "newest first, 50 in a time range of the middle",
            ListQuery { created_after: Some(T0 + n / 2), created_before: Some(T0 + n / 2 + 1_000), ..newest.clone() },
        ),
        ("newest first, label (1 in 100), 50", ListQuery { label: summer.clone(), ..newest.clone() }),
        (
            "newest first, label matching none (scan bound)",
            ListQuery { label: Some(LabelFilter { key: "album".into(), value: "winter".into() }), ..newest.clone() },
        ),
    ];
    let mut timings = Vec::new();
    for (name, query) in cases {
        let mut runs = Vec::new();
        for _ in 0..20 {
            let started = std::time::Instant::now();
            let page = store.list(&query).await.unwrap();
            runs.push(started.elapsed().as_secs_f64() * 1e3);
            assert!(page.tasks.len() <= 50);
        }
        runs.sort_by(f64::total_cmp);
        println!("{name}: median {:.2} ms, max {:.2} ms", runs[10], runs[19]);
        timings.push((name, runs[10]));
    }
    timings
}

/// A blob key made of one repeated hex digit.
fn blob(digit: char) -> String {
    format!("sha256:{}", digit.to_string().repeat(64))
}

/// Runs task `id`, uploaded as blob `source`, to completion at `done`: its metadata step wrote
/// `thumbnail` and `preview`.
async fn complete_upload(store: &impl TaskStore, id: &str, source: &str, thumbnail: &str, preview: &str, done: u64) {
    let submit = SubmitTask { blob: Some(source.to_owned()), ..SubmitTask::default() };
    let d = machine::create(id.into(), &submit, submit.validate().unwrap(), TraceId::random(), T0);
    assert_eq!(store.create(&d).await.unwrap(), Created::New);
    let task = start(store, &d.task, T0).await;
    let task = run_steps(store, task, &imagepipe_contracts::Step::ALL, [source, thumbnail, preview], done).await;
    assert_eq!(task.state, TaskState::Completed);
}

/// Applies the results of `steps` to `task`, in order, at `at`: the download stored blob
/// `source`, the metadata step `thumbnail` and `preview`. The task after the last.
async fn run_steps(
    store: &impl TaskStore,
    mut task: Task,
    steps: &[imagepipe_contracts::Step],
    [source, thumbnail, preview]: [&str; 3],
    at: u64,
) -> Task {
    use imagepipe_contracts::step::{StepOutput, Thumbnail};
    for step in steps.iter().copied() {
        let output = match crate::machine::tests::output(step) {
            StepOutput::Download(mut download) => {
                download.blob_key = source.to_owned();
                StepOutput::Download(download)
            }
            StepOutput::Metadata(mut metadata) => {
                metadata.thumbnail_key = thumbnail.to_owned();
                let derivative = |name: &str, key: &str| Thumbnail {
                    name: name.into(),
                    key: key.into(),
                    format: "webp".into(),
                    width: 1,
                    height: 1,
                    size: 1,
                };
                metadata.thumbnails = vec![derivative("thumbnail", thumbnail), derivative("preview", preview)];
                metadata.preview_key = Some(preview.to_owned());
                StepOutput::Metadata(metadata)
            }
            other => other,
        };
        let result = StepResult {
            task_id: task.id.clone(),
            step,
            attempt: task.current_attempt(),
            outcome: StepOutcome::Ok { output },
        };
        let d = next(&task, Input::Result(Box::new(result)), at);
        assert_eq!(store.apply(&d).await.unwrap(), Applied::Yes);
        task = d.task;
    }
    task
}

/// A task reprocessed from its metadata step drops its derivatives for new ones: the old stay
/// referenced while it lives, and every one of its blobs is released when it expires.
pub async fn blobs_a_task_replaced_are_released_when_it_expires(store: &impl TaskStore) {
    use imagepipe_contracts::Step;
    let (upload, thumb_1, preview_1, thumb_2, preview_2) = (blob('1'), blob('2'), blob('3'), blob('4'), blob('5'));
    complete_upload(store, "tsk_redone", &upload, &thumb_1, &preview_1, T0 + 10).await;
    let done = store.get("tsk_redone").await.unwrap().unwrap();
    let again = next(&done, Input::Reprocess { from: Step::Metadata, priority: None }, T0 + 20);
    assert_eq!(store.apply(&again).await.unwrap(), Applied::Yes);
    assert!(!crate::store::encode(&again.task).contains(&thumb_1), "the reprocessing dropped the derivatives");
    let task =
        run_steps(store, again.task, &[Step::Metadata, Step::Analyze], [&upload, &thumb_2, &preview_2], T0 + 30).await;
    assert_eq!(task.state, TaskState::Completed);
    let all = [&upload, &thumb_1, &preview_1, &thumb_2, &preview_2].map(String::as_str);
    assert_eq!(store.referenced_blobs(&all).await.unwrap(), [true; 5], "every blob the task had, while it lives");

    assert_eq!(store.expire_finished(T0 + 30, 10).await.unwrap(), 1);
    let mut released = store.take_released_blobs(10).await.unwrap();
    released.sort();
    assert_eq!(released, all, "all of them, the replaced derivatives too");
    assert_eq!(store.referenced_blobs(&all).await.unwrap(), [false; 5]);
}

pub async fn blob_references_follow_their_tasks(store: &impl TaskStore) {
    let (upload, thumb_1, preview_1, thumb_2, preview_2, stray, unknown) =
        (blob('a'), blob('b'), blob('c'), blob('d'), blob('e'), blob('f'), blob('0'));
    let queued = SubmitTask { blob: Some(stray.clone()), ..SubmitTask::default() };
    let d = machine::create("tsk_blob_queued".into(), &queued, queued.validate().unwrap(), TraceId::random(), T0);
    assert_eq!(store.create(&d).await.unwrap(), Created::New);
    let all = [&upload, &thumb_1, &preview_1, &thumb_2, &preview_2, &stray, &unknown].map(String::as_str);
    assert_eq!(
        store.referenced_blobs(&all).await.unwrap(),
        [false, false, false, false, false, true, false],
        "a queued upload's source is referenced from its creation"
    );
    // The same image uploaded twice: one blob, two tasks.
    complete_upload(store, "tsk_blob_1", &upload, &thumb_1, &preview_1, T0 + 10).await;
    complete_upload(store, "tsk_blob_2", &upload, &thumb_2, &preview_2, T0 + 20).await;
    assert_eq!(store.referenced_blobs(&all).await.unwrap(), [true, true, true, true, true, true, false]);
    assert!(store.take_released_blobs(10).await.unwrap().is_empty(), "nothing expired, nothing released");

    assert_eq!(store.expire_finished(T0 + 10, 10).await.unwrap(), 1);
    assert_eq!(
        store.referenced_blobs(&all).await.unwrap(),
        [true, false, false, true, true, true, false],
        "the other task still references the upload"
    );
    let mut released = store.take_released_blobs(10).await.unwrap();
    released.sort();
    assert_eq!(released, [thumb_1.clone(), preview_1.clone()]);
    assert!(store.take_released_blobs(10).await.unwrap().is_empty(), "each released key is handed out once");

    assert_eq!(store.expire_finished(T0 + 20, 10).await.unwrap(), 1);
    assert_eq!(store.take_released_blobs(1).await.unwrap().len(), 1, "at most `max`");
    assert_eq!(store.take_released_blobs(10).await.unwrap().len(), 2, "the upload and the second's derivatives");
    assert_eq!(store.referenced_blobs(&all).await.unwrap(), [false, false, false, false, false, true, false]);
    assert!(store.referenced_blobs(&[]).await.unwrap().is_empty());
}

/// Writes a task uploaded as a blob and completed; returns its blob keys (for upgrade tests).
pub async fn write_a_blob_task(store: &impl TaskStore) -> Vec<String> {
    let (upload, thumbnail, preview) = (blob('1'), blob('2'), blob('3'));
    complete_upload(store, "tsk_blob_legacy", &upload, &thumbnail, &preview, T0 + 10).await;
    vec![upload, thumbnail, preview]
}

/// Checks that every one of `keys` is referenced.
pub async fn check_blobs_referenced(store: &impl TaskStore, keys: &[String]) {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(store.referenced_blobs(&keys).await.unwrap(), vec![true; keys.len()]);
}

// --- Shards ---

/// The shard of `id` in a suite store (opened with the default count).
fn shard(id: &str) -> u16 {
    shard_of(id, DEFAULT_SHARDS)
}

/// Ids `<stem>_<n>` of shard `shard`, the first `count` of them.
fn ids_in_shard(stem: &str, shard: u16, count: usize) -> Vec<String> {
    (0..).map(|n| format!("{stem}_{n}")).filter(|id| self::shard(id) == shard).take(count).collect()
}

/// `decision` carrying `lease` as its fence, written at `now`.
fn fenced(mut decision: Decision, lease: &Lease, now: u64) -> Decision {
    decision.fence = Some(Fence { shard: lease.shard, token: lease.token, now });
    decision
}

pub async fn leases_are_taken_renewed_released_and_run_out(store: &impl TaskStore) {
    let ttl = Duration::from_secs(5);
    assert!(store.leases().await.unwrap().is_empty(), "no shard leased yet");
    let taken = store.acquire_shards("a", &[3, 4], T0, ttl).await.unwrap();
    let lease = |shard, owner: &str, token, expires_at| Lease { shard, owner: owner.into(), token, expires_at };
    assert_eq!(taken, [Some(lease(3, "a", 1, T0 + 5_000)), Some(lease(4, "a", 1, T0 + 5_000))]);

    let renewed = store.acquire_shards("a", &[3], T0 + 1_000, ttl).await.unwrap();
    assert_eq!(renewed, [Some(lease(3, "a", 1, T0 + 6_000))], "a renewal keeps the token");
    assert_eq!(
        store.acquire_shards("b", &[3, 4, 5], T0 + 2_000, ttl).await.unwrap(),
        [None, None, Some(lease(5, "b", 1, T0 + 7_000))]
    );

    // A release with a stale token, or by another owner, changes nothing.
    store.release_shards("a", &[lease(3, "a", 0, T0 + 6_000)]).await.unwrap();
    store.release_shards("b", &[lease(3, "a", 1, T0 + 6_000)]).await.unwrap();
    assert_eq!(store.acquire_shards("b", &[3], T0 + 2_000, ttl).await.unwrap(), [None]);
    store.release_shards("a", &[lease(3, "a", 1, T0 + 6_000)]).await.unwrap();
    assert_eq!(store.leases().await.unwrap()[0], lease(3, "", 1, 0), "released: free at once, the token kept");
    assert_eq!(
        store.acquire_shards("b", &[3], T0 + 2_000, ttl).await.unwrap(),
        [Some(lease(3, "b", 2, T0 + 7_000))],
        "the next owner's token is higher"
    );

    // Shard 4 runs out at T0 + 5 s: still a's until then, anyone's from then on.
    assert_eq!(store.acquire_shards("b", &[4], T0 + 4_999, ttl).await.unwrap(), [None]);
    assert_eq!(store.acquire_shards("b", &[4], T0 + 5_000, ttl).await.unwrap(), [Some(lease(4, "b", 2, T0 + 10_000))]);
    // An owner whose own lease ran out takes it anew, with a new token.
    assert_eq!(store.acquire_shards("b", &[5], T0 + 8_000, ttl).await.unwrap(), [Some(lease(5, "b", 2, T0 + 13_000))]);
    // Released by its owner and taken back by it: the token still goes up.
    store.release_shards("b", &[lease(5, "b", 2, T0 + 13_000)]).await.unwrap();
    assert_eq!(store.acquire_shards("b", &[5], T0 + 8_000, ttl).await.unwrap(), [Some(lease(5, "b", 3, T0 + 13_000))]);

    let mut leases = store.leases().await.unwrap();
    leases.sort_by_key(|l| l.shard);
    assert_eq!(leases, [lease(3, "b", 2, T0 + 7_000), lease(4, "b", 2, T0 + 10_000), lease(5, "b", 3, T0 + 13_000)]);
    assert!(store.acquire_shards("a", &[], T0, ttl).await.unwrap().is_empty());
    assert!(matches!(store.acquire_shards("", &[9], T0, ttl).await, Err(StoreError::EmptyReplicaId { .. })));
}

pub async fn owners_racing_for_a_shard_get_it_once(store: &impl TaskStore) {
    let ttl = Duration::from_secs(5);
    for round in 0..10u64 {
        let now = T0 + round * 10_000;
        let shards = [7, 8];
        let (a, b) =
            tokio::join!(store.acquire_shards("a", &shards, now, ttl), store.acquire_shards("b", &shards, now, ttl));
        let (a, b) = (a.unwrap(), b.unwrap());
        for i in 0..shards.len() {
            assert!(a[i].is_some() != b[i].is_some(), "round {round}, shard {}: {a:?} / {b:?}", shards[i]);
            let winner = a[i].as_ref().or(b[i].as_ref()).unwrap();
            assert_eq!(winner.token, round + 1, "one token per change of hands");
        }
    }
}

pub async fn a_write_under_a_lost_lease_is_fenced_and_writes_nothing(store: &impl TaskStore) {
    let ttl = Duration::from_secs(5);
    let id = "tsk_fence";
    let shard = shard(id);
    let a = store.acquire_shards("a", &[shard], T0, ttl).await.unwrap().remove(0).unwrap();
    let new = fenced(created(id, None, T0), &a, T0);
    assert_eq!(store.create(&new).await.unwrap(), Created::New, "a current fence writes");
    let mut started = fenced(next(&new.task, Input::Start, T0 + 1), &a, T0 + 1);
    started.history.replica = Some("a".into());
    assert_eq!(store.apply_many(std::slice::from_ref(&started)).await.unwrap(), [Applied::Yes]);
    let written = store.history(id).await.unwrap();
    assert_eq!(written.last().and_then(|h| h.replica.as_deref()), Some("a"), "the writing replica is kept");

    // a stops renewing; b takes the shard once the lease ran out.
    let b = store.acquire_shards("b", &[shard], T0 + 5_000, ttl).await.unwrap().remove(0).unwrap();
    assert_eq!(b.token, a.token + 1);
    let task = store.get(id).await.unwrap().unwrap();
    let history = store.history(id).await.unwrap();
    let outbox = store.outbox(id).await.unwrap();
    let cancel = next(&task, Input::Cancel { reason: None }, T0 + 6_000);
    // a wakes up late: whatever time it believes it is, its token is not the lease's.
    for believed in [T0 + 2, T0 + 6_000] {
        let late = fenced(cancel.clone(), &a, believed);
        assert_eq!(store.apply_many(std::slice::from_ref(&late)).await.unwrap(), [Applied::Fenced]);
        assert_eq!(store.apply(&late).await.unwrap(), Applied::Fenced);
    }
    assert_eq!(store.get(id).await.unwrap().unwrap(), task, "the task is unchanged");
    assert_eq!(store.history(id).await.unwrap(), history, "no history entry");
    assert_eq!(store.outbox(id).await.unwrap(), outbox, "no outbox entry");
    assert_eq!(store.count_in_flight().await.unwrap(), 1);
    let other = ids_in_shard("tsk_fence_new", shard, 1).remove(0);
    let refused = store.create(&fenced(created(&other, None, T0 + 6_000), &a, T0 + 6_000)).await;
    assert!(matches!(&refused, Err(StoreError::Fenced { shard: s, token, .. }) if *s == shard && *token == a.token));
    assert!(store.get(&other).await.unwrap().is_none(), "a fenced creation writes nothing");
    assert!(store.history(&other).await.unwrap().is_empty());

    // In a batch, each decision is fenced on its own; b's current fence writes.
    let unfenced = created("tsk_fence_free", None, T0 + 6_000);
    let batch = [fenced(cancel.clone(), &a, T0 + 6_000), unfenced.clone()];
    assert_eq!(store.apply_many(&batch).await.unwrap(), [Applied::Fenced, Applied::Yes]);
    assert_eq!(store.apply(&fenced(cancel.clone(), &b, T0 + 6_000)).await.unwrap(), Applied::Yes);
    assert_eq!(store.history(id).await.unwrap().len(), history.len() + 1);

    // A lease that ran out fences its own owner's writes too, until renewed.
    let again = next(&store.get(id).await.unwrap().unwrap(), ok_download(&task), T0 + 11_000);
    assert_eq!(store.apply(&fenced(again.clone(), &b, T0 + 11_000)).await.unwrap(), Applied::Fenced);
    let renewed = store.acquire_shards("b", &[shard], T0 + 11_000, ttl).await.unwrap().remove(0).unwrap();
    assert_eq!(store.apply(&fenced(again, &renewed, T0 + 11_000)).await.unwrap(), Applied::Yes);
}

pub async fn pinning_another_shard_count_is_refused(store: &impl TaskStore) {
    store.pin_shards(DEFAULT_SHARDS).await.unwrap();
    store.pin_shards(DEFAULT_SHARDS).await.unwrap();
    let refused = store.pin_shards(16).await.unwrap_err();
    assert!(matches!(refused, StoreError::ShardsChanged { stored: DEFAULT_SHARDS, configured: 16 }), "{refused:?}");
    let message = refused.to_string();
    assert!(message.contains("coordinator.shards is 16 but this store was written with 64 shards"), "{message}");
    assert!(message.contains("set it back to 64"), "{message}");
}

pub async fn replicas_are_forgotten_when_their_announcement_runs_out(store: &impl TaskStore) {
    let replica = |id: &str, heartbeat_at| Replica {
        id: id.into(),
        address: Some(format!("http://{id}:8080")),
        started_at: T0,
        heartbeat_at,
    };
    let ttl = Duration::from_secs(5);
    store.heartbeat(&replica("b", T0), ttl).await.unwrap();
    store.heartbeat(&replica("a", T0 + 3_000), ttl).await.unwrap();
    assert_eq!(store.replicas(T0 + 4_999).await.unwrap(), [replica("a", T0 + 3_000), replica("b", T0)]);
    assert_eq!(store.replicas(T0 + 5_000).await.unwrap(), [replica("a", T0 + 3_000)], "b's ran out");
    // b comes back: announced anew.
    store.heartbeat(&replica("b", T0 + 6_000), ttl).await.unwrap();
    store.heartbeat(&replica("a", T0 + 6_000), ttl).await.unwrap();
    assert_eq!(store.replicas(T0 + 7_000).await.unwrap().len(), 2);
    store.leave("a").await.unwrap();
    assert_eq!(store.replicas(T0 + 7_000).await.unwrap(), [replica("b", T0 + 6_000)]);
    store.leave("no-such-replica").await.unwrap();
    assert!(store.replicas(T0 + 11_000).await.unwrap().is_empty());
    assert!(matches!(store.heartbeat(&replica("", T0), ttl).await, Err(StoreError::EmptyReplicaId { .. })));
}

pub async fn handovers_are_capped_and_newest_first(store: &impl TaskStore) {
    assert!(store.handovers(10).await.unwrap().is_empty());
    let handover = |i: u64| Handover {
        shard: (i % 64) as u16,
        from: (i % 2 == 0).then(|| "a".to_owned()),
        to: Some("b".into()),
        at: T0 + i,
        reason: if i % 2 == 0 { "expired".into() } else { "free".into() },
    };
    let all: Vec<Handover> = (0..HANDOVERS_KEPT as u64 + 44).map(handover).collect();
    for batch in all.chunks(100) {
        store.record_handovers(batch).await.unwrap();
    }
    store.record_handovers(&[]).await.unwrap();
    let newest = store.handovers(3).await.unwrap();
    let last = all.len() as u64 - 1;
    assert_eq!(newest, [handover(last), handover(last - 1), handover(last - 2)]);
    let kept = store.handovers(10_000).await.unwrap();
    assert_eq!(kept.len(), HANDOVERS_KEPT);
    assert_eq!(kept.last(), Some(&handover(44)), "the oldest beyond the cap are gone");
    assert!(store.handovers(0).await.unwrap().is_empty());
}

pub async fn claims_and_queues_per_shard_return_only_those_shards(store: &impl TaskStore) {
    let (x, y, z) = (5, 9, 40);
    let xs = ids_in_shard("tsk_shx", x, 3);
    let ys = ids_in_shard("tsk_shy", y, 2);
    let zs = ids_in_shard("tsk_shz", z, 1);
    let mut batch = Vec::new();
    for (i, id) in xs.iter().chain(&ys).chain(&zs).enumerate() {
        batch.push(created_with(id, T0 + i as u64, &[], Priority::Normal));
    }
    let urgent = ids_in_shard("tsk_shx_urgent", x, 1).remove(0);
    batch.push(created_with(&urgent, T0 + 100, &[], Priority::High));
    assert!(store.apply_many(&batch).await.unwrap().iter().all(|a| *a == Applied::Yes));
    // xs[1] starts, not yet settled: its queued entry is left for readers to skip.
    let started = next(&batch[1].task, Input::Start, T0 + 200);
    assert_eq!(store.apply_many(&[started]).await.unwrap(), [Applied::Yes]);

    let queued = |tasks: Vec<crate::task::Task>| tasks.into_iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(
        queued(store.queued_in(&[x], 10, 10).await.unwrap()),
        [urgent.as_str(), &xs[0], &xs[2]],
        "high first, then oldest"
    );
    assert_eq!(queued(store.queued_in(&[x], 2, 2).await.unwrap()), [urgent.as_str(), &xs[0]]);
    assert_eq!(
        queued(store.queued_in(&[y, x], 10, 10).await.unwrap()),
        [urgent.as_str(), &xs[0], &xs[2], &ys[0], &ys[1]],
        "merged across shards"
    );
    assert_eq!(queued(store.queued_in(&[z], 10, 10).await.unwrap()), [zs[0].as_str()]);
    assert!(store.queued_in(&[1, 2], 10, 10).await.unwrap().is_empty());
    assert!(store.queued_in(&[], 10, 10).await.unwrap().is_empty());
    assert!(store.queued_in(&[x], 0, 0).await.unwrap().is_empty());
    // Past `room`, only high tasks: at the cap, a start pass reads no normal task.
    assert_eq!(queued(store.queued_in(&[y, x], 0, 10).await.unwrap()), [urgent.as_str()], "no room: high only");
    assert_eq!(
        queued(store.queued_in(&[y, x], 1, 10).await.unwrap()),
        [urgent.as_str()],
        "the high one fills the room"
    );
    assert_eq!(
        queued(store.queued_in(&[y, x], 2, 10).await.unwrap()),
        [urgent.as_str(), &xs[0]],
        "room for one normal task after the high one"
    );
    assert!(store.queued_in(&[y], 0, 10).await.unwrap().is_empty(), "no high task among y's");

    // Every task is due for its creation's outbox (xs[1] keeps its earlier wake time).
    let lease = Duration::from_secs(30);
    let due = T0 + 100 + RELAY_GRACE.as_millis() as u64;
    let sorted = |mut ids: Vec<String>| {
        ids.sort();
        ids
    };
    let claimed = sorted(store.claim_due_in(&[x, z], due, lease, 10).await.unwrap());
    let mut in_x = xs.clone();
    in_x.push(urgent.clone());
    let in_x = sorted(in_x);
    let mut expected = in_x.clone();
    expected.push(zs[0].clone());
    assert_eq!(claimed, sorted(expected));
    assert!(store.claim_due_in(&[x, z], due, lease, 10).await.unwrap().is_empty(), "claimed once");
    assert_eq!(
        store.claim_due_in(&[y], due, lease, 1).await.unwrap(),
        [ys[0].clone()],
        "at most `max`, earliest first"
    );
    assert_eq!(store.claim_due(due, lease, 10).await.unwrap(), [ys[1].clone()], "the global claim takes the rest");
    assert!(store.claim_due(due, lease, 10).await.unwrap().is_empty());
    assert!(store.claim_due_in(&[x, y, z], due, lease, 10).await.unwrap().is_empty());

    // Released, a task is due again at its stored wake time; leases run out make the others
    // due again, each for its shard's claimer.
    store.release(&zs[0], due).await.unwrap();
    let after = due + 30_000;
    assert_eq!(sorted(store.claim_due_in(&[x], after, lease, 10).await.unwrap()), in_x);
    assert_eq!(store.claim_due_in(&[z], after, lease, 10).await.unwrap(), [zs[0].clone()]);
    assert_eq!(sorted(store.claim_due(after, lease, 10).await.unwrap()), sorted(ys.clone()));
}
