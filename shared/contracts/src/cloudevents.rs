//! The CloudEvents 1.0 attributes every message carries in binary content mode
//! (docs/contracts.md, "CloudEvents").
//!
//! The body stays the message itself (the event envelope, a command, a step result); its
//! CloudEvents context attributes travel as headers. [`CloudEvent`] derives them from the
//! message in one place, and [`CloudEvent::headers`] names them the binding-neutral way, as
//! the HTTP and NATS bindings do (`ce-id`, `ce-type`, ..., `content-type`). A bus backend maps
//! that neutral set to its binding's header names on the wire: Kafka's binding prefixes the
//! attributes with `ce_` instead (`ce_id`), NATS's keeps `ce-` and percent-encodes the values.
//!
//! | attribute | event | command or step result |
//! |---|---|---|
//! | `id` | `eventId` | the message id (publish deduplication) |
//! | `type` | `eventType` | [`CommandType`] of its queue, e.g. `command.download` |
//! | `source` | `/imagepipe/` + the envelope's `source` | `/imagepipe/` + the sending service |
//! | `specversion` | `1.0` | `1.0` |
//! | `time` | the envelope's `timestamp`, RFC 3339 | when it was sent, RFC 3339 |
//! | `subject` | `taskId` (absent without one) | `taskId` |
//! | `datacontenttype` | `application/json` | `application/json` |

use std::time::{Duration, UNIX_EPOCH};

use serde::Deserialize;

use crate::decode::{DecodeError, decode};
use crate::event::Event;
use crate::names::{headers, queues};

/// The CloudEvents version of every message ([`headers::CE_SPECVERSION`]).
pub const SPEC_VERSION: &str = "1.0";

/// The media type of every message body ([`headers::CONTENT_TYPE`], the `datacontenttype`).
pub const DATA_CONTENT_TYPE: &str = "application/json";

/// What every `source` attribute starts with: the rest is the service that sent the message.
pub const SOURCE_PREFIX: &str = "/imagepipe/";

/// The `source` attribute of what `service` sends (`download-worker` →
/// `/imagepipe/download-worker`), a URI-reference naming the service.
pub fn source_of(service: &str) -> String {
    format!("{SOURCE_PREFIX}{service}")
}

/// Unix milliseconds as an RFC 3339 UTC time with milliseconds (`2025-11-22T08:26:40.000Z`),
/// the `time` attribute.
pub fn time_of(unix_ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
}

/// The CloudEvents `type` of a task-queue message: one per queue, since each queue carries
/// one kind of command (or the step results). Events take their `eventType` instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommandType {
    /// A submit command on `tasks.submit` (any lane): `command.submit`.
    Submit,
    /// A download command on `tasks.download`: `command.download`.
    Download,
    /// A metadata command on `tasks.metadata`: `command.metadata`.
    Metadata,
    /// An analyze command on `tasks.ai`: `command.analyze`.
    Analyze,
    /// A step result on `tasks.results`: `step.result`.
    StepResult,
    /// A custom stage's command on `tasks.<stage>` ([`crate::StageCommand`]): `command.stage`.
    Stage,
}

impl CommandType {
    /// Every command type, in the order of [`queues::ALL`].
    pub const ALL: [CommandType; 5] = [Self::Submit, Self::Download, Self::Metadata, Self::Analyze, Self::StepResult];

    /// The `type` attribute, e.g. `command.download`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Submit => "command.submit",
            Self::Download => "command.download",
            Self::Metadata => "command.metadata",
            Self::Analyze => "command.analyze",
            Self::StepResult => "step.result",
            Self::Stage => "command.stage",
        }
    }

    /// The queue (its `normal` lane) that carries this type; a custom stage's is
    /// `tasks.{stage}`, one per stage.
    pub const fn queue(self) -> &'static str {
        match self {
            Self::Submit => queues::SUBMIT,
            Self::Download => queues::DOWNLOAD,
            Self::Metadata => queues::METADATA,
            Self::Analyze => queues::AI,
            Self::StepResult => queues::RESULTS,
            Self::Stage => "tasks.{stage}",
        }
    }

    /// The type of what `queue` carries, in any priority lane (`tasks.ai.high` → `Analyze`);
    /// `None` for a queue that is not one of imagepipe's task queues.
    pub fn of_queue(queue: &str) -> Option<Self> {
        let (base, _) = crate::lane_of(queue);
        Self::ALL.into_iter().find(|t| t.queue() == base).or_else(|| {
            let stage = base.strip_prefix("tasks.")?;
            crate::StageName::check(stage).is_ok().then_some(Self::Stage)
        })
    }
}

