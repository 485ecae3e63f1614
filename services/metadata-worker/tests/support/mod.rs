//! Image fixtures, generated in memory: real encoders for the pixels, hand-built containers
//! for what the encoders cannot write (EXIF blocks, animated WebP, a pixel-bomb PNG).

#![allow(dead_code)]

use std::io::Cursor;

use exif::experimental::Writer;
use exif::{Field, In, Rational, Tag, Value};
use image::codecs::gif::GifEncoder;
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::codecs::webp::WebPEncoder;
use image::{Delay, Frame, ImageEncoder, Rgb, RgbImage, Rgba, RgbaImage};

/// A smooth colour gradient with a bright disc: something a camera could have taken.
pub fn scene(width: u32, height: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        let (u, v) = (x as f32 / width as f32, y as f32 / height as f32);
        let disc = ((u - 0.3).powi(2) + (v - 0.4).powi(2)).sqrt() < 0.15;
        if disc { Rgb([250, 220, 40]) } else { Rgb([(40.0 + 80.0 * u) as u8, (90.0 + 60.0 * v) as u8, 170]) }
    })
}

/// An EXIF block (TIFF structure) holding `fields`.
pub fn exif_block(fields: &[Field]) -> Vec<u8> {
    let mut writer = Writer::new();
    for field in fields {
        writer.push_field(field);
    }
    let mut block = Cursor::new(Vec::new());
    writer.write(&mut block, false).expect("writing an EXIF block");
    block.into_inner()
}

/// An ASCII field of the primary image.
pub fn ascii(tag: Tag, text: &str) -> Field {
    Field { tag, ifd_num: In::PRIMARY, value: Value::Ascii(vec![text.as_bytes().to_vec()]) }
}

/// A SHORT field of the primary image.
pub fn short(tag: Tag, value: u16) -> Field {
    Field { tag, ifd_num: In::PRIMARY, value: Value::Short(vec![value]) }
}

/// A RATIONAL field of the primary image.
pub fn rationals(tag: Tag, values: &[(u32, u32)]) -> Field {
    let values = values.iter().map(|&(num, denom)| Rational { num, denom }).collect();
    Field { tag, ifd_num: In::PRIMARY, value: Value::Rational(values) }
}

/// The EXIF block of a camera photo taken in Rio de Janeiro (22°57'5.4"S 43°12'37.2"W).
pub fn camera_exif(orientation: u16) -> Vec<u8> {
    exif_block(&[
        ascii(Tag::Make, "Imagepipe Optics"),
        ascii(Tag::Model, "IP-1 Mark II"),
        ascii(Tag::LensModel, "35mm f/1.4"),
        ascii(Tag::DateTimeOriginal, "2024:05:17 14:03:22"),
        rationals(Tag::ExposureTime, &[(1, 250)]),
        short(Tag::PhotographicSensitivity, 400),
        rationals(Tag::FocalLength, &[(35, 1)]),
        short(Tag::Orientation, orientation),
        ascii(Tag::GPSLatitudeRef, "S"),
        rationals(Tag::GPSLatitude, &[(22, 1), (57, 1), (54, 10)]),
        ascii(Tag::GPSLongitudeRef, "W"),
        rationals(Tag::GPSLongitude, &[(43, 1), (12, 1), (372, 10)]),
    ])
}

/// `image` as a quality-90 JPEG with an optional EXIF block and ICC profile.
pub fn jpeg(image: &RgbImage, exif: Option<Vec<u8>>, icc: Option<Vec<u8>>) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut encoder = JpegEncoder::new_with_quality(Cursor::new(&mut bytes), 90);
    if let Some(exif) = exif {
        encoder.set_exif_metadata(exif).expect("JPEG takes EXIF");
    }
    if let Some(icc) = icc {
        encoder.set_icc_profile(icc).expect("JPEG takes ICC profiles");
    }
    encoder.write_image(image, image.width(), image.height(), image::ExtendedColorType::Rgb8).expect("encoding a JPEG");
    bytes
}

/// An RGBA PNG: opaque red on the left half, fully transparent on the right.
pub fn png_with_alpha(width: u32, height: u32) -> Vec<u8> {
    png_with_exif(width, height, None)
}

/// [`png_with_alpha`] with an optional `eXIf` chunk.
pub fn png_with_exif(width: u32, height: u32, exif: Option<Vec<u8>>) -> Vec<u8> {
    let image =
        RgbaImage::from_fn(
            width,
            height,
            |x, _| {
                if x < width / 2 { Rgba([220, 30, 30, 255]) } else { Rgba([0, 0, 0, 0]) }
            },
        );
    let mut bytes = Vec::new();
    let mut encoder = PngEncoder::new(Cursor::new(&mut bytes));
    if let Some(exif) = exif {
        encoder.set_exif_metadata(exif).expect("PNG takes EXIF");
    }
    encoder.write_image(&image, width, height, image::ExtendedColorType::Rgba8).expect("encoding a PNG");
    bytes
}

/// A GIF animation of `frames` flat-coloured 40×30 frames.
pub fn animated_gif(frames: usize) -> Vec<u8> {
    let colours = [[255, 0, 0, 255], [0, 255, 0, 255], [0, 0, 255, 255], [255, 255, 0, 255]];
    let mut bytes = Vec::new();
    {
        let mut encoder = GifEncoder::new(&mut bytes);
        let frames = (0..frames).map(|i| {
            let image = RgbaImage::from_pixel(40, 30, Rgba(colours[i % colours.len()]));
            Frame::from_parts(image, 0, 0, Delay::from_numer_denom_ms(100, 1))
        });
        encoder.encode_frames(frames).expect("encoding a GIF");
    }
    bytes
}

