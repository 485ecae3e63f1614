//! Metadata throughput: images per second through `extract` (decode, EXIF, colours, hashes,
//! blurhash, thumbnail) on photo-sized JPEGs, on one thread and on every core.
//!
//! `cargo bench -p imagepipe-metadata-worker --bench extract`; prints the median of the rounds.

use std::io::Cursor;
use std::time::Instant;

use image::codecs::jpeg::JpegEncoder;
use image::{ImageEncoder, Rgb, RgbImage};
use imagepipe_metadata_worker::extract;
use imagepipe_runtime::config::MetadataConfig;

const ROUNDS: usize = 7;

/// A `width`×`height` "photo": smooth gradients, a few soft shapes and sensor-like noise, as a
/// quality-90 JPEG (about the size of a phone photo at this resolution).
fn photo(width: u32, height: u32, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 25) as f64 - 12.0
    };
    let (w, h) = (f64::from(width), f64::from(height));
    let image = RgbImage::from_fn(width, height, |x, y| {
        let (u, v) = (f64::from(x) / w, f64::from(y) / h);
        let sky = 1.0 - v;
        let sun = (-((u - 0.7).powi(2) + (v - 0.25).powi(2)) * 40.0).exp();
        let hill = if v > 0.6 + 0.1 * (u * 9.0 + seed as f64).sin() { 1.0 } else { 0.0 };
        let r = 60.0 + 120.0 * sky + 150.0 * sun - 30.0 * hill;
        let g = 90.0 + 100.0 * sky + 120.0 * sun + 40.0 * hill;
        let b = 140.0 + 110.0 * sky - 60.0 * hill;
        let mut px = |c: f64| (c + noise()).clamp(0.0, 255.0) as u8;
        Rgb([px(r), px(g), px(b)])
    });
    let mut bytes = Vec::new();
    JpegEncoder::new_with_quality(Cursor::new(&mut bytes), 90)
        .write_image(&image, width, height, image::ExtendedColorType::Rgb8)
        .expect("encoding a JPEG in memory");
    bytes
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let settings = MetadataConfig::default();
    let photos: Vec<Vec<u8>> =
        [(1600, 1200, 1), (1200, 1600, 2), (1920, 1080, 3), (1024, 768, 4)].map(|(w, h, s)| photo(w, h, s)).to_vec();
    let pixels: u64 = [1600 * 1200, 1200 * 1600, 1920 * 1080, 1024 * 768].iter().sum();
    let kib: usize = photos.iter().map(Vec::len).sum::<usize>() / 1024;
    println!(
        "{} JPEGs, {:.1} MP on average, {} KiB in all; {} rounds",
        photos.len(),
        pixels as f64 / photos.len() as f64 / 1e6,
        kib,
        ROUNDS
    );
    for bytes in &photos {
        extract(bytes, &settings).expect("the sample photos decode"); // warm-up
    }

    let single: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            for bytes in &photos {
                std::hint::black_box(extract(bytes, &settings).expect("decodes"));
            }
            photos.len() as f64 / started.elapsed().as_secs_f64()
        })
        .collect();
    println!(
        "metadata, 1 thread:   median {:.1} images/s (ms per image: {:.1})",
        median(single.clone()),
        1000.0 / median(single)
    );

    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let parallel: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            std::thread::scope(|scope| {
                for t in 0..threads {
                    let (photos, settings) = (&photos, &settings);
                    scope.spawn(move || {
                        for bytes in photos.iter().cycle().skip(t).take(photos.len()) {
                            std::hint::black_box(extract(bytes, settings).expect("decodes"));
                        }
                    });
                }
            });
            (threads * photos.len()) as f64 / started.elapsed().as_secs_f64()
        })
        .collect();
    println!("metadata, {threads} threads:  median {:.1} images/s", median(parallel));
}
