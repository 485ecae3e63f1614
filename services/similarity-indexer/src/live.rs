//! [`LiveIndex`]: the in-memory read model every replica answers from — the vector index per
//! embedding version, the perceptual hashes, each task's thumbnail and near pairs — following the
//! store's change log ([`LiveIndex::sync`]). A new epoch in the store (a rebuild) makes it drop
//! what it holds and read the log from the start.

use std::collections::HashMap;
use std::sync::RwLock;

use imagepipe_contracts::Embedding;
use imagepipe_runtime::config::SimilarityConfig;
use imagepipe_similarity::{PhashIndex, VectorIndex, hamming};
use serde::{Deserialize, Serialize};

use crate::store::{Entry, Pair, SimilarityStore, StoreError};

/// Changes read from the store per call while syncing.
const SYNC_PAGE: usize = 128;
/// Most near images kept per image (by cosine and by hash each).
const NEAR: usize = 32;

/// One similar image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Similar {
    /// The task.
    pub task_id: String,
    /// Cosine of the two embeddings (1 = same direction).
    pub cosine: f64,
    /// Hamming distance of the two perceptual hashes, when both have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phash_distance: Option<u32>,
    /// Blob key of its thumbnail, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thumbnail_key: Option<String>,
}

/// What the index keeps of each task besides its vector and hash.
#[derive(Debug, Clone)]
struct Known {
    created: u64,
    thumbnail_key: Option<String>,
    phash: Option<u64>,
    version: Option<String>,
    pairs: Vec<Pair>,
}

#[derive(Default)]
struct State {
    epoch: u64,
    cursor: u64,
    vectors: HashMap<String, VectorIndex>,
    phashes: PhashIndex,
    known: HashMap<String, Known>,
}

/// The in-memory index of one replica (see the module docs).
pub struct LiveIndex {
    config: SimilarityConfig,
    state: RwLock<State>,
    syncing: tokio::sync::Mutex<()>,
}

/// How many images a [`LiveIndex`] holds and the memory its vectors take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IndexSize {
    /// Tasks known.
    pub tasks: usize,
    /// Tasks with an embedding.
    pub vectors: usize,
    /// Bytes the vector indexes hold.
    pub vector_bytes: usize,
}

impl LiveIndex {
    /// An empty index deciding by `config`.
    pub fn new(config: SimilarityConfig) -> Self {
        Self { config, state: RwLock::new(State::default()), syncing: tokio::sync::Mutex::new(()) }
    }

    /// The thresholds it decides by.
    pub fn config(&self) -> &SimilarityConfig {
        &self.config
    }

    /// Reads the changes the store logged since the last sync (all of them after a new epoch).
    pub async fn sync(&self, store: &dyn SimilarityStore) -> Result<usize, StoreError> {
        let _one_at_a_time = self.syncing.lock().await;
        let mut applied = 0;
        loop {
            let cursor = self.read().cursor;
            let changes = store.changes(cursor, SYNC_PAGE).await?;
            let mut state = self.write();
            if changes.epoch != state.epoch {
                let fresh = State { epoch: changes.epoch, ..State::default() };
                *state = fresh;
                drop(state);
                continue;
            }
            let Some(last) = changes.items.last().map(|c| c.seq) else { return Ok(applied) };
            for changed in changes.items {
                state.remove(&changed.task_id);
                if let Some(entry) = changed.entry {
                    state.insert(&self.config, entry);
                }
                applied += 1;
            }
            state.cursor = last;
        }
    }

    /// The earlier images near `entry` (not itself, not later ones): every image whose cosine
    /// with it is at least `similarity.pair_floor` or whose hash is within
    /// `similarity.phash_max_distance`, closest first.
    pub fn pairs_for(&self, entry: &Entry) -> Vec<Pair> {
        self.near(entry, |known, id| (known.created, id) < (entry.created, entry.task_id.as_str()))
    }

    /// The later images near `entry` that have both a hash and an embedding: those that were
    /// compared before `entry` could be, and may be its near-duplicates. Their ids, closest first.
    pub fn later_near(&self, entry: &Entry) -> Vec<String> {
        let later = self.near(entry, |known, id| {
            known.phash.is_some()
                && known.version.is_some()
                && (known.created, id) > (entry.created, entry.task_id.as_str())
        });
        later.into_iter().map(|pair| pair.task_id).collect()
    }

    /// The images near `entry` that `keep` accepts, closest first (see [`LiveIndex::pairs_for`]).
    fn near(&self, entry: &Entry, keep: impl Fn(&Known, &str) -> bool) -> Vec<Pair> {
        let state = self.read();
        let mut pairs: HashMap<String, Pair> = HashMap::new();
        let kept = |id: &str| id != entry.task_id && state.known.get(id).is_some_and(|known| keep(known, id));
        if let Some(embedding) = &entry.embedding
            && let Some(vectors) = state.vectors.get(&embedding.version)
        {
            let hits = vectors.search(embedding, NEAR, self.config.pair_floor as f32).unwrap_or_default();
            for hit in hits.into_iter().filter(|hit| kept(&hit.id)) {
                let phash_distance = state.phash_distance(entry.phash, &hit.id);
                pairs.insert(
                    hit.id.clone(),
                    Pair { task_id: hit.id, cosine: Some(f64::from(hit.cosine)), phash_distance },
                );
            }
        }
        if let Some(phash) = entry.phash {
            for (id, distance) in state.phashes.nearest(phash, self.config.phash_max_distance, NEAR) {
                if !kept(&id) || pairs.contains_key(&id) {
                    continue;
                }
                let cosine = state.cosine(entry.embedding.as_ref(), &id);
                pairs.insert(id.clone(), Pair { task_id: id, cosine, phash_distance: Some(distance) });
            }
        }
        let mut pairs: Vec<Pair> = pairs.into_values().collect();
        pairs.sort_by(|a, b| {
            let cosine = |p: &Pair| p.cosine.unwrap_or(-1.0);
            cosine(b)
                .total_cmp(&cosine(a))
                .then(a.phash_distance.cmp(&b.phash_distance))
                .then(a.task_id.cmp(&b.task_id))
        });
        pairs
    }

