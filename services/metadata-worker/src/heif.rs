//! HEIC/HEIF and AVIF ("phone formats") through libheif: format sniffing by magic bytes, the
//! primary image's header read and checked against the limits before any pixel is decoded, and
//! decoding to 8-bit RGB(A) with the file's transformations applied.
//!
//! **Orientation.** In HEIF the `irot`/`imir` (and `clap`) properties are authoritative: libheif
//! applies them while decoding, so the pixels [`decode`] returns are upright and [`HeifHeader`]'s
//! `width`/`height` are the displayed ones. An EXIF Orientation tag inside the file must NOT be
//! applied again (encoders such as avifenc keep the camera's tag after turning it into `irot`,
//! and applying both would turn the image twice): [`HeifHeader::upright`] says so to the caller.
//!
//! **Limits.** libheif is told the longest edge the configuration allows before it parses the
//! file, so no image item larger than that (primary, thumbnail, alpha, grid) gets anything
//! allocated; the primary image's displayed size is then checked against `max_pixels`,
//! `max_width` and `max_height`, and the bytes decoding will hold against `max_alloc_bytes`,
//! before any pixel is decoded. libheif reads every metadata item (EXIF, XMP) whole while it
//! parses the file, at the size the item's extents add up to, so those are read first ([`bmff`])
//! and checked: no item may claim more bytes than the file has (extents over the same bytes),
//! no metadata item more than [`MAX_METADATA_BLOCK`], all of them together no more than
//! [`MAX_METADATA_BYTES`]; what they claim counts in [`HeifHeader::scratch_bytes`].
//!
//! **Decoders.** HEVC is decoded by FFmpeg's libavcodec when libheif has its `ffmpeg` decoder
//! plugin (Debian's `libheif-plugin-ffmpegdec`, libheif 1.19 from bookworm-backports, which
//! `scripts/image-libs.sh` installs): about a third of libde265's CPU time, libheif's own first
//! choice. Without the plugin libheif's first decoder is used; [`log_decoders`] says at start
//! which one decodes. A HEIC the FFmpeg decoder fails on is decoded again by libheif's first
//! decoder, so a file either of them reads is read. AV1 is left to libheif's first (dav1d).
//! Grid tiles are decoded on the calling thread, one after the other ([`DECODING_THREADS`]).
//!
//! **Failures.** Every libheif error maps onto [`ExtractError`] with libheif's message: a security
//! limit is [`ExtractError::DecoderLimit`] (`pixel_limit`), anything else about the file is
//! [`ExtractError::Decode`] (`decode_failed`) with format `heic` or `avif`.

use std::ffi::CStr;
use std::sync::OnceLock;

use fast_image_resize::PixelType;
use fast_image_resize::images::ImageRef;
use image::{ColorType, DynamicImage, ImageBuffer};
use imagepipe_codec::heif::{self as libheif, Compression, HeifContext, HeifError, HeifHandle, ProfileType};
use imagepipe_runtime::config::MetadataConfig;

use crate::bmff;
use crate::error::ExtractError;
use crate::thumbnail;

/// Most bytes one metadata item (EXIF, XMP) of a HEIF file may claim. A JPEG's EXIF lives in
/// one APP1 segment, at most 64 KiB; HEIF items have no such bound, and camera EXIF blocks with
/// maker notes stay well under this.
pub const MAX_METADATA_BLOCK: u64 = 1 << 20;

/// Most bytes all metadata items of one HEIF file may claim together.
pub const MAX_METADATA_BYTES: u64 = 4 * MAX_METADATA_BLOCK;

/// The id of the FFmpeg (libavcodec) HEVC decoder among libheif's decoder plugins.
pub const FFMPEG_DECODER: &CStr = c"ffmpeg";

/// Threads of its own libheif decodes a grid's tiles on: none, the calling thread decodes them
/// one after the other. The worker decodes several images at once already (one per blocking
/// thread, `worker.concurrency`), so threads per image add no throughput, only their own cost
/// and a grid's worth of tiles in memory at once: on a 12 MP grid of 48 tiles of 512×512,
/// libheif's default of 4 threads measured no less CPU time per image (docs/performance.md).
pub const DECODING_THREADS: u32 = 0;

