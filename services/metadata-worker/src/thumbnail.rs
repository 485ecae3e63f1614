//! Thumbnails: the image scaled to fit a square (never enlarged), turned upright by its EXIF
//! orientation, encoded as JPEG, or as PNG when it has an alpha channel.

use std::io::Cursor;

use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::metadata::Orientation;
use image::{DynamicImage, ImageEncoder};

use crate::error::ExtractError;

/// An encoded thumbnail.
#[derive(Debug, Clone)]
pub struct Thumbnail {
    /// The encoded bytes.
    pub bytes: Vec<u8>,
    /// Width after orientation.
    pub width: u32,
    /// Height after orientation.
    pub height: u32,
    /// `jpeg` or `png`.
    pub format: &'static str,
}

/// `image` scaled down (area-averaged) so its long edge is at most `size`; the image itself when
/// it already fits.
pub fn fit(image: &DynamicImage, size: u32) -> DynamicImage {
    let (width, height) = (image.width(), image.height());
    match fitted(width, height, size) {
        (w, h) if (w, h) == (width, height) => image.clone(),
        (w, h) => image.thumbnail_exact(w, h),
    }
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

/// Encodes `image` as JPEG of `jpeg_quality`, or as PNG when it has an alpha channel.
pub fn encode(image: DynamicImage, jpeg_quality: u8) -> Result<Thumbnail, ExtractError> {
    let (width, height) = (image.width(), image.height());
    let mut bytes = Vec::new();
    let failed = |e: image::ImageError| ExtractError::Thumbnail(e.to_string());
    let format = if image.color().has_alpha() {
        let rgba = image.into_rgba8();
        PngEncoder::new(Cursor::new(&mut bytes))
            .write_image(&rgba, width, height, image::ExtendedColorType::Rgba8)
            .map_err(failed)?;
        "png"
    } else {
        let rgb = image.into_rgb8();
        JpegEncoder::new_with_quality(Cursor::new(&mut bytes), jpeg_quality)
            .write_image(&rgb, width, height, image::ExtendedColorType::Rgb8)
            .map_err(failed)?;
        "jpeg"
    };
    Ok(Thumbnail { bytes, width, height, format })
}

#[cfg(test)]
mod tests {
    use image::{GenericImageView, Rgb, RgbImage, Rgba, RgbaImage};

    use super::*;

    #[test]
    fn fits_the_long_edge_and_never_enlarges() {
        let wide = DynamicImage::ImageRgb8(RgbImage::new(1000, 500));
        assert_eq!(fit(&wide, 256).dimensions(), (256, 128));
        let tall = DynamicImage::ImageRgb8(RgbImage::new(300, 1201));
        assert_eq!(fit(&tall, 256).dimensions(), (64, 256));
        let thin = DynamicImage::ImageRgb8(RgbImage::new(10_000, 3));
        assert_eq!(fit(&thin, 256).dimensions(), (256, 1));
        let small = DynamicImage::ImageRgb8(RgbImage::new(100, 40));
        assert_eq!(fit(&small, 256).dimensions(), (100, 40));
    }

    #[test]
    fn orientation_six_turns_the_thumbnail_a_quarter_clockwise() {
        // A red top row: after a quarter turn clockwise it is the right column.
        let image = RgbImage::from_fn(40, 20, |_, y| if y == 0 { Rgb([255, 0, 0]) } else { Rgb([0, 0, 0]) });
        let thumb = encode(upright(DynamicImage::ImageRgb8(image), Some(6)), 100).unwrap();
        assert_eq!((thumb.width, thumb.height, thumb.format), (20, 40, "jpeg"));
        let decoded = image::load_from_memory(&thumb.bytes).unwrap().into_rgb8();
        assert_eq!(decoded.dimensions(), (20, 40));
        assert!(decoded.get_pixel(19, 20).0[0] > 150, "right column is red");
        assert!(decoded.get_pixel(0, 20).0[0] < 100, "left column is not");
    }

    #[test]
    fn alpha_makes_a_png() {
        let image = RgbaImage::from_pixel(8, 8, Rgba([1, 2, 3, 4]));
        let thumb = encode(DynamicImage::ImageRgba8(image), 85).unwrap();
        assert_eq!(thumb.format, "png");
        let decoded = image::load_from_memory(&thumb.bytes).unwrap();
        assert_eq!(decoded.into_rgba8().get_pixel(3, 3), &Rgba([1, 2, 3, 4]));
    }
}