/// A still lossless WebP.
pub fn webp(image: &RgbaImage) -> Vec<u8> {
    webp_with_exif(image, None)
}

/// [`webp`] with an optional `EXIF` chunk.
pub fn webp_with_exif(image: &RgbaImage, exif: Option<Vec<u8>>) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut encoder = WebPEncoder::new_lossless(Cursor::new(&mut bytes));
    if let Some(exif) = exif {
        encoder.set_exif_metadata(exif).expect("WebP takes EXIF");
    }
    encoder
        .write_image(image, image.width(), image.height(), image::ExtendedColorType::Rgba8)
        .expect("encoding a WebP");
    bytes
}

/// An animated WebP (`VP8X` + `ANIM` + one `ANMF` per frame) of flat-coloured `width`×`height`
/// frames, assembled around the lossless encoder's `VP8L` bitstreams.
pub fn animated_webp(width: u32, height: u32, colours: &[[u8; 4]]) -> Vec<u8> {
    let u24 = |v: u32| v.to_le_bytes()[..3].to_vec();
    let chunk = |fourcc: &[u8], data: &[u8]| {
        let mut c = fourcc.to_vec();
        c.extend_from_slice(&(data.len() as u32).to_le_bytes());
        c.extend_from_slice(data);
        if data.len() % 2 == 1 {
            c.push(0);
        }
        c
    };
    let mut body = b"WEBP".to_vec();
    let mut vp8x = vec![0x02 | 0x10, 0, 0, 0];
    vp8x.extend(u24(width - 1));
    vp8x.extend(u24(height - 1));
    body.extend(chunk(b"VP8X", &vp8x));
    body.extend(chunk(b"ANIM", &[0, 0, 0, 0, 0, 0]));
    for colour in colours {
        let still = webp(&RgbaImage::from_pixel(width, height, Rgba(*colour)));
        let vp8l = &still[12..]; // the image chunk after `RIFF<size>WEBP`
        assert_eq!(&vp8l[..4], b"VP8L", "the lossless encoder writes a simple-format WebP");
        let mut anmf = [u24(0), u24(0), u24(width - 1), u24(height - 1), u24(100)].concat();
        anmf.push(0);
        anmf.extend_from_slice(vp8l);
        body.extend(chunk(b"ANMF", &anmf));
    }
    let mut riff = b"RIFF".to_vec();
    riff.extend_from_slice(&(body.len() as u32).to_le_bytes());
    riff.extend(body);
    riff
}

/// A PNG chunk: length, kind, data and CRC.
pub fn png_chunk(kind: &[u8], data: &[u8]) -> Vec<u8> {
    let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
    chunk.extend_from_slice(kind);
    chunk.extend_from_slice(data);
    let mut crc = crc32fast::Hasher::new();
    crc.update(kind);
    crc.update(data);
    chunk.extend_from_slice(&crc.finalize().to_be_bytes());
    chunk
}

/// A PNG of a few dozen bytes whose header claims `width`×`height` RGBA pixels.
pub fn pixel_bomb_png(width: u32, height: u32) -> Vec<u8> {
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
    // A zlib stream with one stored block of 16 zero bytes (Adler-32 of 16 zeros: 0x00100001).
    let mut idat = vec![0x78, 0x01, 0x01, 16, 0, !16, 0xff];
    idat.extend_from_slice(&[0; 16]);
    idat.extend_from_slice(&[0x00, 0x10, 0x00, 0x01]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(png_chunk(b"IHDR", &ihdr));
    png.extend(png_chunk(b"IDAT", &idat));
    png.extend(png_chunk(b"IEND", &[]));
    png
}

/// A `width`×`height` 16-bit RGBA PNG of one `colour`, written a row at a time: every row after
/// the first is filtered "Up" to all zeros, so even 100 megapixels compress to under a megabyte.
pub fn flat_rgba16_png(width: u32, height: u32, colour: [u16; 4]) -> Vec<u8> {
    use std::io::Write;

    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[16, 6, 0, 0, 0]);
    let pixel: Vec<u8> = colour.iter().flat_map(|c| c.to_be_bytes()).collect();
    let mut first = vec![0]; // filter None
    first.extend(pixel.iter().copied().cycle().take(pixel.len() * width as usize));
    let mut up = vec![0; first.len()];
    up[0] = 2; // filter Up, no difference
    let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    zlib.write_all(&first).expect("compressing to memory");
    for _ in 1..height {
        zlib.write_all(&up).expect("compressing to memory");
    }
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(png_chunk(b"IHDR", &ihdr));
    png.extend(png_chunk(b"IDAT", &zlib.finish().expect("compressing to memory")));
    png.extend(png_chunk(b"IEND", &[]));
    png
}

/// `png` with a `tEXt` comment after its header chunk: the same pixels under another blob key.
pub fn with_comment(png: &[u8], comment: &str) -> Vec<u8> {
    const SIGNATURE_AND_IHDR: usize = 8 + 12 + 13;
    let mut text = b"Comment\0".to_vec();
    text.extend_from_slice(comment.as_bytes());
    [&png[..SIGNATURE_AND_IHDR], &png_chunk(b"tEXt", &text), &png[SIGNATURE_AND_IHDR..]].concat()
}
