//! Decoding under limits: the header is checked against `metadata.max_pixels`, `max_width`,
//! `max_height` and `max_alloc_bytes` before any pixel buffer is allocated, so a pixel bomb
//! (a tiny file claiming huge dimensions) fails fast. [`header`] stops there and says how many
//! bytes decoding will hold, for the memory budget.
//!
//! Shrink-on-load: [`decode`] is told the long edge the caller needs. A JPEG is decoded by
//! libjpeg-turbo at the smallest DCT scale (M/8) that still covers it, so a 12 MP photo needed
//! at 1440 px is decoded straight to 1512×1134; other formats decode at full size and the
//! caller downscales at once. The container's facts (dimensions, EXIF, ICC) are always the
//! original's.

use std::io::Cursor;

use image::{ColorType, DynamicImage, ExtendedColorType, ImageDecoder, ImageError, ImageFormat, ImageReader, Limits};
use imagepipe_codec::jpeg;
use imagepipe_runtime::config::MetadataConfig;

use crate::error::ExtractError;
use crate::frames;
use crate::heif::{self, ColorProfile, HeifHeader};

/// A decoded image (the first frame of an animation) and what its container says about it.
pub struct Decoded {
    /// The pixels; a JPEG's may be scaled down (see the module docs).
    pub image: DynamicImage,
    /// Width of the stored image, in pixels.
    pub width: u32,
    /// Height of the stored image, in pixels.
    pub height: u32,
    /// The colour type the stored image decodes to at full size.
    pub color: ColorType,
    /// Bits per channel as stored (10 for a 10-bit HEIC, whose pixels decode to 8).
    pub bit_depth: u8,
    /// The container format's wire name ([`format_name`], or `heic` / `avif`).
    pub format_name: &'static str,
    /// Frames of an animation (images of a HEIF collection); 1 for still images.
    pub frame_count: u32,
    /// The pixels are already upright (HEIF applies its own rotation and mirroring; its EXIF
    /// orientation must not be applied again).
    pub upright: bool,
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
    /// The container format's wire name ([`format_name`], or `heic` / `avif`).
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
    /// libjpeg-turbo decodes it at a reduced scale ([`jpeg::decodes`]).
    pub shrinks: bool,
}

impl Header {
    /// What a HEIC's or AVIF's header says, in these terms: the pixels decode to 8-bit RGB(A).
    fn of_heif(h: &HeifHeader) -> Self {
        Self {
            format_name: h.kind.name(),
            width: h.stored_width,
            height: h.stored_height,
            color: heif_color(h),
            pixel_bytes: h.pixel_bytes,
            scratch_bytes: h.scratch_bytes,
            shrinks: false,
        }
    }

    /// Dimensions [`decode`] returns the pixels in when the caller needs a long edge of `need`.
    pub fn decoded_dimensions(&self, need: u32) -> (u32, u32) {
        if !self.shrinks {
            return (self.width, self.height);
        }
        jpeg::scaled_dimensions(self.width, self.height, jpeg::scale_for(self.width, self.height, need))
    }

    /// Bytes of the pixels [`decode`] returns for `need` (see [`Header::decoded_dimensions`]).
    pub fn decoded_bytes(&self, need: u32) -> u64 {
        if !self.shrinks {
            return self.pixel_bytes;
        }
        let (width, height) = self.decoded_dimensions(need);
        u64::from(width) * u64::from(height) * u64::from(self.color.bytes_per_pixel())
    }
}

/// The colour type libheif's pixels decode to: 8-bit RGB(A), whatever the stored depth.
fn heif_color(h: &HeifHeader) -> ColorType {
    if h.has_alpha { ColorType::Rgba8 } else { ColorType::Rgb8 }
}

