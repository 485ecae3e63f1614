//! Blobs in any store the `object_store` crate reaches: S3 and S3-compatible services (MinIO,
//! Ceph, R2, SeaweedFS, ...), for deployments on several hosts.
//!
//! A blob larger than [`MULTIPART_PART_SIZE`] is uploaded as a multipart upload in parts of that
//! size ([`MULTIPART_CONCURRENCY`] at a time); a smaller one with a single `PUT`. Either way the
//! object appears whole or not at all. Reads either fetch the whole object ([`BlobStore::get`]),
//! stream it ([`BlobStore::read`]), or fetch a byte range ([`BlobStore::get_range`]).

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectMeta, ObjectStore, PutPayload, PutResult};

use crate::{BlobError, BlobKey, BlobStore, BlobStream, StoredBlob, clamp};

/// The size of the parts of a multipart upload, and the threshold for one: a blob larger than
/// this (8 MiB) is uploaded in parts of this size, the last one smaller. S3 wants parts of at
/// least 5 MiB (but the last) and at most 10,000 of them: 8 MiB parts cover blobs up to 78 GiB,
/// far beyond `download.max_bytes`.
pub const MULTIPART_PART_SIZE: usize = 8 * 1024 * 1024;

/// How many parts of one multipart upload are sent at once.
pub const MULTIPART_CONCURRENCY: usize = 4;

/// A [`BlobStore`] over an [`ObjectStore`], keys under `<prefix>/<hex[0..2]>/<hex>`.
#[derive(Debug, Clone)]
pub struct ObjectBlobStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
}

impl ObjectBlobStore {
    /// Blobs in `store` under `prefix` (may be empty; slashes around it are dropped). The prefix
    /// is the objects' key prefix exactly as written, non-ASCII and reserved characters included
    /// (the client encodes them on the wire). A prefix that is no object path (an empty, `.` or
    /// `..` segment, a control character: what [`crate::BlobConfig::validate`] refuses) is
    /// percent-encoded instead.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        let prefix = prefix.trim_matches('/');
        Self { store, prefix: Path::parse(prefix).unwrap_or_else(|_| Path::from(prefix)) }
    }

    /// The object path of a key.
    pub fn path_of(&self, key: &BlobKey) -> Path {
        let hex = key.hex();
        self.prefix.child(&hex[..2]).child(hex)
    }
}

/// When an object was last written, as a [`SystemTime`].
fn written_at(meta: &ObjectMeta) -> SystemTime {
    let ms = meta.last_modified.timestamp_millis();
    match u64::try_from(ms) {
        Ok(ms) => SystemTime::UNIX_EPOCH + Duration::from_millis(ms),
        Err(_) => SystemTime::UNIX_EPOCH,
    }
}

/// The blob key an object path ends in (`.../<hex[0..2]>/<hex>`), if it is one.
fn key_of(path: &Path) -> Option<BlobKey> {
    let mut parts: Vec<_> = path.parts().collect();
    let hex = parts.pop()?;
    let shard = parts.pop()?;
    let key: BlobKey = format!("sha256:{}", hex.as_ref()).parse().ok()?;
    (shard.as_ref() == &key.hex()[..2]).then_some(key)
}

fn failed(path: &Path, source: object_store::Error) -> BlobError {
    BlobError::Io { path: path.to_string(), source: std::io::Error::other(source) }
}

