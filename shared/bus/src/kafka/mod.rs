//! Kafka backend (feature `kafka`), on librdkafka through `rdkafka`.
//!
//! Topics (docs/design.md, "Queues and topics"), created at start when missing with
//! `bus.kafka.partitions` (at least `bus.kafka.shards` for the coordinator's input queues) and
//! `replication_factor`: one per task queue
//! (`<prefix>.tasks.download`), one per event family (`<prefix>.events.image`,
//! `<prefix>.events.task`), one per dead-letter queue (`<prefix>.dlq.tasks.download`,
//! `<prefix>.dlq.events.<group>`), and per consumer group one retry topic per delay tier
//! (`<prefix>.retry.tasks.download.10s`). Messages are keyed by task id (per-task order), and
//! the backend picks the partition itself: the one a send names, else `shard_of(key)` (Kafka's
//! Java partitioner), else a hash of the message id; the message id and `traceparent` travel in
//! headers; the producer is idempotent.
//!
//! Every queue and subscriber group is a consumer group; within a process, every consumer of
//! one group shares one member ([`member`](self)). A consumer of chosen partitions of a queue
//! is a member of its own, assigned those partitions by hand and committing in the queue's
//! group. Offsets are committed only once handlers settled the messages below them. What
//! JetStream does on the server, this backend does in the client: ack deadlines and
//! redelivery of unsettled deliveries, delayed nacks (retry topics by delay tier, see
//! [`retry`](self)), max deliveries and dead letters, and dropping re-published message ids
//! within a window (per partition).

mod admin;
mod client;
mod codec;
mod consumer;
mod dead_letter;
mod dedup;
mod events;
mod handle;
mod inspect;
mod member;
mod names;
mod offsets;
#[cfg(test)]
mod partition_tests;
mod producer;
mod queue;
mod retry;
mod state;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub use self::inspect::inspect;
pub use self::producer::Idempotence;

use self::admin::Topics;
use self::consumer::KafkaConsumer;
use self::member::{Departure, Member, MemberSpec};
use self::names::Names;
use self::producer::Producer;
use self::retry::RetryTiers;
use crate::bus::Bus;
use crate::config::{ConsumerConfig, KafkaConfig};
use crate::error::BusError;
use crate::message::Message;
use crate::traits::Consumer;
use imagepipe_secret::mask_url_credentials;

/// The Kafka backend: task queues and event topics of one prefix. Cheap to clone.
#[derive(Clone)]
pub struct KafkaBus {
    shared: Arc<Shared>,
}

/// A group member's key in its bus: group id, and its selector or its partitions.
type MemberKey = (String, String);

/// A member as the bus remembers it: weakly (it lives while consumers use it), and the signal
/// that it has left its group.
#[derive(Clone)]
struct Registered {
    member: Weak<Member>,
    departure: Arc<Departure>,
}

/// What every queue, subscription and delivery of one bus uses.
pub(crate) struct Shared {
    names: Names,
    config: KafkaConfig,
    /// The topics of the coordinator's input queues, partitioned by shard.
    sharded: HashSet<String>,
    producer: Producer,
    topics: Topics,
    tiers: RetryTiers,
    /// The group members of this bus, by group id and selector, with the signal that each
    /// has left its group once stopped.
    members: Mutex<HashMap<MemberKey, Registered>>,
    /// Set by [`KafkaBus::close`].
    closed: AtomicBool,
    /// Committed offsets of the queues' groups, for their backlog.
    offsets: Arc<inspect::GroupOffsets>,
}

impl KafkaBus {
    /// Connects to `config.brokers` and creates the topics of `prefix` that are missing.
    pub async fn connect(prefix: &str, config: &KafkaConfig) -> Result<Self, BusError> {
        config.validate().map_err(BusError::Invalid)?;
        let shown = mask_url_credentials(&config.brokers);
        let producer = Producer::new(config)?;
        let topics = Topics::new(config, producer.clone())?;
        let names = Names::new(prefix);
        let standard = names.standard_topics();
        topics
            .probe(&standard[0], config.connect_timeout)
            .await
            .map_err(|source| BusError::Connect { url: shown.clone(), source })?;
        let sharded = names.sharded_topics();
        if let Some(shards) = config.shards {
            topics.ensure_at_least(&sharded, i32::from(shards)).await?;
        }
        topics.ensure(&standard).await?;
        tracing::info!(brokers = %shown, prefix, "connected to Kafka");
        let shared = Shared {
            names,
            config: config.clone(),
            sharded: sharded.into_iter().collect(),
            producer,
            topics,
            tiers: RetryTiers::new(config.retry_tiers.clone()),
            members: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            offsets: Arc::new(inspect::GroupOffsets::new(config)),
        };
        Ok(Self { shared: Arc::new(shared) })
    }

