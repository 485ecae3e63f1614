//! Derivatives (`metadata.thumbnails`): the image scaled to fit a square (never enlarged),
//! turned upright by its EXIF orientation, encoded as WebP, JPEG or PNG.

use std::borrow::Cow;
use std::cell::RefCell;
use std::io::Cursor;

use fast_image_resize::{FilterType, IntoImageView, ResizeAlg, ResizeError, ResizeOptions, Resizer};
use image::codecs::png::PngEncoder;
use image::metadata::Orientation;
use image::{ColorType, DynamicImage, ImageEncoder, RgbImage, RgbaImage};
use imagepipe_codec::jpeg;
use imagepipe_runtime::config::{ThumbnailFormat, ThumbnailSpec};

use crate::error::ExtractError;

/// libwebp's effort (0 fastest … 6 smallest; its default is 4): 2 encodes a thumbnail in about
/// half the time for a few per cent more bytes.
const WEBP_METHOD: i32 = 2;

/// An encoded derivative.
#[derive(Debug, Clone)]
pub struct Thumbnail {
    /// The encoded bytes.
    pub bytes: Vec<u8>,
    /// Width after orientation.
    pub width: u32,
    /// Height after orientation.
    pub height: u32,
    /// `webp`, `jpeg` or `png`.
    pub format: &'static str,
}

/// `image` scaled down so its long edge is at most `size`; the image itself when it already
/// fits (see [`scaled`]).
pub fn fit(image: DynamicImage, size: u32) -> DynamicImage {
    scaled(&image, size).unwrap_or(image)
}

/// A copy of `image` scaled down so its long edge is at most `size`; `None` when it already
/// fits. A convolution whose support widens with the reduction, so every source pixel counts
/// (like an area filter): Catmull-Rom, sharp, for reductions of 2× and more; bilinear, half the
/// taps, for the small last step a shrink-on-load decode leaves (1512 → 1440 px), where no
/// detail can alias; SIMD through `fast_image_resize`. Images with alpha are area-averaged in
/// place (see the body).
pub fn scaled(image: &DynamicImage, size: u32) -> Option<DynamicImage> {
    let (width, height) = (image.width(), image.height());
    let (w, h) = fitted(width, height, size);
    if (w, h) == (width, height) {
        return None;
    }
    // With alpha, the SIMD resizer premultiplies a copy of the whole source: for a 100 MP
    // 16-bit PNG that is 800 MB more than the memory budget counted. Area averaging needs none.
    if image.color().has_alpha() {
        return Some(image.thumbnail_exact(w, h));
    }
    Some(match resize(image, (w, h), image.color()) {
        Ok(resized) => resized,
        // Pixel types the SIMD resizer lacks (none of the decoders' today) take the slow road.
        Err(_) => image.thumbnail_exact(w, h),
    })
}

/// Bytes [`fit`] holds beside the source and the result while it resizes a `height` pixels
/// tall image of `bytes_per_pixel` to `width` pixels: the horizontally resized rows.
pub fn resize_scratch(width: u32, height: u32, bytes_per_pixel: u8) -> u64 {
    u64::from(width) * u64::from(height) * u64::from(bytes_per_pixel)
}

/// `source` (any view `fast_image_resize` reads: a [`DynamicImage`], or a decoder's buffer)
/// resized to `to`, as [`fit`] filters, into a new image of `color`.
pub fn resize(source: &impl IntoImageView, to: (u32, u32), color: ColorType) -> Result<DynamicImage, ResizeError> {
    let filter = if source.width() >= 2 * to.0 { FilterType::CatmullRom } else { FilterType::Bilinear };
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(filter));
    let mut resized = DynamicImage::new(to.0, to.1, color);
    // The resizer keeps its scratch rows between calls: one per blocking thread.
    thread_local!(static RESIZER: RefCell<Resizer> = RefCell::new(Resizer::new()));
    RESIZER.with(|resizer| resizer.borrow_mut().resize(source, &mut resized, &options))?;
    Ok(resized)
}

/// The dimensions [`fit`] gives a `width`×`height` image.
pub fn fitted(width: u32, height: u32, size: u32) -> (u32, u32) {
    let long = width.max(height);
    if long <= size {
        return (width, height);
    }
    let scale = |edge: u32| ((u64::from(edge) * u64::from(size) + u64::from(long) / 2) / u64::from(long)).max(1);
    (scale(width) as u32, scale(height) as u32)
}

/// Turns `image` upright by its EXIF `orientation` (1..=8; anything else leaves it as it is).
pub fn upright(mut image: DynamicImage, orientation: Option<u16>) -> DynamicImage {
    if let Some(orientation) = orientation.and_then(|o| u8::try_from(o).ok()).and_then(Orientation::from_exif) {
        image.apply_orientation(orientation);
    }
    image
}

/// `image` as 8-bit RGB, borrowed when it already is (a decoded photo is): no copy to encode.
fn rgb8(image: &DynamicImage) -> Cow<'_, RgbImage> {
    match image {
        DynamicImage::ImageRgb8(rgb) => Cow::Borrowed(rgb),
        other => Cow::Owned(other.to_rgb8()),
    }
}

/// `image` as 8-bit RGBA, borrowed when it already is.
fn rgba8(image: &DynamicImage) -> Cow<'_, RgbaImage> {
    match image {
        DynamicImage::ImageRgba8(rgba) => Cow::Borrowed(rgba),
        other => Cow::Owned(other.to_rgba8()),
    }
}

