//! Publish deduplication by message id within a time window (JetStream's `Nats-Msg-Id`).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// The message ids accepted within the last `window`.
#[derive(Debug)]
pub(super) struct DedupWindow {
    window: Duration,
    seen: HashMap<String, Instant>,
    order: VecDeque<(Instant, String)>,
}

impl DedupWindow {
    pub(super) fn new(window: Duration) -> Self {
        Self { window, seen: HashMap::new(), order: VecDeque::new() }
    }

    /// Whether `id` was accepted within the window before `now`.
    pub(super) fn is_duplicate(&mut self, id: &str, now: Instant) -> bool {
        self.forget_before(now);
        self.seen.contains_key(id)
    }

    /// Remembers `id` as accepted at `now`.
    pub(super) fn record(&mut self, id: &str, now: Instant) {
        self.forget_before(now);
        if self.window.is_zero() {
            return;
        }
        self.seen.insert(id.to_owned(), now);
        self.order.push_back((now, id.to_owned()));
    }

    fn forget_before(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.window {
                break;
            }
            let (at, id) = self.order.pop_front().expect("front exists");
            if self.seen.get(&id) == Some(&at) {
                self.seen.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_duplicates_only_within_the_window() {
        let start = Instant::now();
        let mut window = DedupWindow::new(Duration::from_secs(10));
        assert!(!window.is_duplicate("a", start));
        window.record("a", start);
        assert!(window.is_duplicate("a", start + Duration::from_secs(9)));
        assert!(!window.is_duplicate("b", start + Duration::from_secs(9)));
        assert!(!window.is_duplicate("a", start + Duration::from_secs(10)));
        assert!(window.seen.is_empty() && window.order.is_empty());
    }

    #[test]
    fn a_zero_window_remembers_nothing() {
        let now = Instant::now();
        let mut window = DedupWindow::new(Duration::ZERO);
        window.record("a", now);
        assert!(!window.is_duplicate("a", now));
    }
}
