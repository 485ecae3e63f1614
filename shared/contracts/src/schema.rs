//! JSON Schemas of the public messages, generated from the types, for users of other languages.
//!
//! The committed copies live in `shared/contracts/schema/`; a test fails when they drift from
//! the types (regenerate with `IMAGEPIPE_UPDATE_SCHEMAS=1 cargo test -p imagepipe-contracts`).

use schemars::{JsonSchema, Schema, schema_for};

use crate::payload::{
    ImageAnalyzed, ImageDownloaded, ImageDuplicateDetected, ImageMetadataExtracted, QueuePaused, QueueResumed,
    StageCompleted, TaskCancelled, TaskCompleted, TaskCreated, TaskFailed, TaskPaused, TaskResumed, TaskRetrying,
};
use crate::{
    AnalyzeCommand, DownloadCommand, Event, EventPayload, MetadataCommand, StageCommand, StepResult, SubmitTask,
};

/// Every schema imagepipe publishes, as (file name under `schema/`, schema).
pub fn all() -> Vec<(String, Schema)> {
    let mut schemas = vec![
        ("event.schema.json".to_owned(), schema_for!(Event<serde_json::Value>)),
        ("submit-task.schema.json".to_owned(), schema_for!(SubmitTask)),
        ("download-command.schema.json".to_owned(), schema_for!(DownloadCommand)),
        ("metadata-command.schema.json".to_owned(), schema_for!(MetadataCommand)),
        ("analyze-command.schema.json".to_owned(), schema_for!(AnalyzeCommand)),
        ("stage-command.schema.json".to_owned(), schema_for!(StageCommand)),
        ("step-result.schema.json".to_owned(), schema_for!(StepResult)),
    ];
    schemas.extend([
        payload::<ImageDownloaded>(),
        payload::<ImageMetadataExtracted>(),
        payload::<ImageAnalyzed>(),
        payload::<ImageDuplicateDetected>(),
        payload::<TaskCreated>(),
        payload::<TaskRetrying>(),
        payload::<TaskCompleted>(),
        payload::<TaskFailed>(),
        payload::<TaskCancelled>(),
        payload::<TaskPaused>(),
        payload::<TaskResumed>(),
        payload::<QueuePaused>(),
        payload::<QueueResumed>(),
        payload::<StageCompleted>(),
    ]);
    schemas
}

fn payload<P: EventPayload + JsonSchema>() -> (String, Schema) {
    (format!("payload/{}.schema.json", P::EVENT_TYPE), schema_for!(P))
}
