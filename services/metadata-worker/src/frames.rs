//! Frame counts of animations, read from the container without decoding any frame: GIF image
//! descriptors, WebP `ANMF` chunks, the APNG `acTL` chunk. Truncated containers count the frames
//! present.

use image::ImageFormat;

/// Frames of the animation in `bytes`; 1 for still images and formats without animation.
pub fn frame_count(format: ImageFormat, bytes: &[u8]) -> u32 {
    let frames = match format {
        ImageFormat::Gif => gif_frames(bytes),
        ImageFormat::WebP => webp_frames(bytes),
        ImageFormat::Png => apng_frames(bytes),
        _ => 1,
    };
    frames.max(1)
}

/// Counts image descriptors, skipping colour tables, extensions and LZW data.
fn gif_frames(bytes: &[u8]) -> u32 {
    const HEADER_AND_SCREEN: usize = 13;
    let Some(&screen_flags) = bytes.get(10) else { return 0 };
    let mut pos = HEADER_AND_SCREEN + color_table_len(screen_flags);
    let mut frames = 0;
    loop {
        match bytes.get(pos) {
            Some(0x21) => match skip_sub_blocks(bytes, pos + 2) {
                Some(next) => pos = next,
                None => return frames,
            },
            Some(0x2C) => {
                let Some(&flags) = bytes.get(pos + 9) else { return frames };
                // Descriptor (10 bytes), local colour table, LZW minimum code size, data.
                match skip_sub_blocks(bytes, pos + 10 + color_table_len(flags) + 1) {
                    Some(next) => {
                        frames += 1;
                        pos = next;
                    }
                    None => return frames,
                }
            }
            _ => return frames,
        }
    }
}

fn color_table_len(flags: u8) -> usize {
    if flags & 0x80 == 0 { 0 } else { 3 << ((flags & 0x07) + 1) }
}

/// The position after a chain of data sub-blocks starting at `pos`, if it is complete.
fn skip_sub_blocks(bytes: &[u8], mut pos: usize) -> Option<usize> {
    loop {
        let len = usize::from(*bytes.get(pos)?);
        pos += 1;
        if len == 0 {
            return Some(pos);
        }
        pos += len;
    }
}

/// Counts `ANMF` chunks of a RIFF WebP.
fn webp_frames(bytes: &[u8]) -> u32 {
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WEBP" {
        return 0;
    }
    let mut pos = 12;
    let mut frames = 0;
    while let Some(header) = bytes.get(pos..pos + 8) {
        let size = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if &header[..4] == b"ANMF" {
            frames += 1;
        }
        pos = pos.saturating_add(8).saturating_add(size).saturating_add(size & 1);
    }
    frames
}

/// `num_frames` of the APNG `acTL` chunk, which must precede the image data.
fn apng_frames(bytes: &[u8]) -> u32 {
    const SIGNATURE: usize = 8;
    let mut pos = SIGNATURE;
    while let Some(header) = bytes.get(pos..pos + 8) {
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        match &header[4..8] {
            b"acTL" => {
                return bytes.get(pos + 8..pos + 12).map_or(0, |n| u32::from_be_bytes([n[0], n[1], n[2], n[3]]));
            }
            b"IDAT" | b"IEND" => return 0,
            _ => pos = pos.saturating_add(12).saturating_add(len),
        }
    }
    0
}
