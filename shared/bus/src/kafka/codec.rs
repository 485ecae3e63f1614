//! [`Message`] to a Kafka record (key, headers, payload) and back.
//!
//! The key is the Kafka key (the task id: per-task order); the id travels in the header
//! `imagepipe-message-id`; every other header as a Kafka header. Headers starting with
//! `imagepipe-kafka-` belong to the backend (delivery count and due time of redeliveries) and
//! are refused on send and taken out on receive.
//!
//! CloudEvents attributes (binary content mode): the Kafka protocol binding names them `ce_id`,
//! `ce_type`, ... where a [`Message`] has the binding-neutral `ce-id`, `ce-type`, ...; they are
//! renamed on send and back on receive (`content-type` is the same in both). A message's own
//! header named `ce_...` is refused, so the renaming is one to one.

use bytes::Bytes;
use imagepipe_contracts::names::headers;
use rdkafka::Message as _;
use rdkafka::message::{BorrowedMessage, Header, Headers as _, OwnedHeaders};

use crate::error::BusError;
use crate::message::{Headers, Message};

/// Prefix of the headers the backend keeps for itself.
const RESERVED_PREFIX: &str = "imagepipe-kafka-";
/// The delivery count of a redelivery (on retry topics).
pub(crate) const DELIVERY_COUNT: &str = "imagepipe-kafka-delivery-count";
/// When a redelivery is due, in Unix milliseconds (on retry topics).
pub(crate) const DUE: &str = "imagepipe-kafka-due";
/// What the Kafka binding's CloudEvents attribute headers start with.
const KAFKA_CE_PREFIX: &str = "ce_";

/// The Kafka header name of a message's header: `ce-<attribute>` → `ce_<attribute>`.
fn to_kafka_name(name: &str) -> std::borrow::Cow<'_, str> {
    match name.strip_prefix(headers::CE_PREFIX) {
        Some(attribute) => format!("{KAFKA_CE_PREFIX}{attribute}").into(),
        None => name.into(),
    }
}

/// The message's header name of a Kafka header: `ce_<attribute>` → `ce-<attribute>`.
fn from_kafka_name(name: &str) -> std::borrow::Cow<'_, str> {
    match name.strip_prefix(KAFKA_CE_PREFIX) {
        Some(attribute) => format!("{}{attribute}", headers::CE_PREFIX).into(),
        None => name.into(),
    }
}

/// A received record: the message, and what the backend's own headers say.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub message: Message,
    pub delivery_count: Option<u32>,
    pub due_ms: Option<i64>,
    pub timestamp_ms: Option<i64>,
}

