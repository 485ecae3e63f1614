//! The W3C trace id carried in every event's `traceId`.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A W3C trace id: 16 bytes, written as 32 lowercase hex digits, never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId([u8; 16]);

/// A string that is not 32 lowercase hex digits, or is all zeros.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("trace id must be 32 lowercase hex digits, not all zero (got {0:?})")]
pub struct InvalidTraceId(pub String);

impl TraceId {
    /// Wraps raw bytes; `None` for the all-zero (invalid) id.
    pub fn from_bytes(bytes: [u8; 16]) -> Option<Self> {
        (bytes != [0; 16]).then_some(Self(bytes))
    }

    /// A fresh random trace id.
    pub fn random() -> Self {
        loop {
            if let Some(id) = Self::from_bytes(uuid::Uuid::new_v4().into_bytes()) {
                return id;
            }
        }
    }

    /// The raw 16 bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0
    }

    /// Extracts the trace id from a W3C `traceparent` header (`00-<trace>-<span>-<flags>`).
    pub fn from_traceparent(header: &str) -> Option<Self> {
        let mut parts = header.split('-');
        let _version = parts.next()?;
        parts.next()?.parse().ok()
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl FromStr for TraceId {
    type Err = InvalidTraceId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidTraceId(s.to_owned());
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(invalid());
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| invalid())?;
        }
        Self::from_bytes(bytes).ok_or_else(invalid)
    }
}

impl Serialize for TraceId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TraceId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for TraceId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TraceId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "W3C trace id: 32 lowercase hex digits, not all zero.",
            "pattern": "^(?!0{32})[0-9a-f]{32}$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_its_hex_form() {
        let id: TraceId = "4bf92f3577b34da6a3ce929d0e0e4736".parse().unwrap();
        assert_eq!(id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn rejects_uppercase_short_and_zero_ids() {
        for bad in ["4BF92F3577B34DA6A3CE929D0E0E4736", "4bf92f", "00000000000000000000000000000000"] {
            assert!(bad.parse::<TraceId>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn reads_the_trace_id_of_a_traceparent() {
        let id = TraceId::from_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(id.unwrap().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }
}