/// Item types libheif decodes as images (it reads their data when decoding, not when parsing);
/// every other item is metadata to it.
const IMAGE_ITEMS: [&[u8; 4]; 10] =
    [b"hvc1", b"av01", b"grid", b"iden", b"iovl", b"jpeg", b"unci", b"vvc1", b"j2k1", b"avc1"];

/// Which HEIF flavour a file is, by its brands (or, for the generic `mif1`/`msf1`, by its
/// primary image's coding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeifKind {
    /// HEVC-coded HEIF (what phones write).
    Heic,
    /// AV1-coded HEIF.
    Avif,
}

impl HeifKind {
    /// The wire name: `heic` or `avif`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Heic => "heic",
            Self::Avif => "avif",
        }
    }
}

/// The colour profile a HEIF image carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColorProfile {
    /// An embedded ICC profile (`colr` of type `rICC` or `prof`).
    Icc,
    /// An `nclx` colour description (primaries, transfer, matrix by number; no ICC bytes).
    Nclx,
}

/// What a HEIF file says about its primary image, read without decoding pixels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeifHeader {
    /// The flavour.
    pub kind: HeifKind,
    /// Width as displayed (after `clap`, `irot`, `imir`): the width [`decode`] returns.
    pub width: u32,
    /// Height as displayed.
    pub height: u32,
    /// Width as stored (the `ispe` property, before the transformations).
    pub stored_width: u32,
    /// Height as stored.
    pub stored_height: u32,
    /// An alpha image is attached to the primary image ([`decode`] returns RGBA).
    pub has_alpha: bool,
    /// Bits per sample as coded (8, 10, 12); decoding always yields 8.
    pub bit_depth: u8,
    /// The colour profile, if any.
    pub color_profile: Option<ColorProfile>,
    /// The primary image's EXIF block: the TIFF structure, without the HEIF offset prefix.
    pub exif: Option<Vec<u8>>,
    /// Top-level images in the file (a burst or a collection has several; thumbnails, alpha and
    /// depth maps are not counted).
    pub image_count: u32,
    /// Always `true`: the decoded pixels are upright, the EXIF orientation must not be applied.
    pub upright: bool,
    /// Bytes of the decoded 8-bit RGB(A) image.
    pub pixel_bytes: u64,
    /// Bytes held beside [`pixel_bytes`](Self::pixel_bytes) at the peak of decoding: the
    /// decoder's ([`decoder_scratch`]) and the metadata items' twice (libheif's copy and ours).
    pub scratch_bytes: u64,
}

impl HeifHeader {
    /// Bytes decoding holds at its peak: reserve these in the memory budget.
    pub fn peak_bytes(&self) -> u64 {
        self.pixel_bytes.saturating_add(self.scratch_bytes)
    }
}

