//! Blobs in any store the `object_store` crate reaches: S3 and S3-compatible services (MinIO,
//! Ceph, R2, ...), for deployments on several hosts.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};

use crate::{BlobError, BlobKey, BlobStore};

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
    }
}
