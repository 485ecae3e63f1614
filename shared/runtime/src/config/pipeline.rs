//! The `pipeline` section: the stages every task runs through, in order, built-in and users'
//! own.

use std::collections::BTreeMap;
use std::time::Duration;

use imagepipe_contracts::{Step, StepOutput};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, positive};

/// The `pipeline` section: the ordered stages of every task. The default is the built-in
/// pipeline, `download` → `metadata` → `analyze`; a stage of users' own is an entry with any
/// other name, run by their worker on `<prefix>.tasks.<name>` (README, "Add your own stage").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineConfig {
    /// The stages, in the order they run. `download`, `metadata` and `analyze` appear once
    /// each, in that order, `download` first; stages of users' own go anywhere after
    /// `download`. Set in the config file as `[[pipeline.stages]]` tables.
    pub stages: Vec<StageConfig>,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self { stages: Step::ALL.iter().map(|step| StageConfig::named(step.as_str())).collect() }
    }
}

/// One stage of `pipeline.stages`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    /// The stage's name: `download`, `metadata`, `analyze`, or one of users' own (lowercase
    /// letters, digits and `_`, starting with a letter, at most 32 bytes), whose queue is
    /// `tasks.<name>`.
    pub name: String,
    /// How long an attempt may stay silent before it counts as failed (a stage of users' own;
    /// default `coordinator.step_deadline`; the built-in steps take
    /// `coordinator.<step>_deadline`).
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "duration"))]
    pub deadline: Option<Duration>,
    /// Attempts before the task fails (a stage of users' own; default
    /// `coordinator.max_attempts`). Retries back off as `coordinator.retry_min_backoff` and
    /// `coordinator.retry_max_backoff` say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// When the stage runs (a stage of users' own); absent: always. A stage whose condition
    /// does not hold is skipped, and the task's history says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<StageCondition>,
    /// The outputs of earlier stages its command carries in `inputs` (a stage of users' own):
    /// `metadata`, `analyze`, or an earlier custom stage's name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
}

impl StageConfig {
    /// A stage called `name` with every setting at its default.
    pub fn named(name: &str) -> Self {
        Self { name: name.to_owned(), deadline: None, attempts: None, when: None, inputs: Vec::new() }
    }
}

/// When a stage runs: every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct StageCondition {
    /// The source's detected format is one of these (`jpeg`, `png`, `webp`, `gif`, `heic`,
    /// `avif`, ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub format: Vec<String>,
    /// The source's MIME type is one of these (`image/jpeg`, ...; from the detected format).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mime: Vec<String>,
    /// The task's labels include each of these (name → value).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// A field of an earlier stage's output, as `<stage>.<field>[.<field>...]`
    /// (`faces.count`, `metadata.width`, `analysis.model`): it must be present and, with
    /// `equals` or `above`, match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// With `field`: the field equals this value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub equals: Option<serde_json::Value>,
    /// With `field`: the field is a number greater than this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub above: Option<f64>,
}