/// The HEIF flavour of `bytes` by their magic: an ISO-BMFF `ftyp` box whose major or compatible
/// brands name HEIC or AVIF, or the generic `mif1`/`msf1` brands with an HEVC or AV1 primary
/// image. `None` for anything else, MP4 and QuickTime movies included.
pub fn sniff(bytes: &[u8]) -> Option<HeifKind> {
    const HEIC: [&[u8; 4]; 8] = [b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs"];
    const AVIF: [&[u8; 4]; 2] = [b"avif", b"avis"];
    const GENERIC: [&[u8; 4]; 2] = [b"mif1", b"msf1"];
    let (kind, body) = bmff::boxes(bytes).next()?;
    if &kind != b"ftyp" || body.len() < 8 {
        return None;
    }
    // The major brand first, then the compatible brands in their order.
    let brands = std::iter::once(&body[0..4]).chain(body[8..].chunks_exact(4));
    let mut generic = false;
    for brand in brands {
        if HEIC.iter().any(|b| &b[..] == brand) {
            return Some(HeifKind::Heic);
        }
        if AVIF.iter().any(|b| &b[..] == brand) {
            return Some(HeifKind::Avif);
        }
        generic |= GENERIC.iter().any(|b| &b[..] == brand);
    }
    if generic { primary_coding(bytes) } else { None }
}

/// Reads the primary image's header and checks it against `settings`' limits, as [`decode`]
/// does before it decodes anything.
pub fn header(bytes: &[u8], settings: &MetadataConfig) -> Result<HeifHeader, ExtractError> {
    let kind = sniff(bytes).ok_or(ExtractError::UnsupportedFormat)?;
    let (context, metadata) = read(bytes, kind, settings)?;
    let primary = context.primary().map_err(|e| failed(kind, e))?;
    header_of(kind, &context, &primary, metadata, settings)
}

/// Decodes the primary image of `bytes` within `settings`' limits to 8-bit RGB, or RGBA when it
/// has alpha, upright (see the module's notes on orientation), with its header.
pub fn decode(bytes: &[u8], settings: &MetadataConfig, need: u32) -> Result<(DynamicImage, HeifHeader), ExtractError> {
    let kind = sniff(bytes).ok_or(ExtractError::UnsupportedFormat)?;
    let (context, metadata) = read(bytes, kind, settings)?;
    let primary = context.primary().map_err(|e| failed(kind, e))?;
    let header = header_of(kind, &context, &primary, metadata, settings)?;
    let decoded = decode_primary(kind, &primary, header.has_alpha)?;
    let decode_error = |reason: String| ExtractError::Decode { format: kind.name(), reason };

    let (width, height) = decoded.size();
    if (width, height) != (header.width.into(), header.height.into()) {
        return Err(decode_error(format!(
            "decoded {width}×{height}, but the file says {}×{}",
            header.width, header.height
        )));
    }
    let bits = decoded.bits_per_sample();
    if bits != 8 {
        return Err(decode_error(format!("libheif decoded {bits}-bit samples instead of 8-bit")));
    }
    let channels = if header.has_alpha { 4 } else { 3 };
    let row = header.width as usize * channels;
    let rows = header.height as usize;
    let (plane, stride) =
        decoded.plane(row, rows).ok_or_else(|| decode_error("libheif returned no interleaved plane".into()))?;
    // Downscale early: straight from libheif's plane when its rows are packed, so a 48 MP photo
    // is not copied at full size first.
    let fitted = thumbnail::fitted(header.width, header.height, need);
    let (pixel_type, color) =
        if header.has_alpha { (PixelType::U8x4, ColorType::Rgba8) } else { (PixelType::U8x3, ColorType::Rgb8) };
    if stride == row && !header.has_alpha && fitted != (header.width, header.height) {
        let view = ImageRef::new(header.width, header.height, &plane[..row * rows], pixel_type)
            .map_err(|e| decode_error(format!("libheif's plane: {e}")))?;
        let image = thumbnail::resize(&view, fitted, color).map_err(|e| decode_error(format!("downscaling: {e}")))?;
        return Ok((image, header));
    }
    let mut pixels = Vec::with_capacity(row * rows);
    for y in 0..rows {
        pixels.extend_from_slice(&plane[y * stride..y * stride + row]);
    }
    drop(decoded);
    let image = if header.has_alpha {
        ImageBuffer::from_raw(header.width, header.height, pixels).map(DynamicImage::ImageRgba8)
    } else {
        ImageBuffer::from_raw(header.width, header.height, pixels).map(DynamicImage::ImageRgb8)
    };
    let image = image.ok_or_else(|| decode_error("the decoded plane does not match its size".into()))?;
    Ok((image, header))
}

/// Which decoder HEVC images are decoded with, as [`log_decoders`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HevcDecoder {
    /// libheif's version.
    pub libheif: String,
    /// The decoder asked for by id ([`FFMPEG_DECODER`]), when libheif has it.
    pub chosen: Option<&'static CStr>,
    /// The name of the decoder in use (the chosen one, or libheif's first for HEVC); `None` when
    /// libheif has no HEVC decoder at all.
    pub name: Option<String>,
}

/// The HEVC decoder of this process, looked up in libheif's plugins once.
pub fn hevc_decoder() -> &'static HevcDecoder {
    static DECODER: OnceLock<HevcDecoder> = OnceLock::new();
    DECODER.get_or_init(|| {
        let decoders = libheif::decoders(Compression::Hevc).unwrap_or_else(|error| {
            tracing::warn!(error = %error.message, "libheif did not list its HEVC decoders");
            Vec::new()
        });
        let ffmpeg = FFMPEG_DECODER.to_str().unwrap_or_default();
        let chosen = decoders.iter().find(|d| d.id == ffmpeg);
        HevcDecoder {
            libheif: libheif::version(),
            chosen: chosen.map(|_| FFMPEG_DECODER),
            name: chosen.or(decoders.first()).map(|d| d.name.clone()),
        }
    })
}

