//! Stages of users' own: the name a configured stage goes by ([`StageName`]), the command its
//! worker takes ([`StageCommand`]) and what the coordinator keeps of it.
//!
//! A custom stage is an entry of `pipeline.stages` that is none of the built-in steps. Its
//! worker, in any language, takes [`StageCommand`]s from `<prefix>.tasks.<name>` (and the
//! `.high` / `.low` lanes), fetches the blobs it needs over HTTP (`GET /v1/blobs/{key}` on any
//! coordinator), and reports a [`crate::StepResult`] whose `step` is the stage's name and whose
//! successful output is `{"stage": <any JSON object>}`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Labels;

/// The most bytes a stage name may have.
pub const MAX_STAGE_NAME_LEN: usize = 32;

/// The most distinct stage names one process learns: a stage name is interned for the life of
/// the process, so names read from messages are bounded (a flood of made-up names is refused
/// once this many are known, instead of growing memory).
pub const MAX_STAGE_NAMES: usize = 256;

/// The most bytes a stage's output may take as JSON: it is kept in the task's record and
/// travels in `stage.completed`.
pub const MAX_STAGE_OUTPUT_BYTES: usize = 64 * 1024;

/// The names a stage of users' own may not take: the built-in steps' names, their queues'
/// short names and the coordinator's own queues.
pub const RESERVED_STAGE_NAMES: [&str; 6] = ["download", "metadata", "analyze", "ai", "submit", "results"];

/// The name of a custom stage (`faces`, `ocr_text`): lowercase ASCII letters, digits and `_`,
/// starting with a letter, at most [`MAX_STAGE_NAME_LEN`] bytes. Its queue is
/// `tasks.<name>`. Cheap to copy: names are interned once per process.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StageName {
    name: &'static str,
    queue: &'static str,
}

/// A string that cannot name a custom stage, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidStageName {
    /// Not of the allowed form.
    #[error(
        "stage name {0:?} is invalid: use 1 to {MAX_STAGE_NAME_LEN} lowercase letters, digits or '_', starting with a letter"
    )]
    Form(String),
    /// A built-in step's or queue's name.
    #[error("stage name {0:?} is reserved (built-in names: download, metadata, analyze, ai, submit, results)")]
    Reserved(String),
    /// This process already knows [`MAX_STAGE_NAMES`] names.
    #[error("stage name {0:?} is unknown and {MAX_STAGE_NAMES} stage names are known already")]
    TooMany(String),
}

static INTERNED: Mutex<Vec<StageName>> = Mutex::new(Vec::new());

impl StageName {
    /// Whether `name` may name a custom stage (without learning it, as [`Self::new`] does).
    pub fn check(name: &str) -> Result<(), InvalidStageName> {
        let valid_form = !name.is_empty()
            && name.len() <= MAX_STAGE_NAME_LEN
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid_form {
            return Err(InvalidStageName::Form(name.to_owned()));
        }
        if RESERVED_STAGE_NAMES.contains(&name) {
            return Err(InvalidStageName::Reserved(name.to_owned()));
        }
        Ok(())
    }

    /// The stage called `name`, if it is a valid custom stage name.
    pub fn new(name: &str) -> Result<Self, InvalidStageName> {
        Self::check(name)?;
        let mut interned = INTERNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(known) = interned.iter().find(|s| s.name == name) {
            return Ok(*known);
        }
        if interned.len() >= MAX_STAGE_NAMES {
            return Err(InvalidStageName::TooMany(name.to_owned()));
        }
        let stage = StageName {
            name: Box::leak(name.to_owned().into_boxed_str()),
            queue: Box::leak(format!("tasks.{name}").into_boxed_str()),
        };
        interned.push(stage);
        Ok(stage)
    }

    /// The name, e.g. `faces`.
    pub const fn as_str(self) -> &'static str {
        self.name
    }

    /// The stage's task queue (its `normal` lane), e.g. `tasks.faces`.
    pub const fn queue(self) -> &'static str {
        self.queue
    }
}

impl fmt::Display for StageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl fmt::Debug for StageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StageName({:?})", self.name)
    }
}

/// Where a stage's worker finds a task's images: blob keys, each fetched with
/// `GET /v1/blobs/{key}` from a coordinator (with the API token when one is set), or read
/// from the shared blob store directly by a worker that has it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageBlobs {
    /// The original image as downloaded (`sha256:<hex>`).
    pub original: String,
    /// Each derivative the metadata step wrote, by its name (`thumbnail`, `preview`, ...);
    /// empty when the stage runs before the metadata step.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub derivatives: BTreeMap<String, String>,
    /// The derivative the AI step reads (`metadata.ai_input`), when the metadata step wrote one:
    /// an upright, moderately sized copy, enough for most analyses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
}

/// The command a custom stage's worker takes from `tasks.<stage>`: one attempt of the stage for
/// one task. Its worker reports a [`crate::StepResult`] with `step` = [`Self::stage`] and the
/// same `taskId` and `attempt`, to `tasks.results` (to the partition the `imagepipe-shard`
/// header names, when the command has one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageCommand {
    /// The task.
    pub task_id: String,
    /// The stage this command is for (its `pipeline.stages` name).
    pub stage: crate::Step,
    /// Which attempt of the stage this is, from 1.
    pub attempt: u32,
    /// The task's images.
    pub blobs: StageBlobs,
    /// The source's detected format (`jpeg`, `heic`, ...).
    pub format: String,
    /// The outputs of earlier stages the stage asked for (`pipeline.stages[].inputs`), by
    /// stage name (`metadata`, `analyze`, or a custom stage's name).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, serde_json::Value>,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_interned_once_and_carries_its_queue() {
        let a = StageName::new("faces_test").unwrap();
        let b = StageName::new("faces_test").unwrap();
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        assert_eq!(a.queue(), "tasks.faces_test");
        assert_eq!(a.to_string(), "faces_test");
    }

    #[test]
    fn invalid_and_reserved_names_are_refused_with_the_reason() {
        for bad in ["", "Faces", "1st", "a-b", "a.b", "a b", &"x".repeat(33)] {
            assert!(matches!(StageName::new(bad), Err(InvalidStageName::Form(_))), "{bad:?}");
        }
        for reserved in RESERVED_STAGE_NAMES {
            assert!(matches!(StageName::new(reserved), Err(InvalidStageName::Reserved(_))), "{reserved}");
        }
        assert!(StageName::new("ocr_2").is_ok());
    }
}
