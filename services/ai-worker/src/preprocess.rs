//! From image bytes to the model's input: decode under a pixel limit (EXIF orientation applied),
//! RGB, centre crop of 87.5 % of the short side, resize to the model's square input (its
//! [`ModelInput`], from the model directory's manifest: 224×224 for the bundled
//! EfficientNet-Lite0), `(x − mean) / scale` per channel (`(x − 127) / 128` for the bundled
//! model), NCHW float32 `[1, 3, size, size]`.
//!
//! The bytes are normally the metadata step's upright preview (1440 px JPEG); a JPEG is decoded
//! by libjpeg-turbo at the smallest DCT scale that keeps [`ModelInput::decode_short_side`]
//! pixels on its short side ([`DECODE_SHORT_SIDE`] for a 224 px input), so even an original
//! 12 MP photo is never held at full size here.

use std::io::Cursor;

use image::imageops::{self, FilterType};
use image::metadata::Orientation;
use image::{DynamicImage, ExtendedColorType, ImageDecoder, ImageFormat, ImageReader, Limits, RgbImage};
use imagepipe_codec::jpeg;
use tract_onnx::prelude::tract_ndarray::Array4;

use crate::error::AnalyzeError;

/// Side of the bundled model's square input, in pixels (the default when a manifest has no
/// `input`).
pub const INPUT_SIZE: u32 = 224;
/// Share of the short side the centre crop keeps.
pub const CROP_FRACTION: f64 = 0.875;
/// Subtracted from each 0-255 channel value by the bundled model (the default `input.mean`).
pub const MEAN: f32 = 127.0;
/// Each channel value is divided by this after the mean is subtracted, for the bundled model
/// (the default `input.scale`).
pub const SCALE: f32 = 128.0;
/// The bundled model's input name (the default `input.name`).
pub const INPUT_NAME: &str = "input";
/// Crops larger than this many times the input are first box-reduced to twice the input, so a
/// large photo does not pay for a bicubic filter over every pixel.
const PRE_REDUCE_FACTOR: u32 = 4;
/// Least short side a JPEG is decoded at for a 224 px input (when it has that many): twice the
/// centre crop the model needs (224 / 0.875 = 256), so the final resize still has pixels to
/// average. Other input sizes scale it ([`ModelInput::decode_short_side`]).
pub const DECODE_SHORT_SIDE: u32 = 512;

/// What the model takes: its input's name, the side of its square NCHW input `[1, 3, size,
/// size]`, and each RGB channel's normalisation `(x − mean) / scale` (the manifest's `input`).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInput {
    /// The graph input's name.
    pub name: String,
    /// Side of the square input, in pixels.
    pub size: u32,
    /// Subtracted from each 0-255 value, per channel (R, G, B).
    pub mean: [f32; 3],
    /// Divides each value after the mean is subtracted, per channel (R, G, B); never 0.
    pub scale: [f32; 3],
}

impl Default for ModelInput {
    /// The bundled EfficientNet-Lite0's: `input`, 224 px, `(x − 127) / 128`.
    fn default() -> Self {
        Self { name: INPUT_NAME.to_owned(), size: INPUT_SIZE, mean: [MEAN; 3], scale: [SCALE; 3] }
    }
}

impl ModelInput {
    /// Least short side a JPEG is decoded at for this input (when it has that many): twice the
    /// centre crop the model needs, so the final resize still has pixels to average
    /// ([`DECODE_SHORT_SIDE`] for 224 px).
    pub fn decode_short_side(&self) -> u32 {
        let crop = (f64::from(self.size) / CROP_FRACTION).ceil() as u32;
        2 * crop
    }

    /// [`decode`], [`crop_and_resize`] and [`to_input`] in one: the model input of `bytes`.
    pub fn preprocess(&self, bytes: &[u8], max_pixels: u64) -> Result<Array4<f32>, AnalyzeError> {
        preprocess(bytes, max_pixels, self)
    }
}

/// Decodes `bytes` (format detected from the magic bytes) with at most `max_pixels` pixels,
/// applying the EXIF orientation; a JPEG at the DCT scale that keeps enough pixels for
/// `input` ([`ModelInput::decode_short_side`]).
pub fn decode(bytes: &[u8], max_pixels: u64, input: &ModelInput) -> Result<DynamicImage, AnalyzeError> {
    let (mut decoder, format) = open(bytes, max_pixels)?;
    let orientation = decoder.orientation().map_err(decode_error)?;
    let mut image = match jpeg_scale(format, bytes, decoder.dimensions(), input.decode_short_side()) {
        Some(num) => {
            drop(decoder);
            jpeg::decode_scaled(bytes, num).map_err(AnalyzeError::Decode)?
        }
        None => DynamicImage::from_decoder(decoder).map_err(decode_error)?,
    };
    image.apply_orientation(orientation);
    Ok(image)
}

