//! Fixtures shared by the download worker's tests: real images generated with the `image` crate,
//! a handler whose client may reach only loopback, and the Redis the per-host limiter shares.

#![allow(dead_code, reason = "each test binary uses part of the fixtures")]

use std::io::Cursor;
use std::sync::Arc;

use image::codecs::gif::{GifEncoder, Repeat};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::webp::WebPEncoder;
use image::{DynamicImage, ExtendedColorType, Frame, ImageEncoder, ImageFormat, Rgb, RgbImage, Rgba, RgbaImage};
use imagepipe_blob::LocalBlobStore;
use imagepipe_download_worker::DownloadHandler;
use imagepipe_download_worker::politeness::{HostPolicy, RedisLimiter};
use imagepipe_net::testing::LoopbackOnly;
use imagepipe_net::{GuardedClient, Limits, StaticResolver};

/// The test client's allowlist: the fixture servers on 127.0.0.1, nothing else.
pub const LOOPBACK: &str = "127.0.0.1/32";

/// A photo-like gradient.
pub fn rgb(width: u32, height: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| Rgb([(x * 4) as u8, (y * 4) as u8, ((x + y) * 2) as u8]))
}

/// A gradient with a transparent half.
pub fn rgba(width: u32, height: u32) -> RgbaImage {
    RgbaImage::from_fn(width, height, |x, y| {
        Rgba([(x * 4) as u8, (y * 4) as u8, 128, if x < width / 2 { 0 } else { 255 }])
    })
}

/// A JPEG whose EXIF names the camera and the place (48°51'30"N 2°17'40"E).
pub fn jpeg_with_exif_and_gps() -> Vec<u8> {
    let image = rgb(64, 48);
    let mut bytes = Vec::new();
    let mut encoder = JpegEncoder::new_with_quality(&mut bytes, 90);
    encoder.set_exif_metadata(exif_with_gps()).unwrap();
    encoder.write_image(image.as_raw(), 64, 48, ExtendedColorType::Rgb8).unwrap();
    bytes
}

/// A PNG with an alpha channel.
pub fn png_with_alpha() -> Vec<u8> {
    encode(DynamicImage::ImageRgba8(rgba(40, 30)), ImageFormat::Png)
}

/// A two-frame animated GIF.
pub fn animated_gif() -> Vec<u8> {
    let mut bytes = Vec::new();
    {
        let mut encoder = GifEncoder::new(&mut bytes);
        encoder.set_repeat(Repeat::Infinite).unwrap();
        let frames = [rgba(16, 16), RgbaImage::from_pixel(16, 16, Rgba([255, 0, 0, 255]))];
        encoder.encode_frames(frames.into_iter().map(Frame::new)).unwrap();
    }
    bytes
}

/// A lossless WebP.
pub fn webp() -> Vec<u8> {
    let image = rgba(24, 24);
    let mut bytes = Vec::new();
    WebPEncoder::new_lossless(&mut bytes).encode(image.as_raw(), 24, 24, ExtendedColorType::Rgba8).unwrap();
    bytes
}

/// A BMP.
pub fn bmp() -> Vec<u8> {
    encode(DynamicImage::ImageRgb8(rgb(8, 8)), ImageFormat::Bmp)
}

/// A TIFF.
pub fn tiff() -> Vec<u8> {
    encode(DynamicImage::ImageRgb8(rgb(8, 8)), ImageFormat::Tiff)
}

/// The first half of a JPEG: still a JPEG by its magic bytes, undecodable past the cut.
pub fn truncated_jpeg() -> Vec<u8> {
    let mut bytes = jpeg_with_exif_and_gps();
    bytes.truncate(bytes.len() / 2);
    bytes
}

