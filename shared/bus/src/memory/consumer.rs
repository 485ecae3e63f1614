//! A consumer on one in-memory queue or subscriber group.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;

use super::handle::MemoryAckHandle;
use super::queue::Queue;
use crate::config::ConsumerConfig;
use crate::delivery::Delivery;
use crate::error::BusError;
use crate::traits::Consumer;

/// Fetches from `queue`, dead-lettering into `dlq`; every consumer of a queue shares it.
pub(super) struct MemoryConsumer {
    pub(super) queue: Arc<Queue>,
    pub(super) dlq: Arc<Queue>,
    pub(super) config: ConsumerConfig,
    /// Set for a member of a group that expires when idle: leaves the group when dropped.
    pub(super) _member: Option<Member>,
}

/// Membership of a group that goes with its last member; leaving on drop.
pub(super) struct Member {
    /// The bus (weak: a consumer does not keep a dropped bus open).
    pub(super) shared: Weak<super::Shared>,
    /// The group.
    pub(super) group: String,
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.events.leave(&self.group);
        }
    }
}

#[async_trait]
impl Consumer for MemoryConsumer {
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError> {
        if max == 0 {
            return Err(BusError::Invalid(format!("fetch from {}: max must be at least 1", self.queue.display())));
        }
        let taken = self.queue.fetch(max, wait, &self.config, &self.dlq).await?;
        Ok(taken
            .into_iter()
            .map(|t| {
                let handle = MemoryAckHandle {
                    queue: self.queue.clone(),
                    dlq: self.dlq.clone(),
                    seq: t.seq,
                    attempt: t.attempt,
                };
                Delivery::new(t.message, t.attempt, t.max_deliveries, self.queue.name().to_owned(), Box::new(handle))
            })
            .collect())
    }
}