impl std::fmt::Display for CommandType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The CloudEvents context attributes of one message (see the module docs for where each
/// comes from). `specversion` is always [`SPEC_VERSION`] and `datacontenttype` always
/// [`DATA_CONTENT_TYPE`], so they are not fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvent {
    /// `id`: unique per `source`; the same for a redelivered or re-sent message.
    pub id: String,
    /// `type`: the event type or the [`CommandType`].
    pub event_type: String,
    /// `source`: `/imagepipe/<service>` ([`source_of`]).
    pub source: String,
    /// `time`, as Unix milliseconds (on the wire: RFC 3339, [`time_of`]).
    pub time_ms: u64,
    /// `subject`: the task id, when the message is about a task.
    pub subject: Option<String>,
}

/// Headers that do not hold valid CloudEvents attributes of an imagepipe message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloudEventError {
    /// A required attribute's header is absent.
    #[error("CloudEvents header `{0}` is missing")]
    Missing(&'static str),
    /// A header holds a value imagepipe never sends.
    #[error("CloudEvents header `{header}` is {value:?}: {expected}")]
    Invalid {
        /// The header.
        header: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
}

/// The envelope fields the attributes come from, read without the payload.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvelopeHead {
    event_id: uuid::Uuid,
    event_type: crate::EventType,
    #[serde(default)]
    task_id: Option<String>,
    timestamp: u64,
    source: String,
}

impl CloudEvent {
    /// The attributes of an event: its envelope's id, type, source, timestamp and task.
    pub fn of_event<P>(event: &Event<P>) -> Self {
        Self {
            id: event.event_id.to_string(),
            event_type: event.event_type.as_str().to_owned(),
            source: source_of(&event.source),
            time_ms: event.timestamp,
            subject: event.task_id.clone(),
        }
    }

    /// The attributes of an event already encoded as JSON (an outbox entry), read from the
    /// envelope's fields without decoding the payload.
    pub fn of_event_json(body: &[u8]) -> Result<Self, DecodeError> {
        let head: EnvelopeHead = decode(body)?;
        Ok(Self {
            id: head.event_id.to_string(),
            event_type: head.event_type.as_str().to_owned(),
            source: source_of(&head.source),
            time_ms: head.timestamp,
            subject: head.task_id,
        })
    }

    /// The attributes of a command or step result of type `command_type` about task
    /// `task_id`, with message id `id`, sent by `service` at `sent_ms` (Unix milliseconds).
    pub fn of_command(
        command_type: CommandType,
        id: impl Into<String>,
        task_id: impl Into<String>,
        service: &str,
        sent_ms: u64,
    ) -> Self {
        Self {
            id: id.into(),
            event_type: command_type.as_str().to_owned(),
            source: source_of(service),
            time_ms: sent_ms,
            subject: Some(task_id.into()),
        }
    }