/// The Kafka headers of `message`, plus `extra` (which win over the message's own).
pub(crate) fn encode_headers(message: &Message, extra: &[(&str, &str)]) -> Result<OwnedHeaders, BusError> {
    let mut fields: Vec<(std::borrow::Cow<'_, str>, &str)> =
        Vec::with_capacity(message.headers.len() + extra.len() + 1);
    for (name, value) in message.headers.iter() {
        for reserved in [RESERVED_PREFIX, KAFKA_CE_PREFIX] {
            if name.starts_with(reserved) {
                return Err(BusError::Invalid(format!(
                    "header {name:?}: names starting with `{reserved}` are reserved"
                )));
            }
        }
        if !extra.iter().any(|(n, _)| *n == name) {
            fields.push((to_kafka_name(name), value));
        }
    }
    if let Some(id) = &message.id {
        fields.push((headers::MESSAGE_ID.into(), id));
    }
    fields.extend(extra.iter().map(|(name, value)| (to_kafka_name(name), *value)));
    let mut out = OwnedHeaders::new_with_capacity(fields.len());
    for (name, value) in &fields {
        out = out.insert(Header { key: name, value: Some(value.as_bytes()) });
    }
    Ok(out)
}

/// The message a received record carries.
pub(crate) fn decode(record: &BorrowedMessage<'_>) -> Received {
    let mut fields = Headers::new();
    if let Some(kafka_headers) = record.headers() {
        for header in kafka_headers.iter() {
            let value = header.value.map(String::from_utf8_lossy).unwrap_or_default();
            fields.insert(from_kafka_name(header.key), value);
        }
    }
    let delivery_count = fields.remove(DELIVERY_COUNT).and_then(|v| v.parse().ok());
    let due_ms = fields.remove(DUE).and_then(|v| v.parse().ok());
    let message = Message {
        key: record.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        id: fields.remove(headers::MESSAGE_ID),
        headers: fields,
        payload: record.payload().map(Bytes::copy_from_slice).unwrap_or_default(),
        partition: None,
    };
    Received { message, delivery_count, due_ms, timestamp_ms: record.timestamp().to_millis() }
}

/// The partition of a message without a key but with an id: a stable hash (FNV-1a) of the id,
/// so that two publishes of one message meet in one partition and are deduplicated there.
pub(crate) fn partition_of_id(id: &str, partitions: i32) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in id.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    i32::try_from(hash % partitions.max(1).unsigned_abs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_carry_the_id_and_refuse_reserved_names() {
        let message = Message::new("x").with_id("id-1").with_header("traceparent", "00-abc-01");
        let encoded = encode_headers(&message, &[(headers::EVENT_TYPE, "task.failed")]).unwrap();
        let pairs: Vec<(String, String)> = encoded
            .iter()
            .map(|h| (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap()).into_owned()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("traceparent".to_owned(), "00-abc-01".to_owned()),
                (headers::MESSAGE_ID.to_owned(), "id-1".to_owned()),
                (headers::EVENT_TYPE.to_owned(), "task.failed".to_owned()),
            ]
        );
        let reserved = Message::new("x").with_header(DELIVERY_COUNT, "3");
        assert!(matches!(encode_headers(&reserved, &[]), Err(BusError::Invalid(_))));
    }

    #[test]
    fn cloud_event_headers_take_the_kafka_binding_names() {
        let attributes = imagepipe_contracts::CloudEvent::of_command(
            imagepipe_contracts::CommandType::Download,
            "m-1",
            "tsk_1",
            "coordinator",
            1_000,
        );
        let message = Message::new("{}").with_cloud_event(&attributes);
        let encoded = encode_headers(&message, &[]).unwrap();
        let names: Vec<&str> = encoded.iter().map(|h| h.key).collect();
        assert_eq!(names, ["ce_id", "ce_source", "ce_specversion", "ce_subject", "ce_time", "ce_type", "content-type"]);
        let value = |key: &str| encoded.iter().find(|h| h.key == key).and_then(|h| h.value).unwrap();
        assert_eq!(value("ce_type"), b"command.download");
        assert_eq!(value("ce_source"), b"/imagepipe/coordinator");
        assert_eq!(value("content-type"), b"application/json");

        // Back to the neutral names on receive.
        let back: Headers = encoded
            .iter()
            .map(|h| (from_kafka_name(h.key).into_owned(), String::from_utf8_lossy(h.value.unwrap()).into_owned()))
            .collect();
        assert_eq!(back, message.headers);
        assert_eq!(back.cloud_event().unwrap(), attributes);

        let clash = Message::new("x").with_header("ce_id", "1");
        assert!(matches!(encode_headers(&clash, &[]), Err(BusError::Invalid(_))));
    }

    #[test]
    fn ids_map_to_a_stable_partition() {
        // The published FNV-1a 32-bit test vectors ("" 0x811c9dc5, "a" 0xe40c292c, "foobar"
        // 0xbf9cf968), modulo the partition count; i32::MAX partitions show nearly the whole hash.
        // A publisher of another version must pick the same partition, so these must not change.
        for (id, partitions, expected) in [
            ("", 6, 1),
            ("a", 6, 4),
            ("foobar", 6, 4),
            ("foobar", 1000, 720),
            ("", i32::MAX, 18_652_614),
            ("a", i32::MAX, 1_678_518_573),
            ("foobar", i32::MAX, 1_067_252_073),
        ] {
            assert_eq!(partition_of_id(id, partitions), expected, "{id:?} of {partitions} partitions");
        }
        assert!((0..6).contains(&partition_of_id("anything", 6)));
        assert_eq!(partition_of_id("x", 1), 0);
        let spread: std::collections::BTreeSet<i32> =
            (0..100).map(|i| partition_of_id(&format!("id-{i}"), 6)).collect();
        assert_eq!(spread.len(), 6, "ids spread over every partition");
    }
}
