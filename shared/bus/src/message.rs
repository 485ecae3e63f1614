//! What travels on the bus: a body with a key, an id and headers.

use std::collections::BTreeMap;

use bytes::Bytes;
use imagepipe_contracts::names::headers;
use imagepipe_contracts::{CloudEvent, CloudEventError};

/// Message headers: lowercase names to string values (`traceparent`, `imagepipe-schema`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(BTreeMap<String, String>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `name` (lowercased) to `value`, replacing any earlier value.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) -> &mut Self {
        let mut name = name.into();
        name.make_ascii_lowercase();
        self.0.insert(name, value.into());
        self
    }

    /// Builder form of [`Headers::insert`].
    pub fn with(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.insert(name, value);
        self
    }

    /// The value of `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&str> {
        match self.0.get(name) {
            Some(v) => Some(v),
            None => self.0.get(&name.to_ascii_lowercase()).map(String::as_str),
        }
    }

    /// Removes `name` and returns its value.
    pub fn remove(&mut self, name: &str) -> Option<String> {
        self.0.remove(&name.to_ascii_lowercase())
    }

    /// Every header, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// How many headers there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The W3C `traceparent`, if any.
    pub fn traceparent(&self) -> Option<&str> {
        self.get(headers::TRACEPARENT)
    }

    /// Sets the CloudEvents attribute headers of `attributes` (their binding-neutral names,
    /// `ce-id`, ..., `content-type`; a backend renames them for its protocol binding).
    pub fn insert_cloud_event(&mut self, attributes: &CloudEvent) -> &mut Self {
        for (name, value) in attributes.headers() {
            self.insert(name, value);
        }
        self
    }

    /// The CloudEvents attributes these headers carry.
    pub fn cloud_event(&self) -> Result<CloudEvent, CloudEventError> {
        CloudEvent::from_headers(|name| self.get(name))
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut h = Headers::new();
        for (k, v) in iter {
            h.insert(k, v);
        }
        h
    }
}

/// A message to send or a message received.
///
/// `key` orders messages (per-key order; Kafka partition key, the task id in imagepipe);
/// `id` deduplicates publishes within the backend's window (`Nats-Msg-Id` on NATS).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// Ordering key.
    pub key: Option<String>,
    /// Deduplication id.
    pub id: Option<String>,
    /// Headers.
    pub headers: Headers,
    /// The body, usually JSON.
    pub payload: Bytes,
    /// On a send: the partition of the queue to put it in ([`TaskQueue::consume_partitions`]
    /// reads it there); `None` puts it in the queue itself. On a delivery: the partition it was
    /// read from.
    ///
    /// [`TaskQueue::consume_partitions`]: crate::TaskQueue::consume_partitions
    pub partition: Option<u16>,
}

impl Message {
    /// A message with this body and nothing else.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Self { payload: payload.into(), ..Self::default() }
    }

    /// Sets the ordering key.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the deduplication id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Sets the partition to send it to.
    pub fn with_partition(mut self, partition: u16) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Adds the CloudEvents attribute headers of `attributes` ([`Headers::insert_cloud_event`]).
    pub fn with_cloud_event(mut self, attributes: &CloudEvent) -> Self {
        self.headers.insert_cloud_event(attributes);
        self
    }

    /// Bytes the message takes on the wire, besides the protocol's framing: body, headers,
    /// key and id.
    pub fn size(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.payload.len()
            + headers
            + self.key.as_ref().map_or(0, String::len)
            + self.id.as_ref().map_or(0, String::len)
    }
}
