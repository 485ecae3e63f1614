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

use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;

pub use config::{BlobConfig, BlobConfigError, BlobKind, S3Config};
pub use key::{BlobKey, InvalidBlobKey};
pub use local::LocalBlobStore;
pub use object::ObjectBlobStore;
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
    async fn get(&self, key: &BlobKey) -> Result<Bytes, BlobError>;
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
