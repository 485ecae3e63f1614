//! Everything the metadata step reports about one image, computed from its bytes: the CPU work
//! of the worker, free of I/O so the handler can run it on the blocking pool.
//!
//! One decode per image: the image is decoded once at the size its largest derivative needs
//! (shrink-on-load, see [`decode`]), turned upright once, and every derivative is scaled from
//! the one before it, largest first. Colours and hashes come from a [`ANALYSIS_EDGE`] copy.

use std::borrow::Cow;

use bytes::Bytes;
use image::DynamicImage;
use imagepipe_blob::BlobKey;
use imagepipe_contracts::step::{DominantColor, MetadataOutput, Thumbnail as ThumbnailOutput};
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

/// Decodes `bytes` within `settings`' limits and extracts the metadata and derivatives, on the
/// calling thread alone.
///
/// Dimensions, format, EXIF and ICC are those of the stored image (before orientation).
pub fn extract(bytes: &[u8], settings: &MetadataConfig) -> Result<Extracted, ExtractError> {
    extract_with(bytes, settings, || None::<()>)
}

/// [`extract`], encoding the largest derivative on a second thread while this one makes the
/// rest, when `spare` hands over a free core (the slot it returns is held until that encode
/// ends; `None`: all on this thread). Outputs are the same either way; at low load the step
/// then takes about the time of the decode and the longer of the two halves, not their sum.
pub fn extract_with<S: Send>(
    bytes: &[u8],
    settings: &MetadataConfig,
    spare: impl FnOnce() -> Option<S>,
) -> Result<Extracted, ExtractError> {
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
    let mut order: Vec<(usize, &ThumbnailSpec)> = settings.thumbnails.iter().enumerate().collect();
    order.sort_by_key(|(i, spec)| (std::cmp::Reverse(spec.size), *i));
    let (&(first, first_spec), smaller) = order.split_first().expect("at least one derivative");
    let largest = thumbnail::fit(base, first_spec.size);
    let (encoded_first, rest) = match spare() {
        Some(slot) => std::thread::scope(|scope| {
            let helper = scope.spawn(|| {
                let encoded = derivative(&largest, first_spec);
                drop(slot);
                encoded
            });
            let rest = derive_rest(&largest, smaller);
            let encoded = helper.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (encoded, rest)
        }),
        None => (derivative(&largest, first_spec), derive_rest(&largest, smaller)),
    };
    let (mut encoded, analysed) = rest?;
    encoded.push((first, encoded_first?));
    encoded.sort_unstable_by_key(|(index, _)| *index);
    let (thumbnails, derivatives): (Vec<ThumbnailOutput>, Vec<Bytes>) =
        encoded.into_iter().map(|(_, derived)| derived).unzip();
    let Analysis { dominant_colors, mean_brightness, phash, blurhash } = analysed;

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

/// What the [`ANALYSIS_EDGE`] copy tells about the image.
struct Analysis {
    dominant_colors: Vec<DominantColor>,
    mean_brightness: f64,
    phash: String,
    blurhash: String,
}

/// A derivative's output (naming it by content address) and its encoded bytes.
type Derived = (ThumbnailOutput, Bytes);

/// `image` encoded as `spec` says.
fn derivative(image: &DynamicImage, spec: &ThumbnailSpec) -> Result<Derived, ExtractError> {
    let thumb = thumbnail::encode(image, spec)?;
    let output = ThumbnailOutput {
        name: spec.name.clone(),
        key: BlobKey::of(&thumb.bytes).to_string(),
        format: thumb.format.to_owned(),
        width: thumb.width,
        height: thumb.height,
        size: thumb.bytes.len() as u64,
    };
    Ok((output, Bytes::from(thumb.bytes)))
}

/// The derivatives of `smaller` (largest first, each with its place in the configuration), each
/// scaled from the one before it starting at `largest`, then the analysis of an
/// [`ANALYSIS_EDGE`] copy scaled from the smallest.
fn derive_rest(
    largest: &DynamicImage,
    smaller: &[(usize, &ThumbnailSpec)],
) -> Result<(Vec<(usize, Derived)>, Analysis), ExtractError> {
    let mut current = Cow::Borrowed(largest);
    let mut encoded = Vec::with_capacity(smaller.len());
    for &(index, spec) in smaller {
        if let Some(scaled) = thumbnail::scaled(&current, spec.size) {
            current = Cow::Owned(scaled);
        }
        encoded.push((index, derivative(&current, spec)?));
    }
    let analysis = thumbnail::scaled(&current, ANALYSIS_EDGE).map_or(current, Cow::Owned);
    let rgba = analysis.to_rgba8();
    let analysed = Analysis {
        dominant_colors: colors::dominant_colors(&rgba, DOMINANT_COLORS),
        mean_brightness: colors::mean_brightness(&rgba),
        phash: phash::to_hex(phash::phash(&analysis)),
        blurhash: blurhash_of(&analysis),
    };
    Ok((encoded, analysed))
}

/// Bytes of the buffers [`extract`] holds at once at its peak for the image in `bytes`, from
/// its header alone: while decoding, the decoded pixels (scaled for a JPEG) and the decoder's
/// scratch; then the decoded image beside its downscaled copy and the resizer's rows; then the
/// copy and its turned copy, and two derivatives' encoders' 8-bit RGBA copies at once (the
/// largest may be encoded beside the others, [`extract_with`]). Fails as [`extract`] would on a
/// header it refuses.
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
    let finishing = 2 * fitted + 2 * 4 * fitted_pixels;
    Ok(decoding.max(fitting).max(finishing))
}

/// Blurhash with 4×3 components (3×4 for portrait images) of a small copy of `image`.
fn blurhash_of(image: &DynamicImage) -> String {
    let small = thumbnail::scaled(image, BLURHASH_EDGE).as_ref().unwrap_or(image).to_rgba8();
    let (x, y) = if small.width() >= small.height() { (4, 3) } else { (3, 4) };
    blurhash::encode(x, y, small.width(), small.height(), small.as_raw())
        .expect("component counts are in 1..=9 and the buffer matches its dimensions")
}
