//! The blob store (docs/design.md, "claim check"): the download worker writes an image's bytes once,
//! under a content-addressed key `sha256:<hex>`, and every later message carries only the key.
//!
//! [`BlobStore`] is the seam; [`LocalBlobStore`] keeps blobs in a directory (one host, or a volume
//! shared by the containers), [`ObjectBlobStore`] in S3 or an S3-compatible service (several
//! hosts). [`BlobConfig::open`] picks one from the `blob` config section. [`sniff`] tells what
//! stored bytes are by their magic numbers.

mod config;
mod key;
mod local;
mod object;
pub mod sniff;
#[cfg(feature = "testing")]
pub mod testing;

use std::ops::Range;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use sha2::{Digest, Sha256};

pub use config::{BlobConfig, BlobConfigError, BlobKind, S3Config};
pub use key::{BlobKey, InvalidBlobKey};
pub use local::LocalBlobStore;
pub use object::{MULTIPART_CONCURRENCY, MULTIPART_PART_SIZE, ObjectBlobStore};
pub use sniff::{ImageFormat, Sniffed, sniff};

/// A blob operation that failed, naming the key or path involved.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// No blob is stored under this key.
    #[error("blob {0} not found")]
    NotFound(BlobKey),
    /// The stored bytes do not hash to their key (disk corruption or tampering).
    #[error("blob {key} is corrupt: its bytes hash to {actual}")]
    Corrupt {
        /// The key asked for.
        key: BlobKey,
        /// What the stored bytes hash to.
        actual: BlobKey,
    },
    /// The storage itself failed.
    #[error("blob store I/O on {path}")]
    Io {
        /// File or object path.
        path: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl BlobError {
    /// Whether trying again may succeed: the storage failed ([`BlobError::Io`]: a disk, a
    /// network, an object store that is down or restarting), as opposed to a blob that is
    /// missing or corrupt, which stays so.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Io { .. })
    }
}

/// A blob being read as a stream of chunks ([`BlobStore::read`]), not held in memory whole.
pub struct BlobStream {
    /// Its size in bytes, known before the first chunk (a `Content-Length`).
    pub size: u64,
    /// The bytes in order. Checked against the key as they pass: the last chunk is released only
    /// once everything before it and it hash to the key; otherwise the stream ends with
    /// [`BlobError::Corrupt`] instead of it, so a reader that got every chunk got the right bytes.
    pub chunks: BoxStream<'static, Result<Bytes, BlobError>>,
}

impl std::fmt::Debug for BlobStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobStream").field("size", &self.size).finish_non_exhaustive()
    }
}

impl BlobStream {
    /// `chunks` of the blob under `key`, `size` bytes, checked against `key` as described on
    /// [`BlobStream::chunks`].
    pub fn verified(key: BlobKey, size: u64, chunks: BoxStream<'static, Result<Bytes, BlobError>>) -> Self {
        struct State {
            key: BlobKey,
            chunks: BoxStream<'static, Result<Bytes, BlobError>>,
            hasher: Sha256,
            held: Option<Bytes>,
            done: bool,
        }
        let state = State { key, chunks, hasher: Sha256::new(), held: None, done: false };
        let checked = futures::stream::unfold(state, |mut state| async move {
            if state.done {
                return None;
            }
            loop {
                match state.chunks.next().await {
                    Some(Ok(chunk)) => {
                        if chunk.is_empty() {
                            continue;
                        }
                        state.hasher.update(&chunk);
                        // Hold this chunk back and release the previous one: the last is released
                        // only after the hash is checked.
                        if let Some(previous) = state.held.replace(chunk) {
                            return Some((Ok(previous), state));
                        }
                    }
                    Some(Err(error)) => {
                        state.done = true;
                        return Some((Err(error), state));
                    }
                    None => {
                        state.done = true;
                        let digest = std::mem::take(&mut state.hasher).finalize();
                        let actual = BlobKey::from_digest(&digest);
                        if actual != state.key {
                            let key = state.key.clone();
                            return Some((Err(BlobError::Corrupt { key, actual }), state));
                        }
                        let last = state.held.take()?;
                        return Some((Ok(last), state));
                    }
                }
            }
        });
        // Fused: a reader may poll again after the end (as one that peeked at the first chunks does).
        Self { size, chunks: checked.fuse().boxed() }
    }

