//! The `ai` section: the AI worker's model and analysis.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::budget;

/// The `ai` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AiConfig {
    /// Where the prepared model files are (written by `scripts/prepare-model.sh`).
    pub model_dir: PathBuf,
    /// How many of the best classes an analysis reports.
    pub top_k: usize,
    /// Most inferences running at once, each on its own blocking thread (default: cores).
    pub threads: usize,
    /// Least score a tag needs to be reported; a tag's score is the summed probability of the
    /// classes it covers.
    pub tag_min_score: f64,
    /// Most pixels (width × height) an image may have; larger ones fail before they are decoded.
    pub max_pixels: u64,
    /// Bytes of pixel buffers the process's decodes and preprocessing may hold at once; an image
    /// waits until its share is free (default: [`budget::default_capacity`]).
    pub memory_budget: u64,
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
}
