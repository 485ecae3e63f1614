//! Blobs as files in a directory: `<dir>/<hex[0..2]>/<hex>`, written to a temporary file,
//! fsynced and renamed into place, so a reader never sees a partial blob.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::AsyncWriteExt;

use crate::{BlobError, BlobKey, BlobStore};

/// A [`BlobStore`] in a local directory.
#[derive(Debug, Clone)]
pub struct LocalBlobStore {
    dir: PathBuf,
}

impl LocalBlobStore {
    /// A store in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The file a key is stored in.
    pub fn path_of(&self, key: &BlobKey) -> PathBuf {
        let hex = key.hex();
        self.dir.join(&hex[..2]).join(hex)
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BlobError + '_ {
    move |source| BlobError::Io { path: path.display().to_string(), source }
}

#[async_trait]
impl BlobStore for LocalBlobStore {
    async fn put(&self, bytes: Bytes) -> Result<BlobKey, BlobError> {
        let key = BlobKey::compute(&bytes).await;
        let path = self.path_of(&key);
        if tokio::fs::try_exists(&path).await.map_err(io(&path))? {
            return Ok(key);
        }
        let parent = path.parent().expect("blob paths have a parent");
        tokio::fs::create_dir_all(parent).await.map_err(io(parent))?;
        let tmp = parent.join(format!(".{}.{}.tmp", key.hex(), uuid::Uuid::new_v4().simple()));
        let written = async {
            let mut file = tokio::fs::File::create(&tmp).await?;
            file.write_all(&bytes).await?;
            file.sync_all().await?;
            tokio::fs::rename(&tmp, &path).await
        }
        .await;
        if let Err(source) = written {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(BlobError::Io { path: path.display().to_string(), source });
        }
        Ok(key)
    }

    async fn get(&self, key: &BlobKey) -> Result<Bytes, BlobError> {
        let path = self.path_of(key);
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => Bytes::from(bytes),
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(BlobError::NotFound(key.clone())),
            Err(e) => return Err(io(&path)(e)),
        };
        let actual = BlobKey::compute(&bytes).await;
        if &actual != key {
            return Err(BlobError::Corrupt { key: key.clone(), actual });
        }
        Ok(bytes)
    }

    async fn exists(&self, key: &BlobKey) -> Result<bool, BlobError> {
        let path = self.path_of(key);
        tokio::fs::try_exists(&path).await.map_err(io(&path))
    }

    async fn delete(&self, key: &BlobKey) -> Result<(), BlobError> {
        let path = self.path_of(key);
        match tokio::fs::remove_file(&path).await {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(io(&path)(e)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn put_get_is_content_addressed_and_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path());
        let key = store.put(Bytes::from_static(b"jpeg bytes")).await.unwrap();
        assert_eq!(key, BlobKey::of(b"jpeg bytes"));
        assert_eq!(store.put(Bytes::from_static(b"jpeg bytes")).await.unwrap(), key);
        assert_eq!(store.get(&key).await.unwrap(), Bytes::from_static(b"jpeg bytes"));
        assert!(store.exists(&key).await.unwrap());
        let leftovers: Vec<_> = std::fs::read_dir(store.path_of(&key).parent().unwrap()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "temporary files left behind");
    }

    #[tokio::test]
    async fn missing_and_deleted_blobs_are_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path());
        let key = store.put(Bytes::from_static(b"x")).await.unwrap();
        store.delete(&key).await.unwrap();
        store.delete(&key).await.unwrap();
        assert!(matches!(store.get(&key).await, Err(BlobError::NotFound(k)) if k == key));
        assert!(!store.exists(&key).await.unwrap());
    }

    #[tokio::test]
    async fn a_corrupted_blob_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path());
        let key = store.put(Bytes::from_static(b"original")).await.unwrap();
        std::fs::write(store.path_of(&key), b"tampered").unwrap();
        assert!(matches!(store.get(&key).await, Err(BlobError::Corrupt { .. })));
    }
}