/// Logs which decoders HEIC and AVIF are decoded with (at start): FFmpeg's for HEVC when
/// libheif has the plugin; otherwise a warning that HEIC costs several times the CPU.
pub fn log_decoders() {
    let hevc = hevc_decoder();
    let av1 = libheif::decoders(Compression::Av1).ok().and_then(|d| d.into_iter().next()).map(|d| d.name);
    let av1 = av1.as_deref().unwrap_or("none");
    match (&hevc.chosen, &hevc.name) {
        (Some(_), Some(name)) => {
            tracing::info!(libheif = %hevc.libheif, hevc = %name, av1, "HEIC decodes with FFmpeg's HEVC decoder")
        }
        (_, name) => tracing::warn!(
            libheif = %hevc.libheif,
            hevc = name.as_deref().unwrap_or("none"),
            av1,
            "libheif has no FFmpeg HEVC decoder (libheif-plugin-ffmpegdec, libheif 1.19: scripts/image-libs.sh): \
             HEIC decodes with the decoder named here, at about three times the CPU time"
        ),
    }
}

/// Decodes `primary` to 8-bit interleaved RGB(A): a HEIC by the FFmpeg decoder when libheif has
/// it, again by libheif's first decoder when that fails; anything else by libheif's first.
fn decode_primary(kind: HeifKind, primary: &HeifHandle<'_>, alpha: bool) -> Result<libheif::HeifImage, ExtractError> {
    let chosen = if kind == HeifKind::Heic { hevc_decoder().chosen } else { None };
    if let Some(decoder) = chosen {
        match primary.decode_interleaved(alpha, Some(decoder)) {
            Ok(image) => return Ok(image),
            Err(error) if error.is_security_limit() => return Err(failed(kind, error)),
            Err(error) => tracing::debug!(
                error = %error.message,
                "the FFmpeg HEVC decoder failed; decoding again with libheif's first decoder"
            ),
        }
    }
    primary.decode_interleaved(alpha, None).map_err(|e| failed(kind, e))
}

/// Bytes libheif holds beside the decoded 8-bit image while it decodes `pixels` of `bit_depth`
/// (with an alpha plane when `alpha`), in multiples of the coded planes counted as 4:4:4 (the
/// chroma subsampling is not known before decoding): the codec's picture, libheif's copy of it,
/// libheif's RGB image and what the allocator keeps of them. The factors are measured (release
/// build, glibc, 12 and 48 MP): HEVC peaks at 5.9-7 bytes per pixel for 8-bit RGB all included
/// (9 with glibc's heap not yet trimmed), AV1 at 7.7 for 4:2:0 and 13.7 for 4:4:4 (dav1d keeps
/// more than its picture); the factors cover them with a margin of about 15 %.
pub fn decoder_scratch(kind: HeifKind, pixels: u64, bit_depth: u8, alpha: bool) -> u64 {
    let sample = if bit_depth > 8 { 2 } else { 1 };
    let planes = pixels.saturating_mul(if alpha { 4 } else { 3 } * sample);
    match kind {
        HeifKind::Heic => planes.saturating_mul(5) / 2,
        HeifKind::Avif => planes.saturating_mul(9) / 2,
    }
}

/// A context that parsed `bytes` with libheif's image size limit at the configured edges, once
/// [`metadata_claim`] let it; with the bytes the metadata items claim.
fn read<'a>(
    bytes: &'a [u8],
    kind: HeifKind,
    settings: &MetadataConfig,
) -> Result<(HeifContext<'a>, u64), ExtractError> {
    let metadata = metadata_claim(bytes, kind)?;
    // libheif refuses an edge at or above its limit.
    let max_edge = settings.max_width.max(settings.max_height).saturating_add(1);
    let mut context = HeifContext::read(bytes, max_edge).map_err(|e| failed(kind, e))?;
    context.set_decoding_threads(DECODING_THREADS);
    Ok((context, metadata))
}