    /// This backend as a [`Bus`], whose readiness follows the brokers' reachability.
    pub fn into_bus(self) -> Bus {
        let health = self.shared.producer.health().clone();
        let connected = Arc::new(move || health.is_connected());
        Bus::from_parts(Arc::new(self.clone()), Arc::new(self), connected)
    }

    /// Whether a broker connection is up (by the client's last statistics).
    pub fn is_connected(&self) -> bool {
        self.shared.producer.health().is_connected()
    }

    /// The idempotent producer's state as the client last reported it (`None` before the first
    /// report).
    pub fn idempotence(&self) -> Option<Idempotence> {
        self.shared.producer.health().idempotence()
    }

    /// The partition count of `topic` (a full topic name), once this bus has used it.
    pub fn partitions_of(&self, topic: &str) -> Option<i32> {
        self.shared.topics.partitions(topic)
    }

    /// The low and high watermark of every partition of `topic` (a full topic name, created if
    /// missing): how many messages each partition has ever held (`high`) and the first still
    /// kept (`low`). Tests and benchmarks count broker messages by them.
    pub async fn watermarks(&self, topic: &str) -> Result<Vec<(i64, i64)>, BusError> {
        self.shared.topics.watermarks(topic).await
    }

    /// Closes this bus and every clone: later sends, publishes and fetches fail with
    /// [`BusError::Closed`], and every group member commits and leaves its group.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        let members = std::mem::take(&mut *self.shared.members.lock().unwrap_or_else(|e| e.into_inner()));
        for registered in members.into_values() {
            if let Some(member) = registered.member.upgrade() {
                member.stop();
            }
        }
    }

    /// Closes the bus like [`close`](Self::close) and waits (each at most the session timeout)
    /// until its group members have committed and left their groups, so that replicas take
    /// their partitions over at once (graceful shutdown).
    pub async fn shutdown(&self) {
        let members: Vec<Registered> =
            self.shared.members.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        self.close();
        for registered in members {
            registered.departure.wait(self.shared.config.session_timeout).await;
        }
    }

    /// Every topic this bus has created or used (its prefix's standard topics, the queues it
    /// sent to, the retry and dead-letter topics of its consumers).
    pub fn topics(&self) -> Vec<String> {
        self.shared.topics.known()
    }

    /// Deletes `topics` (full names) with everything in them, through an admin client of its
    /// own (tests, resetting an environment). Call it once no client uses them any more: a
    /// client that still reads a deleted topic's metadata can fail inside librdkafka.
    pub async fn delete_topics(config: &KafkaConfig, topics: &[String]) -> Result<(), BusError> {
        admin::delete(config, topics).await
    }

    /// The retry topic of every delay tier for `home` (a queue, or `events.<group>`).
    fn retry_topics(&self, home: &str) -> Result<Vec<(Duration, String)>, BusError> {
        let names = &self.shared.names;
        self.shared.tiers.all().iter().map(|tier| Ok((*tier, names.retry_topic(home, *tier)?))).collect()
    }

    /// A consumer on the member of `spec`, joining the group first if this process has no
    /// member in it yet; waits (up to `assignment_timeout`) for the first assignment.
    async fn open(&self, spec: MemberSpec, config: ConsumerConfig) -> Result<Box<dyn Consumer>, BusError> {
        self.shared.check_open()?;
        if config.max_deliveries == 0 {
            return Err(BusError::Invalid(format!("{}: max_deliveries must be at least 1", spec.source)));
        }
        if config.ack_wait < Duration::from_millis(1) {
            return Err(BusError::Invalid(format!("{}: ack_wait must be at least 1ms", spec.source)));
        }
        let key = (spec.group_id.clone(), spec.member_key());
        let (existing, leaving) = self.registered(&key, &spec)?;
        let live = existing.as_ref().and_then(|r| r.member.upgrade());
        let member = match live {
            Some(member) => member,
            None => {
                for departure in existing.into_iter().map(|r| r.departure).chain(leaving) {
                    departure.wait(self.shared.config.session_timeout).await;
                }
                let member = Member::start(self.shared.clone(), spec).await?;
                let mut members = self.shared.members.lock().unwrap_or_else(|e| e.into_inner());
                members.insert(key, Registered { member: Arc::downgrade(&member), departure: member.departure() });
                member
            }
        };
        let timeout = self.shared.config.assignment_timeout;
        let assigned = member.wait_assigned(timeout).await;
        if !assigned && member.core.spec.assigned.is_some() {
            return Err(BusError::Setup {
                what: format!("partitions {} of {}", member.core.spec.member_key(), member.core.spec.source),
                source: format!("not assigned within {timeout:?} (see the log for why)").into(),
            });
        }
        if !assigned {
            tracing::warn!(
                group = %member.core.spec.group_id,
                "no partition assignment within {timeout:?}; the consumer keeps joining in the background"
            );
        }
        Ok(Box::new(KafkaConsumer { member, config }))
    }
}

