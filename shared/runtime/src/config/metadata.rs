//! The `metadata` section: how the metadata worker decodes images and writes thumbnails.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::budget;

/// The `metadata` section: how the metadata worker decodes images and writes thumbnails.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataConfig {
    /// Most pixels (width × height) an image may have; larger ones (pixel bombs) fail before
    /// they are decoded.
    pub max_pixels: u64,
    /// Widest image accepted, in pixels.
    pub max_width: u32,
    /// Tallest image accepted, in pixels.
    pub max_height: u32,
    /// Most bytes a decoder may allocate for one image.
    pub max_alloc_bytes: u64,
    /// The derivatives written for every image, each its own blob (by default a 256 px WebP
    /// `thumbnail` and a 1440 px JPEG `preview`). All are made from one decode, at the smallest
    /// JPEG DCT scale that covers the largest of them.
    pub thumbnails: Vec<ThumbnailSpec>,
    /// The name of the derivative the AI worker reads instead of the original (`preview`).
    pub ai_input: String,
    /// Bytes of pixel buffers the process's decodes may hold at once; an image waits until its
    /// share is free. At least 16 MiB; by default a quarter of the memory (of the cgroup's limit
    /// when lower), [`budget::default_capacity`].
    #[schemars(extend("x-default" = "¼ of the memory"))]
    pub memory_budget: u64,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        Self {
            max_pixels: 100_000_000,
            max_width: 65_535,
            max_height: 65_535,
            max_alloc_bytes: 1 << 30,
            thumbnails: vec![
                ThumbnailSpec { name: "thumbnail".into(), size: 256, format: ThumbnailFormat::Webp, quality: 80 },
                ThumbnailSpec { name: "preview".into(), size: 1440, format: ThumbnailFormat::Jpeg, quality: 85 },
            ],
            ai_input: "preview".into(),
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
        if !(1..=MAX_THUMBNAILS).contains(&self.thumbnails.len()) {
            return Err(ConfigError::invalid(
                "metadata.thumbnails",
                format!("must list 1-{MAX_THUMBNAILS} derivatives (the AI worker reads one of them)"),
            ));
        }
        for (i, spec) in self.thumbnails.iter().enumerate() {
            spec.validate()?;
            if self.thumbnails[..i].iter().any(|other| other.name == spec.name) {
                return Err(ConfigError::invalid(
                    "metadata.thumbnails",
                    format!("the name {:?} is used twice", spec.name),
                ));
            }
        }
        if self.ai_input_spec().is_none() {
            return Err(ConfigError::invalid(
                "metadata.ai_input",
                format!("{:?} is not the name of one of metadata.thumbnails", self.ai_input),
            ));
        }
        super::memory_budget("metadata.memory_budget", self.memory_budget)
    }

    /// The derivative named by `ai_input` (a valid configuration has it).
    pub fn ai_input_spec(&self) -> Option<&ThumbnailSpec> {
        self.thumbnails.iter().find(|spec| spec.name == self.ai_input)
    }

    /// The long edge of the largest derivative: what decoding must cover.
    pub fn largest_thumbnail(&self) -> u32 {
        self.thumbnails.iter().map(|spec| spec.size).max().unwrap_or(0)
    }
}

/// Most derivatives `metadata.thumbnails` may list.
pub const MAX_THUMBNAILS: usize = 8;

/// One derivative of `metadata.thumbnails`: the image scaled to fit `size` (never enlarged),
/// upright, encoded as `format`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ThumbnailSpec {
    /// Its name in `image.metadata_extracted` (`thumbnail`, `preview`; `[a-z0-9_-]`, 1-32).
    pub name: String,
    /// Long edge in pixels, 16-8192.
    pub size: u32,
    /// Encoding.
    pub format: ThumbnailFormat,
    /// Quality of lossy encodings, 1-100 (PNG ignores it).
    #[serde(default = "default_quality")]
    pub quality: u8,
}

fn default_quality() -> u8 {
    85
}

impl ThumbnailSpec {
    fn validate(&self) -> Result<(), ConfigError> {
        let name_ok = (1..=32).contains(&self.name.len())
            && self.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(ConfigError::invalid(
                "metadata.thumbnails",
                format!("the name {:?} must be 1-32 of a-z, 0-9, _ and -", self.name),
            ));
        }
        if !(16..=8192).contains(&self.size) {
            return Err(ConfigError::invalid(
                "metadata.thumbnails",
                format!("{}: size {} must be 16-8192 pixels", self.name, self.size),
            ));
        }
        if !(1..=100).contains(&self.quality) {
            return Err(ConfigError::invalid(
                "metadata.thumbnails",
                format!("{}: quality {} must be 1-100", self.name, self.quality),
            ));
        }
        Ok(())
    }
}

/// How a derivative is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ThumbnailFormat {
    /// Lossy WebP (with alpha when the image has it).
    Webp,
    /// JPEG; an image with alpha is written as PNG instead.
    Jpeg,
    /// Lossless PNG.
    Png,
}

impl ThumbnailFormat {
    /// The wire name: `webp`, `jpeg`, `png`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Webp => "webp",
            Self::Jpeg => "jpeg",
            Self::Png => "png",
        }
    }
}
