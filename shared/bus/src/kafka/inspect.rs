//! What the brokers hold for a prefix, read without creating anything ([`inspect`], for
//! `imagepipe doctor`), and the lag of a queue's consumer group (for
//! [`TaskQueue::backlog`](crate::TaskQueue::backlog)).
//!
//! A group's lag is the sum over the partitions of its topic of the high watermark minus the
//! group's committed offset: messages not yet committed, the ones in flight included (Kafka does
//! not know which are being handled). Messages waiting in the group's retry topics are not
//! counted. Reading committed offsets takes a client configured with the group's id (it only
//! asks; it never joins the group), so [`GroupOffsets`] keeps one per group.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use imagepipe_contracts::names::queues;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode;

use super::client::{self, LogContext};
use super::names::Names;
use crate::config::KafkaConfig;
use crate::error::{BoxError, BusError};
use crate::inspect::{Backlog, BrokerReport, ConsumerReport, StoreReport};
use imagepipe_secret::mask_url_credentials;

impl ConsumerContext for LogContext {}

/// One librdkafka client per consumer group, created on first use, for reading the group's
/// committed offsets and its topics' watermarks. Blocking calls: use it on a blocking thread.
pub(crate) struct GroupOffsets {
    config: KafkaConfig,
    clients: Mutex<HashMap<String, Arc<BaseConsumer<LogContext>>>>,
}

impl GroupOffsets {
    pub(crate) fn new(config: &KafkaConfig) -> Self {
        Self { config: config.clone(), clients: Mutex::default() }
    }

    /// The client of `group`.
    fn client(&self, group: &str) -> Result<Arc<BaseConsumer<LogContext>>, BusError> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = clients.get(group) {
            return Ok(client.clone());
        }
        let client: BaseConsumer<LogContext> = client::base_config(&self.config)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("allow.auto.create.topics", "false")
            .create_with_context(LogContext)
            .map_err(|e| BusError::Connect { url: mask_url_credentials(&self.config.brokers), source: Box::new(e) })?;
        let client = Arc::new(client);
        clients.insert(group.to_owned(), client.clone());
        Ok(client)
    }

    /// The partition count of `topic`, `None` when it does not exist; waits up to `timeout`.
    fn partitions(&self, group: &str, topic: &str, timeout: Duration) -> Result<Option<i32>, BusError> {
        let metadata = self
            .client(group)?
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| inspect_error(format!("topic {topic}"), Box::new(e)))?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else { return Ok(None) };
        match found.error() {
            None if !found.partitions().is_empty() => {
                Ok(Some(i32::try_from(found.partitions().len()).unwrap_or(i32::MAX)))
            }
            None => Ok(None),
            Some(code) if RDKafkaErrorCode::from(code) == RDKafkaErrorCode::UnknownTopicOrPartition => Ok(None),
            Some(code) => Err(inspect_error(format!("topic {topic}"), Box::new(RDKafkaErrorCode::from(code)))),
        }
    }

    /// Messages `topic` holds now (high minus low watermark over its partitions).
    fn messages(&self, group: &str, topic: &str, partitions: i32) -> Result<u64, BusError> {
        let client = self.client(group)?;
        let mut total = 0u64;
        for p in 0..partitions {
            let (low, high) = client
                .fetch_watermarks(topic, p, self.config.request_timeout)
                .map_err(|e| inspect_error(format!("watermarks of {topic}[{p}]"), Box::new(e)))?;
            total = total.saturating_add(u64::try_from(high - low).unwrap_or(0));
        }
        Ok(total)
    }

    /// The lag of `group` on the `partitions` partitions of `topic`; `None` when the group has
    /// committed nothing there (nothing has consumed the queue yet).
    pub(crate) fn backlog(&self, group: &str, topic: &str, partitions: i32) -> Result<Option<Backlog>, BusError> {
        let client = self.client(group)?;
        let timeout = self.config.request_timeout;
        let mut wanted = TopicPartitionList::new();
        for p in 0..partitions {
            wanted.add_partition(topic, p);
        }
        let committed = client
            .committed_offsets(wanted, timeout)
            .map_err(|e| inspect_error(format!("offsets of consumer group {group}"), Box::new(e)))?;
        let mut lag = 0u64;
        let mut any = false;
        for element in committed.elements() {
            let Offset::Offset(offset) = element.offset() else { continue };
            any = true;
            let (_, high) = client
                .fetch_watermarks(topic, element.partition(), timeout)
                .map_err(|e| inspect_error(format!("watermarks of {topic}[{}]", element.partition()), Box::new(e)))?;
            lag = lag.saturating_add(u64::try_from(high - offset).unwrap_or(0));
        }
        Ok(any.then_some(Backlog { waiting: lag, unacked: 0 }))
    }
}

fn inspect_error(what: String, source: BoxError) -> BusError {
    BusError::Inspect { what, source }
}

/// Asks the brokers of `config` what they hold for `prefix`: whether the standard topics exist
/// (with the messages each holds) and the lag of every task queue's consumer group. Creates
/// nothing, unlike [`KafkaBus::connect`](super::KafkaBus::connect).
pub async fn inspect(prefix: &str, config: &KafkaConfig) -> Result<BrokerReport, BusError> {
    config.validate().map_err(BusError::Invalid)?;
    let (prefix, config) = (prefix.to_owned(), config.clone());
    tokio::task::spawn_blocking(move || inspect_blocking(&prefix, &config))
        .await
        .map_err(|e| inspect_error("the topics".into(), Box::new(e)))?
}

fn inspect_blocking(prefix: &str, config: &KafkaConfig) -> Result<BrokerReport, BusError> {
    let names = Names::new(prefix);
    let offsets = GroupOffsets::new(config);
    let shown = mask_url_credentials(&config.brokers);
    let standard = names.standard_topics();
    // The first question tells whether a broker answers at all.
    let probe = names.group_id(queues::SUBMIT);
    let mut partitions = HashMap::new();
    let mut stores = Vec::with_capacity(standard.len());
    for (i, topic) in standard.iter().enumerate() {
        let timeout = if i == 0 { config.connect_timeout } else { config.request_timeout };
        let count = offsets.partitions(&probe, topic, timeout).map_err(|error| match error {
            BusError::Inspect { source, .. } if i == 0 => BusError::Connect { url: shown.clone(), source },
            other => other,
        })?;
        let messages = match count {
            Some(n) => Some(offsets.messages(&probe, topic, n)?),
            None => None,
        };
        if let Some(n) = count {
            partitions.insert(topic.clone(), n);
        }
        stores.push(StoreReport {
            name: topic.clone(),
            captures: topic.clone(),
            exists: count.is_some(),
            problem: None,
            messages,
        });
    }
    let mut consumers = Vec::new();
    for queue in queues::all_lanes() {
        let queue = queue.as_str();
        let topic = names.queue_topic(queue)?;
        let group = names.group_id(queue);
        let backlog = match partitions.get(&topic) {
            Some(&n) => offsets.backlog(&group, &topic, n)?,
            None => None,
        };
        consumers.push(ConsumerReport { serves: (*queue).to_owned(), name: group, backlog });
    }
    Ok(BrokerReport {
        server: format!("Kafka brokers {shown}"),
        prefix: prefix.to_owned(),
        stores,
        consumers,
        other_prefixes: Vec::new(),
    })
}
