//! The indexer [`EventHandler`]: `image.analyzed` → the task's tags into the index;
//! `image.metadata_extracted` → the task's thumbnail key; `stage.completed` → the `tags` a
//! stage of users' own reported (`faces:1`). It runs inside the dedup layer, and
//! its writes are idempotent anyway, so a redelivered event changes nothing.

use std::sync::Arc;

use async_trait::async_trait;
use imagepipe_contracts::payload::{ImageAnalyzed, ImageMetadataExtracted, StageCompleted};
use imagepipe_contracts::{Event, EventType};
use imagepipe_runtime::Outcome;
use imagepipe_runtime::dedup::{EventHandler, Seen};
use serde_json::Value;

use crate::index::TagIndex;

/// Handles `image.analyzed`, `image.metadata_extracted` and `stage.completed` events (see the
/// module docs).
pub struct IndexHandler {
    index: Arc<dyn TagIndex>,
}

impl IndexHandler {
    /// A handler writing into `index`.
    pub fn new(index: Arc<dyn TagIndex>) -> Self {
        Self { index }
    }

    async fn index_event(&self, event: Event<Value>) -> Result<(), Outcome> {
        let task_id =
            event.task_id.clone().ok_or_else(|| Outcome::reject(format!("{} without a taskId", event.event_type)))?;
        match event.event_type {
            EventType::ImageAnalyzed => {
                let analyzed = event.into_typed::<ImageAnalyzed>().map_err(Outcome::reject)?;
                let tags: Vec<(String, f64)> = analyzed
                    .payload
                    .analysis
                    .tags
                    .iter()
                    .map(|tag| (crate::normalize_tag(&tag.label), tag.score))
                    .filter(|(tag, _)| !tag.is_empty())
                    .collect();
                let at = analyzed.timestamp;
                self.index.index(&task_id, &tags, at).await.map_err(|e| Outcome::retry(crate::error_chain(&e)))?;
                tracing::debug!(task_id, tags = tags.len(), "tags indexed");
            }
            EventType::ImageMetadataExtracted => {
                let extracted = event.into_typed::<ImageMetadataExtracted>().map_err(Outcome::reject)?;
                let (key, at) = (&extracted.payload.metadata.thumbnail_key, extracted.timestamp);
                self.index
                    .set_thumbnail(&task_id, key, at)
                    .await
                    .map_err(|e| Outcome::retry(crate::error_chain(&e)))?;
            }
            EventType::StageCompleted => {
                let completed = event.into_typed::<StageCompleted>().map_err(Outcome::reject)?;
                let tags = stage_tags(&completed.payload.output).map_err(Outcome::reject)?;
                if !tags.is_empty() {
                    let at = completed.timestamp;
                    self.index.index(&task_id, &tags, at).await.map_err(|e| Outcome::retry(crate::error_chain(&e)))?;
                    tracing::debug!(task_id, stage = %completed.payload.stage, tags = tags.len(), "stage tags indexed");
                }
            }
            other => return Err(Outcome::reject(format!("{other} is not an event the tag indexer handles"))),
        }
        Ok(())
    }
}

/// The tags of a custom stage's output: its `tags` field, an array of strings (score 1) or of
/// `{"label", "score"}` objects; none without the field. Anything else in `tags` is an error.
fn stage_tags(output: &serde_json::Map<String, Value>) -> Result<Vec<(String, f64)>, String> {
    let Some(tags) = output.get("tags") else { return Ok(Vec::new()) };
    let Value::Array(tags) = tags else { return Err(format!("the stage output's tags is not an array: {tags}")) };
    let mut out = Vec::with_capacity(tags.len());
    for tag in tags {
        let (label, score) = match tag {
            Value::String(label) => (label.as_str(), 1.0),
            Value::Object(o) => {
                match (o.get("label").and_then(Value::as_str), o.get("score").and_then(Value::as_f64)) {
                    (Some(label), score) => (label, score.unwrap_or(1.0)),
                    _ => return Err(format!("a tag of the stage output has no label: {tag}")),
                }
            }
            other => return Err(format!("a tag of the stage output is neither a string nor an object: {other}")),
        };
        let label = crate::normalize_tag(label);
        if !label.is_empty() {
            out.push((label, score));
        }
    }
    Ok(out)
}

#[async_trait]
impl EventHandler for IndexHandler {
    async fn apply(&self, event: Event<Value>, _: &Seen<'_>) -> Outcome {
        match self.index_event(event).await {
            Ok(()) => Outcome::Ack,
            Err(outcome) => outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn output(value: Value) -> serde_json::Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn a_stage_reports_tags_as_strings_or_labelled_scores() {
        let tags = stage_tags(&output(json!({"count": 1, "tags": ["Faces:1", {"label": "person", "score": 0.5}]})));
        assert_eq!(tags.unwrap(), [("faces:1".to_owned(), 1.0), ("person".to_owned(), 0.5)]);
        assert_eq!(stage_tags(&output(json!({"count": 0}))).unwrap(), []);
        assert!(stage_tags(&output(json!({"tags": "faces:1"}))).unwrap_err().contains("not an array"));
        assert!(stage_tags(&output(json!({"tags": [3]}))).unwrap_err().contains("neither"));
    }
}
