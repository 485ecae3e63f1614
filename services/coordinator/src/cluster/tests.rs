//! Replicas joining, leaving and dying at random over one store: every shard ends with exactly
//! one owner, the share-out balanced, and no two replicas ever hold a valid lease on one shard.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use imagepipe_runtime::clock::{Clock, ManualClock};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{ClusterConfig, LeaseLoop, Ownership};
use crate::store::TaskStore;
use crate::store::embedded::EmbeddedStore;

const SHARDS: u16 = 16;
const LEASE: Duration = Duration::from_secs(5);

struct Member {
    ownership: Ownership,
    lease_loop: LeaseLoop,
    /// Stands in for the intake: reports every owned set read as soon as it changes.
    intake: tokio::task::JoinHandle<()>,
}

fn config() -> ClusterConfig {
    ClusterConfig { shards: SHARDS, lease: LEASE, address: None }
}

fn join(store: &Arc<dyn TaskStore>, clock: &ManualClock, id: String) -> Member {
    let ownership = Ownership::new(id, SHARDS);
    let mut owned = ownership.watch();
    let reporter = ownership.clone();
    let intake = tokio::spawn(async move {
        loop {
            let generation = owned.borrow_and_update().generation;
            reporter.drained(generation);
            if owned.changed().await.is_err() {
                return;
            }
        }
    });
    let lease_loop = LeaseLoop::new(store.clone(), ownership.clone(), Arc::new(clock.clone()), config());
    Member { ownership, lease_loop, intake }
}

/// An embedded store of [`SHARDS`] shards in `dir`.
fn store_in(dir: &tempfile::TempDir) -> Arc<dyn TaskStore> {
    Arc::new(EmbeddedStore::open(dir.path(), Duration::from_secs(10)).unwrap().with_shards(SHARDS))
}

/// No shard is held, by the holders' own views, by two replicas at `now`.
fn assert_no_two_owners(members: &BTreeMap<String, Member>, now: u64) {
    let mut holders: BTreeMap<u16, Vec<&str>> = BTreeMap::new();
    for (id, member) in members {
        for (shard, lease) in member.ownership.leases() {
            if lease.expires_at > now {
                holders.entry(shard).or_default().push(id);
            }
        }
    }
    for (shard, ids) in holders {
        assert!(ids.len() <= 1, "shard {shard} held by {ids:?} at once");
    }
}

async fn period(members: &BTreeMap<String, Member>, clock: &ManualClock) {
    for member in members.values() {
        member.lease_loop.tick(false).await.unwrap();
        tokio::task::yield_now().await;
    }
    assert_no_two_owners(members, clock.unix_ms());
    clock.advance(LEASE / 5);
}

async fn run(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir);
    let clock = ManualClock::at_unix_ms(1_700_000_000_000);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut members: BTreeMap<String, Member> = BTreeMap::new();
    let mut next = 0;
    for _ in 0..30 {
        match rng.random_range(0..10) {
            0..=3 if members.len() < 5 => {
                next += 1;
                let id = format!("r{next}");
                members.insert(id.clone(), join(&store, &clock, id));
            }
            4 | 5 if members.len() > 1 => {
                let id = members.keys().nth(rng.random_range(0..members.len())).unwrap().clone();
                let member = members.remove(&id).unwrap();
                member.lease_loop.hand_over().await;
                member.intake.abort();
            }
            6 if members.len() > 1 => {
                // Killed: it releases nothing; its leases run out.
                let id = members.keys().nth(rng.random_range(0..members.len())).unwrap().clone();
                members.remove(&id).unwrap().intake.abort();
            }
            _ => {}
        }
        for _ in 0..rng.random_range(1..4) {
            period(&members, &clock).await;
        }
    }
    if members.is_empty() {
        members.insert("last".into(), join(&store, &clock, "last".into()));
    }
    // Settle: past every dead replica's lease and announcement, then a few periods more.
    for _ in 0..(5 * 2 + 6) {
        period(&members, &clock).await;
    }
    let now = clock.unix_ms();
    let mut owners: BTreeMap<u16, &str> = BTreeMap::new();
    for (id, member) in &members {
        for shard in member.ownership.leases().keys() {
            assert!(owners.insert(*shard, id).is_none(), "seed {seed}: shard {shard} owned twice");
        }
    }
    assert_eq!(owners.len(), usize::from(SHARDS), "seed {seed}: every shard has an owner: {owners:?}");
    let stored = store.leases().await.unwrap();
    for lease in &stored {
        assert_eq!(Some(&lease.owner.as_str()), owners.get(&lease.shard), "seed {seed}: the store agrees");
        assert!(lease.expires_at > now);
    }
    let shares: Vec<usize> = members.values().map(|m| m.ownership.leases().len()).collect();
    let (min, max) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
    assert!(max - min <= 1, "seed {seed}: shares {shares:?}");
    for member in members.into_values() {
        member.intake.abort();
    }
}