/// Uploads `bytes` to `path` as a multipart upload in parts of `part_size`; aborts the upload
/// (so the store drops the parts sent) when a part or the completion fails.
async fn put_multipart(
    store: &dyn ObjectStore,
    path: &Path,
    bytes: Bytes,
    part_size: usize,
) -> Result<PutResult, object_store::Error> {
    let mut upload = store.put_multipart(path).await?;
    // Each part is numbered when it is made, in order; they are sent as they are polled.
    let parts: Vec<_> = (0..bytes.len())
        .step_by(part_size.max(1))
        .map(|start| {
            let part = bytes.slice(start..(start + part_size).min(bytes.len()));
            upload.put_part(PutPayload::from_bytes(part))
        })
        .collect();
    let sent = futures::stream::iter(parts).buffer_unordered(MULTIPART_CONCURRENCY).try_collect::<Vec<()>>().await;
    let completed = match sent {
        Ok(_) => upload.complete().await,
        Err(error) => Err(error),
    };
    if completed.is_err() {
        // Best effort: the error that matters is the upload's; an unaborted upload's parts
        // are what a bucket lifecycle rule for incomplete multipart uploads removes.
        let _ = upload.abort().await;
    }
    completed
}

#[async_trait]
impl BlobStore for ObjectBlobStore {
    async fn put(&self, bytes: Bytes) -> Result<BlobKey, BlobError> {
        let key = BlobKey::compute(&bytes).await;
        let path = self.path_of(&key);
        // Same key, same bytes: overwriting is harmless, and cheaper than a HEAD first.
        if bytes.len() > MULTIPART_PART_SIZE {
            put_multipart(self.store.as_ref(), &path, bytes, MULTIPART_PART_SIZE)
                .await
                .map_err(|e| failed(&path, e))?;
        } else {
            self.store.put(&path, PutPayload::from_bytes(bytes)).await.map_err(|e| failed(&path, e))?;
        }
        Ok(key)
    }

