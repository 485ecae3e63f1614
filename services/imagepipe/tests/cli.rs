//! The `imagepipe` binary's API commands against an in-process pipeline on 127.0.0.1:0.

mod common;

use std::process::Output;

use imagepipe::Pipeline;

/// Runs the binary with `args` (off the async runtime's threads).
async fn imagepipe(args: Vec<String>) -> Output {
    imagepipe_with_env(args, Vec::new()).await
}

/// Runs the binary with `args` and the environment variables `env` besides the test's own
/// (without any `IMAGEPIPE_API`/`IMAGEPIPE_TOKEN` the test process may have).
async fn imagepipe_with_env(args: Vec<String>, env: Vec<(&'static str, String)>) -> Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_imagepipe"))
            .args(args)
            .env_remove("IMAGEPIPE_API")
            .env_remove("IMAGEPIPE_TOKEN")
            .envs(env)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_status_and_dlq_go_through_the_api_and_errors_are_one_line() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(common::settings(&model_dir, &work)).await.unwrap();
    let api = pipeline.api_url();
    let photo = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/coffee.jpg");

    let out = imagepipe(args(&["submit", photo, "--wait", "--json", "--api", &api])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let finished: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(finished[0]["state"], "completed", "{finished}");
    let id = finished[0]["id"].as_str().unwrap().to_owned();

    let out = imagepipe(args(&["status", &id, "--api", &api])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let status = text(&out.stdout);
    assert!(status.contains("completed") && status.contains("espresso"), "{status}");

    let out = imagepipe(args(&["status", &id, "--json", "--api", &api])).await;
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["id"], id.as_str());

    // A reader that has stopped reading (`imagepipe status ID | head -3`): a quiet exit 0.
    for command in [vec!["status", &id], vec!["status", &id, "--json"], vec!["dlq", "list"]] {
        let api = api.clone();
        let command: Vec<String> = command.iter().map(|s| (*s).to_owned()).collect();
        let out = tokio::task::spawn_blocking(move || {
            let (reader, writer) = std::io::pipe().unwrap();
            drop(reader);
            std::process::Command::new(env!("CARGO_BIN_EXE_imagepipe"))
                .args(&command)
                .args(["--api", &api])
                .env_remove("IMAGEPIPE_TOKEN")
                .stdout(writer)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert_eq!((out.status.code(), text(&out.stderr)), (Some(0), String::new()), "a closed pipe");
    }

    let out = imagepipe(args(&["dlq", "list", "--json", "--api", &api])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(), serde_json::json!([]));

    let out = imagepipe(args(&["status", "tsk_nope", "--api", &api])).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("404") && err.contains("no task tsk_nope"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");

    let out = imagepipe(args(&["submit", "/no/such/file.jpg", "--api", &api])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/no/such/file.jpg"), "{}", text(&out.stderr));

    pipeline.stop().await.unwrap();

    let out = imagepipe(args(&["status", &id, "--api", &api])).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("cannot reach the imagepipe API") && err.trim_end().lines().count() == 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_takes_the_api_and_its_token_from_the_environment() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let mut settings = common::settings(&model_dir, &work);
    settings.http.auth_token = Some("cli-t0ken".to_owned().into());
    let pipeline = Pipeline::start(settings).await.unwrap();
    let api = pipeline.api_url();

    let out = imagepipe_with_env(args(&["stats", "--json"]), vec![("IMAGEPIPE_API", api.clone())]).await;
    assert_eq!(out.status.code(), Some(1), "no token: {}", text(&out.stdout));
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));

    let env = vec![("IMAGEPIPE_API", api.clone()), ("IMAGEPIPE_TOKEN", "cli-t0ken".to_owned())];
    let out = imagepipe_with_env(args(&["stats", "--json"]), env).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(stats["tasks"].is_object(), "{stats}");

    let out = imagepipe_with_env(args(&["--help"]), vec![("IMAGEPIPE_TOKEN", "cli-t0ken".to_owned())]).await;
    assert!(!text(&out.stdout).contains("cli-t0ken"), "the token is not shown in --help");
    pipeline.stop().await.unwrap();
}
