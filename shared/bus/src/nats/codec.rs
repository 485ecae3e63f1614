//! [`Message`] to NATS headers and back.
//!
//! The body travels as the NATS payload; headers as NATS headers; the id as `Nats-Msg-Id`
//! (JetStream deduplication); the key in `imagepipe-key`. Headers starting with `nats-` belong
//! to the server and are refused on send and left out on receive.

use std::str::FromStr;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use imagepipe_contracts::names::headers;

use crate::error::BusError;
use crate::message::{Headers, Message};

/// JetStream's deduplication header.
const NATS_MESSAGE_ID: &str = "Nats-Msg-Id";

/// Carries [`Message::key`]; NATS has no message key of its own.
pub(crate) const KEY_HEADER: &str = "imagepipe-key";

/// The NATS headers for `message`, plus `extra` (which win over the message's own).
pub(crate) fn encode(message: &Message, extra: &[(&str, &str)]) -> Result<HeaderMap, BusError> {
    let mut map = HeaderMap::new();
    for (name, value) in message.headers.iter() {
        if name.starts_with("nats-") {
            return Err(BusError::Invalid(format!("header {name:?}: names starting with `nats-` are reserved")));
        }
        insert(&mut map, name, value)?;
    }
    if let Some(key) = &message.key {
        insert(&mut map, KEY_HEADER, key)?;
    }
    if let Some(id) = &message.id {
        insert(&mut map, NATS_MESSAGE_ID, id)?;
    }
    for (name, value) in extra {
        insert(&mut map, name, value)?;
    }
    Ok(map)
}

fn insert(map: &mut HeaderMap, name: &str, value: &str) -> Result<(), BusError> {
    let header =
        HeaderName::from_str(name).map_err(|_| BusError::Invalid(format!("header name {name:?} is not valid")))?;
    let value = HeaderValue::from_str(value)
        .map_err(|_| BusError::Invalid(format!("header {name:?}: values cannot contain line breaks")))?;
    map.insert(header, value);
    Ok(())
}

/// The message carried by a NATS payload and headers.
///
/// A dead letter keeps the original id in `imagepipe-message-id` (its own `Nats-Msg-Id`
/// deduplicates dead-letter writes), so reading a dead-letter queue gives the original id back.
pub(crate) fn decode(map: Option<&HeaderMap>, payload: bytes::Bytes) -> Message {
    let mut message = Message::new(payload);
    let Some(map) = map else { return message };
    let mut nats_id = None;
    let mut fields = Headers::new();
    for (name, values) in map.iter() {
        let name = name.to_string().to_ascii_lowercase();
        let Some(value) = values.last() else { continue };
        if name == NATS_MESSAGE_ID.to_ascii_lowercase() {
            nats_id = Some(value.as_str().to_owned());
        } else if !name.starts_with("nats-") {
            fields.insert(name, value.as_str());
        }
    }
    message.key = fields.remove(KEY_HEADER);
    message.id = fields.remove(headers::MESSAGE_ID).or(nats_id);
    message.headers = fields;
    message
}

/// A header value made safe: line breaks become spaces and it is cut to `max` bytes.
pub(crate) fn header_text(text: &str, max: usize) -> String {
    let mut out: String = text.chars().map(|c| if c == '\r' || c == '\n' { ' ' } else { c }).collect();
    if out.len() > max {
        let mut cut = max;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips() {
        let message = Message::new("body")
            .with_key("tsk_1")
            .with_id("id-1")
            .with_header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .with_header("imagepipe-schema", "1");
        let map = encode(&message, &[("imagepipe-event-type", "task.completed")]).unwrap();
        assert_eq!(map.get(NATS_MESSAGE_ID).unwrap().as_str(), "id-1");
        let back = decode(Some(&map), message.payload.clone());
        assert_eq!(back.key.as_deref(), Some("tsk_1"));
        assert_eq!(back.id.as_deref(), Some("id-1"));
        assert_eq!(back.headers.get("imagepipe-event-type"), Some("task.completed"));
        assert_eq!(back.headers.get("traceparent"), message.headers.get("traceparent"));
        assert_eq!(back.headers.len(), 3);
        assert_eq!(back.payload, message.payload);
    }

    #[test]
    fn bad_headers_are_refused_not_sent() {
        for message in [
            Message::new("x").with_header("nats-expected-stream", "X"),
            Message::new("x").with_header("x", "a\r\nb"),
            Message::new("x").with_header("a:b", "v"),
            Message::new("x").with_id("a\nb"),
        ] {
            assert!(matches!(encode(&message, &[]), Err(BusError::Invalid(_))), "{message:?}");
        }
    }

    #[test]
    fn header_text_is_single_line_and_bounded() {
        assert_eq!(header_text("a\r\nb", 100), "a  b");
        assert_eq!(header_text("ééé", 3), "é…");
    }
}
