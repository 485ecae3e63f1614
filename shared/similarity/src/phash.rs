//! [`PhashIndex`]: 64-bit perceptual hashes searched by Hamming distance, by a linear scan of a
//! contiguous `Vec<u64>` (100,000 hashes take well under a millisecond).

use std::collections::HashMap;
use std::sync::Arc;

/// Number of bits in which `a` and `b` differ.
pub fn hamming(a: u64, b: u64) -> u32 {
    (a ^ b).count_ones()
}

/// A perceptual hash as the metadata worker writes it, 16 hex digits (`"c3a1…"`); `None` for
/// anything else.
pub fn parse_phash(hex: &str) -> Option<u64> {
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Images' perceptual hashes, by image id (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct PhashIndex {
    hashes: Vec<u64>,
    ids: Vec<Arc<str>>,
    slots: HashMap<Arc<str>, usize>,
}

impl PhashIndex {
    /// Sets `id`'s hash, replacing what it had.
    pub fn insert(&mut self, id: &str, phash: u64) {
        if let Some(&slot) = self.slots.get(id) {
            self.hashes[slot] = phash;
            return;
        }
        let id: Arc<str> = Arc::from(id);
        self.slots.insert(id.clone(), self.hashes.len());
        self.hashes.push(phash);
        self.ids.push(id);
    }

    /// Takes `id` out; whether it was in.
    pub fn remove(&mut self, id: &str) -> bool {
        let Some(slot) = self.slots.remove(id) else { return false };
        self.hashes.swap_remove(slot);
        self.ids.swap_remove(slot);
        if let Some(moved) = self.ids.get(slot) {
            self.slots.insert(moved.clone(), slot);
        }
        true
    }

    /// Up to `limit` images whose hash is within `max_distance` bits of `phash`, with their
    /// distance, nearest first, then by id.
    pub fn nearest(&self, phash: u64, max_distance: u32, limit: usize) -> Vec<(String, u32)> {
        let mut found: Vec<(u32, &str)> = self
            .hashes
            .iter()
            .zip(&self.ids)
            .filter_map(|(&hash, id)| {
                let distance = hamming(hash, phash);
                (distance <= max_distance).then_some((distance, &**id))
            })
            .collect();
        if found.len() > limit {
            found.select_nth_unstable(limit);
            found.truncate(limit);
        }
        found.sort_unstable();
        found.into_iter().map(|(distance, id)| (id.to_owned(), distance)).collect()
    }

    /// Images held.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether it holds no image.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hamming_counts_the_differing_bits() {
        assert_eq!(hamming(0, 0), 0);
        assert_eq!(hamming(0, u64::MAX), 64);
        assert_eq!(hamming(0b1011, 0b0110), 3);
        assert_eq!(hamming(1 << 63, 1), 2);
    }

    #[test]
    fn parse_phash_takes_sixteen_hex_digits_and_nothing_else() {
        assert_eq!(parse_phash("c3a1000000000001"), Some(0xc3a1_0000_0000_0001));
        assert_eq!(parse_phash("FFFFFFFFFFFFFFFF"), Some(u64::MAX));
        assert_eq!(parse_phash("0000000000000000"), Some(0));
        for bad in [
            "",
            "c3a1",
            "c3a10000000000011",
            "+3a1000000000001",
            "0xa1000000000001",
            "g3a1000000000001",
            " 3a1000000000001",
            "c3a100000000000é",
        ] {
            assert_eq!(parse_phash(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn nearest_orders_by_distance_then_id_and_keeps_the_limit() {
        let mut index = PhashIndex::default();
        let base = 0xF0F0_F0F0_0F0F_0F0Fu64;
        index.insert("far", base ^ 0xFFFF);
        index.insert("two-b", base ^ 0b11);
        index.insert("same", base);
        index.insert("two-a", base ^ 0b101);
        index.insert("one", base ^ 1 << 40);
        let found = index.nearest(base, 6, 10);
        let expected = [("same", 0), ("one", 1), ("two-a", 2), ("two-b", 2)];
        assert_eq!(found, expected.map(|(id, d)| (id.to_owned(), d)));
        assert_eq!(
            index.nearest(base, 6, 3),
            expected[..3].iter().map(|&(id, d)| (id.to_owned(), d)).collect::<Vec<_>>()
        );
        assert_eq!(index.nearest(base, 16, 10).last(), Some(&("far".to_owned(), 16)));
        assert!(index.nearest(base, 6, 0).is_empty());
    }

    #[test]
    fn insert_replaces_and_remove_forgets() {
        let mut index = PhashIndex::default();
        index.insert("a", 0);
        index.insert("b", 1);
        index.insert("c", 3);
        index.insert("a", u64::MAX);
        assert_eq!(index.len(), 3);
        assert_eq!(index.nearest(0, 64, 1), vec![("b".to_owned(), 1)]);
        assert!(index.remove("b"));
        assert!(!index.remove("b"));
        assert_eq!(index.len(), 2);
        assert_eq!(index.nearest(0, 64, 10), vec![("c".to_owned(), 2), ("a".to_owned(), 64)]);
        index.insert("b", 0);
        assert_eq!(index.nearest(0, 0, 10), vec![("b".to_owned(), 0)]);
    }
}
