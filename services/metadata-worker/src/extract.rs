//! Everything the metadata step reports about one image, computed from its bytes: the CPU work
//! of the worker, free of I/O so the handler can run it on the blocking pool.
//!
//! One decode per image: the image is decoded once at the size its largest derivative needs
//! (shrink-on-load, see [`decode`]), turned upright once, and every derivative is scaled from
//! the one before it, largest first. Colours and hashes come from a [`ANALYSIS_EDGE`] copy.

use bytes::Bytes;
use image::DynamicImage;
use imagepipe_blob::BlobKey;
use imagepipe_contracts::step::{MetadataOutput, Thumbnail as ThumbnailOutput};
use imagepipe_runtime::config::{MetadataConfig, ThumbnailSpec};

use crate::decode::{self, Decoded};
use crate::error::ExtractError;
use crate::{colors, exif, phash, thumbnail};

/// Dominant colours reported per image.
pub const DOMINANT_COLORS: usize = 5;
/// Long edge of the copy colours, brightness and hashes are computed from, whatever the
/// configured derivatives are.
pub const ANALYSIS_EDGE: u32 = 256;
/// Long edge of the image the blurhash is computed from.
const BLURHASH_EDGE: u32 = 64;

/// The metadata of an image and its encoded derivatives.
#[derive(Debug, Clone)]
pub struct Extracted {
    /// The step output; its `thumbnails` name each derivative's content address.
    pub metadata: MetadataOutput,
    /// The encoded derivatives, to be written to the blob store, in the order of
    /// `metadata.thumbnails`.
    pub derivatives: Vec<Bytes>,
}

/// Decodes `bytes` within `settings`' limits and extracts the metadata and derivatives.
///
/// Dimensions, format, EXIF and ICC are those of the stored image (before orientation).
pub fn extract(bytes: &[u8], settings: &MetadataConfig) -> Result<Extracted, ExtractError> {
    let need = decode_edge(settings);
    let Decoded { image, width, height, color, bit_depth, format_name, frame_count, upright, has_icc_profile, exif } =
        decode::decode(bytes, settings, need)?;
    let exif = exif.and_then(|raw| match exif::parse(raw) {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(%error, "unreadable EXIF block; reported as absent");
            None
        }
    });
    let orientation = if upright { None } else { exif.as_ref().and_then(|e| e.orientation) };

    // Downscale first (turning a smaller image is cheaper), then turn upright once.
    let base = thumbnail::upright(thumbnail::fit(image, need), orientation);
    let (thumbnails, derivatives, analysis) = derive(base, settings)?;
    let rgba = analysis.to_rgba8();
    let dominant_colors = colors::dominant_colors(&rgba, DOMINANT_COLORS);
    let mean_brightness = colors::mean_brightness(&rgba);
    let phash = phash::to_hex(phash::phash(&analysis));
    let blurhash = blurhash_of(&analysis);

    let smallest = thumbnails.iter().min_by_key(|t| t.width.max(t.height)).expect("at least one derivative");
    let metadata = MetadataOutput {
        format: format_name.to_owned(),
        width,
        height,
        color_type: decode::color_type_name(color).to_owned(),
        bit_depth,
        has_alpha: color.has_alpha(),
        frame_count,
        exif,
        has_icc_profile,
        dominant_colors,
        mean_brightness,
        phash,
        blurhash,
        thumbnail_key: smallest.key.clone(),
        preview_key: thumbnails.iter().find(|t| t.name == settings.ai_input).map(|t| t.key.clone()),
        thumbnails,
    };
    Ok(Extracted { metadata, derivatives })
}

/// The long edge decoding must cover: the largest derivative, or the analysis copy.
pub fn decode_edge(settings: &MetadataConfig) -> u32 {
    settings.largest_thumbnail().max(ANALYSIS_EDGE)
}

/// Every derivative of `settings` from the upright `base`, each scaled from the next larger
/// one, and the [`ANALYSIS_EDGE`] copy scaled from the smallest; outputs and bytes in the
/// configured order.
fn derive(
    base: DynamicImage,
    settings: &MetadataConfig,
) -> Result<(Vec<ThumbnailOutput>, Vec<Bytes>, DynamicImage), ExtractError> {
    let mut order: Vec<(usize, &ThumbnailSpec)> = settings.thumbnails.iter().enumerate().collect();
    order.sort_by_key(|(i, spec)| (std::cmp::Reverse(spec.size), *i));
    let mut encoded: Vec<Option<(ThumbnailOutput, Bytes)>> = vec![None; order.len()];
    let mut current = base;
    for (index, spec) in order {
        current = thumbnail::fit(current, spec.size);
        let thumb = thumbnail::encode(&current, spec)?;
        let output = ThumbnailOutput {
            name: spec.name.clone(),
            key: BlobKey::of(&thumb.bytes).to_string(),
            format: thumb.format.to_owned(),
            width: thumb.width,
            height: thumb.height,
            size: thumb.bytes.len() as u64,
        };
        encoded[index] = Some((output, Bytes::from(thumb.bytes)));
    }
    let analysis = thumbnail::fit(current, ANALYSIS_EDGE);
    let (outputs, bytes) = encoded.into_iter().map(|e| e.expect("every derivative is encoded")).unzip();
    Ok((outputs, bytes, analysis))
}

/// Bytes of the buffers [`extract`] holds at once at its peak for the image in `bytes`, from
/// its header alone: while decoding, the decoded pixels (scaled for a JPEG) and the decoder's
/// scratch; then the decoded image beside its downscaled copy and the resizer's rows; then, per
/// derivative, the copy, its turned copy and the encoder's 8-bit RGBA copy. Fails as [`extract`]
/// would on a header it refuses.
pub fn memory_needed(bytes: &[u8], settings: &MetadataConfig) -> Result<u64, ExtractError> {
    let header = decode::header(bytes, settings)?;
    let need = decode_edge(settings);
    let decoded = header.decoded_bytes(need);
    let (dw, dh) = header.decoded_dimensions(need);
    let (fw, fh) = thumbnail::fitted(dw, dh, need);
    let fitted_pixels = u64::from(fw) * u64::from(fh);
    let fitted = fitted_pixels * u64::from(header.color.bytes_per_pixel());
    let decoding = decoded + header.scratch_bytes;
    let fitting = decoded + fitted + thumbnail::resize_scratch(fw, dh, header.color.bytes_per_pixel());
    let finishing = 2 * fitted + 4 * fitted_pixels;
    Ok(decoding.max(fitting).max(finishing))
}

/// Blurhash with 4×3 components (3×4 for portrait images) of a small copy of `image`.
fn blurhash_of(image: &DynamicImage) -> String {
    let small = thumbnail::fit(image.clone(), BLURHASH_EDGE).to_rgba8();
    let (x, y) = if small.width() >= small.height() { (4, 3) } else { (3, 4) };
    blurhash::encode(x, y, small.width(), small.height(), small.as_raw())
        .expect("component counts are in 1..=9 and the buffer matches its dimensions")
}
