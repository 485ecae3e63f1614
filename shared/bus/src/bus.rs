//! [`Bus`]: the task queues and event topics of one backend, chosen by config.

use std::sync::Arc;

use crate::config::BusConfig;
#[allow(unused_imports)]
use crate::config::BusKind;
use crate::error::BusError;
use crate::opening::{CountedEvents, CountedQueues, Openings, SizeLimit};
use crate::traits::{EventBus, TaskQueue};

/// A connected backend: its task queues and event topics, cheap to clone.
#[derive(Clone)]
pub struct Bus {
    /// Task queues.
    pub queues: Arc<dyn TaskQueue>,
    /// Event topics.
    pub events: Arc<dyn EventBus>,
    connected: Arc<dyn Fn() -> bool + Send + Sync>,
    openings: Arc<Openings>,
    limit: Arc<SizeLimit>,
}

impl Bus {
    /// A bus from its parts; `connected` reports whether the broker is reachable now.
    pub fn from_parts(
        queues: Arc<dyn TaskQueue>,
        events: Arc<dyn EventBus>,
        connected: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Self {
        let openings = Arc::new(Openings::default());
        let limit = Arc::new(SizeLimit::new(BusConfig::DEFAULT_MAX_MESSAGE_BYTES));
        let queues = Arc::new(CountedQueues { inner: queues, openings: openings.clone(), limit: limit.clone() });
        let events = Arc::new(CountedEvents { inner: events, openings: openings.clone(), limit: limit.clone() });
        Self { queues, events, connected, openings, limit }
    }

    /// Sets the largest message this bus (and its clones) sends; a larger one fails with
    /// [`BusError::TooLarge`] before it reaches the broker.
    pub fn with_max_message_bytes(self, max: usize) -> Self {
        self.limit.set(max);
        self
    }

    /// Connects the backend `config.kind`, creating streams or topics it needs.
    pub async fn connect(config: &BusConfig) -> Result<Self, BusError> {
        config.validate().map_err(BusError::Invalid)?;
        let bus = match config.kind {
            #[cfg(feature = "memory")]
            BusKind::Memory => {
                Ok(crate::memory::MemoryBus::new(config.prefix.clone(), config.memory.clone()).into_bus())
            }
            #[cfg(feature = "nats")]
            BusKind::Nats => {
                crate::nats::NatsBus::connect(&config.prefix, &config.nats).await.map(crate::nats::NatsBus::into_bus)
            }
            #[cfg(feature = "kafka")]
            BusKind::Kafka => crate::kafka::KafkaBus::connect(&config.prefix, &config.kafka)
                .await
                .map(crate::kafka::KafkaBus::into_bus),
            #[allow(unreachable_patterns)]
            kind => Err(BusError::Invalid(format!(
                "bus.kind = {kind:?} is not compiled into this binary (cargo feature missing)"
            ))),
        };
        bus.map(|bus| bus.with_max_message_bytes(config.max_message_bytes))
    }

    /// Whether the broker connection is up (readiness).
    pub fn is_connected(&self) -> bool {
        (self.connected)()
    }

    /// Whether at least one consumer or subscription was opened through this bus (or a clone)
    /// and none is still being opened (readiness: a service takes work only once it consumes).
    pub fn consumers_open(&self) -> bool {
        self.openings.settled()
    }
}
