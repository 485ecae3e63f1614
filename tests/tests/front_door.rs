//! The coordinator's API as the one front door of the multi-process deployment: with the seven
//! services as separate processes over NATS and Redis, `imagepipe submit`, `search` and
//! `stats` all work against the coordinator's URL alone (as `:8080` in compose), the
//! coordinator forwarding search and stats to their services with the shared token.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use imagepipe_e2e::backend::{Backend, Cleanup};
use imagepipe_e2e::cluster::{self, Cluster, ServiceKind};
use imagepipe_e2e::fixtures::sample_path;
use imagepipe_e2e::scenarios::cluster_config;
use serde_json::Value;

const TOKEN: &str = "front-door-t0ken-0123456789abcdef0123456789";

/// The CLI as a user runs it: `--api` the coordinator, the token from `IMAGEPIPE_TOKEN`.
struct Cli {
    binary: PathBuf,
    api: String,
}

impl Cli {
    async fn run(&self, args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .args(args)
            .args(["--api", &self.api])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("IMAGEPIPE_TOKEN", TOKEN)
            .kill_on_drop(true);
        let output = tokio::time::timeout(Duration::from_secs(120), command.output()).await;
        output.unwrap_or_else(|_| panic!("imagepipe {args:?} did not end within 120 s")).expect("imagepipe runs")
    }

    /// Runs `args` (with `--json`) and parses standard output; panics unless it exits 0.
    async fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let output = self.run(&args).await;
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "imagepipe {args:?}: {}\nstdout: {stdout}\nstderr: {stderr}", output.status);
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("imagepipe {args:?}: {e}: {stdout}"))
    }

    /// Runs `args` until `done` holds for its JSON answer, at most `within`; the last answer.
    async fn json_until(&self, args: &[&str], within: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let until = tokio::time::Instant::now() + within;
        loop {
            let answer = self.json(args).await;
            if done(&answer) || tokio::time::Instant::now() >= until {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_search_and_stats_answer_on_the_coordinators_address_alone() {
    let Some(model_dir) = cluster::model_dir() else { return };
    let backend = Backend::nats();
    let config = cluster_config(backend.clone(), "front", &model_dir).env("IMAGEPIPE_HTTP__AUTH_TOKEN", TOKEN);
    let _cleanup = Cleanup::new(&backend, &config.prefix);
    let cluster = Cluster::start(config).await.expect("cluster");
    let cli = Cli { binary: cluster::bin_dir().join("imagepipe"), api: cluster.url(ServiceKind::Coordinator) };

    let photo = sample_path("chelsea.jpg");
    let finished = cli.json(&["submit", &photo.display().to_string(), "--wait", "--timeout", "120"]).await;
    let task = &finished[0];
    assert_eq!(task["state"], "completed", "{finished}");
    let id = task["id"].as_str().expect("the task id").to_owned();

    // The tag indexer and analytics follow the events: each catches up shortly after.
    let lists_it = |answer: &Value| {
        answer["results"].as_array().is_some_and(|hits| hits.iter().any(|hit| hit["taskId"] == id.as_str()))
    };
    let search = cli.json_until(&["search", "cat"], Duration::from_secs(60), lists_it).await;
    assert!(lists_it(&search), "imagepipe search cat through the coordinator lists {id}: {search}");
    assert_eq!(search["tags"], serde_json::json!(["cat"]), "{search}");

    let counted = |answer: &Value| answer["tasks"]["completed"].as_u64() == Some(1);
    let stats = cli.json_until(&["stats"], Duration::from_secs(60), counted).await;
    assert!(counted(&stats), "imagepipe stats through the coordinator counts the task: {stats}");

    // The tables too, as a person reads them.
    let search = cli.run(&["search", "cat"]).await;
    assert!(search.status.success() && String::from_utf8_lossy(&search.stdout).contains(&id), "{search:?}");
    let stats = cli.run(&["stats"]).await;
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(stats.status.success() && text.contains("completed"), "{stats:?}");

    let failures = cluster.stop(Duration::from_secs(40)).await;
    assert!(failures.is_empty(), "services that did not stop cleanly on SIGTERM: {failures:?}");
}
