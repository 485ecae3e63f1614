//! S3 through a SeaweedFS crash: a SeaweedFS of this test's own (its own ports and data
//! directory, started with `scripts/seaweedfs.sh`'s `seaweedfs_serve` and the binary
//! `ensure_seaweedfs` installed, `IMAGEPIPE_TEST_SEAWEEDFS_BIN`) is killed with SIGKILL while a
//! writer stores blobs, and started again over the same data. Every blob whose put was
//! acknowledged before is there after, byte for byte; the puts during the outage fail with a
//! retryable storage error naming the object; the puts after succeed. Without the binary the
//! test fails, or skips with `IMAGEPIPE_TEST_ALLOW_SKIP=1`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use imagepipe_blob::{BlobConfig, BlobError, BlobKey, BlobKind, BlobStore, MULTIPART_PART_SIZE, S3Config};
use imagepipe_secret::Secret;

/// The script that knows how to start SeaweedFS.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/seaweedfs.sh")
}

/// A SeaweedFS server of this test's own, killed when dropped.
struct Server {
    bin: String,
    dir: tempfile::TempDir,
    port: u16,
    pid: Option<u32>,
}

impl Server {
    /// Starts one on a spare port over a fresh data directory, with the test bucket.
    fn start(bin: String) -> Self {
        let dir = tempfile::Builder::new().prefix("imagepipe-seaweedfs-").tempdir().expect("a data directory");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut server = Self { bin, dir, port, pid: None };
        server.serve();
        server
    }

    /// `seaweedfs_serve` over this server's directory and port: returns once the gateway answers
    /// a signed request and the bucket is there.
    fn serve(&mut self) {
        let output = Command::new("bash")
            .arg("-c")
            .arg(r#"source "$1" && seaweedfs_serve "$2" "$3" "$4""#)
            .arg("seaweedfs-serve")
            .arg(script())
            .arg(&self.bin)
            .arg(self.dir.path())
            .arg(self.port.to_string())
            .output()
            .expect("running bash");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "seaweedfs_serve failed: {}\n{stdout}\n{}\nlog:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr),
            self.log_tail()
        );
        self.pid = Some(stdout.trim().parse().unwrap_or_else(|_| panic!("a pid from seaweedfs_serve: {stdout:?}")));
    }

    /// SIGKILL, then waits until the process is gone (not even a zombie holding its locks).
    fn kill9(&mut self) {
        let Some(pid) = self.pid.take() else { return };
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.split_whitespace().nth(2).is_none_or(|state| state == "Z") {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("SeaweedFS (pid {pid}) still runs 30 s after SIGKILL");
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// A blob store on this server, `retry_timeout` per request.
    fn blobs(&self, prefix: &str, retry_timeout: Duration) -> Arc<dyn BlobStore> {
        let s3 = S3Config {
            bucket: "imagepipe-test".into(),
            prefix: prefix.into(),
            region: Some("us-east-1".into()),
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            access_key_id: Some("imagepipe-test".into()),
            secret_access_key: Some(Secret::new("imagepipe-test-secret".into())),
            allow_http: true,
            retry_timeout,
        };
        BlobConfig { kind: BlobKind::S3, s3, ..BlobConfig::default() }.open().expect("blob.s3 opens")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// What the writer saw.
#[derive(Default)]
struct Writes {
    /// Blobs whose put returned their key, with their bytes.
    acknowledged: Vec<(BlobKey, Bytes)>,
    /// The errors of the puts that failed, with when.
    failed: Vec<(Instant, String, bool)>,
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
    let Some(bin) = std::env::var("IMAGEPIPE_TEST_SEAWEEDFS_BIN").ok().filter(|b| Path::new(b).is_file()) else {
        imagepipe_contracts::testing::environment_missing(
            "no SeaweedFS binary: IMAGEPIPE_TEST_SEAWEEDFS_BIN is unset or not a file (source scripts/seaweedfs.sh \
             and run ensure_seaweedfs)",
        );
        return;
    };
    let mut server = tokio::task::spawn_blocking(move || Server::start(bin)).await.unwrap();
    let prefix = format!("restart-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    // Short retries: a put during the outage fails within seconds rather than after minutes.
    let blobs = server.blobs(&prefix, Duration::from_secs(2));

    let writes = Arc::new(Mutex::new(Writes::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (blobs, writes, stop) = (blobs.clone(), writes.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let bytes = blob(i);
                i += 1;
                match blobs.put(bytes.clone()).await {
                    Ok(key) => writes.lock().unwrap().acknowledged.push((key, bytes)),
                    Err(error) => {
                        let retryable = error.is_retryable();
                        let message = chain(&error);
                        writes.lock().unwrap().failed.push((Instant::now(), message, retryable));
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
    for (_, message, retryable) in &writes.failed {
        assert!(*retryable, "a put during the outage fails with a retryable error: {message}");
        assert!(message.contains(&format!("blob store I/O on {prefix}/")), "the error names the object: {message}");
    }
    eprintln!(
        "{before} blobs acknowledged before SIGKILL, {} in all; {} puts failed during the outage, e.g. {}",
        writes.acknowledged.len(),
        writes.failed.len(),
        writes.failed[0].1
    );

    // Every acknowledged blob, before the crash and after, reads back whole, from a new client.
    let reader = server.blobs(&prefix, Duration::from_secs(20));
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
