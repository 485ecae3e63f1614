//! Everything the metadata step reports about one image, computed from its bytes: the CPU work
//! of the worker, free of I/O so the handler can run it on the blocking pool.

use bytes::Bytes;
use image::DynamicImage;
use imagepipe_blob::BlobKey;
use imagepipe_contracts::step::MetadataOutput;
use imagepipe_runtime::config::MetadataConfig;

use crate::decode::{self, Decoded};
use crate::error::ExtractError;
use crate::{colors, exif, frames, phash, thumbnail};

/// Dominant colours reported per image.
pub const DOMINANT_COLORS: usize = 5;
/// Long edge of the image the blurhash is computed from.
const BLURHASH_EDGE: u32 = 64;

/// The metadata of an image and its encoded thumbnail.
#[derive(Debug, Clone)]
pub struct Extracted {
    /// The step output; `thumbnail_key` is the content address of `thumbnail`.
    pub metadata: MetadataOutput,
    /// The encoded thumbnail, to be written to the blob store.
    pub thumbnail: Bytes,
}

/// Decodes `bytes` within `settings`' limits and extracts the metadata and thumbnail.
///
/// Colours, brightness, hashes and the thumbnail are computed from the upright image scaled to
/// `thumbnail_size`; dimensions are those of the stored image (before orientation).
pub fn extract(bytes: &[u8], settings: &MetadataConfig) -> Result<Extracted, ExtractError> {
    let Decoded { image, format, format_name, has_icc_profile, exif } = decode::decode(bytes, settings)?;
    let color = image.color();
    let exif = exif.and_then(|raw| match exif::parse(raw) {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(%error, "unreadable EXIF block; reported as absent");
            None
        }
    });
    let orientation = exif.as_ref().and_then(|e| e.orientation);
    let (width, height) = (image.width(), image.height());

    let fitted = thumbnail::fit(&image, settings.thumbnail_size);
    drop(image);
    let upright = thumbnail::upright(fitted, orientation);
    let rgba = upright.to_rgba8();
    let dominant_colors = colors::dominant_colors(&rgba, DOMINANT_COLORS);
    let mean_brightness = colors::mean_brightness(&rgba);
    let phash = phash::to_hex(phash::phash(&upright));
    let blurhash = blurhash_of(&upright);
    let thumbnail = thumbnail::encode(upright, settings.thumbnail_quality)?;

    let metadata = MetadataOutput {
        format: format_name.to_owned(),
        width,
        height,
        color_type: decode::color_type_name(color).to_owned(),
        bit_depth: decode::bit_depth(color),
        has_alpha: color.has_alpha(),
        frame_count: frames::frame_count(format, bytes),
        exif,
        has_icc_profile,
        dominant_colors,
        mean_brightness,
        phash,
        blurhash,
        thumbnail_key: BlobKey::of(&thumbnail.bytes).to_string(),
    };
    Ok(Extracted { metadata, thumbnail: Bytes::from(thumbnail.bytes) })
}

/// Bytes of the buffers [`extract`] holds at once at its peak for the image in `bytes`, from
/// its header alone: while decoding, the pixels in their own depth and the decoder's scratch;
/// then the decoded image beside its thumbnail-sized copy; after the image is dropped, the copy
/// and its turned (orientation) copy, or the copy, its RGBA copy for the colours and the
/// encoder's RGB(A) copy. Fails as [`extract`] would on a header it refuses.
pub fn memory_needed(bytes: &[u8], settings: &MetadataConfig) -> Result<u64, ExtractError> {
    let header = decode::header(bytes, settings)?;
    let (width, height) = thumbnail::fitted(header.width, header.height, settings.thumbnail_size);
    let fitted_pixels = u64::from(width) * u64::from(height);
    let fitted = fitted_pixels * u64::from(header.color.bytes_per_pixel());
    let decoding = header.pixel_bytes + header.scratch_bytes;
    let fitting = header.pixel_bytes + fitted;
    let finishing = (2 * fitted).max(fitted + 2 * 4 * fitted_pixels);
    Ok(decoding.max(fitting).max(finishing))
}

/// Blurhash with 4×3 components (3×4 for portrait images) of a small copy of `image`.
fn blurhash_of(image: &DynamicImage) -> String {
    let small = thumbnail::fit(image, BLURHASH_EDGE).to_rgba8();
    let (x, y) = if small.width() >= small.height() { (4, 3) } else { (3, 4) };
    blurhash::encode(x, y, small.width(), small.height(), small.as_raw())
        .expect("component counts are in 1..=9 and the buffer matches its dimensions")
}