    /// Reads the whole stream into memory.
    pub async fn collect(mut self) -> Result<Bytes, BlobError> {
        let mut bytes = bytes::BytesMut::with_capacity(usize::try_from(self.size).unwrap_or(0));
        while let Some(chunk) = self.chunks.next().await {
            bytes.extend_from_slice(&chunk?);
        }
        Ok(bytes.freeze())
    }
}

/// A stored blob as [`BlobStore::list`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlob {
    /// Its key.
    pub key: BlobKey,
    /// When it was last written: a [`BlobStore::put`] of bytes already stored counts, so a
    /// re-uploaded blob is as new as its latest upload.
    pub modified: SystemTime,
}

/// Where images and thumbnails live. Writes are content-addressed and idempotent: putting the
/// same bytes twice returns the same key and stores them once (and renews its
/// [`modified`](BlobStore::modified) time, which the coordinator's orphan sweep goes by).
#[async_trait]
pub trait BlobStore: Send + Sync {
    /// Stores `bytes` durably and returns their key.
    async fn put(&self, bytes: Bytes) -> Result<BlobKey, BlobError>;
    /// The bytes stored under `key`, checked against it.
    async fn get(&self, key: &BlobKey) -> Result<Bytes, BlobError> {
        let bytes = self.get_unchecked(key).await?;
        key.check(&bytes).await?;
        Ok(bytes)
    }
    /// The bytes stored under `key`, not checked yet: for a reader that starts on them while
    /// [`BlobKey::check`] runs beside it, and uses nothing it made of them unless the check
    /// passes.
    async fn get_unchecked(&self, key: &BlobKey) -> Result<Bytes, BlobError>;
    /// The bytes stored under `key` as a stream, checked against it as they pass (see
    /// [`BlobStream::chunks`]): for serving a blob without holding it whole. This default reads
    /// it whole with [`BlobStore::get`]; [`ObjectBlobStore`] streams it from the object store.
    async fn read(&self, key: &BlobKey) -> Result<BlobStream, BlobError> {
        let bytes = self.get(key).await?;
        let size = bytes.len() as u64;
        Ok(BlobStream { size, chunks: futures::stream::once(async move { Ok(bytes) }).boxed() })
    }
    /// The bytes of `range` of the blob under `key`, clamped to the blob as an HTTP range is (an
    /// end past it reads to its end; a start past it reads nothing). Not checked against the key:
    /// a part cannot be. This default reads the blob whole with [`BlobStore::get`] (checked) and
    /// slices it; [`ObjectBlobStore`] asks the object store for the range only.
    async fn get_range(&self, key: &BlobKey, range: Range<u64>) -> Result<Bytes, BlobError> {
        let bytes = self.get(key).await?;
        let (start, end) = clamp(&range, bytes.len() as u64);
        Ok(bytes.slice(start as usize..end as usize))
    }
    /// Whether a blob is stored under `key`.
    async fn exists(&self, key: &BlobKey) -> Result<bool, BlobError>;
    /// Removes the blob under `key`; removing a missing blob is not an error.
    async fn delete(&self, key: &BlobKey) -> Result<(), BlobError>;
    /// When the blob under `key` was last written; `None` when there is none.
    async fn modified(&self, key: &BlobKey) -> Result<Option<SystemTime>, BlobError>;
    /// Up to `max` stored blobs whose keys come after `after` (from the first without it), in
    /// key order: a listing goes on from the last key of its previous page.
    async fn list(&self, after: Option<&BlobKey>, max: usize) -> Result<Vec<StoredBlob>, BlobError>;
}

/// Runs `work` on the blocking pool, its panic resumed here: a local put or get is one job
/// there, not one per file call, and a large hash does not stall an async worker thread.
pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
}

/// `range` clamped to a blob of `size` bytes: `(start, end)` with `start <= end <= size`.
pub(crate) fn clamp(range: &Range<u64>, size: u64) -> (u64, u64) {
    let end = range.end.min(size);
    (range.start.min(end), end)
}
