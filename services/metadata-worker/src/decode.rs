//! Decoding under limits: the header is checked against `metadata.max_pixels`, `max_width`,
//! `max_height` and `max_alloc_bytes` before any pixel buffer is allocated, so a pixel bomb
//! (a tiny file claiming huge dimensions) fails fast.

use std::io::Cursor;

use image::{ColorType, DynamicImage, ImageDecoder, ImageError, ImageFormat, ImageReader, Limits};
use imagepipe_runtime::config::MetadataConfig;

use crate::error::ExtractError;

/// A decoded image (the first frame of an animation) and what its container says about it.
pub struct Decoded {
    /// The pixels.
    pub image: DynamicImage,
    /// The container format.
    pub format: ImageFormat,
    /// Its wire name ([`format_name`]).
    pub format_name: &'static str,
    /// Whether an ICC profile is embedded.
    pub has_icc_profile: bool,
    /// The raw EXIF block (a TIFF structure), if any.
    pub exif: Option<Vec<u8>>,
}

/// The wire name of a supported format (`jpeg`, `png`, `gif`, `webp`, `bmp`, `tiff`); `None`
/// for formats the worker does not decode.
pub fn format_name(format: ImageFormat) -> Option<&'static str> {
    match format {
        ImageFormat::Jpeg => Some("jpeg"),
        ImageFormat::Png => Some("png"),
        ImageFormat::Gif => Some("gif"),
        ImageFormat::WebP => Some("webp"),
        ImageFormat::Bmp => Some("bmp"),
        ImageFormat::Tiff => Some("tiff"),
        _ => None,
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
pub fn decode(bytes: &[u8], settings: &MetadataConfig) -> Result<Decoded, ExtractError> {
    let reader = ImageReader::new(Cursor::new(bytes)).with_guessed_format().expect("reading from memory cannot fail");
    let (format, name) =
        reader.format().and_then(|f| Some((f, format_name(f)?))).ok_or(ExtractError::UnsupportedFormat)?;
    let failed = |error: ImageError| classify(name, error);
    // The JPEG decoder fills a truncated scan with grey instead of failing.
    if format == ImageFormat::Jpeg && !jpeg_has_end(bytes) {
        return Err(ExtractError::Decode {
            format: name,
            reason: "truncated: no end-of-image marker after the scan".into(),
        });
    }

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
    Ok(Decoded { image, format, format_name: name, has_icc_profile, exif })
}

/// Whether a JPEG's first scan is followed by an end-of-image marker. The segments before the
/// scan are skipped by their lengths, so an EXIF thumbnail's marker does not count; inside
/// entropy-coded data `FF D9` cannot occur (a data `FF` is followed by `00`).
fn jpeg_has_end(bytes: &[u8]) -> bool {
    const SOS: u8 = 0xDA;
    const EOI: [u8; 2] = [0xFF, 0xD9];
    let mut pos = 2; // after SOI
    loop {
        if bytes.get(pos) != Some(&0xFF) {
            return false;
        }
        let Some(&marker) = bytes.get(pos + 1) else { return false };
        match marker {
            0xFF => pos += 1, // fill byte
            0x01 | 0xD0..=0xD7 => pos += 2,
            SOS => return bytes[pos + 2..].windows(2).any(|w| w == EOI),
            _ => {
                let Some(len) = bytes.get(pos + 2..pos + 4) else { return false };
                pos += 2 + usize::from(u16::from_be_bytes([len[0], len[1]]));
            }
        }
    }
}

fn limits(settings: &MetadataConfig) -> Limits {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jpeg_ends_with_an_end_marker_after_its_scan() {
        let app1_with_thumbnail_end = [0xFF, 0xE1, 0x00, 0x06, 0xFF, 0xD9, 0x00, 0x00];
        let sos = [0xFF, 0xDA, 0x00, 0x02, 0x12, 0xFF, 0x00, 0x34];
        let jpeg = |parts: &[&[u8]]| {
            [&[0xFF, 0xD8][..]].iter().chain(parts).flat_map(|p| p.iter().copied()).collect::<Vec<u8>>()
        };
        assert!(jpeg_has_end(&jpeg(&[&app1_with_thumbnail_end, &sos, &[0xFF, 0xD9]])));
        assert!(jpeg_has_end(&jpeg(&[&sos, &[0xFF, 0xD9, 0x00, 0x00]])), "trailing bytes after the end are fine");
        assert!(!jpeg_has_end(&jpeg(&[&app1_with_thumbnail_end, &sos])), "an EXIF thumbnail's end does not count");
        assert!(!jpeg_has_end(&jpeg(&[&app1_with_thumbnail_end])));
        assert!(!jpeg_has_end(&[0xFF, 0xD8]));
    }
}
