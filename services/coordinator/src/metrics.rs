//! Names of the coordinator's metrics (Prometheus, through the `metrics` facade), and their
//! help texts ([`describe`]).

use metrics::{Unit, describe_counter, describe_gauge};

/// Transitions applied; labels `to` (state) and `event` (history event).
pub const TRANSITIONS: &str = "imagepipe_coordinator_transitions_total";
/// Inputs acknowledged without effect (duplicates, stale results, stale timers); label `reason`.
pub const IGNORED: &str = "imagepipe_coordinator_ignored_inputs_total";
/// Inputs with no edge from the task's state, never applied; labels `input`, `state`.
pub const ILLEGAL: &str = "imagepipe_coordinator_illegal_transitions_total";
/// Transitions that lost their compare-and-set to another writer and were decided again.
pub const CONFLICTS: &str = "imagepipe_coordinator_version_conflicts_total";
/// Batches of transitions fewer replicas acknowledged than `store.redis.min_replicas` (their
/// inputs are retried).
pub const UNREPLICATED: &str = "imagepipe_coordinator_unreplicated_batches_total";
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
/// Blobs deleted because no task referenced them past `blob.orphan_grace`, by `reason`
/// (`released`: their last task expired; `orphan`: found by the listing).
pub const BLOBS_DELETED: &str = "imagepipe_coordinator_blobs_deleted_total";

/// Messages of a task queue not yet finished by its consumer (waiting and unacknowledged), as
/// the broker counts them; label `queue`. Sampled every few seconds.
pub const QUEUE_DEPTH: &str = "imagepipe_queue_depth";
/// Messages of a task queue not yet delivered to its consumer (on Kafka: not yet committed);
/// label `queue`. Sampled every few seconds.
pub const CONSUMER_LAG: &str = "imagepipe_queue_consumer_lag";
/// Dead letters in the archive (`GET /v1/dlq`). Sampled every few seconds.
pub const DEAD_LETTERS: &str = "imagepipe_coordinator_dead_letters";

/// Shards this replica holds a lease on.
pub const SHARDS_OWNED: &str = "imagepipe_coordinator_shards_owned";
/// Shards that changed hands at this replica, by `reason` (`released`, `shutdown`: given up;
/// `expired`, `free`: taken).
pub const HANDOVERS: &str = "imagepipe_coordinator_shard_handovers_total";
/// Lease periods whose store calls failed (the leases may run out if it lasts).
pub const LEASE_ERRORS: &str = "imagepipe_coordinator_lease_errors_total";
/// Inputs handed on to their shard's partition (sent to the queue itself, or to a
/// partition of a shard this replica does not own), by `queue`.
pub const INPUTS_ROUTED: &str = "imagepipe_coordinator_inputs_routed_total";
/// Writes the store refused because the replica's lease on the shard was gone.
pub const WRITES_FENCED: &str = "imagepipe_coordinator_writes_fenced_total";

/// The value of the `reason` label of [`SUBMISSIONS_PAUSED`].
pub const PAUSED_BY_CAP: &str = "in_flight_cap";

/// The `queue` label of [`QUEUE_DEPTH`] and [`CONSUMER_LAG`]: a task queue (`tasks.download`).
pub const QUEUE: &str = "queue";

/// Gives every coordinator metric its `# HELP` text (once per process is enough; again is
/// harmless).
pub fn describe() {
    describe_counter!(TRANSITIONS, Unit::Count, "Task transitions applied, by to (state) and event (history event).");
    describe_counter!(
        IGNORED,
        Unit::Count,
        "Inputs acknowledged without effect (duplicates, stale results), by reason."
    );
    describe_counter!(
        ILLEGAL,
        Unit::Count,
        "Inputs with no edge from the task's state, never applied, by input and state."
    );
    describe_counter!(CONFLICTS, Unit::Count, "Transitions that lost their compare-and-set to another writer.");
    describe_counter!(
        UNREPLICATED,
        Unit::Count,
        "Batches of transitions fewer replicas acknowledged than store.redis.min_replicas (inputs retried)."
    );
    describe_counter!(OUTBOX_PUBLISHED, Unit::Count, "Outbox entries the broker confirmed, by kind (queue or event).");
    describe_counter!(OUTBOX_ERRORS, Unit::Count, "Outbox publishes that failed (the entry is relayed later).");
    describe_counter!(OUTBOX_UNDELIVERABLE, Unit::Count, "Outbox entries the bus refused for good (too large).");
    describe_counter!(TIMERS_FIRED, Unit::Count, "Timers fired, by kind (deadline or retry).");
    describe_gauge!(IN_FLIGHT, Unit::Count, "Tasks started and unfinished.");
    describe_gauge!(IN_FLIGHT_CAP, Unit::Count, "The configured cap on tasks in flight (coordinator.max_in_flight).");
    describe_gauge!(SUBMISSIONS_PAUSED, Unit::Count, "1 while submissions are not pulled, by reason.");
    describe_counter!(TASKS_CREATED, Unit::Count, "Tasks accepted, by origin (bus or http).");
    describe_counter!(SUBMISSIONS_REJECTED, Unit::Count, "Submissions refused as invalid, by origin.");
    describe_counter!(DEAD_LETTERS_ARCHIVED, Unit::Count, "Dead letters archived from the dead-letter queues, by dlq.");
    describe_counter!(SWEEP_ERRORS, Unit::Count, "Failed wake-index maintenance and expiry passes.");
    describe_counter!(TASKS_EXPIRED, Unit::Count, "Finished tasks deleted after coordinator.retention.");
    describe_counter!(
        DEAD_LETTERS_TRIMMED,
        Unit::Count,
        "Archived dead letters deleted beyond dlq.max_entries or dlq.max_age."
    );
    describe_counter!(
        BLOBS_DELETED,
        Unit::Count,
        "Blobs deleted when no task referenced them past blob.orphan_grace, by reason (released, orphan)."
    );
    describe_gauge!(QUEUE_DEPTH, Unit::Count, "Messages of a task queue not yet finished by its consumer, by queue.");
    describe_gauge!(
        CONSUMER_LAG,
        Unit::Count,
        "Messages of a task queue not yet delivered (Kafka: not committed), by queue."
    );
    describe_gauge!(DEAD_LETTERS, Unit::Count, "Dead letters in the archive (GET /v1/dlq).");
    describe_gauge!(SHARDS_OWNED, Unit::Count, "Shards this replica holds a lease on.");
    describe_counter!(
        HANDOVERS,
        Unit::Count,
        "Shards that changed hands at this replica, by reason (released, shutdown, expired, free)."
    );
    describe_counter!(LEASE_ERRORS, Unit::Count, "Lease periods whose store calls failed.");
    describe_counter!(INPUTS_ROUTED, Unit::Count, "Inputs handed on to their shard's partition, by queue.");
    describe_counter!(WRITES_FENCED, Unit::Count, "Writes refused because the replica's lease on the shard was gone.");
}
