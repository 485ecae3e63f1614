//! The one test suite every [`TaskStore`] passes. [`store_suite!`](crate::store_suite) expands
//! to one test per case, each on a fresh store from the backend's `make(name)`.

use std::time::Duration;

use imagepipe_contracts::{StepOutcome, StepResult, SubmitTask, TraceId};

use super::{Applied, Created, DeadLetter, ListQuery, Settled, StoreError, TaskStore};
use crate::machine::{self, Context, Decision, Input, Policy, Verdict};
use crate::task::{Task, TaskState, TimerKind};

/// The relay grace every suite store is opened with.
pub const RELAY_GRACE: Duration = Duration::from_secs(10);
const T0: u64 = 1_700_000_000_000;

/// Expands to one `#[tokio::test]` per suite case; `$make(name).await` returns a fresh store
/// and a guard that cleans it up when dropped.
#[macro_export]
#[doc(hidden)]
macro_rules! store_suite {
    ($make:path) => {
        $crate::store_suite!(@cases $make;
            create_is_idempotent_by_id_and_key,
            apply_is_a_compare_and_set_on_the_version,
            a_batch_applies_each_compare_and_set_on_its_own,
            history_keeps_every_transition_in_order,
            outbox_entries_stay_until_removed,
            lists_page_by_creation_and_filter_by_state,
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
        );
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let (store, _guard) = $make(stringify!($case)).await;
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
        let page = store.list(&ListQuery { state: None, limit: 2, cursor }).await.unwrap();
        assert!(page.tasks.len() <= 2);
        seen.extend(page.tasks.iter().map(|t| t.id.clone()));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let all: Vec<_> = (0..5).map(|i| format!("tsk_list_{i}")).collect();
    assert_eq!(seen, all);

    let downloading =
        store.list(&ListQuery { state: Some(TaskState::Downloading), limit: 10, cursor: None }).await.unwrap();
    let ids: Vec<_> = downloading.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["tsk_list_1", "tsk_list_3"]);
    assert!(downloading.tasks.iter().all(|t| t.state == TaskState::Downloading));
    let queued = store.list(&ListQuery { state: Some(TaskState::Queued), limit: 1, cursor: None }).await.unwrap();
    assert_eq!(queued.tasks[0].id, "tsk_list_0");
    let rest =
        store.list(&ListQuery { state: Some(TaskState::Queued), limit: 10, cursor: queued.next_cursor }).await.unwrap();
    let ids: Vec<_> = rest.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["tsk_list_2", "tsk_list_4"]);
    assert_eq!(rest.next_cursor, None);

    let bad = store.list(&ListQuery { state: None, limit: 1, cursor: Some("garbage".into()) }).await;
    assert!(matches!(bad, Err(StoreError::InvalidCursor(_))), "{bad:?}");
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
        let page = store.list(&ListQuery { state, limit: 50, cursor }).await.unwrap();
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
