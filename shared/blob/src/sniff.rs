//! What a body is, judged by its first bytes (magic numbers); the Content-Type header is not
//! trusted. Images are named by the `format` the pipeline reports; anything else gets a short
//! description for the `not an image (detected: …)` error.

/// An image format recognised by its signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// JPEG (`FF D8 FF`).
    Jpeg,
    /// PNG (`89 50 4E 47 0D 0A 1A 0A`).
    Png,
    /// GIF (`GIF87a`, `GIF89a`).
    Gif,
    /// WebP (`RIFF····WEBP`).
    Webp,
    /// BMP (`BM` with a known DIB header size).
    Bmp,
    /// TIFF (`II*\0`, `MM\0*`).
    Tiff,
    /// AVIF (ISO-BMFF `ftyp` with an `avif`/`avis` brand).
    Avif,
    /// HEIF/HEIC (ISO-BMFF `ftyp` with a `heic`/`heix`/`mif1`/... brand).
    Heic,
    /// Windows icon (`00 00 01 00`).
    Ico,
}

impl ImageFormat {
    /// The name in `DownloadOutput.format`: `jpeg`, `png`, `gif`, `webp`, `bmp`, `tiff`, `avif`,
    /// `heic`, `ico`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "jpeg",
            ImageFormat::Png => "png",
            ImageFormat::Gif => "gif",
            ImageFormat::Webp => "webp",
            ImageFormat::Bmp => "bmp",
            ImageFormat::Tiff => "tiff",
            ImageFormat::Avif => "avif",
            ImageFormat::Heic => "heic",
            ImageFormat::Ico => "ico",
        }
    }

    /// The media type to serve it with (`image/jpeg`, `image/webp`, `image/heic`, ...).
    pub const fn content_type(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "image/jpeg",
            ImageFormat::Png => "image/png",
            ImageFormat::Gif => "image/gif",
            ImageFormat::Webp => "image/webp",
            ImageFormat::Bmp => "image/bmp",
            ImageFormat::Tiff => "image/tiff",
            ImageFormat::Avif => "image/avif",
            ImageFormat::Heic => "image/heic",
            ImageFormat::Ico => "image/vnd.microsoft.icon",
        }
    }
}

/// What the bytes turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniffed {
    /// An image.
    Image(ImageFormat),
    /// Something else, described (`text`, `html`, `pdf`, `zip`, `empty`, `unknown binary`, ...).
    Other(&'static str),
}

/// DIB header sizes a real BMP carries (BITMAPCOREHEADER to BITMAPV5HEADER).
const BMP_DIB_SIZES: [u32; 7] = [12, 16, 40, 52, 56, 108, 124];

/// Non-image signatures worth naming in an error.
const OTHER_SIGNATURES: [(&[u8], &str); 8] = [
    (b"%PDF-", "pdf"),
    (b"PK\x03\x04", "zip"),
    (b"\x1f\x8b", "gzip"),
    (b"\x7fELF", "elf executable"),
    (b"MZ", "windows executable"),
    (b"\x1aE\xdf\xa3", "matroska/webm video"),
    (b"OggS", "ogg"),
    (b"ID3", "mp3"),
];

/// Judges `bytes` by their signature.
pub fn sniff(bytes: &[u8]) -> Sniffed {
    if let Some(format) = image_format(bytes) {
        return Sniffed::Image(format);
    }
    Sniffed::Other(describe_other(bytes))
}

fn image_format(b: &[u8]) -> Option<ImageFormat> {
    let format = match b {
        [0xff, 0xd8, 0xff, ..] => ImageFormat::Jpeg,
        [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, ..] => ImageFormat::Png,
        [b'G', b'I', b'F', b'8', b'7' | b'9', b'a', ..] => ImageFormat::Gif,
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => ImageFormat::Webp,
        [b'I', b'I', 0x2a, 0x00, ..] | [b'M', b'M', 0x00, 0x2a, ..] => ImageFormat::Tiff,
        [b'B', b'M', rest @ ..] if rest.len() >= 16 => {
            let dib = u32::from_le_bytes([rest[12], rest[13], rest[14], rest[15]]);
            if !BMP_DIB_SIZES.contains(&dib) {
                return None;
            }
            ImageFormat::Bmp
        }
        [0x00, 0x00, 0x01, 0x00, count_lo, count_hi, ..] if u16::from_le_bytes([*count_lo, *count_hi]) > 0 => {
            ImageFormat::Ico
        }
        [_, _, _, _, b'f', b't', b'y', b'p', brand @ ..] if brand.len() >= 4 => iso_bmff_image(&brand[..4])?,
        _ => return None,
    };
    Some(format)
}

fn iso_bmff_image(brand: &[u8]) -> Option<ImageFormat> {
    match brand {
        b"avif" | b"avis" => Some(ImageFormat::Avif),
        b"heic" | b"heix" | b"heim" | b"heis" | b"hevc" | b"hevx" | b"mif1" | b"msf1" => Some(ImageFormat::Heic),
        _ => None,
    }
}

