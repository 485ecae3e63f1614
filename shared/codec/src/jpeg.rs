//! JPEG through libjpeg-turbo: decoding at a reduced DCT scale (shrink-on-load: an 8×8 block
//! is inverse-transformed straight to M×M pixels, so a 12 MP photo needed at 1440 px is never
//! held at full size) and encoding derivatives.

use std::ffi::CStr;
use std::os::raw::{c_int, c_ulong};

use image::{DynamicImage, GrayImage, RgbImage};
use turbojpeg::raw;

/// Eighths of the full size libjpeg-turbo's scaled IDCT can produce directly.
const EIGHTHS: u32 = 8;

/// The scale `num`/8 (1..=8) at which decoding a `width`×`height` JPEG gives the smallest image
/// whose long edge still covers `need` pixels (or the full size when the image is smaller).
pub fn scale_for(width: u32, height: u32, need: u32) -> u32 {
    let long = width.max(height);
    let target = need.min(long);
    (1..=EIGHTHS).find(|&num| scaled(long, num) >= target).unwrap_or(EIGHTHS)
}

/// An edge of `dimension` pixels decoded at `num`/8, rounded up as libjpeg-turbo does.
pub fn scaled(dimension: u32, num: u32) -> u32 {
    ((u64::from(dimension) * u64::from(num)).div_ceil(u64::from(EIGHTHS))) as u32
}

/// A `width`×`height` image decoded at `num`/8 ([`scaled`] on each edge).
pub fn scaled_dimensions(width: u32, height: u32, num: u32) -> (u32, u32) {
    (scaled(width, num), scaled(height, num))
}

/// Whether libjpeg-turbo decodes this JPEG's colour space to RGB or grey itself; CMYK and
/// YCCK JPEGs are left to the `image` crate's decoder.
pub fn decodes(bytes: &[u8]) -> bool {
    Decompressor::new()
        .and_then(|d| d.header(bytes))
        .is_ok_and(|h| h.colorspace != raw::TJCS_TJCS_CMYK && h.colorspace != raw::TJCS_TJCS_YCCK)
}

/// `bytes` decoded at `num`/8 of their size: grey JPEGs as [`DynamicImage::ImageLuma8`], the
/// others as RGB. A warning of libjpeg-turbo (e.g. extraneous bytes before a marker, which many
/// cameras write) is logged and the image kept; an error is returned with its message.
pub fn decode_scaled(bytes: &[u8], num: u32) -> Result<DynamicImage, String> {
    let decompressor = Decompressor::new()?;
    let header = decompressor.header(bytes)?;
    let (width, height) = scaled_dimensions(header.width, header.height, num);
    let grey = header.colorspace == raw::TJCS_TJCS_GRAY;
    let channels = if grey { 1 } else { 3 };
    let mut pixels = vec![0u8; width as usize * height as usize * channels];
    let format = if grey { raw::TJPF_TJPF_GRAY } else { raw::TJPF_TJPF_RGB };
    // SAFETY: `pixels` holds `height` rows of `width * channels` bytes, the pitch given as 0
    // (rows packed); libjpeg-turbo writes no more than that for these dimensions and format.
    let status = unsafe {
        raw::tjDecompress2(
            decompressor.0,
            bytes.as_ptr(),
            c_ulong::try_from(bytes.len()).map_err(|_| "the JPEG is too large".to_owned())?,
            pixels.as_mut_ptr(),
            width as c_int,
            0,
            height as c_int,
            format as c_int,
            0,
        )
    };
    if status != 0 {
        let (message, warning) = decompressor.error();
        if !warning {
            return Err(message);
        }
        tracing::debug!(warning = %message, "libjpeg-turbo decoded the JPEG with a warning");
    }
    let image = if grey {
        DynamicImage::ImageLuma8(GrayImage::from_raw(width, height, pixels).expect("the buffer fits the dimensions"))
    } else {
        DynamicImage::ImageRgb8(RgbImage::from_raw(width, height, pixels).expect("the buffer fits the dimensions"))
    };
    Ok(image)
}

