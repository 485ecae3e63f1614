//! [`Consumer`] over a shared group [`Member`]: fetch takes what the member's thread has
//! received, waiting for more up to the given time.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::handle::KafkaAckHandle;
use super::member::Member;
use crate::config::ConsumerConfig;
use crate::delivery::Delivery;
use crate::error::BusError;
use crate::traits::Consumer;

/// One consumer of a queue or subscriber group in this process.
pub(crate) struct KafkaConsumer {
    pub member: Arc<Member>,
    pub config: ConsumerConfig,
}

impl KafkaConsumer {
    fn take(&self, max: usize) -> Vec<Delivery> {
        let core = &self.member.core;
        let handouts = core.lock().take(max, &self.config, std::time::Instant::now());
        handouts
            .into_iter()
            .map(|h| {
                let handle = KafkaAckHandle { core: core.clone(), id: h.id, epoch: h.epoch, attempt: h.attempt };
                Delivery::new(
                    h.message,
                    h.delivery_count,
                    self.config.max_deliveries,
                    core.spec.source.clone(),
                    Box::new(handle),
                )
            })
            .collect()
    }
}

#[async_trait]
impl Consumer for KafkaConsumer {
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError> {
        let core = &self.member.core;
        core.shared.check_open()?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let until = tokio::time::Instant::now() + wait;
        loop {
            let notified = core.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self.take(max);
            if !got.is_empty() {
                return Ok(got);
            }
            if !core.shared.producer.health().is_connected() {
                return Err(BusError::Receive {
                    source_name: core.spec.source.clone(),
                    source: "no Kafka broker is reachable".into(),
                });
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return Ok(self.take(max));
            }
        }
    }
}