    /// The attributes as binding-neutral headers (the HTTP and NATS names: `ce-id`, ...,
    /// `content-type`), in a fixed order; a backend renames them for its binding.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            (headers::CE_ID, self.id.clone()),
            (headers::CE_SOURCE, self.source.clone()),
            (headers::CE_SPECVERSION, SPEC_VERSION.to_owned()),
            (headers::CE_TYPE, self.event_type.clone()),
            (headers::CE_TIME, time_of(self.time_ms)),
            (headers::CONTENT_TYPE, DATA_CONTENT_TYPE.to_owned()),
        ];
        if let Some(subject) = &self.subject {
            out.push((headers::CE_SUBJECT, subject.clone()));
        }
        out
    }

    /// Reads the attributes back from binding-neutral headers (`get` looks one up by name),
    /// checking the fixed ones (`specversion`, `content-type`) and the time's form.
    pub fn from_headers<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<Self, CloudEventError> {
        let required = |name: &'static str| get(name).ok_or(CloudEventError::Missing(name));
        let spec = required(headers::CE_SPECVERSION)?;
        if spec != SPEC_VERSION {
            return Err(CloudEventError::Invalid {
                header: headers::CE_SPECVERSION,
                value: spec.to_owned(),
                expected: "1.0",
            });
        }
        let content_type = required(headers::CONTENT_TYPE)?;
        if content_type != DATA_CONTENT_TYPE {
            return Err(CloudEventError::Invalid {
                header: headers::CONTENT_TYPE,
                value: content_type.to_owned(),
                expected: "application/json",
            });
        }
        let time = required(headers::CE_TIME)?;
        let time_ms = humantime::parse_rfc3339(time)
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .and_then(|d| u64::try_from(d.as_millis()).ok())
            .ok_or_else(|| CloudEventError::Invalid {
                header: headers::CE_TIME,
                value: time.to_owned(),
                expected: "an RFC 3339 UTC time",
            })?;
        Ok(Self {
            id: required(headers::CE_ID)?.to_owned(),
            event_type: required(headers::CE_TYPE)?.to_owned(),
            source: required(headers::CE_SOURCE)?.to_owned(),
            time_ms,
            subject: get(headers::CE_SUBJECT).map(str::to_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{EventType, TraceId};

    fn completed() -> Event<serde_json::Value> {
        Event {
            event_id: crate::event_id("tsk_photo_0001", EventType::TaskCompleted, 1),
            event_type: EventType::TaskCompleted,
            task_id: Some("tsk_photo_0001".into()),
            trace_id: TraceId::random(),
            timestamp: 1_763_800_000_123,
            source: "coordinator".into(),
            payload: serde_json::json!({"durationMs": 812}),
        }
    }

    #[test]
    fn an_event_gives_its_envelope_fields() {
        let event = completed();
        let ce = CloudEvent::of_event(&event);
        assert_eq!(ce.id, event.event_id.to_string());
        assert_eq!(ce.event_type, "task.completed");
        assert_eq!(ce.source, "/imagepipe/coordinator");
        assert_eq!(ce.subject.as_deref(), Some("tsk_photo_0001"));
        let headers: BTreeMap<_, _> = ce.headers().into_iter().collect();
        assert_eq!(headers["ce-time"], "2025-11-22T08:26:40.123Z");
        assert_eq!(headers["ce-specversion"], "1.0");
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers.len(), 7);
    }

    #[test]
    fn the_json_form_gives_the_same_attributes() {
        let event = completed();
        assert_eq!(CloudEvent::of_event_json(&event.to_json()).unwrap(), CloudEvent::of_event(&event));
        let without_task = Event { task_id: None, ..completed() };
        let ce = CloudEvent::of_event_json(&without_task.to_json()).unwrap();
        assert_eq!(ce.subject, None);
        assert!(!ce.headers().iter().any(|(name, _)| *name == headers::CE_SUBJECT));
        let err = CloudEvent::of_event_json(br#"{"eventId":"x"}"#).unwrap_err();
        assert_eq!(err.path, "eventId", "{err}");
    }

    #[test]
    fn headers_read_back() {
        let ce = CloudEvent::of_command(CommandType::Download, "tsk_1:download:2", "tsk_1", "coordinator", 1_000);
        let headers: BTreeMap<_, _> = ce.headers().into_iter().collect();
        assert_eq!(headers["ce-type"], "command.download");
        assert_eq!(headers["ce-time"], "1970-01-01T00:00:01.000Z");
        let back = CloudEvent::from_headers(|name| headers.get(name).map(String::as_str)).unwrap();
        assert_eq!(back, ce);
    }

    #[test]
    fn wrong_headers_are_named() {
        let ce = CloudEvent::of_event(&completed());
        let read = |change: &dyn Fn(&mut BTreeMap<&'static str, String>)| {
            let mut headers: BTreeMap<_, _> = ce.headers().into_iter().collect();
            change(&mut headers);
            CloudEvent::from_headers(|name| headers.get(name).map(String::as_str))
        };
        assert_eq!(read(&|h| drop(h.remove("ce-id"))), Err(CloudEventError::Missing("ce-id")));
        assert!(matches!(
            read(&|h| drop(h.insert("ce-specversion", "0.3".into()))),
            Err(CloudEventError::Invalid { header: "ce-specversion", .. })
        ));
        assert!(matches!(
            read(&|h| drop(h.insert("ce-time", "1763800000123".into()))),
            Err(CloudEventError::Invalid { header: "ce-time", .. })
        ));
        assert!(matches!(
            read(&|h| drop(h.insert("content-type", "text/plain".into()))),
            Err(CloudEventError::Invalid { header: "content-type", .. })
        ));
    }

    #[test]
    fn every_queue_lane_has_its_command_type() {
        assert_eq!(CommandType::of_queue("tasks.ai.high"), Some(CommandType::Analyze));
        assert_eq!(CommandType::of_queue("tasks.submit"), Some(CommandType::Submit));
        assert_eq!(CommandType::of_queue("tasks.results.low"), Some(CommandType::StepResult));
        assert_eq!(CommandType::of_queue("dlq.tasks.ai"), None);
        for queue in queues::all_lanes() {
            assert!(CommandType::of_queue(&queue).is_some(), "{queue}");
        }
        let names: Vec<_> = CommandType::ALL.iter().map(|t| t.as_str()).collect();
        assert_eq!(names, ["command.submit", "command.download", "command.metadata", "command.analyze", "step.result"]);
        // A command type is never an event type.
        for t in CommandType::ALL {
            assert!(t.as_str().parse::<EventType>().is_err());
        }
    }
}
