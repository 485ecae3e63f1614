//! The pixel work of a rendition, pure CPU: decode an image under a pixel limit (upright, as
//! its EXIF orientation says), scale it to fit a square of `max_side` (never enlarged), darken
//! a band along its bottom edge and draw a checker stamp and the watermark's text into it, and
//! encode the result as JPEG or WebP.

use std::io::Cursor;

use image::codecs::jpeg::JpegEncoder;
use image::codecs::webp::WebPEncoder;
use image::imageops::FilterType;
use image::metadata::Orientation;
use image::{DynamicImage, ExtendedColorType, ImageDecoder, ImageReader, Rgb, RgbImage};

use crate::font;

/// The filter the image is scaled with (bilinear): a check that compares a rendition with a
/// plain resize of its source scales with the same one.
pub const RESIZE_FILTER: FilterType = FilterType::Triangle;

/// How much the band is darkened: each of its pixels keeps `1 - BAND_ALPHA` of its value.
pub const BAND_ALPHA: f32 = 0.55;

/// The opacity of the stamp's and the text's white ink.
pub const INK_ALPHA: f32 = 0.9;

/// The least height of the band, in pixels (unless the image is lower).
pub const MIN_BAND_HEIGHT: u32 = 12;

/// Stable error codes of a rendition that cannot be made (the `code` of the step's error).
pub mod codes {
    /// The bytes are not an image the stage decodes, or they are corrupt.
    pub const UNDECODABLE: &str = "undecodable_image";
    /// The image has more pixels than the stage's limit.
    pub const PIXEL_LIMIT: &str = "pixel_limit";
    /// The rendition could not be encoded.
    pub const ENCODE_FAILED: &str = "encode_failed";
}

/// The encoding of a rendition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Baseline JPEG at the spec's quality.
    Jpeg,
    /// Lossless WebP (the quality is not used).
    Webp,
}

impl OutputFormat {
    /// Its name in the stage's output (`jpeg`, `webp`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Jpeg => "jpeg",
            Self::Webp => "webp",
        }
    }
}

/// What rendition to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenditionSpec {
    /// The longest side of the rendition, in pixels; a smaller image keeps its size.
    pub max_side: u32,
    /// The watermark's text (see [`font`] for the characters drawn).
    pub text: String,
    /// How it is encoded.
    pub format: OutputFormat,
    /// JPEG quality, 1 to 100.
    pub quality: u8,
    /// The most pixels (width × height) of a source image that is decoded.
    pub max_pixels: u64,
}

impl Default for RenditionSpec {
    fn default() -> Self {
        Self {
            max_side: 512,
            text: "imagepipe".into(),
            format: OutputFormat::Jpeg,
            quality: 85,
            max_pixels: 64_000_000,
        }
    }
}

/// An encoded rendition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendition {
    /// The encoded image.
    pub bytes: Vec<u8>,
    /// Its width in pixels.
    pub width: u32,
    /// Its height in pixels.
    pub height: u32,
    /// Its encoding.
    pub format: OutputFormat,
}

/// Why a rendition cannot be made. Every variant is permanent: the same bytes fail the same way
/// on every attempt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// Not an image in a format the stage decodes, or corrupt.
    #[error("the image cannot be decoded: {0}")]
    Undecodable(String),
    /// Over [`RenditionSpec::max_pixels`].
    #[error("the image is {width}×{height}, over the limit of {max_pixels} pixels")]
    TooManyPixels {
        /// Its width.
        width: u32,
        /// Its height.
        height: u32,
        /// The limit.
        max_pixels: u64,
    },
    /// The encoder failed.
    #[error("encoding the rendition failed: {0}")]
    Encode(String),
}

impl RenderError {
    /// Its stable code (one of [`codes`]).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Undecodable(_) => codes::UNDECODABLE,
            Self::TooManyPixels { .. } => codes::PIXEL_LIMIT,
            Self::Encode(_) => codes::ENCODE_FAILED,
        }
    }
}

