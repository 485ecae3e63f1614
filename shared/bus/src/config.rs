//! Bus configuration (`bus.*` keys) and per-consumer settings.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::secret::{Secret, mask_url_credentials};
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
            && self
                .prefix
                .split('.')
                .all(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
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

/// The `bus.nats` section: servers, credentials, TLS, and the JetStream streams the backend
/// creates (or updates) at start. `Debug` masks credentials in `url` and the secrets.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URL(s), comma-separated (`nats://host:4222,nats://other:4222`).
    pub url: String,
    /// Client name shown in the server's connection list.
    pub name: Option<String>,
    /// How long the first connection may take before `Bus::connect` fails.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long a JetStream API call or a publish acknowledgement may take.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// First delay before reconnecting after the connection is lost; it doubles on every
    /// failed attempt (with jitter) up to `reconnect_delay_max`.
    #[serde(with = "humantime_serde")]
    pub reconnect_delay_min: Duration,
    /// Longest delay between reconnect attempts.
    #[serde(with = "humantime_serde")]
    pub reconnect_delay_max: Duration,
    /// NATS credentials file (JWT and NKey seed), for decentralized auth.
    pub credentials_file: Option<PathBuf>,
    /// User name, with `password`.
    pub user: Option<String>,
    /// Password of `user`.
    pub password: Option<Secret<String>>,
    /// Authentication token.
    pub token: Option<Secret<String>>,
    /// TLS settings.
    pub tls: NatsTlsConfig,
    /// Replicas of every stream (1 on a single server; 3 in a production cluster).
    pub replicas: usize,
    /// Where streams keep messages.
    pub storage: NatsStorage,
    /// Window within which a repeated message id (`Nats-Msg-Id`) is dropped as a duplicate.
    #[serde(with = "humantime_serde")]
    pub dedup_window: Duration,
    /// How long the events stream retains events for subscriber groups that start from the
    /// beginning or a time.
    #[serde(with = "humantime_serde")]
    pub events_max_age: Duration,
    /// How long dead letters are kept; `0s` keeps them until an operator purges them.
    #[serde(with = "humantime_serde")]
    pub dlq_max_age: Duration,
    /// Most bytes each stream holds; 0 is unlimited. A full task or dead-letter stream rejects
    /// publishes (nothing queued is dropped); a full events stream drops its oldest events.
    pub max_bytes: u64,
    /// Most messages each stream holds; 0 is unlimited. Full streams behave as for `max_bytes`.
    pub max_msgs: u64,
    /// Ack deadlines of successive deliveries (consumer backoff): delivery `n` waits
    /// `max(ack_wait, redelivery_backoff[n-1])`, the last entry repeating. Empty: every delivery
    /// waits the consumer's `ack_wait`.
    #[serde(with = "humantime_list")]
    pub redelivery_backoff: Vec<Duration>,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            name: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            reconnect_delay_min: Duration::from_millis(100),
            reconnect_delay_max: Duration::from_secs(5),
            credentials_file: None,
            user: None,
            password: None,
            token: None,
            tls: NatsTlsConfig::default(),
            replicas: 1,
            storage: NatsStorage::File,
            dedup_window: Duration::from_secs(120),
            events_max_age: Duration::from_secs(7 * 24 * 3600),
            dlq_max_age: Duration::ZERO,
            max_bytes: 0,
            max_msgs: 0,
            redelivery_backoff: Vec::new(),
        }
    }
}

impl std::fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConfig")
            .field("url", &mask_url_credentials(&self.url))
            .field("name", &self.name)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("reconnect_delay_min", &self.reconnect_delay_min)
            .field("reconnect_delay_max", &self.reconnect_delay_max)
            .field("credentials_file", &self.credentials_file)
            .field("user", &self.user)
            .field("password", &self.password)
            .field("token", &self.token)
            .field("tls", &self.tls)
            .field("replicas", &self.replicas)
            .field("storage", &self.storage)
            .field("dedup_window", &self.dedup_window)
            .field("events_max_age", &self.events_max_age)
            .field("dlq_max_age", &self.dlq_max_age)
            .field("max_bytes", &self.max_bytes)
            .field("max_msgs", &self.max_msgs)
            .field("redelivery_backoff", &self.redelivery_backoff)
            .finish()
    }
}

/// Where a JetStream stream keeps its messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NatsStorage {
    /// On disk; survives a server restart.
    #[default]
    File,
    /// In memory; lost when the server stops.
    Memory,
}

/// The `bus.nats.tls` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsTlsConfig {
    /// Refuse to connect without TLS (implied by `tls://` URLs and by the other settings).
    pub required: bool,
    /// PEM file of the CA certificates that sign the server's certificate.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for mutual TLS (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Start TLS before the server's INFO (servers configured with `handshake_first`).
    pub handshake_first: bool,
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

/// Serde for a list of durations written the humantime way (`["1s", "30s", "2m"]`).
mod humantime_list {
    use std::time::Duration;

    use humantime_serde::Serde;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(durations: &[Duration], serializer: S) -> Result<S::Ok, S::Error> {
        durations.iter().map(|d| Serde::from(*d)).collect::<Vec<_>>().serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Duration>, D::Error> {
        Ok(Vec::<Serde<Duration>>::deserialize(deserializer)?.into_iter().map(Serde::into_inner).collect())
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
#[cfg(any(feature = "memory", feature = "nats"))]
pub(crate) fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .split('.')
            .all(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
}
