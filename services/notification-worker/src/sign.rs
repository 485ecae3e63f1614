//! Webhook signatures, the [Standard Webhooks](https://www.standardwebhooks.com/) way.
//!
//! Every webhook carries three headers:
//!
//! - `webhook-id`: the event's `eventId`, the same on every retry, so a receiver deduplicates;
//! - `webhook-timestamp`: when this attempt was signed, in Unix seconds, so a receiver refuses
//!   replays (older than [`TOLERANCE`]);
//! - `webhook-signature`: `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`, one entry
//!   per key, space-separated (two while a key is rotated; a receiver accepts any one it can
//!   verify). Without a key the header is left out.
//!
//! A key is a [`WebhookSecret`]: `whsec_` + base64 of its bytes, as Standard Webhooks libraries
//! expect it. [`verify`] is the receiver's side.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub use imagepipe_runtime::config::WebhookSecret;

/// Header carrying the event's `eventId` (stable across retries).
pub const ID_HEADER: &str = "webhook-id";
/// Header carrying the attempt's Unix time in seconds.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// Header carrying the signatures.
pub const SIGNATURE_HEADER: &str = "webhook-signature";
/// Header carrying the event's `eventType`, so a receiver may route without parsing.
pub const EVENT_TYPE_HEADER: &str = "x-imagepipe-event-type";

/// How far a webhook's timestamp may be from the receiver's clock, either way.
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// The version tag of an HMAC-SHA256 signature.
const VERSION: &str = "v1";

/// The `webhook-signature` value of `body`, sent as webhook `id` at `timestamp` (Unix
/// seconds): one `v1,<base64>` entry per key, space-separated. Empty without keys.
pub fn signature(keys: &[WebhookSecret], id: &str, timestamp: u64, body: &[u8]) -> String {
    let entries: Vec<String> = keys
        .iter()
        .map(|key| format!("{VERSION},{}", BASE64.encode(mac(key, id, timestamp, body).finalize().into_bytes())))
        .collect();
    entries.join(" ")
}

/// The three `webhook-*` headers of a received webhook, as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signed<'a> {
    /// `webhook-id`.
    pub id: &'a str,
    /// `webhook-timestamp`.
    pub timestamp: &'a str,
    /// `webhook-signature`.
    pub signature: &'a str,
}

/// Why a received webhook was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// `webhook-timestamp` is not a number of seconds.
    #[error("webhook-timestamp {0:?} is not Unix seconds")]
    Timestamp(String),
    /// `webhook-timestamp` is further than [`TOLERANCE`] from the receiver's clock: a replay,
    /// or a clock far off.
    #[error("webhook-timestamp {timestamp} is more than {}s away from now ({now})", TOLERANCE.as_secs())]
    Stale {
        /// The webhook's timestamp.
        timestamp: u64,
        /// The receiver's time, Unix seconds.
        now: u64,
    },
    /// No `v1` entry of `webhook-signature` is the body's signature under the key.
    #[error("no v1 signature in webhook-signature matches the body under this key")]
    Mismatch,
}

/// Accepts a webhook whose `body` arrived with the headers `signed` when one of its `v1`
/// signatures is the HMAC of `{id}.{timestamp}.{body}` under `key` (compared in constant
/// time) and its timestamp is within [`TOLERANCE`] of `now`.
pub fn verify(key: &WebhookSecret, signed: &Signed<'_>, body: &[u8], now: SystemTime) -> Result<(), VerifyError> {
    let timestamp: u64 =
        signed.timestamp.trim().parse().map_err(|_| VerifyError::Timestamp(signed.timestamp.into()))?;
    let now = unix_seconds(now);
    if timestamp.abs_diff(now) > TOLERANCE.as_secs() {
        return Err(VerifyError::Stale { timestamp, now });
    }
    let matches = signed
        .signature
        .split_whitespace()
        .filter_map(|entry| entry.strip_prefix(VERSION)?.strip_prefix(','))
        .filter_map(|encoded| BASE64.decode(encoded).ok())
        .any(|digest| mac(key, signed.id, timestamp, body).verify_slice(&digest).is_ok());
    if matches { Ok(()) } else { Err(VerifyError::Mismatch) }
}

/// `time` in whole seconds since the Unix epoch (0 before it).
pub fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}

