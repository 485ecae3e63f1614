//! `POST /v1/blobs` over real HTTP on 127.0.0.1, bounded while its body arrives: a body that is
//! no image is refused once its head is in, a body over the limit as soon as it says or shows
//! it, and uploads beyond `http.max_uploads` get `503` with `Retry-After`; what is read is read
//! as it streams.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use imagepipe_blob::LocalBlobStore;
use imagepipe_coordinator::api::blobs;
use imagepipe_runtime::Shutdown;
use imagepipe_runtime::http::{ApiRoutes, HealthServer, Readiness, UploadSlots, testing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The limit of the server under test (`download.max_bytes`).
const MAX_BYTES: u64 = 64 * 1024;
/// Longest a test waits for an answer that must come before the body is complete.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// A 1×1 PNG.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89";

/// The blob routes over a fresh store, served through the runtime's HTTP edge with `slots`.
async fn serve(slots: UploadSlots) -> (SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalBlobStore::new(dir.path().join("blobs")));
    let routes = ApiRoutes::new(None);
    routes.add(blobs::router(store, MAX_BYTES, slots));
    let server = HealthServer::new(Readiness::new(), imagepipe_runtime::metrics::install().unwrap()).api(routes);
    let bound = server.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = bound.local_addr();
    tokio::spawn(bound.serve(Shutdown::new()));
    (addr, dir)
}

/// An upload whose head (`POST /v1/blobs`, `Content-Length: declared`) and first `sent` bytes
/// are on the wire, the rest not sent yet.
struct Started {
    stream: TcpStream,
}

impl Started {
    async fn send(addr: SocketAddr, declared: u64, sent: &[u8]) -> Self {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/blobs HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {declared}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(sent).await.unwrap();
        Self { stream }
    }

    /// Sends more of the body.
    async fn more(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// The answer, which must come within [`ANSWER_WITHIN`] with nothing more sent: status,
    /// lowercased head, body.
    async fn answer(mut self) -> testing::Answer {
        let mut response = Vec::new();
        let read = tokio::time::timeout(ANSWER_WITHIN, async {
            // Up to the end of the connection, or of a reset after the answer.
            let mut buffer = [0u8; 4096];
            while let Ok(n) = self.stream.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
                response.extend_from_slice(&buffer[..n]);
            }
        })
        .await;
        assert!(read.is_ok(), "no answer within {ANSWER_WITHIN:?} while the body is unfinished: {response:?}");
        let response = String::from_utf8_lossy(&response);
        let (head, body) = response.split_once("\r\n\r\n").expect("a full HTTP answer");
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
        testing::Answer { status, head: head.to_ascii_lowercase(), body: body.to_owned() }
    }
}

#[tokio::test]
async fn a_body_that_is_no_image_is_refused_once_its_head_is_in() {
    let (addr, _dir) = serve(UploadSlots::new(8, Duration::from_secs(1))).await;
    // Announces 60 KB of text, sends 64 bytes of it, and waits.
    let head = b"<html><body>this is a web page, not an image at all</body></html>";
    let answer = Started::send(addr, MAX_BYTES - 1000, head).await.answer().await;
    assert_eq!(answer.status, 415, "{answer:?}");
    assert!(answer.body.contains("unsupported_media_type") && answer.body.contains("html"), "{}", answer.body);
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_as_soon_as_it_says_or_shows_it() {
    let (addr, _dir) = serve(UploadSlots::new(8, Duration::from_secs(1))).await;
    // Its Content-Length says so: refused before any byte of it.
    let answer = Started::send(addr, MAX_BYTES + 1, b"").await.answer().await;
    assert_eq!(answer.status, 413, "{answer:?}");
    assert!(answer.body.contains("(download.max_bytes)"), "{}", answer.body);

    // Chunked, no length said: refused once the chunks pass the limit, the last never sent.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!("POST /v1/blobs HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let chunk = [PNG, &vec![0u8; 16 * 1024 - PNG.len()]].concat();
    for _ in 0..(MAX_BYTES / chunk.len() as u64 + 1) {
        let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
        if stream.write_all(&framed).await.is_err() {
            break; // answered and closed already
        }
    }
    let answer = Started { stream }.answer().await;
    assert_eq!(answer.status, 413, "{answer:?}");
}

#[tokio::test]
async fn uploads_beyond_the_slots_are_answered_503_with_retry_after() {
    let (addr, _dir) = serve(UploadSlots::new(1, Duration::from_millis(100))).await;
    // One upload holds the only slot: its head is in, its body not finished.
    let body = [PNG, &vec![0u8; 1000]].concat();
    let mut holding = Started::send(addr, body.len() as u64, &body[..PNG.len()]).await;

    // The next upload, whole, waits 100 ms for the slot and is told to come back. Until the
    // first upload has taken the slot, the next one may still get it (and is stored).
    let deadline = tokio::time::Instant::now() + ANSWER_WITHIN;
    let refused = loop {
        let answer = testing::request_with_body(addr, "POST", "/v1/blobs", None, PNG).await;
        if answer.status != 201 || tokio::time::Instant::now() >= deadline {
            break answer;
        }
    };
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.head.contains("retry-after: 1"), "{}", refused.head);
    assert!(refused.body.contains("\"busy\"") && refused.body.contains("http.max_uploads"), "{}", refused.body);

    // The first upload finishes and is stored; its slot is free again.
    holding.more(&body[PNG.len()..]).await;
    let answer = holding.answer().await;
    assert_eq!(answer.status, 201, "{answer:?}");
    let answer = testing::request_with_body(addr, "POST", "/v1/blobs", None, PNG).await;
    assert_eq!(answer.status, 201, "{answer:?}");
}
