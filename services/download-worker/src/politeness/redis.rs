//! [`RedisLimiter`]: the per-host limits in Redis, shared by every download replica
//! (`store.kind = redis`).
//!
//! Per host, three keys under `<prefix>:polite:{<host>}:` (one hash tag per host, so a host's
//! keys share a Redis Cluster slot and each script touches one slot):
//!
//! - `leases`: a sorted set of lease id → expiry (ms); expired leases are dropped before each
//!   count, so a killed worker's slot frees itself; the key expires with its newest lease;
//! - `rate`: when the next request may start (ms), expiring then (GCRA without burst);
//! - `throttle`: a hash of `until` (ms, the end of the pause) and `level` (how far the host is
//!   slowed down), expiring [`HostPolicy::LEVEL_MEMORY`] after the pause ends.
//!
//! Time is Redis's own (`TIME`), so replicas whose clocks disagree still agree on the limits.
//! Timestamps are milliseconds with a fractional part (a rate up to 1000/s has sub-millisecond
//! intervals), stored with `%.3f`.

use std::time::Duration;

use async_trait::async_trait;
use imagepipe_runtime::clock::millis;
use imagepipe_runtime::redis_connection::RedisConnection;
use redis::Script;

use super::{Admission, HostLimiter, HostPolicy, LimiterError};

/// Takes a slot, or says why not: `{0}` granted, `{1, 0, held, limit}` busy, `{2, wait_ms}`
/// paused, `{3, wait_ms}` rate used up. KEYS: leases, rate, throttle. ARGV: lease id, lease
/// ms, concurrency, interval ms at full speed (0: no rate limit).
const ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.3f', now))
local state = redis.call('HMGET', KEYS[3], 'until', 'level')
local paused_until = tonumber(state[1]) or 0
local level = tonumber(state[2]) or 0
if paused_until > now then
  return {2, math.ceil(paused_until - now)}
end
local limit = math.max(1, math.floor(tonumber(ARGV[3]) / (2 ^ level)))
local held = redis.call('ZCARD', KEYS[1])
if held >= limit then
  return {1, 0, held, limit}
end
local interval = tonumber(ARGV[4]) * (2 ^ level)
if interval > 0 then
  local next_at = tonumber(redis.call('GET', KEYS[2])) or 0
  if next_at > now then
    return {3, math.ceil(next_at - now)}
  end
  redis.call('SET', KEYS[2], string.format('%.3f', now + interval), 'PX', math.ceil(interval))
end
redis.call('ZADD', KEYS[1], string.format('%.3f', now + tonumber(ARGV[2])), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {0}
";

/// Gives a slot back; a success after the pause takes the host one level back up. KEYS:
/// leases, throttle. ARGV: lease id, success (`1` or `0`).
const RELEASE: &str = r"
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  local state = redis.call('HMGET', KEYS[2], 'until', 'level')
  local level = tonumber(state[2]) or 0
  if level > 0 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
    if (tonumber(state[1]) or 0) <= now then
      redis.call('HSET', KEYS[2], 'level', level - 1)
    end
  end
end
return 0
";

/// Pauses a host after a 429 or 503 and returns the pause (ms). KEYS: throttle. ARGV:
/// Retry-After ms (-1: none), base pause ms, longest pause ms, level memory ms, most levels.
const THROTTLE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local state = redis.call('HMGET', KEYS[1], 'until', 'level')
local paused_until = tonumber(state[1]) or 0
local level = tonumber(state[2]) or 0
local retry_after = tonumber(ARGV[1])
local longest = tonumber(ARGV[3])
local pause
if paused_until > now then
  pause = paused_until - now
  if retry_after >= 0 then
    pause = math.max(pause, math.min(retry_after, longest))
  end
else
  level = math.min(level + 1, tonumber(ARGV[5]))
  if retry_after >= 0 then
    pause = math.min(retry_after, longest)
  else
    pause = math.min(tonumber(ARGV[2]) * (2 ^ (level - 1)), longest)
  end
end
redis.call('HSET', KEYS[1], 'until', string.format('%.3f', now + pause), 'level', level)
redis.call('PEXPIRE', KEYS[1], math.ceil(pause + tonumber(ARGV[4])))
return math.ceil(pause)
";

/// The per-host limits in Redis (see the module docs).
#[derive(Clone)]
pub struct RedisLimiter {
    connection: RedisConnection,
    prefix: String,
    policy: HostPolicy,
    acquire: Script,
    release: Script,
    throttle: Script,
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter").field("prefix", &self.prefix).field("policy", &self.policy).finish()
    }
}