impl PipelineConfig {
    /// The pipeline's steps in order, each with its stage settings.
    pub fn steps(&self) -> Result<Vec<(Step, &StageConfig)>, ConfigError> {
        self.stages
            .iter()
            .enumerate()
            .map(|(i, stage)| {
                Step::named(&stage.name)
                    .map(|step| (step, stage))
                    .map_err(|e| ConfigError::invalid(format!("pipeline.stages[{i}].name"), e.to_string()))
            })
            .collect()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let steps = self.steps()?;
        let builtins: Vec<Step> = steps.iter().map(|(s, _)| *s).filter(|s| !s.is_custom()).collect();
        if builtins != Step::ALL {
            return Err(ConfigError::invalid(
                "pipeline.stages",
                format!(
                    "must hold download, metadata and analyze once each, in that order (found {})",
                    builtins.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        if steps[0].0 != Step::Download {
            return Err(ConfigError::invalid(
                "pipeline.stages",
                "must start with download: every stage reads its blob",
            ));
        }
        let mut seen: Vec<&str> = Vec::new();
        for (i, (step, stage)) in steps.iter().enumerate() {
            let key = |field: &str| format!("pipeline.stages[{i}].{field}");
            if seen.contains(&step.as_str()) {
                return Err(ConfigError::invalid(key("name"), format!("stage {step} appears twice")));
            }
            if !step.is_custom() {
                let extra = [
                    ("deadline", stage.deadline.is_some()),
                    ("attempts", stage.attempts.is_some()),
                    ("when", stage.when.is_some()),
                    ("inputs", !stage.inputs.is_empty()),
                ];
                if let Some((field, _)) = extra.iter().find(|(_, set)| *set) {
                    return Err(ConfigError::invalid(
                        key(field),
                        format!(
                            "is for stages of users' own; the built-in {step} step takes coordinator.max_attempts and coordinator.{step}_deadline"
                        ),
                    ));
                }
            }
            if let Some(deadline) = stage.deadline {
                positive(&key("deadline"), deadline)?;
            }
            if stage.attempts == Some(0) {
                return Err(ConfigError::invalid(key("attempts"), "must be at least 1"));
            }
            for input in &stage.inputs {
                if !seen.contains(&output_stage(input)) {
                    return Err(ConfigError::invalid(
                        key("inputs"),
                        format!("{input:?} is not a stage before {step} (earlier: {})", seen.join(", ")),
                    ));
                }
            }
            if let Some(when) = &stage.when {
                when.validate(&key("when"), &seen)?;
            }
            seen.push(step.as_str());
        }
        Ok(())
    }
}

/// The stage whose output a name of `inputs` or of a condition's `field` refers to: the
/// analyze step's output is also called `analysis` (its name in the task's outputs).
fn output_stage(name: &str) -> &str {
    if name == "analysis" { "analyze" } else { name }
}

/// The key of a stage's output in the task's outputs: the stage's name, except the analyze
/// step's, kept as `analysis`.
pub fn output_key(name: &str) -> &str {
    if name == "analyze" { "analysis" } else { name }
}

impl StageCondition {
    fn validate(&self, key: &str, earlier: &[&str]) -> Result<(), ConfigError> {
        if let Some(field) = &self.field {
            let stage = field.split('.').next().unwrap_or_default();
            if !field.contains('.') || !earlier.contains(&output_stage(stage)) {
                return Err(ConfigError::invalid(
                    format!("{key}.field"),
                    format!(
                        "{field:?} must be <stage>.<field> of a stage before this one (earlier: {})",
                        earlier.join(", ")
                    ),
                ));
            }
        } else if self.equals.is_some() || self.above.is_some() {
            return Err(ConfigError::invalid(format!("{key}.field"), "equals and above need a field to compare"));
        }
        if self.equals.is_some() && self.above.is_some() {
            return Err(ConfigError::invalid(key, "give equals or above, not both"));
        }
        Ok(())
    }

    /// Whether the condition holds for a task whose source was detected as `format`, labelled
    /// `labels`, with `outputs` (each earlier stage's output by its name in the task's
    /// outputs, as JSON); `Err` says which part did not hold.
    pub fn check(
        &self,
        format: &str,
        labels: &imagepipe_contracts::Labels,
        outputs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), String> {
        if !self.format.is_empty() && !self.format.iter().any(|f| f.eq_ignore_ascii_case(format)) {
            return Err(format!("format {format} is not one of {}", self.format.join(", ")));
        }
        if !self.mime.is_empty() {
            let mime = mime_of_format(format);
            if !self.mime.iter().any(|m| m.eq_ignore_ascii_case(mime)) {
                return Err(format!("MIME type {mime} is not one of {}", self.mime.join(", ")));
            }
        }
        for (name, value) in &self.labels {
            if labels.get(name) != Some(value) {
                return Err(format!("label {name} is not {value:?}"));
            }
        }
        let Some(field) = &self.field else { return Ok(()) };
        let mut parts = field.split('.');
        let stage = parts.next().unwrap_or_default();
        let mut value = outputs.get(output_key(stage));
        for part in parts {
            value = value.and_then(|v| v.get(part));
        }
        let Some(value) = value else { return Err(format!("{field} is absent")) };
        if let Some(expected) = &self.equals
            && value != expected
        {
            return Err(format!("{field} is {value}, not {expected}"));
        }
        if let Some(above) = self.above
            && !value.as_f64().is_some_and(|v| v > above)
        {
            return Err(format!("{field} is {value}, not above {above}"));
        }
        Ok(())
    }
}

/// The MIME type of a detected format name (`jpeg` → `image/jpeg`).
pub fn mime_of_format(format: &str) -> &'static str {
    match format {
        "jpeg" | "jpg" => "image/jpeg",
        "png" => "image/png",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "bmp" => "image/bmp",
        "tiff" => "image/tiff",
        "heic" | "heif" => "image/heic",
        "avif" => "image/avif",
        _ => "application/octet-stream",
    }
}

/// Whether `output` is too large to keep (more than
/// [`imagepipe_contracts::stage::MAX_STAGE_OUTPUT_BYTES`] as JSON).
pub fn stage_output_too_large(output: &StepOutput) -> bool {
    match output {
        StepOutput::Stage(map) => {
            serde_json::to_vec(map).map_or(true, |json| json.len() > imagepipe_contracts::stage::MAX_STAGE_OUTPUT_BYTES)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pipeline(stages: serde_json::Value) -> PipelineConfig {
        serde_json::from_value(json!({ "stages": stages })).unwrap()
    }

    #[test]
    fn the_default_is_the_built_in_pipeline() {
        let config = PipelineConfig::default();
        config.validate().unwrap();
        let steps: Vec<Step> = config.steps().unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps, Step::ALL);
    }

    #[test]
    fn a_custom_stage_goes_after_download_with_its_settings() {
        let config = pipeline(json!([
            {"name": "download"}, {"name": "metadata"},
            {"name": "faces", "deadline": "30s", "attempts": 2, "inputs": ["metadata"], "when": {"format": ["jpeg"]}},
            {"name": "analyze"},
            {"name": "face_embed", "when": {"field": "faces.count", "above": 0}},
        ]));
        config.validate().unwrap();
        let faces = &config.steps().unwrap()[2];
        assert_eq!(faces.0.as_str(), "faces");
        assert_eq!(faces.1.deadline, Some(Duration::from_secs(30)));
    }

    #[test]
    fn bad_pipelines_are_refused_naming_the_key() {
        let cases = [
            (json!([{"name": "metadata"}, {"name": "download"}, {"name": "analyze"}]), "pipeline.stages"),
            (json!([{"name": "download"}, {"name": "metadata"}]), "pipeline.stages"),
            (
                json!([{"name": "faces"}, {"name": "download"}, {"name": "metadata"}, {"name": "analyze"}]),
                "start with download",
            ),
            (
                json!([{"name": "download"}, {"name": "metadata"}, {"name": "analyze"}, {"name": "Faces"}]),
                "stages[3].name",
            ),
            (
                json!([{"name": "download"}, {"name": "metadata"}, {"name": "analyze"}, {"name": "x"}, {"name": "x"}]),
                "appears twice",
            ),
            (
                json!([{"name": "download", "attempts": 3}, {"name": "metadata"}, {"name": "analyze"}]),
                "stages[0].attempts",
            ),
            (
                json!([{"name": "download"}, {"name": "x", "inputs": ["analyze"]}, {"name": "metadata"}, {"name": "analyze"}]),
                "stages[1].inputs",
            ),
            (
                json!([{"name": "download"}, {"name": "metadata"}, {"name": "analyze"}, {"name": "x", "when": {"field": "y.count"}}]),
                "when.field",
            ),
            (
                json!([{"name": "download"}, {"name": "metadata"}, {"name": "analyze"}, {"name": "x", "attempts": 0}]),
                "attempts",
            ),
        ];
        for (stages, expected) in cases {
            let error = pipeline(stages.clone()).validate().unwrap_err().to_string();
            assert!(error.contains(expected), "{stages}: {error}");
        }
    }

    #[test]
    fn a_condition_checks_format_mime_labels_and_an_earlier_output() {
        let outputs = json!({"faces": {"count": 2}, "metadata": {"width": 640}}).as_object().unwrap().clone();
        let labels: imagepipe_contracts::Labels = [("kind".to_owned(), "photo".to_owned())].into();
        let holds = |when: serde_json::Value, format: &str| {
            serde_json::from_value::<StageCondition>(when).unwrap().check(format, &labels, &outputs)
        };
        assert!(holds(json!({"format": ["jpeg", "heic"]}), "heic").is_ok());
        assert!(holds(json!({"format": ["jpeg"]}), "png").unwrap_err().contains("format png"));
        assert!(holds(json!({"mime": ["image/jpeg"]}), "jpeg").is_ok());
        assert!(holds(json!({"labels": {"kind": "photo"}}), "png").is_ok());
        assert!(holds(json!({"labels": {"kind": "scan"}}), "png").is_err());
        assert!(holds(json!({"field": "faces.count", "above": 0}), "png").is_ok());
        assert!(holds(json!({"field": "faces.count", "above": 2}), "png").unwrap_err().contains("not above 2"));
        assert!(holds(json!({"field": "metadata.width", "equals": 640}), "png").is_ok());
        assert!(holds(json!({"field": "faces.boxes"}), "png").unwrap_err().contains("absent"));
    }
}