/// A PNG of a few dozen bytes whose header claims 100 000 × 100 000 pixels.
pub fn pixel_bomb_png() -> Vec<u8> {
    let mut bytes = encode(DynamicImage::ImageLuma8(image::GrayImage::new(1, 1)), ImageFormat::Png);
    // IHDR's data starts after the signature (8), its length (4) and its type (4).
    bytes[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    bytes[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let crc = crc32(&bytes[12..29]);
    bytes[29..33].copy_from_slice(&crc.to_be_bytes());
    bytes
}

fn encode(image: DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut bytes = Cursor::new(Vec::new());
    image.write_to(&mut bytes, format).unwrap();
    bytes.into_inner()
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// A big-endian TIFF structure: IFD0 with Make and a GPS IFD with latitude and longitude.
fn exif_with_gps() -> Vec<u8> {
    fn entry(out: &mut Vec<u8>, tag: u16, kind: u16, count: u32, value: [u8; 4]) {
        out.extend_from_slice(&tag.to_be_bytes());
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        out.extend_from_slice(&value);
    }
    fn rationals(out: &mut Vec<u8>, values: [(u32, u32); 3]) {
        for (n, d) in values {
            out.extend_from_slice(&n.to_be_bytes());
            out.extend_from_slice(&d.to_be_bytes());
        }
    }
    const ASCII: u16 = 2;
    const LONG: u16 = 4;
    const RATIONAL: u16 = 5;
    let mut tiff = b"MM\x00\x2a\x00\x00\x00\x08".to_vec();
    tiff.extend_from_slice(&2u16.to_be_bytes());
    entry(&mut tiff, 0x010f, ASCII, 6, 38u32.to_be_bytes()); // Make, at 38
    entry(&mut tiff, 0x8825, LONG, 1, 44u32.to_be_bytes()); // GPS IFD, at 44
    tiff.extend_from_slice(&0u32.to_be_bytes());
    tiff.extend_from_slice(b"Canon\0");
    tiff.extend_from_slice(&4u16.to_be_bytes());
    entry(&mut tiff, 0x0001, ASCII, 2, *b"N\0\0\0");
    entry(&mut tiff, 0x0002, RATIONAL, 3, 98u32.to_be_bytes());
    entry(&mut tiff, 0x0003, ASCII, 2, *b"E\0\0\0");
    entry(&mut tiff, 0x0004, RATIONAL, 3, 122u32.to_be_bytes());
    tiff.extend_from_slice(&0u32.to_be_bytes());
    assert_eq!(tiff.len(), 98);
    rationals(&mut tiff, [(48, 1), (51, 1), (30, 1)]);
    rationals(&mut tiff, [(2, 1), (17, 1), (40, 1)]);
    tiff
}

/// A handler over a blob store in `dir`, whose client reaches only `allow` through
/// `resolver`, and refuses (and records) any dial beyond loopback.
pub async fn handler(
    dir: &std::path::Path,
    allow: &[&str],
    resolver: StaticResolver,
    limits: Limits,
) -> (DownloadHandler, Arc<LocalBlobStore>, LoopbackOnly) {
    let dial = LoopbackOnly::new();
    let client = GuardedClient::builder()
        .allow(allow.iter().map(|net| net.parse().unwrap()))
        .resolver(resolver)
        .dial_check(dial.clone())
        .limits(limits)
        .build()
        .unwrap();
    let blobs = Arc::new(LocalBlobStore::new(dir));
    (DownloadHandler::new(client, blobs.clone()), blobs, dial)
}

/// Where Redis runs for the tests (`scripts/redis.sh`); `IMAGEPIPE_TEST_REDIS_URL` overrides.
pub fn redis_url() -> String {
    std::env::var("IMAGEPIPE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A key prefix no other test uses.
pub fn unique_prefix(test: &str) -> String {
    format!("test-polite-{test}-{}", uuid::Uuid::new_v4().simple())
}

/// A [`RedisLimiter`] on its own connection, keys under `prefix`; `None` (after saying so, or
/// failing the test unless skips are allowed) when Redis is not running.
pub async fn redis_limiter(prefix: &str, policy: HostPolicy) -> Option<RedisLimiter> {
    redis_limiter_at(&redis_url(), prefix, policy).await
}

/// A [`RedisLimiter`] at `url` (a server or a cluster), as [`redis_limiter`].
pub async fn redis_limiter_at(url: &str, prefix: &str, policy: HostPolicy) -> Option<RedisLimiter> {
    match RedisLimiter::connect(url, prefix, policy).await {
        Ok(limiter) => Some(limiter),
        Err(error) => {
            imagepipe_contracts::testing::environment_missing(&format!(
                "Redis at {url} is not reachable ({error}): run scripts/redis.sh"
            ));
            None
        }
    }
}

/// The Redis Cluster of the tests (`scripts/redis-cluster.sh`), or `None` after
/// [`environment_missing`](imagepipe_contracts::testing::environment_missing) allowed a skip.
pub fn redis_cluster_url() -> Option<String> {
    let found = imagepipe_contracts::testing::redis_urls().into_iter().find(|(name, _)| *name == "cluster");
    found.map(|(_, url)| url)
}

/// Deletes every key under a prefix on the Redis Cluster of the tests when dropped.
pub struct ClusterCleanup(pub String);

impl Drop for ClusterCleanup {
    fn drop(&mut self) {
        let Ok(url) = std::env::var(imagepipe_contracts::testing::REDIS_CLUSTER_URL_ENV) else { return };
        let pattern = format!("{}:*", self.0);
        // Drop runs inside the test's runtime: clean up on a thread with its own.
        let cleaning = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async {
                let mut conn = imagepipe_runtime::redis_connection::RedisConnection::open(&url).await.ok()?;
                let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query_async(&mut conn).await.ok()?;
                for key in keys {
                    let _: redis::RedisResult<()> = redis::cmd("DEL").arg(key).query_async(&mut conn).await;
                }
                Some(())
            })
        });
        let _ = cleaning.join();
    }
}

/// Deletes every key under a Redis prefix when dropped.
pub struct RedisCleanup(pub String);

impl Drop for RedisCleanup {
    fn drop(&mut self) {
        let Ok(mut conn) = redis::Client::open(redis_url()).and_then(|c| c.get_connection()) else { return };
        let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{}:*", self.0)).query(&mut conn).unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}
