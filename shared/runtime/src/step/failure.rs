//! How a step attempt failed ([`StepFailure`]), and the failures every step shares: those of
//! the blob store, with their stable [`codes`].

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use imagepipe_blob::{BlobError, BlobKey, BlobStore, InvalidBlobKey};
use imagepipe_contracts::StepError;

use crate::worker::error_chain;

/// Stable error codes of blob store failures, the same in every step (the `code` of their
/// [`StepError`]s).
pub mod codes {
    /// The command's blob key is not a blob key.
    pub const INVALID_BLOB_KEY: &str = "invalid_blob_key";
    /// No blob is stored under the command's key.
    pub const BLOB_NOT_FOUND: &str = "blob_not_found";
    /// The stored blob does not hash to its key.
    pub const BLOB_CORRUPT: &str = "blob_corrupt";
    /// Reading or writing the blob store failed (retryable).
    pub const BLOB_IO: &str = "blob_io";
}

/// How a step attempt failed; the step result reports it to the coordinator, which retries
/// or fails the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepFailure {
    /// A later attempt may succeed (timeouts, 5xx, store I/O).
    Retryable {
        /// What went wrong.
        error: StepError,
        /// The least delay before the next attempt, when the cause asked for one.
        retry_after: Option<Duration>,
    },
    /// No attempt can succeed for this input (404, not an image, too large): the task fails.
    Permanent(StepError),
    /// The step was not started (its host is at its politeness limit): the coordinator sends
    /// the same attempt again after `retry_after`, charging nothing.
    Deferred {
        /// Why it waits.
        reason: StepError,
        /// When to send it again.
        retry_after: Duration,
    },
}

impl StepFailure {
    /// A retryable failure with code `code`, retried after the coordinator's backoff.
    pub fn retryable(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Retryable { error: StepError::new(code, message), retry_after: None }
    }

    /// A permanent failure with code `code`.
    pub fn permanent(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Permanent(StepError::new(code, message))
    }

    /// The command's blob key does not parse: permanent.
    pub fn invalid_blob_key(error: &InvalidBlobKey) -> Self {
        Self::permanent(codes::INVALID_BLOB_KEY, format!("the command's blob key: {error}"))
    }

    /// A deferral with code `code`, sent again after `retry_after`.
    pub fn deferred(code: impl Into<String>, message: impl Into<String>, retry_after: Duration) -> Self {
        Self::Deferred { reason: StepError::new(code, message), retry_after }
    }

    /// What went wrong (or, for a deferral, why it waits).
    pub fn error(&self) -> &StepError {
        match self {
            Self::Retryable { error, .. } | Self::Permanent(error) | Self::Deferred { reason: error, .. } => error,
        }
    }

    /// Whether a later attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Retryable { .. } | Self::Deferred { .. })
    }
}

impl fmt::Display for StepFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error().fmt(f)
    }
}

/// Runs `work` on the bytes of the blob a command names by `key` while they are checked
/// against the key beside it, so the hash is not on the step's path: what `work` returns is
/// used only when the check passes, and a corrupt blob fails the step as a corrupt blob
/// whatever `work` made of it. A malformed key or a failing store fails the step the same way
/// for every step.
pub async fn with_blob<T, F>(blobs: &dyn BlobStore, key: &str, work: impl FnOnce(Bytes) -> F) -> Result<T, StepFailure>
where
    F: Future<Output = Result<T, StepFailure>>,
{
    let key: BlobKey = key.parse().map_err(|e| StepFailure::invalid_blob_key(&e))?;
    let bytes = blobs.get_unchecked(&key).await?;
    let (checked, worked) = tokio::join!(key.check(&bytes), work(bytes.clone()));
    checked?;
    worked
}

/// The stable code of a blob store failure.
pub fn blob_code(error: &BlobError) -> &'static str {
    match error {
        BlobError::NotFound(_) => codes::BLOB_NOT_FOUND,
        BlobError::Corrupt { .. } => codes::BLOB_CORRUPT,
        BlobError::Io { .. } => codes::BLOB_IO,
    }
}

impl From<BlobError> for StepFailure {
    /// A missing or corrupt blob is permanent; store I/O is retryable.
    fn from(error: BlobError) -> Self {
        let step_error = StepError::new(blob_code(&error), error_chain(&error));
        match error {
            BlobError::Io { .. } => Self::Retryable { error: step_error, retry_after: None },
            BlobError::NotFound(_) | BlobError::Corrupt { .. } => Self::Permanent(step_error),
        }
    }
}

#[cfg(test)]
mod tests {
    use imagepipe_blob::BlobKey;

    use super::*;

    #[test]
    fn blob_failures_carry_their_codes_and_retryability() {
        let key: BlobKey = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".parse().unwrap();
        let missing = StepFailure::from(BlobError::NotFound(key));
        assert_eq!((missing.error().code.as_str(), missing.is_retryable()), ("blob_not_found", false));
        let io = StepFailure::from(BlobError::Io { path: "ab/cd".into(), source: std::io::Error::other("disk gone") });
        assert!(io.is_retryable());
        assert_eq!(io.error().code, "blob_io");
        assert!(io.error().message.contains("disk gone"), "{io}");
    }

    #[tokio::test]
    async fn with_blob_hands_the_bytes_to_the_work_and_returns_what_it_made() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = imagepipe_blob::LocalBlobStore::new(dir.path());
        let bytes = Bytes::from(vec![7u8; 200_000]);
        let key = blobs.put(bytes.clone()).await.unwrap();
        let made = with_blob(&blobs, key.as_str(), |got| async move { Ok(got.len()) }).await.unwrap();
        assert_eq!(made, bytes.len());
    }

    #[tokio::test]
    async fn with_blob_fails_a_corrupt_blob_as_corrupt_whatever_the_work_made_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = imagepipe_blob::LocalBlobStore::new(dir.path());
        let key = blobs.put(Bytes::from(vec![7u8; 200_000])).await.unwrap();
        std::fs::write(blobs.path_of(&key), vec![8u8; 200_000]).unwrap();
        let worked = std::sync::atomic::AtomicBool::new(false);
        let worked = &worked;
        let failed = with_blob(&blobs, key.as_str(), |_| async move {
            worked.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .await
        .unwrap_err();
        assert!(worked.load(std::sync::atomic::Ordering::SeqCst), "the work runs beside the check");
        assert_eq!((failed.error().code.as_str(), failed.is_retryable()), (codes::BLOB_CORRUPT, false));
    }

    #[tokio::test]
    async fn with_blob_refuses_a_malformed_key_before_reading_or_working() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = imagepipe_blob::LocalBlobStore::new(dir.path());
        let failed =
            with_blob(&blobs, "sha256:nope", |_| async { Err::<(), _>(StepFailure::permanent("worked", "ran")) })
                .await
                .unwrap_err();
        assert_eq!(failed.error().code, codes::INVALID_BLOB_KEY);
    }
}
