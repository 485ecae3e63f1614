//! Per-host politeness: how hard the download workers, every replica together, press one source
//! host (`download.per_host.*`).
//!
//! A host is the URL's host, lowercased, and port ([`host_key`]); uploaded blobs are not
//! limited. Per host there are three limits, checked and taken in one atomic step by a
//! [`HostLimiter`]:
//!
//! - a semaphore of `concurrency` slots, each a *lease* that expires on its own (`lease`), so a
//!   worker killed mid-download frees its slot;
//! - a rate (`rate` requests per second, off by default): a request may start only once the
//!   previous one's interval has passed (GCRA without burst);
//! - a throttle: after a 429 or 503 the host is paused for its `Retry-After` (seconds or an HTTP
//!   date), or without one for a backoff doubling from 1 s, both capped by `throttle_max`. Each
//!   throttle also takes the host one *level* down: its concurrency and rate are halved per
//!   level (never below one slot). A success once the pause is over takes it one level back
//!   up; a host not throttled for [`HostPolicy::LEVEL_MEMORY`] is forgotten. A 429 arriving
//!   while the host is already paused (from a request that started before the pause) extends
//!   the pause to its `Retry-After` but takes no further level. Other hosts keep full speed.
//!
//! [`Politeness`] is what the download handler uses: it waits in place for a slot at most
//! `max_wait`, then gives up with a [`Deferral`] the step reports as
//! [`StepFailure::Deferred`](imagepipe_runtime::step::StepFailure::Deferred): the coordinator
//! sends the same attempt again later, charging nothing, and the worker slot is free meanwhile.
//! A [`HostSlot`] is released on every path (explicitly after the request, or by its `Drop`,
//! and at worst by its lease's expiry).
//!
//! Backends: [`MemoryLimiter`] (one process: `imagepipe run`, `store.kind = embedded`; share
//! one through an `Arc` between replicas in a process) and [`RedisLimiter`]
//! (`store.kind = redis`, every replica of every host: Lua scripts on keys hash-tagged per
//! host). [`open_limiter`] picks one from the settings.
//!
//! If the limiter fails (Redis unreachable or slow), downloads go ahead unlimited, with a
//! warning and [`metrics::POLITENESS_ERRORS`]: politeness
//! is a courtesy, and a store hiccup must not fail tasks.

mod memory;
mod redis;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use imagepipe_net::{StatusCode, Url};
use imagepipe_runtime::Settings;
use imagepipe_runtime::backoff::{ExponentialBackoff, Jitter};
use imagepipe_runtime::config::{DownloadConfig, StoreKind};
use rand::Rng;
use tokio::time::Instant;

pub use memory::MemoryLimiter;
pub use redis::RedisLimiter;

use crate::metrics;

/// Stable codes of a deferred download (the `code` of its deferral reason).
pub mod codes {
    /// Every slot of the host is taken, or its request rate is used up.
    pub const HOST_BUSY: &str = "host_busy";
    /// The host answered 429 or 503 and is paused.
    pub const HOST_THROTTLED: &str = "host_throttled";
}

/// The limits every replica applies to each host (from `download.per_host`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostPolicy {
    /// Slots per host at full speed.
    pub concurrency: u32,
    /// Requests per second per host at full speed; `0` is no rate limit.
    pub rate: f64,
    /// How long a slot lives if it is never released.
    pub lease: Duration,
    /// The first pause after a 429 or 503 without `Retry-After`; it doubles per level.
    pub throttle_base: Duration,
    /// The longest pause.
    pub throttle_max: Duration,
}

impl HostPolicy {
    /// The first pause after a 429 or 503 without `Retry-After`.
    pub const THROTTLE_BASE: Duration = Duration::from_secs(1);
    /// Most levels a host is taken down (its concurrency halves per level, to one slot).
    pub const MAX_LEVEL: u32 = 8;
    /// How long a host's slow-down is remembered after its last pause ends.
    pub const LEVEL_MEMORY: Duration = Duration::from_secs(600);

