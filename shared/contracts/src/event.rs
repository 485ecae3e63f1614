//! The event envelope (docs/design.md, "The event envelope") and the event types.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::decode::{DecodeError, decode};
use crate::trace::TraceId;

/// Every lifecycle event, as it travels on an event topic.
///
/// Serializes to exactly the JSON of docs/design.md (camelCase). `P` is the typed payload
/// (see [`crate::payload`]); `serde_json::Value` reads any event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(title = "imagepipe event envelope")]
pub struct Event<P> {
    /// Deterministic for pipeline events (see [`event_id`]), so subscribers deduplicate by it.
    pub event_id: Uuid,
    /// What happened, e.g. `image.downloaded`.
    pub event_type: EventType,
    /// The task the event belongs to; present on every pipeline event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// W3C trace id of the task's trace.
    pub trace_id: TraceId,
    /// When it happened, Unix milliseconds.
    pub timestamp: u64,
    /// The publishing service, e.g. `download-worker`.
    pub source: String,
    /// Event-specific data.
    pub payload: P,
}

/// The name of every event imagepipe publishes; the string form is the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub enum EventType {
    /// The download worker stored the source image in the blob store.
    #[serde(rename = "image.downloaded")]
    ImageDownloaded,
    /// The metadata worker decoded the image and wrote its thumbnail.
    #[serde(rename = "image.metadata_extracted")]
    ImageMetadataExtracted,
    /// The AI worker labelled the image.
    #[serde(rename = "image.analyzed")]
    ImageAnalyzed,
    /// The similarity indexer found the image to be a near-duplicate of an earlier one.
    #[serde(rename = "image.duplicate_detected")]
    ImageDuplicateDetected,
    /// The coordinator accepted a new task.
    #[serde(rename = "task.created")]
    TaskCreated,
    /// A step failed with a retryable error and will run again.
    #[serde(rename = "task.retrying")]
    TaskRetrying,
    /// The last step succeeded.
    #[serde(rename = "task.completed")]
    TaskCompleted,
    /// The task failed for good.
    #[serde(rename = "task.failed")]
    TaskFailed,
    /// The task was cancelled.
    #[serde(rename = "task.cancelled")]
    TaskCancelled,
    /// The task stopped at a step boundary, as asked through the API.
    #[serde(rename = "task.paused")]
    TaskPaused,
    /// A paused task goes on.
    #[serde(rename = "task.resumed")]
    TaskResumed,
    /// An operator paused a stage queue: no replica takes new messages from it.
    #[serde(rename = "queue.paused")]
    QueuePaused,
    /// A paused stage queue is served again.
    #[serde(rename = "queue.resumed")]
    QueueResumed,
    /// A stage of users' own (`pipeline.stages`) succeeded, with its output.
    #[serde(rename = "stage.completed")]
    StageCompleted,
}

impl EventType {
    /// Every event type.
    pub const ALL: [EventType; 14] = [
        Self::ImageDownloaded,
        Self::ImageMetadataExtracted,
        Self::ImageAnalyzed,
        Self::ImageDuplicateDetected,
        Self::TaskCreated,
        Self::TaskRetrying,
        Self::TaskCompleted,
        Self::TaskFailed,
        Self::TaskCancelled,
        Self::TaskPaused,
        Self::TaskResumed,
        Self::QueuePaused,
        Self::QueueResumed,
        Self::StageCompleted,
    ];

    /// The wire name, e.g. `image.downloaded`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ImageDownloaded => "image.downloaded",
            Self::ImageMetadataExtracted => "image.metadata_extracted",
            Self::ImageAnalyzed => "image.analyzed",
            Self::ImageDuplicateDetected => "image.duplicate_detected",
            Self::TaskCreated => "task.created",
            Self::TaskRetrying => "task.retrying",
            Self::TaskCompleted => "task.completed",
            Self::TaskFailed => "task.failed",
            Self::TaskCancelled => "task.cancelled",
            Self::TaskPaused => "task.paused",
            Self::TaskResumed => "task.resumed",
            Self::QueuePaused => "queue.paused",
            Self::QueueResumed => "queue.resumed",
            Self::StageCompleted => "stage.completed",
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no imagepipe event type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown event type {0:?}")]
pub struct UnknownEventType(pub String);

impl FromStr for EventType {
    type Err = UnknownEventType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|t| t.as_str() == s).ok_or_else(|| UnknownEventType(s.to_owned()))
    }
}

/// A typed payload, tied to the one event type it belongs to.
pub trait EventPayload: Serialize + serde::de::DeserializeOwned {
    /// The event type whose payload this is.
    const EVENT_TYPE: EventType;
}

/// Namespace of the UUIDv5 event ids (a fixed random UUID, part of the contract).
const EVENT_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6b1f_4a8e_93d2_4c5e_8f71_2d0c_9a3b_e415);

/// The deterministic id of a pipeline event: UUIDv5 over `(taskId, eventType, attempt)`,
/// so a redelivered step publishes the same id and subscribers deduplicate by it.
pub fn event_id(task_id: &str, event_type: EventType, attempt: u32) -> Uuid {
    let name = format!("{task_id}\n{}\n{attempt}", event_type.as_str());
    Uuid::new_v5(&EVENT_ID_NAMESPACE, name.as_bytes())
}

/// The deterministic id of `stage.completed` for attempt `attempt` of custom stage `stage`:
/// UUIDv5 over `(taskId, eventType, stage, attempt)`, since several stages of one task have
/// attempts of the same number.
pub fn stage_event_id(task_id: &str, stage: &str, attempt: u32) -> Uuid {
    let name = format!("{task_id}\n{}\n{stage}\n{attempt}", EventType::StageCompleted.as_str());
    Uuid::new_v5(&EVENT_ID_NAMESPACE, name.as_bytes())
}