/// Reads the header of `bytes` and checks it against `settings`' limits, as [`decode`] does
/// before it allocates anything.
pub fn header(bytes: &[u8], settings: &MetadataConfig) -> Result<Header, ExtractError> {
    if heif::sniff(bytes).is_some() {
        return heif::header(bytes, settings).map(|h| Header::of_heif(&h));
    }
    open(bytes, settings).map(|(_, header, _)| header)
}

/// Detects the format by magic bytes and decodes `bytes` within `settings`' limits, a JPEG at
/// the smallest scale whose long edge still covers `need` pixels.
pub fn decode(bytes: &[u8], settings: &MetadataConfig, need: u32) -> Result<Decoded, ExtractError> {
    if heif::sniff(bytes).is_some() {
        let (image, h) = heif::decode(bytes, settings, need)?;
        return Ok(Decoded {
            image,
            width: h.stored_width,
            height: h.stored_height,
            color: heif_color(&h),
            bit_depth: h.bit_depth,
            format_name: h.kind.name(),
            frame_count: h.image_count.max(1),
            upright: h.upright,
            has_icc_profile: h.color_profile == Some(ColorProfile::Icc),
            exif: h.exif,
        });
    }
    let (mut decoder, header, format) = open(bytes, settings)?;
    let name = header.format_name;
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

    let image = if header.shrinks {
        drop(decoder);
        let num = jpeg::scale_for(header.width, header.height, need);
        jpeg::decode_scaled(bytes, num).map_err(|reason| ExtractError::Decode { format: name, reason })?
    } else {
        DynamicImage::from_decoder(decoder).map_err(|error| classify(name, error))?
    };
    if image.width() == 0 || image.height() == 0 {
        return Err(ExtractError::Empty { format: name, width: image.width(), height: image.height() });
    }
    let (width, height, color) = (header.width, header.height, header.color);
    let frame_count = frames::frame_count(format, bytes);
    let bit_depth = bit_depth(color);
    Ok(Decoded {
        image,
        width,
        height,
        color,
        bit_depth,
        format_name: name,
        frame_count,
        upright: false,
        has_icc_profile,
        exif,
    })
}

/// A decoder for `bytes` whose header passed `settings`' limits, with what the header says.
fn open<'a>(
    bytes: &'a [u8],
    settings: &MetadataConfig,
) -> Result<(impl ImageDecoder + 'a, Header, ImageFormat), ExtractError> {
    let reader = ImageReader::new(Cursor::new(bytes)).with_guessed_format().expect("reading from memory cannot fail");
    let (format, name) =
        reader.format().and_then(|f| Some((f, format_name(f)?))).ok_or(ExtractError::UnsupportedFormat)?;
    let failed = |error: ImageError| classify(name, error);
    let layout = (format == ImageFormat::Jpeg).then(|| jpeg::layout(bytes));
    // The JPEG decoder fills a truncated scan with grey instead of failing.
    if layout.is_some_and(|layout| !layout.ends) {
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

    let progressive = layout.is_some_and(|layout| layout.progressive);
    let header = Header {
        format_name: name,
        width,
        height,
        color: decoder.color_type(),
        pixel_bytes: decoder.total_bytes(),
        scratch_bytes: decoder_scratch(format, decoder.original_color_type(), pixels, progressive),
        shrinks: layout.is_some() && jpeg::decodes(bytes),
    };
    Ok((decoder, header, format))
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
    fn decoders_that_go_through_a_whole_frame_need_scratch() {
        let rgb = ExtendedColorType::Rgb8;
        assert_eq!(decoder_scratch(ImageFormat::Png, ExtendedColorType::Rgba16, 100, false), 0);
        assert_eq!(decoder_scratch(ImageFormat::Jpeg, rgb, 100, false), 0);
        assert_eq!(decoder_scratch(ImageFormat::Jpeg, rgb, 100, true), 600);
        assert_eq!(decoder_scratch(ImageFormat::Tiff, ExtendedColorType::Cmyk8, 100, false), 400);
        assert_eq!(decoder_scratch(ImageFormat::WebP, rgb, 100, false), 400);
    }
}