    /// The policy of `download.per_host` (and `download.total_timeout` for the default lease).
    pub fn from_settings(download: &DownloadConfig) -> Self {
        let per_host = &download.per_host;
        Self {
            concurrency: per_host.concurrency.max(1),
            rate: if per_host.rate_limited() { per_host.rate } else { 0.0 },
            lease: download.per_host_lease(),
            throttle_base: Self::THROTTLE_BASE,
            throttle_max: per_host.throttle_max,
        }
    }

    /// The host's concurrency at `level`: halved per level, at least 1.
    pub fn limit(&self, level: u32) -> u32 {
        self.concurrency.checked_shr(level).unwrap_or(0).max(1)
    }

    /// The least time between two requests to the host at `level` (doubled per level); `None`
    /// without a rate limit.
    pub fn interval(&self, level: u32) -> Option<Duration> {
        if self.rate <= 0.0 {
            return None;
        }
        Duration::try_from_secs_f64(f64::from(2u32.saturating_pow(level)) / self.rate).ok()
    }

    /// The pause after a 429 or 503 that took the host to `level` (from 1): its `Retry-After`
    /// when it sent one, else [`throttle_base`](Self::throttle_base) doubling per level; capped
    /// by [`throttle_max`](Self::throttle_max).
    pub fn pause(&self, level: u32, retry_after: Option<Duration>) -> Duration {
        match retry_after {
            Some(delay) => delay.min(self.throttle_max),
            None => self.backoff().delay(level.saturating_sub(1)),
        }
    }

    fn backoff(&self) -> ExponentialBackoff {
        let max = self.throttle_max.max(Duration::from_millis(1));
        ExponentialBackoff::new(self.throttle_base.clamp(Duration::from_millis(1), max), max, Jitter::None)
            .expect("min is non-zero and at most max")
    }
}

/// What [`HostLimiter::try_acquire`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The slot is taken under the lease id given; release it.
    Granted,
    /// Every slot of the host is taken.
    Busy {
        /// Slots held now.
        held: u32,
        /// Slots the host has at its current level.
        limit: u32,
    },
    /// A slot is free but the host's request rate is used up for `wait`.
    RateLimited {
        /// Until the next request may start.
        wait: Duration,
    },
    /// The host answered 429 or 503 and is paused for `wait`.
    Throttled {
        /// Until the pause ends.
        wait: Duration,
    },
}

/// The limiter's store failed.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    /// Connecting to Redis failed.
    #[error("connecting to Redis for per-host politeness")]
    Connect(#[source] ::redis::RedisError),
    /// A Redis script failed.
    #[error("per-host politeness: Redis {action} for {host}")]
    Redis {
        /// What was being done.
        action: &'static str,
        /// The host.
        host: String,
        /// What Redis said.
        #[source]
        source: ::redis::RedisError,
    },
    /// A Redis script answered something this code does not write.
    #[error("per-host politeness: unexpected answer {answer:?} to {action} for {host}")]
    Reply {
        /// What was being done.
        action: &'static str,
        /// The host.
        host: String,
        /// The answer.
        answer: Vec<i64>,
    },
    /// The store took longer than [`Politeness::CALL_TIMEOUT`] to answer.
    #[error("per-host politeness: {action} for {host} took longer than {after:?}")]
    Timeout {
        /// What was being done.
        action: &'static str,
        /// The host.
        host: String,
        /// The limit.
        after: Duration,
    },
}

impl LimiterError {
    /// Whether the store could not be reached (retried at start, `/readyz` false meanwhile).
    pub fn is_unreachable(&self) -> bool {
        match self {
            LimiterError::Connect(source) | LimiterError::Redis { source, .. } => {
                imagepipe_runtime::connect::redis_unreachable(source)
            }
            LimiterError::Timeout { .. } => true,
            LimiterError::Reply { .. } => false,
        }
    }
}

