//! The broker a test's services meet on, and what a user does with it directly: publish a
//! submit command as plain JSON, as `nats pub` or `kcat -P` would.

use imagepipe_bus::{BusConfig, BusKind};

/// Where NATS runs for the tests (scripts/test.sh starts it there).
pub const NATS_URL_ENV: &str = "IMAGEPIPE_TEST_NATS_URL";
/// The variable naming the current NATS server's URL (scripts/nats.sh, `ensure_nats_latest`).
pub const NATS_LATEST_URL_ENV: &str = "IMAGEPIPE_TEST_NATS_LATEST_URL";
/// Where the Kafka-compatible broker runs for the tests (scripts/kafka.sh starts Tansu there).
pub const KAFKA_BROKERS_ENV: &str = "IMAGEPIPE_TEST_KAFKA_BROKERS";
/// The Redis the services keep their state in.
pub const REDIS_URL_ENV: &str = "IMAGEPIPE_TEST_REDIS_URL";

/// A broker the services of one test use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// NATS JetStream at this URL.
    Nats {
        /// `nats://host:port`.
        url: String,
    },
    /// Kafka (or a Kafka-compatible broker) at these bootstrap servers.
    Kafka {
        /// `host:port[,host:port]`.
        brokers: String,
    },
}

/// Publishing a submit command or cleaning up after a test failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The NATS server is unreachable.
    #[error("connecting to NATS at {url}")]
    NatsConnect {
        /// The server.
        url: String,
        /// Why.
        #[source]
        source: async_nats::ConnectError,
    },
    /// A Kafka client could not be created.
    #[error("creating a Kafka client for {brokers}")]
    KafkaClient {
        /// The bootstrap servers.
        brokers: String,
        /// Why.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// The broker did not store a publish.
    #[error("publishing on {subject}: {reason}")]
    Publish {
        /// The subject.
        subject: String,
        /// What the server or client said.
        reason: String,
    },
}

impl Backend {
    /// NATS from `IMAGEPIPE_TEST_NATS_URL`, default `nats://127.0.0.1:4222`.
    pub fn nats() -> Self {
        Self::Nats { url: std::env::var(NATS_URL_ENV).unwrap_or_else(|_| "nats://127.0.0.1:4222".into()) }
    }

    /// The current NATS server scripts/nats.sh starts beside Debian's 2.9, from
    /// `IMAGEPIPE_TEST_NATS_LATEST_URL`: there a coordinator reads its partitions through one
    /// consumer per group (NATS 2.10+). `None` (after saying why) when it is not set and
    /// skipping is allowed; without it, a panic.
    pub fn nats_latest() -> Option<Self> {
        match std::env::var(NATS_LATEST_URL_ENV) {
            Ok(url) if !url.is_empty() => Some(Self::Nats { url }),
            _ => {
                imagepipe_contracts::testing::environment_missing(&format!(
                    "the current NATS server is not running: {NATS_LATEST_URL_ENV} is not set \
                     (run the tests through scripts/test.sh, or `source scripts/nats.sh && ensure_nats_latest`)"
                ));
                None
            }
        }
    }

    /// Kafka from `IMAGEPIPE_TEST_KAFKA_BROKERS`, default `127.0.0.1:9092`.
    pub fn kafka() -> Self {
        Self::Kafka { brokers: std::env::var(KAFKA_BROKERS_ENV).unwrap_or_else(|_| "127.0.0.1:9092".into()) }
    }

    /// The `IMAGEPIPE_BUS__…` environment of a service on this broker.
    pub fn service_env(&self) -> Vec<(String, String)> {
        match self {
            Self::Nats { url } => {
                vec![("IMAGEPIPE_BUS__KIND".into(), "nats".into()), ("IMAGEPIPE_BUS__NATS__URL".into(), url.clone())]
            }
            Self::Kafka { brokers } => vec![
                ("IMAGEPIPE_BUS__KIND".into(), "kafka".into()),
                ("IMAGEPIPE_BUS__KAFKA__BROKERS".into(), brokers.clone()),
            ],
        }
    }

    /// The bus settings of a test-side client with `prefix`: as a service's, the
    /// coordinator's input topics with a partition per shard of the default count (a client
    /// that creates them first must not create them with fewer: a broker such as Tansu cannot
    /// grow a topic, and the coordinators would refuse to start).
    pub fn bus_config(&self, prefix: &str) -> BusConfig {
        let mut config = BusConfig { prefix: prefix.to_owned(), ..BusConfig::default() };
        config.kafka.shards = Some(imagepipe_contracts::shard::DEFAULT_SHARDS);
        match self {
            Self::Nats { url } => {
                config.kind = BusKind::Nats;
                config.nats.url = url.clone();
            }
            Self::Kafka { brokers } => {
                config.kind = BusKind::Kafka;
                config.kafka.brokers = brokers.clone();
            }
        }
        config
    }

    /// A publisher of raw submit commands on `<prefix>.tasks.submit`.
    pub async fn submitter(&self, prefix: &str) -> Result<Submitter, BackendError> {
        match self {
            Self::Nats { url } => {
                let client = async_nats::connect(url.as_str())
                    .await
                    .map_err(|source| BackendError::NatsConnect { url: url.clone(), source })?;
                Ok(Submitter::Nats { client, subject: submit_subject(prefix) })
            }
            Self::Kafka { brokers } => {
                let producer = rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", brokers)
                    .create()
                    .map_err(|source| BackendError::KafkaClient { brokers: brokers.clone(), source })?;
                Ok(Submitter::Kafka { producer, topic: submit_subject(prefix) })
            }
        }
    }

