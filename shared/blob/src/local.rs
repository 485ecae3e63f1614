//! Blobs as files in a directory: `<dir>/<hex[0..2]>/<hex>`, written to a temporary file,
//! fsynced and renamed into place, so a reader never sees a partial blob. A file's modification
//! time is when its blob was last put.

use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{BlobError, BlobKey, BlobStore, StoredBlob, blocking};

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

/// Stores `bytes` in `store`'s directory (see the module docs), or renews the modification time
/// of the file that holds them already.
fn put_file(store: &LocalBlobStore, bytes: &[u8]) -> Result<BlobKey, BlobError> {
    let key = BlobKey::of(bytes);
    let path = store.path_of(&key);
    if path.try_exists().map_err(io(&path))? {
        std::fs::File::options()
            .append(true)
            .open(&path)
            .and_then(|f| f.set_modified(SystemTime::now()))
            .map_err(io(&path))?;
        return Ok(key);
    }
    let parent = path.parent().expect("blob paths have a parent");
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let tmp = parent.join(format!(".{}.{}.tmp", key.hex(), uuid::Uuid::new_v4().simple()));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(source) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(BlobError::Io { path: path.display().to_string(), source });
    }
    Ok(key)
}

/// The names in directory `dir` for which `keep` holds, sorted; none when it does not exist.
async fn sorted_names(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<String>, BlobError> {
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut names = Vec::new();
    while let Some(entry) = entries.next_entry().await.map_err(io(dir))? {
        if let Some(name) = entry.file_name().to_str().filter(|n| keep(n)) {
            names.push(name.to_owned());
        }
    }
    names.sort_unstable();
    Ok(names)
}

fn is_hex(name: &str, len: usize) -> bool {
    name.len() == len && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BlobError + '_ {
    move |source| BlobError::Io { path: path.display().to_string(), source }
}

#[async_trait]
impl BlobStore for LocalBlobStore {
    async fn put(&self, bytes: Bytes) -> Result<BlobKey, BlobError> {
        let store = self.clone();
        blocking(move || put_file(&store, &bytes)).await
    }

    async fn get_unchecked(&self, key: &BlobKey) -> Result<Bytes, BlobError> {
        let path = self.path_of(key);
        let read = blocking({
            let path = path.clone();
            move || std::fs::read(path)
        });
        match read.await {
            Ok(bytes) => Ok(Bytes::from(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(BlobError::NotFound(key.clone())),
            Err(e) => Err(io(&path)(e)),
        }
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

    async fn modified(&self, key: &BlobKey) -> Result<Option<SystemTime>, BlobError> {
        let path = self.path_of(key);
        match tokio::fs::metadata(&path).await {
            Ok(meta) => meta.modified().map(Some).map_err(io(&path)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Reads one shard directory (`<hex[0..2]>`) at a time, from the shard of `after` on, until
    /// `max` blobs are found; temporary files are skipped.
    async fn list(&self, after: Option<&BlobKey>, max: usize) -> Result<Vec<StoredBlob>, BlobError> {
        let first_shard = after.map(|k| &k.hex()[..2]);
        let shards = sorted_names(&self.dir, |n| is_hex(n, 2) && first_shard.is_none_or(|f| n >= f)).await?;
        let mut found = Vec::new();
        for shard in shards {
            let dir = self.dir.join(&shard);
            let after_hex = after.map(BlobKey::hex);
            let names =
                sorted_names(&dir, |n| is_hex(n, 64) && n.starts_with(&shard) && after_hex.is_none_or(|a| n > a))
                    .await?;
            for name in names {
                if found.len() == max {
                    return Ok(found);
                }
                let key: BlobKey = format!("sha256:{name}").parse().expect("64 lowercase hex digits are a key");
                // A blob deleted since the directory was read is simply not listed.
                if let Some(modified) = self.modified(&key).await? {
                    found.push(StoredBlob { key, modified });
                }
            }
        }
        Ok(found)
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
        let unchecked = store.get_unchecked(&key).await.unwrap();
        assert_eq!(&unchecked[..], b"tampered");
        assert!(
            matches!(key.check(&unchecked).await, Err(BlobError::Corrupt { actual, .. }) if actual == BlobKey::of(b"tampered"))
        );
    }

    #[tokio::test]
    async fn blobs_are_listed_in_key_order_page_by_page_and_a_put_renews_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path());
        assert!(store.list(None, 10).await.unwrap().is_empty(), "no directory yet: nothing stored");
        let mut keys = Vec::new();
        for i in 0..40u8 {
            keys.push(store.put(Bytes::from(vec![i])).await.unwrap());
        }
        keys.sort();
        std::fs::write(store.path_of(&keys[0]).with_extension("tmp"), b"half written").unwrap();
        let (mut listed, mut after) = (Vec::new(), None);
        loop {
            let page = store.list(after.as_ref(), 7).await.unwrap();
            assert!(page.len() <= 7);
            let Some(last) = page.last() else { break };
            after = Some(last.key.clone());
            listed.extend(page.into_iter().map(|b| b.key));
        }
        assert_eq!(listed, keys, "every blob once, in key order, no temporary file");

        let long_ago = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        std::fs::File::options().append(true).open(store.path_of(&keys[1])).unwrap().set_modified(long_ago).unwrap();
        assert_eq!(store.modified(&keys[1]).await.unwrap(), Some(long_ago));
        let bytes = store.get(&keys[1]).await.unwrap();
        store.put(bytes).await.unwrap();
        let renewed = store.modified(&keys[1]).await.unwrap().unwrap();
        assert!(renewed.elapsed().unwrap() < std::time::Duration::from_secs(60), "an upload renews the blob");
        store.delete(&keys[1]).await.unwrap();
        assert_eq!(store.modified(&keys[1]).await.unwrap(), None);
    }
}
