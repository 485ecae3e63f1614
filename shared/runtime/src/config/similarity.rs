//! The `similarity` section: when the similarity indexer calls two images near-duplicates, and
//! when its vector index turns approximate, how long a search by image waits for the model.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, positive};

/// The `similarity` section (the similarity indexer's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SimilarityConfig {
    /// A new image whose 64-bit perceptual hash differs from an earlier one's in at most this
    /// many bits is a near-duplicate of it (0-64).
    pub phash_max_distance: u32,
    /// A new image whose embedding's cosine with an earlier one's is at least this is a
    /// near-duplicate of it (0-1]. Calibrated on the sample photos with the bundled model:
    /// copies resized, re-encoded or cropped by 10 % score 0.88-0.99 with their original,
    /// different photos at most 0.29.
    pub duplicate_threshold: f64,
    /// Images (per embedding version) held before the vector index adds an approximate (HNSW)
    /// graph to its exact search: the exact scan of 100,000 1280-d vectors takes 10 ms at p50
    /// and about 20 ms at p99 on two cores, the graph under 6 ms at p99.
    pub exact_limit: usize,
    /// Lowest cosine kept as a pair for `GET /v1/duplicates` (its `threshold` may not go lower).
    pub pair_floor: f64,
    /// Longest a `POST /v1/search/similar` waits for a free model slot (`ai.threads`, shared
    /// with the AI worker in `imagepipe run`) and its share of `ai.memory_budget`; then it is
    /// answered `503 busy` with `Retry-After`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub model_wait: Duration,
}

impl Default for SimilarityConfig {
    fn default() -> Self {
        Self {
            phash_max_distance: 6,
            duplicate_threshold: 0.85,
            exact_limit: 50_000,
            pair_floor: 0.75,
            model_wait: Duration::from_secs(5),
        }
    }
}

impl SimilarityConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.phash_max_distance > 64 {
            return Err(ConfigError::invalid("similarity.phash_max_distance", "must be 0-64 (bits of a 64-bit hash)"));
        }
        if !(self.duplicate_threshold > 0.0 && self.duplicate_threshold <= 1.0) {
            return Err(ConfigError::invalid("similarity.duplicate_threshold", "must be a cosine in (0, 1]"));
        }
        if !(self.pair_floor > 0.0 && self.pair_floor <= self.duplicate_threshold) {
            return Err(ConfigError::invalid(
                "similarity.pair_floor",
                "must be a cosine in (0, similarity.duplicate_threshold]",
            ));
        }
        if self.exact_limit == 0 {
            return Err(ConfigError::invalid("similarity.exact_limit", "must be at least 1"));
        }
        positive("similarity.model_wait", self.model_wait)
    }
}
