//! Decoding under limits: the header is checked against `metadata.max_pixels`, `max_width`,
//! `max_height` and `max_alloc_bytes` before any pixel buffer is allocated, so a pixel bomb
//! (a tiny file claiming huge dimensions) fails fast.

use std::io::Cursor;

use image::{ColorType, DynamicImage, ImageDecoder, ImageError, ImageFormat, ImageReader, Limits};
use imagepipe_runtime::config::MetadataSettings;

use crate::error::ExtractError;

/// A decoded image (the first frame of an animation) and what its container says about it.
pub struct Decoded {
    /// The pixels.
    pub image: DynamicImage,
    /// The container format.
    pub format: ImageFormat,
    /// Whether an ICC profile is embedded.
    pub has_icc_profile: bool,
    /// The raw EXIF block (a TIFF structure), if any.
    pub exif: Option<Vec<u8>>,
}

/// The wire name of a format: `jpeg`, `png`, `gif`, `webp`, `bmp`, `tiff`.
pub fn format_name(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Jpeg => "jpeg",
        ImageFormat::Png => "png",
        ImageFormat::Gif => "gif",
        ImageFormat::WebP => "webp",
        ImageFormat::Bmp => "bmp",
        ImageFormat::Tiff => "tiff",
        _ => "unsupported",
    }
}

/// The wire name of a colour type: `l8`, `la8`, `rgb8`, `rgba8`, `l16`, ..., `rgba32f`.
pub fn color_type_name(color: ColorType) -> &'static str {
    match color {
        ColorType::L8 => "l8",
        ColorType::La8 => "la8",
        ColorType::Rgb8 => "rgb8",
        ColorType::Rgba8 => "rgba8",
        ColorType::L16 => "l16",
        ColorType::La16 => "la16",
        ColorType::Rgb16 => "rgb16",
        ColorType::Rgba16 => "rgba16",
        ColorType::Rgb32F => "rgb32f",
        ColorType::Rgba32F => "rgba32f",
        _ => "other",
    }
}

/// Bits per channel of a colour type.
pub fn bit_depth(color: ColorType) -> u8 {
    let channels = color.channel_count().max(1);
    u8::try_from(color.bits_per_pixel() / u16::from(channels)).unwrap_or(u8::MAX)
}

/// Detects the format by magic bytes and decodes `bytes` within `settings`' limits.
pub fn decode(bytes: &[u8], settings: &MetadataSettings) -> Result<Decoded, ExtractError> {
    let reader = ImageReader::new(Cursor::new(bytes)).with_guessed_format().expect("reading from memory cannot fail");
    let format = reader.format().filter(|f| format_name(*f) != "unsupported").ok_or(ExtractError::UnsupportedFormat)?;
    let name = format_name(format);
    let failed = |error: ImageError| classify(name, error);

    let mut reader = reader;
    let limits = limits(settings);
    reader.limits(limits.clone());
    let mut decoder = reader.into_decoder().map_err(failed)?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > settings.max_pixels {
        return Err(ExtractError::TooManyPixels { width, height, max_pixels: settings.max_pixels });
    }
    // The output buffer counts against the allocation limit, as in `ImageReader::decode`.
    let mut remaining = limits;
    remaining.reserve(decoder.total_bytes()).map_err(failed)?;
    decoder.set_limits(remaining).map_err(failed)?;

    let has_icc_profile = match decoder.icc_profile() {
        Ok(profile) => profile.is_some_and(|p| !p.is_empty()),
        Err(error) => {
            tracing::warn!(format = name, %error, "unreadable ICC profile; reported as absent");
            false
        }
    };
    let exif = match decoder.exif_metadata() {
        Ok(exif) => exif.filter(|e| !e.is_empty()),
        Err(error) => {
            tracing::warn!(format = name, %error, "unreadable EXIF block; reported as absent");
            None
        }
    };
    // TIFF keeps its EXIF pointer in the file's own first IFD: the file is the EXIF block.
    let exif = exif.or_else(|| (format == ImageFormat::Tiff).then(|| bytes.to_vec()));

    let image = DynamicImage::from_decoder(decoder).map_err(failed)?;
    if image.width() == 0 || image.height() == 0 {
        return Err(ExtractError::Empty { format: name, width: image.width(), height: image.height() });
    }
    Ok(Decoded { image, format, has_icc_profile, exif })
}

fn limits(settings: &MetadataSettings) -> Limits {
    let mut limits = Limits::no_limits();
    limits.max_image_width = Some(settings.max_width);
    limits.max_image_height = Some(settings.max_height);
    limits.max_alloc = Some(settings.max_alloc_bytes);
    limits
}

fn classify(format: &'static str, error: ImageError) -> ExtractError {
    match error {
        ImageError::Limits(limit) => ExtractError::DecoderLimit { format, limit: limit.to_string() },
        other => ExtractError::Decode { format, reason: other.to_string() },
    }
}
