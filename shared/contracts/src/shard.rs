//! Which shard a task belongs to: the coordinator's unit of ownership and of routing.
//!
//! A task's shard is `(murmur2(taskId as UTF-8) & 0x7fffffff) % shards`, with murmur2 as
//! Apache Kafka's Java client computes it for its default partitioner (seed `0x9747b28c`). So
//! the shard of an id is the same in every process and language, and a Kafka producer in any
//! language that keys by task id with the Java-compatible partitioner (`murmur2_random` in
//! librdkafka) lands in the partition of its shard when the topic has `shards` partitions.
//! docs/contracts.md, "Shards", gives test vectors.

/// How many shards there are unless `coordinator.shards` says otherwise.
pub const DEFAULT_SHARDS: u16 = 64;

/// Most shards `coordinator.shards` may name (a shard is a partition on the bus).
pub const MAX_SHARDS: u16 = 4_096;

/// The shard of task `task_id` among `shards` (at least 1).
pub fn shard_of(task_id: &str, shards: u16) -> u16 {
    let positive = (murmur2(task_id.as_bytes()) as u32) & 0x7fff_ffff;
    (positive % u32::from(shards.max(1))) as u16
}

/// MurmurHash2, 32-bit, seed `0x9747b28c`, exactly as Kafka's `Utils.murmur2`.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len() as u32;
    let mut h: u32 = SEED ^ length;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_gives_the_values_kafka_pins() {
        // Apache Kafka's UtilsTest.testMurmur2: a key hashes here as in a Java producer.
        let cases: [(&str, i32); 6] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
            ("abc", 479_470_107),
        ];
        for (key, expected) in cases {
            assert_eq!(murmur2(key.as_bytes()), expected, "murmur2({key:?})");
        }
    }

    #[test]
    fn the_documented_vectors_hold() {
        // The table in docs/contracts.md, "Shards".
        for (id, shard) in DOC_VECTORS {
            assert_eq!(shard_of(id, 64), shard, "shard_of({id:?}, 64)");
        }
    }

    /// The vectors docs/contracts.md lists (64 shards).
    const DOC_VECTORS: [(&str, u16); 4] =
        [("tsk_0", 51), ("tsk_1", 12), ("abc", 27), ("tsk_3f2b8c1e9d7a4e6f8a0b1c2d3e4f5a6b", 38)];

    proptest::proptest! {
        #[test]
        fn every_id_has_one_shard_in_range(id in ".{0,80}", shards in 1u16..=MAX_SHARDS) {
            let shard = shard_of(&id, shards);
            proptest::prop_assert!(shard < shards);
            proptest::prop_assert_eq!(shard, shard_of(&id.clone(), shards));
        }
    }

    #[test]
    fn ids_spread_over_every_shard() {
        let mut counts = [0u32; DEFAULT_SHARDS as usize];
        for i in 0..64_000 {
            counts[shard_of(&format!("tsk_{i:032x}"), DEFAULT_SHARDS) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min > 800 && *max < 1_200, "shard sizes from {min} to {max} of a mean 1,000");
    }
}
