//! Bus configuration (`bus.*` keys) and per-consumer settings.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::selector::Selector;
use imagepipe_secret::{Secret, mask_url_credentials};

/// Which backend carries the messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// Largest message sent (body, headers, key and id), in bytes; a larger one is refused
    /// before it reaches the broker. Keep it at or below the broker's own limit (NATS
    /// `max_payload`, Kafka `message.max.bytes`; both 1 MiB by default).
    pub max_message_bytes: usize,
}

impl BusConfig {
    /// `max_message_bytes` by default: NATS's default `max_payload`, 1 MiB.
    pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1024 * 1024;
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: Self::DEFAULT_MAX_MESSAGE_BYTES,
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
        if self.max_message_bytes < 1024 {
            return Err("bus.max_message_bytes: must be at least 1024".into());
        }
        if self.memory.capacity == 0 {
            return Err("bus.memory.capacity: must be at least 1".into());
        }
        if self.kind == BusKind::Kafka {
            self.kafka.validate()?;
        }
        Ok(())
    }
}

/// The `bus.memory` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Most messages a queue or subscriber group holds; a send waits while it is full.
    pub capacity: usize,
    /// How long `send` waits for room before failing with `BusError::Full`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub send_timeout: Duration,
    /// Window within which a repeated message id is dropped as a duplicate.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
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
#[derive(Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URL(s), comma-separated (`nats://host:4222,nats://other:4222`).
    pub url: String,
    /// Client name shown in the server's connection list.
    pub name: Option<String>,
    /// How long the first connection may take before `Bus::connect` fails.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub connect_timeout: Duration,
    /// How long a JetStream API call or a publish acknowledgement may take.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub request_timeout: Duration,
    /// First delay before reconnecting after the connection is lost; it doubles on every
    /// failed attempt (with jitter) up to `reconnect_delay_max`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub reconnect_delay_min: Duration,
    /// Longest delay between reconnect attempts.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub reconnect_delay_max: Duration,
    /// NATS credentials file (JWT and NKey seed), for decentralized auth.
    pub credentials_file: Option<PathBuf>,
    /// User name, with `password`.
    pub user: Option<String>,
    /// Password of `user`.
    #[schemars(with = "Option<String>")]
    pub password: Option<Secret<String>>,
    /// Authentication token.
    #[schemars(with = "Option<String>")]
    pub token: Option<Secret<String>>,
    /// TLS settings.
    pub tls: NatsTlsConfig,
    /// Replicas of every stream (1 on a single server; 3 in a production cluster).
    pub replicas: usize,
    /// Where streams keep messages.
    pub storage: NatsStorage,
    /// Window within which a repeated message id (`Nats-Msg-Id`) is dropped as a duplicate.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub dedup_window: Duration,
    /// How long the events stream retains events for subscriber groups that start from the
    /// beginning or a time.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub events_max_age: Duration,
    /// How long dead letters are kept; `0s` keeps them until an operator purges them.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
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
    #[schemars(with = "Vec<String>", extend("items" = { "type": "string", "format": "duration" }))]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NatsStorage {
    /// On disk; survives a server restart.
    #[default]
    File,
    /// In memory; lost when the server stops.
    Memory,
}

/// The `bus.nats.tls` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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