/// The rows of an image its watermark band covers: the lowest eighth, at least
/// [`MIN_BAND_HEIGHT`] rows (all of them in a lower image).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Band {
    /// Its first row.
    pub top: u32,
    /// Its height in rows; it reaches the image's bottom edge.
    pub height: u32,
}

impl Band {
    /// The band of an image `height` rows high.
    pub fn of(height: u32) -> Self {
        let band = (height / 8).max(MIN_BAND_HEIGHT).min(height);
        Self { top: height - band, height: band }
    }
}

/// The size of an image of `width` × `height` scaled to fit a square of `max_side`, its aspect
/// ratio kept (rounded, each side at least 1); the same size when it fits already.
pub fn fit(width: u32, height: u32, max_side: u32) -> (u32, u32) {
    let longest = width.max(height);
    if longest <= max_side || longest == 0 {
        return (width, height);
    }
    let scale =
        |side: u32| ((u64::from(side) * u64::from(max_side) + u64::from(longest) / 2) / u64::from(longest)) as u32;
    if width >= height { (max_side, scale(height).max(1)) } else { (scale(width).max(1), max_side) }
}

/// Decodes `bytes` to RGB, upright as its EXIF orientation says; transparency is flattened on
/// white. An image of more than `max_pixels` pixels is refused before its pixels are decoded.
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<RgbImage, RenderError> {
    let undecodable = |e: image::ImageError| RenderError::Undecodable(e.to_string());
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| RenderError::Undecodable(e.to_string()))?;
    if reader.format().is_none() {
        return Err(RenderError::Undecodable("not an image in a supported format".into()));
    }
    let mut decoder = reader.into_decoder().map_err(undecodable)?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(RenderError::TooManyPixels { width, height, max_pixels });
    }
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let mut image = DynamicImage::from_decoder(decoder).map_err(undecodable)?;
    image.apply_orientation(orientation);
    if image.width() == 0 || image.height() == 0 {
        return Err(RenderError::Undecodable(format!("the image has no pixels ({width}×{height})")));
    }
    if !image.color().has_alpha() {
        return Ok(image.into_rgb8());
    }
    let rgba = image.into_rgba8();
    Ok(RgbImage::from_fn(rgba.width(), rgba.height(), |x, y| {
        let [r, g, b, a] = rgba.get_pixel(x, y).0;
        let over_white = |c: u8| ((u32::from(c) * u32::from(a) + 255 * (255 - u32::from(a)) + 127) / 255) as u8;
        Rgb([over_white(r), over_white(g), over_white(b)])
    }))
}

/// `image` scaled with [`RESIZE_FILTER`] to fit a square of `max_side` (see [`fit`]).
pub fn resize(image: &RgbImage, max_side: u32) -> RgbImage {
    let (width, height) = fit(image.width(), image.height(), max_side);
    if (width, height) == image.dimensions() {
        return image.clone();
    }
    image::imageops::resize(image, width, height, RESIZE_FILTER)
}

/// Blends `alpha` of `toward` into the pixel.
fn blend(pixel: &mut Rgb<u8>, toward: u8, alpha: f32) {
    for c in &mut pixel.0 {
        *c = (f32::from(*c) * (1.0 - alpha) + f32::from(toward) * alpha).round() as u8;
    }
}

