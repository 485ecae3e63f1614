//! Decoding under limits: the header is checked against `metadata.max_pixels`, `max_width`,
//! `max_height` and `max_alloc_bytes` before any pixel buffer is allocated, so a pixel bomb
//! (a tiny file claiming huge dimensions) fails fast. [`header`] stops there and says how many
//! bytes decoding will hold, for the memory budget.

use std::io::Cursor;

use image::{ColorType, DynamicImage, ExtendedColorType, ImageDecoder, ImageError, ImageFormat, ImageReader, Limits};
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

/// What an image's header says, read without decoding its pixels: enough to know what decoding
/// it will hold in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The container format.
    pub format: ImageFormat,
    /// Its wire name ([`format_name`]).
    pub format_name: &'static str,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The colour type the pixels decode to.
    pub color: ColorType,
    /// Bytes of the decoded pixels, in the colour type's own depth (16-bit RGBA: 8 per pixel).
    pub pixel_bytes: u64,
    /// Bytes the decoder holds beside the decoded pixels while it decodes ([`decoder_scratch`]).
    pub scratch_bytes: u64,
}

/// Reads the header of `bytes` and checks it against `settings`' limits, as [`decode`] does
/// before it allocates anything.
pub fn header(bytes: &[u8], settings: &MetadataConfig) -> Result<Header, ExtractError> {
    open(bytes, settings).map(|(_, header)| header)
}

/// Detects the format by magic bytes and decodes `bytes` within `settings`' limits.
pub fn decode(bytes: &[u8], settings: &MetadataConfig) -> Result<Decoded, ExtractError> {
    let (mut decoder, header) = open(bytes, settings)?;
    let (format, name) = (header.format, header.format_name);
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

    let image = DynamicImage::from_decoder(decoder).map_err(|error| classify(name, error))?;
    if image.width() == 0 || image.height() == 0 {
        return Err(ExtractError::Empty { format: name, width: image.width(), height: image.height() });
    }
    Ok(Decoded { image, format, format_name: name, has_icc_profile, exif })
}

