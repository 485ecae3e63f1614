//! Content-addressed blob keys.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// `sha256:<64 lowercase hex digits>`: the SHA-256 of the blob's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobKey(String);

/// A string that is not a blob key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("blob key must be `sha256:` followed by 64 lowercase hex digits (got {0:?})")]
pub struct InvalidBlobKey(pub String);

impl BlobKey {
    /// The key of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// The key of a finished SHA-256 digest.
    pub(crate) fn from_digest(digest: &[u8]) -> Self {
        Self(format!("sha256:{}", hex::encode(digest)))
    }

    /// The key of `bytes`, hashed on the blocking pool when they are large enough to stall an
    /// async worker thread (SHA-256 runs at a few hundred MB/s: 25 MB is tens of milliseconds).
    pub async fn compute(bytes: &bytes::Bytes) -> Self {
        const INLINE_BYTES: usize = 64 * 1024;
        if bytes.len() <= INLINE_BYTES {
            return Self::of(bytes);
        }
        let bytes = bytes.clone();
        crate::blocking(move || Self::of(&bytes)).await
    }

    /// Whether `bytes` are the blob of this key: [`BlobError::Corrupt`] when they hash to
    /// another (hashed as [`BlobKey::compute`] does).
    pub async fn check(&self, bytes: &bytes::Bytes) -> Result<(), crate::BlobError> {
        let actual = Self::compute(bytes).await;
        if &actual == self { Ok(()) } else { Err(crate::BlobError::Corrupt { key: self.clone(), actual }) }
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// The whole key, `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for BlobKey {
    type Err = InvalidBlobKey;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if imagepipe_contracts::command::is_blob_key(s) {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidBlobKey(s.to_owned()))
        }
    }
}

impl fmt::Display for BlobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_sha256_of_the_bytes() {
        let key = BlobKey::of(b"test");
        assert_eq!(key.as_str(), "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
        assert_eq!(key.as_str().parse::<BlobKey>().unwrap(), key);
    }

    #[test]
    fn malformed_keys_are_rejected() {
        for bad in ["sha256:abc", "md5:9f86d081884c7d659a2feaa0c55ad015", "../../etc/passwd"] {
            assert!(bad.parse::<BlobKey>().is_err(), "{bad}");
        }
    }
}
