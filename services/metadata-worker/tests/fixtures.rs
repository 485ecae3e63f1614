//! Every fixture of issue 5 through `extract`: its documented output or its documented failure.

mod support;

use image::{GenericImageView, Rgba, RgbaImage};
use imagepipe_blob::BlobKey;
use imagepipe_contracts::step::Exif;
use imagepipe_metadata_worker::error::codes;
use imagepipe_metadata_worker::{ExtractError, Extracted, extract};
use imagepipe_runtime::config::MetadataConfig;
use support::*;

fn run(bytes: &[u8]) -> Extracted {
    extract(bytes, &MetadataConfig::default()).expect("the fixture is a valid image")
}

fn failure(bytes: &[u8]) -> ExtractError {
    extract(bytes, &MetadataConfig::default()).expect_err("the fixture must fail")
}

/// The smallest derivative (the `thumbnail`), checked against its description, decoded.
fn thumbnail_of(extracted: &Extracted) -> image::DynamicImage {
    let m = &extracted.metadata;
    assert_eq!(m.thumbnails.len(), extracted.derivatives.len());
    for (described, bytes) in m.thumbnails.iter().zip(&extracted.derivatives) {
        assert_eq!(described.key, BlobKey::of(bytes).to_string(), "{}", described.name);
        assert_eq!(described.size, bytes.len() as u64);
        let decoded = image::load_from_memory(bytes).expect("every derivative decodes");
        assert_eq!(decoded.dimensions(), (described.width, described.height), "{}", described.name);
    }
    let preview = m.thumbnails.iter().find(|t| t.name == "preview").expect("a preview");
    assert_eq!(m.preview_key.as_deref(), Some(preview.key.as_str()), "the AI reads the preview");
    let index = m.thumbnails.iter().position(|t| t.key == m.thumbnail_key).expect("thumbnailKey is listed");
    assert_eq!(m.thumbnails[index].name, "thumbnail");
    image::load_from_memory(&extracted.derivatives[index]).expect("the thumbnail decodes")
}

