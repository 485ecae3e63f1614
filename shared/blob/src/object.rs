//! Blobs in any store the `object_store` crate reaches: S3 and S3-compatible services (MinIO,
//! Ceph, R2, ...), for deployments on several hosts.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, PutPayload};

use crate::{BlobError, BlobKey, BlobStore, StoredBlob};

/// A [`BlobStore`] over an [`ObjectStore`], keys under `<prefix>/<hex[0..2]>/<hex>`.
#[derive(Debug, Clone)]
pub struct ObjectBlobStore {
    store: Arc<dyn ObjectStore>,
    prefix: String,
}

impl ObjectBlobStore {
    /// Blobs in `store` under `prefix` (may be empty).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: impl Into<String>) -> Self {
        Self { store, prefix: prefix.into().trim_matches('/').to_owned() }
    }

    /// The object path of a key.
    pub fn path_of(&self, key: &BlobKey) -> Path {
        let hex = key.hex();
        if self.prefix.is_empty() {
            Path::from(format!("{}/{hex}", &hex[..2]))
        } else {
            Path::from(format!("{}/{}/{hex}", self.prefix, &hex[..2]))
        }
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

#[async_trait]
impl BlobStore for ObjectBlobStore {
    async fn put(&self, bytes: Bytes) -> Result<BlobKey, BlobError> {
        let key = BlobKey::compute(&bytes).await;
        let path = self.path_of(&key);
        // Same key, same bytes: overwriting is harmless, and cheaper than a HEAD first.
        self.store.put(&path, PutPayload::from_bytes(bytes)).await.map_err(|e| failed(&path, e))?;
        Ok(key)
    }

    async fn get(&self, key: &BlobKey) -> Result<Bytes, BlobError> {
        let path = self.path_of(key);
        let bytes = match self.store.get(&path).await {
            Ok(result) => result.bytes().await.map_err(|e| failed(&path, e))?,
            Err(object_store::Error::NotFound { .. }) => return Err(BlobError::NotFound(key.clone())),
            Err(e) => return Err(failed(&path, e)),
        };
        let actual = BlobKey::compute(&bytes).await;
        if &actual != key {
            return Err(BlobError::Corrupt { key: key.clone(), actual });
        }
        Ok(bytes)
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
        let prefix = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
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