/// The deterministic id of an event a subscriber publishes because of another event (`cause`,
/// that event's id): UUIDv5 over `(cause, eventType, key)`, so a redelivered cause publishes the
/// same id and a new cause (a new generation of the task) a new one.
pub fn derived_event_id(cause: Uuid, event_type: EventType, key: &str) -> Uuid {
    let name = format!("{cause}\n{}\n{key}", event_type.as_str());
    Uuid::new_v5(&EVENT_ID_NAMESPACE, name.as_bytes())
}

impl<P: EventPayload> Event<P> {
    /// A pipeline event of task `task_id` for step attempt `attempt`, with its deterministic id.
    pub fn for_task(
        task_id: impl Into<String>,
        attempt: u32,
        trace_id: TraceId,
        timestamp: u64,
        source: impl Into<String>,
        payload: P,
    ) -> Self {
        let task_id = task_id.into();
        Self {
            event_id: event_id(&task_id, P::EVENT_TYPE, attempt),
            event_type: P::EVENT_TYPE,
            task_id: Some(task_id),
            trace_id,
            timestamp,
            source: source.into(),
            payload,
        }
    }
}

impl<P: serde::de::DeserializeOwned> Event<P> {
    /// Decodes an event from JSON; the error names a missing or ill-typed field.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DecodeError> {
        decode(bytes)
    }
}

impl<P: Serialize> Event<P> {
    /// Encodes the event as JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("events serialize infallibly")
    }
}

impl Event<serde_json::Value> {
    /// Reads the payload as `P`, checking that the event type matches.
    pub fn into_typed<P: EventPayload>(self) -> Result<Event<P>, DecodeError> {
        if self.event_type != P::EVENT_TYPE {
            return Err(DecodeError {
                type_name: std::any::type_name::<P>().rsplit("::").next().unwrap_or("payload"),
                path: "eventType".into(),
                message: format!("expected {}, got {}", P::EVENT_TYPE, self.event_type),
            });
        }
        let payload = serde_path_to_error::deserialize(self.payload).map_err(|err| DecodeError {
            type_name: std::any::type_name::<P>().rsplit("::").next().unwrap_or("payload"),
            path: format!("payload.{}", err.path()),
            message: err.into_inner().to_string(),
        })?;
        Ok(Event {
            event_id: self.event_id,
            event_type: self.event_type,
            task_id: self.task_id,
            trace_id: self.trace_id,
            timestamp: self.timestamp,
            source: self.source,
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_are_deterministic_and_distinct_per_attempt() {
        let a = event_id("tsk_1", EventType::ImageDownloaded, 1);
        assert_eq!(a, event_id("tsk_1", EventType::ImageDownloaded, 1));
        assert_eq!(a.get_version_num(), 5);
        assert_ne!(a, event_id("tsk_1", EventType::ImageDownloaded, 2));
        assert_ne!(a, event_id("tsk_1", EventType::TaskCompleted, 1));
        assert_ne!(a, event_id("tsk_2", EventType::ImageDownloaded, 1));
        let faces = stage_event_id("tsk_1", "faces", 1);
        assert_ne!(faces, stage_event_id("tsk_1", "ocr", 1), "two stages of one task, attempt 1 each");
        assert_ne!(faces, stage_event_id("tsk_1", "faces", 2));
    }

    #[test]
    fn event_type_names_are_the_contract() {
        let names: Vec<_> = EventType::ALL.iter().map(|t| t.as_str()).collect();
        assert_eq!(
            names,
            [
                "image.downloaded",
                "image.metadata_extracted",
                "image.analyzed",
                "image.duplicate_detected",
                "task.created",
                "task.retrying",
                "task.completed",
                "task.failed",
                "task.cancelled",
                "task.paused",
                "task.resumed",
                "queue.paused",
                "queue.resumed",
                "stage.completed"
            ]
        );
        for t in EventType::ALL {
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
            assert_eq!(t.as_str().parse::<EventType>().unwrap(), t);
        }
        assert!("image.processed".parse::<EventType>().is_err());
    }

    #[test]
    fn missing_or_ill_typed_fields_are_named() {
        let missing = br#"{"eventType":"task.created","traceId":"4bf92f3577b34da6a3ce929d0e0e4736","timestamp":1,"source":"x","payload":{}}"#;
        let err = Event::<serde_json::Value>::from_json(missing).unwrap_err();
        assert!(err.to_string().contains("eventId"), "{err}");

        let ill_typed = br#"{"eventId":"8f0c7c7e-0b5e-4d55-9a47-2a5b5d1c9e11","eventType":"task.created","traceId":"4bf92f3577b34da6a3ce929d0e0e4736","timestamp":"soon","source":"x","payload":{}}"#;
        let err = Event::<serde_json::Value>::from_json(ill_typed).unwrap_err();
        assert_eq!(err.path, "timestamp");
    }

    #[test]
    fn unknown_fields_are_tolerated() {
        let json = br#"{"eventId":"8f0c7c7e-0b5e-4d55-9a47-2a5b5d1c9e11","eventType":"task.created","traceId":"4bf92f3577b34da6a3ce929d0e0e4736","timestamp":1,"source":"x","payload":{},"extra":true}"#;
        assert!(Event::<serde_json::Value>::from_json(json).is_ok());
    }
}
