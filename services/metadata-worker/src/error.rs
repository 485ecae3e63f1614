//! Why an image's metadata could not be extracted, with the stable code its step result carries.

use imagepipe_contracts::StepError;

/// Stable error codes of the metadata step (the `code` of its [`StepError`]s).
pub mod codes {
    /// The image has more pixels, or is wider or taller, than the configured limits allow.
    pub const PIXEL_LIMIT: &str = "pixel_limit";
    /// The bytes are not an image in a supported format.
    pub const UNSUPPORTED_FORMAT: &str = "unsupported_format";
    /// The image is truncated or corrupt.
    pub const DECODE_FAILED: &str = "decode_failed";
    /// The thumbnail could not be encoded.
    pub const THUMBNAIL_FAILED: &str = "thumbnail_failed";
    /// The decoding task was cancelled (the runtime is shutting down; retryable).
    pub const INTERRUPTED: &str = "interrupted";
}

/// Why extracting metadata from an image's bytes failed. Every variant is permanent: the same
/// bytes fail the same way on every attempt.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    /// Width × height is over `metadata.max_pixels`.
    #[error("the image is {width}×{height} = {pixels} pixels, over the limit of {max_pixels}", pixels = u64::from(*width) * u64::from(*height))]
    TooManyPixels {
        /// Width the header claims.
        width: u32,
        /// Height the header claims.
        height: u32,
        /// The configured limit.
        max_pixels: u64,
    },
    /// The decoder refused the image under `metadata.max_width`, `max_height` or `max_alloc_bytes`.
    #[error("the {format} image exceeds the decoding limits ({limit})")]
    DecoderLimit {
        /// Detected format.
        format: &'static str,
        /// What the decoder reported.
        limit: String,
    },
    /// The bytes are in no supported format.
    #[error("not an image in a supported format (jpeg, png, gif, webp, bmp, tiff, heic, avif)")]
    UnsupportedFormat,
    /// The image is truncated or corrupt.
    #[error("decoding the {format} image failed: {reason}")]
    Decode {
        /// Detected format.
        format: &'static str,
        /// What the decoder reported.
        reason: String,
    },
    /// The decoder panicked on these bytes.
    #[error("the decoder crashed on this image")]
    DecoderPanicked,
    /// The image decoded to zero pixels.
    #[error("the {format} image has no pixels ({width}×{height})")]
    Empty {
        /// Detected format.
        format: &'static str,
        /// Width decoded.
        width: u32,
        /// Height decoded.
        height: u32,
    },
    /// A derivative could not be encoded.
    #[error("encoding the {name} derivative failed: {reason}")]
    Thumbnail {
        /// Its name in `metadata.thumbnails`.
        name: String,
        /// What the encoder reported.
        reason: String,
    },
}

impl ExtractError {
    /// The stable code of this error (one of [`codes`]).
    pub fn code(&self) -> &'static str {
        match self {
            Self::TooManyPixels { .. } | Self::DecoderLimit { .. } => codes::PIXEL_LIMIT,
            Self::UnsupportedFormat => codes::UNSUPPORTED_FORMAT,
            Self::Decode { .. } | Self::DecoderPanicked | Self::Empty { .. } => codes::DECODE_FAILED,
            Self::Thumbnail { .. } => codes::THUMBNAIL_FAILED,
        }
    }

    /// This error as a step error.
    pub fn to_step_error(&self) -> StepError {
        StepError::new(self.code(), self.to_string())
    }
}