/// The per-host limits' store, shared by every replica it should coordinate (see the module
/// docs). Each call is one atomic step; none waits.
#[async_trait]
pub trait HostLimiter: Send + Sync + fmt::Debug + 'static {
    /// Takes one slot of `host` under the id `lease` if the host is not paused, has a slot free
    /// at its level and, with a rate limit, may start a request now (which uses up the
    /// interval); otherwise takes nothing and says why.
    async fn try_acquire(&self, host: &str, lease: &str) -> Result<Admission, LimiterError>;

    /// Gives back the slot held under `lease` (nothing if it already expired). `success`: the
    /// host answered (a status below 500, not 429), which takes a slowed host one level back
    /// up once its pause is over.
    async fn release(&self, host: &str, lease: &str, success: bool) -> Result<(), LimiterError>;

    /// `host` answered 429 or 503, asking for `retry_after` (if it did): pauses it and takes
    /// it one level down (see the module docs). Returns how long it is paused from now.
    async fn throttle(&self, host: &str, retry_after: Option<Duration>) -> Result<Duration, LimiterError>;
}

/// The limiter `settings` call for: [`RedisLimiter`] at `store.redis.url` (keys under
/// `<bus.prefix>:polite:`) when `store.kind = redis`, a [`MemoryLimiter`] otherwise.
pub async fn open_limiter(settings: &Settings) -> Result<Arc<dyn HostLimiter>, LimiterError> {
    let policy = HostPolicy::from_settings(&settings.download);
    Ok(match settings.store.kind {
        StoreKind::Embedded => Arc::new(MemoryLimiter::new(policy)),
        StoreKind::Redis => {
            Arc::new(RedisLimiter::connect(settings.store.redis.url.expose(), &settings.bus.prefix, policy).await?)
        }
    })
}

/// The politeness key of a URL: its host, lowercased, `:` and its port (the scheme's default
/// when it names none): `example.com:443`, `[::1]:8080`. `None` for a URL that does not parse
/// or is not http(s): the client refuses those without a request.
pub fn host_key(url: &str) -> Option<String> {
    Url::parse(url).ok().as_ref().and_then(url_host_key)
}

/// [`host_key`] of a parsed URL.
pub fn url_host_key(url: &Url) -> Option<String> {
    if !matches!(url.scheme(), "http" | "https") {
        return None;
    }
    let host = url.host_str()?.to_ascii_lowercase();
    Some(format!("{host}:{}", url.port_or_known_default()?))
}

/// A download that was not started because its host is at its limits: the step reports it as
/// deferred (not charged), to be sent again after `retry_after`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{host}: {detail}")]
pub struct Deferral {
    /// [`codes::HOST_BUSY`] or [`codes::HOST_THROTTLED`].
    pub code: &'static str,
    /// The host key.
    pub host: String,
    /// What the host's limits said.
    pub detail: String,
    /// When to try again.
    pub retry_after: Duration,
}

/// The download handler's side of politeness: waits in place for a host's slot (at most
/// `max_wait`), records throttles, counts and times both (see the module docs). Clones share
/// the limiter.
#[derive(Debug, Clone)]
pub struct Politeness {
    limiter: Arc<dyn HostLimiter>,
    max_wait: Duration,
    waiting: Arc<Mutex<HashMap<String, u32>>>,
}

