//! CPU time of the metadata stage per image: `extract` (decode, EXIF, colours, hashes, every
//! derivative) on every image of each directory, as the `imagepipe bench --photos` metadata probe
//! runs it, without the rest of the pipeline. Process CPU time, every thread (libheif decodes on
//! threads of its own), after one round not counted. Each round also runs `extract_with` given
//! a spare core (the largest derivative encoded on a second thread, as the worker does when a
//! core is free), right after the one-thread run of the same image: wall and CPU time of both,
//! side by side.
//!
//! ```text
//! stage_cpu [--rounds N] DIR...   # per DIR: the median and the range of the files' medians
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use cpu_time::ProcessTime;
use imagepipe_metadata_worker::{extract, extract_with};
use imagepipe_runtime::config::MetadataConfig;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut rounds = 5;
    if let Some(at) = args.iter().position(|a| a == "--rounds") {
        rounds = args.get(at + 1).and_then(|r| r.parse().ok()).expect("--rounds N");
        args.drain(at..at + 2);
    }
    if args.is_empty() {
        eprintln!("usage: stage_cpu [--rounds N] DIR...");
        std::process::exit(2);
    }
    let settings = MetadataConfig::default();
    let hevc = imagepipe_metadata_worker::heif::hevc_decoder();
    println!("libheif {}, HEVC decoder: {}", hevc.libheif, hevc.name.as_deref().unwrap_or("none"));
    for dir in &args {
        measure(Path::new(dir), &settings, rounds);
    }
}

fn measure(dir: &Path, settings: &MetadataConfig, rounds: usize) {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("reading the directory")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let photos: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(p).expect("reading")))
        .collect();
    let mut all = Vec::new();
    let mut per_file = Vec::new();
    let (mut walls, mut spared_walls, mut spared_cpu) = (Vec::new(), Vec::new(), Vec::new());
    for (name, bytes) in &photos {
        let mut times = Vec::with_capacity(rounds);
        for round in 0..=rounds {
            let (started, wall) = (ProcessTime::now(), Instant::now());
            let extracted = extract(bytes, settings).unwrap_or_else(|e| panic!("{name}: {e}"));
            let (spent, took) = (started.elapsed(), wall.elapsed());
            std::hint::black_box(&extracted);
            let (started, wall) = (ProcessTime::now(), Instant::now());
            let spared = extract_with(bytes, settings, || Some(())).unwrap_or_else(|e| panic!("{name}: {e}"));
            let (spared_spent, spared_took) = (started.elapsed(), wall.elapsed());
            std::hint::black_box(&spared);
            if round > 0 {
                times.push(spent);
                walls.push(took);
                spared_walls.push(spared_took);
                spared_cpu.push(spared_spent);
            }
        }
        times.sort();
        all.extend_from_slice(&times);
        per_file.push((name.clone(), times[times.len() / 2]));
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    all.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let files: Vec<String> = per_file.iter().map(|(n, t)| format!("{n} {:.1}", ms(*t))).collect();
    println!(
        "{}: median {:.1} ms CPU per image ({} images × {rounds} rounds; per file: {})",
        dir.display(),
        ms(all[all.len() / 2]),
        photos.len(),
        files.join(", ")
    );
    println!(
        "  one thread: median wall {:.1} ms; given a spare core: median wall {:.1} ms, CPU {:.1} ms",
        ms(median(walls)),
        ms(median(spared_walls)),
        ms(median(spared_cpu))
    );
}
