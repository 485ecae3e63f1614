//! Deterministic randomness for HNSW levels, and synthetic clustered vectors for the tests and
//! [`crate::bench`].

use imagepipe_contracts::Embedding;

/// SplitMix64: small, fast and reproducible from its seed.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never 0, so its logarithm is finite.
    pub(crate) fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Standard normal (Box–Muller).
    pub(crate) fn normal(&mut self) -> f32 {
        let (u, v) = (self.unit(), self.unit());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

/// Vectors scattered around a number of random centres, like embeddings of images that fall
/// into groups of similar scenes.
#[derive(Debug, Clone)]
pub(crate) struct Clusters {
    centres: Vec<Vec<f32>>,
    spread: f32,
    non_negative: bool,
}

impl Clusters {
    /// `count` centres in `dim` dimensions; each point is its centre plus normal noise of
    /// `spread` per component. `non_negative` clips centres and points at zero, like the real
    /// model's features after ReLU6, so all cosines are positive; otherwise components are signed.
    pub(crate) fn new(rng: &mut Rng, count: usize, dim: usize, spread: f32, non_negative: bool) -> Self {
        let clip = |v: f32| if non_negative { v.max(0.0) } else { v };
        let centres = (0..count.max(1)).map(|_| (0..dim).map(|_| clip(rng.normal())).collect()).collect();
        Self { centres, spread, non_negative }
    }

    /// One point near a random centre.
    pub(crate) fn point(&self, rng: &mut Rng) -> Vec<f32> {
        let centre = &self.centres[rng.below(self.centres.len())];
        centre
            .iter()
            .map(|&c| {
                let v = c + self.spread * rng.normal();
                if self.non_negative { v.max(0.0) } else { v }
            })
            .collect()
    }

    /// One point as the embedding the AI worker would publish, labelled `version`.
    pub(crate) fn embedding(&self, rng: &mut Rng, version: &str) -> Embedding {
        loop {
            if let Ok(embedding) = Embedding::from_features(version, &self.point(rng)) {
                return embedding;
            }
        }
    }
}