/// Encodes `image` as `spec` says. An image with alpha asked for as JPEG is written as PNG
/// (JPEG has no alpha); 16-bit and float images are written with 8 bits per channel.
pub fn encode(image: &DynamicImage, spec: &ThumbnailSpec) -> Result<Thumbnail, ExtractError> {
    let (width, height) = (image.width(), image.height());
    let alpha = image.color().has_alpha();
    let failed = |reason: String| ExtractError::Thumbnail { name: spec.name.clone(), reason };
    let (bytes, format) = match spec.format {
        ThumbnailFormat::Webp => {
            let mut config = webp::WebPConfig::new().map_err(|()| failed("libwebp's configuration".into()))?;
            config.quality = f32::from(spec.quality);
            config.method = WEBP_METHOD;
            config.alpha_compression = 1;
            let (rgb, rgba);
            let encoder = if alpha {
                rgba = rgba8(image);
                webp::Encoder::from_rgba(rgba.as_raw(), width, height)
            } else {
                rgb = rgb8(image);
                webp::Encoder::from_rgb(rgb.as_raw(), width, height)
            };
            let encoded = encoder.encode_advanced(&config).map_err(|e| failed(format!("libwebp: {e:?}")))?;
            (encoded.to_vec(), "webp")
        }
        ThumbnailFormat::Jpeg if !alpha => (jpeg::encode(&rgb8(image), spec.quality).map_err(failed)?, "jpeg"),
        ThumbnailFormat::Jpeg | ThumbnailFormat::Png => {
            let mut bytes = Vec::new();
            let encoder = PngEncoder::new(Cursor::new(&mut bytes));
            if alpha {
                encoder.write_image(&rgba8(image), width, height, image::ExtendedColorType::Rgba8)
            } else {
                encoder.write_image(&rgb8(image), width, height, image::ExtendedColorType::Rgb8)
            }
            .map_err(|e| failed(e.to_string()))?;
            (bytes, "png")
        }
    };
    Ok(Thumbnail { bytes, width, height, format })
}

#[cfg(test)]
mod tests {
    use image::{GenericImageView, Rgb, RgbImage, Rgba, RgbaImage};

    use super::*;

    fn spec(format: ThumbnailFormat) -> ThumbnailSpec {
        ThumbnailSpec { name: "t".into(), size: 256, format, quality: 90 }
    }

    #[test]
    fn fits_the_long_edge_and_never_enlarges() {
        let wide = DynamicImage::ImageRgb8(RgbImage::new(1000, 500));
        assert_eq!(fit(wide, 256).dimensions(), (256, 128));
        let tall = DynamicImage::ImageRgb8(RgbImage::new(300, 1201));
        assert_eq!(fit(tall, 256).dimensions(), (64, 256));
        let thin = DynamicImage::ImageRgb8(RgbImage::new(10_000, 3));
        assert_eq!(fit(thin, 256).dimensions(), (256, 1));
        let small = DynamicImage::ImageRgb8(RgbImage::new(100, 40));
        assert_eq!(fit(small, 256).dimensions(), (100, 40));
    }

    #[test]
    fn orientation_six_turns_the_thumbnail_a_quarter_clockwise() {
        // A red top row: after a quarter turn clockwise it is the right column.
        let image = RgbImage::from_fn(40, 20, |_, y| if y == 0 { Rgb([255, 0, 0]) } else { Rgb([0, 0, 0]) });
        let thumb = encode(&upright(DynamicImage::ImageRgb8(image), Some(6)), &spec(ThumbnailFormat::Png)).unwrap();
        assert_eq!((thumb.width, thumb.height, thumb.format), (20, 40, "png"));
        let decoded = image::load_from_memory(&thumb.bytes).unwrap().into_rgb8();
        assert_eq!(decoded.dimensions(), (20, 40));
        assert!(decoded.get_pixel(19, 20).0[0] > 150, "right column is red");
        assert!(decoded.get_pixel(0, 20).0[0] < 100, "left column is not");
    }

    #[test]
    fn every_format_decodes_to_the_same_picture() {
        let image = DynamicImage::ImageRgb8(RgbImage::from_fn(64, 32, |x, _| {
            if x < 32 { Rgb([200, 30, 30]) } else { Rgb([30, 30, 200]) }
        }));
        for (format, name) in
            [(ThumbnailFormat::Webp, "webp"), (ThumbnailFormat::Jpeg, "jpeg"), (ThumbnailFormat::Png, "png")]
        {
            let thumb = encode(&image, &spec(format)).unwrap();
            assert_eq!(thumb.format, name);
            let decoded = image::load_from_memory(&thumb.bytes).unwrap().into_rgb8();
            assert_eq!(decoded.dimensions(), (64, 32), "{name}");
            let [r, _, b] = decoded.get_pixel(8, 16).0;
            assert!(r > 150 && b < 90, "{name}: left is red, got {:?}", decoded.get_pixel(8, 16));
            let [r, _, b] = decoded.get_pixel(56, 16).0;
            assert!(b > 150 && r < 90, "{name}: right is blue");
        }
    }

    #[test]
    fn alpha_survives_in_webp_and_turns_a_jpeg_into_a_png() {
        let image = DynamicImage::ImageRgba8(RgbaImage::from_pixel(8, 8, Rgba([1, 2, 3, 4])));
        let thumb = encode(&image, &spec(ThumbnailFormat::Jpeg)).unwrap();
        assert_eq!(thumb.format, "png");
        let decoded = image::load_from_memory(&thumb.bytes).unwrap();
        assert_eq!(decoded.into_rgba8().get_pixel(3, 3), &Rgba([1, 2, 3, 4]));
        let webp = encode(&image, &spec(ThumbnailFormat::Webp)).unwrap();
        assert_eq!(webp.format, "webp");
        assert!(image::load_from_memory(&webp.bytes).unwrap().color().has_alpha());
    }
}