#[tokio::test]
async fn replicas_joining_leaving_and_dying_settle_on_one_owner_per_shard() {
    for seed in 0..24 {
        run(seed).await;
    }
}

#[tokio::test]
async fn a_late_replica_writes_nothing_once_another_took_its_shard() {
    use crate::machine::{self, Input};
    use imagepipe_contracts::{ImageSource, SubmitTask, TraceId};

    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir);
    let clock = ManualClock::at_unix_ms(1_700_000_000_000);
    let a = join(&store, &clock, "a".into());
    a.lease_loop.tick(false).await.unwrap();
    assert_eq!(a.ownership.leases().len(), usize::from(SHARDS));

    let submit = SubmitTask { url: Some("https://example.com/a.jpg".into()), ..SubmitTask::default() };
    let source = ImageSource::Url("https://example.com/a.jpg".into());
    let created = machine::create("tsk_fenced".into(), &submit, source, TraceId::random(), clock.unix_ms());
    assert_eq!(store.apply_many(std::slice::from_ref(&created)).await.unwrap(), vec![crate::store::Applied::Yes]);
    let fence = a.ownership.fence("tsk_fenced", clock.unix_ms()).unwrap();

    // a stops renewing (SIGSTOP); past its lease, b takes every shard.
    clock.advance(LEASE + Duration::from_secs(1));
    let b = join(&store, &clock, "b".into());
    b.lease_loop.tick(false).await.unwrap();
    assert_eq!(b.ownership.leases().len(), usize::from(SHARDS));

    // a wakes up with its old lease: the store refuses its write.
    let machine::Verdict::Apply(mut start) = machine::decide(
        &created.task,
        &Input::Start,
        &machine::Context { now: clock.unix_ms(), ..machine::Context::default() },
        &machine::Policy::default(),
    )
    .unwrap() else {
        panic!("a queued task starts")
    };
    start.fence = Some(machine::Fence { now: clock.unix_ms(), ..fence });
    assert_eq!(store.apply_many(std::slice::from_ref(&start)).await.unwrap(), vec![crate::store::Applied::Fenced]);
    assert_eq!(store.get("tsk_fenced").await.unwrap().unwrap().version, 1, "nothing written");
    // Its next period finds the leases gone and gives the shards up.
    a.lease_loop.tick(false).await.unwrap();
    assert!(a.ownership.leases().is_empty());
    a.intake.abort();
    b.intake.abort();
}

#[tokio::test]
async fn leases_not_renewed_in_time_are_let_go_and_taken_again_when_the_store_answers() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir);
    let clock = ManualClock::at_unix_ms(1_700_000_000_000);
    let member = join(&store, &clock, "a".into());
    member.lease_loop.tick(false).await.unwrap();
    assert_eq!(member.ownership.shards().len(), usize::from(SHARDS));
    assert_eq!(member.ownership.lapse(clock.unix_ms()), 0, "leases within their time are kept");

    // No renewal for a whole lease (the store hung): every shard is let go here.
    clock.advance(LEASE + Duration::from_millis(1));
    assert_eq!(member.ownership.lapse(clock.unix_ms()), usize::from(SHARDS));
    assert!(member.ownership.shards().is_empty(), "no shard is read after its lease ran out");

    // The store answers again: the next period takes them back.
    member.lease_loop.tick(false).await.unwrap();
    assert_eq!(member.ownership.shards().len(), usize::from(SHARDS));
    member.intake.abort();
}