/// `image` (RGB) as a baseline JPEG of `quality` with 4:2:0 chroma, as cameras write them.
pub fn encode(image: &RgbImage, quality: u8) -> Result<Vec<u8>, String> {
    let (width, height) = image.dimensions();
    let mut compressor = turbojpeg::Compressor::new().map_err(|e| e.to_string())?;
    compressor.set_quality(i32::from(quality));
    compressor.set_subsamp(turbojpeg::Subsamp::Sub2x2);
    let view = turbojpeg::Image {
        pixels: image.as_raw().as_slice(),
        width: width as usize,
        pitch: 3 * width as usize,
        height: height as usize,
        format: turbojpeg::PixelFormat::RGB,
    };
    compressor.compress_to_vec(view).map_err(|e| e.to_string())
}

/// What the segments before a JPEG's first scan say: enough to refuse a truncated file (which
/// decoders fill with grey instead of failing) and to know what decoding will hold.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// The frame is progressive (SOF2, SOF6, SOF10 or SOF14).
    pub progressive: bool,
    /// The first scan is followed by an end-of-image marker.
    pub ends: bool,
}

/// Walks a JPEG's segments up to its first scan. The segments before the scan are skipped by
/// their lengths, so an EXIF thumbnail's end marker does not count; inside entropy-coded data
/// `FF D9` cannot occur (a data `FF` is followed by `00`).
pub fn layout(bytes: &[u8]) -> Layout {
    const SOS: u8 = 0xDA;
    const EOI: [u8; 2] = [0xFF, 0xD9];
    const PROGRESSIVE_FRAMES: [u8; 4] = [0xC2, 0xC6, 0xCA, 0xCE];
    let mut layout = Layout { progressive: false, ends: false };
    let mut pos = 2; // after SOI
    loop {
        if bytes.get(pos) != Some(&0xFF) {
            return layout;
        }
        let Some(&marker) = bytes.get(pos + 1) else { return layout };
        match marker {
            0xFF => pos += 1, // fill byte
            0x01 | 0xD0..=0xD7 => pos += 2,
            SOS => {
                // Nearly every JPEG ends with its end marker (some with padding after it).
                let scan = &bytes[pos + 2..];
                let tail = &scan[scan.len().saturating_sub(64)..];
                layout.ends = tail.windows(2).any(|w| w == EOI) || scan.windows(2).any(|w| w == EOI);
                return layout;
            }
            _ => {
                layout.progressive |= PROGRESSIVE_FRAMES.contains(&marker);
                let Some(len) = bytes.get(pos + 2..pos + 4) else { return layout };
                pos += 2 + usize::from(u16::from_be_bytes([len[0], len[1]]));
            }
        }
    }
}

/// What a JPEG's header says.
struct JpegHeader {
    width: u32,
    height: u32,
    colorspace: raw::TJCS,
}

/// A libjpeg-turbo decompression handle, destroyed on drop.
struct Decompressor(raw::tjhandle);

impl Decompressor {
    fn new() -> Result<Self, String> {
        // SAFETY: tjInitDecompress has no preconditions; a null handle is checked.
        let handle = unsafe { raw::tjInitDecompress() };
        if handle.is_null() {
            return Err("libjpeg-turbo could not allocate a decompressor".into());
        }
        Ok(Self(handle))
    }

    fn header(&self, bytes: &[u8]) -> Result<JpegHeader, String> {
        let (mut width, mut height, mut subsampling, mut colorspace) = (0, 0, 0, 0);
        let len = c_ulong::try_from(bytes.len()).map_err(|_| "the JPEG is too large".to_owned())?;
        // SAFETY: the pointer and length describe `bytes`; the out-parameters are valid ints.
        let status = unsafe {
            raw::tjDecompressHeader3(
                self.0,
                bytes.as_ptr(),
                len,
                &mut width,
                &mut height,
                &mut subsampling,
                &mut colorspace,
            )
        };
        if status != 0 {
            return Err(self.error().0);
        }
        let positive = |v: c_int| u32::try_from(v).ok().filter(|&v| v > 0);
        match (positive(width), positive(height)) {
            (Some(width), Some(height)) => Ok(JpegHeader { width, height, colorspace: colorspace as raw::TJCS }),
            _ => Err(format!("the JPEG header says {width}×{height}")),
        }
    }

    /// The last error's message and whether it was only a warning.
    fn error(&self) -> (String, bool) {
        // SAFETY: the handle is valid; libjpeg-turbo returns a NUL-terminated static or
        // handle-owned string, copied before the handle is used again.
        unsafe {
            let message = CStr::from_ptr(raw::tjGetErrorStr2(self.0)).to_string_lossy().into_owned();
            let warning = raw::tjGetErrorCode(self.0) == raw::TJERR_TJERR_WARNING as c_int;
            (message, warning)
        }
    }
}