/// A decoder for `bytes` whose header passed `settings`' limits, with what the header says.
fn open<'a>(bytes: &'a [u8], settings: &MetadataConfig) -> Result<(impl ImageDecoder + 'a, Header), ExtractError> {
    let reader = ImageReader::new(Cursor::new(bytes)).with_guessed_format().expect("reading from memory cannot fail");
    let (format, name) =
        reader.format().and_then(|f| Some((f, format_name(f)?))).ok_or(ExtractError::UnsupportedFormat)?;
    let failed = |error: ImageError| classify(name, error);
    let jpeg = (format == ImageFormat::Jpeg).then(|| jpeg_layout(bytes));
    // The JPEG decoder fills a truncated scan with grey instead of failing.
    if jpeg.is_some_and(|layout| !layout.ends) {
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
    let pixels = u64::from(width) * u64::from(height);
    if pixels > settings.max_pixels {
        return Err(ExtractError::TooManyPixels { width, height, max_pixels: settings.max_pixels });
    }
    // The output buffer counts against the allocation limit, as in `ImageReader::decode`.
    let mut remaining = limits;
    remaining.reserve(decoder.total_bytes()).map_err(failed)?;
    decoder.set_limits(remaining).map_err(failed)?;

    let progressive = jpeg.is_some_and(|layout| layout.progressive);
    let header = Header {
        format,
        format_name: name,
        width,
        height,
        color: decoder.color_type(),
        pixel_bytes: decoder.total_bytes(),
        scratch_bytes: decoder_scratch(format, decoder.original_color_type(), pixels, progressive),
    };
    Ok((decoder, header))
}

/// Bytes the `image` crate's decoder of `format` holds beside its output while it decodes
/// `pixels` stored as `stored`: TIFF reads the whole image in its stored layout before
/// converting it; WebP decodes through an RGBA (lossless) or YUV (lossy) frame, GIF through an
/// RGBA frame when the first frame does not cover the screen; a progressive JPEG keeps two bytes
/// per sample of DCT coefficients until its last scan. PNG, BMP and baseline JPEG decode a few
/// rows at a time.
pub fn decoder_scratch(format: ImageFormat, stored: ExtendedColorType, pixels: u64, progressive: bool) -> u64 {
    match format {
        ImageFormat::Tiff => pixels.saturating_mul(u64::from(stored.bits_per_pixel())) / 8,
        ImageFormat::WebP | ImageFormat::Gif => pixels.saturating_mul(4),
        ImageFormat::Jpeg if progressive => pixels.saturating_mul(2 * u64::from(stored.channel_count())),
        _ => 0,
    }
}

/// What the segments before a JPEG's first scan say.
#[derive(Debug, Clone, Copy)]
struct JpegLayout {
    /// The frame is progressive (SOF2, SOF6, SOF10 or SOF14).
    progressive: bool,
    /// The first scan is followed by an end-of-image marker.
    ends: bool,
}

/// Walks a JPEG's segments up to its first scan. The segments before the scan are skipped by
/// their lengths, so an EXIF thumbnail's end marker does not count; inside entropy-coded data
/// `FF D9` cannot occur (a data `FF` is followed by `00`).
fn jpeg_layout(bytes: &[u8]) -> JpegLayout {
    const SOS: u8 = 0xDA;
    const EOI: [u8; 2] = [0xFF, 0xD9];
    const PROGRESSIVE_FRAMES: [u8; 4] = [0xC2, 0xC6, 0xCA, 0xCE];
    let mut layout = JpegLayout { progressive: false, ends: false };
    let mut pos = 2; // after SOI
    loop {
        if bytes.get(pos) != Some(&0xFF) {
            return layout;
        }
        let Some(&marker) = bytes.get(pos + 1) else { return layout };
        match marker {
            0xFF => pos += 1, // fill byte
            0x01 | 0xD0..=0xD7 => pos += 2,
            SOS => {
                layout.ends = bytes[pos + 2..].windows(2).any(|w| w == EOI);
                return layout;
            }
            _ => {
                layout.progressive |= PROGRESSIVE_FRAMES.contains(&marker);
                let Some(len) = bytes.get(pos + 2..pos + 4) else { return layout };
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
        let ends = |parts: &[&[u8]]| jpeg_layout(&jpeg(parts)).ends;
        assert!(ends(&[&app1_with_thumbnail_end, &sos, &[0xFF, 0xD9]]));
        assert!(ends(&[&sos, &[0xFF, 0xD9, 0x00, 0x00]]), "trailing bytes after the end are fine");
        assert!(!ends(&[&app1_with_thumbnail_end, &sos]), "an EXIF thumbnail's end does not count");
        assert!(!ends(&[&app1_with_thumbnail_end]));
        assert!(!jpeg_layout(&[0xFF, 0xD8]).ends);
    }

    #[test]
    fn a_progressive_frame_marks_a_progressive_jpeg() {
        let frame = |marker: u8| [0xFF, marker, 0x00, 0x03, 0x08];
        let sos = [0xFF, 0xDA, 0x00, 0x02, 0xFF, 0xD9];
        assert!(jpeg_layout(&jpeg(&[&frame(0xC2), &sos])).progressive);
        assert!(!jpeg_layout(&jpeg(&[&frame(0xC0), &sos])).progressive, "baseline");
        assert!(!jpeg_layout(&jpeg(&[&sos, &frame(0xC2)])).progressive, "only segments before the scan count");
    }

    #[test]
    fn decoders_that_go_through_a_whole_frame_need_scratch() {
        let rgb = ExtendedColorType::Rgb8;
        assert_eq!(decoder_scratch(ImageFormat::Png, ExtendedColorType::Rgba16, 100, false), 0);
        assert_eq!(decoder_scratch(ImageFormat::Jpeg, rgb, 100, false), 0);
        assert_eq!(decoder_scratch(ImageFormat::Jpeg, rgb, 100, true), 600);
        assert_eq!(decoder_scratch(ImageFormat::Tiff, ExtendedColorType::Cmyk8, 100, false), 400);
        assert_eq!(decoder_scratch(ImageFormat::WebP, rgb, 100, false), 400);
    }

    /// A JPEG of SOI and `parts`.
    fn jpeg(parts: &[&[u8]]) -> Vec<u8> {
        [&[0xFF, 0xD8][..]].iter().chain(parts).flat_map(|p| p.iter().copied()).collect()
    }
}
