//! For tests (the `testing` feature): the `blob.s3` settings of the S3-compatible server the test
//! scripts start (SeaweedFS's S3 gateway, `scripts/seaweedfs.sh`), read from the variables the
//! script exports; and a SeaweedFS of a test's own ([`SeaweedFs`]), for a test that kills it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use imagepipe_secret::Secret;

use crate::S3Config;

/// Where the S3 gateway listens (`http://127.0.0.1:<port>`).
pub const ENDPOINT_ENV: &str = "IMAGEPIPE_TEST_S3_ENDPOINT";
/// The bucket the script created.
pub const BUCKET_ENV: &str = "IMAGEPIPE_TEST_S3_BUCKET";
/// The access key id the gateway admits.
pub const ACCESS_KEY_ID_ENV: &str = "IMAGEPIPE_TEST_S3_ACCESS_KEY_ID";
/// Its secret.
pub const SECRET_ACCESS_KEY_ENV: &str = "IMAGEPIPE_TEST_S3_SECRET_ACCESS_KEY";
/// The `weed` binary `ensure_seaweedfs` installed, for a test that starts a server of its own.
pub const SEAWEEDFS_BIN_ENV: &str = "IMAGEPIPE_TEST_SEAWEEDFS_BIN";

/// The bucket, key id and secret `scripts/seaweedfs.sh` gives every server it starts.
const BUCKET: &str = "imagepipe-test";
const ACCESS_KEY_ID: &str = "imagepipe-test";
const SECRET_ACCESS_KEY: &str = "imagepipe-test-secret";

/// The test server's `blob.s3` settings with blobs under `prefix`, each request retried for up to
/// `retry_timeout`; `None` (after failing, or printing `SKIPPED` under
/// `IMAGEPIPE_TEST_ALLOW_SKIP=1`) when the script provided no server.
pub fn s3_config(prefix: &str, retry_timeout: Duration) -> Option<S3Config> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(endpoint), Some(bucket), Some(id), Some(secret)) =
        (var(ENDPOINT_ENV), var(BUCKET_ENV), var(ACCESS_KEY_ID_ENV), var(SECRET_ACCESS_KEY_ENV))
    else {
        imagepipe_contracts::testing::environment_missing(&format!(
            "no S3 server: {ENDPOINT_ENV}, {BUCKET_ENV}, {ACCESS_KEY_ID_ENV} and {SECRET_ACCESS_KEY_ENV} are unset \
             (source scripts/seaweedfs.sh and run ensure_seaweedfs)"
        ));
        return None;
    };
    Some(S3Config {
        bucket,
        prefix: prefix.to_owned(),
        region: Some("us-east-1".into()),
        endpoint: Some(endpoint),
        access_key_id: Some(id),
        secret_access_key: Some(Secret::new(secret)),
        allow_http: true,
        retry_timeout,
    })
}

/// The `weed` binary of [`SEAWEEDFS_BIN_ENV`], or `None` (after failing, or printing `SKIPPED`
/// under `IMAGEPIPE_TEST_ALLOW_SKIP=1`) when the script installed none.
pub fn seaweedfs_binary() -> Option<String> {
    let bin = std::env::var(SEAWEEDFS_BIN_ENV).ok().filter(|b| Path::new(b).is_file());
    if bin.is_none() {
        imagepipe_contracts::testing::environment_missing(&format!(
            "no SeaweedFS binary: {SEAWEEDFS_BIN_ENV} is unset or not a file (source scripts/seaweedfs.sh and run \
             ensure_seaweedfs)"
        ));
    }
    bin
}

/// A SeaweedFS server of a test's own (its own port and data directory, started with
/// `scripts/seaweedfs.sh`'s `seaweedfs_serve`), which the test may kill and start again over
/// the same data; killed when dropped. Its calls block: call them from `spawn_blocking`.
pub struct SeaweedFs {
    bin: String,
    dir: tempfile::TempDir,
    port: u16,
    pid: Option<u32>,
}

impl SeaweedFs {
    /// Starts one on a spare port over a fresh data directory, with the test bucket.
    pub fn start(bin: String) -> Self {
        let dir = tempfile::Builder::new().prefix("imagepipe-seaweedfs-").tempdir().expect("a data directory");
        let port = imagepipe_contracts::testing::spare_port().expect("a spare port");
        let mut server = Self { bin, dir, port, pid: None };
        server.serve();
        server
    }

    /// Starts the server (again) over its directory and port: returns once the gateway answers
    /// a signed request and the bucket is there.
    pub fn serve(&mut self) {
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
    pub fn kill9(&mut self) {
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

    /// The last 30 lines of its log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// `blob.s3` settings on this server with blobs under `prefix`, `retry_timeout` per request.
    pub fn s3_config(&self, prefix: &str, retry_timeout: Duration) -> S3Config {
        S3Config {
            bucket: BUCKET.into(),
            prefix: prefix.into(),
            region: Some("us-east-1".into()),
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            access_key_id: Some(ACCESS_KEY_ID.into()),
            secret_access_key: Some(Secret::new(SECRET_ACCESS_KEY.into())),
            allow_http: true,
            retry_timeout,
        }
    }
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The script that knows how to start SeaweedFS.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/seaweedfs.sh")
}
