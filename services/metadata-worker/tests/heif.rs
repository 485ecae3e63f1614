//! HEIC and AVIF through `heif`: fixtures made at test time by the real encoders, `heif-enc`
//! (libheif-examples) and `avifenc` (libavif-bin), which `scripts/image-libs.sh` installs.

mod support;

use std::path::Path;
use std::process::Command;

use image::{DynamicImage, GenericImageView, RgbImage, imageops};
use imagepipe_codec::heif::HeifContext;
use imagepipe_metadata_worker::error::codes;
use imagepipe_metadata_worker::heif::{self, ColorProfile, HeifKind};
use imagepipe_metadata_worker::{ExtractError, exif as exif_fields};
use imagepipe_runtime::config::MetadataConfig;
use support::*;

/// Runs `tool` with `args` in a fresh directory holding `input` as `input_name`, and returns the
/// bytes it wrote to `output_name`.
fn encode(tool: &str, input_name: &str, input: &[u8], args: &[&str], output_name: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join(input_name), input).expect("writing the encoder's input");
    run_in(dir.path(), tool, args, output_name)
}

/// Runs `tool` with `args` in `dir`, and returns the bytes it wrote to `output_name` there.
fn run_in(dir: &Path, tool: &str, args: &[&str], output_name: &str) -> Vec<u8> {
    let output = match Command::new(tool).current_dir(dir).args(args).output() {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => panic!(
            "`{tool}` is not installed: run `source scripts/image-libs.sh && ensure_image_tools` \
             (Debian: libheif-examples for heif-enc, libavif-bin for avifenc)"
        ),
        Err(error) => panic!("running {tool}: {error}"),
    };
    assert!(
        output.status.success(),
        "{tool} {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    read(&dir.join(output_name))
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A HEIC of a JPEG, by heif-enc (x265) at quality 90.
fn heic_of_jpeg(jpeg: &[u8]) -> Vec<u8> {
    encode("heif-enc", "in.jpg", jpeg, &["-q", "90", "-o", "out.heic", "in.jpg"], "out.heic")
}

/// An AVIF of a JPEG or PNG (`ext`), by avifenc (aom) at its fastest speed, quantizer 8-16 of 63,
/// and `extra` options.
fn avif_of(ext: &str, input: &[u8], extra: &[&str]) -> Vec<u8> {
    let name = format!("in.{ext}");
    let mut args = vec!["-s", "10", "--min", "8", "--max", "16"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[&name, "out.avif"]);
    encode("avifenc", &name, input, &args, "out.avif")
}

/// The edge of a grid tile, as phones write them.
const TILE: u32 = 512;

/// A HEIC of `source` shaped as phones write photos: a grid of [`TILE`]-pixel HEVC tiles (8×6 for
/// 4032×3024), the last column and row cropped to the image's size, by heif-enc's tiled input
/// (libheif 1.19) from PNG tiles, x265 at its fastest preset.
fn grid_heic_of(source: &RgbImage) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (width, height) = source.dimensions();
    for row in 0..height.div_ceil(TILE) {
        for column in 0..width.div_ceil(TILE) {
            // Tiles past the edge repeat its last pixels (the grid crops them away).
            let tile = RgbImage::from_fn(TILE, TILE, |x, y| {
                *source.get_pixel((column * TILE + x).min(width - 1), (row * TILE + y).min(height - 1))
            });
            tile.save(dir.path().join(format!("tile-{row:02}-{column:02}.png"))).expect("writing a tile");
        }
    }
    let (width, height) = (width.to_string(), height.to_string());
    let args = [
        "-q",
        "80",
        "-p",
        "preset=ultrafast",
        "-T",
        "--tiled-image-width",
        &width,
        "--tiled-image-height",
        &height,
        "-o",
        "out.heic",
        "tile-00-00.png",
    ];
    run_in(dir.path(), "heif-enc", &args, "out.heic")
}

/// The primary image of `heif` decoded by the libheif decoder `decoder` (by id), as 8-bit RGB.
fn decoded_by(heif: &[u8], decoder: &'static std::ffi::CStr) -> RgbImage {
    let context = HeifContext::read(heif, 65_536).expect("libheif reads the file");
    let primary = context.primary().expect("a primary image");
    let image = primary.decode_interleaved(false, Some(decoder)).expect("the decoder decodes it");
    let (width, height) = primary.size();
    let (width, height) = (u32::try_from(width).unwrap(), u32::try_from(height).unwrap());
    let row = width as usize * 3;
    let (plane, stride) = image.plane(row, height as usize).expect("an interleaved plane");
    let pixels = (0..height as usize).flat_map(|y| plane[y * stride..y * stride + row].iter().copied()).collect();
    RgbImage::from_raw(width, height, pixels).expect("a whole image")
}

/// The largest difference of a sample of two RGB images of the same size.
fn max_difference(a: &RgbImage, b: &RgbImage) -> u8 {
    assert_eq!(a.dimensions(), b.dimensions());
    a.as_raw().iter().zip(b.as_raw()).map(|(&x, &y)| x.abs_diff(y)).max().unwrap_or(0)
}

fn settings() -> MetadataConfig {
    MetadataConfig::default()
}

fn decode(bytes: &[u8]) -> (DynamicImage, heif::HeifHeader) {
    heif::decode(bytes, &settings(), u32::MAX).unwrap_or_else(|e| panic!("the fixture decodes: {e}"))
}

fn failure(bytes: &[u8], settings: &MetadataConfig) -> ExtractError {
    let header = heif::header(bytes, settings).err();
    let error = match heif::decode(bytes, settings, u32::MAX) {
        Ok((image, header)) => panic!("the fixture must fail, but decoded {:?}: {header:?}", image.dimensions()),
        Err(error) => error,
    };
    if let Some(header) = header {
        assert_eq!(header.code(), error.code(), "header and decode fail alike");
    }
    error
}

/// Mean absolute difference per sample of two RGB images of the same size.
fn mean_difference(a: &RgbImage, b: &RgbImage) -> f64 {
    assert_eq!(a.dimensions(), b.dimensions());
    let sum: u64 = a.as_raw().iter().zip(b.as_raw()).map(|(&x, &y)| u64::from(x.abs_diff(y))).sum();
    sum as f64 / a.as_raw().len() as f64
}

fn exif_of(header: &heif::HeifHeader) -> imagepipe_contracts::step::Exif {
    let raw = header.exif.clone().expect("the HEIF carries an EXIF block");
    exif_fields::parse(raw).expect("the EXIF block parses").expect("the EXIF block has fields")
}

#[test]
fn a_heic_decodes_to_its_size_and_colours() {
    let source = scene(320, 240);
    let heic = heic_of_jpeg(&jpeg(&source, None, None));
    assert_eq!(heif::sniff(&heic), Some(HeifKind::Heic));

    let (image, header) = decode(&heic);
    assert_eq!((image.width(), image.height()), (320, 240));
    assert!(matches!(image, DynamicImage::ImageRgb8(_)), "8-bit RGB without alpha");
    assert_eq!((header.kind, header.width, header.height), (HeifKind::Heic, 320, 240));
    assert_eq!((header.stored_width, header.stored_height), (320, 240));
    assert_eq!((header.has_alpha, header.bit_depth, header.image_count), (false, 8, 1));
    assert!(header.upright);
    assert_eq!(header.exif, None);
    assert_eq!(header.pixel_bytes, 320 * 240 * 3);
    assert!(header.peak_bytes() > header.pixel_bytes);
    let difference = mean_difference(&image.to_rgb8(), &source);
    assert!(difference < 6.0, "the HEIC looks like its source: mean difference {difference}");
    // The disc is yellow, the background blue.
    let disc = image.get_pixel(96, 96);
    assert!(disc[0] > 200 && disc[1] > 180 && disc[2] < 100, "{disc:?}");
    assert_eq!(heif::header(&heic, &settings()).expect("the header reads"), header);

    // Asked for less, it is downscaled straight from libheif's plane, the same picture.
    let (small, _) = heif::decode(&heic, &settings(), 160).expect("a downscaled decode");
    assert_eq!((small.width(), small.height()), (160, 120));
    let disc = small.get_pixel(48, 48);
    assert!(disc[0] > 200 && disc[1] > 180 && disc[2] < 100, "{disc:?}");
}

#[test]
fn an_avif_decodes_to_its_size_and_colours_with_alpha() {
    let source = scene(200, 100);
    let avif = avif_of("jpg", &jpeg(&source, None, None), &[]);
    assert_eq!(heif::sniff(&avif), Some(HeifKind::Avif));
    let (image, header) = decode(&avif);
    assert_eq!((header.kind, image.width(), image.height()), (HeifKind::Avif, 200, 100));
    assert_eq!(header.color_profile, Some(ColorProfile::Nclx), "avifenc writes an nclx colour description");
    let difference = mean_difference(&image.to_rgb8(), &source);
    assert!(difference < 6.0, "the AVIF looks like its source: mean difference {difference}");

    // Red on the left half, transparent on the right.
    let avif = avif_of("png", &png_with_alpha(64, 32), &[]);
    let (image, header) = decode(&avif);
    assert!(header.has_alpha);
    let DynamicImage::ImageRgba8(rgba) = image else { panic!("RGBA for an image with alpha") };
    let (left, right) = (rgba.get_pixel(8, 16), rgba.get_pixel(56, 16));
    assert!(left[3] > 250 && left[0] > 190 && left[1] < 60, "{left:?}");
    assert!(right[3] < 5, "{right:?}");
}

#[test]
fn a_ten_bit_avif_decodes_to_eight_bits() {
    let source = scene(96, 64);
    let avif = avif_of("jpg", &jpeg(&source, None, None), &["-d", "10"]);
    let (image, header) = decode(&avif);
    assert_eq!(header.bit_depth, 10);
    assert!(matches!(image, DynamicImage::ImageRgb8(_)));
    let difference = mean_difference(&image.to_rgb8(), &source);
    assert!(difference < 6.0, "mean difference {difference}");
}

/// heif-enc (1.19) copies the JPEG's EXIF block verbatim (its 4-byte offset prefix is 0) and, like
/// avifenc, turns its orientation into `irot`/`imir`, the EXIF still saying 6: the decoded pixels
/// are upright, and applying the EXIF orientation again would turn them twice. (At least 64 px
/// each way: x265 pads a smaller image to 64 px, and heif-enc crops it back with `clap`.)
#[test]
fn a_heic_carries_the_exif_of_its_jpeg() {
    let source = scene(128, 64);
    let heic = heic_of_jpeg(&jpeg(&source, Some(camera_exif(6)), None));
    let (image, header) = decode(&heic);
    let exif = exif_of(&header);
    assert_eq!(exif.make.as_deref(), Some("Imagepipe Optics"));
    assert_eq!(exif.model.as_deref(), Some("IP-1 Mark II"));
    assert_eq!(exif.orientation, Some(6));
    assert!(exif.gps_latitude.is_some());
    assert_eq!((header.width, header.height, header.stored_width, header.stored_height), (64, 128, 128, 64));
    assert_eq!((image.width(), image.height()), (64, 128), "turned by irot");
    assert!(header.upright, "the EXIF orientation is not to be applied to HEIF pixels");
    let difference = mean_difference(&image.to_rgb8(), &imageops::rotate90(&source));
    assert!(difference < 8.0, "turned 90° clockwise as orientation 6 says: mean difference {difference}");
}

/// avifenc turns the JPEG's EXIF orientation into `irot`/`imir` and keeps the EXIF block as it
/// was (still saying 6): the decoded pixels are upright, and applying the EXIF orientation again
/// would turn them twice.
#[test]
fn an_avif_with_an_exif_orientation_comes_out_upright() {
    let source = scene(64, 32);
    let avif = avif_of("jpg", &jpeg(&source, Some(camera_exif(6)), None), &[]);
    let (image, header) = decode(&avif);
    assert_eq!((header.width, header.height), (32, 64), "displayed size, turned by irot");
    assert_eq!((header.stored_width, header.stored_height), (64, 32));
    assert_eq!(exif_of(&header).orientation, Some(6), "avifenc keeps the EXIF tag");
    assert!(header.upright);
    let upright = imageops::rotate90(&source);
    let difference = mean_difference(&image.to_rgb8(), &upright);
    assert!(difference < 8.0, "turned 90° clockwise as orientation 6 says: mean difference {difference}");
}

#[test]
fn irot_and_imir_of_avifenc_are_applied() {
    let source = scene(64, 32);
    let input = jpeg(&source, None, None);
    // irot 1: 90° anticlockwise.
    let (image, _) = decode(&avif_of("jpg", &input, &["--irot", "1"]));
    let difference = mean_difference(&image.to_rgb8(), &imageops::rotate270(&source));
    assert!(difference < 8.0, "mean difference {difference}");
    // imir 1: mirrored left to right (libavif 0.11's axis 1).
    let (image, _) = decode(&avif_of("jpg", &input, &["--imir", "1"]));
    let difference = mean_difference(&image.to_rgb8(), &imageops::flip_horizontal(&source));
    assert!(difference < 8.0, "mean difference {difference}");
}

/// heif-enc writes `irot` only for an EXIF orientation (and heif-enc 1.15 never), so this HEIC
/// case is its output with an `irot` property added to the primary image (see [`with_irot`]):
/// the same transform path as AVIF, on HEVC.
#[test]
fn a_heic_with_irot_comes_out_upright() {
    let source = scene(128, 64);
    let heic = with_irot(&heic_of_jpeg(&jpeg(&source, None, None)), 3);
    let (image, header) = decode(&heic);
    assert_eq!((header.width, header.height, header.stored_width, header.stored_height), (64, 128, 128, 64));
    // irot 3: 270° anticlockwise, i.e. 90° clockwise.
    let difference = mean_difference(&image.to_rgb8(), &imageops::rotate90(&source));
    assert!(difference < 8.0, "mean difference {difference}");
}

/// What the container and the decoder can notice fails as `decode_failed`: a truncated file, a
/// broken box, broken parameter sets (`hvcC`), a broken NAL unit length. HEVC slice data has no
/// checksum and libde265 conceals errors in it, so bytes flipped inside it decode to a damaged
/// image of the declared size; every flip anywhere in the file is one or the other, never a
/// panic or a crash.
#[test]
fn a_corrupt_heic_is_decode_failed() {
    let heic = heic_of_jpeg(&jpeg(&scene(320, 240), None, None));
    let flipped = |range: std::ops::Range<usize>| {
        let mut bytes = heic.clone();
        bytes[range].iter_mut().for_each(|b| *b = !*b);
        bytes
    };
    let decode_failed = |bytes: &[u8], what: &str| {
        let error = failure(bytes, &settings());
        assert_eq!(error.code(), codes::DECODE_FAILED, "{what}: {error}");
        assert!(matches!(error, ExtractError::Decode { format: "heic", .. }), "{what}: {error:?}");
    };
    for cut in [heic.len() / 2, heic.len() - 100, 200, 40] {
        decode_failed(&heic[..cut], &format!("cut at {cut}"));
    }
    let hvcc = heic.windows(4).position(|w| w == b"hvcC").expect("heif-enc writes an hvcC property") - 4;
    let hvcc_end = hvcc + u32::from_be_bytes(heic[hvcc..hvcc + 4].try_into().unwrap()) as usize;
    decode_failed(&flipped(hvcc + 8 + 23..hvcc_end), "flipped parameter sets");
    let mdat = heic.windows(4).position(|w| w == b"mdat").expect("heif-enc writes an mdat box") + 4;
    decode_failed(&flipped(mdat..mdat + 4), "flipped NAL unit length");
    decode_failed(&flipped(100..140), "flipped boxes in meta");

    // The middle of the slice data: concealed by the decoder.
    let middle = heic.len() / 2;
    let (image, header) = decode(&flipped(middle..middle + 64));
    assert_eq!((image.width(), image.height(), header.width), (320, 240, 320));
    // Anywhere: an error or an image of the declared size.
    for at in (0..heic.len() - 16).step_by(48) {
        match heif::decode(&flipped(at..at + 16), &settings(), u32::MAX) {
            Ok((image, header)) => assert_eq!((image.width(), image.height()), (header.width, header.height)),
            Err(error) => assert!(
                [codes::DECODE_FAILED, codes::UNSUPPORTED_FORMAT, codes::PIXEL_LIMIT].contains(&error.code()),
                "flipped at {at}: {error}"
            ),
        }
    }
}

/// libheif decodes HEVC by FFmpeg's decoder where it has the plugin (`scripts/image-libs.sh`
/// installs it), and the pixels are libde265's (both decoders are conformant, so they agree
/// sample for sample).
#[test]
fn a_heic_decodes_by_ffmpeg_to_libde265s_pixels() {
    let decoder = heif::hevc_decoder();
    assert_eq!(
        decoder.chosen,
        Some(heif::FFMPEG_DECODER),
        "libheif {} has no FFmpeg HEVC decoder (only {:?}): run scripts/image-libs.sh \
         (libheif-plugin-ffmpegdec, libheif 1.19)",
        decoder.libheif,
        decoder.name
    );
    let heic = heic_of_jpeg(&jpeg(&scene(640, 480), None, None));
    let (image, _) = decode(&heic);
    let reference = decoded_by(&heic, c"libde265");
    let (mean, max) = (mean_difference(&image.to_rgb8(), &reference), max_difference(&image.to_rgb8(), &reference));
    assert!(mean < 0.5 && max <= 4, "FFmpeg against libde265: mean difference {mean}, largest {max}");
}

/// A phone-shaped HEIC, 4032×3024 as a grid of 48 tiles of 512×512 (the last column and row
/// cropped): the whole picture, each tile in its place, upright under `irot`, at full size and
/// at the derivative's size.
#[test]
fn a_phone_shaped_grid_heic_decodes_whole() {
    let source = scene(4032, 3024);
    let grid = grid_heic_of(&source);
    assert_eq!(heif::sniff(&grid), Some(HeifKind::Heic));
    let items = imagepipe_metadata_worker::bmff::items(&grid).expect("the file has items");
    let count = |kind: &[u8; 4]| items.types.iter().filter(|(_, k)| k == kind).count();
    assert_eq!((count(b"grid"), count(b"hvc1")), (1, 48), "one grid of 8×6 HEVC tiles");
    let primary = items.primary.and_then(|id| items.type_of(id));
    assert_eq!(primary, Some(*b"grid"), "the grid is the primary image");

    let (image, header) = decode(&grid);
    assert_eq!((header.width, header.height, header.stored_width, header.stored_height), (4032, 3024, 4032, 3024));
    assert_eq!((header.bit_depth, header.image_count, header.has_alpha), (8, 1, false));
    assert_eq!((image.width(), image.height()), (4032, 3024));
    let image = image.to_rgb8();
    let difference = mean_difference(&image, &source);
    assert!(difference < 6.0, "every tile in its place: mean difference {difference}");
    let reference = decoded_by(&grid, c"libde265");
    let (mean, max) = (mean_difference(&image, &reference), max_difference(&image, &reference));
    assert!(mean < 0.5 && max <= 4, "FFmpeg against libde265: mean difference {mean}, largest {max}");

    // At the preview's size, as the metadata stage asks for it, and turned by `irot` 3 (90°
    // clockwise), as a phone held upright writes it.
    let (small, _) = heif::decode(&grid, &settings(), 1440).expect("a downscaled decode");
    assert_eq!((small.width(), small.height()), (1440, 1080));
    let expected = imageops::resize(&source, 1440, 1080, imageops::FilterType::Triangle);
    let difference = mean_difference(&small.to_rgb8(), &expected);
    assert!(difference < 6.0, "downscaled: mean difference {difference}");
    let (turned, header) = heif::decode(&with_irot(&grid, 3), &settings(), 1440).expect("a turned grid decodes");
    assert_eq!((header.width, header.height, header.stored_width, header.stored_height), (3024, 4032, 4032, 3024));
    assert_eq!((turned.width(), turned.height()), (1080, 1440));
    let difference = mean_difference(&turned.to_rgb8(), &imageops::rotate90(&expected));
    assert!(difference < 6.0, "turned 90° clockwise: mean difference {difference}");
}

#[test]
fn a_heic_over_the_pixel_limit_fails_before_decoding() {
    let heic = heic_of_jpeg(&jpeg(&scene(128, 64), None, None));
    let tight = MetadataConfig { max_pixels: 8_000, ..settings() };
    let error = failure(&heic, &tight);
    assert!(matches!(error, ExtractError::TooManyPixels { width: 128, height: 64, .. }), "{error:?}");
    assert_eq!(error.code(), codes::PIXEL_LIMIT);

    // The coded image zeroed: still `pixel_limit`, so nothing was decoded.
    let mdat = heic.windows(4).position(|w| w == b"mdat").expect("heif-enc writes an mdat box");
    let mut hollow = heic.clone();
    hollow[mdat + 4..].fill(0);
    assert_eq!(failure(&hollow, &tight).code(), codes::PIXEL_LIMIT);
    assert_eq!(failure(&hollow, &settings()).code(), codes::DECODE_FAILED);

    // A file claiming 70000×70000, over the longest edge allowed (65535): refused by libheif's
    // own size limit while it parses the file.
    let bomb = with_ispe(&heic, 70_000, 70_000);
    let error = failure(&bomb, &settings());
    assert!(
        matches!(&error, ExtractError::DecoderLimit { format: "heic", limit } if limit.contains("70000")),
        "{error:?}"
    );
    assert_eq!(error.code(), codes::PIXEL_LIMIT);
    // Within libheif's limit, over the pixel count.
    let error = failure(&with_ispe(&heic, 20_000, 20_000), &settings());
    assert!(matches!(error, ExtractError::TooManyPixels { width: 20_000, height: 20_000, .. }), "{error:?}");
    // Over the configured width alone.
    let narrow = MetadataConfig { max_width: 50, ..settings() };
    assert_eq!(failure(&heic, &narrow).code(), codes::PIXEL_LIMIT);
    // Decoding would need more than max_alloc_bytes.
    let stingy = MetadataConfig { max_alloc_bytes: 10_000, ..settings() };
    assert_eq!(failure(&heic, &stingy).code(), codes::PIXEL_LIMIT);
}

#[test]
fn sniffing_real_files() {
    let jpeg = jpeg(&scene(32, 32), None, None);
    assert_eq!(heif::sniff(&heic_of_jpeg(&jpeg)), Some(HeifKind::Heic));
    assert_eq!(heif::sniff(&avif_of("jpg", &jpeg, &[])), Some(HeifKind::Avif));
    assert_eq!(heif::sniff(&jpeg), None);
    let error = heif::decode(&jpeg, &settings(), u32::MAX).unwrap_err();
    assert_eq!(error.code(), codes::UNSUPPORTED_FORMAT);
    // An MP4 and a QuickTime movie start with ftyp boxes too.
    let mp4 = [&[0, 0, 0, 0x20][..], b"ftypisom\0\0\x02\0isomiso2avc1mp41"].concat();
    let mov = [&[0, 0, 0, 0x14][..], b"ftypqt  \0\0\x02\0qt  "].concat();
    assert_eq!(heif::sniff(&mp4), None);
    assert_eq!(heif::sniff(&mov), None);
}

// --- ISO-BMFF surgery on heif-enc's output ---

/// A box of `bytes`: (start, end, body start).
#[derive(Clone, Copy, Debug)]
struct BoxAt {
    start: usize,
    end: usize,
    body: usize,
}

/// The child boxes of `bytes[from..to]` by type (plain 32-bit sizes, as heif-enc writes).
fn children(bytes: &[u8], from: usize, to: usize) -> Vec<([u8; 4], BoxAt)> {
    let mut found = Vec::new();
    let mut pos = from;
    while pos + 8 <= to {
        let size = u32::from_be_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        assert!(size >= 8 && pos + size <= to, "a plain box at {pos}");
        found.push((bytes[pos + 4..pos + 8].try_into().unwrap(), BoxAt { start: pos, end: pos + size, body: pos + 8 }));
        pos += size;
    }
    found
}

fn child(boxes: &[([u8; 4], BoxAt)], kind: &[u8; 4]) -> BoxAt {
    boxes.iter().find(|(k, _)| k == kind).unwrap_or_else(|| panic!("no {} box", String::from_utf8_lossy(kind))).1
}

fn add_to_size(bytes: &mut [u8], at: BoxAt, delta: usize) {
    let size = u32::from_be_bytes(bytes[at.start..at.start + 4].try_into().unwrap()) + delta as u32;
    bytes[at.start..at.start + 4].copy_from_slice(&size.to_be_bytes());
}

/// `heic` with an `irot` property of `angle` × 90° anticlockwise added to its primary image:
/// the property appended to `ipco`, associated in `ipma`, the sizes of `ipco`, `ipma`, `iprp`
/// and `meta` grown, and the file offsets in `iloc` moved past the inserted bytes.
fn with_irot(heic: &[u8], angle: u8) -> Vec<u8> {
    let mut bytes = heic.to_vec();
    let top = children(&bytes, 0, bytes.len());
    let meta = child(&top, b"meta");
    let inside = children(&bytes, meta.body + 4, meta.end);
    let pitm = child(&inside, b"pitm");
    assert_eq!(bytes[pitm.body], 0, "pitm version 0");
    let primary = u16::from_be_bytes([bytes[pitm.body + 4], bytes[pitm.body + 5]]);
    let iprp = child(&inside, b"iprp");
    let props = children(&bytes, iprp.body, iprp.end);
    let (ipco, ipma) = (child(&props, b"ipco"), child(&props, b"ipma"));
    assert!(ipco.end <= ipma.start, "ipco before ipma");
    let irot_index = children(&bytes, ipco.body, ipco.end).len() + 1;
    assert!(irot_index < 128);

    // The primary image's ipma entry: version 0 (16-bit ids), flags 0 (8-bit associations).
    assert_eq!(&bytes[ipma.body..ipma.body + 4], &[0, 0, 0, 0], "ipma version 0, flags 0");
    let entries = u32::from_be_bytes(bytes[ipma.body + 4..ipma.body + 8].try_into().unwrap());
    let mut pos = ipma.body + 8;
    let mut insert_association = None;
    for _ in 0..entries {
        let item = u16::from_be_bytes([bytes[pos], bytes[pos + 1]]);
        let count = usize::from(bytes[pos + 2]);
        if item == primary {
            bytes[pos + 2] += 1;
            insert_association = Some(pos + 3 + count);
        }
        pos += 3 + count;
    }
    let insert_association = insert_association.expect("the primary image has properties");
    let irot = [&[0, 0, 0, 9][..], b"irot", &[angle]].concat();
    let delta = irot.len() + 1;

    // iloc: every file offset past the insertion moves by `delta`.
    let iloc = child(&inside, b"iloc");
    let version = bytes[iloc.body];
    assert!(version < 2, "iloc version 0 or 1");
    let sizes = [bytes[iloc.body + 4] >> 4, bytes[iloc.body + 4] & 15, bytes[iloc.body + 5] >> 4];
    let (offset_size, length_size, base_size) = (sizes[0] as usize, sizes[1] as usize, sizes[2] as usize);
    let index_size = if version == 1 { (bytes[iloc.body + 5] & 15) as usize } else { 0 };
    let items = u16::from_be_bytes([bytes[iloc.body + 6], bytes[iloc.body + 7]]);
    let mut pos = iloc.body + 8;
    let shift = |bytes: &mut [u8], at: usize, size: usize| {
        if size == 0 {
            return;
        }
        let mut value = 0u64;
        for &b in &bytes[at..at + size] {
            value = value << 8 | u64::from(b);
        }
        if value as usize >= ipco.end {
            value += delta as u64;
            for i in (0..size).rev() {
                bytes[at + i] = value as u8;
                value >>= 8;
            }
        }
    };
    for _ in 0..items {
        pos += 2; // item id
        let method = if version == 1 {
            pos += 2;
            bytes[pos - 1] & 15
        } else {
            0
        };
        pos += 2; // data reference index
        let base = pos;
        pos += base_size;
        let extents = u16::from_be_bytes([bytes[pos], bytes[pos + 1]]);
        pos += 2;
        if method == 0 {
            shift(&mut bytes, base, base_size);
        }
        for _ in 0..extents {
            pos += index_size;
            if method == 0 && base_size == 0 {
                shift(&mut bytes, pos, offset_size);
            }
            pos += offset_size + length_size;
        }
    }

    for (at, grow) in [(ipma, 1), (ipco, irot.len()), (iprp, delta), (meta, delta)] {
        add_to_size(&mut bytes, at, grow);
    }
    bytes.insert(insert_association, 0x80 | irot_index as u8); // essential
    bytes.splice(ipco.end..ipco.end, irot);
    bytes
}

/// `heic` with every `ispe` property claiming `width`×`height`.
fn with_ispe(heic: &[u8], width: u32, height: u32) -> Vec<u8> {
    let mut bytes = heic.to_vec();
    let mut found = false;
    for at in 4..bytes.len() - 16 {
        if &bytes[at..at + 4] == b"ispe" {
            bytes[at + 8..at + 12].copy_from_slice(&width.to_be_bytes());
            bytes[at + 12..at + 16].copy_from_slice(&height.to_be_bytes());
            found = true;
        }
    }
    assert!(found, "heif-enc writes an ispe property");
    bytes
}

/// `heic` (holding an EXIF item) with that item's extents replaced by `repeats` extents over
/// the whole file: a small file whose EXIF item claims `repeats` × its length. The original
/// `meta` box becomes a `free` box and the changed one is appended at the end of the file, so
/// no file offset moves.
fn with_repeated_exif_extents(heic: &[u8], repeats: u16) -> Vec<u8> {
    let top = children(heic, 0, heic.len());
    let meta = child(&top, b"meta");
    let inside = children(heic, meta.body + 4, meta.end);
    let iinf = child(&inside, b"iinf");
    let skip = if heic[iinf.body] == 0 { 6 } else { 8 };
    let exif_id = children(heic, iinf.body + skip, iinf.end)
        .into_iter()
        .find_map(|(_, infe)| {
            assert_eq!(heic[infe.body], 2, "infe version 2");
            let id = u16::from_be_bytes([heic[infe.body + 4], heic[infe.body + 5]]);
            (&heic[infe.body + 8..infe.body + 12] == b"Exif").then_some(id)
        })
        .expect("the HEIC has an EXIF item");

    let iloc = child(&inside, b"iloc");
    let version = heic[iloc.body];
    assert!(version < 2, "iloc version 0 or 1");
    let (offset_size, length_size) = (usize::from(heic[iloc.body + 4] >> 4), usize::from(heic[iloc.body + 4] & 15));
    let base_size = usize::from(heic[iloc.body + 5] >> 4);
    let index_size = if version == 1 { usize::from(heic[iloc.body + 5] & 15) } else { 0 };
    assert!(length_size == 4 || length_size == 8, "extent lengths are written");
    let items = u16::from_be_bytes([heic[iloc.body + 6], heic[iloc.body + 7]]);
    let mut pos = iloc.body + 8;
    let mut exif_extents = None;
    for _ in 0..items {
        let id = u16::from_be_bytes([heic[pos], heic[pos + 1]]);
        pos += 2 + if version == 1 { 2 } else { 0 } + 2 + base_size;
        let count = usize::from(u16::from_be_bytes([heic[pos], heic[pos + 1]]));
        let end = pos + 2 + count * (index_size + offset_size + length_size);
        if id == exif_id {
            exif_extents = Some((pos, end));
        }
        pos = end;
    }
    let (count_at, extents_end) = exif_extents.expect("the EXIF item is in iloc");
    let entry = index_size + offset_size + length_size;
    let delta = usize::from(repeats) * entry - (extents_end - count_at - 2);
    let file_len = heic.len() + (meta.end - meta.start) + delta;

    let mut new_meta = heic[meta.start..count_at].to_vec();
    // Base offset 0: the extents' offsets are from the start of the file.
    let base_at = new_meta.len() - base_size;
    new_meta[base_at..].fill(0);
    new_meta.extend_from_slice(&repeats.to_be_bytes());
    for _ in 0..repeats {
        // Offset 0, length: the whole file.
        new_meta.extend(std::iter::repeat_n(0, index_size + offset_size));
        new_meta.extend_from_slice(&(file_len as u64).to_be_bytes()[8 - length_size..]);
    }
    new_meta.extend_from_slice(&heic[extents_end..meta.end]);
    let moved =
        |at: BoxAt| BoxAt { start: at.start - meta.start, end: at.end - meta.start, body: at.body - meta.start };
    add_to_size(&mut new_meta, moved(iloc), delta);
    add_to_size(&mut new_meta, moved(meta), delta);

    let mut bytes = heic.to_vec();
    bytes[meta.start + 4..meta.start + 8].copy_from_slice(b"free");
    bytes.extend_from_slice(&new_meta);
    assert_eq!(bytes.len(), file_len);
    bytes
}

/// A line of `/proc/self/status` in bytes (`VmHWM`: peak resident memory); `None` off Linux.
fn status_bytes(name: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(name))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[test]
fn an_exif_item_claiming_more_than_the_file_is_refused_before_libheif_reads_it() {
    let heic = heic_of_jpeg(&jpeg(&scene(64, 32), Some(camera_exif(1)), None));
    assert!(decode(&heic).1.exif.is_some(), "heif-enc keeps the EXIF block");

    // Its EXIF item once over the whole file: a claim within the file, read as before (not a
    // TIFF structure any more, so reported as absent).
    let once = with_repeated_exif_extents(&heic, 1);
    let (_, header) = decode(&once);
    assert_eq!(header.exif, None);
    assert!(header.scratch_bytes >= 2 * once.len() as u64, "the block counts in the budget: {header:?}");

    // 32 times (the most extents libheif reads of one item) over a file padded to 10 MiB: a
    // claim of over 300 MiB.
    let padding = vec![0u8; 10 << 20];
    let padded = [&heic[..], &u32::try_from(padding.len() + 8).unwrap().to_be_bytes(), b"free", &padding].concat();
    let bomb = with_repeated_exif_extents(&padded, 32);
    let claimed = 32 * bomb.len() as u64;
    assert!(claimed > 300 << 20, "{claimed}");
    let resettable = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = status_bytes("VmHWM");
    let error = failure(&bomb, &settings());
    assert_eq!(error.code(), codes::DECODE_FAILED, "{error}");
    let message = error.to_string();
    assert!(message.contains("(Exif) claims") && message.contains(&claimed.to_string()), "{message}");
    assert!(message.contains("extents repeat the same bytes"), "{message}");
    if let (Some(before), Some(after), true) = (before, status_bytes("VmHWM"), resettable) {
        assert!(after < before + (64 << 20), "peak resident memory grew from {before} to {after} bytes");
    }

    // A metadata item once over a file of more than a MiB: within the file, over the block
    // limit, so `pixel_limit` naming it.
    let padding = vec![0u8; heif::MAX_METADATA_BLOCK as usize];
    let padded = [&heic[..], &u32::try_from(padding.len() + 8).unwrap().to_be_bytes(), b"free", &padding].concat();
    let error = failure(&with_repeated_exif_extents(&padded, 1), &settings());
    assert_eq!(error.code(), codes::PIXEL_LIMIT, "{error}");
    let message = error.to_string();
    assert!(message.contains("(Exif) claims") && message.contains(&heif::MAX_METADATA_BLOCK.to_string()), "{message}");
}