/// The bytes the metadata items of `bytes` claim together, checked as the module docs say
/// before libheif allocates them.
pub fn metadata_claim(bytes: &[u8], kind: HeifKind) -> Result<u64, ExtractError> {
    let format = kind.name();
    let Some(items) = bmff::items(bytes) else { return Ok(0) };
    let claims = items.claims.clone().map_err(|e| ExtractError::Decode { format, reason: e.to_string() })?;
    let file = bytes.len() as u64;
    let mut metadata = 0u64;
    for (id, claimed) in claims {
        let kind = items.type_of(id);
        let name = kind.map_or_else(|| "untyped".to_owned(), |k| String::from_utf8_lossy(&k).trim().to_owned());
        if claimed > file {
            return Err(ExtractError::Decode {
                format,
                reason: format!(
                    "item {id} ({name}) claims {claimed} bytes, more than the file's {file}: its extents repeat the same bytes"
                ),
            });
        }
        if kind.is_some_and(|k| IMAGE_ITEMS.contains(&&k)) {
            continue;
        }
        if claimed > MAX_METADATA_BLOCK {
            return Err(ExtractError::DecoderLimit {
                format,
                limit: format!(
                    "metadata item {id} ({name}) claims {claimed} bytes, over the {MAX_METADATA_BLOCK} a metadata block may have"
                ),
            });
        }
        metadata += claimed;
        if metadata > MAX_METADATA_BYTES {
            return Err(ExtractError::DecoderLimit {
                format,
                limit: format!(
                    "the metadata items claim over {MAX_METADATA_BYTES} bytes together, the most a file may have"
                ),
            });
        }
    }
    Ok(metadata)
}

fn header_of(
    kind: HeifKind,
    context: &HeifContext<'_>,
    primary: &HeifHandle<'_>,
    metadata: u64,
    settings: &MetadataConfig,
) -> Result<HeifHeader, ExtractError> {
    let format = kind.name();
    let dimension = |v: i64| u32::try_from(v).unwrap_or(0);
    let (width, height) = primary.size();
    let (width, height) = (dimension(width), dimension(height));
    if width == 0 || height == 0 {
        return Err(ExtractError::Empty { format, width, height });
    }
    let (stored_width, stored_height) = primary.stored_size();
    let (stored_width, stored_height) = (dimension(stored_width), dimension(stored_height));
    // A cropped image (`clap`) is decoded at its stored size and cropped afterwards: the limits
    // hold for whichever of the two sizes is larger (heif-enc 1.19 stores an image under 64 px
    // padded to 64 px, x265's smallest, and crops it back).
    let area = |w: u32, h: u32| u64::from(w) * u64::from(h);
    let (check_width, check_height) = if area(stored_width, stored_height) > area(width, height) {
        (stored_width, stored_height)
    } else {
        (width, height)
    };
    if check_width.max(width) > settings.max_width || check_height.max(height) > settings.max_height {
        return Err(ExtractError::DecoderLimit {
            format,
            limit: format!(
                "{check_width}×{check_height} is over the maximum of {}×{}",
                settings.max_width, settings.max_height
            ),
        });
    }
    let pixels = area(check_width, check_height);
    if pixels > settings.max_pixels {
        return Err(ExtractError::TooManyPixels {
            width: check_width,
            height: check_height,
            max_pixels: settings.max_pixels,
        });
    }
    let has_alpha = primary.has_alpha();
    let (luma, chroma) = primary.bits_per_pixel();
    let bit_depth = u8::try_from(luma.max(chroma)).ok().filter(|&b| b > 0).unwrap_or(8);
    let pixel_bytes = area(width, height) * if has_alpha { 4 } else { 3 };
    let scratch_bytes = decoder_scratch(kind, pixels, bit_depth, has_alpha).saturating_add(2 * metadata);
    let peak = pixel_bytes.saturating_add(scratch_bytes);
    if peak > settings.max_alloc_bytes {
        return Err(ExtractError::DecoderLimit {
            format,
            limit: format!("decoding needs {peak} bytes, over the maximum of {}", settings.max_alloc_bytes),
        });
    }
    let exif = match primary.metadata(c"Exif", MAX_METADATA_BLOCK as usize) {
        Ok(blocks) => blocks.iter().find_map(|block| exif_tiff(block)),
        Err(error) => {
            tracing::warn!(format, error = %error.message, "unreadable EXIF block; reported as absent");
            None
        }
    };
    Ok(HeifHeader {
        kind,
        width,
        height,
        stored_width,
        stored_height,
        has_alpha,
        bit_depth,
        color_profile: primary.profile().map(|p| match p {
            ProfileType::Icc => ColorProfile::Icc,
            ProfileType::Nclx => ColorProfile::Nclx,
        }),
        exif,
        image_count: context.top_level_images().max(1),
        upright: true,
        pixel_bytes,
        scratch_bytes,
    })
}

