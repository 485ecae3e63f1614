//! [`Message`] to NATS headers and back.
//!
//! The body travels as the NATS payload; headers as NATS headers; the id as `Nats-Msg-Id`
//! (JetStream deduplication); the key in `imagepipe-key`. Headers starting with `nats-` belong
//! to the server and are refused on send and left out on receive.
//!
//! CloudEvents attributes (binary content mode, NATS protocol binding 1.0.3): the headers keep
//! their `ce-` names, their values are percent-encoded (space, `"`, `%` and everything outside
//! printable ASCII) on send and decoded on receive, and a CloudEvent's `content-type` is also
//! sent as `ce-datacontenttype`, the binding's name for it (taken out again on receive).

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

/// The NATS binding's name of the CloudEvents `datacontenttype` attribute.
const CE_DATACONTENTTYPE: &str = "ce-datacontenttype";

/// The NATS headers for `message`, plus `extra` (which win over the message's own).
pub(crate) fn encode(message: &Message, extra: &[(&str, &str)]) -> Result<HeaderMap, BusError> {
    let mut map = HeaderMap::new();
    for (name, value) in message.headers.iter() {
        if name.starts_with("nats-") {
            return Err(BusError::Invalid(format!("header {name:?}: names starting with `nats-` are reserved")));
        }
        if name == CE_DATACONTENTTYPE {
            continue;
        }
        if name.starts_with(headers::CE_PREFIX) {
            insert(&mut map, name, &percent_encode(value))?;
        } else {
            insert(&mut map, name, value)?;
        }
    }
    if message.headers.get(headers::CE_SPECVERSION).is_some()
        && let Some(content_type) = message.headers.get(headers::CONTENT_TYPE)
    {
        insert(&mut map, CE_DATACONTENTTYPE, &percent_encode(content_type))?;
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
        let Some(value) = values.last() else { continue };
        let name: &str = name.as_ref();
        if name.eq_ignore_ascii_case(NATS_MESSAGE_ID) {
            nats_id = Some(value.as_str().to_owned());
        } else if starts_with_ignore_case(name, headers::CE_PREFIX) {
            fields.insert(name, percent_decode(value.as_str()));
        } else if !starts_with_ignore_case(name, "nats-") {
            fields.insert(name, value.as_str());
        }
    }
    if let Some(content_type) = fields.remove(CE_DATACONTENTTYPE)
        && fields.get(headers::CONTENT_TYPE).is_none()
    {
        fields.insert(headers::CONTENT_TYPE, content_type);
    }
    message.key = fields.remove(KEY_HEADER);
    message.id = fields.remove(headers::MESSAGE_ID).or(nats_id);
    message.headers = fields;
    message
}

/// Whether `name` starts with `prefix`, ignoring ASCII case (header names are case-insensitive).
fn starts_with_ignore_case(name: &str, prefix: &str) -> bool {
    name.len() >= prefix.len() && name.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// A CloudEvents attribute value as the NATS binding sends it: space, `"`, `%` and every
/// character outside printable ASCII percent-encoded (upper-case hex, over its UTF-8 bytes).
fn percent_encode(value: &str) -> std::borrow::Cow<'_, str> {
    let plain = |b: u8| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'%';
    if value.bytes().all(plain) {
        return value.into();
    }
    let mut out = String::with_capacity(value.len() + 8);
    for byte in value.bytes() {
        if plain(byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out.into()
}

/// A CloudEvents attribute value as the NATS binding receives it: a double-quoted value
/// unquoted (backslash escapes), then one round of percent-decoding. A value whose decoded
/// bytes are not UTF-8, or with a malformed escape, is kept as it came.
fn percent_decode(value: &str) -> String {
    let unquoted = match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                out.push(if c == '\\' { chars.next().unwrap_or(c) } else { c });
            }
            out
        }
        None => value.to_owned(),
    };
    if !unquoted.contains('%') {
        return unquoted;
    }
    let bytes = unquoted.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(byte) => {
                    out.push(byte);
                    i += 3;
                }
                None => return unquoted,
            }
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or(unquoted)
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
    fn cloud_event_headers_follow_the_nats_binding() {
        let attributes = imagepipe_contracts::CloudEvent {
            id: "id 1".into(),
            event_type: "task.completed".into(),
            source: "/imagepipe/coordinator".into(),
            time_ms: 1_763_800_000_000,
            subject: Some("tsk_1".into()),
        };
        let message = Message::new("{}").with_cloud_event(&attributes);
        let map = encode(&message, &[]).unwrap();
        let value = |name: &str| map.get(name).map(|v| v.as_str().to_owned());
        assert_eq!(value("ce-id").as_deref(), Some("id%201"));
        assert_eq!(value("ce-type").as_deref(), Some("task.completed"));
        assert_eq!(value("ce-time").as_deref(), Some("2025-11-22T08:26:40.000Z"));
        assert_eq!(value("ce-specversion").as_deref(), Some("1.0"));
        assert_eq!(value("ce-datacontenttype").as_deref(), Some("application/json"));
        assert_eq!(value("content-type").as_deref(), Some("application/json"));
        let back = decode(Some(&map), message.payload.clone());
        assert_eq!(back.headers, message.headers, "the neutral set comes back");
        assert_eq!(back.headers.cloud_event().unwrap(), attributes);
    }

    #[test]
    fn percent_encoding_is_the_bindings() {
        // The binding's own example.
        assert_eq!(percent_encode("Euro \u{20ac} \u{1f600}"), "Euro%20%E2%82%AC%20%F0%9F%98%80");
        assert_eq!(percent_decode("Euro%20%E2%82%AC%20%F0%9F%98%80"), "Euro \u{20ac} \u{1f600}");
        assert_eq!(percent_encode("100% \"x\""), "100%25%20%22x%22");
        assert_eq!(percent_decode("100%25%20%22x%22"), "100% \"x\"");
        // Lower-case hex, unneeded escapes and an old sender's quoted value are accepted.
        assert_eq!(percent_decode("%e2%82%ac%41"), "\u{20ac}A");
        assert_eq!(percent_decode("\"a b\\\"c\""), "a b\"c");
        // An overlong or cut escape is not decoded.
        assert_eq!(percent_decode("%C0%A0"), "%C0%A0");
        assert_eq!(percent_decode("50%"), "50%");
        assert_eq!(percent_encode("/imagepipe/coordinator"), "/imagepipe/coordinator");
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
