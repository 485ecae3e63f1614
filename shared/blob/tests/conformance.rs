//! The blob store suite, run on every store: the local directory, the object store in memory, and
//! S3 for real on the SeaweedFS that `scripts/seaweedfs.sh` starts (its S3 gateway with an access
//! key and secret, SigV4-signed requests). Without that server (`IMAGEPIPE_TEST_S3_*` unset) the
//! S3 cases fail, or skip with `IMAGEPIPE_TEST_ALLOW_SKIP=1`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use imagepipe_blob::{
    BlobConfig, BlobError, BlobKey, BlobKind, BlobStore, LocalBlobStore, MULTIPART_PART_SIZE, ObjectBlobStore, S3Config,
};
use imagepipe_secret::Secret;
use object_store::ObjectStore;
use object_store::memory::InMemory;

/// A store under test, and what the object-store cases look at beneath it.
struct Subject {
    blobs: Arc<dyn BlobStore>,
    /// The object store and the blob store over it, for the object-store backends.
    objects: Option<(Arc<dyn ObjectStore>, ObjectBlobStore)>,
    /// Keeps the local store's directory.
    _dir: Option<tempfile::TempDir>,
}

/// Bytes that differ per test run and per `tag`, `len` of them.
fn payload(tag: &str, len: usize) -> Bytes {
    let seed = format!("{tag}-{}", uuid::Uuid::new_v4());
    let mut bytes = Vec::with_capacity(len);
    let mut block = BlobKey::of(seed.as_bytes()).hex().as_bytes().to_vec();
    while bytes.len() < len {
        bytes.extend_from_slice(&block);
        block = BlobKey::of(&block).hex().as_bytes().to_vec();
    }
    bytes.truncate(len);
    Bytes::from(bytes)
}

async fn put_get_is_content_addressed_and_idempotent(subject: Subject) {
    let blobs = subject.blobs;
    let bytes = payload("round-trip", 1000);
    let key = blobs.put(bytes.clone()).await.unwrap();
    assert_eq!(key, BlobKey::of(&bytes));
    assert_eq!(blobs.put(bytes.clone()).await.unwrap(), key, "putting the same bytes again");
    assert_eq!(blobs.get(&key).await.unwrap(), bytes);
    assert!(blobs.exists(&key).await.unwrap());
    let modified = blobs.modified(&key).await.unwrap().expect("a stored blob has a modification time");
    let age = modified.elapsed().unwrap_or_default();
    assert!(age < Duration::from_secs(120), "written just now, {age:?} ago");
    let streamed = blobs.read(&key).await.unwrap();
    assert_eq!(streamed.size, bytes.len() as u64);
    assert_eq!(streamed.collect().await.unwrap(), bytes);
    blobs.delete(&key).await.unwrap();
}

async fn missing_and_deleted_blobs_are_not_found(subject: Subject) {
    let blobs = subject.blobs;
    let missing = BlobKey::of(payload("never stored", 10).as_ref());
    assert!(matches!(blobs.get(&missing).await, Err(BlobError::NotFound(k)) if k == missing));
    assert!(matches!(blobs.read(&missing).await, Err(BlobError::NotFound(k)) if k == missing));
    assert!(matches!(blobs.get_range(&missing, 0..4).await, Err(BlobError::NotFound(k)) if k == missing));
    assert!(!blobs.exists(&missing).await.unwrap());
    assert_eq!(blobs.modified(&missing).await.unwrap(), None);
    blobs.delete(&missing).await.expect("deleting a missing blob is not an error");

    let key = blobs.put(payload("deleted", 100)).await.unwrap();
    blobs.delete(&key).await.unwrap();
    blobs.delete(&key).await.unwrap();
    assert!(matches!(blobs.get(&key).await, Err(BlobError::NotFound(k)) if k == key));
    assert!(!blobs.exists(&key).await.unwrap());
    assert_eq!(blobs.modified(&key).await.unwrap(), None);
}

