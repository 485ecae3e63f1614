//! [`MemoryLimiter`]: the per-host limits in process memory, for one process (`imagepipe run`,
//! `store.kind = embedded`). The same rules as the Redis scripts, on [`tokio::time::Instant`]
//! (so tests can pause time).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Admission, HostLimiter, HostPolicy, LimiterError};

/// Every how many calls hosts with nothing left to remember are dropped.
const SWEEP_EVERY: u64 = 1024;

/// The per-host limits in process memory (see the module docs). Share one through an `Arc`
/// between the download replicas of one process; other processes do not see it.
#[derive(Debug)]
pub struct MemoryLimiter {
    policy: HostPolicy,
    state: Mutex<Hosts>,
}

#[derive(Debug, Default)]
struct Hosts {
    hosts: HashMap<String, Host>,
    calls: u64,
}

/// What is known of one host.
#[derive(Debug, Default)]
struct Host {
    /// Lease id → when it expires.
    leases: HashMap<String, Instant>,
    /// When the next request may start (rate limit).
    next_at: Option<Instant>,
    /// When the pause ends.
    paused_until: Option<Instant>,
    /// How many levels the host is slowed down.
    level: u32,
    /// When the level is forgotten.
    forget_at: Option<Instant>,
}

impl Host {
    /// Drops expired leases and a forgotten level.
    fn expire(&mut self, now: Instant) {
        self.leases.retain(|_, expires| *expires > now);
        if self.forget_at.is_some_and(|at| at <= now) {
            self.level = 0;
            self.paused_until = None;
            self.forget_at = None;
        }
    }

    fn paused_for(&self, now: Instant) -> Option<Duration> {
        self.paused_until.filter(|until| *until > now).map(|until| until - now)
    }

    /// Whether nothing is left to remember.
    fn idle(&self, now: Instant) -> bool {
        self.leases.is_empty()
            && self.level == 0
            && self.paused_for(now).is_none()
            && self.next_at.is_none_or(|at| at <= now)
    }
}

impl MemoryLimiter {
    /// An empty limiter applying `policy`.
    pub fn new(policy: HostPolicy) -> Self {
        Self { policy, state: Mutex::default() }
    }

    /// The policy it applies.
    pub fn policy(&self) -> &HostPolicy {
        &self.policy
    }

    /// Runs `f` on `host`'s state (expired parts dropped), then forgets the host if nothing is
    /// left of it, and every [`SWEEP_EVERY`] calls every such host.
    fn with<T>(&self, host: &str, f: impl FnOnce(&mut Host, Instant) -> T) -> T {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = state.hosts.entry(host.to_owned()).or_default();
        entry.expire(now);
        let out = f(entry, now);
        if entry.idle(now) {
            state.hosts.remove(host);
        }
        state.calls += 1;
        if state.calls % SWEEP_EVERY == 0 {
            state.hosts.retain(|_, host| {
                host.expire(now);
                !host.idle(now)
            });
        }
        out
    }

    /// How many hosts it remembers (tests: that idle hosts are forgotten).
    pub fn hosts(&self) -> usize {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).hosts.len()
    }
}

#[async_trait]
impl HostLimiter for MemoryLimiter {
    async fn try_acquire(&self, host: &str, lease: &str) -> Result<Admission, LimiterError> {
        let policy = self.policy;
        Ok(self.with(host, |host, now| {
            if let Some(wait) = host.paused_for(now) {
                return Admission::Throttled { wait };
            }
            let limit = policy.limit(host.level);
            let held = u32::try_from(host.leases.len()).unwrap_or(u32::MAX);
            if held >= limit {
                return Admission::Busy { held, limit };
            }
            if let Some(interval) = policy.interval(host.level) {
                if let Some(next_at) = host.next_at.filter(|at| *at > now) {
                    return Admission::RateLimited { wait: next_at - now };
                }
                host.next_at = Some(now + interval);
            }
            host.leases.insert(lease.to_owned(), now + policy.lease);
            Admission::Granted
        }))
    }

    async fn release(&self, host: &str, lease: &str, success: bool) -> Result<(), LimiterError> {
        self.with(host, |host, now| {
            host.leases.remove(lease);
            if success && host.level > 0 && host.paused_for(now).is_none() {
                host.level -= 1;
            }
        });
        Ok(())
    }

    async fn throttle(&self, host: &str, retry_after: Option<Duration>) -> Result<Duration, LimiterError> {
        let policy = self.policy;
        Ok(self.with(host, |host, now| {
            let pause = match host.paused_for(now) {
                Some(left) => {
                    // Already paused: a request from before the pause. Its Retry-After may
                    // extend the pause; it takes no further level.
                    let extended = retry_after.map_or(left, |delay| left.max(delay.min(policy.throttle_max)));
                    host.paused_until = Some(now + extended);
                    extended
                }
                None => {
                    host.level = (host.level + 1).min(HostPolicy::MAX_LEVEL);
                    let pause = policy.pause(host.level, retry_after);
                    host.paused_until = Some(now + pause);
                    pause
                }
            };
            host.forget_at = Some(now + pause + HostPolicy::LEVEL_MEMORY);
            pause
        }))
    }
}
