//! [`VectorIndex`]: the embeddings of one model version, searched by cosine.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use imagepipe_contracts::{Embedding, EmbeddingError};

use crate::hnsw::{EF_SEARCH, Graph, Near};
use crate::store::{Query, Store};

/// Dead slots, as a share of all, at which the index drops them and starts its graph over (1/10).
const DEAD_SHARE_DIVISOR: usize = 10;
/// Largest `limit` answered through the graph; a larger one scans.
const GRAPH_MAX_LIMIT: usize = 1_000;
/// Images linked into the graph per insert or removal, at most, while it catches up.
pub(crate) const LINKS_PER_CHANGE: usize = 8;

/// One image found by a search.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// The image's id, as inserted.
    pub id: String,
    /// Cosine of its embedding with the query (1 = same direction).
    pub cosine: f32,
}

/// Why an embedding was not indexed or could not be searched for.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The embedding was made by another model than the index's vectors.
    #[error("embedding version {embedding:?} is not this index's {index:?}")]
    Version {
        /// The index's version.
        index: String,
        /// The embedding's.
        embedding: String,
    },
    /// The embedding has another number of components than the index's vectors.
    #[error("embedding has {actual} components, this index's vectors have {expected}")]
    Dim {
        /// Components of the vectors held.
        expected: usize,
        /// Components of the embedding.
        actual: usize,
    },
    /// The embedding cannot be read back (not base64, wrong length, or all zeros).
    #[error("embedding cannot be read: {0}")]
    Unreadable(#[from] EmbeddingError),
    /// No image with this id is in the index.
    #[error("no image {0:?} in the vector index")]
    UnknownId(String),
}

/// The embeddings of one model version, searched by cosine.
///
/// Vectors live in one contiguous buffer of int8 components, one scale each. Up to `exact_limit`
/// images a search scans them all, keeping the best in a bounded heap. Past it the index starts an
/// HNSW graph and links the images into it up to eight per insert or removal, so that no single
/// call builds the whole graph; searches keep scanning until the graph holds every image
/// ([`VectorIndex::catch_up`] links the rest at once).
///
/// Without a graph a removal moves the last vector into the freed slot. With one, slots stay put
/// (the graph's nodes are slots): a removal marks its slot dead (answers leave it out, the graph
/// still routes through it), the next insert takes the dead slot over and links it anew, and a
/// removed image inserted again with the same vector, as the indexer does whenever an entry
/// changes, simply gets its slot back. Once dead slots make up a tenth of all (removals outpacing
/// inserts), the index drops them and starts the graph over.
#[derive(Debug, Clone)]
pub struct VectorIndex {
    version: String,
    exact_limit: usize,
    store: Store,
    /// The id of each slot (of its last image, for a dead slot).
    ids: Vec<Arc<str>>,
    /// Whether each slot's image was removed.
    dead: Vec<bool>,
    dead_count: usize,
    /// Dead slots to take over, newest last (some may have come back to life since).
    free: Vec<u32>,
    /// Live ids → slot.
    slots: HashMap<Arc<str>, u32>,
    /// Removed ids → their dead slot, to give back on an insert of the same vector.
    removed: HashMap<Arc<str>, u32>,
    graph: Option<Graph>,
}

impl VectorIndex {
    /// An empty index for embeddings of `version`, scanning exactly up to `exact_limit` images.
    pub fn new(version: &str, exact_limit: usize) -> Self {
        Self {
            version: version.to_owned(),
            exact_limit,
            store: Store::default(),
            ids: Vec::new(),
            dead: Vec::new(),
            dead_count: 0,
            free: Vec::new(),
            slots: HashMap::new(),
            removed: HashMap::new(),
            graph: None,
        }
    }

    /// The embedding version it holds.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Indexes `embedding` as `id`'s, replacing what `id` had. Fails when the embedding is of
    /// another version, has another number of components than the vectors held, or cannot be
    /// read.
    pub fn insert(&mut self, id: &str, embedding: &Embedding) -> Result<(), IndexError> {
        let components = self.components(embedding)?;
        let query = Query::new(&components).ok_or(EmbeddingError::Degenerate)?;
        if let Some(&slot) = self.slots.get(id) {
            if !self.store.holds(slot, query) {
                self.set(slot, query);
            }
        } else if let Some(slot) = self.removed.remove(id).filter(|&slot| self.store.holds(slot, query)) {
            self.revive(slot);
        } else if let Some(slot) = self.take_free() {
            let old = std::mem::replace(&mut self.ids[slot as usize], Arc::from(id));
            if self.removed.get(&old) == Some(&slot) {
                self.removed.remove(&old);
            }
            self.revive(slot);
            self.set(slot, query);
        } else {
            let slot = self.store.push(query);
            let id: Arc<str> = Arc::from(id);
            self.ids.push(id.clone());
            self.dead.push(false);
            self.slots.insert(id, slot);
        }
        if self.graph.is_none() && self.len() > self.exact_limit {
            self.graph = Some(Graph::new());
        }
        self.catch_up(LINKS_PER_CHANGE);
        Ok(())
    }