impl Politeness {
    /// Longest wait for one limiter call; past it the download goes ahead unlimited.
    pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);
    /// Polls of a busy host while waiting in place: from 20 ms doubling to 250 ms, + up to 50 %.
    const POLL: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(250));
    /// The deferral delay of a busy host: 0.5 s doubling with the host's queue (waiters per
    /// slot) to 4 s, + up to 50 %, at most 5 s.
    const QUEUE_DELAY: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(5));

    /// Politeness through `limiter`, waiting at most `max_wait` for a slot.
    pub fn new(limiter: Arc<dyn HostLimiter>, max_wait: Duration) -> Self {
        Self { limiter, max_wait, waiting: Arc::default() }
    }

    /// [`Politeness::new`] with `download.per_host.max_wait`.
    pub fn from_settings(limiter: Arc<dyn HostLimiter>, settings: &Settings) -> Self {
        Self::new(limiter, settings.download.per_host.max_wait)
    }

    /// The limiter.
    pub fn limiter(&self) -> &Arc<dyn HostLimiter> {
        &self.limiter
    }

    /// A slot of `host`, waiting in place for it at most `max_wait`: a busy host is polled, a
    /// paused or rate-limited one waited for when it frees in time. Otherwise a [`Deferral`]
    /// whose `retry_after` is when the pause or the rate frees the host, or for a busy host a
    /// jittered delay growing with the number of downloads of this process waiting for it.
    pub async fn acquire(&self, host: &str) -> Result<HostSlot, Deferral> {
        let started = Instant::now();
        let deadline = started + self.max_wait;
        let lease = uuid::Uuid::new_v4().simple().to_string();
        let _waiter = Waiter::new(&self.waiting, host);
        let mut polls = ExponentialBackoff::new(Self::POLL.0, Self::POLL.1, Jitter::Proportional(0.5))
            .expect("a valid poll backoff")
            .attempts();
        loop {
            let admission = match call_within("acquiring a slot", host, self.limiter.try_acquire(host, &lease)).await {
                Ok(admission) => admission,
                Err(error) => {
                    unlimited(&error);
                    Admission::Granted
                }
            };
            let now = Instant::now();
            let wait = match admission {
                Admission::Granted => {
                    record_wait(metrics::GRANTED, now - started);
                    return Ok(HostSlot::held(self, host, lease));
                }
                Admission::Busy { .. } if now < deadline => polls.next_delay().min(deadline - now),
                Admission::RateLimited { wait } | Admission::Throttled { wait } if now + wait <= deadline => wait,
                denied => return Err(self.defer(host, denied, now - started)),
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// `host` answered `status` (429 or 503) asking for `retry_after`: pauses it in the
    /// limiter, counts it, and logs how long it is paused.
    pub async fn throttled(&self, host: &str, status: StatusCode, retry_after: Option<Duration>) {
        ::metrics::counter!(metrics::THROTTLES, metrics::STATUS => status.as_str().to_owned()).increment(1);
        match call_within("recording a throttle", host, self.limiter.throttle(host, retry_after)).await {
            Ok(paused) => tracing::info!(host, status = status.as_u16(), ?retry_after, ?paused, "host throttled"),
            Err(error) => count_error(&error),
        }
    }

    fn defer(&self, host: &str, denied: Admission, waited: Duration) -> Deferral {
        record_wait(metrics::DEFERRED, waited);
        let queued = self.waiting.lock().expect("waiting lock").get(host).copied().unwrap_or(1);
        let (code, detail, retry_after) = match denied {
            Admission::Busy { held, limit } => {
                let delay = queue_delay(queued, limit);
                (codes::HOST_BUSY, format!("{held} of {limit} downloads running (waited {waited:?})"), delay)
            }
            Admission::RateLimited { wait } => {
                let delay = wait.max(queue_delay(queued, 1));
                (codes::HOST_BUSY, format!("request rate used up for {wait:?} (waited {waited:?})"), delay)
            }
            Admission::Throttled { wait } => {
                let detail = format!("paused for {wait:?} more after a 429 or 503");
                (codes::HOST_THROTTLED, detail, spread(wait))
            }
            Admission::Granted => unreachable!("a granted slot is not deferred"),
        };
        ::metrics::counter!(metrics::DEFERRALS, metrics::REASON => code).increment(1);
        tracing::debug!(host, code, %detail, ?retry_after, "download deferred");
        Deferral { code, host: host.to_owned(), detail, retry_after }
    }
}

/// Runs one limiter call, failing it after [`Politeness::CALL_TIMEOUT`].
async fn call_within<T>(
    action: &'static str,
    host: &str,
    call: impl Future<Output = Result<T, LimiterError>>,
) -> Result<T, LimiterError> {
    let after = Politeness::CALL_TIMEOUT;
    tokio::time::timeout(after, call)
        .await
        .unwrap_or_else(|_| Err(LimiterError::Timeout { action, host: host.to_owned(), after }))
}

/// A busy host's deferral delay (see [`Politeness::QUEUE_DELAY`]): 0.5 s while at most one
/// download per slot waits, doubling per further slot's worth of waiters, to 4 s.
fn queue_delay(waiting: u32, limit: u32) -> Duration {
    let (min, max) = Politeness::QUEUE_DELAY;
    let per_slot = (waiting.saturating_sub(1) / limit.max(1)).min(3);
    ExponentialBackoff::new(min, max, Jitter::Proportional(0.5)).expect("a valid queue backoff").delay(per_slot)
}

/// `wait` plus up to a quarter of it (at most 5 s), so the downloads a pause deferred do not
/// all come back at once.
fn spread(wait: Duration) -> Duration {
    let most = (wait / 4).min(Duration::from_secs(5));
    wait + most.mul_f64(rand::rng().random::<f64>())
}

fn record_wait(outcome: &'static str, waited: Duration) {
    ::metrics::histogram!(metrics::HOST_WAIT, metrics::OUTCOME => outcome).record(waited.as_secs_f64());
}

fn count_error(error: &LimiterError) {
    ::metrics::counter!(metrics::POLITENESS_ERRORS).increment(1);
    tracing::warn!(error = %imagepipe_runtime::error_chain(error), "per-host politeness unavailable");
}

fn unlimited(error: &LimiterError) {
    count_error(error);
    tracing::warn!("downloading without the host's limits");
}

/// Counts one download of this process waiting for `host` while it lives.
struct Waiter<'a> {
    waiting: &'a Mutex<HashMap<String, u32>>,
    host: &'a str,
}

impl<'a> Waiter<'a> {
    fn new(waiting: &'a Mutex<HashMap<String, u32>>, host: &'a str) -> Self {
        *waiting.lock().expect("waiting lock").entry(host.to_owned()).or_default() += 1;
        Self { waiting, host }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut waiting = self.waiting.lock().expect("waiting lock");
        if let Some(count) = waiting.get_mut(self.host) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(self.host);
            }
        }
    }
}