async fn ranges_read_parts_clamped_to_the_blob(subject: Subject) {
    let blobs = subject.blobs;
    let bytes = payload("range", 10_000);
    let key = blobs.put(bytes.clone()).await.unwrap();
    for range in [0..1, 0..10_000, 17..4_096, 9_999..10_000, 5_000..5_000] {
        let (start, end) = (range.start as usize, range.end as usize);
        assert_eq!(blobs.get_range(&key, range.clone()).await.unwrap(), bytes.slice(start..end), "{range:?}");
    }
    assert_eq!(blobs.get_range(&key, 9_000..20_000).await.unwrap(), bytes.slice(9_000..), "an end past the blob");
    assert!(blobs.get_range(&key, 10_000..10_010).await.unwrap().is_empty(), "a start at the end");
    assert!(blobs.get_range(&key, 50_000..60_000).await.unwrap().is_empty(), "a start past the end");
    blobs.delete(&key).await.unwrap();
}

async fn blobs_are_listed_in_key_order_page_by_page(subject: Subject) {
    let blobs = subject.blobs;
    let mut keys = Vec::new();
    for i in 0..12 {
        keys.push(blobs.put(payload(&format!("list {i}"), 64)).await.unwrap());
    }
    keys.sort();
    let (mut listed, mut after) = (Vec::new(), None);
    loop {
        let page = blobs.list(after.as_ref(), 5).await.unwrap();
        assert!(page.len() <= 5);
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        listed.extend(page.into_iter().map(|b| b.key));
    }
    assert_eq!(listed, keys, "every blob once, in key order");
    for key in &keys {
        blobs.delete(key).await.unwrap();
    }
    assert!(blobs.list(None, 5).await.unwrap().is_empty(), "all deleted");
}

/// A blob over twice [`MULTIPART_PART_SIZE`] is stored whole (by an object store, with a
/// multipart upload: on S3 its ETag says so, `"<md5 of the parts' md5s>-<parts>"`) and reads back
/// the same bytes, whole, streamed and by ranges across the parts' borders.
async fn a_blob_over_two_multipart_parts_round_trips_whole(subject: Subject, etag_counts_parts: bool) {
    let blobs = subject.blobs;
    let len = 2 * MULTIPART_PART_SIZE + 123_457;
    let bytes = payload("large", len);
    let key = blobs.put(bytes.clone()).await.unwrap();
    assert_eq!(key, BlobKey::of(&bytes));
    if let Some((objects, store)) = &subject.objects {
        let meta = objects.head(&store.path_of(&key)).await.unwrap();
        assert_eq!(meta.size, len as u64);
        if etag_counts_parts {
            let etag = meta.e_tag.clone().unwrap_or_default();
            assert!(etag.trim_matches('"').ends_with("-3"), "three parts in the ETag, got {etag:?}");
        }
    }
    assert_eq!(blobs.get(&key).await.unwrap(), bytes);
    let mut streamed = blobs.read(&key).await.unwrap();
    assert_eq!(streamed.size, len as u64);
    let mut read = Vec::with_capacity(len);
    let mut chunks = 0;
    while let Some(chunk) = streamed.chunks.next().await {
        read.extend_from_slice(&chunk.unwrap());
        chunks += 1;
    }
    assert_eq!(read, bytes, "streamed in {chunks} chunks");
    let border = MULTIPART_PART_SIZE as u64;
    let across = border - 10..border + 10;
    assert_eq!(
        blobs.get_range(&key, across.clone()).await.unwrap(),
        bytes.slice(border as usize - 10..border as usize + 10)
    );
    blobs.delete(&key).await.unwrap();
}

/// Bytes that do not hash to their key are refused by `get`, and a streamed read ends with
/// `Corrupt` instead of its last chunk.
async fn a_corrupt_object_is_refused_whole_and_streamed(subject: Subject) {
    let blobs = subject.blobs;
    let (objects, store) = subject.objects.expect("an object store");
    let key = blobs.put(payload("original", 200_000)).await.unwrap();
    let tampered = payload("tampered", 200_000);
    objects.put(&store.path_of(&key), tampered.clone().into()).await.unwrap();
    assert!(matches!(blobs.get(&key).await, Err(BlobError::Corrupt { key: k, .. }) if k == key));
    let mut streamed = blobs.read(&key).await.unwrap();
    let mut passed = 0;
    let mut last = None;
    while let Some(chunk) = streamed.chunks.next().await {
        match chunk {
            Ok(chunk) => passed += chunk.len(),
            Err(error) => last = Some(error),
        }
    }
    assert!(matches!(last, Some(BlobError::Corrupt { .. })), "the stream ends with Corrupt: {last:?}");
    assert!(passed < tampered.len(), "the last chunk is held back: {passed} of {} bytes passed", tampered.len());
    blobs.delete(&key).await.unwrap();
}