/// The scale `num`/8 libjpeg-turbo decodes a `width`×`height` JPEG at to keep `short_side`
/// pixels on its short side (see [`ModelInput::decode_short_side`]); `None` for other formats
/// and for JPEGs it leaves to the `image` crate (CMYK).
fn jpeg_scale(format: ImageFormat, bytes: &[u8], (width, height): (u32, u32), short_side: u32) -> Option<u32> {
    if format != ImageFormat::Jpeg || !jpeg::decodes(bytes) {
        return None;
    }
    let (long, short) = (u64::from(width.max(height)), u64::from(width.min(height)).max(1));
    let need = (u64::from(short_side) * long).div_ceil(short);
    Some(jpeg::scale_for(width, height, u32::try_from(need).unwrap_or(u32::MAX)))
}

/// Bytes of the buffers [`preprocess`] holds at once at its peak for the image in `bytes`, from
/// its header alone: the decoded pixels in their own depth beside the decoder's scratch, or
/// beside their turned copy (orientations with a quarter turn), or beside their RGB copy and its
/// centre crop. Fails as [`decode`] would on a header it refuses.
pub fn memory_needed(bytes: &[u8], max_pixels: u64, input: &ModelInput) -> Result<u64, AnalyzeError> {
    let (mut decoder, format) = open(bytes, max_pixels)?;
    let full = decoder.dimensions();
    let (width, height) = match jpeg_scale(format, bytes, full, input.decode_short_side()) {
        Some(num) => jpeg::scaled_dimensions(full.0, full.1, num),
        None => full,
    };
    let pixels = u64::from(width) * u64::from(height);
    let decoded = pixels * u64::from(decoder.color_type().bytes_per_pixel());
    // A progressive JPEG's coefficients are held at full size, whatever the output scale.
    let progressive = format != ImageFormat::Jpeg || jpeg::layout(bytes).progressive;
    let scratch = if progressive {
        decoder_scratch(format, decoder.original_color_type(), u64::from(full.0) * u64::from(full.1))
    } else {
        0
    };
    let quarter_turn = matches!(
        decoder.orientation().map_err(decode_error)?,
        Orientation::Rotate90 | Orientation::Rotate270 | Orientation::Rotate90FlipH | Orientation::Rotate270FlipH
    );
    let turned = if quarter_turn { decoded } else { 0 };
    let side = u64::from(crop_side(width, height));
    let converted = 3 * pixels + 3 * side * side;
    Ok(decoded + scratch.max(turned).max(converted))
}

/// A decoder for `bytes` whose header claims at most `max_pixels` pixels and not none, with its
/// allocations limited, and the detected format.
fn open(bytes: &[u8], max_pixels: u64) -> Result<(impl ImageDecoder + '_, ImageFormat), AnalyzeError> {
    let reader =
        ImageReader::new(Cursor::new(bytes)).with_guessed_format().map_err(|e| AnalyzeError::Decode(e.to_string()))?;
    let format = reader.format().ok_or(AnalyzeError::UnsupportedFormat)?;
    let mut decoder = reader.into_decoder().map_err(decode_error)?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(AnalyzeError::TooManyPixels { width, height, max_pixels });
    }
    if width == 0 || height == 0 {
        return Err(AnalyzeError::Empty { width, height });
    }
    let mut limits = Limits::default();
    limits.max_alloc = Some(max_pixels.saturating_mul(16).max(64 << 20));
    decoder.set_limits(limits).map_err(decode_error)?;
    Ok((decoder, format))
}

/// Bytes the decoder of `format` holds beside its output while it decodes `pixels` stored as
/// `stored`: TIFF reads the whole image in its stored layout first; WebP and GIF decode through
/// an RGBA frame; a progressive JPEG keeps two bytes per sample of DCT coefficients (a baseline
/// one is not asked: it decodes a few rows at a time, as PNG and BMP do).
fn decoder_scratch(format: ImageFormat, stored: ExtendedColorType, pixels: u64) -> u64 {
    let per_pixel_bits = match format {
        ImageFormat::Tiff => u64::from(stored.bits_per_pixel()),
        ImageFormat::WebP | ImageFormat::Gif => 32,
        ImageFormat::Jpeg => 16 * u64::from(stored.channel_count()),
        _ => 0,
    };
    pixels.saturating_mul(per_pixel_bits) / 8
}

