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

#[cfg(test)]
mod tests {
    use super::*;

    fn png_chunk(kind: &[u8], data: &[u8]) -> Vec<u8> {
        let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
        chunk.extend_from_slice(kind);
        chunk.extend_from_slice(data);
        chunk.extend_from_slice(&[0; 4]); // CRC, not checked here
        chunk
    }

    #[test]
    fn apng_frames_come_from_the_animation_control_chunk() {
        let ihdr = png_chunk(b"IHDR", &[0; 13]);
        let actl = png_chunk(b"acTL", &[0, 0, 0, 12, 0, 0, 0, 0]);
        let idat = png_chunk(b"IDAT", &[1, 2, 3]);
        let png = |chunks: &[&[u8]]| {
            [&b"\x89PNG\r\n\x1a\n"[..]].iter().chain(chunks).flat_map(|c| c.to_vec()).collect::<Vec<u8>>()
        };
        assert_eq!(frame_count(ImageFormat::Png, &png(&[&ihdr, &actl, &idat])), 12);
        assert_eq!(frame_count(ImageFormat::Png, &png(&[&ihdr, &idat, &actl])), 1, "acTL after IDAT is ignored");
        assert_eq!(frame_count(ImageFormat::Png, &png(&[&ihdr, &idat])), 1);
    }

    #[test]
    fn truncated_or_foreign_containers_count_what_is_there() {
        assert_eq!(frame_count(ImageFormat::Gif, b"GIF89a"), 1);
        assert_eq!(frame_count(ImageFormat::WebP, b"RIFF\0\0\0\0WAVE"), 1);
        assert_eq!(frame_count(ImageFormat::Jpeg, b"\xFF\xD8"), 1);
        // Two complete frames and a third cut off in its image data.
        let frame = [0x2C, 0, 0, 0, 0, 1, 0, 1, 0, 0x00, 0x02, 0x02, 0x4C, 0x01, 0x00];
        let mut gif = b"GIF89a\x01\x00\x01\x00\x00\x00\x00".to_vec();
        gif.extend_from_slice(&frame);
        gif.extend_from_slice(&frame);
        gif.extend_from_slice(&frame[..12]);
        assert_eq!(frame_count(ImageFormat::Gif, &gif), 2);
    }
}
