//! [`Graph`]: a hierarchical navigable small world graph (Malkov & Yashunin, 2016) over the slots
//! of a [`Store`], which keeps the vectors: the graph holds only links, as slot numbers, and links
//! the slots in order. It knows nothing of removals: the index leaves removed slots out of its
//! answers, and gives a removed slot a new vector through [`Graph::relink`].

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::store::{GROWTH_DIVISOR, MIN_GROWTH, Query, Store};
use crate::synthetic::Rng;

/// Links a node keeps on each layer above 0 (and the most chosen for a new node on any layer).
const M: usize = 16;
/// Links a node keeps on layer 0.
const M0: usize = 2 * M;
/// Candidates kept while finding a new node's links.
const EF_CONSTRUCTION: usize = 100;
/// Candidates kept while searching, when fewer results are asked for.
pub(crate) const EF_SEARCH: usize = 128;
/// Layers above 0 at most (reached by one node in 16^16).
const MAX_LEVEL: usize = 16;
/// Seed of the level draws: the same inserts make the same graph.
const SEED: u64 = 0x1AE5_0F5E_ED00;

/// A slot and its cosine with the vector searched for; greater means nearer, ties going to the
/// lower slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Near {
    pub(crate) cosine: f32,
    pub(crate) slot: u32,
}

impl Eq for Near {}

impl Ord for Near {
    fn cmp(&self, other: &Self) -> Ordering {
        self.cosine.total_cmp(&other.cosine).then_with(|| other.slot.cmp(&self.slot))
    }
}

impl PartialOrd for Near {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The graph (see the module docs); node `n` is slot `n` of the store it was built over.
#[derive(Debug, Clone)]
pub(crate) struct Graph {
    /// Layer 0, `M0 + 1` numbers per node: how many links it has, then the links.
    layer0: Vec<u32>,
    /// Per node, its links on layers 1 up to its level.
    upper: Vec<Vec<Vec<u32>>>,
    /// The node reached from, and its level (the graph's highest).
    entry: Option<(u32, usize)>,
    rng: Rng,
}

impl Graph {
    /// An empty graph.
    pub(crate) fn new() -> Self {
        Self { layer0: Vec::new(), upper: Vec::new(), entry: None, rng: Rng::new(SEED) }
    }

    /// Nodes linked: the store's slots `0..len`.
    pub(crate) fn len(&self) -> usize {
        self.upper.len()
    }

    /// Links slot [`Graph::len`] of `store`, the first not in the graph yet.
    pub(crate) fn insert(&mut self, store: &Store) {
        let node = self.upper.len() as u32;
        let level = self.random_level();
        let links = self.plan(store, node, level);
        if self.layer0.len() + M0 + 1 > self.layer0.capacity() {
            let more = (self.upper.len() / GROWTH_DIVISOR).max(MIN_GROWTH);
            self.layer0.reserve_exact(more * (M0 + 1));
        }
        self.layer0.resize(self.layer0.len() + M0 + 1, 0);
        self.upper.push(vec![Vec::new(); level]);
        self.attach(store, node, &links);
        if self.entry.is_none_or(|(_, top)| level > top) {
            self.entry = Some((node, level));
        }
    }

    /// Links `node` anew after its vector changed in the store: the links to it from its old
    /// neighbours go, and it gets links (both ways) to the nodes nearest its new vector. Links to
    /// it from nodes it did not link to stay, as long-range links.
    pub(crate) fn relink(&mut self, store: &Store, node: u32) {
        let level = self.upper[node as usize].len();
        for layer in 0..=level {
            for other in self.links(node, layer).to_vec() {
                let kept: Vec<u32> = self.links(other, layer).iter().copied().filter(|&slot| slot != node).collect();
                self.set_links(other, layer, &kept);
            }
        }
        let links = self.plan(store, node, level);
        self.attach(store, node, &links);
    }

    /// The links `node` of `level` gets on each of its layers, 0 first: up to [`M`] of the
    /// nodes nearest its vector that the graph reaches, itself left out.
    fn plan(&self, store: &Store, node: u32, level: usize) -> Vec<Vec<u32>> {
        let Some((entry, top)) = self.entry else { return vec![Vec::new(); level + 1] };
        let query = store.query(node);
        let mut links = vec![Vec::new(); level + 1];
        let mut nearest = vec![Near { cosine: store.cosine(query, entry), slot: entry }];
        for layer in (level + 1..=top).rev() {
            nearest = vec![self.greedy(store, query, nearest[0], layer)];
        }
        let mut visited = Visited::new(self.upper.len());
        for layer in (0..=level.min(top)).rev() {
            visited.clear();
            nearest = self.search_layer(store, query, &nearest, EF_CONSTRUCTION, layer, &mut visited);
            let candidates: Vec<Near> = nearest.iter().copied().filter(|near| near.slot != node).collect();
            links[layer] = select(store, &candidates, M);
        }
        links
    }

    /// Sets `node`'s links per layer and the links back to it.
    fn attach(&mut self, store: &Store, node: u32, links: &[Vec<u32>]) {
        for (layer, links) in links.iter().enumerate() {
            self.set_links(node, layer, links);
            for &other in links {
                self.link(store, other, node, layer);
            }
        }
    }

    /// Up to `ef` nodes nearest `query`, nearest first.
    pub(crate) fn search(&self, store: &Store, query: Query<'_>, ef: usize) -> Vec<Near> {
        let Some((entry, top)) = self.entry else { return Vec::new() };
        let mut nearest = Near { cosine: store.cosine(query, entry), slot: entry };
        for layer in (1..=top).rev() {
            nearest = self.greedy(store, query, nearest, layer);
        }
        self.search_layer(store, query, &[nearest], ef, 0, &mut Visited::new(self.upper.len()))
    }