fn decode_error(error: image::ImageError) -> AnalyzeError {
    match error {
        image::ImageError::Unsupported(_) => AnalyzeError::UnsupportedFormat,
        other => AnalyzeError::Decode(other.to_string()),
    }
}

/// The square centre crop (87.5 % of the short side) of `image`, resized to the input's
/// `size`×`size` RGB with a bicubic (Catmull-Rom) filter.
pub fn crop_and_resize(image: &DynamicImage, input: &ModelInput) -> RgbImage {
    let size = input.size;
    let rgb = image.to_rgb8();
    let (width, height) = rgb.dimensions();
    let side = crop_side(width, height);
    let crop = imageops::crop_imm(&rgb, (width - side) / 2, (height - side) / 2, side, side).to_image();
    let crop = if side > PRE_REDUCE_FACTOR * size { imageops::thumbnail(&crop, 2 * size, 2 * size) } else { crop };
    imageops::resize(&crop, size, size, FilterType::CatmullRom)
}

/// Side of the centre crop of a `width`×`height` image.
fn crop_side(width: u32, height: u32) -> u32 {
    ((f64::from(width.min(height)) * CROP_FRACTION).round() as u32).max(1)
}

/// The model input of a `size`² RGB image: NCHW, `(x − mean) / scale` per channel.
///
/// # Panics
/// If `image` is not the input's `size`×`size` (use [`crop_and_resize`]).
pub fn to_input(image: &RgbImage, input: &ModelInput) -> Array4<f32> {
    let size = input.size;
    assert_eq!(image.dimensions(), (size, size), "the model input is {size}×{size}");
    let (mean, scale) = (input.mean, input.scale);
    let size = size as usize;
    Array4::from_shape_fn((1, 3, size, size), |(_, c, y, x)| {
        (f32::from(image.get_pixel(x as u32, y as u32)[c]) - mean[c]) / scale[c]
    })
}

/// [`decode`], [`crop_and_resize`] and [`to_input`] in one, for the model taking `input`.
pub fn preprocess(bytes: &[u8], max_pixels: u64, input: &ModelInput) -> Result<Array4<f32>, AnalyzeError> {
    Ok(to_input(&crop_and_resize(&decode(bytes, max_pixels, input)?, input), input))
}

#[cfg(test)]
mod tests {
    use image::codecs::png::PngEncoder;
    use image::{ImageEncoder, Rgb, RgbaImage};

    use super::*;

    fn encode(image: &DynamicImage, format: ImageFormat) -> Vec<u8> {
        let mut bytes = Cursor::new(Vec::new());
        image.write_to(&mut bytes, format).unwrap();
        bytes.into_inner()
    }

    #[test]
    fn the_input_is_nchw_normalised_rgb() {
        let mut image = RgbImage::from_pixel(INPUT_SIZE, INPUT_SIZE, Rgb([127, 255, 0]));
        image.put_pixel(3, 1, Rgb([255, 0, 127]));
        let input = to_input(&image, &ModelInput::default());
        assert_eq!(input.shape(), &[1, 3, 224, 224]);
        assert_eq!([input[[0, 0, 0, 0]], input[[0, 1, 0, 0]], input[[0, 2, 0, 0]]], [0.0, 1.0, -127.0 / 128.0]);
        // x = 3, y = 1: the row is the third axis, the column the fourth.
        assert_eq!([input[[0, 0, 1, 3]], input[[0, 1, 1, 3]], input[[0, 2, 1, 3]]], [1.0, -127.0 / 128.0, 0.0]);
    }