impl KafkaBus {
    /// The member registered under `key`, and the departures to wait for before a new member
    /// of `spec` starts: those of the group's stopped members still leaving (they commit
    /// first). Refuses to read a partition another live member of this process reads, and to
    /// mix consumers of chosen partitions with a consumer of the whole queue in one group
    /// (Kafka refuses commits outside a group's generation while it has members). Forgets
    /// members that have left.
    fn registered(
        &self,
        key: &MemberKey,
        spec: &MemberSpec,
    ) -> Result<(Option<Registered>, Vec<Arc<Departure>>), BusError> {
        let mut members = self.shared.members.lock().unwrap_or_else(|e| e.into_inner());
        members.retain(|k, r| k == key || r.member.strong_count() > 0 || !r.departure.has_left());
        let existing = members.get(key).cloned();
        let mut leaving = Vec::new();
        let mine = spec.assigned.as_deref();
        for (other_key, registered) in members.iter().filter(|(k, _)| k.0 == key.0 && *k != key) {
            let Some(other) = registered.member.upgrade() else {
                leaving.push(registered.departure.clone());
                continue;
            };
            let clash = match (mine, other.core.spec.assigned.as_deref()) {
                (Some(mine), Some(theirs)) => mine
                    .iter()
                    .find(|p| theirs.contains(p))
                    .map(|p| format!("partition {p} is already read by a consumer of this process ({})", other_key.1)),
                (None, None) => None,
                _ => Some(
                    "a consumer of the whole queue and consumers of chosen partitions cannot share its group".into(),
                ),
            };
            if let Some(clash) = clash {
                return Err(BusError::Invalid(format!("{}: {clash}; drop that consumer first", spec.source)));
            }
        }
        Ok((existing, leaving))
    }
}

impl Shared {
    fn check_open(&self) -> Result<(), BusError> {
        if self.closed.load(Ordering::Acquire) { Err(BusError::Closed) } else { Ok(()) }
    }

    /// How many partitions keys of `topic` are spread over: `bus.kafka.shards` for the
    /// coordinator's input queues when set, else every partition the topic has.
    fn routed_partitions(&self, topic: &str) -> Option<i32> {
        match self.config.shards {
            Some(shards) if self.sharded.contains(topic) => Some(i32::from(shards)),
            _ => self.topics.partitions(topic),
        }
    }

    /// Where `message` goes in `topic`: `partition` when given, else the key's shard among the
    /// topic's routed partitions (Kafka's Java partitioner: one key, one partition, whoever
    /// sends), else for a keyless message with an id a hash of the id (so duplicates meet);
    /// `None` lets the client pick.
    fn partition_for(&self, topic: &str, message: &Message, partition: Option<u16>) -> Result<Option<i32>, BusError> {
        if let Some(partition) = partition {
            let count = self.topics.partitions(topic).unwrap_or(0);
            if i32::from(partition) >= count {
                return Err(BusError::Invalid(format!(
                    "partition {partition} of topic {topic}: it has {count} partitions"
                )));
            }
            return Ok(Some(i32::from(partition)));
        }
        let Some(count) = self.routed_partitions(topic) else { return Ok(None) };
        Ok(match (&message.key, &message.id) {
            (Some(key), _) => {
                Some(i32::from(imagepipe_contracts::shard::shard_of(key, u16::try_from(count).unwrap_or(u16::MAX))))
            }
            (None, Some(id)) => Some(codec::partition_of_id(id, count)),
            (None, None) => None,
        })
    }

    /// Sends `message` to `topic` (created if missing), in `partition` when given (else as
    /// [`partition_for`](Self::partition_for) says), and returns once the broker has it.
    async fn send(
        &self,
        topic: &str,
        message: &Message,
        partition: Option<u16>,
        extra: &[(&str, &str)],
    ) -> Result<(), BusError> {
        self.check_open()?;
        self.topics.ensure(&[topic.to_owned()]).await?;
        let partition = self.partition_for(topic, message, partition)?;
        self.producer.send(topic, partition, message, extra).await
    }

    /// Sends every message to the partition it names (or its key's), all enqueued before any
    /// acknowledgement is awaited (the idempotent producer keeps their order per partition).
    async fn send_all(&self, topic: &str, messages: &[Message]) -> Result<(), BusError> {
        self.check_open()?;
        self.topics.ensure(&[topic.to_owned()]).await?;
        let placed = messages
            .iter()
            .map(|m| Ok((m, self.partition_for(topic, m, m.partition)?)))
            .collect::<Result<Vec<_>, BusError>>()?;
        let sends = placed.into_iter().map(|(m, partition)| self.producer.send(topic, partition, m, &[]));
        futures::future::join_all(sends).await.into_iter().collect()
    }
}
