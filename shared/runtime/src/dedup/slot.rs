//! Redis Cluster hash slots, and the shortest hash tag of a slot: a key's slot is CRC16
//! (XMODEM) of its hash tag (the part between its first `{` and the next `}`, when not empty)
//! or of the whole key, modulo 16,384. A key tagged with [`tag_of_slot`]`(s)` is in slot `s`,
//! like one tagged with any longer string of that slot, so a store can keep some keys short and
//! still share a slot with keys tagged at length.

use std::sync::OnceLock;

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// The characters of the tags [`tag_of_slot`] makes, in the order it tries them.
const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// CRC16 as Redis Cluster computes it (XMODEM: polynomial 0x1021, initial value 0).
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The hash slot of `key` in a Redis Cluster.
pub fn hash_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter().position(|b| *b == b'}').filter(|close| *close > 0).map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// The shortest string of [`ALPHABET`] (the first of that length, in its order) whose hash slot
/// is `slot` (taken modulo [`SLOTS`]): a hash tag `{<it>}` puts a key in that slot. Every slot has
/// one of at most 3 characters (a test checks); they are worked out once per process.
pub fn tag_of_slot(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut left = tags.len();
        let mut candidate: Vec<usize> = Vec::with_capacity(4);
        'lengths: for len in 1.. {
            candidate.clear();
            candidate.resize(len, 0);
            loop {
                let tag: Vec<u8> = candidate.iter().map(|&i| ALPHABET[i]).collect();
                let found = &mut tags[usize::from(crc16(&tag) % SLOTS)];
                if found.is_empty() {
                    *found = String::from_utf8(tag).expect("the alphabet is ASCII");
                    left -= 1;
                    if left == 0 {
                        break 'lengths;
                    }
                }
                // the next candidate of this length, the last character fastest
                let Some(at) = candidate.iter().rposition(|&i| i + 1 < ALPHABET.len()) else { break };
                candidate[at] += 1;
                candidate[at + 1..].fill(0);
            }
        }
        tags
    });
    &tags[usize::from(slot % SLOTS)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_of_redis_cluster() {
        // Examples from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(hash_slot(b"foo"), 12_182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"), "an empty tag: the whole key");
        assert_ne!(hash_slot(b"foo{}{bar}"), hash_slot(b"bar"));
        assert_eq!(hash_slot(b"foo{{bar}}zap"), hash_slot(b"{bar"));
    }

    #[test]
    fn every_slot_has_a_tag_of_at_most_three_characters() {
        let mut found = vec![false; usize::from(SLOTS)];
        let mut left = found.len();
        for a in ALPHABET {
            for b in ALPHABET {
                for c in ALPHABET {
                    for tag in [&[*a][..], &[*a, *b][..], &[*a, *b, *c][..]] {
                        let slot = usize::from(crc16(tag) % SLOTS);
                        if !found[slot] {
                            found[slot] = true;
                            left -= 1;
                        }
                    }
                }
            }
        }
        assert_eq!(left, 0, "slots without a tag of 3 characters or fewer");
        for slot in 0..SLOTS {
            let tag = tag_of_slot(slot);
            assert!(!tag.is_empty() && tag.len() <= 3, "{slot}: {tag}");
            assert_eq!(hash_slot(format!("k:{{{tag}}}:x").as_bytes()), slot);
        }
        assert_eq!(tag_of_slot(hash_slot(b"0")), "0", "the shortest, first in the alphabet's order");
    }
}
