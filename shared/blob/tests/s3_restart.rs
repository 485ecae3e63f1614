//! S3 through a SeaweedFS crash: a SeaweedFS of this test's own (its own ports and data
//! directory, started with `scripts/seaweedfs.sh`'s `seaweedfs_serve` and the binary
//! `ensure_seaweedfs` installed, `IMAGEPIPE_TEST_SEAWEEDFS_BIN`) is killed with SIGKILL while a
//! writer stores blobs, and started again over the same data. Every blob whose put was
//! acknowledged before is there after, byte for byte; the puts during the outage fail with a
//! retryable storage error naming the object; the puts after succeed. Without the binary the
//! test fails, or skips with `IMAGEPIPE_TEST_ALLOW_SKIP=1`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use imagepipe_blob::testing::SeaweedFs;
use imagepipe_blob::{BlobConfig, BlobError, BlobKey, BlobKind, BlobStore, MULTIPART_PART_SIZE};

/// How long the writer's puts are retried.
const RETRY_TIMEOUT: Duration = Duration::from_secs(8);

/// A blob store on `server`, `retry_timeout` per request.
fn open(server: &SeaweedFs, prefix: &str, retry_timeout: Duration) -> Arc<dyn BlobStore> {
    BlobConfig { kind: BlobKind::S3, s3: server.s3_config(prefix, retry_timeout), ..BlobConfig::default() }
        .open()
        .expect("blob.s3 opens")
}

/// What the writer saw.
#[derive(Default)]
struct Writes {
    /// Blobs whose put returned their key, with their bytes.
    acknowledged: Vec<(BlobKey, Bytes)>,
    /// The errors of the puts that failed, with when, whether retryable and how long the put
    /// tried.
    failed: Vec<(Instant, String, bool, Duration)>,
}

fn blob(i: usize) -> Bytes {
    // Every 10th blob is one of two parts (a multipart upload), the rest are small.
    let len = if i % 10 == 0 { MULTIPART_PART_SIZE + 4096 } else { 2048 + i };
    let seed = format!("restart {i} {}", uuid::Uuid::new_v4());
    let block = BlobKey::of(seed.as_bytes()).hex().as_bytes().to_vec();
    Bytes::from(block.iter().cycle().take(len).copied().collect::<Vec<u8>>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seaweedfs_restart_loses_no_acknowledged_blob() {
    let Some(bin) = imagepipe_blob::testing::seaweedfs_binary() else { return };
    let mut server = tokio::task::spawn_blocking(move || SeaweedFs::start(bin)).await.unwrap();
    let prefix = format!("restart-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    // Short retries: a put during the outage fails within seconds rather than after minutes,
    // but only once `retry_timeout` ran out (not after a count of quick retries).
    let blobs = open(&server, &prefix, RETRY_TIMEOUT);

    let writes = Arc::new(Mutex::new(Writes::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (blobs, writes, stop) = (blobs.clone(), writes.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let bytes = blob(i);
                i += 1;
                let started = Instant::now();
                match blobs.put(bytes.clone()).await {
                    Ok(key) => writes.lock().unwrap().acknowledged.push((key, bytes)),
                    Err(error) => {
                        let retryable = error.is_retryable();
                        let message = chain(&error);
                        writes.lock().unwrap().failed.push((Instant::now(), message, retryable, started.elapsed()));
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        })
    };
    let acknowledged = |writes: &Mutex<Writes>| writes.lock().unwrap().acknowledged.len();

    wait_for(Duration::from_secs(60), || acknowledged(&writes) >= 25).await.expect("25 blobs stored before the crash");
    let before = acknowledged(&writes);
    let killed_at = Instant::now();
    server = tokio::task::spawn_blocking(move || {
        server.kill9();
        server
    })
    .await
    .unwrap();
    wait_for(Duration::from_secs(60), || writes.lock().unwrap().failed.iter().any(|(at, ..)| *at > killed_at))
        .await
        .expect("a put failed while SeaweedFS was down");
    let down = acknowledged(&writes);
    server = tokio::task::spawn_blocking(move || {
        server.serve();
        server
    })
    .await
    .unwrap();
    let restarted_at = Instant::now();
    wait_for(Duration::from_secs(60), || acknowledged(&writes) >= down + 15)
        .await
        .expect("puts succeed after the restart");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.await.unwrap();

    let writes = std::mem::take(&mut *writes.lock().unwrap());
    let during: Vec<_> = writes.failed.iter().filter(|(at, ..)| *at > killed_at && *at < restarted_at).collect();
    assert!(!during.is_empty(), "puts failed during the outage");
    for (_, message, retryable, tried) in &writes.failed {
        assert!(*retryable, "a put during the outage fails with a retryable error: {message}");
        assert!(
            *tried >= RETRY_TIMEOUT,
            "a put failed after {tried:?}, before retry_timeout ({RETRY_TIMEOUT:?}): {message}"
        );
        assert!(message.contains(&format!("blob store I/O on {prefix}/")), "the error names the object: {message}");
    }
    eprintln!(
        "{before} blobs acknowledged before SIGKILL, {} in all; {} puts failed during the outage, e.g. {}",
        writes.acknowledged.len(),
        writes.failed.len(),
        writes.failed[0].1
    );

    // Every acknowledged blob, before the crash and after, reads back whole, from a new client.
    let reader = open(&server, &prefix, Duration::from_secs(20));
    for (key, bytes) in &writes.acknowledged {
        let read =
            reader.get(key).await.unwrap_or_else(|e| panic!("{key}, acknowledged, after the restart: {}", chain(&e)));
        assert_eq!(&read, bytes, "{key}");
    }
    let mut listed = Vec::new();
    let mut after = None;
    loop {
        let page = reader.list(after.as_ref(), 100).await.unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        listed.extend(page.into_iter().map(|b| b.key));
    }
    for (key, _) in &writes.acknowledged {
        assert!(listed.contains(key), "{key} listed after the restart");
    }
    for key in listed {
        reader.delete(&key).await.unwrap();
    }
}

/// An error and its sources, `: `-joined.
fn chain(error: &BlobError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(next) = source {
        text.push_str(": ");
        text.push_str(&next.to_string());
        source = next.source();
    }
    text
}

/// Polls `done` every 100 ms until it holds (`Some`) or `deadline` passes (`None`).
async fn wait_for(deadline: Duration, mut done: impl FnMut() -> bool) -> Option<()> {
    let until = Instant::now() + deadline;
    while Instant::now() < until {
        if done() {
            return Some(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}