    /// Takes `id` out of the index; whether it was in.
    pub fn remove(&mut self, id: &str) -> bool {
        let Some((id, slot)) = self.slots.remove_entry(id) else { return false };
        if self.graph.is_none() {
            self.store.swap_remove(slot);
            self.ids.swap_remove(slot as usize);
            self.dead.swap_remove(slot as usize);
            if let Some(moved) = self.ids.get(slot as usize) {
                self.slots.insert(moved.clone(), slot);
            }
            return true;
        }
        self.dead[slot as usize] = true;
        self.dead_count += 1;
        self.free.push(slot);
        self.removed.insert(id, slot);
        if self.dead_count * DEAD_SHARE_DIVISOR >= self.store.len() {
            self.compact();
        }
        self.catch_up(LINKS_PER_CHANGE);
        true
    }

    /// Links up to `max` images the HNSW graph does not hold yet (each insert and removal links a
    /// few); how many are left. Searches go through the graph once none is.
    pub fn catch_up(&mut self, max: usize) -> usize {
        let Some(graph) = &mut self.graph else { return 0 };
        for _ in 0..max.min(self.store.len() - graph.len()) {
            graph.insert(&self.store);
        }
        self.store.len() - graph.len()
    }

    /// Up to `limit` images whose cosine with `embedding` is at least `min_cosine`, nearest
    /// first. Exact up to `exact_limit` images, approximate past it.
    pub fn search(&self, embedding: &Embedding, limit: usize, min_cosine: f32) -> Result<Vec<Hit>, IndexError> {
        let components = self.components(embedding)?;
        let query = Query::new(&components).ok_or(EmbeddingError::Degenerate)?;
        Ok(self.nearest(query, limit, min_cosine, None))
    }

    /// Like [`VectorIndex::search`] with `id`'s own vector, leaving `id` out. Fails when `id` is
    /// not in the index.
    pub fn similar_to(&self, id: &str, limit: usize, min_cosine: f32) -> Result<Vec<Hit>, IndexError> {
        let &slot = self.slots.get(id).ok_or_else(|| IndexError::UnknownId(id.to_owned()))?;
        Ok(self.nearest(self.store.query(slot), limit, min_cosine, Some(slot)))
    }

    /// Cosine of `embedding` with `id`'s vector; `None` when `id` is not in the index or the
    /// embedding does not fit it.
    pub fn cosine_to(&self, embedding: &Embedding, id: &str) -> Option<f32> {
        let &slot = self.slots.get(id)?;
        let components = self.components(embedding).ok()?;
        Some(clamp(self.store.cosine(Query::new(&components)?, slot)))
    }

    /// Images held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether it holds no image.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// An estimate of the heap it holds: vectors, ids, maps and graph.
    pub fn memory_bytes(&self) -> usize {
        let id_text: usize = self.ids.iter().map(arc_str_bytes).sum();
        let removed_text: usize = self.removed.keys().filter(|id| Arc::strong_count(id) == 1).map(arc_str_bytes).sum();
        self.store.memory_bytes()
            + self.ids.capacity() * size_of::<Arc<str>>()
            + id_text
            + removed_text
            + self.dead.capacity()
            + self.free.capacity() * size_of::<u32>()
            + map_bytes(self.slots.capacity(), size_of::<(Arc<str>, u32)>())
            + map_bytes(self.removed.capacity(), size_of::<(Arc<str>, u32)>())
            + self.graph.as_ref().map_or(0, Graph::memory_bytes)
    }

    /// Whether searches go through the graph: past `exact_limit` with every slot linked.
    fn approximate(&self) -> bool {
        self.len() > self.exact_limit && self.graph.as_ref().is_some_and(|graph| graph.len() == self.store.len())
    }

    /// `embedding`'s components, when it fits this index.
    fn components(&self, embedding: &Embedding) -> Result<Vec<i8>, IndexError> {
        if embedding.version != self.version {
            return Err(IndexError::Version { index: self.version.clone(), embedding: embedding.version.clone() });
        }
        let components = embedding.components()?;
        let expected = self.store.dim();
        if self.store.len() > 0 && components.len() != expected {
            return Err(IndexError::Dim { expected, actual: components.len() });
        }
        Ok(components)
    }

