//! The indexes measured at a given scale, on synthetic clustered embeddings: insert time, query
//! latency of the exact scan and of the HNSW graph, the graph's recall, memory per image, and the
//! perceptual-hash scan. One place for the `scale` example and `imagepipe bench --scenario
//! similarity`.

use std::fmt;
use std::time::{Duration, Instant};

use imagepipe_contracts::Embedding;

use crate::phash::PhashIndex;
use crate::synthetic::{Clusters, Rng};
use crate::vector::VectorIndex;

/// Components of the real model's embeddings (EfficientNet-Lite0's pooled features).
pub const DIM: usize = 1280;
/// Images asked for per query, and the depth recall is measured at.
pub const TOP: usize = 10;
/// Images per synthetic cluster, on average.
const CLUSTER_SIZE: usize = 100;
/// Noise around a cluster's centre, per component (the centre's are standard normal, clipped).
const SPREAD: f32 = 1.0;
/// Hash distance a perceptual-hash query accepts (the indexer's default).
const PHASH_MAX_DISTANCE: u32 = 6;
/// Version label of the synthetic embeddings.
const VERSION: &str = "bench@1/synthetic";

/// Latency percentiles of a series of queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Latency {
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Slowest.
    pub max: Duration,
}

impl Latency {
    fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        let at = |q: f64| {
            samples.get(((samples.len() as f64 * q).ceil() as usize).saturating_sub(1)).copied().unwrap_or_default()
        };
        Self { p50: at(0.50), p99: at(0.99), max: samples.last().copied().unwrap_or_default() }
    }
}

/// What [`scale`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleReport {
    /// Images indexed.
    pub images: usize,
    /// Components per embedding.
    pub dim: usize,
    /// Queries timed per path.
    pub queries: usize,
    /// The `exact_limit` of the index measured through its graph.
    pub exact_limit: usize,
    /// Inserting every image into an index that only scans.
    pub exact_insert: Duration,
    /// Inserting every image into the index with the graph (the linking each insert does
    /// included).
    pub graph_insert: Duration,
    /// Latency of one insert into the index with the graph.
    pub graph_insert_latency: Latency,
    /// [`VectorIndex::catch_up`] linking the images the graph did not hold yet after the last
    /// insert (all but a few when `exact_limit` is close to `images`: the whole build).
    pub graph_catch_up: Duration,
    /// Top-[`TOP`] query latency of the exact scan.
    pub exact_latency: Latency,
    /// Top-[`TOP`] query latency through the graph.
    pub graph_latency: Latency,
    /// Share of the exact top [`TOP`] the graph found, over all queries.
    pub recall: f64,
    /// [`VectorIndex::memory_bytes`] of the scanning index.
    pub exact_bytes: usize,
    /// [`VectorIndex::memory_bytes`] of the index with the graph.
    pub graph_bytes: usize,
    /// Latency of [`PhashIndex::nearest`] over as many random hashes.
    pub phash_latency: Latency,
}

/// Measures `images` synthetic 1,280-component embeddings (see [`scale_with_dim`]).
pub fn scale(images: usize, queries: usize, exact_limit: usize) -> ScaleReport {
    scale_with_dim(images, DIM, queries, exact_limit)
}