    /// Of `pairs`, the one that makes the image a near-duplicate by `similarity.*`, if any.
    pub fn duplicate_of<'p>(&self, pairs: &'p [Pair]) -> Option<&'p Pair> {
        pairs.iter().find(|pair| self.is_duplicate(pair, self.config.duplicate_threshold))
    }

    /// Whether `pair` is a near-duplicate: cosine at least `threshold` or hash distance within
    /// `similarity.phash_max_distance`.
    fn is_duplicate(&self, pair: &Pair, threshold: f64) -> bool {
        pair.cosine.is_some_and(|c| c >= threshold)
            || pair.phash_distance.is_some_and(|d| d <= self.config.phash_max_distance)
    }

    /// The `limit` images most similar to `task_id`'s, or `None` when it has no embedding here.
    pub fn similar_to(&self, task_id: &str, limit: usize) -> Option<Vec<Similar>> {
        let state = self.read();
        let version = state.known.get(task_id)?.version.clone()?;
        let vectors = state.vectors.get(&version)?;
        let hits = vectors.similar_to(task_id, limit, -1.0).ok()?;
        let phash = state.known.get(task_id).and_then(|k| k.phash);
        Some(hits.into_iter().map(|hit| state.similar(hit.id, hit.cosine, phash)).collect())
    }

    /// The `limit` images most similar to `embedding` (none when no image has its version).
    pub fn search(&self, embedding: &Embedding, limit: usize) -> Vec<Similar> {
        let state = self.read();
        let Some(vectors) = state.vectors.get(&embedding.version) else { return Vec::new() };
        let hits = vectors.search(embedding, limit, -1.0).unwrap_or_default();
        hits.into_iter().map(|hit| state.similar(hit.id, hit.cosine, None)).collect()
    }

    /// Groups of near-duplicates: images joined by a pair whose cosine is at least `threshold`
    /// (not below `similarity.pair_floor`) or whose hashes are within
    /// `similarity.phash_max_distance`; each group sorted by task id, groups by their first.
    pub fn duplicate_groups(&self, threshold: f64) -> Vec<Vec<String>> {
        let state = self.read();
        let edges = state.known.iter().flat_map(|(id, known)| {
            known
                .pairs
                .iter()
                .filter(|pair| self.is_duplicate(pair, threshold) && state.known.contains_key(&pair.task_id))
                .map(move |pair| (id.clone(), pair.task_id.clone()))
        });
        imagepipe_similarity::groups(edges)
    }

    /// The embedding version of `task_id`'s vector, when it has one here.
    pub fn version_of(&self, task_id: &str) -> Option<String> {
        self.read().known.get(task_id).and_then(|k| k.version.clone())
    }

    /// The thumbnail key of `task_id`, when known.
    pub fn thumbnail_key(&self, task_id: &str) -> Option<String> {
        self.read().known.get(task_id).and_then(|k| k.thumbnail_key.clone())
    }

    /// How much it holds.
    pub fn size(&self) -> IndexSize {
        let state = self.read();
        IndexSize {
            tasks: state.known.len(),
            vectors: state.vectors.values().map(VectorIndex::len).sum(),
            vector_bytes: state.vectors.values().map(VectorIndex::memory_bytes).sum(),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl State {
    fn remove(&mut self, task_id: &str) {
        if let Some(known) = self.known.remove(task_id) {
            if let Some(vectors) = known.version.and_then(|v| self.vectors.get_mut(&v)) {
                vectors.remove(task_id);
            }
            self.phashes.remove(task_id);
        }
    }

    fn insert(&mut self, config: &SimilarityConfig, entry: Entry) {
        let mut version = None;
        if let Some(embedding) = &entry.embedding {
            let vectors = self
                .vectors
                .entry(embedding.version.clone())
                .or_insert_with(|| VectorIndex::new(&embedding.version, config.exact_limit));
            match vectors.insert(&entry.task_id, embedding) {
                Ok(()) => version = Some(embedding.version.clone()),
                Err(error) => tracing::warn!(task_id = %entry.task_id, %error, "an embedding was not indexed"),
            }
        }
        if let Some(phash) = entry.phash {
            self.phashes.insert(&entry.task_id, phash);
        }
        let known = Known {
            created: entry.created,
            thumbnail_key: entry.thumbnail_key,
            phash: entry.phash,
            version,
            pairs: entry.pairs,
        };
        self.known.insert(entry.task_id, known);
    }

    fn phash_distance(&self, phash: Option<u64>, other: &str) -> Option<u32> {
        Some(hamming(phash?, self.known.get(other)?.phash?))
    }

    fn cosine(&self, embedding: Option<&Embedding>, other: &str) -> Option<f64> {
        let embedding = embedding?;
        let vectors = self.vectors.get(&embedding.version)?;
        vectors.cosine_to(embedding, other).map(f64::from)
    }

    fn similar(&self, task_id: String, cosine: f32, phash: Option<u64>) -> Similar {
        let known = self.known.get(&task_id);
        Similar {
            phash_distance: self.phash_distance(phash, &task_id),
            thumbnail_key: known.and_then(|k| k.thumbnail_key.clone()),
            cosine: f64::from(cosine),
            task_id,
        }
    }
}