/// The `bus.kafka` section: brokers, client and security settings, the topics the backend
/// creates at start, consumer group timing, and the delay tiers of redelivery. `Debug` masks
/// the SASL password and secret-looking client properties.
#[derive(Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap brokers, comma-separated (`host:9092,other:9092`).
    pub brokers: String,
    /// Client id shown in the broker's logs and metrics.
    pub client_id: String,
    /// Partitions of every topic the backend creates (existing topics keep theirs).
    pub partitions: i32,
    /// Replicas of every topic the backend creates (1 on a single broker; 3 in production).
    pub replication_factor: i32,
    /// The coordinator's shard count (`coordinator.shards`, set by the runtime), when its
    /// input queues are partitioned by shard: their topics (`tasks.submit`, `tasks.results`
    /// and their lanes) get at least this many partitions, and a keyed send to them without a
    /// partition goes to partition `shard_of(key, shards)`. `None`: they get `partitions` like
    /// every topic, and keys are spread over the partitions a topic has. Not a key of its own:
    /// the runtime sets it from `coordinator.shards` when it loads the settings.
    #[serde(skip)]
    #[schemars(skip)]
    pub shards: Option<u16>,
    /// `security.protocol`: `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl`.
    pub security_protocol: Option<String>,
    /// `sasl.mechanism`: `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`.
    pub sasl_mechanism: Option<String>,
    /// SASL user name, with `sasl_password`.
    pub sasl_username: Option<String>,
    /// Password of `sasl_username`.
    #[schemars(with = "Option<String>")]
    pub sasl_password: Option<Secret<String>>,
    /// PEM file of the CA certificates that sign the brokers' certificates.
    pub ssl_ca_file: Option<PathBuf>,
    /// Further librdkafka properties (`socket.keepalive.enable = "true"`); the ones the
    /// backend manages (idempotence, group, commits, offsets) are refused.
    pub client: BTreeMap<String, String>,
    /// How long `Bus::connect` waits for the brokers to answer.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub connect_timeout: Duration,
    /// How long a topic creation, metadata or offset request may take.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub request_timeout: Duration,
    /// How long a send may take before it fails (`message.timeout.ms`), retries included.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub send_timeout: Duration,
    /// How long the producer waits to batch messages (`linger.ms`); `0s` sends at once (messages
    /// queued while earlier requests are in flight are still batched together).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub linger: Duration,
    /// Consumer group session timeout: a member silent this long is dropped from its group.
    /// Tansu also delays a new group's first assignment by half of it.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub session_timeout: Duration,
    /// Heartbeat interval of group members; shorter makes rebalances quicker.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub heartbeat_interval: Duration,
    /// Longest time the broker holds a fetch when no message is there (`fetch.wait.max.ms`).
    /// Tansu holds an empty fetch this long even when a message arrives meanwhile, so on Tansu
    /// this is also how long a waiting consumer may take to see a new message (half of it on
    /// average); shorter costs one fetch request per wait per consumer group member.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub fetch_wait_max: Duration,
    /// How long `consume`/`subscribe` waits for the group's first partition assignment.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub assignment_timeout: Duration,
    /// Delay tiers of redelivery: a nack with delay `d` goes to the retry topic of the
    /// smallest tier at least `d` (the largest when none is), where it is held until due.
    #[serde(with = "humantime_list")]
    #[schemars(with = "Vec<String>", extend("items" = { "type": "string", "format": "duration" }))]
    pub retry_tiers: Vec<Duration>,
    /// Within one partition, a message whose id was seen this recently is dropped as a
    /// duplicate.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub dedup_window: Duration,
    /// Most received messages one group member buffers before it pauses fetching.
    pub prefetch: usize,
    /// How often the client reports broker state (readiness follows it).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub health_interval: Duration,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            client_id: "imagepipe".into(),
            partitions: 6,
            replication_factor: 1,
            shards: None,
            security_protocol: None,
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            ssl_ca_file: None,
            client: BTreeMap::new(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            send_timeout: Duration::from_secs(30),
            linger: Duration::from_millis(1),
            session_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(1),
            fetch_wait_max: Duration::from_millis(100),
            assignment_timeout: Duration::from_secs(30),
            retry_tiers: [1, 10, 60, 600].into_iter().map(Duration::from_secs).collect(),
            dedup_window: Duration::from_secs(120),
            prefetch: 256,
            health_interval: Duration::from_secs(1),
        }
    }
}

/// librdkafka properties the Kafka backend sets itself; `bus.kafka.client` may not override them.
pub(crate) const KAFKA_MANAGED_PROPERTIES: [&str; 12] = [
    "bootstrap.servers",
    "group.id",
    "enable.idempotence",
    "acks",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "statistics.interval.ms",
    "sasl.password",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "message.timeout.ms",
];