/// Indexes `images` synthetic embeddings of `dim` components (clustered, non-negative like the
/// real model's) twice — once scanning only, once with the graph from `exact_limit` images on —
/// and times `queries` top-[`TOP`] searches for fresh images of the same clusters on each, and as
/// many perceptual-hash lookups over `images` random hashes.
pub fn scale_with_dim(images: usize, dim: usize, queries: usize, exact_limit: usize) -> ScaleReport {
    let mut rng = Rng::new(0x5ca1e);
    let clusters = Clusters::new(&mut rng, images.div_ceil(CLUSTER_SIZE), dim, SPREAD, true);
    let embeddings: Vec<Embedding> = (0..images).map(|_| clusters.embedding(&mut rng, VERSION)).collect();
    let probes: Vec<Embedding> = (0..queries).map(|_| clusters.embedding(&mut rng, VERSION)).collect();

    let (exact, exact_insert, _) = indexed(&embeddings, usize::MAX);
    let (mut graph, graph_insert, graph_insert_latency) = indexed(&embeddings, exact_limit);
    let started = Instant::now();
    graph.catch_up(usize::MAX);
    let graph_catch_up = started.elapsed();

    let mut exact_times = Vec::with_capacity(queries);
    let mut graph_times = Vec::with_capacity(queries);
    let mut found = 0;
    let mut expected = 0;
    for probe in &probes {
        let started = Instant::now();
        let truth = exact.search(probe, TOP, -1.0).expect("the probes fit the index");
        exact_times.push(started.elapsed());
        let started = Instant::now();
        let approximate = graph.search(probe, TOP, -1.0).expect("the probes fit the index");
        graph_times.push(started.elapsed());
        expected += truth.len();
        found += truth.iter().filter(|hit| approximate.iter().any(|other| other.id == hit.id)).count();
    }

    let mut hashes = PhashIndex::default();
    for image in 0..images {
        hashes.insert(&format!("image-{image}"), rng.next_u64());
    }
    let phash_times = (0..queries)
        .map(|_| {
            let probe = rng.next_u64();
            let started = Instant::now();
            std::hint::black_box(hashes.nearest(probe, PHASH_MAX_DISTANCE, 32));
            started.elapsed()
        })
        .collect();

    ScaleReport {
        images,
        dim,
        queries,
        exact_limit,
        exact_insert,
        graph_insert,
        graph_insert_latency,
        graph_catch_up,
        exact_latency: Latency::of(exact_times),
        graph_latency: Latency::of(graph_times),
        recall: if expected == 0 { 1.0 } else { found as f64 / expected as f64 },
        exact_bytes: exact.memory_bytes(),
        graph_bytes: graph.memory_bytes(),
        phash_latency: Latency::of(phash_times),
    }
}

/// An index of `embeddings` (ids `image-0`…), the time inserting them took, and the latency of
/// one insert.
fn indexed(embeddings: &[Embedding], exact_limit: usize) -> (VectorIndex, Duration, Latency) {
    let mut index = VectorIndex::new(VERSION, exact_limit);
    let mut times = Vec::with_capacity(embeddings.len());
    for (image, embedding) in embeddings.iter().enumerate() {
        let id = format!("image-{image}");
        let started = Instant::now();
        index.insert(&id, embedding).expect("synthetic embeddings are valid");
        times.push(started.elapsed());
    }
    let total = times.iter().sum();
    (index, total, Latency::of(times))
}

impl fmt::Display for ScaleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per_image = |total: Duration| total.as_secs_f64() * 1e6 / self.images.max(1) as f64;
        let bytes = |total: usize| total as f64 / self.images.max(1) as f64;
        writeln!(f, "{} images of {} components, {} queries for the top {TOP}", self.images, self.dim, self.queries)?;
        writeln!(
            f,
            "  exact scan:    insert {:.2?} ({:.1} µs/image), query p50 {:.2?} p99 {:.2?} max {:.2?}, {:.0} bytes/image",
            self.exact_insert,
            per_image(self.exact_insert),
            self.exact_latency.p50,
            self.exact_latency.p99,
            self.exact_latency.max,
            bytes(self.exact_bytes),
        )?;
        writeln!(
            f,
            "  HNSW (graph past {} images): insert {:.2?} ({:.1} µs/image; one insert p50 {:.2?} p99 {:.2?} max {:.2?}) + catch-up {:.2?}, query p50 {:.2?} p99 {:.2?} max {:.2?}, recall@{TOP} {:.4}, {:.0} bytes/image",
            self.exact_limit,
            self.graph_insert,
            per_image(self.graph_insert),
            self.graph_insert_latency.p50,
            self.graph_insert_latency.p99,
            self.graph_insert_latency.max,
            self.graph_catch_up,
            self.graph_latency.p50,
            self.graph_latency.p99,
            self.graph_latency.max,
            self.recall,
            bytes(self.graph_bytes),
        )?;
        write!(
            f,
            "  phash scan (within {PHASH_MAX_DISTANCE} bits, top 32): query p50 {:.2?} p99 {:.2?} max {:.2?}",
            self.phash_latency.p50, self.phash_latency.p99, self.phash_latency.max,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_reports_every_figure() {
        let report = scale_with_dim(600, 32, 20, 100);
        assert_eq!((report.images, report.dim, report.queries, report.exact_limit), (600, 32, 20, 100));
        assert!(report.recall >= 0.8, "{report}");
        assert!(report.graph_bytes > report.exact_bytes);
        assert!(report.exact_latency.p50 <= report.exact_latency.p99);
        let text = report.to_string();
        for part in
            ["600 images of 32 components", "exact scan", "HNSW (graph past 100 images)", "recall@10", "phash scan"]
        {
            assert!(text.contains(part), "{text}");
        }
    }
}
