//! One configuration schema for every service ([`Settings`]); each service reads its part.
//!
//! Sources, later ones winning: built-in defaults < a TOML file (`--config`) < environment
//! variables `IMAGEPIPE_<SECTION>__<KEY>` (e.g. `IMAGEPIPE_BUS__KIND=nats`). Every section
//! rejects unknown keys, and [`Settings::validate`] rejects values no service can use; both
//! errors name the key.

//!
//! One file per section, each with its defaults (stated once) and its checks; the `bus` and
//! `blob` sections belong to their crates ([`BusConfig`], [`BlobConfig`]). Every section type
//! is named `<Section>Config`. What `store.kind = embedded` means for each service is said in
//! [`store`](StoreConfig).

mod ai;
mod coordinator;
mod dedup;
mod dlq;
mod download;
mod error;
mod http;
mod list;
mod load;
mod log;
mod metadata;
mod net;
mod notification;
mod pipeline;
#[cfg(test)]
mod reference;
mod secret;
mod similarity;
mod store;
mod telemetry;
mod validate;
mod worker;

use imagepipe_blob::BlobConfig;
use imagepipe_bus::BusConfig;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use ai::{AiConfig, AiRuntime};
pub use coordinator::CoordinatorConfig;
pub use dedup::DedupConfig;
pub use dlq::DlqConfig;
pub use download::{DownloadConfig, PerHostConfig};
pub use error::ConfigError;
pub use http::{AUTH_TOKEN_NAME, HttpConfig, MIN_TOKEN_BYTES, Scope, ScopedToken};
pub use load::{CONFIG_PATH_ENV, ConfigArgs, ENV_PREFIX, key_to_env_name};
pub use log::{LogConfig, LogFormat};
pub use metadata::{MetadataConfig, ThumbnailFormat, ThumbnailSpec};
pub use net::{NetConfig, Outbound};
pub use notification::{InvalidWebhookSecret, NotificationConfig, WebhookSecret, WebhookTarget};
pub use pipeline::{PipelineConfig, StageCondition, StageConfig, mime_of_format, output_key, stage_output_too_large};
pub use secret::{MASK, Secret, SecretUrl, mask_url_credentials};
pub use similarity::SimilarityConfig;
pub use store::{RedisConfig, StoreConfig, StoreKind};
pub use telemetry::TelemetryConfig;
pub use worker::{PriorityShares, WorkerConfig};

use list::{ListItem, list_or_comma_separated_of, optional_list_or_comma_separated_of};
use validate::{memory_budget, non_empty_path, positive};

/// Every service's configuration. Sections a service does not use are ignored by it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Message bus (`bus.*`).
    pub bus: BusConfig,
    /// Coordinator state store (`store.*`).
    pub store: StoreConfig,
    /// Blob store: a local directory or S3 (`blob.*`).
    pub blob: BlobConfig,
    /// Download worker: HTTP limits and per-host politeness (`download.*`).
    pub download: DownloadConfig,
    /// Outbound network policy (`net.*`).
    pub net: NetConfig,
    /// The service's HTTP server (`http.*`).
    pub http: HttpConfig,
    /// AI model (`ai.*`).
    pub ai: AiConfig,
    /// Logging (`log.*`).
    pub log: LogConfig,
    /// Worker loop (`worker.*`).
    pub worker: WorkerConfig,
    /// Tracing (`telemetry.*`).
    pub telemetry: TelemetryConfig,
    /// Task coordinator (`coordinator.*`).
    pub coordinator: CoordinatorConfig,
    /// Metadata worker: decoding limits and thumbnails (`metadata.*`).
    pub metadata: MetadataConfig,
    /// Notification worker: webhook targets, signing secret, timeouts and retries
    /// (`notification.*`).
    pub notification: NotificationConfig,
    /// Event subscribers: how handled event ids are remembered (`dedup.*`).
    pub dedup: DedupConfig,
    /// Coordinator: bounds of the dead-letter archive (`dlq.*`).
    pub dlq: DlqConfig,
    /// Similarity indexer: near-duplicate thresholds and the vector index (`similarity.*`).
    pub similarity: SimilarityConfig,
    /// The stages of every task, built-in and users' own (`pipeline.stages`).
    pub pipeline: PipelineConfig,
}

#[cfg(test)]
mod tests;