/// The TIFF structure of a HEIF `Exif` item: the item starts with a 32-bit big-endian offset
/// from the end of that field to the TIFF header (usually 0, or 6 to skip an `Exif\0\0` marker).
/// Writers that forget to count their `Exif\0\0` marker are forgiven; anything else that does not
/// lead to a TIFF header is ignored.
pub fn exif_tiff(item: &[u8]) -> Option<Vec<u8>> {
    const MARKER: &[u8] = b"Exif\0\0";
    let is_tiff = |b: &[u8]| b.starts_with(b"II*\0") || b.starts_with(b"MM\0*");
    let offset = u32::from_be_bytes(item.get(..4)?.try_into().ok()?);
    let rest = item.get(4..)?;
    let mut tiff = rest.get(usize::try_from(offset).ok()?..)?;
    if tiff.starts_with(MARKER) {
        tiff = &tiff[MARKER.len()..];
    }
    if is_tiff(tiff) {
        return Some(tiff.to_vec());
    }
    tracing::warn!(offset, len = item.len(), "HEIF EXIF item does not lead to a TIFF header; reported as absent");
    None
}

fn failed(kind: HeifKind, error: HeifError) -> ExtractError {
    if error.is_security_limit() {
        ExtractError::DecoderLimit { format: kind.name(), limit: error.message }
    } else {
        ExtractError::Decode { format: kind.name(), reason: error.message }
    }
}

