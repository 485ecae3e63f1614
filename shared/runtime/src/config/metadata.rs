//! The `metadata` section: how the metadata worker decodes images and writes thumbnails.

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::budget;

/// The `metadata` section: how the metadata worker decodes images and writes thumbnails.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataConfig {
    /// Most pixels (width × height) an image may have; larger ones fail before they are decoded.
    pub max_pixels: u64,
    /// Widest image accepted, in pixels.
    pub max_width: u32,
    /// Tallest image accepted, in pixels.
    pub max_height: u32,
    /// Most bytes a decoder may allocate for one image.
    pub max_alloc_bytes: u64,
    /// Long edge of the thumbnail, in pixels.
    pub thumbnail_size: u32,
    /// JPEG quality of thumbnails without alpha, 1-100 (thumbnails with alpha are PNG).
    pub thumbnail_quality: u8,
    /// Bytes of pixel buffers the process's decodes may hold at once; an image waits until its
    /// share is free (default: [`budget::default_capacity`]).
    pub memory_budget: u64,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        Self {
            max_pixels: 100_000_000,
            max_width: 65_535,
            max_height: 65_535,
            max_alloc_bytes: 1 << 30,
            thumbnail_size: 256,
            thumbnail_quality: 85,
            memory_budget: budget::default_capacity(),
        }
    }
}

impl MetadataConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("metadata.max_pixels", self.max_pixels),
            ("metadata.max_width", self.max_width.into()),
            ("metadata.max_height", self.max_height.into()),
            ("metadata.max_alloc_bytes", self.max_alloc_bytes),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        if !(16..=4096).contains(&self.thumbnail_size) {
            return Err(ConfigError::invalid("metadata.thumbnail_size", "must be 16-4096 pixels"));
        }
        if !(1..=100).contains(&self.thumbnail_quality) {
            return Err(ConfigError::invalid("metadata.thumbnail_quality", "must be 1-100"));
        }
        super::memory_budget("metadata.memory_budget", self.memory_budget)
    }
}