    /// Streams the object's body as the object store sends it (the size from its metadata),
    /// checked against the key as it passes.
    async fn read(&self, key: &BlobKey) -> Result<BlobStream, BlobError> {
        let path = self.path_of(key);
        let result = match self.store.get(&path).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Err(BlobError::NotFound(key.clone())),
            Err(e) => return Err(failed(&path, e)),
        };
        let size = result.meta.size;
        let at = path.clone();
        let chunks = result.into_stream().map(move |chunk| chunk.map_err(|e| failed(&at, e))).boxed();
        Ok(BlobStream::verified(key.clone(), size, chunks))
    }

    /// A `HEAD` for the size, then a ranged `GET` of the clamped range (none when it is empty).
    async fn get_range(&self, key: &BlobKey, range: Range<u64>) -> Result<Bytes, BlobError> {
        let path = self.path_of(key);
        let size = match self.store.head(&path).await {
            Ok(meta) => meta.size,
            Err(object_store::Error::NotFound { .. }) => return Err(BlobError::NotFound(key.clone())),
            Err(e) => return Err(failed(&path, e)),
        };
        let (start, end) = clamp(&range, size);
        if start == end {
            return Ok(Bytes::new());
        }
        match self.store.get_range(&path, start..end).await {
            Ok(bytes) => Ok(bytes),
            Err(object_store::Error::NotFound { .. }) => Err(BlobError::NotFound(key.clone())),
            Err(e) => Err(failed(&path, e)),
        }
    }

    async fn get_unchecked(&self, key: &BlobKey) -> Result<Bytes, BlobError> {
        let path = self.path_of(key);
        match self.store.get(&path).await {
            Ok(result) => result.bytes().await.map_err(|e| failed(&path, e)),
            Err(object_store::Error::NotFound { .. }) => Err(BlobError::NotFound(key.clone())),
            Err(e) => Err(failed(&path, e)),
        }
    }

    async fn exists(&self, key: &BlobKey) -> Result<bool, BlobError> {
        let path = self.path_of(key);
        match self.store.head(&path).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(failed(&path, e)),
        }
    }

    async fn delete(&self, key: &BlobKey) -> Result<(), BlobError> {
        let path = self.path_of(key);
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(failed(&path, e)),
        }
    }

    async fn modified(&self, key: &BlobKey) -> Result<Option<SystemTime>, BlobError> {
        let path = self.path_of(key);
        match self.store.head(&path).await {
            Ok(meta) => Ok(Some(written_at(&meta))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(failed(&path, e)),
        }
    }

    /// One listing request from the object after `after` (object stores list in key order,
    /// and a blob's path sorts as its key); objects that are not blobs are skipped.
    async fn list(&self, after: Option<&BlobKey>, max: usize) -> Result<Vec<StoredBlob>, BlobError> {
        let prefix = (!self.prefix.as_ref().is_empty()).then(|| self.prefix.clone());
        let listing = match after {
            Some(key) => self.store.list_with_offset(prefix.as_ref(), &self.path_of(key)),
            None => self.store.list(prefix.as_ref()),
        };
        let at = prefix.clone().unwrap_or_default();
        listing
            .try_filter_map(|meta| async move {
                Ok(key_of(&meta.location).map(|key| StoredBlob { key, modified: written_at(&meta) }))
            })
            .take(max)
            .try_collect()
            .await
            .map_err(|e| failed(&at, e))
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;

    use super::*;

    fn store() -> (Arc<InMemory>, ObjectBlobStore) {
        let memory = Arc::new(InMemory::new());
        (memory.clone(), ObjectBlobStore::new(memory, "/blobs/"))
    }

    #[tokio::test]
    async fn blobs_round_trip_under_their_content_address() {
        let (memory, blobs) = store();
        let key = blobs.put(Bytes::from_static(b"png bytes")).await.unwrap();
        assert_eq!(key, BlobKey::of(b"png bytes"));
        assert_eq!(blobs.path_of(&key).as_ref(), format!("blobs/{}/{}", &key.hex()[..2], key.hex()));
        assert!(memory.head(&blobs.path_of(&key)).await.is_ok());
        assert_eq!(blobs.get(&key).await.unwrap(), Bytes::from_static(b"png bytes"));
        assert!(blobs.exists(&key).await.unwrap());
    }

    #[tokio::test]
    async fn missing_deleted_and_corrupt_blobs_are_told_apart() {
        let (memory, blobs) = store();
        let key = blobs.put(Bytes::from_static(b"a")).await.unwrap();
        memory.put(&blobs.path_of(&key), PutPayload::from_static(b"b")).await.unwrap();
        assert!(matches!(blobs.get(&key).await, Err(BlobError::Corrupt { .. })));
        assert_eq!(&blobs.get_unchecked(&key).await.unwrap()[..], b"b");
        blobs.delete(&key).await.unwrap();
        blobs.delete(&key).await.unwrap();
        assert!(matches!(blobs.get(&key).await, Err(BlobError::NotFound(_))));
        assert!(!blobs.exists(&key).await.unwrap());
        assert_eq!(blobs.modified(&key).await.unwrap(), None);
    }

    #[tokio::test]
    async fn blobs_are_listed_in_key_order_page_by_page_skipping_other_objects() {
        let (memory, blobs) = store();
        let mut keys = Vec::new();
        for bytes in [&b"one"[..], b"two", b"three", b"four"] {
            keys.push(blobs.put(Bytes::copy_from_slice(bytes)).await.unwrap());
        }
        keys.sort();
        memory.put(&Path::from("blobs/README"), PutPayload::from_static(b"not a blob")).await.unwrap();
        memory.put(&Path::from("elsewhere/x"), PutPayload::from_static(b"outside the prefix")).await.unwrap();
        let first = blobs.list(None, 3).await.unwrap();
        assert_eq!(first.iter().map(|b| b.key.clone()).collect::<Vec<_>>(), keys[..3]);
        let rest = blobs.list(Some(&first[2].key), 3).await.unwrap();
        assert_eq!(rest.iter().map(|b| b.key.clone()).collect::<Vec<_>>(), keys[3..]);
        assert!(blobs.list(Some(&keys[3]), 3).await.unwrap().is_empty());
        let modified = blobs.modified(&keys[0]).await.unwrap().unwrap();
        assert_eq!(first[0].modified, modified);
        assert!(modified.elapsed().unwrap() < Duration::from_secs(60), "{modified:?}");
    }
}