    /// Deletes what a test with `prefix` left on the broker (streams or topics).
    pub async fn cleanup(&self, prefix: &str) {
        match self {
            Self::Nats { url } => {
                if let Ok(bus) = imagepipe_bus::nats::NatsBus::connect(prefix, &self.bus_config(prefix).nats).await
                    && let Err(error) = bus.delete_streams().await
                {
                    eprintln!("cleanup of the streams of {prefix} on {url}: {error}");
                }
            }
            Self::Kafka { brokers } => {
                if let Err(error) = delete_kafka_topics(brokers, prefix).await {
                    eprintln!("cleanup of the topics of {prefix} on {brokers}: {error}");
                }
            }
        }
    }
}

/// The subject/topic submit commands go to.
pub fn submit_subject(prefix: &str) -> String {
    format!("{prefix}.{}", imagepipe_contracts::names::queues::SUBMIT)
}

/// Deletes every topic whose name starts with `<prefix>.`.
async fn delete_kafka_topics(brokers: &str, prefix: &str) -> Result<(), rdkafka::error::KafkaError> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let metadata = admin.inner().fetch_metadata(None, std::time::Duration::from_secs(10))?;
    let ours: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|name| name.starts_with(&format!("{prefix}.")))
        .collect();
    if ours.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = ours.iter().map(String::as_str).collect();
    admin.delete_topics(&names, &AdminOptions::new()).await.map(drop)
}

/// Publishes submit commands exactly as a user's tool would: the JSON body, no headers.
pub enum Submitter {
    /// A core NATS publish, exactly what `nats pub` does; the stream bound to the subject
    /// stores it.
    Nats {
        /// The connection.
        client: async_nats::Client,
        /// `<prefix>.tasks.submit`.
        subject: String,
    },
    /// A Kafka produce keyed by the task id, exactly what `kcat -P -k <taskId>` does.
    Kafka {
        /// The producer.
        producer: rdkafka::producer::FutureProducer,
        /// `<prefix>.tasks.submit`.
        topic: String,
    },
}

/// Publishes a [`Submitter`] sends before it waits for their acknowledgements.
const PUBLISH_WINDOW: usize = 256;

impl Submitter {
    /// Publishes every body and returns once the broker has stored each one: on NATS through
    /// JetStream, each publish acknowledged by the stream (a core publish the server fails to
    /// store would be lost without a word), at most [`PUBLISH_WINDOW`] awaiting at once.
    pub async fn publish_all(&self, bodies: Vec<Vec<u8>>) -> Result<(), BackendError> {
        match self {
            Self::Nats { client, subject } => {
                let failed = |e: &dyn std::fmt::Display| BackendError::Publish {
                    subject: subject.clone(),
                    reason: e.to_string(),
                };
                let js = async_nats::jetstream::new(client.clone());
                let mut waiting = Vec::with_capacity(PUBLISH_WINDOW);
                let mut bodies = bodies.into_iter().peekable();
                while bodies.peek().is_some() {
                    for body in bodies.by_ref().take(PUBLISH_WINDOW) {
                        waiting.push(js.publish(subject.clone(), body.into()).await.map_err(|e| failed(&e))?);
                    }
                    for ack in waiting.drain(..) {
                        ack.await.map_err(|e| failed(&e))?;
                    }
                }
                Ok(())
            }
            Self::Kafka { producer, topic } => {
                let failed =
                    |e: &dyn std::fmt::Display| BackendError::Publish { subject: topic.clone(), reason: e.to_string() };
                let mut deliveries = Vec::with_capacity(bodies.len());
                for body in &bodies {
                    let key = serde_json::from_slice::<serde_json::Value>(body)
                        .ok()
                        .and_then(|v| v["taskId"].as_str().map(str::to_owned))
                        .unwrap_or_default();
                    let record = rdkafka::producer::FutureRecord::to(topic).key(&key).payload(body);
                    deliveries.push(producer.send_result(record).map_err(|(e, _)| failed(&e))?);
                }
                for delivery in deliveries {
                    delivery.await.map_err(|e| failed(&e))?.map_err(|(e, _)| failed(&e))?;
                }
                Ok(())
            }
        }
    }
}

/// The Redis URL of the tests, from `IMAGEPIPE_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var(REDIS_URL_ENV).unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Deletes every Redis key starting with `prefix` (coordinator, analytics and tag index all
/// key by the bus prefix).
pub async fn cleanup_redis(prefix: &str) {
    let Ok(client) = redis::Client::open(redis_url()) else { return };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else { return };
    let pattern = format!("{prefix}*");
    let mut cursor: u64 = 0;
    loop {
        let scanned: Result<(u64, Vec<String>), _> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await;
        let Ok((next, keys)) = scanned else { return };
        if !keys.is_empty() {
            let _: Result<(), _> = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await;
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

/// Removes what a run left on the broker and in Redis when dropped, even when the test failed.
pub struct Cleanup {
    backend: Backend,
    prefix: String,
}

impl Cleanup {
    /// Cleans up `prefix` on `backend` when dropped.
    pub fn new(backend: &Backend, prefix: &str) -> Self {
        Self { backend: backend.clone(), prefix: prefix.to_owned() }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (backend, prefix) = (self.backend.clone(), self.prefix.clone());
        if std::thread::panicking() && matches!(backend, Backend::Kafka { .. }) {
            // A failed run may still hold Kafka clients in this process (its event recorder was
            // not stopped): deleting their topics under them can crash the test process and
            // hide the failure. The topics are left; the Redis keys go.
            eprintln!("a failed run leaves its Kafka topics {prefix}.*");
            let redis = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                runtime.block_on(cleanup_redis(&prefix));
            });
            let _ = redis.join();
            return;
        }
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async {
                backend.cleanup(&prefix).await;
                cleanup_redis(&prefix).await;
            });
        });
        let _ = cleanup.join();
    }
}