fn describe_other(bytes: &[u8]) -> &'static str {
    if bytes.is_empty() {
        return "empty";
    }
    if let Some((_, name)) = OTHER_SIGNATURES.iter().find(|(magic, _)| bytes.starts_with(magic)) {
        return name;
    }
    if bytes.len() >= 8 && &bytes[4..8] == b"ftyp" {
        return "iso media (video or audio)";
    }
    let head = &bytes[..bytes.len().min(1024)];
    let text = match std::str::from_utf8(head) {
        Ok(text) => text,
        // A multi-byte character cut at the end of the window is still text.
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default(),
        Err(_) => return "unknown binary",
    };
    if text.chars().any(|c| c.is_control() && !c.is_whitespace()) {
        return "unknown binary";
    }
    let start = text.trim_start_matches('\u{feff}').trim_start().to_ascii_lowercase();
    if start.starts_with("<!doctype html") || start.starts_with("<html") {
        "html"
    } else if start.starts_with("<svg") || (start.starts_with("<?xml") && start.contains("<svg")) {
        "svg (vector images are not supported)"
    } else if start.starts_with("<?xml") {
        "xml"
    } else if start.starts_with('{') || start.starts_with('[') {
        "json"
    } else {
        "text"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bmp_header(dib: u32) -> Vec<u8> {
        let mut header = b"BM".to_vec();
        header.extend_from_slice(&[0; 12]);
        header.extend_from_slice(&dib.to_le_bytes());
        header
    }

    #[test]
    fn image_signatures_are_recognised() {
        let table: &[(&[u8], ImageFormat)] = &[
            (b"\xff\xd8\xff\xe0\x00\x10JFIF", ImageFormat::Jpeg),
            (b"\xff\xd8\xff\xe1", ImageFormat::Jpeg),
            (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", ImageFormat::Png),
            (b"GIF87a\x01\x00", ImageFormat::Gif),
            (b"GIF89a\x01\x00", ImageFormat::Gif),
            (b"RIFF\x24\x00\x00\x00WEBPVP8 ", ImageFormat::Webp),
            (b"II*\x00\x08\x00\x00\x00", ImageFormat::Tiff),
            (b"MM\x00*\x00\x00\x00\x08", ImageFormat::Tiff),
            (b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00", ImageFormat::Avif),
            (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00", ImageFormat::Heic),
            (b"\x00\x00\x00\x18ftypmif1\x00\x00\x00\x00", ImageFormat::Heic),
            (b"\x00\x00\x01\x00\x01\x00\x10\x10", ImageFormat::Ico),
        ];
        for (bytes, format) in table {
            assert_eq!(sniff(bytes), Sniffed::Image(*format), "{bytes:?}");
        }
        for dib in BMP_DIB_SIZES {
            assert_eq!(sniff(&bmp_header(dib)), Sniffed::Image(ImageFormat::Bmp), "DIB {dib}");
        }
    }

    #[test]
    fn lookalikes_are_not_images() {
        assert_eq!(sniff(b"BM is how this text starts, not a bitmap"), Sniffed::Other("text"));
        assert_eq!(sniff(&bmp_header(41)), Sniffed::Other("unknown binary"));
        assert_eq!(sniff(b"RIFF\x24\x00\x00\x00WAVEfmt "), Sniffed::Other("unknown binary"));
        assert_eq!(sniff(b"\x00\x00\x00\x18ftypisom\x00\x00"), Sniffed::Other("iso media (video or audio)"));
        assert_eq!(sniff(b"GIF90a"), Sniffed::Other("text"));
        assert_eq!(sniff(b"\xff\xd8"), Sniffed::Other("unknown binary"), "two bytes are not a JPEG");
    }

    #[test]
    fn other_content_is_described() {
        let table: &[(&[u8], &str)] = &[
            (b"", "empty"),
            (b"hello, this is not a picture\n", "text"),
            (b"  <!DOCTYPE html><html>", "html"),
            (b"<HTML><body>", "html"),
            (
                b"<?xml version=\"1.0\"?><svg xmlns=\"http://www.w3.org/2000/svg\"/>",
                "svg (vector images are not supported)",
            ),
            (b"<?xml version=\"1.0\"?><feed/>", "xml"),
            (b"{\"error\": \"not found\"}", "json"),
            (b"%PDF-1.7\n", "pdf"),
            (b"PK\x03\x04\x14\x00", "zip"),
            (b"\x1f\x8b\x08\x00", "gzip"),
            (b"\x00\x01\x02\x03\x04", "unknown binary"),
        ];
        for (bytes, described) in table {
            assert_eq!(sniff(bytes), Sniffed::Other(described), "{bytes:?}");
        }
        let long_text = "caf\u{e9} ".repeat(300);
        assert_eq!(sniff(long_text.as_bytes()), Sniffed::Other("text"), "a character cut at the window's end");
    }
}