impl RedisLimiter {
    /// Connects to Redis at `url`; keys live under `<prefix>:polite:`.
    pub async fn connect(url: &str, prefix: &str, policy: HostPolicy) -> Result<Self, LimiterError> {
        let connection = RedisConnection::open(url).await.map_err(LimiterError::Connect)?;
        Ok(Self::new(connection, prefix, policy))
    }

    /// A limiter on `connection`, keys under `<prefix>:polite:`.
    pub fn new(connection: RedisConnection, prefix: &str, policy: HostPolicy) -> Self {
        Self {
            connection,
            prefix: format!("{prefix}:polite"),
            policy,
            acquire: Script::new(ACQUIRE),
            release: Script::new(RELEASE),
            throttle: Script::new(THROTTLE),
        }
    }

    /// The policy it applies.
    pub fn policy(&self) -> &HostPolicy {
        &self.policy
    }

    /// The key `part` (`leases`, `rate`, `throttle`) of `host`, hash-tagged by host.
    pub fn key(&self, host: &str, part: &str) -> String {
        format!("{}:{{{host}}}:{part}", self.prefix)
    }
}

fn reply(action: &'static str, host: &str, answer: Vec<i64>) -> LimiterError {
    LimiterError::Reply { action, host: host.to_owned(), answer }
}

fn failed(action: &'static str, host: &str) -> impl FnOnce(redis::RedisError) -> LimiterError {
    let host = host.to_owned();
    move |source| LimiterError::Redis { action, host, source }
}

fn ms(value: i64) -> Duration {
    Duration::from_millis(u64::try_from(value).unwrap_or(0))
}

#[async_trait]
impl HostLimiter for RedisLimiter {
    async fn try_acquire(&self, host: &str, lease: &str) -> Result<Admission, LimiterError> {
        const ACTION: &str = "acquiring a slot";
        let interval_ms = self.policy.interval(0).map_or(0.0, |interval| interval.as_secs_f64() * 1000.0);
        let answer: Vec<i64> = self
            .acquire
            .key(self.key(host, "leases"))
            .key(self.key(host, "rate"))
            .key(self.key(host, "throttle"))
            .arg(lease)
            .arg(millis(self.policy.lease).max(1))
            .arg(self.policy.concurrency)
            .arg(format!("{interval_ms:.6}"))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed(ACTION, host))?;
        Ok(match answer[..] {
            [0, ..] => Admission::Granted,
            [1, _, held, limit] => Admission::Busy {
                held: u32::try_from(held).unwrap_or(u32::MAX),
                limit: u32::try_from(limit).unwrap_or(u32::MAX),
            },
            [2, wait, ..] => Admission::Throttled { wait: ms(wait) },
            [3, wait, ..] => Admission::RateLimited { wait: ms(wait) },
            _ => return Err(reply(ACTION, host, answer)),
        })
    }

    async fn release(&self, host: &str, lease: &str, success: bool) -> Result<(), LimiterError> {
        self.release
            .key(self.key(host, "leases"))
            .key(self.key(host, "throttle"))
            .arg(lease)
            .arg(if success { "1" } else { "0" })
            .invoke_async::<i64>(&mut self.connection.clone())
            .await
            .map_err(failed("releasing a slot", host))?;
        Ok(())
    }

    async fn throttle(&self, host: &str, retry_after: Option<Duration>) -> Result<Duration, LimiterError> {
        let retry_after_ms = retry_after.map_or(-1, |delay| i64::try_from(millis(delay)).unwrap_or(i64::MAX));
        let pause: i64 = self
            .throttle
            .key(self.key(host, "throttle"))
            .arg(retry_after_ms)
            .arg(millis(self.policy.throttle_base))
            .arg(millis(self.policy.throttle_max))
            .arg(millis(HostPolicy::LEVEL_MEMORY))
            .arg(HostPolicy::MAX_LEVEL)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed("recording a throttle", host))?;
        Ok(ms(pause))
    }
}