impl Drop for Decompressor {
    fn drop(&mut self) {
        // SAFETY: the handle came from tjInitDecompress and is destroyed once.
        unsafe {
            raw::tjDestroy(self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use image::codecs::jpeg::JpegEncoder;
    use image::{ImageEncoder, Rgb};

    use super::*;

    #[test]
    fn the_scale_is_the_smallest_that_covers_the_need() {
        assert_eq!(scale_for(4032, 3024, 1440), 3, "3/8 of 4032 is 1512");
        assert_eq!(scale_for(4032, 3024, 256), 1, "1/8 of 4032 is 504");
        assert_eq!(scale_for(8064, 6048, 1440), 2, "2/8 of 8064 is 2016");
        assert_eq!(scale_for(3024, 4032, 2016), 4, "the long edge counts, portrait or not");
        assert_eq!(scale_for(1000, 800, 1440), 8, "a smaller image decodes at full size");
        assert_eq!(scaled(4031, 3), 1512, "rounded up");
    }

    #[test]
    fn a_scaled_decode_keeps_the_picture() {
        // Left half red, right half blue, 400×200: at 1/4 it is 100×50, still split.
        let image = RgbImage::from_fn(400, 200, |x, _| if x < 200 { Rgb([230, 20, 20]) } else { Rgb([20, 20, 230]) });
        let mut bytes = Vec::new();
        JpegEncoder::new_with_quality(Cursor::new(&mut bytes), 95)
            .write_image(&image, 400, 200, image::ExtendedColorType::Rgb8)
            .unwrap();
        assert!(decodes(&bytes));
        let decoded = decode_scaled(&bytes, 2).unwrap().into_rgb8();
        assert_eq!(decoded.dimensions(), (100, 50));
        assert!(decoded.get_pixel(10, 25)[0] > 200 && decoded.get_pixel(90, 25)[2] > 200);

        let encoded = encode(&decoded, 90).unwrap();
        let again = decode_scaled(&encoded, 8).unwrap().into_rgb8();
        assert_eq!(again.dimensions(), (100, 50));
        assert!(again.get_pixel(10, 25)[0] > 200);
    }

    #[test]
    fn a_jpeg_ends_with_an_end_marker_after_its_scan() {
        let app1_with_thumbnail_end = [0xFF, 0xE1, 0x00, 0x06, 0xFF, 0xD9, 0x00, 0x00];
        let sos = [0xFF, 0xDA, 0x00, 0x02, 0x12, 0xFF, 0x00, 0x34];
        let ends = |parts: &[&[u8]]| layout(&jpeg(parts)).ends;
        assert!(ends(&[&app1_with_thumbnail_end, &sos, &[0xFF, 0xD9]]));
        assert!(ends(&[&sos, &[0xFF, 0xD9, 0x00, 0x00]]), "trailing bytes after the end are fine");
        assert!(!ends(&[&app1_with_thumbnail_end, &sos]), "an EXIF thumbnail's end does not count");
        assert!(!ends(&[&app1_with_thumbnail_end]));
        assert!(!layout(&[0xFF, 0xD8]).ends);
    }

    #[test]
    fn a_progressive_frame_marks_a_progressive_jpeg() {
        let frame = |marker: u8| [0xFF, marker, 0x00, 0x03, 0x08];
        let sos = [0xFF, 0xDA, 0x00, 0x02, 0xFF, 0xD9];
        assert!(layout(&jpeg(&[&frame(0xC2), &sos])).progressive);
        assert!(!layout(&jpeg(&[&frame(0xC0), &sos])).progressive, "baseline");
        assert!(!layout(&jpeg(&[&sos, &frame(0xC2)])).progressive, "only segments before the scan count");
    }

    /// A JPEG of SOI and `parts`.
    fn jpeg(parts: &[&[u8]]) -> Vec<u8> {
        [&[0xFF, 0xD8][..]].iter().chain(parts).flat_map(|p| p.iter().copied()).collect()
    }

    #[test]
    fn garbage_is_an_error_with_libjpeg_turbos_message() {
        let error = decode_scaled(b"\xFF\xD8\xFF\xE0 not really a JPEG", 8).unwrap_err();
        assert!(!error.is_empty());
        assert!(!decodes(b"nothing"));
    }
}
