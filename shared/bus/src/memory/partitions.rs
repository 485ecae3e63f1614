//! Partitioned queues: partition `p` of a queue is a [`Queue`] of its own, and one consumer
//! reads a set of them, waiting on the notifier the partitions of a queue share.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::handle::MemoryAckHandle;
use super::queue::{Queue, after};
use crate::config::ConsumerConfig;
use crate::delivery::Delivery;
use crate::error::BusError;
use crate::traits::Consumer;

/// A consumer over some partitions of one queue, dead-lettering into the queue's `dlq`.
pub(super) struct PartitionsConsumer {
    /// The queue's logical name, as in [`Delivery::source`].
    pub(super) queue: String,
    /// Each partition read, with its number.
    pub(super) partitions: Vec<(u16, Arc<Queue>)>,
    /// Notified whenever any partition of the queue may have something for a fetch.
    pub(super) family: Arc<Notify>,
    pub(super) dlq: Arc<Queue>,
    pub(super) config: ConsumerConfig,
    /// Where the next fetch starts looking, so that a busy partition does not starve the others.
    pub(super) next: AtomicUsize,
}

impl PartitionsConsumer {
    /// Up to `max` deliveries ready now, from the partitions in turn, and the earliest due time
    /// among the partitions looked at.
    fn take_now(&self, max: usize, now: Instant) -> Result<(Vec<Delivery>, Option<Instant>), BusError> {
        let count = self.partitions.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
        let mut got = Vec::new();
        let mut next_due: Option<Instant> = None;
        for i in 0..count {
            if got.len() == max {
                break;
            }
            let (partition, queue) = &self.partitions[(start + i) % count];
            let (taken, due) = queue.take_now(max - got.len(), now, &self.config, &self.dlq)?;
            next_due = match (next_due, due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            got.extend(taken.into_iter().map(|t| {
                let handle =
                    MemoryAckHandle { queue: queue.clone(), dlq: self.dlq.clone(), seq: t.seq, attempt: t.attempt };
                let mut message = t.message;
                message.partition = Some(*partition);
                Delivery::new(message, t.attempt, t.max_deliveries, self.queue.clone(), Box::new(handle))
            }));
        }
        Ok((got, next_due))
    }
}

#[async_trait]
impl Consumer for PartitionsConsumer {
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError> {
        if max == 0 {
            return Err(BusError::Invalid(format!("fetch from partitions of {}: max must be at least 1", self.queue)));
        }
        let until = after(Instant::now(), wait);
        loop {
            let changed = self.family.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = Instant::now();
            let (got, next_due) = self.take_now(max, now)?;
            if !got.is_empty() || now >= until {
                return Ok(got);
            }
            let wake = next_due.map_or(until, |due| due.min(until));
            tokio::select! {
                _ = &mut changed => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}
