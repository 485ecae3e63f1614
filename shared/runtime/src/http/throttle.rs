//! Limiting token guessing: failed attempts (a wrong bearer token, a wrong login) are counted
//! per client address in a fixed window; an address over the limit is refused until its window
//! ends, whatever it sends, so a right guess cannot be told from a wrong one. The table holds at
//! most [`CAPACITY`] addresses (the oldest window gives way), and IPv6 addresses count per /64
//! (one host owns a whole /64).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Most client addresses the table follows at once.
pub const CAPACITY: usize = 4096;

/// One address's failures in its window.
#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    failures: u32,
}

/// The failures of every recent client address (see the module docs).
#[derive(Debug)]
pub struct Throttle {
    limit: u32,
    window: Duration,
    capacity: usize,
    windows: Mutex<HashMap<IpAddr, Window>>,
}

/// The address failures of `ip` are counted under: an IPv4 address itself, an IPv6 address's
/// /64 (an IPv4-mapped IPv6 address as its IPv4 address).
fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

impl Throttle {
    /// At most `limit` failures per address within `window`.
    pub fn new(limit: u32, window: Duration) -> Self {
        Self::with_capacity(limit, window, CAPACITY)
    }

    fn with_capacity(limit: u32, window: Duration, capacity: usize) -> Self {
        Self { limit: limit.max(1), window, capacity: capacity.max(1), windows: Mutex::default() }
    }

    /// How long `ip` must still wait, when it used up its failures; `None` when it may try.
    pub fn retry_after(&self, ip: IpAddr) -> Option<Duration> {
        let windows = self.windows.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.wait(&windows, key(ip), Instant::now())
    }

    fn wait(&self, windows: &HashMap<IpAddr, Window>, key: IpAddr, now: Instant) -> Option<Duration> {
        let window = windows.get(&key)?;
        let ends = window.started + self.window;
        (window.failures >= self.limit && ends > now).then(|| ends - now)
    }

    /// Makes the attempt `succeeds` of `ip` unless `ip` used up its failures (then `Err` with
    /// how long it must still wait), and counts it when it fails. The table is held throughout,
    /// so attempts made at once cannot slip past the limit together.
    pub fn attempt(&self, ip: IpAddr, succeeds: impl FnOnce() -> bool) -> Result<bool, Duration> {
        let now = Instant::now();
        let key = key(ip);
        let mut windows = self.windows.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(wait) = self.wait(&windows, key, now) {
            return Err(wait);
        }
        let succeeded = succeeds();
        if !succeeded {
            self.count(&mut windows, key, now);
        }
        Ok(succeeded)
    }

    /// Counts a failed attempt of `ip`.
    pub fn failed(&self, ip: IpAddr) {
        let mut windows = self.windows.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.count(&mut windows, key(ip), Instant::now());
    }

    fn count(&self, windows: &mut HashMap<IpAddr, Window>, key: IpAddr, now: Instant) {
        if !windows.contains_key(&key) && windows.len() >= self.capacity {
            windows.retain(|_, w| w.started + self.window > now);
            if windows.len() >= self.capacity
                && let Some(oldest) = windows.iter().min_by_key(|(_, w)| w.started).map(|(ip, _)| *ip)
            {
                windows.remove(&oldest);
            }
        }
        let window = windows.entry(key).or_insert(Window { started: now, failures: 0 });
        if window.started + self.window <= now {
            *window = Window { started: now, failures: 0 };
        }
        window.failures = window.failures.saturating_add(1);
    }

    /// How many addresses the table follows now.
    pub fn len(&self) -> usize {
        self.windows.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Whether the table follows no address.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_over_the_limit_waits_for_its_window_to_end() {
        let throttle = Throttle::new(3, MINUTE);
        let (guesser, other) = (ip("192.0.2.7"), ip("192.0.2.8"));
        for _ in 0..3 {
            assert_eq!(throttle.retry_after(guesser), None);
            throttle.failed(guesser);
        }
        assert_eq!(throttle.retry_after(guesser), Some(MINUTE));
        assert_eq!(throttle.retry_after(other), None, "per address");
        tokio::time::advance(Duration::from_secs(45)).await;
        assert_eq!(throttle.retry_after(guesser), Some(Duration::from_secs(15)));
        tokio::time::advance(Duration::from_secs(15)).await;
        assert_eq!(throttle.retry_after(guesser), None, "a new window");
        throttle.failed(guesser);
        assert_eq!(throttle.retry_after(guesser), None, "counting starts over");
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_runs_only_while_the_address_may_try_and_counts_when_it_fails() {
        let throttle = Throttle::new(2, MINUTE);
        let guesser = ip("192.0.2.7");
        assert_eq!(throttle.attempt(guesser, || true), Ok(true), "a success");
        assert_eq!(throttle.attempt(guesser, || false), Ok(false));
        assert_eq!(throttle.attempt(guesser, || false), Ok(false));
        let mut ran = false;
        assert_eq!(
            throttle.attempt(guesser, || {
                ran = true;
                true
            }),
            Err(MINUTE)
        );
        assert!(!ran, "a blocked address's attempt is not made");
    }

    #[tokio::test(start_paused = true)]
    async fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let throttle = Throttle::new(2, MINUTE);
        throttle.failed(ip("2001:db8::1"));
        throttle.failed(ip("2001:db8::ffff:2"));
        assert!(throttle.retry_after(ip("2001:db8::3")).is_some(), "one /64");
        assert!(throttle.retry_after(ip("2001:db8:0:1::3")).is_none(), "another /64");
        throttle.failed(ip("::ffff:192.0.2.9"));
        throttle.failed(ip("192.0.2.9"));
        assert!(throttle.retry_after(ip("192.0.2.9")).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_never_grows_past_its_capacity() {
        let throttle = Throttle::with_capacity(1, MINUTE, 8);
        let first = ip("198.51.100.1");
        throttle.failed(first);
        for i in 2..=100u8 {
            tokio::time::advance(Duration::from_millis(10)).await;
            throttle.failed(IpAddr::from([198, 51, 100, i]));
            assert!(throttle.len() <= 8);
        }
        assert_eq!(throttle.retry_after(first), None, "the oldest window gave way");
        assert!(throttle.retry_after(ip("198.51.100.100")).is_some(), "the newest is kept");
    }
}