#[test]
fn jpeg_with_exif_gps_and_icc() {
    let bytes = jpeg(&scene(640, 480), Some(camera_exif(1)), Some(vec![0x42; 300]));
    let out = run(&bytes);
    let m = &out.metadata;
    assert_eq!((m.format.as_str(), m.width, m.height), ("jpeg", 640, 480));
    assert_eq!((m.color_type.as_str(), m.bit_depth, m.has_alpha, m.frame_count), ("rgb8", 8, false, 1));
    assert!(m.has_icc_profile);

    let exif = m.exif.clone().expect("EXIF found");
    let (lat, lon) = (exif.gps_latitude.unwrap(), exif.gps_longitude.unwrap());
    assert!((lat - -22.9515).abs() < 1e-9, "{lat}");
    assert!((lon - -(43.0 + 12.0 / 60.0 + 37.2 / 3600.0)).abs() < 1e-9, "{lon}");
    let expected = Exif {
        make: Some("Imagepipe Optics".into()),
        model: Some("IP-1 Mark II".into()),
        lens: Some("35mm f/1.4".into()),
        date_time_original: Some("2024:05:17 14:03:22".into()),
        exposure_time: Some("1/250".into()),
        iso: Some(400),
        focal_length_mm: Some(35.0),
        orientation: Some(1),
        gps_latitude: exif.gps_latitude,
        gps_longitude: exif.gps_longitude,
    };
    assert_eq!(exif, expected);

    // The scene is mostly the blue-ish gradient with a yellow disc.
    assert_eq!(m.dominant_colors.len(), 5);
    let shares: f64 = m.dominant_colors.iter().map(|c| c.share).sum();
    assert!((shares - 1.0).abs() < 1e-9);
    assert!(
        m.dominant_colors.iter().any(|c| c.hex.starts_with("#f") || c.hex.starts_with("#e")),
        "{:?}",
        m.dominant_colors
    );
    assert!((0.2..0.8).contains(&m.mean_brightness), "{}", m.mean_brightness);
    assert_eq!(m.phash.len(), 16);
    assert!(m.phash.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(blurhash::decode(&m.blurhash, 4, 3, 1.0).is_ok(), "{}", m.blurhash);

    let thumb = thumbnail_of(&out);
    assert_eq!(thumb.dimensions(), (256, 192));
    let formats: Vec<(&str, &str, u32, u32)> =
        m.thumbnails.iter().map(|t| (t.name.as_str(), t.format.as_str(), t.width, t.height)).collect();
    assert_eq!(formats, [("thumbnail", "webp", 256, 192), ("preview", "jpeg", 640, 480)], "never enlarged");
    assert_eq!(image::guess_format(&out.derivatives[0]).unwrap(), image::ImageFormat::WebP);
    assert_eq!(image::guess_format(&out.derivatives[1]).unwrap(), image::ImageFormat::Jpeg);
}

#[test]
fn a_plain_jpeg_has_no_exif_and_no_icc() {
    let m = run(&jpeg(&scene(64, 48), None, None)).metadata;
    assert_eq!(m.exif, None);
    assert!(!m.has_icc_profile);
}

#[test]
fn exif_is_read_from_png_and_webp_too() {
    let png = run(&png_with_exif(60, 40, Some(camera_exif(8)))).metadata;
    let still = RgbaImage::from_pixel(60, 40, Rgba([10, 20, 30, 255]));
    let webp = run(&webp_with_exif(&still, Some(camera_exif(8)))).metadata;
    for (format, m) in [("png", png), ("webp", webp)] {
        let exif = m.exif.unwrap_or_else(|| panic!("{format}: EXIF found"));
        assert_eq!((exif.model.as_deref(), exif.orientation, exif.iso), (Some("IP-1 Mark II"), Some(8), Some(400)));
    }
}

#[test]
fn orientation_six_swaps_the_thumbnail_dimensions() {
    let out = run(&jpeg(&scene(400, 200), Some(camera_exif(6)), None));
    assert_eq!((out.metadata.width, out.metadata.height), (400, 200), "dimensions as stored");
    assert_eq!(out.metadata.exif.as_ref().and_then(|e| e.orientation), Some(6));
    assert_eq!(thumbnail_of(&out).dimensions(), (128, 256), "the thumbnail is upright");
}

#[test]
fn png_with_an_alpha_channel() {
    let out = run(&png_with_alpha(300, 100));
    let m = &out.metadata;
    assert_eq!((m.format.as_str(), m.width, m.height), ("png", 300, 100));
    assert_eq!((m.color_type.as_str(), m.bit_depth, m.has_alpha, m.frame_count), ("rgba8", 8, true, 1));
    // Only the opaque half has a colour; brightness counts only opaque pixels.
    assert_eq!(m.dominant_colors.len(), 1);
    assert_eq!((m.dominant_colors[0].hex.as_str(), m.dominant_colors[0].share), ("#dc1e1e", 1.0));
    let red_luma = (0.2126 * 220.0 + 0.7152 * 30.0 + 0.0722 * 30.0) / 255.0;
    assert!((m.mean_brightness - red_luma).abs() < 0.01, "{}", m.mean_brightness);

    assert_eq!(image::guess_format(&out.derivatives[0]).unwrap(), image::ImageFormat::WebP);
    assert_eq!(m.thumbnails[1].format, "png", "a JPEG preview of an image with alpha is a PNG");
    let thumb = thumbnail_of(&out).into_rgba8();
    assert_eq!(thumb.dimensions(), (256, 85));
    assert_eq!(thumb.get_pixel(250, 40)[3], 0, "transparency survives in the thumbnail");
}

#[test]
fn animated_gif_with_three_frames() {
    let m = run(&animated_gif(3)).metadata;
    assert_eq!((m.format.as_str(), m.width, m.height, m.frame_count), ("gif", 40, 30, 3));
    assert_eq!(m.dominant_colors[0].hex, "#ff0000", "colours of the first frame");
    assert_eq!(run(&animated_gif(1)).metadata.frame_count, 1);
}

#[test]
fn webp_still_and_animated() {
    let still =
        RgbaImage::from_fn(50, 20, |x, _| if x < 25 { Rgba([0, 128, 255, 255]) } else { Rgba([255, 255, 255, 255]) });
    let m = run(&webp(&still)).metadata;
    assert_eq!((m.format.as_str(), m.width, m.height, m.frame_count), ("webp", 50, 20, 1));
    let hexes: Vec<&str> = m.dominant_colors.iter().map(|c| c.hex.as_str()).collect();
    assert!(hexes.contains(&"#0080ff") && hexes.contains(&"#ffffff"), "{hexes:?}");

    let animated = animated_webp(32, 16, &[[255, 0, 0, 255], [0, 255, 0, 255]]);
    let m = run(&animated).metadata;
    assert_eq!((m.format.as_str(), m.width, m.height, m.frame_count), ("webp", 32, 16, 2));
}

#[test]
fn bmp_tiff_and_sixteen_bit_png() {
    let image = image::DynamicImage::ImageRgb8(scene(90, 60));
    for (format, name) in [(image::ImageFormat::Bmp, "bmp"), (image::ImageFormat::Tiff, "tiff")] {
        let mut bytes = std::io::Cursor::new(Vec::new());
        image.write_to(&mut bytes, format).unwrap();
        let m = run(bytes.get_ref()).metadata;
        assert_eq!((m.format.as_str(), m.width, m.height, m.exif), (name, 90, 60, None));
    }
    let mut bytes = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb16(image.to_rgb16()).write_to(&mut bytes, image::ImageFormat::Png).unwrap();
    let m = run(bytes.get_ref()).metadata;
    assert_eq!((m.color_type.as_str(), m.bit_depth), ("rgb16", 16));
}

#[test]
fn truncated_jpeg_is_decode_failed() {
    let bytes = jpeg(&scene(640, 480), Some(camera_exif(1)), None);
    for cut in [bytes.len() / 2, 700] {
        let error = failure(&bytes[..cut]);
        assert_eq!(error.code(), codes::DECODE_FAILED, "cut at {cut}: {error}");
    }
    let png = png_with_alpha(300, 100);
    assert_eq!(failure(&png[..png.len() - 40]).code(), codes::DECODE_FAILED);
    let gif = animated_gif(1);
    assert_eq!(failure(&gif[..gif.len() / 2]).code(), codes::DECODE_FAILED);
    let mut corrupt = jpeg(&scene(64, 48), None, None);
    let sof = corrupt.windows(2).position(|w| w == [0xFF, 0xC0]).expect("a baseline JPEG has SOF0");
    corrupt[sof + 4] = 5; // sample precision
    corrupt[sof + 9] = 9; // component count
    assert_eq!(failure(&corrupt).code(), codes::DECODE_FAILED, "a corrupt frame header");
}

#[test]
fn pixel_bombs_fail_with_pixel_limit_before_decoding() {
    // Wider than any decoder limit: refused by the decoder's dimension check.
    let bomb = pixel_bomb_png(100_000, 100_000);
    assert!(bomb.len() < 100);
    let error = failure(&bomb);
    assert_eq!(error.code(), codes::PIXEL_LIMIT, "{error}");

    // Within the width and height limits but 400 megapixels: refused by the pixel count.
    let error = failure(&pixel_bomb_png(20_000, 20_000));
    assert_eq!(error.code(), codes::PIXEL_LIMIT);
    assert!(error.to_string().contains("20000×20000"), "{error}");

    // The limits are the configured ones.
    let tight = MetadataConfig { max_pixels: 1_000, ..MetadataConfig::default() };
    let error = extract(&png_with_alpha(40, 30), &tight).unwrap_err();
    assert_eq!(error.code(), codes::PIXEL_LIMIT);
    assert!(extract(&png_with_alpha(40, 25), &tight).is_ok());
}

#[test]
fn text_is_not_an_image() {
    let error = failure(b"<html><body>this is not a JPEG</body></html>");
    assert_eq!(error.code(), codes::UNSUPPORTED_FORMAT);
    assert_eq!(failure(b"").code(), codes::UNSUPPORTED_FORMAT);
}

#[test]
fn extraction_is_deterministic() {
    let bytes = jpeg(&scene(320, 240), Some(camera_exif(1)), None);
    let (a, b) = (run(&bytes), run(&bytes));
    assert_eq!(a.metadata, b.metadata);
    assert_eq!(a.derivatives, b.derivatives);
}

#[test]
fn a_spare_core_changes_nothing_in_the_output() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use imagepipe_metadata_worker::extract_with;

    let settings = MetadataConfig::default();
    for bytes in [jpeg(&scene(2000, 1500), Some(camera_exif(6)), None), png_with_alpha(900, 700)] {
        let alone = run(&bytes);
        // The "slot" counts while the second thread holds it: it is given back when it ends.
        let (held, asked) = (Arc::new(AtomicUsize::new(0)), AtomicUsize::new(0));
        struct Slot(Arc<AtomicUsize>);
        impl Drop for Slot {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let spared = extract_with(&bytes, &settings, || {
            asked.fetch_add(1, Ordering::SeqCst);
            held.fetch_add(1, Ordering::SeqCst);
            Some(Slot(held.clone()))
        })
        .unwrap();
        assert_eq!(asked.load(Ordering::SeqCst), 1, "a spare core is asked for once");
        assert_eq!(held.load(Ordering::SeqCst), 0, "the spare slot is given back");
        assert_eq!(spared.metadata, alone.metadata);
        assert_eq!(spared.derivatives, alone.derivatives);
        thumbnail_of(&spared);
    }
}