mod local {
    use super::*;

    fn subject() -> Subject {
        let dir = tempfile::tempdir().unwrap();
        Subject { blobs: Arc::new(LocalBlobStore::new(dir.path())), objects: None, _dir: Some(dir) }
    }

    #[tokio::test]
    async fn put_get_is_content_addressed_and_idempotent() {
        super::put_get_is_content_addressed_and_idempotent(subject()).await;
    }

    #[tokio::test]
    async fn missing_and_deleted_blobs_are_not_found() {
        super::missing_and_deleted_blobs_are_not_found(subject()).await;
    }

    #[tokio::test]
    async fn ranges_read_parts_clamped_to_the_blob() {
        super::ranges_read_parts_clamped_to_the_blob(subject()).await;
    }

    #[tokio::test]
    async fn blobs_are_listed_in_key_order_page_by_page() {
        super::blobs_are_listed_in_key_order_page_by_page(subject()).await;
    }

    #[tokio::test]
    async fn a_blob_over_two_multipart_parts_round_trips_whole() {
        super::a_blob_over_two_multipart_parts_round_trips_whole(subject(), false).await;
    }
}

mod memory {
    use super::*;

    fn subject() -> Subject {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let store = ObjectBlobStore::new(objects.clone(), "blobs");
        Subject { blobs: Arc::new(store.clone()), objects: Some((objects, store)), _dir: None }
    }

    #[tokio::test]
    async fn put_get_is_content_addressed_and_idempotent() {
        super::put_get_is_content_addressed_and_idempotent(subject()).await;
    }

    #[tokio::test]
    async fn missing_and_deleted_blobs_are_not_found() {
        super::missing_and_deleted_blobs_are_not_found(subject()).await;
    }

    #[tokio::test]
    async fn ranges_read_parts_clamped_to_the_blob() {
        super::ranges_read_parts_clamped_to_the_blob(subject()).await;
    }

    #[tokio::test]
    async fn blobs_are_listed_in_key_order_page_by_page() {
        super::blobs_are_listed_in_key_order_page_by_page(subject()).await;
    }

    #[tokio::test]
    async fn a_blob_over_two_multipart_parts_round_trips_whole() {
        super::a_blob_over_two_multipart_parts_round_trips_whole(subject(), false).await;
    }

    #[tokio::test]
    async fn a_corrupt_object_is_refused_whole_and_streamed() {
        super::a_corrupt_object_is_refused_whole_and_streamed(subject()).await;
    }
}

/// S3 on the SeaweedFS of `scripts/seaweedfs.sh`.
mod s3 {
    use super::*;

    /// The `blob.s3` settings of the test server under `prefix`.
    pub(super) fn config(prefix: &str) -> Option<S3Config> {
        imagepipe_blob::testing::s3_config(prefix, Duration::from_secs(20))
    }

