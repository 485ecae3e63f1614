//! The `ai` section: the AI worker's model and analysis.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::budget;

/// Which inference runtime runs the model (`ai.runtime`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AiRuntime {
    /// onnxruntime when its shared library (shipped in the model directory by
    /// `scripts/prepare-model.sh`, or `ai.onnxruntime_library`) loads; otherwise tract, with a
    /// warning saying why.
    #[default]
    Auto,
    /// onnxruntime (several times faster than tract); a library that cannot load is an error.
    Onnxruntime,
    /// tract: pure Rust, needs no shared library, slower.
    Tract,
}

impl AiRuntime {
    /// The value as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Onnxruntime => "onnxruntime",
            Self::Tract => "tract",
        }
    }
}

impl std::fmt::Display for AiRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `ai` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AiConfig {
    /// Where the model files are: written by `scripts/prepare-model.sh`, or any ONNX image
    /// classifier of your own that its `manifest.json` describes (docs/model.md).
    pub model_dir: PathBuf,
    /// How many of the best classes an analysis reports.
    pub top_k: usize,
    /// Most inferences running at once, each on its own blocking thread (default: cores).
    #[schemars(extend("x-default" = "the number of cores"))]
    pub threads: usize,
    /// Least score a tag needs to be reported; a tag's score is the summed probability of the
    /// classes it covers.
    pub tag_min_score: f64,
    /// Most pixels (width × height) an image may have; larger ones fail before they are decoded.
    pub max_pixels: u64,
    /// Bytes of pixel buffers the process's decodes and preprocessing may hold at once; an image
    /// waits until its share is free. At least 16 MiB; by default a quarter of the memory (of the
    /// cgroup's limit when lower), [`budget::default_capacity`].
    #[schemars(extend("x-default" = "¼ of the memory"))]
    pub memory_budget: u64,
    /// Which runtime runs the model: `auto` (default), `onnxruntime` or `tract`. An explicit
    /// runtime that cannot load stops the worker with the reason. Each inference runs on one
    /// thread; `ai.threads` run at once.
    pub runtime: AiRuntime,
    /// onnxruntime's shared library (`libonnxruntime.so.<version>`, 1.22 or newer) to load
    /// instead of the one in `ai.model_dir`; unset: the model directory's.
    pub onnxruntime_library: Option<PathBuf>,
}

impl Default for AiConfig {
    fn default() -> Self {
        Self {
            model_dir: PathBuf::from(".imagepipe/models"),
            top_k: 5,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            tag_min_score: 0.05,
            max_pixels: 100_000_000,
            memory_budget: budget::default_capacity(),
            runtime: AiRuntime::default(),
            onnxruntime_library: None,
        }
    }
}

impl AiConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        super::non_empty_path("ai.model_dir", &self.model_dir)?;
        if !(1..=1000).contains(&self.top_k) {
            return Err(ConfigError::invalid("ai.top_k", "must be 1-1000 (the model has 1000 classes)"));
        }
        if self.threads == 0 {
            return Err(ConfigError::invalid("ai.threads", "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.tag_min_score) {
            return Err(ConfigError::invalid("ai.tag_min_score", "must be 0-1"));
        }
        if self.max_pixels == 0 {
            return Err(ConfigError::invalid("ai.max_pixels", "must be at least 1"));
        }
        if let Some(library) = &self.onnxruntime_library {
            super::non_empty_path("ai.onnxruntime_library", library)?;
            if self.runtime == AiRuntime::Tract {
                return Err(ConfigError::invalid(
                    "ai.onnxruntime_library",
                    "is set, but ai.runtime is tract, which does not use it (unset one of them)",
                ));
            }
        }
        super::memory_budget("ai.memory_budget", self.memory_budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_budget_under_the_minimum_is_refused_by_name() {
        let small = AiConfig { memory_budget: budget::MIN_CAPACITY - 1, ..AiConfig::default() };
        assert!(small.validate().unwrap_err().to_string().contains("ai.memory_budget"));
        assert!(AiConfig { memory_budget: budget::MIN_CAPACITY, ..AiConfig::default() }.validate().is_ok());
    }

    #[test]
    fn the_runtime_is_auto_by_default_and_reads_its_names() {
        assert_eq!(AiConfig::default().runtime, AiRuntime::Auto);
        assert_eq!(AiConfig::default().onnxruntime_library, None);
        for runtime in [AiRuntime::Auto, AiRuntime::Onnxruntime, AiRuntime::Tract] {
            let parsed: AiRuntime = serde_json::from_value(serde_json::json!(runtime.as_str())).unwrap();
            assert_eq!(parsed, runtime);
            assert_eq!(runtime.to_string(), runtime.as_str());
        }
        assert!(serde_json::from_value::<AiRuntime>(serde_json::json!("torch")).is_err());
    }

    #[test]
    fn an_onnxruntime_library_must_be_a_path_and_needs_a_runtime_that_uses_it() {
        let with = |runtime, library: &str| AiConfig {
            runtime,
            onnxruntime_library: Some(PathBuf::from(library)),
            ..AiConfig::default()
        };
        assert!(with(AiRuntime::Auto, "/opt/ort/libonnxruntime.so").validate().is_ok());
        assert!(with(AiRuntime::Onnxruntime, "/opt/ort/libonnxruntime.so").validate().is_ok());
        let empty = with(AiRuntime::Onnxruntime, "").validate().unwrap_err().to_string();
        assert!(empty.contains("ai.onnxruntime_library"), "{empty}");
        let unused = with(AiRuntime::Tract, "/opt/ort/libonnxruntime.so").validate().unwrap_err().to_string();
        assert!(unused.contains("ai.onnxruntime_library") && unused.contains("tract"), "{unused}");
        assert!(AiConfig { runtime: AiRuntime::Tract, ..AiConfig::default() }.validate().is_ok());
    }
}
