//! Bus configuration (`bus.*` keys) and per-consumer settings.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::selector::Selector;

/// Which backend carries the messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BusKind {
    /// In-process; for `imagepipe run` and tests.
    #[default]
    Memory,
    /// NATS JetStream.
    Nats,
    /// Kafka.
    Kafka,
}

/// The `bus` section of the config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusConfig {
    /// Backend.
    pub kind: BusKind,
    /// Prefix of every subject, topic and stream name.
    pub prefix: String,
    /// In-memory backend settings.
    pub memory: MemoryConfig,
    /// NATS settings.
    pub nats: NatsConfig,
    /// Kafka settings.
    pub kafka: KafkaConfig,
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            kind: BusKind::default(),
            prefix: "imagepipe".into(),
            memory: MemoryConfig::default(),
            nats: NatsConfig::default(),
            kafka: KafkaConfig::default(),
        }
    }
}

impl BusConfig {
    /// Checks values a backend cannot use, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        let prefix_ok = !self.prefix.is_empty()
            && self.prefix.split('.').all(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
        if !prefix_ok {
            return Err(format!("bus.prefix: {:?} must be dot-separated tokens of [A-Za-z0-9_-]", self.prefix));
        }
        if self.memory.capacity == 0 {
            return Err("bus.memory.capacity: must be at least 1".into());
        }
        Ok(())
    }
}

/// The `bus.memory` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Most messages a queue or subscriber group holds; a send waits while it is full.
    pub capacity: usize,
    /// How long `send` waits for room before failing with `BusError::Full`.
    #[serde(with = "humantime_serde")]
    pub send_timeout: Duration,
    /// Window within which a repeated message id is dropped as a duplicate.
    #[serde(with = "humantime_serde")]
    pub dedup_window: Duration,
    /// Most events kept per topic for subscribers that start from the beginning or a time.
    pub retention: usize,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            capacity: 100_000,
            send_timeout: Duration::from_secs(30),
            dedup_window: Duration::from_secs(120),
            retention: 100_000,
        }
    }
}

/// The `bus.nats` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URL(s), comma-separated.
    pub url: String,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self { url: "nats://127.0.0.1:4222".into() }
    }
}

/// The `bus.kafka` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap brokers, comma-separated.
    pub brokers: String,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self { brokers: "127.0.0.1:9092".into() }
    }
}

/// How a consumer treats unsettled deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// A delivery not settled within this time is delivered again.
    pub ack_wait: Duration,
    /// Deliveries allowed before the message goes to the dead-letter queue.
    pub max_deliveries: u32,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self { ack_wait: Duration::from_secs(30), max_deliveries: 5 }
    }
}

/// Where a new subscriber group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartPosition {
    /// Only events published after the group was created.
    #[default]
    New,
    /// Every retained event.
    Beginning,
    /// Retained events published at or after this time.
    Since(SystemTime),
}

/// A durable subscription to event topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// Durable group name (`[A-Za-z0-9_-]`); members of one group compete, groups each get
    /// every event.
    pub group: String,
    /// Which event types the group wants.
    pub selector: Selector,
    /// Where a new group starts.
    pub start: StartPosition,
    /// Redelivery settings.
    pub consumer: ConsumerConfig,
}

impl Subscription {
    /// A group receiving `selector` from now on, with default consumer settings.
    pub fn new(group: impl Into<String>, selector: Selector) -> Self {
        Self { group: group.into(), selector, start: StartPosition::New, consumer: ConsumerConfig::default() }
    }

    /// Sets the start position.
    pub fn starting(mut self, start: StartPosition) -> Self {
        self.start = start;
        self
    }

    /// Sets the consumer settings.
    pub fn with_consumer(mut self, consumer: ConsumerConfig) -> Self {
        self.consumer = consumer;
        self
    }
}

/// Whether `name` is a valid group or queue token sequence (`[A-Za-z0-9_-]`, dot-separated).
pub(crate) fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
}
