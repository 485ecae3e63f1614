//! The limiter's rules on the memory backend, and the handler's side (waiting in place,
//! deferring, releasing), on paused time.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::*;

const A: &str = "a.example:443";
const B: &str = "b.example:443";

fn policy(concurrency: u32, rate: f64) -> HostPolicy {
    HostPolicy {
        concurrency,
        rate,
        lease: Duration::from_secs(30),
        throttle_base: HostPolicy::THROTTLE_BASE,
        throttle_max: Duration::from_secs(60),
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

async fn acquire(limiter: &dyn HostLimiter, host: &str, lease: &str) -> Admission {
    limiter.try_acquire(host, lease).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_host_has_at_most_its_concurrency_and_other_hosts_are_not_affected() {
    let limiter = MemoryLimiter::new(policy(2, 0.0));
    assert_eq!(acquire(&limiter, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&limiter, A, "2").await, Admission::Granted);
    assert_eq!(acquire(&limiter, A, "3").await, Admission::Busy { held: 2, limit: 2 });
    assert_eq!(acquire(&limiter, B, "4").await, Admission::Granted, "another host keeps its share");
    assert_eq!(acquire(&limiter, B, "5").await, Admission::Granted);
    limiter.release(A, "1", true).await.unwrap();
    assert_eq!(acquire(&limiter, A, "3").await, Admission::Granted);
    for (host, lease) in [(A, "2"), (A, "3"), (B, "4"), (B, "5")] {
        limiter.release(host, lease, true).await.unwrap();
    }
    limiter.release(A, "never-held", false).await.unwrap();
    assert_eq!(limiter.hosts(), 0, "idle hosts are forgotten");
}

#[tokio::test(start_paused = true)]
async fn an_unreleased_slot_frees_itself_when_its_lease_expires() {
    let limiter = MemoryLimiter::new(policy(1, 0.0));
    assert_eq!(acquire(&limiter, A, "killed").await, Admission::Granted);
    tokio::time::advance(secs(29)).await;
    assert_eq!(acquire(&limiter, A, "next").await, Admission::Busy { held: 1, limit: 1 });
    tokio::time::advance(secs(1)).await;
    assert_eq!(acquire(&limiter, A, "next").await, Admission::Granted, "the lease ran out");
}

#[tokio::test(start_paused = true)]
async fn the_rate_spaces_requests_and_a_busy_host_uses_none_of_it() {
    let limiter = MemoryLimiter::new(policy(1, 2.0));
    assert_eq!(acquire(&limiter, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&limiter, A, "2").await, Admission::Busy { held: 1, limit: 1 });
    limiter.release(A, "1", true).await.unwrap();
    assert_eq!(acquire(&limiter, A, "2").await, Admission::RateLimited { wait: ms(500) });
    tokio::time::advance(ms(200)).await;
    assert_eq!(acquire(&limiter, A, "2").await, Admission::RateLimited { wait: ms(300) });
    assert_eq!(acquire(&limiter, B, "3").await, Admission::Granted, "each host has its own rate");
    tokio::time::advance(ms(300)).await;
    assert_eq!(acquire(&limiter, A, "2").await, Admission::Granted);
}

#[tokio::test(start_paused = true)]
async fn a_throttle_pauses_that_host_for_its_capped_retry_after_and_halves_it() {
    let limiter = MemoryLimiter::new(policy(4, 4.0));
    assert_eq!(limiter.throttle(A, Some(secs(5))).await.unwrap(), secs(5));
    assert_eq!(acquire(&limiter, A, "1").await, Admission::Throttled { wait: secs(5) });
    assert_eq!(acquire(&limiter, B, "2").await, Admission::Granted, "other hosts keep full speed");
    tokio::time::advance(secs(5)).await;
    // One level down: 2 slots instead of 4, a request every 500 ms instead of every 250 ms.
    assert_eq!(acquire(&limiter, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&limiter, A, "3").await, Admission::RateLimited { wait: ms(500) });
    tokio::time::advance(ms(500)).await;
    assert_eq!(acquire(&limiter, A, "3").await, Admission::Granted);
    tokio::time::advance(ms(500)).await;
    assert_eq!(acquire(&limiter, A, "4").await, Admission::Busy { held: 2, limit: 2 });

    assert_eq!(limiter.throttle(B, Some(secs(3600))).await.unwrap(), secs(60), "capped by throttle_max");
}

#[tokio::test(start_paused = true)]
async fn without_retry_after_the_pause_doubles_and_successes_take_the_host_back_up() {
    let limiter = MemoryLimiter::new(policy(4, 0.0));
    let mut pauses = Vec::new();
    for _ in 0..4 {
        let pause = limiter.throttle(A, None).await.unwrap();
        pauses.push(pause);
        tokio::time::advance(pause).await;
    }
    assert_eq!(pauses, [secs(1), secs(2), secs(4), secs(8)]);
    // Levels 4, 3 and 2 leave one slot (4 >> 2 = 1); each success takes the host a level up.
    for _ in 0..3 {
        assert_eq!(acquire(&limiter, A, "1").await, Admission::Granted);
        assert_eq!(acquire(&limiter, A, "2").await, Admission::Busy { held: 1, limit: 1 });
        limiter.release(A, "1", true).await.unwrap();
    }
    // Level 1: two slots.
    assert_eq!(acquire(&limiter, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&limiter, A, "2").await, Admission::Granted);
    assert_eq!(acquire(&limiter, A, "3").await, Admission::Busy { held: 2, limit: 2 });
    limiter.release(A, "1", false).await.unwrap();
    limiter.release(A, "2", false).await.unwrap();
    assert_eq!(acquire(&limiter, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&limiter, A, "2").await, Admission::Granted);
    assert_eq!(acquire(&limiter, A, "3").await, Admission::Busy { held: 2, limit: 2 }, "a failure restores nothing");
    limiter.release(A, "1", true).await.unwrap();
    limiter.release(A, "2", true).await.unwrap();
    // Level 0 again: the next pause starts from 1 s.
    assert_eq!(limiter.throttle(A, None).await.unwrap(), secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_throttle_during_a_pause_extends_it_but_takes_no_level() {
    let limiter = MemoryLimiter::new(policy(4, 0.0));
    assert_eq!(limiter.throttle(A, None).await.unwrap(), secs(1));
    // The other requests already in flight answer 429 too.
    assert_eq!(limiter.throttle(A, None).await.unwrap(), secs(1));
    assert_eq!(limiter.throttle(A, Some(secs(3))).await.unwrap(), secs(3), "a longer Retry-After extends it");
    assert_eq!(limiter.throttle(A, Some(secs(1))).await.unwrap(), secs(3), "a shorter one does not cut it");
    tokio::time::advance(secs(3)).await;
    for lease in ["1", "2"] {
        assert_eq!(acquire(&limiter, A, lease).await, Admission::Granted);
    }
    assert_eq!(acquire(&limiter, A, "3").await, Admission::Busy { held: 2, limit: 2 }, "one level, not four");
}

#[tokio::test(start_paused = true)]
async fn a_success_during_the_pause_does_not_end_the_slow_down() {
    let limiter = MemoryLimiter::new(policy(2, 0.0));
    assert_eq!(acquire(&limiter, A, "early").await, Admission::Granted);
    limiter.throttle(A, Some(secs(2))).await.unwrap();
    // A request started before the pause succeeds during it.
    limiter.release(A, "early", true).await.unwrap();
    tokio::time::advance(secs(2)).await;
    assert_eq!(acquire(&limiter, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&limiter, A, "2").await, Admission::Busy { held: 1, limit: 1 });
}

#[tokio::test(start_paused = true)]
async fn a_slowed_host_is_forgotten_after_the_level_memory() {
    let limiter = MemoryLimiter::new(policy(2, 0.0));
    limiter.throttle(A, None).await.unwrap();
    tokio::time::advance(secs(1) + HostPolicy::LEVEL_MEMORY - secs(1)).await;
    assert_eq!(limiter.hosts(), 1);
    assert_eq!(acquire(&limiter, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&limiter, A, "2").await, Admission::Busy { held: 1, limit: 1 });
    limiter.release(A, "1", false).await.unwrap();
    tokio::time::advance(secs(1)).await;
    assert_eq!(acquire(&limiter, A, "1").await, Admission::Granted);
    assert_eq!(acquire(&limiter, A, "2").await, Admission::Granted, "forgotten: full speed");
}

#[test]
fn the_policy_halves_per_level_and_caps_its_pauses() {
    let policy = HostPolicy { throttle_max: secs(5), ..policy(5, 10.0) };
    assert_eq!((0..5).map(|level| policy.limit(level)).collect::<Vec<_>>(), [5, 2, 1, 1, 1]);
    assert_eq!(policy.limit(40), 1);
    assert_eq!(policy.interval(0), Some(ms(100)));
    assert_eq!(policy.interval(2), Some(ms(400)));
    assert_eq!(HostPolicy { rate: 0.0, ..policy }.interval(0), None);
    assert_eq!((1..=5).map(|level| policy.pause(level, None)).collect::<Vec<_>>(), [1, 2, 4, 5, 5].map(secs));
    assert_eq!(policy.pause(1, Some(secs(3))), secs(3));
    assert_eq!(policy.pause(1, Some(secs(30))), secs(5));
    assert_eq!(policy.pause(1, Some(Duration::ZERO)), Duration::ZERO);
    let short = HostPolicy { throttle_max: ms(300), ..policy };
    assert_eq!(short.pause(1, None), ms(300), "a throttle_max under 1 s caps the first pause too");

    let mut settings = Settings::default();
    settings.download.per_host.rate = 0.5;
    settings.download.total_timeout = secs(45);
    let from = HostPolicy::from_settings(&settings.download);
    assert_eq!((from.concurrency, from.rate, from.lease, from.throttle_max), (4, 0.5, secs(55), secs(60)));
    assert_eq!(from.interval(0), Some(secs(2)));
}

#[test]
fn host_keys_are_the_lowercased_host_and_port() {
    let cases = [
        ("https://Images.Example.COM/cat.jpg", Some("images.example.com:443")),
        ("http://images.example.com/cat.jpg?sig=1", Some("images.example.com:80")),
        ("http://user:pw@images.example.com:8080/x", Some("images.example.com:8080")),
        ("HTTP://127.0.0.2:9000/", Some("127.0.0.2:9000")),
        ("http://[::1]:8080/", Some("[::1]:8080")),
        ("https://bücher.example/", Some("xn--bcher-kva.example:443")),
        ("ftp://example.com/x", None),
        ("not a url", None),
        ("file:///etc/passwd", None),
    ];
    for (url, key) in cases {
        assert_eq!(host_key(url).as_deref(), key, "{url}");
    }
}

fn politeness(limiter: &Arc<MemoryLimiter>, max_wait: Duration) -> Politeness {
    Politeness::new(limiter.clone(), max_wait)
}

#[tokio::test(start_paused = true)]
async fn a_download_waits_in_place_for_a_slot_freed_within_max_wait() {
    let limiter = Arc::new(MemoryLimiter::new(policy(1, 0.0)));
    let polite = politeness(&limiter, secs(2));
    let held = polite.acquire(A).await.unwrap();
    assert_eq!(held.host(), A);
    let started = Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep(ms(700)).await;
        held.release(true).await;
    });
    let slot = polite.acquire(A).await.expect("the slot freed in time");
    let waited = started.elapsed();
    assert!((ms(700)..ms(1000)).contains(&waited), "{waited:?}: polled, at most 250 ms apart");
    slot.release(true).await;
}

#[tokio::test(start_paused = true)]
async fn a_busy_host_defers_after_max_wait_with_a_short_jittered_delay() {
    let limiter = Arc::new(MemoryLimiter::new(policy(1, 0.0)));
    let polite = politeness(&limiter, secs(2));
    let _held = polite.acquire(A).await.unwrap();
    let started = Instant::now();
    let deferral = polite.acquire(A).await.unwrap_err();
    assert_eq!(started.elapsed(), secs(2), "waited max_wait in place");
    assert_eq!((deferral.code, deferral.host.as_str()), (codes::HOST_BUSY, A));
    assert_eq!(deferral.detail, "1 of 1 downloads running (waited 2s)");
    assert!((ms(500)..=ms(750)).contains(&deferral.retry_after), "{:?}", deferral.retry_after);
    assert_eq!(polite.acquire(B).await.map(|slot| slot.host().to_owned()).unwrap(), B);

    let at_once = politeness(&limiter, Duration::ZERO).acquire(A).await.unwrap_err();
    assert_eq!(at_once.code, codes::HOST_BUSY, "max_wait 0s defers at once");
}

#[tokio::test(start_paused = true)]
async fn the_deferral_delay_grows_with_the_downloads_waiting_for_the_host() {
    assert!((ms(500)..=ms(750)).contains(&queue_delay(1, 2)));
    assert!((ms(500)..=ms(750)).contains(&queue_delay(2, 2)));
    assert!((secs(1)..=ms(1500)).contains(&queue_delay(3, 2)));
    assert!((secs(2)..=secs(3)).contains(&queue_delay(5, 2)));
    assert!((secs(4)..=secs(5)).contains(&queue_delay(500, 2)), "at most 5 s");

    let limiter = Arc::new(MemoryLimiter::new(policy(1, 0.0)));
    let polite = politeness(&limiter, ms(100));
    let _held = polite.acquire(A).await.unwrap();
    let waiting: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn({
                let polite = polite.clone();
                async move { polite.acquire(A).await.unwrap_err().retry_after }
            })
        })
        .collect();
    let mut delays = Vec::new();
    for waiter in waiting {
        delays.push(waiter.await.unwrap());
    }
    assert!(delays.iter().any(|d| *d >= secs(1)), "four waiters for one slot: {delays:?}");
}

#[tokio::test(start_paused = true)]
async fn a_paused_host_defers_at_once_until_the_pause_ends_and_a_short_pause_is_waited_out() {
    let limiter = Arc::new(MemoryLimiter::new(policy(2, 0.0)));
    let polite = politeness(&limiter, secs(2));
    polite.throttled(A, StatusCode::TOO_MANY_REQUESTS, Some(secs(10))).await;
    let started = Instant::now();
    let deferral = polite.acquire(A).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO, "no use waiting for a pause longer than max_wait");
    assert_eq!(deferral.code, codes::HOST_THROTTLED);
    assert!((secs(10)..=ms(12_500)).contains(&deferral.retry_after), "{:?}", deferral.retry_after);

    polite.throttled(B, StatusCode::SERVICE_UNAVAILABLE, Some(ms(1500))).await;
    let slot = polite.acquire(B).await.expect("a pause within max_wait is waited out");
    assert_eq!(started.elapsed(), ms(1500));
    slot.release(true).await;
}

