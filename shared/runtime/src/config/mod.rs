//! One configuration schema for every service ([`Settings`]); each service reads its part.
//!
//! Sources, later ones winning: built-in defaults < a TOML file (`--config`) < environment
//! variables `IMAGEPIPE_<SECTION>__<KEY>` (e.g. `IMAGEPIPE_BUS__KIND=nats`). Every section
//! rejects unknown keys, and [`Settings::validate`] rejects values no service can use; both
//! errors name the key.

mod error;
mod load;
mod secret;
mod subscribers;
mod validate;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use imagepipe_blob::BlobConfig;
use imagepipe_bus::{BusConfig, ConsumerConfig};
use serde::{Deserialize, Deserializer, Serialize};

pub use error::ConfigError;
pub use load::{CONFIG_PATH_ENV, ConfigArgs, ENV_PREFIX};
pub use secret::{MASK, Secret, SecretUrl, mask_url_credentials};
pub use subscribers::{DedupSettings, NotificationSettings};

/// Every service's configuration. Sections a service does not use are ignored by it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Message bus (`bus.*`).
    pub bus: BusConfig,
    /// Coordinator state store (`store.*`).
    pub store: StoreConfig,
    /// Blob store: a local directory or S3 (`blob.*`).
    pub blob: BlobConfig,
    /// Download worker: HTTP limits (`download.*`).
    pub download: DownloadSettings,
    /// Outbound network policy (`net.*`).
    pub net: NetConfig,
    /// The service's HTTP server (`http.*`).
    pub http: HttpConfig,
    /// AI model (`ai.*`).
    pub ai: AiConfig,
    /// Logging (`log.*`).
    pub log: LogConfig,
    /// Worker loop (`worker.*`).
    pub worker: WorkerSettings,
    /// Tracing (`telemetry.*`).
    pub telemetry: TelemetryConfig,
    /// Task coordinator (`coordinator.*`).
    pub coordinator: CoordinatorSettings,
    /// Metadata worker: decoding limits and thumbnails (`metadata.*`).
    pub metadata: MetadataSettings,
    /// Notification worker: webhook targets, signing secret, timeouts and retries
    /// (`notification.*`).
    pub notification: NotificationSettings,
    /// Event subscribers: how handled event ids are remembered (`dedup.*`).
    pub dedup: DedupSettings,
}

/// Which state store the coordinator uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// File-backed store in `store.path`, for one process (`imagepipe run`).
    #[default]
    Embedded,
    /// Redis at `store.redis.url`, shared by coordinator replicas.
    Redis,
}

/// The `store` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Backend.
    pub kind: StoreKind,
    /// Directory of the embedded store.
    pub path: PathBuf,
    /// Redis settings.
    pub redis: RedisConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { kind: StoreKind::default(), path: PathBuf::from(".imagepipe/store"), redis: RedisConfig::default() }
    }
}

/// The `store.redis` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]` (or `rediss://` for TLS); the password is
    /// masked whenever printed.
    pub url: SecretUrl,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self { url: SecretUrl::new("redis://127.0.0.1:6379") }
    }
}

/// The `download` section: limits of the download worker's HTTP client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DownloadSettings {
    /// Largest image accepted, in bytes; a body passing it is cut off while it streams.
    pub max_bytes: u64,
    /// Longest time to resolve and connect to one server.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest time for a whole download, redirects and body included.
    #[serde(with = "humantime_serde")]
    pub total_timeout: Duration,
    /// Most redirects followed, each one checked by the SSRF guard like the first request.
    pub max_redirects: u32,
    /// The `User-Agent` header of downloads.
    pub user_agent: String,
}

impl DownloadSettings {
    /// Most redirects `max_redirects` may allow.
    pub const MAX_REDIRECTS_LIMIT: u32 = 20;
}

impl Default for DownloadSettings {
    fn default() -> Self {
        Self {
            max_bytes: 25 * 1024 * 1024,
            connect_timeout: Duration::from_secs(10),
            total_timeout: Duration::from_secs(60),
            max_redirects: 5,
            user_agent: concat!("imagepipe-download-worker/", env!("CARGO_PKG_VERSION")).into(),
        }
    }
}

/// The `net` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// CIDRs the download and webhook clients may reach despite the SSRF guard
    /// (`10.0.0.0/8`, `::1/128`); a comma-separated list in the environment.
    #[serde(deserialize_with = "list_or_comma_separated")]
    pub allow_cidrs: Vec<String>,
}

impl NetConfig {
    /// The allowed networks, parsed; the error names the offending entry.
    pub fn allowed_networks(&self) -> Result<Vec<ipnet::IpNet>, ConfigError> {
        self.allow_cidrs
            .iter()
            .enumerate()
            .map(|(i, cidr)| {
                cidr.trim().parse().map_err(|e| ConfigError::Invalid {
                    key: format!("net.allow_cidrs[{i}]"),
                    reason: format!("{cidr:?} is not a CIDR such as 10.0.0.0/8 ({e})"),
                })
            })
            .collect()
    }
}

/// The `http` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Address to listen on.
    pub bind: IpAddr,
    /// Port of the service's HTTP server (health, metrics, its API).
    pub port: u16,
    /// Bearer token the HTTP API requires, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_token: Option<Secret<String>>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self { bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED), port: 8080, auth_token: None }
    }
}

impl HttpConfig {
    /// `bind:port`.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.port)
    }
}