/// Draws the watermark into `image`: the [`Band`] along its bottom edge darkened by
/// [`BAND_ALPHA`], a 4 × 4 checker stamp at its left end and `text` after it in the 5×7
/// [`font`], scaled to the band's height, in white ink of [`INK_ALPHA`]; characters that do not
/// fit the width are left out. Pixels above the band are left as they are.
pub fn watermark(image: &mut RgbImage, text: &str) {
    let (width, height) = image.dimensions();
    let band = Band::of(height);
    for y in band.top..height {
        for x in 0..width {
            blend(image.get_pixel_mut(x, y), 0, BAND_ALPHA);
        }
    }
    let pad = (band.height / 6).max(1);
    let inner = band.height.saturating_sub(2 * pad);
    if inner == 0 || width <= 2 * pad {
        return;
    }
    let mut ink = |x: u32, y: u32| {
        if x < width && y < height {
            blend(image.get_pixel_mut(x, y), 255, INK_ALPHA);
        }
    };
    // The stamp: a checker of 4 × 4 cells, its top left cell inked.
    let top = band.top + pad;
    let side = inner.min(width - 2 * pad);
    let cell = (side / 4).max(1);
    for dy in 0..side {
        for dx in 0..side {
            if (dx / cell + dy / cell) % 2 == 0 {
                ink(pad + dx, top + dy);
            }
        }
    }
    // The text, vertically centred in the band.
    let scale = (inner / font::GLYPH_HEIGHT).max(1);
    let text_top = top + inner.saturating_sub(font::GLYPH_HEIGHT * scale) / 2;
    let advance = (font::GLYPH_WIDTH + font::GLYPH_SPACING) * scale;
    let right = width - pad;
    let mut left = pad + side + 2 * pad;
    for c in text.chars() {
        if left + font::GLYPH_WIDTH * scale > right {
            break;
        }
        for fy in 0..font::GLYPH_HEIGHT {
            for fx in 0..font::GLYPH_WIDTH {
                if font::is_set(c, fx, fy) {
                    for sy in 0..scale {
                        for sx in 0..scale {
                            ink(left + fx * scale + sx, text_top + fy * scale + sy);
                        }
                    }
                }
            }
        }
        left += advance;
    }
}

/// Encodes `image` as `format` (JPEG at `quality`).
pub fn encode(image: &RgbImage, format: OutputFormat, quality: u8) -> Result<Vec<u8>, RenderError> {
    let mut bytes = Vec::new();
    let encoded = match format {
        OutputFormat::Jpeg => JpegEncoder::new_with_quality(&mut bytes, quality.clamp(1, 100)).encode_image(image),
        OutputFormat::Webp => WebPEncoder::new_lossless(&mut bytes).encode(
            image.as_raw(),
            image.width(),
            image.height(),
            ExtendedColorType::Rgb8,
        ),
    };
    encoded.map_err(|e| RenderError::Encode(e.to_string()))?;
    Ok(bytes)
}

/// The rendition of the image in `bytes` that `spec` asks for: decoded, scaled, watermarked,
/// encoded.
pub fn render(bytes: &[u8], spec: &RenditionSpec) -> Result<Rendition, RenderError> {
    let source = decode(bytes, spec.max_pixels)?;
    let mut image = resize(&source, spec.max_side);
    drop(source);
    watermark(&mut image, &spec.text);
    let (width, height) = image.dimensions();
    let bytes = encode(&image, spec.format, spec.quality)?;
    Ok(Rendition { bytes, width, height, format: spec.format })
}

#[cfg(test)]
mod tests {
    use image::ImageFormat;

    use super::*;

    /// A smooth, colourful test picture of `width` × `height`: gradients, no flat areas.
    fn picture(width: u32, height: u32) -> RgbImage {
        RgbImage::from_fn(width, height, |x, y| {
            Rgb([
                (60 + x * 140 / width) as u8,
                (80 + y * 120 / height) as u8,
                (200 - (x + y) * 100 / (width + height)) as u8,
            ])
        })
    }

    fn png(image: &RgbImage) -> Vec<u8> {
        let mut bytes = Vec::new();
        image.write_to(&mut Cursor::new(&mut bytes), ImageFormat::Png).unwrap();
        bytes
    }

    /// Mean absolute difference per channel of `a` and `b` over rows `rows`.
    fn mean_difference(a: &RgbImage, b: &RgbImage, rows: std::ops::Range<u32>) -> f64 {
        assert_eq!(a.dimensions(), b.dimensions());
        let (mut sum, mut n) = (0u64, 0u64);
        for y in rows {
            for x in 0..a.width() {
                for (p, q) in a.get_pixel(x, y).0.iter().zip(b.get_pixel(x, y).0) {
                    sum += u64::from(p.abs_diff(q));
                    n += 1;
                }
            }
        }
        sum as f64 / n as f64
    }