    /// Gives `slot` a new vector, linking it anew when the graph holds it.
    fn set(&mut self, slot: u32, query: Query<'_>) {
        self.store.set(slot, query);
        if let Some(graph) = &mut self.graph
            && (slot as usize) < graph.len()
        {
            graph.relink(&self.store, slot);
        }
    }

    /// Brings dead `slot` back to life, for the id it holds.
    fn revive(&mut self, slot: u32) {
        self.dead[slot as usize] = false;
        self.dead_count -= 1;
        self.slots.insert(self.ids[slot as usize].clone(), slot);
    }

    /// A dead slot to take over, if any.
    fn take_free(&mut self) -> Option<u32> {
        while let Some(slot) = self.free.pop() {
            if self.dead[slot as usize] {
                return Some(slot);
            }
        }
        None
    }

    /// Drops the dead slots and starts the graph over (none when the rest fits `exact_limit`).
    fn compact(&mut self) {
        let keep: Vec<bool> = self.dead.iter().map(|dead| !dead).collect();
        self.store.retain(&keep);
        let mut slot = 0;
        self.ids.retain(|_| {
            slot += 1;
            keep[slot - 1]
        });
        self.ids.shrink_to_fit();
        self.dead = vec![false; self.ids.len()];
        self.dead_count = 0;
        self.free = Vec::new();
        self.removed = HashMap::new();
        self.slots = self.ids.iter().enumerate().map(|(slot, id)| (id.clone(), slot as u32)).collect();
        self.graph = (self.len() > self.exact_limit).then(Graph::new);
    }

    fn nearest(&self, query: Query<'_>, limit: usize, min_cosine: f32, exclude: Option<u32>) -> Vec<Hit> {
        if limit == 0 || self.is_empty() {
            return Vec::new();
        }
        let wanted =
            |near: &Near| !self.dead[near.slot as usize] && Some(near.slot) != exclude && near.cosine >= min_cosine;
        let found: Vec<Near> = match &self.graph {
            Some(graph) if self.approximate() && limit <= GRAPH_MAX_LIMIT => {
                let ef = EF_SEARCH.max(limit + usize::from(exclude.is_some()));
                graph.search(&self.store, query, ef).into_iter().filter(wanted).take(limit).collect()
            }
            _ => self.scan(query, limit, wanted),
        };
        let mut hits: Vec<Hit> = found
            .into_iter()
            .map(|near| Hit { id: self.ids[near.slot as usize].to_string(), cosine: clamp(near.cosine) })
            .collect();
        hits.sort_by(|a, b| b.cosine.total_cmp(&a.cosine).then_with(|| a.id.cmp(&b.id)));
        hits
    }

    /// The exact answer: every live slot compared, the best `limit` that are `wanted` kept in a
    /// bounded heap.
    fn scan(&self, query: Query<'_>, limit: usize, wanted: impl Fn(&Near) -> bool) -> Vec<Near> {
        let mut best: BinaryHeap<Reverse<Near>> = BinaryHeap::with_capacity(limit.min(self.store.len()) + 1);
        for slot in 0..self.store.len() as u32 {
            if self.dead[slot as usize] {
                continue;
            }
            let near = Near { cosine: self.store.cosine(query, slot), slot };
            if !wanted(&near) {
                continue;
            }
            if best.len() < limit {
                best.push(Reverse(near));
            } else if let Some(mut worst) = best.peek_mut()
                && near > worst.0
            {
                *worst = Reverse(near);
            }
        }
        best.into_sorted_vec().into_iter().map(|Reverse(near)| near).collect()
    }
}

/// A cosine as reported: rounding can take a vector's cosine with itself a hair past 1.
fn clamp(cosine: f32) -> f32 {
    cosine.clamp(-1.0, 1.0)
}

/// Heap bytes of one `Arc<str>`'s allocation: two counters and the text.
fn arc_str_bytes(id: &Arc<str>) -> usize {
    (2 * size_of::<usize>() + id.len()).next_multiple_of(size_of::<usize>())
}

/// Heap bytes of a std `HashMap` of `capacity` entries of `entry` bytes: buckets (a power of two
/// at 7/8 load) of one entry and one control byte each.
fn map_bytes(capacity: usize, entry: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7).next_power_of_two();
    buckets * (entry + 1) + 16
}

#[cfg(test)]
mod tests;