impl KafkaConfig {
    /// Checks values the backend cannot use, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.brokers.split(',').all(|b| b.trim().is_empty()) {
            return Err("bus.kafka.brokers: no broker given".into());
        }
        if self.partitions < 1 {
            return Err(format!("bus.kafka.partitions: {} must be at least 1", self.partitions));
        }
        if self.replication_factor < 1 {
            return Err(format!("bus.kafka.replication_factor: {} must be at least 1", self.replication_factor));
        }
        if let Some(shards) = self.shards
            && !(1..=imagepipe_contracts::shard::MAX_SHARDS).contains(&shards)
        {
            return Err(format!(
                "bus.kafka.shards: {shards} must be between 1 and {}",
                imagepipe_contracts::shard::MAX_SHARDS
            ));
        }
        if self.sasl_username.is_some() != self.sasl_password.is_some() {
            return Err("bus.kafka.sasl_username and bus.kafka.sasl_password go together".into());
        }
        for (key, value) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
            ("send_timeout", self.send_timeout),
            ("session_timeout", self.session_timeout),
            ("heartbeat_interval", self.heartbeat_interval),
            ("fetch_wait_max", self.fetch_wait_max),
            ("assignment_timeout", self.assignment_timeout),
            ("health_interval", self.health_interval),
        ] {
            if value < Duration::from_millis(1) {
                return Err(format!("bus.kafka.{key}: must be at least 1ms"));
            }
        }
        if self.heartbeat_interval >= self.session_timeout {
            return Err(format!(
                "bus.kafka.heartbeat_interval ({:?}) must be below bus.kafka.session_timeout ({:?})",
                self.heartbeat_interval, self.session_timeout
            ));
        }
        if self.retry_tiers.is_empty() {
            return Err("bus.kafka.retry_tiers: give at least one delay tier".into());
        }
        if self.retry_tiers.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("bus.kafka.retry_tiers: {:?} must be strictly increasing", self.retry_tiers));
        }
        if self.retry_tiers.iter().any(|t| t.subsec_nanos() % 1_000_000 != 0 || t.is_zero()) {
            return Err("bus.kafka.retry_tiers: tiers are whole milliseconds above zero".into());
        }
        if self.prefetch == 0 {
            return Err("bus.kafka.prefetch: must be at least 1".into());
        }
        if let Some(key) = self.client.keys().find(|k| KAFKA_MANAGED_PROPERTIES.contains(&k.as_str())) {
            return Err(format!("bus.kafka.client.{key}: set by the backend (or by its own bus.kafka key)"));
        }
        Ok(())
    }
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let client: BTreeMap<&str, &str> = self
            .client
            .iter()
            .map(|(k, v)| {
                let secret = ["password", "secret", "key", "token", "jaas"].iter().any(|s| k.contains(s));
                (k.as_str(), if secret { imagepipe_secret::MASK } else { v.as_str() })
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &mask_url_credentials(&self.brokers))
            .field("client_id", &self.client_id)
            .field("partitions", &self.partitions)
            .field("replication_factor", &self.replication_factor)
            .field("shards", &self.shards)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &self.sasl_password)
            .field("ssl_ca_file", &self.ssl_ca_file)
            .field("client", &client)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("send_timeout", &self.send_timeout)
            .field("linger", &self.linger)
            .field("session_timeout", &self.session_timeout)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("fetch_wait_max", &self.fetch_wait_max)
            .field("assignment_timeout", &self.assignment_timeout)
            .field("retry_tiers", &self.retry_tiers)
            .field("dedup_window", &self.dedup_window)
            .field("prefetch", &self.prefetch)
            .field("health_interval", &self.health_interval)
            .finish()
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

/// How long a subscriber group outlives its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupLifetime {
    /// The group stays until an operator deletes it, and resumes where it was: a service's
    /// group, whose replicas come and go.
    #[default]
    Durable,
    /// The broker deletes the group once no member has asked it for events for this long: a
    /// group of one process (the coordinator's `/v1/events` fan-out) that must not outlive it.
    /// NATS deletes the consumer (its `inactive_threshold`); the in-memory bus drops the group
    /// with its last member; Kafka keeps a memberless group's offsets for the broker's
    /// `offsets.retention.minutes`, whatever is asked here.
    UntilIdle(Duration),
}

/// A subscription to event topics: a durable group unless its [`GroupLifetime`] says otherwise.
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
    /// How long the group outlives its members.
    pub lifetime: GroupLifetime,
}

impl Subscription {
    /// A durable group receiving `selector` from now on, with default consumer settings.
    pub fn new(group: impl Into<String>, selector: Selector) -> Self {
        Self {
            group: group.into(),
            selector,
            start: StartPosition::New,
            consumer: ConsumerConfig::default(),
            lifetime: GroupLifetime::Durable,
        }
    }

    /// Makes the group one the broker deletes once no member has fetched for `idle`
    /// ([`GroupLifetime::UntilIdle`]).
    pub fn expiring_when_idle(mut self, idle: Duration) -> Self {
        self.lifetime = GroupLifetime::UntilIdle(idle);
        self
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
#[cfg(any(feature = "memory", feature = "nats", feature = "kafka"))]
pub(crate) fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .split('.')
            .all(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
}