    #[test]
    fn fit_keeps_the_aspect_and_never_enlarges() {
        assert_eq!(fit(800, 400, 200), (200, 100));
        assert_eq!(fit(400, 800, 200), (100, 200));
        assert_eq!(fit(1000, 333, 300), (300, 100));
        assert_eq!(fit(512, 512, 320), (320, 320));
        assert_eq!(fit(100, 50, 200), (100, 50), "a smaller image keeps its size");
        assert_eq!(fit(200, 100, 200), (200, 100));
        assert_eq!(fit(10_000, 1, 100), (100, 1), "a side never rounds to 0");
    }

    #[test]
    fn the_band_is_the_lowest_eighth_with_a_floor() {
        assert_eq!(Band::of(400), Band { top: 350, height: 50 });
        assert_eq!(Band::of(64), Band { top: 52, height: 12 });
        assert_eq!(Band::of(5), Band { top: 0, height: 5 });
    }

    #[test]
    fn a_rendition_fits_the_side_keeps_the_aspect_and_decodes() {
        let spec = RenditionSpec { max_side: 240, ..RenditionSpec::default() };
        let rendition = render(&png(&picture(960, 600)), &spec).unwrap();
        assert_eq!((rendition.width, rendition.height), (240, 150));
        assert_eq!(rendition.format, OutputFormat::Jpeg);
        assert_eq!(image::guess_format(&rendition.bytes).unwrap(), ImageFormat::Jpeg);
        let decoded = image::load_from_memory(&rendition.bytes).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (240, 150));