/// For the generic brands: `Heic` or `Avif` by the coding of the primary item (`hvc1`, `av01`),
/// or of any coded item when the primary is derived (a `grid`).
fn primary_coding(bytes: &[u8]) -> Option<HeifKind> {
    let items = bmff::items(bytes)?;
    let coding = |kind: &[u8; 4]| match kind {
        b"hvc1" => Some(HeifKind::Heic),
        b"av01" => Some(HeifKind::Avif),
        _ => None,
    };
    let primary = items.primary.and_then(|id| items.type_of(id)).and_then(|kind| coding(&kind));
    primary.or_else(|| items.types.iter().find_map(|(_, kind)| coding(kind)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ftyp(major: &[u8; 4], compatible: &[&[u8; 4]]) -> Vec<u8> {
        let mut body = major.to_vec();
        body.extend_from_slice(&0u32.to_be_bytes());
        for brand in compatible {
            body.extend_from_slice(&brand[..]);
        }
        boxed(b"ftyp", &body)
    }

    fn boxed(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut b = u32::try_from(body.len() + 8).unwrap().to_be_bytes().to_vec();
        b.extend_from_slice(kind);
        b.extend_from_slice(body);
        b
    }

    /// A `meta` box with a primary item `primary` and items of the given types (ids from 1).
    fn meta(primary: u16, items: &[&[u8; 4]]) -> Vec<u8> {
        let pitm = boxed(b"pitm", &[&[0, 0, 0, 0][..], &primary.to_be_bytes()].concat());
        let mut iinf = vec![0, 0, 0, 0];
        iinf.extend_from_slice(&u16::try_from(items.len()).unwrap().to_be_bytes());
        for (i, kind) in items.iter().enumerate() {
            let id = u16::try_from(i + 1).unwrap();
            let body = [&[2, 0, 0, 0][..], &id.to_be_bytes(), &[0, 0], &kind[..], b"\0"].concat();
            iinf.extend(boxed(b"infe", &body));
        }
        boxed(b"meta", &[&[0, 0, 0, 0][..], &pitm, &boxed(b"iinf", &iinf)].concat())
    }

    #[test]
    fn brands_name_the_flavour() {
        assert_eq!(sniff(&ftyp(b"heic", &[b"mif1", b"heic"])), Some(HeifKind::Heic));
        assert_eq!(sniff(&ftyp(b"mif1", &[b"heix"])), Some(HeifKind::Heic));
        assert_eq!(sniff(&ftyp(b"avif", &[b"avif", b"mif1", b"miaf"])), Some(HeifKind::Avif));
        assert_eq!(sniff(&ftyp(b"avis", &[b"msf1"])), Some(HeifKind::Avif));
        assert_eq!(HeifKind::Heic.name(), "heic");
        assert_eq!(HeifKind::Avif.name(), "avif");
    }

    #[test]
    fn movies_are_not_heif() {
        assert_eq!(sniff(&ftyp(b"isom", &[b"isom", b"iso2", b"avc1", b"mp41"])), None);
        assert_eq!(sniff(&ftyp(b"qt  ", &[b"qt  "])), None);
        assert_eq!(sniff(&ftyp(b"mp42", &[b"mp42", b"isom"])), None);
        assert_eq!(sniff(b"\xFF\xD8\xFF\xE0 not a box"), None);
        assert_eq!(sniff(b""), None);
        assert_eq!(sniff(&boxed(b"ftyp", b"hei")), None, "too short for a major brand");
    }

    #[test]
    fn generic_brands_look_at_the_primary_item() {
        let file = |items: &[&[u8; 4]], primary| [ftyp(b"mif1", &[b"mif1", b"miaf"]), meta(primary, items)].concat();
        assert_eq!(sniff(&file(&[b"Exif", b"hvc1"], 2)), Some(HeifKind::Heic));
        assert_eq!(sniff(&file(&[b"av01"], 1)), Some(HeifKind::Avif));
        assert_eq!(sniff(&file(&[b"grid", b"av01", b"av01"], 1)), Some(HeifKind::Avif), "a grid of AV1 tiles");
        assert_eq!(sniff(&file(&[b"jpeg"], 1)), None, "JPEG-coded HEIF is not decoded");
        assert_eq!(sniff(&ftyp(b"mif1", &[])), None, "no meta box");
    }

    #[test]
    fn the_exif_offset_is_honoured() {
        let tiff = b"MM\0*\0\0\0\x08rest".to_vec();
        let item = |offset: u32, prefix: &[u8]| [&offset.to_be_bytes()[..], prefix, &tiff].concat();
        assert_eq!(exif_tiff(&item(0, b"")), Some(tiff.clone()));
        assert_eq!(exif_tiff(&item(6, b"Exif\0\0")), Some(tiff.clone()));
        assert_eq!(exif_tiff(&item(0, b"Exif\0\0")), Some(tiff.clone()), "an uncounted marker is forgiven");
        assert_eq!(exif_tiff(&item(3, b"abc")), Some(tiff.clone()));
        assert_eq!(exif_tiff(&item(2, b"abc")), None, "an offset that misses the header");
        assert_eq!(exif_tiff(&item(4000, b"")), None, "an offset past the end");
        assert_eq!(exif_tiff(&[0, 0]), None);
        let little = [&[0, 0, 0, 0][..], b"II*\0\x08\0\0\0"].concat();
        assert_eq!(exif_tiff(&little), Some(b"II*\0\x08\0\0\0".to_vec()));
    }

    #[test]
    fn scratch_counts_the_coded_planes_as_four_four_four() {
        assert_eq!(decoder_scratch(HeifKind::Heic, 100, 8, false), 750);
        assert_eq!(decoder_scratch(HeifKind::Heic, 100, 10, false), 1500);
        assert_eq!(decoder_scratch(HeifKind::Heic, 100, 8, true), 1000);
        assert_eq!(decoder_scratch(HeifKind::Avif, 100, 8, false), 1350);
        assert!(decoder_scratch(HeifKind::Avif, u64::MAX, 12, true) > u64::MAX / 3, "saturates");
    }
}