/// A held slot of one host. [`release`](Self::release) it once the request is answered;
/// dropped unreleased (a panic, a cancelled handler), it is released in the background, and
/// at worst its lease expires.
#[must_use = "a slot is released when dropped"]
#[derive(Debug)]
pub struct HostSlot {
    held: Option<Held>,
}

#[derive(Debug)]
struct Held {
    limiter: Arc<dyn HostLimiter>,
    host: String,
    lease: String,
}

impl Held {
    async fn release(self, success: bool) {
        let call = self.limiter.release(&self.host, &self.lease, success);
        if let Err(error) = call_within("releasing a slot", &self.host, call).await {
            count_error(&error);
        }
    }
}

impl HostSlot {
    fn held(politeness: &Politeness, host: &str, lease: String) -> Self {
        Self { held: Some(Held { limiter: politeness.limiter.clone(), host: host.to_owned(), lease }) }
    }

    /// The host key this slot belongs to.
    pub fn host(&self) -> &str {
        self.held.as_ref().map_or("", |held| held.host.as_str())
    }

    /// Gives the slot back; `success`: the host answered (a status below 500, not 429).
    pub async fn release(mut self, success: bool) {
        if let Some(held) = self.held.take() {
            held.release(success).await;
        }
    }
}

impl Drop for HostSlot {
    fn drop(&mut self) {
        if let Some(held) = self.held.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(held.release(false));
        }
    }
}

#[cfg(test)]
mod tests;
