//! Webhook signatures: `X-Imagepipe-Signature: sha256=<hex HMAC-SHA256(secret, body)>`.
//!
//! A receiver recomputes the HMAC over the raw request body with the shared secret and compares
//! it, in constant time, with the header ([`verify`] does exactly that).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Header carrying the body's signature.
pub const SIGNATURE_HEADER: &str = "x-imagepipe-signature";
/// Header carrying the event's `eventId`, for the receiver's own deduplication.
pub const EVENT_ID_HEADER: &str = "x-imagepipe-event-id";
/// Header carrying the event's `eventType`.
pub const EVENT_TYPE_HEADER: &str = "x-imagepipe-event-type";

/// The scheme prefix of a signature.
const SCHEME: &str = "sha256=";

/// `sha256=<hex HMAC-SHA256(secret, body)>`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(body);
    format!("{SCHEME}{}", hex::encode(mac.finalize().into_bytes()))
}

/// Whether `header` is the signature of `body` under `secret` (compared in constant time).
pub fn verify(secret: &[u8], body: &[u8], header: &str) -> bool {
    let Some(digest) = header.strip_prefix(SCHEME).and_then(|hex| hex::decode(hex).ok()) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(body);
    mac.verify_slice(&digest).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_rfc_4231_test_case_2() {
        let signature = signature(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(signature, "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        assert!(verify(b"Jefe", b"what do ya want for nothing?", &signature));
    }

    #[test]
    fn another_body_secret_or_format_does_not_verify() {
        let signature = signature(b"secret", b"{}");
        assert!(!verify(b"secret", b"{ }", &signature));
        assert!(!verify(b"other", b"{}", &signature));
        assert!(!verify(b"secret", b"{}", signature.trim_start_matches("sha256=")));
        assert!(!verify(b"secret", b"{}", "sha256=zz"));
    }
}
