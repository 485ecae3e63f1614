//! Topics: created when missing (with `bus.kafka.partitions` and `replication_factor`), their
//! partition counts remembered, and deleted for cleanup.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::producer::Producer as _;
use rdkafka::types::RDKafkaErrorCode;

use super::client::{self, LogContext};
use super::producer::Producer;
use crate::config::KafkaConfig;
use crate::error::{BoxError, BusError};

/// The topics of one bus.
pub(crate) struct Topics {
    admin: AdminClient<LogContext>,
    producer: Producer,
    partitions: i32,
    replication: i32,
    timeout: Duration,
    /// Topics known to exist, with their partition counts.
    known: Mutex<HashMap<String, i32>>,
}

impl Topics {
    pub(crate) fn new(config: &KafkaConfig, producer: Producer) -> Result<Self, BusError> {
        let admin = client::base_config(config).create_with_context(LogContext).map_err(|err| BusError::Connect {
            url: imagepipe_secret::mask_url_credentials(&config.brokers),
            source: Box::new(err),
        })?;
        Ok(Self {
            admin,
            producer,
            partitions: config.partitions,
            replication: config.replication_factor,
            timeout: config.request_timeout,
            known: Mutex::new(HashMap::new()),
        })
    }

    /// The partition count of a topic [`ensure`](Self::ensure) has seen.
    pub(crate) fn partitions(&self, topic: &str) -> Option<i32> {
        self.known.lock().unwrap_or_else(|e| e.into_inner()).get(topic).copied()
    }

    /// Creates the topics that do not exist yet and learns the partition count of each.
    pub(crate) async fn ensure(&self, topics: &[String]) -> Result<(), BusError> {
        self.ensure_at_least(topics, 1).await
    }

