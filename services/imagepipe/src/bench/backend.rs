//! The broker and store of one run under its own prefix: connecting them, asking the broker
//! how many messages it stored, and removing everything the run left behind.

use std::collections::BTreeMap;

use imagepipe_bus::kafka::KafkaBus;
use imagepipe_bus::nats::NatsBus;
use imagepipe_bus::{Bus, BusError, BusKind};
use imagepipe_runtime::Settings;
use imagepipe_runtime::config::StoreKind;

use super::counting::{self, Counts};

/// Streams of a NATS prefix, in the order of [`NatsBus::stream_names`].
const STREAMS: [&str; 3] = ["tasks", "events", "dlq"];

/// Messages stored by the broker so far, by stream; `None` for brokers the bench cannot ask.
pub type BrokerCounts = Option<BTreeMap<String, u64>>;

/// The run's bus (counting what is published through it) and how to clean up after it.
pub struct RunBackend {
    /// The bus every in-process service of the run uses.
    pub bus: Bus,
    /// Publishes through [`Self::bus`].
    pub counts: Counts,
    nats: Option<NatsBus>,
    kafka: Option<KafkaBus>,
    prefix: String,
    redis_url: Option<String>,
}

impl RunBackend {
    /// Connects the bus of `settings.bus` (whose prefix is the run's own).
    pub async fn connect(settings: &Settings) -> Result<Self, BusError> {
        let (prefix, mut nats, mut kafka) = (&settings.bus.prefix, None, None);
        let bus = match settings.bus.kind {
            BusKind::Nats => nats.insert(NatsBus::connect(prefix, &settings.bus.nats).await?).clone().into_bus(),
            BusKind::Kafka => {
                kafka.insert(KafkaBus::connect(prefix, &settings.bus_config().kafka).await?).clone().into_bus()
            }
            BusKind::Memory => Bus::connect(&settings.bus).await?,
        };
        let (bus, counts) = counting::counting(bus);
        let redis_url = (settings.store.kind == StoreKind::Redis).then(|| settings.store.redis.url.expose().to_owned());
        Ok(Self { bus, counts, nats, kafka, prefix: prefix.clone(), redis_url })
    }

    /// What the broker itself says it stored, per stream (NATS: each stream's last sequence).
    pub async fn broker_counts(&self) -> Result<BrokerCounts, BusError> {
        let Some(nats) = &self.nats else { return Ok(None) };
        let sequences = nats.stream_sequences().await?;
        Ok(Some(STREAMS.iter().map(|s| (*s).to_owned()).zip(sequences).collect()))
    }

    /// Deletes the run's streams, topics and Redis keys (a Kafka client first leaves its
    /// groups); returns what could not be cleaned, to report. Call it once the run's services
    /// have stopped.
    pub async fn clean_up(self, settings: &Settings) -> Vec<String> {
        let Self { bus, nats, kafka, prefix, redis_url, .. } = self;
        drop(bus);
        let mut left = Vec::new();
        if let Some(kafka) = kafka {
            let topics = kafka.topics();
            kafka.shutdown().await;
            drop(kafka);
            if let Err(error) = KafkaBus::delete_topics(&settings.bus.kafka, &topics).await {
                left.push(format!("Kafka topics of prefix {prefix}: {}", imagepipe_runtime::error_chain(&error)));
            }
        }
        left.extend(clean_up(nats.as_ref(), &prefix, redis_url.as_deref()).await);
        left
    }
}

/// Deletes the NATS streams of `nats` and the Redis keys under `prefix:` at `redis_url`;
/// returns what could not be cleaned.
pub async fn clean_up(nats: Option<&NatsBus>, prefix: &str, redis_url: Option<&str>) -> Vec<String> {
    let mut left = Vec::new();
    if let Some(nats) = nats
        && let Err(error) = nats.delete_streams().await
    {
        left.push(format!("NATS streams of prefix {prefix}: {}", imagepipe_runtime::error_chain(&error)));
    }
    if let Some(url) = redis_url
        && let Err(error) = delete_redis_keys(url, prefix).await
    {
        left.push(format!("Redis keys {prefix}:*: {error}"));
    }
    left
}

/// Deletes every key starting with `prefix:`, or with the hash tag `{prefix:` (a key that
/// starts with its shard's tag), on every primary of a cluster.
async fn delete_redis_keys(url: &str, prefix: &str) -> Result<(), redis::RedisError> {
    let mut conn = imagepipe_runtime::redis_connection::RedisConnection::open(url).await?;
    for pattern in [format!("{prefix}:*"), format!("{{{prefix}:*")] {
        let keys = conn.scan_match(&pattern, 1_000).await?;
        for batch in keys.chunks(1_000) {
            // One UNLINK per key: a cluster refuses one over several slots in a pipeline part.
            let mut pipe = redis::pipe();
            for key in batch {
                pipe.cmd("UNLINK").arg(key).ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
        }
    }
    Ok(())
}

/// Per-stream `after - before`.
pub fn broker_delta(before: &BrokerCounts, after: &BrokerCounts) -> BrokerCounts {
    let (before, after) = (before.as_ref()?, after.as_ref()?);
    Some(after.iter().map(|(s, n)| (s.clone(), n - before.get(s).copied().unwrap_or(0))).collect())
}
