//! The producer every send, publish, redelivery and dead letter goes through: idempotent
//! (`enable.idempotence`, so its own retries never duplicate or reorder), waiting for every
//! in-sync replica (`acks=all`), and reporting broker state for readiness.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::statistics::Statistics;
use rdkafka::util::Timeout;

use super::client::{self, ms};
use super::codec;
use crate::config::KafkaConfig;
use crate::error::BusError;
use crate::message::Message;

/// What the producer's statistics last said about the brokers and the idempotent producer.
#[derive(Debug)]
pub(crate) struct Health {
    interval: Duration,
    state: Mutex<HealthState>,
}

#[derive(Debug)]
struct HealthState {
    brokers_up: bool,
    reported: Instant,
    idempotence: Option<Idempotence>,
}

/// The idempotent producer's state, from librdkafka's statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotence {
    /// `Assigned` once the broker gave the producer an id; `Init`, `WaitPID`, ... before.
    pub state: String,
    /// The producer id the broker assigned, or -1.
    pub producer_id: i64,
}

impl Health {
    fn new(interval: Duration) -> Self {
        let state = HealthState { brokers_up: true, reported: Instant::now(), idempotence: None };
        Self { interval, state: Mutex::new(state) }
    }

    /// Whether a broker connection is up, by statistics no older than three intervals.
    pub(crate) fn is_connected(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.brokers_up && state.reported.elapsed() < self.interval * 3 + Duration::from_secs(1)
    }

    /// The idempotent producer's last reported state.
    pub(crate) fn idempotence(&self) -> Option<Idempotence> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).idempotence.clone()
    }
}

/// The producer's context: statistics into [`Health`], logs into `tracing`.
pub(crate) struct ProducerContext {
    health: Arc<Health>,
}

impl ClientContext for ProducerContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, line: &str) {
        client::log(level, facility, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        client::client_error(&error, reason);
    }

    fn stats(&self, statistics: Statistics) {
        let brokers_up = statistics.brokers.values().any(|b| b.state == "UP");
        let idempotence = statistics
            .eos
            .as_ref()
            .map(|eos| Idempotence { state: eos.idemp_state.clone(), producer_id: eos.producer_id });
        let mut state = self.health.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.brokers_up != brokers_up {
            if brokers_up {
                tracing::info!("Kafka brokers reachable again");
            } else {
                tracing::warn!("no Kafka broker reachable; the client keeps reconnecting");
            }
        }
        *state = HealthState { brokers_up, reported: Instant::now(), idempotence };
    }
}

/// librdkafka's default `message.max.bytes`.
const LIBRDKAFKA_MAX_MESSAGE_BYTES: usize = 1_000_000;

/// The bus's producer. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Producer {
    inner: FutureProducer<ProducerContext>,
    health: Arc<Health>,
    send_timeout: Duration,
    /// The client's `message.max.bytes`, for the error of a message it refuses.
    max_message_bytes: usize,
}

impl Producer {
    pub(crate) fn new(config: &KafkaConfig) -> Result<Self, BusError> {
        let health = Arc::new(Health::new(config.health_interval));
        let mut c = client::base_config(config);
        // Topics are created by the backend with the configured partitions, never by a send.
        c.set("enable.idempotence", "true")
            .set("allow.auto.create.topics", "false")
            .set("acks", "all")
            // 0 is allowed here (send at once), unlike the other durations.
            .set("linger.ms", config.linger.as_millis().to_string())
            .set("message.timeout.ms", ms(config.send_timeout))
            .set("statistics.interval.ms", ms(config.health_interval));
        let inner = c.create_with_context(ProducerContext { health: health.clone() }).map_err(|err| {
            BusError::Connect { url: imagepipe_secret::mask_url_credentials(&config.brokers), source: Box::new(err) }
        })?;
        let max_message_bytes =
            c.get("message.max.bytes").and_then(|v| v.parse().ok()).unwrap_or(LIBRDKAFKA_MAX_MESSAGE_BYTES);
        Ok(Self { inner, health, send_timeout: config.send_timeout, max_message_bytes })
    }

    /// The underlying client (metadata requests).
    pub(crate) fn client(&self) -> &FutureProducer<ProducerContext> {
        &self.inner
    }

    pub(crate) fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Sends `message` (plus the `extra` headers) to `topic`, in `partition` when given (else
    /// by key), and returns once every in-sync replica has it.
    pub(crate) async fn send(
        &self,
        topic: &str,
        partition: Option<i32>,
        message: &Message,
        extra: &[(&str, &str)],
    ) -> Result<(), BusError> {
        let headers = codec::encode_headers(message, extra)?;
        let mut record: FutureRecord<'_, str, [u8]> =
            FutureRecord::to(topic).payload(&message.payload[..]).headers(headers);
        if let Some(key) = &message.key {
            record = record.key(key.as_str());
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        match self.inner.send(record, Timeout::After(self.send_timeout)).await {
            Ok(_) => Ok(()),
            Err((err, _)) if err.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageSizeTooLarge) => {
                Err(BusError::TooLarge {
                    destination: topic.to_owned(),
                    size: message.size(),
                    max: self.max_message_bytes,
                })
            }
            Err((err, _)) => Err(BusError::Publish { destination: topic.to_owned(), source: Box::new(err) }),
        }
    }
}
