//! The share-out of shards among replicas: a pure function every replica computes alike from
//! the same view (live replicas, current owners), so that they converge on one plan.

use std::collections::{BTreeMap, BTreeSet};

/// Who should own each shard: every shard `0..shards` to one of `replicas`, each replica
/// `shards / n` or one more (the first `shards % n` replicas in id order get one more), keeping
/// each shard with its current owner (`owners`, only valid leases) while that owner is live
/// and within its quota, so that a change of membership moves as few shards as it can.
/// Empty when there are no replicas.
pub fn plan(shards: u16, replicas: &BTreeSet<String>, owners: &BTreeMap<u16, String>) -> BTreeMap<u16, String> {
    let n = replicas.len();
    let mut plan = BTreeMap::new();
    if n == 0 {
        return plan;
    }
    let (base, extra) = (usize::from(shards) / n, usize::from(shards) % n);
    let mut room: BTreeMap<&str, usize> =
        replicas.iter().enumerate().map(|(i, id)| (id.as_str(), base + usize::from(i < extra))).collect();
    let mut unassigned = Vec::new();
    for shard in 0..shards {
        match owners.get(&shard).and_then(|owner| room.get_mut(owner.as_str()).map(|left| (owner, left))) {
            Some((owner, left)) if *left > 0 => {
                *left -= 1;
                plan.insert(shard, owner.clone());
            }
            _ => unassigned.push(shard),
        }
    }
    for shard in unassigned {
        // The replica with the most room left takes it (the first in id order on a tie).
        let taker = room.iter().fold(None::<(&str, usize)>, |best, (id, left)| match best {
            Some((_, most)) if most >= *left => best,
            _ => Some((id, *left)),
        });
        if let Some((id, _)) = taker {
            *room.get_mut(id).expect("a replica from the room table") -= 1;
            plan.insert(shard, id.to_owned());
        }
    }
    plan
}

/// The shards `plan` gives `replica`.
pub fn share_of(plan: &BTreeMap<u16, String>, replica: &str) -> BTreeSet<u16> {
    plan.iter().filter(|(_, owner)| owner.as_str() == replica).map(|(shard, _)| *shard).collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ids(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("r{i}")).collect()
    }

    fn counts(plan: &BTreeMap<u16, String>) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for owner in plan.values() {
            *counts.entry(owner.clone()).or_default() += 1;
        }
        counts
    }

    #[test]
    fn three_replicas_share_64_shards_22_21_21() {
        let plan = plan(64, &ids(3), &BTreeMap::new());
        assert_eq!(plan.len(), 64);
        let counts: Vec<usize> = counts(&plan).into_values().collect();
        assert_eq!(counts, vec![22, 21, 21]);
    }

    #[test]
    fn a_joining_replica_takes_only_its_share() {
        let before = plan(64, &ids(2), &BTreeMap::new());
        let after = plan(64, &ids(3), &before);
        let moved = before.iter().filter(|(shard, owner)| after[*shard] != **owner).count();
        assert_eq!(moved, 21, "only the newcomer's share moves");
        assert_eq!(share_of(&after, "r2").len(), 21);
    }

    #[test]
    fn no_replicas_no_plan() {
        assert!(plan(64, &BTreeSet::new(), &BTreeMap::new()).is_empty());
    }

    proptest! {
        #[test]
        fn every_shard_has_one_owner_within_one_of_the_mean(
            shards in 1u16..300,
            n in 1usize..6,
            current in proptest::collection::btree_map(0u16..300, 0usize..8, 0..300),
        ) {
            let replicas = ids(n);
            let owners = current.into_iter().filter(|(s, _)| *s < shards).map(|(s, r)| (s, format!("r{r}"))).collect();
            let plan = plan(shards, &replicas, &owners);
            prop_assert_eq!(plan.len(), usize::from(shards));
            prop_assert!(plan.values().all(|owner| replicas.contains(owner)));
            let counts = counts(&plan);
            let (min, max) = (counts.values().min().copied().unwrap_or(0), counts.values().max().copied().unwrap_or(0));
            let min = if counts.len() < n { 0 } else { min };
            prop_assert!(max - min <= 1, "shares from {} to {}", min, max);
        }
    }
}