#[tokio::test(start_paused = true)]
async fn a_rate_limited_host_is_waited_for_within_max_wait_and_deferred_past_it() {
    let limiter = Arc::new(MemoryLimiter::new(policy(4, 0.25)));
    let polite = politeness(&limiter, secs(2));
    polite.acquire(A).await.unwrap().release(true).await;
    let deferral = polite.acquire(A).await.unwrap_err();
    assert_eq!(deferral.code, codes::HOST_BUSY);
    assert!(deferral.detail.starts_with("request rate used up for 4s"), "{}", deferral.detail);
    assert!(deferral.retry_after >= secs(4), "not before the rate frees: {:?}", deferral.retry_after);

    let patient = politeness(&limiter, secs(5));
    let started = Instant::now();
    patient.acquire(A).await.unwrap().release(true).await;
    assert_eq!(started.elapsed(), secs(4));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_slot_is_released_in_the_background() {
    let limiter = Arc::new(MemoryLimiter::new(policy(1, 0.0)));
    let polite = politeness(&limiter, Duration::ZERO);
    let slot = polite.acquire(A).await.unwrap();
    assert!(polite.acquire(A).await.is_err());
    drop(slot);
    tokio::task::yield_now().await;
    polite.acquire(A).await.expect("released by Drop").release(true).await;
    assert_eq!(limiter.hosts(), 0);
}

/// A limiter whose store is down, or hangs.
#[derive(Debug)]
struct Broken {
    hang: bool,
}

#[async_trait]
impl HostLimiter for Broken {
    async fn try_acquire(&self, host: &str, _: &str) -> Result<Admission, LimiterError> {
        self.fail(host).await
    }

    async fn release(&self, host: &str, _: &str, _: bool) -> Result<(), LimiterError> {
        self.fail(host).await
    }

    async fn throttle(&self, host: &str, _: Option<Duration>) -> Result<Duration, LimiterError> {
        self.fail(host).await
    }
}

impl Broken {
    async fn fail<T>(&self, host: &str) -> Result<T, LimiterError> {
        if self.hang {
            std::future::pending::<()>().await;
        }
        Err(LimiterError::Reply { action: "testing", host: host.to_owned(), answer: vec![-1] })
    }
}

#[tokio::test(start_paused = true)]
async fn a_broken_or_hanging_limiter_lets_downloads_go_ahead() {
    for hang in [false, true] {
        let polite = Politeness::new(Arc::new(Broken { hang }), secs(2));
        let started = Instant::now();
        let slot = polite.acquire(A).await.expect("fails open");
        polite.throttled(A, StatusCode::TOO_MANY_REQUESTS, None).await;
        slot.release(true).await;
        let limit = if hang { Politeness::CALL_TIMEOUT * 3 } else { Duration::ZERO };
        assert_eq!(started.elapsed(), limit, "hang: {hang}");
    }
    let error = LimiterError::Timeout { action: "acquiring a slot", host: A.into(), after: Politeness::CALL_TIMEOUT };
    assert!(error.is_unreachable());
}
