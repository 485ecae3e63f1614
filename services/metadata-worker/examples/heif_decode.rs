//! Measures `heif::decode`: decode time (median of several runs) and, under `/usr/bin/time -v`,
//! peak memory.
//!
//! ```text
//! heif_decode make WIDTH HEIGHT OUT.jpg   # a photo-like JPEG to feed heif-enc / avifenc
//! heif_decode decode FILE [RUNS]          # decodes FILE RUNS times (default 5)
//! ```

use std::time::Instant;

use image::imageops::{self, FilterType};
use image::{Rgb, RgbImage};
use imagepipe_metadata_worker::heif;
use imagepipe_runtime::config::MetadataConfig;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["make", width, height, out] => make(width.parse().expect("width"), height.parse().expect("height"), out),
        ["decode", file] => decode(file, 5),
        ["decode", file, runs] => decode(file, runs.parse().expect("runs")),
        _ => eprintln!("usage: heif_decode make WIDTH HEIGHT OUT.jpg | heif_decode decode FILE [RUNS]"),
    }
}

/// A quarter-size scene (gradient sky, a sun, a textured ground with sensor-like noise),
/// upscaled with Catmull-Rom as a phone's processing would leave it, saved as a quality-92 JPEG.
fn make(width: u32, height: u32, out: &str) {
    let (w, h) = (width / 4, height / 4);
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut noise = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % 41) as i32 - 20
    };
    let small = RgbImage::from_fn(w, h, |x, y| {
        let (u, v) = (x as f32 / w as f32, y as f32 / h as f32);
        let sun = ((u - 0.7).powi(2) + (v - 0.25).powi(2)).sqrt() < 0.08;
        let base = if sun {
            [255.0, 230.0, 120.0]
        } else if v < 0.55 {
            [90.0 + 60.0 * v, 140.0 + 60.0 * v, 230.0 - 40.0 * v]
        } else {
            let ridge = ((u * 40.0).sin() * (v * 25.0).cos()) * 30.0;
            [70.0 + ridge, 110.0 + 0.5 * ridge + 60.0 * u, 40.0]
        };
        let n = noise() as f32;
        Rgb(base.map(|c| (c + n).clamp(0.0, 255.0) as u8))
    });
    let big = imageops::resize(&small, width, height, FilterType::CatmullRom);
    big.save_with_format(out, image::ImageFormat::Jpeg).expect("writing the JPEG");
}

fn decode(file: &str, runs: usize) {
    let bytes = std::fs::read(file).expect("reading the file");
    let settings = MetadataConfig::default();
    let mut times = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        let (image, header) = heif::decode(&bytes, &settings, u32::MAX).expect("decoding");
        times.push(start.elapsed().as_secs_f64() * 1000.0);
        last = Some((image.width(), image.height(), header));
        drop(image);
    }
    times.sort_by(f64::total_cmp);
    let (width, height, header) = last.expect("at least one run");
    println!(
        "{file}: {width}x{height} {} bytes, median {:.1} ms of {runs} (min {:.1}, max {:.1}); \
         pixel_bytes {} MB, estimated peak {} MB",
        bytes.len(),
        times[times.len() / 2],
        times[0],
        times[times.len() - 1],
        header.pixel_bytes >> 20,
        header.peak_bytes() >> 20,
    );
}
