//! [`Store`]: the vectors of a [`crate::VectorIndex`] in one contiguous buffer of int8
//! components, with one scale per vector such that the dot product of two vectors' components
//! times their two scales is their cosine.

use crate::dot::{dot, norm_squared};

/// The store (and the graph's layer 0) grows by an eighth of its vectors at a time rather than
/// doubling, so that at most an eighth of its memory (not half) is spare.
pub(crate) const GROWTH_DIVISOR: usize = 8;
/// Vectors it makes room for at least when it grows.
pub(crate) const MIN_GROWTH: usize = 64;

/// A vector to compare against the stored ones.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Query<'a> {
    pub(crate) components: &'a [i8],
    pub(crate) scale: f32,
}

impl<'a> Query<'a> {
    /// `components` with the scale that makes them a unit vector, or `None` when they are all zero.
    pub(crate) fn new(components: &'a [i8]) -> Option<Self> {
        let norm_squared = norm_squared(components);
        (norm_squared > 0).then(|| Self { components, scale: (1.0 / (norm_squared as f64).sqrt()) as f32 })
    }
}

/// The vectors, by slot (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct Store {
    dim: usize,
    components: Vec<i8>,
    scales: Vec<f32>,
}

impl Store {
    /// Components per vector; 0 until the first push.
    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    /// Vectors held.
    pub(crate) fn len(&self) -> usize {
        self.scales.len()
    }

    /// Appends `query`'s vector (of [`Store::dim`] components, or of any when empty); its slot.
    pub(crate) fn push(&mut self, query: Query<'_>) -> u32 {
        if self.scales.is_empty() {
            self.dim = query.components.len();
        }
        debug_assert_eq!(query.components.len(), self.dim);
        if self.scales.len() == self.scales.capacity() {
            let more = (self.scales.len() / GROWTH_DIVISOR).max(MIN_GROWTH);
            self.scales.reserve_exact(more);
            self.components.reserve_exact(more * self.dim);
        }
        self.components.extend_from_slice(query.components);
        self.scales.push(query.scale);
        (self.scales.len() - 1) as u32
    }

    /// Overwrites the vector in `slot`.
    pub(crate) fn set(&mut self, slot: u32, query: Query<'_>) {
        let start = slot as usize * self.dim;
        self.components[start..start + self.dim].copy_from_slice(query.components);
        self.scales[slot as usize] = query.scale;
    }

    /// Removes the vector in `slot`, moving the last one into it.
    pub(crate) fn swap_remove(&mut self, slot: u32) {
        let last = self.scales.len() - 1;
        let slot = slot as usize;
        if slot != last {
            self.components.copy_within(last * self.dim.., slot * self.dim);
        }
        self.components.truncate(last * self.dim);
        self.scales.swap_remove(slot);
    }

    /// Keeps the vectors whose slot is `true` in `keep`, in order.
    pub(crate) fn retain(&mut self, keep: &[bool]) {
        let mut to = 0;
        for from in (0..self.len()).filter(|&slot| keep[slot]) {
            if from != to {
                self.components.copy_within(from * self.dim..(from + 1) * self.dim, to * self.dim);
                self.scales[to] = self.scales[from];
            }
            to += 1;
        }
        self.components.truncate(to * self.dim);
        self.scales.truncate(to);
        self.components.shrink_to_fit();
        self.scales.shrink_to_fit();
    }

    /// The vector in `slot` as a query.
    pub(crate) fn query(&self, slot: u32) -> Query<'_> {
        Query { components: self.row(slot), scale: self.scales[slot as usize] }
    }

    fn row(&self, slot: u32) -> &[i8] {
        let start = slot as usize * self.dim;
        &self.components[start..start + self.dim]
    }

    /// Whether `slot` holds exactly `query`'s components.
    pub(crate) fn holds(&self, slot: u32, query: Query<'_>) -> bool {
        self.row(slot) == query.components
    }

    /// Cosine of `query` and the vector in `slot`.
    pub(crate) fn cosine(&self, query: Query<'_>, slot: u32) -> f32 {
        query.scale * self.scales[slot as usize] * dot(query.components, self.row(slot)) as f32
    }

    /// Cosine of the vectors in slots `a` and `b`.
    pub(crate) fn cosine_between(&self, a: u32, b: u32) -> f32 {
        self.cosine(self.query(a), b)
    }

    /// Heap bytes held.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.components.capacity() + self.scales.capacity() * size_of::<f32>()
    }
}
