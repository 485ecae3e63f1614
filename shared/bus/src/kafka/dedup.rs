//! Dropping re-published messages: the ids seen in one partition within a time window.
//!
//! Kafka's idempotent producer removes the duplicates of its own retries, not a message
//! published twice (an outbox relay resending after a crash). A message's partition follows its
//! key (or its id when it has none), so two publishes of one message land in the same partition,
//! and the member reading that partition drops the second one. The window lives as long as the
//! member owns the partition; handlers stay idempotent for what slips through a rebalance.

use std::collections::{HashMap, VecDeque};

/// Most ids one partition remembers, whatever the window.
const MAX_IDS: usize = 100_000;

/// Ids seen in one partition, by message timestamp.
#[derive(Debug)]
pub(crate) struct DedupWindow {
    window_ms: i64,
    order: VecDeque<(i64, String)>,
    seen: HashMap<String, u32>,
}

impl DedupWindow {
    /// Remembers ids for `window_ms` of message time.
    pub(crate) fn new(window_ms: i64) -> Self {
        Self { window_ms, order: VecDeque::new(), seen: HashMap::new() }
    }

    /// Whether `id`, in a message stamped `timestamp_ms`, was seen within the window; records it.
    pub(crate) fn is_duplicate(&mut self, id: &str, timestamp_ms: i64) -> bool {
        if self.window_ms <= 0 {
            return false;
        }
        while let Some((stamp, _)) = self.order.front() {
            if *stamp >= timestamp_ms - self.window_ms && self.order.len() < MAX_IDS {
                break;
            }
            let (_, old) = self.order.pop_front().expect("front exists");
            if let Some(count) = self.seen.get_mut(&old) {
                *count -= 1;
                if *count == 0 {
                    self.seen.remove(&old);
                }
            }
        }
        let duplicate = self.seen.contains_key(id);
        *self.seen.entry(id.to_owned()).or_default() += 1;
        self.order.push_back((timestamp_ms, id.to_owned()));
        duplicate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_id_within_the_window_is_a_duplicate() {
        let mut w = DedupWindow::new(1000);
        assert!(!w.is_duplicate("a", 0));
        assert!(!w.is_duplicate("b", 10));
        assert!(w.is_duplicate("a", 500));
        assert!(w.is_duplicate("a", 1400), "seen again at 500");
    }

    #[test]
    fn ids_older_than_the_window_are_forgotten() {
        let mut w = DedupWindow::new(1000);
        assert!(!w.is_duplicate("a", 0));
        assert!(!w.is_duplicate("a", 1001));
        assert!(!w.is_duplicate("b", 5000));
        assert!(!w.is_duplicate("a", 5001));
    }

    #[test]
    fn a_zero_window_keeps_nothing() {
        let mut w = DedupWindow::new(0);
        assert!(!w.is_duplicate("a", 0));
        assert!(!w.is_duplicate("a", 0));
    }
}
