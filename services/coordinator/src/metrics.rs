//! Names of the coordinator's metrics (Prometheus, through the `metrics` facade).

/// Transitions applied; labels `to` (state) and `event` (history event).
pub const TRANSITIONS: &str = "imagepipe_coordinator_transitions_total";
/// Inputs acknowledged without effect (duplicates, stale results, stale timers); label `reason`.
pub const IGNORED: &str = "imagepipe_coordinator_ignored_inputs_total";
/// Inputs with no edge from the task's state, never applied; labels `input`, `state`.
pub const ILLEGAL: &str = "imagepipe_coordinator_illegal_transitions_total";
/// Transitions that lost their compare-and-set to another writer and were decided again.
pub const CONFLICTS: &str = "imagepipe_coordinator_version_conflicts_total";
/// Outbox entries the broker confirmed; label `kind` (`queue` or `event`).
pub const OUTBOX_PUBLISHED: &str = "imagepipe_coordinator_outbox_published_total";
/// Outbox publishes that failed (the entry stays and is relayed later).
pub const OUTBOX_ERRORS: &str = "imagepipe_coordinator_outbox_publish_errors_total";
/// Outbox entries the bus refused for good (too large): dead-lettered, their task failed.
pub const OUTBOX_UNDELIVERABLE: &str = "imagepipe_coordinator_outbox_undeliverable_total";
/// Timers fired; label `kind` (`deadline` or `retry`).
pub const TIMERS_FIRED: &str = "imagepipe_coordinator_timers_fired_total";
/// Tasks started and unfinished.
pub const IN_FLIGHT: &str = "imagepipe_coordinator_tasks_in_flight";
/// The configured cap on tasks in flight.
pub const IN_FLIGHT_CAP: &str = "imagepipe_coordinator_in_flight_cap";
/// 1 while the coordinator does not pull submissions; label `reason` (`in_flight_cap`).
pub const SUBMISSIONS_PAUSED: &str = "imagepipe_coordinator_submissions_paused";
/// Tasks accepted; label `origin` (`bus` or `http`).
pub const TASKS_CREATED: &str = "imagepipe_coordinator_tasks_created_total";
/// Submissions refused as invalid; label `origin`.
pub const SUBMISSIONS_REJECTED: &str = "imagepipe_coordinator_submissions_rejected_total";
/// Dead letters archived from the dead-letter queues; label `dlq`.
pub const DEAD_LETTERS_ARCHIVED: &str = "imagepipe_coordinator_dead_letters_archived_total";
/// Wake-index maintenance errors (a claimed task is retried when its lease ends), and failed
/// expiry passes.
pub const SWEEP_ERRORS: &str = "imagepipe_coordinator_sweep_errors_total";
/// Finished tasks deleted after `coordinator.retention`.
pub const TASKS_EXPIRED: &str = "imagepipe_coordinator_tasks_expired_total";
/// Archived dead letters deleted beyond `dlq.max_entries` or `dlq.max_age`.
pub const DEAD_LETTERS_TRIMMED: &str = "imagepipe_coordinator_dead_letters_trimmed_total";

/// The value of the `reason` label of [`SUBMISSIONS_PAUSED`].
pub const PAUSED_BY_CAP: &str = "in_flight_cap";