    /// Heap bytes held.
    pub(crate) fn memory_bytes(&self) -> usize {
        let upper: usize = self
            .upper
            .iter()
            .map(|layers| {
                layers.capacity() * size_of::<Vec<u32>>()
                    + layers.iter().map(|links| links.capacity() * size_of::<u32>()).sum::<usize>()
            })
            .sum();
        self.layer0.capacity() * size_of::<u32>() + self.upper.capacity() * size_of::<Vec<Vec<u32>>>() + upper
    }

    /// A level drawn from the exponential distribution the paper prescribes (`mL = 1/ln M`).
    fn random_level(&mut self) -> usize {
        let level = -self.rng.unit().ln() / (M as f64).ln();
        (level as usize).min(MAX_LEVEL)
    }

    fn links(&self, node: u32, layer: usize) -> &[u32] {
        if layer == 0 {
            let start = node as usize * (M0 + 1);
            let count = self.layer0[start] as usize;
            &self.layer0[start + 1..start + 1 + count]
        } else {
            &self.upper[node as usize][layer - 1]
        }
    }

    fn set_links(&mut self, node: u32, layer: usize, links: &[u32]) {
        if layer == 0 {
            let start = node as usize * (M0 + 1);
            self.layer0[start] = links.len() as u32;
            self.layer0[start + 1..start + 1 + links.len()].copy_from_slice(links);
        } else {
            let upper = &mut self.upper[node as usize][layer - 1];
            upper.clear();
            upper.extend_from_slice(links);
        }
    }

    /// Adds a link from `from` to `to`; when `from` has all the links it may keep, it keeps the
    /// most useful of its links and `to` (see [`select`]).
    fn link(&mut self, store: &Store, from: u32, to: u32, layer: usize) {
        let capacity = if layer == 0 { M0 } else { M };
        let links = self.links(from, layer);
        if links.contains(&to) {
            return;
        }
        let count = links.len();
        if count < capacity {
            if layer == 0 {
                let start = from as usize * (M0 + 1);
                self.layer0[start] += 1;
                self.layer0[start + count + 1] = to;
            } else {
                self.upper[from as usize][layer - 1].push(to);
            }
            return;
        }
        let base = store.query(from);
        let mut candidates: Vec<Near> = self
            .links(from, layer)
            .iter()
            .chain([&to])
            .map(|&slot| Near { cosine: store.cosine(base, slot), slot })
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        let kept = select(store, &candidates, capacity);
        self.set_links(from, layer, &kept);
    }

    /// Walks `layer` from `start` to the nearest node it can reach by always moving nearer.
    fn greedy(&self, store: &Store, query: Query<'_>, start: Near, layer: usize) -> Near {
        let mut nearest = start;
        loop {
            let from = nearest.slot;
            for &slot in self.links(from, layer) {
                let near = Near { cosine: store.cosine(query, slot), slot };
                if near > nearest {
                    nearest = near;
                }
            }
            if nearest.slot == from {
                return nearest;
            }
        }
    }

    /// The best-first search of one layer from `entries`, keeping the `ef` nearest nodes seen;
    /// those, nearest first.
    fn search_layer(
        &self,
        store: &Store,
        query: Query<'_>,
        entries: &[Near],
        ef: usize,
        layer: usize,
        visited: &mut Visited,
    ) -> Vec<Near> {
        let mut candidates: BinaryHeap<Near> = BinaryHeap::with_capacity(ef * 2);
        let mut found: BinaryHeap<Reverse<Near>> = BinaryHeap::with_capacity(ef + 1);
        for &entry in entries {
            if visited.insert(entry.slot) {
                candidates.push(entry);
                found.push(Reverse(entry));
            }
        }
        while found.len() > ef {
            found.pop();
        }
        while let Some(candidate) = candidates.pop() {
            let worst = found.peek().map_or(f32::NEG_INFINITY, |Reverse(near)| near.cosine);
            if found.len() >= ef && candidate.cosine < worst {
                break;
            }
            for &slot in self.links(candidate.slot, layer) {
                if !visited.insert(slot) {
                    continue;
                }
                let near = Near { cosine: store.cosine(query, slot), slot };
                if found.len() < ef || found.peek().is_some_and(|Reverse(worst)| near > *worst) {
                    candidates.push(near);
                    found.push(Reverse(near));
                    if found.len() > ef {
                        found.pop();
                    }
                }
            }
        }
        found.into_sorted_vec().into_iter().map(|Reverse(near)| near).collect()
    }
}

/// Of `candidates` (nearest a base node first), up to `m` to link the base to: a candidate is
/// kept only when it is nearer the base than any kept one, so the links spread in different
/// directions instead of all pointing into the nearest cluster (the paper's heuristic, which
/// keeps clustered data navigable).
fn select(store: &Store, candidates: &[Near], m: usize) -> Vec<u32> {
    if candidates.len() <= m {
        return candidates.iter().map(|near| near.slot).collect();
    }
    let mut kept: Vec<u32> = Vec::with_capacity(m);
    for candidate in candidates {
        if kept.len() == m {
            break;
        }
        if kept.iter().all(|&other| store.cosine_between(candidate.slot, other) < candidate.cosine) {
            kept.push(candidate.slot);
        }
    }
    kept
}

/// The nodes one search has seen, one bit each.
struct Visited(Vec<u64>);

impl Visited {
    fn new(nodes: usize) -> Self {
        Self(vec![0; nodes.div_ceil(64)])
    }

    fn clear(&mut self) {
        self.0.fill(0);
    }

    /// Marks `slot`; whether it was unmarked.
    fn insert(&mut self, slot: u32) -> bool {
        let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        let unseen = self.0[word] & bit == 0;
        self.0[word] |= bit;
        unseen
    }
}
