//! Idle memory of the real service binaries: each one found next to the `imagepipe`
//! executable is started over the chosen bus and store (a prefix of its own), and once its
//! `/readyz` answers 200 and it has sat idle a moment, its `VmRSS` is read.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::process::{MemoryField, Pid, memory};

/// Every service binary, with whether it needs the prepared AI model.
pub const BINARIES: [(&str, bool); 7] = [
    ("imagepipe-coordinator", false),
    ("imagepipe-download-worker", false),
    ("imagepipe-metadata-worker", false),
    ("imagepipe-ai-worker", true),
    ("imagepipe-notification-worker", false),
    ("imagepipe-analytics-worker", false),
    ("imagepipe-tag-indexer-worker", false),
];

/// How long a service may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a ready service sits idle before its memory is read.
const SETTLE: Duration = Duration::from_secs(1);
/// How long a service may take to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// One binary's idle resident memory, or why it has none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IdleRss {
    /// Binary name.
    pub binary: String,
    /// `VmRSS` once ready and idle, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Why it was not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// How the binaries are started.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Where the binaries are (the `imagepipe` executable's directory).
    pub dir: PathBuf,
    /// `--config` to pass on, if the bench was given one.
    pub config_file: Option<PathBuf>,
    /// `IMAGEPIPE_*` settings on top of the inherited environment (bus kind, prefix, store).
    pub env: Vec<(String, String)>,
    /// A directory for embedded stores and blobs.
    pub work: PathBuf,
    /// The prepared model, when there is one.
    pub model_dir: Option<PathBuf>,
}

/// Starts every binary of [`BINARIES`] one after the other and measures it.
pub async fn measure(launch: &Launch) -> Vec<IdleRss> {
    let mut out = Vec::with_capacity(BINARIES.len());
    for (binary, needs_model) in BINARIES {
        let skipped = |why: String| IdleRss { binary: binary.to_owned(), rss_bytes: None, skipped: Some(why) };
        let path = launch.dir.join(binary);
        if !path.is_file() {
            out.push(skipped(format!("not built next to imagepipe ({})", launch.dir.display())));
            continue;
        }
        if needs_model && launch.model_dir.is_none() {
            out.push(skipped("no prepared model (scripts/prepare-model.sh)".into()));
            continue;
        }
        out.push(match one(&path, binary, launch).await {
            Ok(rss) => IdleRss { binary: binary.to_owned(), rss_bytes: Some(rss), skipped: None },
            Err(why) => skipped(why),
        });
    }
    out
}

async fn one(path: &Path, binary: &str, launch: &Launch) -> Result<u64, String> {
    let port = free_port().map_err(|e| format!("no free port: {e}"))?;
    let mut command = Command::new(path);
    if let Some(file) = &launch.config_file {
        command.arg("--config").arg(file);
    }
    command
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .env("IMAGEPIPE_HTTP__BIND", "127.0.0.1")
        .env("IMAGEPIPE_HTTP__PORT", port.to_string())
        .env("IMAGEPIPE_STORE__PATH", launch.work.join(binary).join("store"))
        .env("IMAGEPIPE_BLOB__DIR", launch.work.join("blobs"))
        .env("IMAGEPIPE_LOG__FILTER", "warn")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(model) = &launch.model_dir {
        command.env("IMAGEPIPE_AI__MODEL_DIR", model);
    }
    let mut child = command.spawn().map_err(|e| format!("starting it: {e}"))?;
    let measured = async {
        wait_ready(&mut child, port).await?;
        tokio::time::sleep(SETTLE).await;
        let pid = child.id().ok_or("it exited")?;
        memory(Pid::Other(pid), MemoryField::Resident).ok_or_else(|| "no /proc/<pid>/status".to_owned())
    }
    .await;
    stop(&mut child).await;
    measured
}

async fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/readyz");
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                use tokio::io::AsyncReadExt;
                let _ = pipe.read_to_string(&mut stderr).await;
            }
            let last = stderr.lines().last().unwrap_or_default().to_owned();
            return Err(format!("exited before it was ready ({status}): {last}"));
        }
        let ready = client.get(&url).timeout(Duration::from_secs(1)).send().await;
        if ready.is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("not ready within {READY_TIMEOUT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGTERM (through `kill`, the services' orderly stop), then SIGKILL after [`STOP_TIMEOUT`].
async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
        if tokio::time::timeout(STOP_TIMEOUT, child.wait()).await.is_ok() {
            return;
        }
    }
    let _ = child.kill().await;
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binaries_that_are_not_built_or_lack_the_model_are_skipped_with_the_reason() {
        let work = tempfile::tempdir().unwrap();
        let launch = Launch {
            dir: work.path().to_owned(),
            config_file: None,
            env: Vec::new(),
            work: work.path().to_owned(),
            model_dir: None,
        };
        std::fs::write(work.path().join("imagepipe-ai-worker"), "").unwrap();
        let measured = measure(&launch).await;
        assert_eq!(measured.len(), BINARIES.len());
        for idle in &measured {
            assert_eq!(idle.rss_bytes, None);
            let why = idle.skipped.as_deref().unwrap();
            if idle.binary == "imagepipe-ai-worker" {
                assert!(why.contains("no prepared model"), "{why}");
            } else {
                assert!(why.contains("not built"), "{why}");
            }
        }
    }
}