    #[test]
    fn the_crop_keeps_the_centre_875_per_cent_of_the_short_side() {
        // 800×400: the crop is the centred 350×350 square, x 225..575, y 25..375. Paint it
        // white and everything else black: the resized crop is white to its edges.
        let mut image = RgbImage::from_pixel(800, 400, Rgb([0, 0, 0]));
        for y in 25..375 {
            for x in 225..575 {
                image.put_pixel(x, y, Rgb([255, 255, 255]));
            }
        }
        let resized = crop_and_resize(&DynamicImage::ImageRgb8(image.clone()), &ModelInput::default());
        assert_eq!(resized.dimensions(), (224, 224));
        assert!(resized.pixels().all(|p| p.0 == [255, 255, 255]), "only the white square is kept");

        // One pixel less of white on the left: the crop's left column is no longer all white.
        for y in 25..375 {
            image.put_pixel(225, y, Rgb([0, 0, 0]));
        }
        let resized = crop_and_resize(&DynamicImage::ImageRgb8(image), &ModelInput::default());
        assert!(resized.get_pixel(0, 112).0[0] < 255);
        assert_eq!(resized.get_pixel(223, 112).0, [255, 255, 255]);
    }

    #[test]
    fn large_and_tiny_images_resize_to_the_input_size() {
        for (w, h) in [(4000, 3000), (1, 1), (3, 500)] {
            let image = DynamicImage::ImageRgb8(RgbImage::from_pixel(w, h, Rgb([10, 200, 30])));
            let resized = crop_and_resize(&image, &ModelInput::default());
            assert_eq!(resized.dimensions(), (224, 224), "{w}×{h}");
            assert!(resized.pixels().all(|p| p.0 == [10, 200, 30]), "{w}×{h}: a flat image stays flat");
        }
    }

    #[test]
    fn alpha_and_grey_images_become_rgb() {
        let rgba = DynamicImage::ImageRgba8(RgbaImage::from_pixel(50, 50, image::Rgba([200, 100, 50, 0])));
        let png = encode(&rgba, ImageFormat::Png);
        let input = preprocess(&png, 1_000_000, &ModelInput::default()).unwrap();
        assert_eq!(input[[0, 0, 100, 100]], (200.0 - 127.0) / 128.0);
        let grey = DynamicImage::ImageLuma8(image::GrayImage::from_pixel(40, 60, image::Luma([255])));
        let input = preprocess(&encode(&grey, ImageFormat::Jpeg), 1_000_000, &ModelInput::default()).unwrap();
        assert!((0..3).all(|c| (input[[0, c, 50, 50]] - 1.0).abs() < 0.02));
    }

    #[test]
    fn every_supported_format_decodes() {
        let image = DynamicImage::ImageRgb8(RgbImage::from_pixel(30, 20, Rgb([1, 2, 3])));
        for format in [
            ImageFormat::Png,
            ImageFormat::Jpeg,
            ImageFormat::Gif,
            ImageFormat::WebP,
            ImageFormat::Bmp,
            ImageFormat::Tiff,
        ] {
            let decoded = decode(&encode(&image, format), 1_000, &ModelInput::default())
                .unwrap_or_else(|e| panic!("{format:?}: {e}"));
            assert_eq!((decoded.width(), decoded.height()), (30, 20), "{format:?}");
        }
    }

    #[test]
    fn bad_bytes_are_decode_errors() {
        assert!(matches!(
            decode(b"hello, not an image", 1_000, &ModelInput::default()),
            Err(AnalyzeError::UnsupportedFormat)
        ));
        let image = DynamicImage::ImageRgb8(RgbImage::from_pixel(64, 64, Rgb([90, 20, 30])));
        let jpeg = encode(&image, ImageFormat::Jpeg);
        let truncated = &jpeg[..jpeg.len() / 2];
        let err = decode(truncated, 1_000_000, &ModelInput::default()).unwrap_err();
        assert!(matches!(err, AnalyzeError::Decode(_)), "{err:?}");
        assert_eq!(err.code(), crate::error::codes::DECODE_FAILED);
    }