        let tall = render(&png(&picture(300, 900)), &spec).unwrap();
        assert_eq!((tall.width, tall.height), (80, 240));
    }

    #[test]
    fn the_watermark_changes_the_band_and_nothing_above_it() {
        let source = picture(480, 320);
        let plain = resize(&source, 240);
        let mut marked = plain.clone();
        watermark(&mut marked, "imagepipe");
        let band = Band::of(marked.height());
        assert_eq!(band, Band { top: 140, height: 20 });
        assert_eq!(mean_difference(&plain, &marked, 0..band.top), 0.0, "untouched above the band");
        let in_band = mean_difference(&plain, &marked, band.top..marked.height());
        assert!(in_band > 40.0, "the band is darkened and inked: {in_band}");
        // Every pixel of the band is changed, darker unless inked.
        let (mut darker, mut inked) = (0, 0);
        for y in band.top..marked.height() {
            for x in 0..marked.width() {
                let (p, q) = (plain.get_pixel(x, y).0, marked.get_pixel(x, y).0);
                let (sum_p, sum_q) =
                    (p.iter().map(|&c| u32::from(c)).sum::<u32>(), q.iter().map(|&c| u32::from(c)).sum::<u32>());
                if sum_q < sum_p {
                    darker += 1;
                } else {
                    assert!(q.iter().all(|&c| c > 200), "({x}, {y}) is inked white: {q:?}");
                    inked += 1;
                }
            }
        }
        assert!(darker > 0 && inked > 0, "{darker} darkened, {inked} inked");
    }

    #[test]
    fn the_text_is_drawn_glyph_by_glyph() {
        // A band of 40 rows: pad 6, inner 28, the checker 28 wide, the glyphs at scale 4.
        let mut with_text = RgbImage::from_pixel(400, 320, Rgb([128, 128, 128]));
        let mut without = with_text.clone();
        watermark(&mut with_text, "I");
        watermark(&mut without, "");
        let (pad, scale, band_top) = (6, 4, 280);
        let left = pad + 28 + 2 * pad;
        let top = band_top + pad;
        // The I's stem (font column 2, rows 1 to 5) is inked; font column 0 of row 3 is not.
        let stem = with_text.get_pixel(left + 2 * scale + 1, top + 3 * scale + 1).0;
        let beside = with_text.get_pixel(left + 1, top + 3 * scale + 1).0;
        assert!(stem.iter().all(|&c| c > 200), "{stem:?}");
        assert_eq!(beside, [58, 58, 58], "darkened only");
        let differing = with_text.pixels().zip(without.pixels()).filter(|(a, b)| a != b).count();
        // Each pixel the font sets for the I is scale × scale pixels of ink.
        let set = (0..7).flat_map(|y| (0..5).map(move |x| (x, y))).filter(|&(x, y)| font::is_set('I', x, y)).count();
        assert_eq!(differing as u32, set as u32 * scale * scale);
    }

    #[test]
    fn a_long_text_is_cut_at_the_right_edge_and_a_tiny_image_is_still_marked() {
        let mut image = RgbImage::from_pixel(60, 40, Rgb([100, 160, 200]));
        watermark(&mut image, &"W".repeat(100));
        let band = Band::of(40);
        let right_pad = (band.height / 6).max(1);
        for y in band.top..40 {
            for x in 60 - right_pad..60 {
                assert_eq!(image.get_pixel(x, y).0, [45, 72, 90], "the right padding is not inked");
            }
        }
        let mut tiny = RgbImage::from_pixel(3, 2, Rgb([200, 200, 200]));
        watermark(&mut tiny, "imagepipe");
        assert!(tiny.pixels().all(|p| p.0 != [200, 200, 200]));
    }

    #[test]
    fn the_jpeg_rendition_matches_a_plain_resize_outside_the_band() {
        let source = picture(800, 500);
        let spec = RenditionSpec { max_side: 320, quality: 90, ..RenditionSpec::default() };
        let rendition = render(&png(&source), &spec).unwrap();
        let decoded = image::load_from_memory(&rendition.bytes).unwrap().into_rgb8();
        let plain = resize(&source, 320);
        let band = Band::of(plain.height());
        // JPEG blocks of 16 rows may straddle the band's top edge.
        let above = mean_difference(&plain, &decoded, 0..band.top.saturating_sub(16));
        let inside = mean_difference(&plain, &decoded, band.top..plain.height());
        assert!(above < 3.0, "outside the band, a plain resize within JPEG's loss: {above}");
        assert!(inside > 40.0, "the band differs: {inside}");
    }

    #[test]
    fn webp_is_lossless() {
        let source = picture(200, 100);
        let spec = RenditionSpec { max_side: 100, format: OutputFormat::Webp, ..RenditionSpec::default() };
        let rendition = render(&png(&source), &spec).unwrap();
        assert_eq!(image::guess_format(&rendition.bytes).unwrap(), ImageFormat::WebP);
        let decoded = image::load_from_memory(&rendition.bytes).unwrap().into_rgb8();
        let mut expected = resize(&source, 100);
        watermark(&mut expected, &spec.text);
        assert_eq!(decoded, expected);
    }

    #[test]
    fn transparency_is_flattened_on_white() {
        let rgba = image::RgbaImage::from_fn(4, 4, |x, _| image::Rgba([0, 0, 0, if x < 2 { 0 } else { 255 }]));
        let mut bytes = Vec::new();
        rgba.write_to(&mut Cursor::new(&mut bytes), ImageFormat::Png).unwrap();
        let decoded = decode(&bytes, 100).unwrap();
        assert_eq!(decoded.get_pixel(0, 0).0, [255, 255, 255]);
        assert_eq!(decoded.get_pixel(3, 0).0, [0, 0, 0]);
    }

    #[test]
    fn undecodable_and_oversized_images_are_refused_with_their_codes() {
        let garbage = render(b"not an image at all", &RenditionSpec::default()).unwrap_err();
        assert_eq!(garbage.code(), codes::UNDECODABLE, "{garbage}");
        let jpeg = encode(&picture(64, 64), OutputFormat::Jpeg, 80).unwrap();
        let truncated = render(&jpeg[..jpeg.len() / 3], &RenditionSpec::default()).unwrap_err();
        assert_eq!(truncated.code(), codes::UNDECODABLE, "{truncated}");
        let spec = RenditionSpec { max_pixels: 64 * 63, ..RenditionSpec::default() };
        let large = render(&jpeg, &spec).unwrap_err();
        assert_eq!(large, RenderError::TooManyPixels { width: 64, height: 64, max_pixels: 64 * 63 });
        assert_eq!(large.code(), codes::PIXEL_LIMIT);
    }
}
