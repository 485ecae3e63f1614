//! The per-host limiter's contract, run the same against the memory backend and Redis: two
//! replicas (for memory, one limiter shared through its `Arc`; for Redis, two connections on one
//! key prefix, fresh per test) see one set of limits. Real time, short durations.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use imagepipe_download_worker::politeness::{Admission, HostLimiter, HostPolicy, MemoryLimiter};

const A: &str = "127.0.0.2:8080";
const B: &str = "127.0.0.3:8080";

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn policy(concurrency: u32, rate: f64) -> HostPolicy {
    HostPolicy { concurrency, rate, lease: Duration::from_secs(30), throttle_base: ms(100), throttle_max: ms(250) }
}

/// Where a case's limiters live.
enum Harness {
    Memory,
    Redis { prefix: String, _cleanup: RedisCleanup },
    Cluster { prefix: String, _cleanup: ClusterCleanup },
}

impl Harness {
    fn redis(test: &str) -> Self {
        let prefix = unique_prefix(test);
        Self::Redis { _cleanup: RedisCleanup(prefix.clone()), prefix }
    }

    fn cluster(test: &str) -> Self {
        let prefix = unique_prefix(test);
        Self::Cluster { _cleanup: ClusterCleanup(prefix.clone()), prefix }
    }

    /// Two replicas' limiters sharing their state; `None` when Redis is missing (and skips
    /// are allowed).
    async fn replicas(&self, policy: HostPolicy) -> Option<[Arc<dyn HostLimiter>; 2]> {
        match self {
            Harness::Memory => {
                let shared: Arc<dyn HostLimiter> = Arc::new(MemoryLimiter::new(policy));
                Some([shared.clone(), shared])
            }
            Harness::Redis { prefix, .. } => {
                let one = redis_limiter(prefix, policy).await?;
                let two = redis_limiter(prefix, policy).await?;
                Some([Arc::new(one), Arc::new(two)])
            }
            Harness::Cluster { prefix, .. } => {
                let url = redis_cluster_url()?;
                let one = redis_limiter_at(&url, prefix, policy).await?;
                let two = redis_limiter_at(&url, prefix, policy).await?;
                Some([Arc::new(one), Arc::new(two)])
            }
        }
    }
}

async fn acquire(limiter: &Arc<dyn HostLimiter>, host: &str, lease: &str) -> Admission {
    limiter.try_acquire(host, lease).await.unwrap()
}

/// `admission` is a wait of at most `most` and more than `most - slack`.
fn assert_wait(admission: Admission, throttled: bool, most: Duration, slack: Duration) {
    let wait = match (admission, throttled) {
        (Admission::Throttled { wait }, true) | (Admission::RateLimited { wait }, false) => wait,
        other => panic!("expected a {} wait, got {other:?}", if throttled { "throttle" } else { "rate" }),
    };
    assert!(wait <= most && wait + slack > most, "{wait:?}, expected just under {most:?}");
}

async fn concurrency_is_shared_by_the_replicas_and_per_host(harness: &Harness) {
    let Some([one, two]) = harness.replicas(policy(2, 0.0)).await else { return };
    assert_eq!(acquire(&one, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&two, A, "2").await, Admission::Granted);
    assert_eq!(acquire(&one, A, "3").await, Admission::Busy { held: 2, limit: 2 });
    assert_eq!(acquire(&two, A, "3").await, Admission::Busy { held: 2, limit: 2 });
    assert_eq!(acquire(&two, B, "4").await, Admission::Granted, "another host keeps its share");
    assert_eq!(acquire(&one, B, "5").await, Admission::Granted);
    one.release(A, "2", true).await.unwrap();
    assert_eq!(acquire(&two, A, "3").await, Admission::Granted, "released by the other replica");
    two.release(A, "3", true).await.unwrap();
    two.release(A, "3", true).await.unwrap();
    one.release(A, "unknown", false).await.unwrap();
    assert_eq!(acquire(&one, A, "6").await, Admission::Granted, "a repeated release frees one slot");
    assert_eq!(acquire(&one, A, "7").await, Admission::Busy { held: 2, limit: 2 });
}

async fn a_killed_replicas_slot_frees_itself_when_its_lease_expires(harness: &Harness) {
    let Some([one, two]) = harness.replicas(HostPolicy { lease: ms(300), ..policy(1, 0.0) }).await else { return };
    assert_eq!(acquire(&one, A, "killed").await, Admission::Granted);
    assert_eq!(acquire(&two, A, "next").await, Admission::Busy { held: 1, limit: 1 });
    tokio::time::sleep(ms(350)).await;
    assert_eq!(acquire(&two, A, "next").await, Admission::Granted);
}

async fn the_rate_spaces_requests_across_replicas(harness: &Harness) {
    let Some([one, two]) = harness.replicas(policy(1, 5.0)).await else { return };
    assert_eq!(acquire(&one, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&two, A, "2").await, Admission::Busy { held: 1, limit: 1 }, "busy before rate");
    one.release(A, "1", true).await.unwrap();
    assert_wait(acquire(&two, A, "2").await, false, ms(200), ms(150));
    assert_eq!(acquire(&two, B, "3").await, Admission::Granted, "each host has its own rate");
    tokio::time::sleep(ms(210)).await;
    assert_eq!(acquire(&two, A, "2").await, Admission::Granted);
}

