//! NATS JetStream backend (feature `nats`).
//!
//! Three streams per `bus.prefix`, created or updated at start (docs/design.md, "Queues and
//! topics"): a work-queue stream for `<prefix>.tasks.>`, a limits stream for
//! `<prefix>.events.>` kept for `events_max_age`, and a limits stream for the dead letters
//! `<prefix>.dlq.>`. Every queue and subscriber group is a durable pull consumer with explicit
//! acks; see [`queue`](self) and the consumer module for how settling maps to JetStream.
//!
//! Works with nats-server 2.9 and newer: it relies on no 2.10+ API (one filter subject per
//! consumer; selectors of several patterns are narrowed client-side).

mod advisories;
mod codec;
mod connect;
mod consumer;
mod consumers;
mod dead_letter;
mod events;
mod handle;
mod inspect;
mod names;
mod partitions;
mod pull;
mod queue;
mod streams;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_nats::connection::State;
use async_nats::jetstream;

use crate::bus::Bus;
use crate::config::NatsConfig;
use crate::error::{BoxError, BusError};
use crate::message::Message;

use self::names::Names;
use self::streams::Streams;

pub use self::inspect::inspect;

/// The NATS JetStream backend: task queues and event topics of one prefix. Cheap to clone.
#[derive(Clone)]
pub struct NatsBus {
    shared: Arc<Shared>,
}

/// What every queue, subscription and delivery of one bus uses.
pub(crate) struct Shared {
    client: async_nats::Client,
    js: jetstream::Context,
    names: Names,
    config: NatsConfig,
    streams: Streams,
    /// Set by [`NatsBus::close`]: every operation fails with [`BusError::Closed`].
    closed: AtomicBool,
}

impl NatsBus {
    /// Connects to `config.url` and creates (or updates) the streams of `prefix`.
    pub async fn connect(prefix: &str, config: &NatsConfig) -> Result<Self, BusError> {
        let client = connect::connect(config).await?;
        let js = jetstream::ContextBuilder::new()
            .timeout(config.request_timeout)
            .ack_timeout(config.request_timeout)
            .build(client.clone());
        let names = Names::new(prefix);
        let streams = streams::ensure(&js, &names, config).await?;
        let closed = AtomicBool::new(false);
        Ok(Self { shared: Arc::new(Shared { client, js, names, config: config.clone(), streams, closed }) })
    }

    /// This backend as a [`Bus`], whose readiness follows the connection state.
    pub fn into_bus(self) -> Bus {
        let client = self.shared.client.clone();
        let connected = Arc::new(move || client.connection_state() == State::Connected);
        Bus::from_parts(Arc::new(self.clone()), Arc::new(self), connected)
    }

    /// Whether the connection to the server is up now.
    pub fn is_connected(&self) -> bool {
        self.shared.client.connection_state() == State::Connected
    }

    /// The version the connected server announced (`2.9.10`).
    pub fn server_version(&self) -> String {
        self.shared.client.server_info().version
    }

    /// Names of the task, event and dead-letter streams of this prefix.
    pub fn stream_names(&self) -> [String; 3] {
        let names = &self.shared.names;
        [names.tasks_stream(), names.events_stream(), names.dlq_stream()]
    }

    /// The last sequence number of the task, event and dead-letter streams (in the order of
    /// [`stream_names`](Self::stream_names)): how many messages each stream has ever stored,
    /// acknowledged and removed ones included. Benchmarks count broker messages by its deltas.
    pub async fn stream_sequences(&self) -> Result<[u64; 3], BusError> {
        self.shared.check_open()?;
        let mut sequences = [0; 3];
        for (slot, name) in sequences.iter_mut().zip(self.stream_names()) {
            let failed = |source: BoxError| BusError::Setup { what: format!("stream {name}"), source };
            let mut stream = self.shared.js.get_stream(&name).await.map_err(|e| failed(Box::new(e)))?;
            *slot = stream.info().await.map_err(|e| failed(e.into()))?.state.last_sequence;
        }
        Ok(sequences)
    }

    /// Closes this bus and every clone: later sends, publishes, fetches and consumer setups
    /// fail with [`BusError::Closed`], and nothing recreates its streams. Unsettled deliveries
    /// are redelivered by the server after their ack deadline.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
    }

    /// Closes the bus and deletes the streams of this prefix with everything in them (tests,
    /// resetting an environment).
    pub async fn delete_streams(&self) -> Result<(), BusError> {
        self.close();
        streams::delete(&self.shared.js, &self.shared.names).await
    }
}

impl Shared {
    fn check_open(&self) -> Result<(), BusError> {
        if self.closed.load(Ordering::Acquire) { Err(BusError::Closed) } else { Ok(()) }
    }

    /// Publishes `message` on `subject` and waits for JetStream to store it (a duplicate id
    /// within the dedup window counts as stored).
    async fn publish(&self, subject: &str, message: &Message, extra: &[(&str, &str)]) -> Result<(), BusError> {
        let ack = self.start_publish(subject, message, extra).await?;
        ack.await.map(drop).map_err(|err| publish_error(subject, err))
    }

    /// Sends a publish and returns the future of its acknowledgement, so callers can pipeline.
    async fn start_publish(
        &self,
        subject: &str,
        message: &Message,
        extra: &[(&str, &str)],
    ) -> Result<jetstream::context::PublishAckFuture, BusError> {
        self.check_open()?;
        let headers = codec::encode(message, extra)?;
        self.js.publish_with_headers(subject.to_owned(), headers, message.payload.clone()).await.map_err(|err| {
            if err.kind() == jetstream::context::PublishErrorKind::MaxPayloadExceeded {
                let max = self.client.server_info().max_payload;
                BusError::TooLarge { destination: subject.to_owned(), size: message.size(), max }
            } else {
                publish_error(subject, err)
            }
        })
    }

    /// Publishes every message on its subject, all sent before any acknowledgement is awaited.
    async fn publish_pipelined(&self, messages: &[(String, Message)], extra: &[(&str, &str)]) -> Result<(), BusError> {
        let mut acks = Vec::with_capacity(messages.len());
        for (subject, message) in messages {
            acks.push((subject, self.start_publish(subject, message, extra).await?));
        }
        for (subject, ack) in acks {
            ack.await.map_err(|err| publish_error(subject, err))?;
        }
        Ok(())
    }
}

fn publish_error(subject: &str, err: impl std::error::Error + Send + Sync + 'static) -> BusError {
    BusError::Publish { destination: subject.to_owned(), source: Box::new(err) }
}
