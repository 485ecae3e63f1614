//! `GET /v1/blobs/{key}` over an object store, over real HTTP on 127.0.0.1: the blob is streamed
//! (its `Content-Length` from the object's size, its type from its first bytes), and an object
//! whose bytes do not hash to its key never arrives as a complete answer: the body ends short.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use imagepipe_blob::{BlobError, BlobKey, BlobStore, BlobStream, ObjectBlobStore, StoredBlob};
use imagepipe_coordinator::api::blobs;
use imagepipe_runtime::Shutdown;
use imagepipe_runtime::http::{ApiRoutes, HealthServer, Readiness, UploadSlots};
use object_store::ObjectStore;
use object_store::memory::InMemory;

/// A PNG signature followed by `len` bytes that differ per `seed`.
fn png_like(seed: u8, len: usize) -> Bytes {
    let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89".to_vec();
    bytes.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    Bytes::from(bytes)
}

async fn serve(store: Arc<dyn BlobStore>) -> SocketAddr {
    let routes = ApiRoutes::new(None);
    routes.add(blobs::router(store, 1024, UploadSlots::new(2, Duration::from_secs(1))));
    let server = HealthServer::new(Readiness::new(), imagepipe_runtime::metrics::install().unwrap()).api(routes);
    let bound = server.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = bound.local_addr();
    tokio::spawn(bound.serve(Shutdown::new()));
    addr
}

#[tokio::test]
async fn blobs_stream_from_the_object_store_and_a_corrupt_one_ends_short() {
    let objects = Arc::new(InMemory::new());
    let store = ObjectBlobStore::new(objects.clone(), "blobs");
    let addr = serve(Arc::new(store.clone())).await;
    let client = reqwest::Client::new();

    let bytes = png_like(1, 3 * 1024 * 1024);
    let key = store.put(bytes.clone()).await.unwrap();
    let read = client.get(format!("http://{addr}/v1/blobs/{key}")).send().await.unwrap();
    assert_eq!(read.status(), reqwest::StatusCode::OK);
    assert_eq!(read.headers()["content-type"], "image/png");
    assert_eq!(read.headers()["content-length"], bytes.len().to_string().as_str());
    assert_eq!(read.bytes().await.unwrap(), bytes);

    // Shorter than the bytes the route reads to type it: the stream ends while they are read.
    let tiny = png_like(3, 0);
    let tiny_key = store.put(tiny.clone()).await.unwrap();
    let read = client.get(format!("http://{addr}/v1/blobs/{tiny_key}")).send().await.unwrap();
    assert_eq!(read.headers()["content-type"], "image/png");
    assert_eq!(read.bytes().await.unwrap(), tiny);

    let missing = client.get(format!("http://{addr}/v1/blobs/sha256:{}", "0".repeat(64))).send().await.unwrap();
    assert_eq!(missing.status(), reqwest::StatusCode::NOT_FOUND);

    // Same size, same signature, other bytes. The in-memory store sends an object in one chunk,
    // so the route sees the end (and the mismatch) before it answers: 503.
    objects.put(&store.path_of(&key), png_like(2, 3 * 1024 * 1024).into()).await.unwrap();
    let read = client.get(format!("http://{addr}/v1/blobs/{key}")).send().await.unwrap();
    assert_eq!(read.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
}

/// A store whose `read` streams `tampered` in 64 KiB chunks as the blob under its key, as an
/// object store sends a large object; everything else goes to `inner`.
struct Tampered {
    inner: ObjectBlobStore,
    tampered: Bytes,
}

#[async_trait::async_trait]
impl BlobStore for Tampered {
    async fn put(&self, bytes: Bytes) -> Result<BlobKey, BlobError> {
        self.inner.put(bytes).await
    }
    async fn get_unchecked(&self, key: &BlobKey) -> Result<Bytes, BlobError> {
        self.inner.get_unchecked(key).await
    }
    async fn read(&self, key: &BlobKey) -> Result<BlobStream, BlobError> {
        let chunks: Vec<Result<Bytes, BlobError>> =
            self.tampered.chunks(64 * 1024).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let stream = futures::stream::iter(chunks).boxed();
        Ok(BlobStream::verified(key.clone(), self.tampered.len() as u64, stream))
    }
    async fn exists(&self, key: &BlobKey) -> Result<bool, BlobError> {
        self.inner.exists(key).await
    }
    async fn delete(&self, key: &BlobKey) -> Result<(), BlobError> {
        self.inner.delete(key).await
    }
    async fn modified(&self, key: &BlobKey) -> Result<Option<std::time::SystemTime>, BlobError> {
        self.inner.modified(key).await
    }
    async fn list(&self, after: Option<&BlobKey>, max: usize) -> Result<Vec<StoredBlob>, BlobError> {
        self.inner.list(after, max).await
    }
}

#[tokio::test]
async fn a_corrupt_blob_streamed_in_chunks_never_arrives_whole() {
    let inner = ObjectBlobStore::new(Arc::new(InMemory::new()), "");
    let key = BlobKey::of(&png_like(1, 3 * 1024 * 1024));
    let tampered = png_like(2, 3 * 1024 * 1024);
    let addr = serve(Arc::new(Tampered { inner, tampered: tampered.clone() })).await;
    let read = reqwest::get(format!("http://{addr}/v1/blobs/{key}")).await.unwrap();
    // The headers went out with the first chunks; the last chunk never does.
    assert_eq!(read.status(), reqwest::StatusCode::OK);
    assert_eq!(read.headers()["content-length"], tampered.len().to_string().as_str());
    let body = read.bytes().await;
    assert!(body.is_err(), "a corrupt blob's body must not arrive whole: got {:?} bytes", body.map(|b| b.len()));
}