async fn a_throttle_pauses_only_that_host_then_halves_it(harness: &Harness) {
    let Some([one, two]) = harness.replicas(HostPolicy { throttle_max: ms(2000), ..policy(4, 0.0) }).await else {
        return;
    };
    assert_eq!(one.throttle(A, Some(ms(300))).await.unwrap(), ms(300));
    assert_wait(acquire(&two, A, "1").await, true, ms(300), ms(150));
    assert_eq!(acquire(&two, B, "2").await, Admission::Granted, "other hosts keep full speed");
    assert_eq!(one.throttle(B, Some(ms(60_000))).await.unwrap(), ms(2000), "capped by throttle_max");
    tokio::time::sleep(ms(310)).await;
    assert_eq!(acquire(&two, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&one, A, "3").await, Admission::Granted);
    assert_eq!(acquire(&one, A, "4").await, Admission::Busy { held: 2, limit: 2 }, "4 slots halved");
}

async fn without_retry_after_the_pause_doubles_to_the_cap_and_successes_undo_it(harness: &Harness) {
    let Some([one, two]) = harness.replicas(policy(4, 0.0)).await else { return };
    let mut pauses = Vec::new();
    for replica in [&one, &two, &one] {
        let pause = replica.throttle(A, None).await.unwrap();
        pauses.push(pause);
        tokio::time::sleep(pause + ms(10)).await;
    }
    assert_eq!(pauses, [ms(100), ms(200), ms(250)]);
    assert_eq!(acquire(&two, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&two, A, "2").await, Admission::Busy { held: 1, limit: 1 }, "level 3: one slot");
    for level in [3, 2] {
        two.release(A, "1", true).await.unwrap();
        assert_eq!(acquire(&one, A, "1").await, Admission::Granted, "level {level}");
    }
    // Level 1 now: two slots.
    assert_eq!(acquire(&one, A, "2").await, Admission::Granted);
    assert_eq!(acquire(&one, A, "3").await, Admission::Busy { held: 2, limit: 2 });
    one.release(A, "2", false).await.unwrap();
    assert_eq!(acquire(&one, A, "2").await, Admission::Granted);
    assert_eq!(acquire(&one, A, "3").await, Admission::Busy { held: 2, limit: 2 }, "a failure restores nothing");
    one.release(A, "1", true).await.unwrap();
    one.release(A, "2", true).await.unwrap();
    assert_eq!(two.throttle(A, None).await.unwrap(), ms(100), "back to level 0: the first pause again");
}

async fn a_throttle_during_a_pause_takes_no_level_and_a_success_during_it_none_back(harness: &Harness) {
    let Some([one, two]) = harness.replicas(HostPolicy { throttle_max: ms(2000), ..policy(4, 0.0) }).await else {
        return;
    };
    assert_eq!(acquire(&one, A, "early").await, Admission::Granted);
    assert_eq!(one.throttle(A, None).await.unwrap(), ms(100));
    let again = two.throttle(A, None).await.unwrap();
    assert!(again <= ms(100) && again > ms(50), "{again:?}: the same pause");
    let extended = two.throttle(A, Some(ms(300))).await.unwrap();
    assert_eq!(extended, ms(300), "a longer Retry-After extends it");
    let kept = one.throttle(A, Some(ms(50))).await.unwrap();
    assert!(kept <= ms(300) && kept > ms(200), "{kept:?}: a shorter one does not cut it");
    one.release(A, "early", true).await.unwrap();
    tokio::time::sleep(ms(310)).await;
    assert_eq!(acquire(&one, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&two, A, "2").await, Admission::Granted);
    assert_eq!(acquire(&two, A, "3").await, Admission::Busy { held: 2, limit: 2 }, "one level, kept");
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(&super::Harness::Memory).await;
                }
            )*
        }

        mod redis {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(&super::Harness::redis(stringify!($case))).await;
                }
            )*
        }

        mod cluster {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(&super::Harness::cluster(stringify!($case))).await;
                }
            )*
        }
    };
}

conformance!(
    concurrency_is_shared_by_the_replicas_and_per_host,
    a_killed_replicas_slot_frees_itself_when_its_lease_expires,
    the_rate_spaces_requests_across_replicas,
    a_throttle_pauses_only_that_host_then_halves_it,
    without_retry_after_the_pause_doubles_to_the_cap_and_successes_undo_it,
    a_throttle_during_a_pause_takes_no_level_and_a_success_during_it_none_back,
);

/// The Redis layout: a host's keys share one hash tag (so one Redis Cluster slot), under the
/// prefix, and each expires (a lease with its newest slot, the throttle state after the level memory).
#[tokio::test]
async fn redis_keys_are_hash_tagged_per_host_and_expire() {
    let prefix = unique_prefix("layout");
    let _cleanup = RedisCleanup(prefix.clone());
    let Some(limiter) = redis_limiter(&prefix, policy(2, 10.0)).await else { return };
    assert_eq!(limiter.key(A, "leases"), format!("{prefix}:polite:{{{A}}}:leases"));
    assert_eq!(limiter.try_acquire(A, "1").await.unwrap(), Admission::Granted);
    limiter.throttle(A, None).await.unwrap();
    let mut conn = ::redis::Client::open(redis_url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let mut keys: Vec<String> = ::redis::cmd("KEYS").arg(format!("{prefix}:*")).query_async(&mut conn).await.unwrap();
    keys.sort();
    let tagged = |part: &str| format!("{prefix}:polite:{{{A}}}:{part}");
    assert_eq!(keys, [tagged("leases"), tagged("rate"), tagged("throttle")]);
    for (part, most) in [("leases", 30_000), ("rate", 100), ("throttle", 100 + 600_000)] {
        let ttl: i64 = ::redis::cmd("PTTL").arg(tagged(part)).query_async(&mut conn).await.unwrap();
        assert!(ttl > 0 && ttl <= most, "{part}: {ttl} ms");
    }
}
