//! The commit point of one partition: the highest offset below which every message is finished.
//!
//! Messages of one partition are handled concurrently and finish in any order; Kafka keeps one
//! committed offset per partition, meaning "everything below is done". So the commit point only
//! moves past a message once it and every message before it are finished: a slow message holds
//! the point back (it is redelivered after a crash, with the finished ones after it), and a
//! finished message is never committed past an unfinished one.

use std::collections::BTreeSet;

/// Tracks the received and finished offsets of one partition.
#[derive(Debug, Clone)]
pub(crate) struct OffsetTracker {
    /// Received and not yet finished.
    unfinished: BTreeSet<i64>,
    /// The next offset expected: one past the highest received.
    next: i64,
    /// The last commit point handed out (initially the start offset).
    committed: i64,
}

impl OffsetTracker {
    /// A partition read from `start` (its committed offset, or where a new group starts).
    pub(crate) fn new(start: i64) -> Self {
        Self { unfinished: BTreeSet::new(), next: start, committed: start }
    }

    /// Registers a received message. Returns false for an offset below one already received
    /// (a refetch after pause or seek), which the caller drops.
    pub(crate) fn receive(&mut self, offset: i64) -> bool {
        if offset < self.next {
            return false;
        }
        self.unfinished.insert(offset);
        self.next = offset + 1;
        true
    }

    /// Marks `offset` finished. Returns the new commit point when it moved forward.
    pub(crate) fn finish(&mut self, offset: i64) -> Option<i64> {
        if !self.unfinished.remove(&offset) {
            return None;
        }
        let point = self.commit_point();
        (point > self.committed).then(|| {
            self.committed = point;
            point
        })
    }

    /// The offset to commit now: the lowest unfinished one, or one past the highest received.
    pub(crate) fn commit_point(&self) -> i64 {
        self.unfinished.first().copied().unwrap_or(self.next)
    }

    /// The last commit point handed out.
    #[cfg(test)]
    pub(crate) fn committed(&self) -> i64 {
        self.committed
    }

    /// How many received messages are not finished.
    #[cfg(test)]
    pub(crate) fn unfinished(&self) -> usize {
        self.unfinished.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_finishing_commits_each_offset() {
        let mut t = OffsetTracker::new(10);
        assert!(t.receive(10) && t.receive(11));
        assert_eq!(t.finish(10), Some(11));
        assert_eq!(t.finish(11), Some(12));
        assert_eq!(t.committed(), 12);
    }

    #[test]
    fn a_gap_holds_the_commit_point_until_it_is_filled() {
        let mut t = OffsetTracker::new(0);
        for o in 0..5 {
            assert!(t.receive(o));
        }
        assert_eq!(t.finish(1), None, "0 is still in flight");
        assert_eq!(t.finish(3), None);
        assert_eq!(t.finish(4), None);
        assert_eq!(t.commit_point(), 0);
        assert_eq!(t.finish(0), Some(2), "0 and 1 are done, 2 is not");
        assert_eq!(t.finish(2), Some(5), "everything up to 4 is done");
        assert_eq!(t.unfinished(), 0);
    }

    #[test]
    fn offsets_missing_from_the_log_do_not_hold_the_point() {
        // Compacted topics and transaction markers leave holes in the offsets.
        let mut t = OffsetTracker::new(0);
        assert!(t.receive(3) && t.receive(7));
        assert_eq!(t.finish(7), Some(3), "nothing below 3 is unfinished");
        assert_eq!(t.finish(3), Some(8));
    }

    #[test]
    fn refetched_and_unknown_offsets_are_ignored() {
        let mut t = OffsetTracker::new(5);
        assert!(!t.receive(4), "below the start");
        assert!(t.receive(5));
        assert!(!t.receive(5), "received twice");
        assert_eq!(t.finish(9), None, "never received");
        assert_eq!(t.finish(5), Some(6));
        assert_eq!(t.finish(5), None, "finished twice");
    }
}