/// The HMAC of `{id}.{timestamp}.{body}` under `key`.
fn mac(key: &WebhookSecret, id: &str, timestamp: u64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.expose()).expect("HMAC accepts keys of any length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks specification's test vector.
    const SPEC_KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TIMESTAMP: u64 = 1_614_265_330;
    const SPEC_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SPEC_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn key(text: &str) -> WebhookSecret {
        WebhookSecret::parse(text).unwrap()
    }

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn signed<'a>(id: &'a str, timestamp: &'a str, signature: &'a str) -> Signed<'a> {
        Signed { id, timestamp, signature }
    }

    #[test]
    fn the_standard_webhooks_test_vector_signs_and_verifies() {
        let spec = key(SPEC_KEY);
        assert_eq!(signature(std::slice::from_ref(&spec), SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY), SPEC_SIGNATURE);
        let headers = signed(SPEC_ID, "1614265330", SPEC_SIGNATURE);
        assert_eq!(verify(&spec, &headers, SPEC_BODY, at(SPEC_TIMESTAMP + 10)), Ok(()));
    }

    #[test]
    fn with_two_keys_each_signs_and_either_verifies() {
        let (new, old, other) = (key("whsec_bmV3LWtleQ=="), key("old-key"), key("other-key"));
        let both = signature(&[new.clone(), old.clone()], "evt_1", 1_000, b"{}");
        let entries: Vec<&str> = both.split(' ').collect();
        assert_eq!(entries.len(), 2, "{both}");
        assert!(entries.iter().all(|entry| entry.starts_with("v1,")), "{both}");
        let headers = signed("evt_1", "1000", &both);
        assert_eq!(verify(&new, &headers, b"{}", at(1_000)), Ok(()));
        assert_eq!(verify(&old, &headers, b"{}", at(1_000)), Ok(()));
        assert_eq!(verify(&other, &headers, b"{}", at(1_000)), Err(VerifyError::Mismatch));
        assert_eq!(signature(&[], "evt_1", 1_000, b"{}"), "", "no key, no signature");
    }

    #[test]
    fn a_stale_or_future_timestamp_is_refused_even_when_signed_right() {
        let spec = key(SPEC_KEY);
        let headers = signed(SPEC_ID, "1614265330", SPEC_SIGNATURE);
        let limit = TOLERANCE.as_secs();
        assert_eq!(verify(&spec, &headers, SPEC_BODY, at(SPEC_TIMESTAMP + limit)), Ok(()));
        let late = verify(&spec, &headers, SPEC_BODY, at(SPEC_TIMESTAMP + limit + 1));
        assert_eq!(late, Err(VerifyError::Stale { timestamp: SPEC_TIMESTAMP, now: SPEC_TIMESTAMP + limit + 1 }));
        let early = verify(&spec, &headers, SPEC_BODY, at(SPEC_TIMESTAMP - limit - 1));
        assert!(matches!(early, Err(VerifyError::Stale { .. })), "{early:?}");
        let garbled = signed(SPEC_ID, "yesterday", SPEC_SIGNATURE);
        assert!(matches!(verify(&spec, &garbled, SPEC_BODY, at(SPEC_TIMESTAMP)), Err(VerifyError::Timestamp(_))));
    }

    #[test]
    fn a_tampered_body_id_or_timestamp_or_a_foreign_scheme_is_refused() {
        let spec = key(SPEC_KEY);
        let now = at(SPEC_TIMESTAMP);
        let refused = Err(VerifyError::Mismatch);
        assert_eq!(
            verify(&spec, &signed(SPEC_ID, "1614265330", SPEC_SIGNATURE), br#"{"test": 2432232315}"#, now),
            refused
        );
        assert_eq!(verify(&spec, &signed("msg_other", "1614265330", SPEC_SIGNATURE), SPEC_BODY, now), refused);
        assert_eq!(verify(&spec, &signed(SPEC_ID, "1614265331", SPEC_SIGNATURE), SPEC_BODY, now), refused);
        let v2 = SPEC_SIGNATURE.replacen("v1,", "v2,", 1);
        assert_eq!(verify(&spec, &signed(SPEC_ID, "1614265330", &v2), SPEC_BODY, now), refused);
        assert_eq!(verify(&spec, &signed(SPEC_ID, "1614265330", "v1,%%%"), SPEC_BODY, now), refused);
        // An unknown entry next to a good one does not hide it.
        let mixed = format!("v1a,xyz {SPEC_SIGNATURE}");
        assert_eq!(verify(&spec, &signed(SPEC_ID, "1614265330", &mixed), SPEC_BODY, now), Ok(()));
    }
}