/// The `ai` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AiConfig {
    /// Where the prepared model files are (written by `scripts/prepare-model.sh`).
    pub model_dir: PathBuf,
    /// How many of the best classes an analysis reports.
    pub top_k: usize,
    /// Most inferences running at once, each on its own blocking thread (default: cores).
    pub threads: usize,
    /// Least score a tag needs to be reported; a tag's score is the summed probability of the
    /// classes it covers.
    pub tag_min_score: f64,
    /// Most pixels (width × height) an image may have; larger ones fail before they are decoded.
    pub max_pixels: u64,
}

impl Default for AiConfig {
    fn default() -> Self {
        Self {
            model_dir: PathBuf::from(".imagepipe/models"),
            top_k: 5,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            tag_min_score: 0.05,
            max_pixels: 100_000_000,
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The `log` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Line format.
    pub format: LogFormat,
    /// `tracing` filter directives (`info`, `imagepipe_runtime=debug,info`); `RUST_LOG`, when
    /// set, takes precedence. Also accepted as `log.level`.
    #[serde(alias = "level")]
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::default(), filter: "info".into() }
    }
}

/// The `worker` section: how a worker consumes its queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSettings {
    /// Most messages handled at once (default 2 × cores).
    pub concurrency: usize,
    /// A delivery not settled (nor extended by progress) within this time is redelivered.
    #[serde(with = "humantime_serde")]
    pub ack_wait: Duration,
    /// Deliveries allowed before a message is dead-lettered.
    pub max_deliveries: u32,
    /// A handler running longer is abandoned and its message retried.
    #[serde(with = "humantime_serde")]
    pub handler_timeout: Duration,
    /// On shutdown, how long in-flight handlers may take to finish.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            concurrency: 2 * cores,
            ack_wait: Duration::from_secs(30),
            max_deliveries: 5,
            handler_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(25),
        }
    }
}

impl WorkerSettings {
    /// The consumer settings to open the worker's queue with.
    pub fn consumer_config(&self) -> ConsumerConfig {
        ConsumerConfig { ack_wait: self.ack_wait, max_deliveries: self.max_deliveries }
    }
}

/// The `telemetry` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Service name on traces; defaults to the service's own name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
}

/// The `coordinator` section: retries, deadlines and limits of the task coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorSettings {
    /// Most tasks started and unfinished at once; beyond it submissions wait in their queue.
    pub max_in_flight: u64,
    /// Attempts per step before the task fails.
    pub max_attempts: u32,
    /// How long a step may stay silent before the attempt counts as failed.
    #[serde(with = "humantime_serde")]
    pub step_deadline: Duration,
    /// The download step's deadline, when it differs from `step_deadline`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub download_deadline: Option<Duration>,
    /// The metadata step's deadline, when it differs from `step_deadline`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub metadata_deadline: Option<Duration>,
    /// The analyze step's deadline, when it differs from `step_deadline`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub analyze_deadline: Option<Duration>,
    /// How long after a state write the sweeper relays outbox entries the write's own relay
    /// did not (e.g. after a crash).
    #[serde(with = "humantime_serde")]
    pub relay_grace: Duration,
    /// How often the sweeper looks for due timers and unrelayed outbox entries.
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    /// Subscriber groups whose dead letters the coordinator archives for `/v1/dlq`, besides
    /// every task queue's; a comma-separated list in the environment.
    #[serde(deserialize_with = "list_or_comma_separated")]
    pub dlq_groups: Vec<String>,
}

impl Default for CoordinatorSettings {
    fn default() -> Self {
        Self {
            max_in_flight: 1_000,
            max_attempts: 5,
            step_deadline: Duration::from_secs(300),
            download_deadline: None,
            metadata_deadline: None,
            analyze_deadline: None,
            relay_grace: Duration::from_secs(10),
            sweep_interval: Duration::from_secs(1),
            dlq_groups: Vec::new(),
        }
    }
}

/// The `metadata` section: how the metadata worker decodes images and writes thumbnails.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataSettings {
    /// Most pixels (width × height) an image may have; larger ones fail before they are decoded.
    pub max_pixels: u64,
    /// Widest image accepted, in pixels.
    pub max_width: u32,
    /// Tallest image accepted, in pixels.
    pub max_height: u32,
    /// Most bytes a decoder may allocate for one image.
    pub max_alloc_bytes: u64,
    /// Long edge of the thumbnail, in pixels.
    pub thumbnail_size: u32,
    /// JPEG quality of thumbnails without alpha, 1-100 (thumbnails with alpha are PNG).
    pub thumbnail_quality: u8,
}

impl Default for MetadataSettings {
    fn default() -> Self {
        Self {
            max_pixels: 100_000_000,
            max_width: 65_535,
            max_height: 65_535,
            max_alloc_bytes: 1 << 30,
            thumbnail_size: 256,
            thumbnail_quality: 85,
        }
    }
}

/// Accepts a list, or one string of comma-separated items (how lists arrive from the
/// environment); blank items are dropped.
fn list_or_comma_separated<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    struct ListVisitor;

    impl<'de> serde::de::Visitor<'de> for ListVisitor {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of strings or one comma-separated string")
        }

        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
            Ok(s.split(',').map(str::to_owned).collect())
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element::<String>()? {
                items.push(item);
            }
            Ok(items)
        }
    }

    let items = deserializer.deserialize_any(ListVisitor)?;
    Ok(items.into_iter().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
}

#[cfg(test)]
mod tests;
