//! The contract between imagepipe services: every message that crosses the bus.
//!
//! - [`Event`] is the envelope every lifecycle event travels in (`eventId`, `eventType`,
//!   `taskId`, `traceId`, `timestamp`, `source`, `payload`), with one typed payload per
//!   [`EventType`] in [`payload`].
//! - [`command`] holds the task-queue commands: [`SubmitTask`] (the public submit JSON),
//!   [`DownloadCommand`], [`MetadataCommand`], [`AnalyzeCommand`].
//! - [`step`] holds what a worker reports back to the coordinator: [`StepResult`].
//! - [`stage`] holds what a stage of users' own takes: [`StageName`], [`StageCommand`].
//! - [`names`] holds the logical names of queues, topics and headers.
//! - [`asyncapi`] generates the AsyncAPI 3.0 document of every channel (docs/asyncapi.yaml).
//! - [`cloudevents`] derives the CloudEvents attributes every message carries as headers.
//!
//! Every type decodes through [`decode`], whose error names the offending field.
//!
//! With the `testing` feature, [`testing`] holds the rule every test of the workspace follows
//! when its environment (a server, a prepared model) is missing.

pub mod asyncapi;
pub mod cloudevents;
pub mod command;
pub mod decode;
pub mod embedding;
pub mod event;
pub mod names;
pub mod payload;
pub mod priority;
pub mod schema;
pub mod shard;
pub mod stage;
pub mod step;
pub mod step_command;
#[cfg(feature = "testing")]
pub mod testing;
pub mod trace;

pub use cloudevents::{CloudEvent, CloudEventError, CommandType};
pub use command::{AnalyzeCommand, DownloadCommand, ImageSource, MetadataCommand, SubmitError, SubmitTask};
pub use decode::{DecodeError, decode};
pub use embedding::{Embedding, EmbeddingError};
pub use event::{Event, EventPayload, EventType, UnknownEventType, derived_event_id, event_id, stage_event_id};
pub use priority::{Priority, UnknownPriority, lane_of};
pub use stage::{InvalidStageName, StageBlobs, StageCommand, StageName};
pub use step::{Step, StepError, StepOutcome, StepOutput, StepResult};
pub use step_command::StepCommand;
pub use trace::{InvalidTraceId, TraceId};

/// Version of the message schemas in this crate, sent in the [`names::headers::SCHEMA`] header
/// of every message (never inside the envelope).
pub const SCHEMA_VERSION: &str = "1";

/// User labels attached to a task at submission and copied into every event's payload.
pub type Labels = std::collections::BTreeMap<String, String>;