    #[test]
    fn the_memory_needed_counts_the_decoded_pixels_and_their_largest_companion() {
        // 100×50 RGBA16: 8 bytes a pixel decoded; the RGB copy and the 44×44 crop come beside it.
        let (decoded, converted) = (100 * 50 * 8, 3 * 100 * 50 + 3 * 44 * 44);
        let png = |exif: Option<Vec<u8>>| {
            let mut bytes = Vec::new();
            let mut encoder = PngEncoder::new(&mut bytes);
            if let Some(exif) = exif {
                encoder.set_exif_metadata(exif).unwrap();
            }
            encoder.write_image(&[7; 100 * 50 * 8], 100, 50, image::ExtendedColorType::Rgba16).unwrap();
            bytes
        };
        assert_eq!(memory_needed(&png(None), 10_000, &ModelInput::default()).unwrap(), decoded + converted);
        // Orientation 6 (a quarter turn): the turned copy is larger than the conversion.
        let orientation_6 =
            vec![b'M', b'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0];
        assert_eq!(memory_needed(&png(Some(orientation_6)), 10_000, &ModelInput::default()).unwrap(), 2 * decoded);
        // A baseline JPEG decodes a few rows at a time: its RGB copy and crop are the companions.
        let jpeg = encode(&DynamicImage::ImageRgb8(RgbImage::new(100, 50)), ImageFormat::Jpeg);
        assert_eq!(memory_needed(&jpeg, 10_000, &ModelInput::default()).unwrap(), 100 * 50 * 3 + converted);
        assert!(matches!(memory_needed(&jpeg, 4_999, &ModelInput::default()), Err(AnalyzeError::TooManyPixels { .. })));
    }

    #[test]
    fn a_large_jpeg_is_decoded_at_a_reduced_scale_keeping_the_short_side() {
        // 4000×3000: at 2/8 the short side is 750 ≥ 512, at 1/8 it would be 375.
        let image = DynamicImage::ImageRgb8(RgbImage::from_fn(4000, 3000, |x, _| Rgb([(x / 16) as u8, 90, 30])));
        let jpeg = encode(&image, ImageFormat::Jpeg);
        let decoded = decode(&jpeg, 100_000_000, &ModelInput::default()).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (1000, 750));
        assert!(
            memory_needed(&jpeg, 100_000_000, &ModelInput::default()).unwrap() < 4000 * 3000 * 3,
            "the full size is never held"
        );
        let input = preprocess(&jpeg, 100_000_000, &ModelInput::default()).unwrap();
        assert_eq!(input.shape(), &[1, 3, 224, 224]);
    }

    #[test]
    fn another_input_size_and_per_channel_normalisation_are_honoured() {
        let input =
            ModelInput { name: "pixels".into(), size: 160, mean: [100.0, 0.0, 200.0], scale: [50.0, 255.0, 2.0] };
        let image = DynamicImage::ImageRgb8(RgbImage::from_pixel(640, 480, Rgb([150, 255, 204])));
        let resized = crop_and_resize(&image, &input);
        assert_eq!(resized.dimensions(), (160, 160));
        let tensor = to_input(&resized, &input);
        assert_eq!(tensor.shape(), &[1, 3, 160, 160]);
        assert_eq!([tensor[[0, 0, 5, 7]], tensor[[0, 1, 5, 7]], tensor[[0, 2, 5, 7]]], [1.0, 1.0, 2.0]);
        let png = encode(&image, ImageFormat::Png);
        assert_eq!(preprocess(&png, 1_000_000, &input).unwrap(), tensor);
    }

    #[test]
    fn a_jpeg_is_decoded_at_the_scale_the_input_size_needs() {
        // 4000×3000 for a 224 px input: twice the 256 px crop is 512, so 2/8 (750 px); for a
        // 96 px input twice the 110 px crop is 220, so 1/8 (375 px); for 512 px, twice the
        // 586 px crop is 1172, so 4/8 (1500 px).
        assert_eq!(ModelInput::default().decode_short_side(), DECODE_SHORT_SIDE);
        let image = DynamicImage::ImageRgb8(RgbImage::from_fn(4000, 3000, |x, _| Rgb([(x / 16) as u8, 90, 30])));
        let jpeg = encode(&image, ImageFormat::Jpeg);
        for (size, short_side) in [(224, 750), (96, 375), (512, 1500)] {
            let input = ModelInput { size, ..ModelInput::default() };
            let decoded = decode(&jpeg, 100_000_000, &input).unwrap();
            assert_eq!(decoded.height(), short_side, "{size} px input");
            assert_eq!(preprocess(&jpeg, 100_000_000, &input).unwrap().shape(), &[1, 3, size as usize, size as usize]);
        }
    }

    #[test]
    fn too_many_pixels_fail_before_decoding() {
        let image = DynamicImage::ImageRgb8(RgbImage::new(100, 100));
        let png = encode(&image, ImageFormat::Png);
        let err = decode(&png, 9_999, &ModelInput::default()).unwrap_err();
        assert!(matches!(err, AnalyzeError::TooManyPixels { width: 100, height: 100, max_pixels: 9_999 }), "{err:?}");
        assert_eq!(err.code(), crate::error::codes::PIXEL_LIMIT);
        assert!(decode(&png, 10_000, &ModelInput::default()).is_ok());
    }
}
