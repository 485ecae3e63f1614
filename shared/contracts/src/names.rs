//! Logical names of queues, topics and headers (docs/design.md, "Queues and topics").
//!
//! Names here carry no prefix: a bus backend prepends its configured `bus.prefix`
//! (default `imagepipe`), so [`queues::DOWNLOAD`] becomes `imagepipe.tasks.download`.

/// Task queues: each message is a command for exactly one kind of worker.
pub mod queues {
    /// Task submissions, consumed by the coordinator.
    pub const SUBMIT: &str = "tasks.submit";
    /// ImageDownloadQueue, consumed by download-worker replicas.
    pub const DOWNLOAD: &str = "tasks.download";
    /// MetadataProcessingQueue, consumed by metadata-worker replicas.
    pub const METADATA: &str = "tasks.metadata";
    /// AIProcessingQueue, consumed by ai-worker replicas.
    pub const AI: &str = "tasks.ai";
    /// Step results, consumed by the coordinator.
    pub const RESULTS: &str = "tasks.results";
    /// Every task queue, in pipeline order (the `normal` lane of each laned queue).
    pub const ALL: [&str; 5] = [SUBMIT, DOWNLOAD, METADATA, AI, RESULTS];
    /// The queues with one lane per [`crate::Priority`] (`tasks.download.high`, ...): a task's
    /// step results travel in its lane too, so a high task's result is not behind a backlog's.
    pub const LANED: [&str; 5] = [SUBMIT, DOWNLOAD, METADATA, AI, RESULTS];

    /// Every task queue with every lane: [`ALL`] and the `high` / `low` lanes of [`LANED`].
    pub fn all_lanes() -> Vec<String> {
        let mut all: Vec<String> = ALL.iter().map(|q| (*q).to_owned()).collect();
        for queue in LANED {
            for priority in [crate::Priority::High, crate::Priority::Low] {
                all.push(priority.lane(queue));
            }
        }
        all
    }

    /// The stage queue an operator names by its short name: `download`, `metadata`, `ai`
    /// (or the queue's own name, `tasks.download`).
    pub fn stage(name: &str) -> Option<&'static str> {
        [DOWNLOAD, METADATA, AI].into_iter().find(|q| *q == name || q.strip_prefix("tasks.") == Some(name))
    }
}

/// Event topics: every subscriber group gets every event.
pub mod topics {
    /// Root of every event subject; on NATS an event's subject is this + `.` + its type.
    pub const EVENTS: &str = "events";
    /// ImageEventsQueue (`image.*` events); the Kafka topic name.
    pub const IMAGE_EVENTS: &str = "events.image";
    /// TaskLifecycleEventsQueue (`task.*` events); the Kafka topic name.
    pub const TASK_EVENTS: &str = "events.task";
    /// The events of stages of users' own (`stage.*`); the Kafka topic name.
    pub const STAGE_EVENTS: &str = "events.stage";
}

/// Message headers. Header names are lowercase on every backend.
pub mod headers {
    /// W3C trace context of the task's trace.
    pub const TRACEPARENT: &str = "traceparent";
    /// Schema version of the message body ([`crate::SCHEMA_VERSION`]).
    pub const SCHEMA: &str = "imagepipe-schema";
    /// The event type of an event message, so subscribers can skip without parsing.
    pub const EVENT_TYPE: &str = "imagepipe-event-type";
    /// Message id used for publish deduplication (`Nats-Msg-Id` on NATS).
    pub const MESSAGE_ID: &str = "imagepipe-message-id";
    /// On a dead letter: why it was dead-lettered.
    pub const DLQ_REASON: &str = "imagepipe-dlq-reason";
    /// On a dead letter: how many times it had been delivered.
    pub const DLQ_DELIVERY_COUNT: &str = "imagepipe-dlq-delivery-count";
    /// On a dead letter: the queue or subscriber group it was taken from.
    pub const DLQ_SOURCE: &str = "imagepipe-dlq-source";
    /// On a dead letter: Unix milliseconds when it was dead-lettered.
    pub const DLQ_TIMESTAMP: &str = "imagepipe-dlq-timestamp";
    /// On a stage command: the shard of its task ([`crate::shard::shard_of`]). A worker sends
    /// the step result to that partition of `tasks.results` (NATS subject
    /// `<prefix>.tasks.results[.<lane>].<shard>`, Kafka partition `<shard>`), where the
    /// coordinator that owns the shard reads it; without it, to the queue itself.
    pub const SHARD: &str = "imagepipe-shard";

    /// What the CloudEvents attribute headers start with: `ce-<attribute>` is the binding-neutral
    /// name (the HTTP and NATS bindings'); on Kafka a backend sends `ce_<attribute>` instead
    /// ([`crate::cloudevents`]).
    pub const CE_PREFIX: &str = "ce-";
    /// CloudEvents `id`: the event id, or a command's message id.
    pub const CE_ID: &str = "ce-id";
    /// CloudEvents `type`: the event type, or a command's [`crate::cloudevents::CommandType`].
    pub const CE_TYPE: &str = "ce-type";
    /// CloudEvents `source`: `/imagepipe/<service>`.
    pub const CE_SOURCE: &str = "ce-source";
    /// CloudEvents `specversion`: `1.0`.
    pub const CE_SPECVERSION: &str = "ce-specversion";
    /// CloudEvents `time`: RFC 3339.
    pub const CE_TIME: &str = "ce-time";
    /// CloudEvents `subject`: the task id.
    pub const CE_SUBJECT: &str = "ce-subject";
    /// The body's media type (`application/json`), the CloudEvents `datacontenttype` in binary
    /// mode (HTTP and Kafka bindings; the NATS binding also sends it as `ce-datacontenttype`).
    pub const CONTENT_TYPE: &str = "content-type";
}

/// Prefix of every dead-letter queue name.
pub const DLQ: &str = "dlq";

/// The dead-letter queue of a task queue (`tasks.download` → `dlq.tasks.download`). Every
/// priority lane of a queue shares its queue's (`tasks.download.high` → `dlq.tasks.download`);
/// a dead letter's source header still names the lane it came from.
pub fn dead_letter_queue(queue: &str) -> String {
    format!("{DLQ}.{}", crate::lane_of(queue).0)
}

/// The dead-letter queue of an event subscriber group (`analytics` → `dlq.events.analytics`).
pub fn dead_letter_queue_of_group(group: &str) -> String {
    format!("{DLQ}.{}.{group}", topics::EVENTS)
}

/// The topic an event type belongs to: `image.*` → [`topics::IMAGE_EVENTS`], `task.*` →
/// [`topics::TASK_EVENTS`], and so does `queue.*` (the task lifecycle topic family); any other
/// family `x.*` → `events.x`.
pub fn topic_of_event_type(event_type: &str) -> String {
    let family = event_type.split('.').next().unwrap_or(event_type);
    if family == "queue" {
        // `queue.paused` / `queue.resumed` travel with the task lifecycle events.
        return topics::TASK_EVENTS.to_owned();
    }
    format!("{}.{family}", topics::EVENTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_map_to_their_family_topic() {
        assert_eq!(topic_of_event_type("image.downloaded"), topics::IMAGE_EVENTS);
        assert_eq!(topic_of_event_type("task.completed"), topics::TASK_EVENTS);
    }

    #[test]
    fn dead_letter_names_keep_the_source_visible() {
        assert_eq!(dead_letter_queue(queues::DOWNLOAD), "dlq.tasks.download");
        assert_eq!(dead_letter_queue_of_group("analytics"), "dlq.events.analytics");
    }
}