    /// Like [`ensure`](Self::ensure), and makes sure each topic has at least `min` partitions:
    /// a missing one is created with `max(partitions, min)`, an existing one with fewer is
    /// grown (CreatePartitions), or refused with an error when the broker cannot grow it.
    pub(crate) async fn ensure_at_least(&self, topics: &[String], min: i32) -> Result<(), BusError> {
        let missing: Vec<&String> = {
            let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            topics.iter().filter(|t| !known.contains_key(*t)).collect()
        };
        if !missing.is_empty() {
            let partitions = self.partitions.max(min);
            let new: Vec<NewTopic<'_>> = missing
                .iter()
                .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(self.replication)))
                .collect();
            let results = self
                .admin
                .create_topics(&new, &self.options())
                .await
                .map_err(|err| BusError::Setup { what: format!("topics {missing:?}"), source: Box::new(err) })?;
            for result in results {
                match result {
                    Ok(topic) => tracing::info!(%topic, partitions, "created topic"),
                    Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((topic, code)) => {
                        return Err(BusError::Setup { what: format!("topic {topic}"), source: Box::new(code) });
                    }
                }
            }
            let names: Vec<String> = missing.into_iter().cloned().collect();
            let counts = self.partition_counts(names, 1).await?;
            self.known.lock().unwrap_or_else(|e| e.into_inner()).extend(counts);
        }
        let short: Vec<(String, i32)> = {
            let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            topics.iter().filter_map(|t| known.get(t).filter(|n| **n < min).map(|n| (t.clone(), *n))).collect()
        };
        if short.is_empty() { Ok(()) } else { self.grow(short, min).await }
    }

    /// Grows every topic of `short` (with its partition count) to `min` partitions.
    async fn grow(&self, short: Vec<(String, i32)>, min: i32) -> Result<(), BusError> {
        let count = usize::try_from(min).unwrap_or(1);
        let requests: Vec<NewPartitions<'_>> = short.iter().map(|(t, _)| NewPartitions::new(t, count)).collect();
        let refused = |topic: &str, had: i32, source: BoxError| BusError::Setup {
            what: format!(
                "topic {topic}: it has {had} partitions and needs at least {min} (bus.kafka.shards); \
                 growing it failed, so grow or recreate it by hand"
            ),
            source,
        };
        let results = match self.admin.create_partitions(&requests, &self.options()).await {
            Ok(results) => results,
            Err(err) => return Err(refused(&short[0].0, short[0].1, Box::new(err))),
        };
        for result in results {
            if let Err((topic, code)) = result {
                let had = short.iter().find(|(t, _)| *t == topic).map_or(0, |(_, n)| *n);
                return Err(refused(&topic, had, Box::new(code)));
            }
        }
        for (topic, had) in &short {
            tracing::warn!(%topic, from = had, to = min, "grew topic; keys without an explicit partition move");
        }
        let counts = self.partition_counts(short.into_iter().map(|(t, _)| t).collect(), min).await?;
        self.known.lock().unwrap_or_else(|e| e.into_inner()).extend(counts);
        Ok(())
    }

    fn options(&self) -> AdminOptions {
        AdminOptions::new().operation_timeout(Some(self.timeout)).request_timeout(Some(self.timeout))
    }

    /// The partition count of each topic, waiting (up to the request timeout) for topics just
    /// created or grown to show up in the metadata with at least `min` partitions.
    async fn partition_counts(&self, topics: Vec<String>, min: i32) -> Result<Vec<(String, i32)>, BusError> {
        let producer = self.producer.clone();
        let timeout = self.timeout;
        let lookup = move || -> Result<Vec<(String, i32)>, BusError> {
            let until = Instant::now() + timeout;
            let mut out = Vec::with_capacity(topics.len());
            for topic in topics {
                loop {
                    let setup =
                        |source: BoxError| BusError::Setup { what: format!("metadata of topic {topic}"), source };
                    let metadata = producer
                        .client()
                        .client()
                        .fetch_metadata(Some(&topic), timeout)
                        .map_err(|e| setup(Box::new(e)))?;
                    let count = metadata
                        .topics()
                        .iter()
                        .find(|t| t.name() == topic && t.error().is_none())
                        .map(|t| t.partitions().len())
                        .unwrap_or(0);
                    let count = i32::try_from(count).unwrap_or(i32::MAX);
                    if count >= min.max(1) {
                        out.push((topic, count));
                        break;
                    }
                    if Instant::now() >= until {
                        return Err(setup(
                            format!("the topic has {count} partitions after {timeout:?}, {} expected", min.max(1))
                                .into(),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Ok(out)
        };
        tokio::task::spawn_blocking(lookup)
            .await
            .map_err(|err| BusError::Setup { what: "topic metadata".into(), source: Box::new(err) })?
    }

    /// The low and high watermark of every partition of `topic`.
    pub(crate) async fn watermarks(&self, topic: &str) -> Result<Vec<(i64, i64)>, BusError> {
        self.ensure(&[topic.to_owned()]).await?;
        let partitions = self.partitions(topic).unwrap_or(0);
        let producer = self.producer.clone();
        let (topic, timeout) = (topic.to_owned(), self.timeout);
        let setup = |what: &str, source: BoxError| BusError::Setup { what: what.to_owned(), source };
        tokio::task::spawn_blocking(move || {
            (0..partitions)
                .map(|p| {
                    producer
                        .client()
                        .client()
                        .fetch_watermarks(&topic, p, timeout)
                        .map_err(|e| setup(&format!("watermarks of {topic}[{p}]"), Box::new(e)))
                })
                .collect()
        })
        .await
        .map_err(|e| setup("watermarks", Box::new(e)))?
    }

    /// Every topic this bus has created or used.
    pub(crate) fn known(&self) -> Vec<String> {
        self.known.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect()
    }

    /// Checks that a broker answers within `timeout`, asking for the metadata of `topic` only
    /// (the whole cluster's can be large).
    pub(crate) async fn probe(&self, topic: &str, timeout: Duration) -> Result<(), BoxError> {
        let producer = self.producer.clone();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || producer.client().client().fetch_metadata(Some(&topic), timeout).map(drop))
            .await
            .map_err(|err| -> BoxError { Box::new(err) })?
            .map_err(|err| -> BoxError { Box::new(err) })
    }
}

/// Deletes `topics` with everything in them, through an admin client of its own; missing ones
/// are fine.
pub(crate) async fn delete(config: &KafkaConfig, topics: &[String]) -> Result<(), BusError> {
    if topics.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<LogContext> =
        client::base_config(config).create_with_context(LogContext).map_err(|err| BusError::Connect {
            url: imagepipe_secret::mask_url_credentials(&config.brokers),
            source: Box::new(err),
        })?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let timeout = config.request_timeout;
    let options = AdminOptions::new().operation_timeout(Some(timeout)).request_timeout(Some(timeout));
    let results = admin
        .delete_topics(&names, &options)
        .await
        .map_err(|err| BusError::Setup { what: format!("deleting {} topics", names.len()), source: Box::new(err) })?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, code)) => {
                return Err(BusError::Setup { what: format!("deleting topic {topic}"), source: Box::new(code) });
            }
        }
    }
    Ok(())
}