    /// A fresh prefix per test: `conformance/<label>-<random>`, with what the test adds.
    fn prefix(label: &str) -> String {
        format!("conformance/{label}-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
    }

    /// The store `blob.kind = "s3"` opens under `prefix`, and the object store beneath it.
    fn subject_under(prefix: &str) -> Option<Subject> {
        let s3 = config(prefix)?;
        let config = BlobConfig { kind: BlobKind::S3, s3: s3.clone(), ..BlobConfig::default() };
        let blobs = config.open().expect("blob.s3 opens");
        let objects: Arc<dyn ObjectStore> = Arc::new(s3.object_store().expect("an S3 client"));
        let store = ObjectBlobStore::new(objects.clone(), prefix);
        Some(Subject { blobs, objects: Some((objects, store)), _dir: None })
    }

    fn subject(label: &str) -> Option<Subject> {
        subject_under(&prefix(label))
    }

    #[tokio::test]
    async fn put_get_is_content_addressed_and_idempotent() {
        let Some(subject) = subject("round-trip") else { return };
        super::put_get_is_content_addressed_and_idempotent(subject).await;
    }

    #[tokio::test]
    async fn missing_and_deleted_blobs_are_not_found() {
        let Some(subject) = subject("missing") else { return };
        super::missing_and_deleted_blobs_are_not_found(subject).await;
    }

    #[tokio::test]
    async fn ranges_read_parts_clamped_to_the_blob() {
        let Some(subject) = subject("range") else { return };
        super::ranges_read_parts_clamped_to_the_blob(subject).await;
    }

    #[tokio::test]
    async fn blobs_are_listed_in_key_order_page_by_page() {
        let Some(subject) = subject("list") else { return };
        super::blobs_are_listed_in_key_order_page_by_page(subject).await;
    }

    #[tokio::test]
    async fn a_blob_over_two_multipart_parts_round_trips_whole() {
        let Some(subject) = subject("multipart") else { return };
        super::a_blob_over_two_multipart_parts_round_trips_whole(subject, true).await;
    }

    #[tokio::test]
    async fn a_corrupt_object_is_refused_whole_and_streamed() {
        let Some(subject) = subject("corrupt") else { return };
        super::a_corrupt_object_is_refused_whole_and_streamed(subject).await;
    }

    /// Keys are content addresses (`sha256:<hex>`), so the only free text in an object's path is
    /// `blob.s3.prefix`: one with spaces, reserved and non-ASCII characters signs, stores, lists
    /// and reads like a plain one, and lands under exactly that prefix.
    #[tokio::test]
    async fn a_prefix_with_unusual_characters_round_trips() {
        let prefix = format!("{}/été + zoë=1&x;y,z!'()*@$ ~ü/日本", prefix("unusual"));
        let Some(subject) = subject_under(&prefix) else { return };
        let (objects, store) = subject.objects.clone().expect("an object store");
        let bytes = payload("unusual", 3000);
        let key = subject.blobs.put(bytes.clone()).await.unwrap();
        let path = store.path_of(&key);
        assert!(path.as_ref().starts_with(prefix.as_str()), "{path} under {prefix}");
        let meta = objects.head(&path).await.expect("the object under the unusual prefix");
        assert_eq!(meta.size, 3000);
        assert_eq!(subject.blobs.get(&key).await.unwrap(), bytes);
        assert_eq!(subject.blobs.get_range(&key, 100..200).await.unwrap(), bytes.slice(100..200));
        let listed = subject.blobs.list(None, 10).await.unwrap();
        assert_eq!(listed.into_iter().map(|b| b.key).collect::<Vec<_>>(), std::slice::from_ref(&key));
        super::missing_and_deleted_blobs_are_not_found(subject_under(&prefix).expect("S3")).await;
        subject.blobs.delete(&key).await.unwrap();
        assert!(!subject.blobs.exists(&key).await.unwrap());
    }

    /// The gateway checks signatures: a wrong secret is refused (with a storage error, retryable
    /// as every storage error is), and nothing is stored.
    #[tokio::test]
    async fn a_wrong_secret_is_refused() {
        let prefix = prefix("wrong-secret");
        let Some(mut s3) = config(&prefix) else { return };
        s3.secret_access_key = Some(Secret::new("not-the-secret".into()));
        s3.retry_timeout = Duration::from_secs(2);
        let config = BlobConfig { kind: BlobKind::S3, s3, ..BlobConfig::default() };
        let blobs = config.open().unwrap();
        let error = blobs.put(payload("refused", 10)).await.expect_err("a wrong secret stores nothing");
        let chain = format!("{:?}", anyhow_chain(&error));
        assert!(chain.contains("403") || chain.contains("SignatureDoesNotMatch"), "{chain}");
        let honest = subject_under(&prefix).expect("S3");
        assert!(honest.blobs.list(None, 10).await.unwrap().is_empty(), "nothing stored");
    }

    /// Every message in an error's source chain.
    fn anyhow_chain(error: &dyn std::error::Error) -> Vec<String> {
        let mut chain = vec![error.to_string()];
        let mut source = error.source();
        while let Some(next) = source {
            chain.push(next.to_string());
            source = next.source();
        }
        chain
    }
}
