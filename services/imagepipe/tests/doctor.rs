//! `imagepipe doctor` against the real brokers and Redis of the test environment (NATS on
//! 127.0.0.1:4222, Tansu on 127.0.0.1:9092, Redis on 127.0.0.1:6379), each test on a prefix of
//! its own; and the command line's small frictions: `config print --json`, an error's cause
//! printed once.

mod common;

use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use imagepipe_bus::kafka::KafkaBus;
use imagepipe_bus::nats::NatsBus;
use imagepipe_bus::{ConsumerConfig, KafkaConfig, NatsConfig, TaskQueue};
use imagepipe_contracts::names::queues;
use serde_json::Value;

/// The Kafka broker the tests use (`IMAGEPIPE_TEST_KAFKA_BROKERS` overrides).
fn kafka_brokers() -> String {
    std::env::var("IMAGEPIPE_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn nats_config() -> NatsConfig {
    NatsConfig { url: common::nats_url(), connect_timeout: Duration::from_secs(3), ..NatsConfig::default() }
}

fn kafka_config() -> KafkaConfig {
    KafkaConfig {
        brokers: kafka_brokers(),
        partitions: 1,
        session_timeout: Duration::from_secs(6),
        heartbeat_interval: Duration::from_millis(500),
        ..KafkaConfig::default()
    }
}

/// A prefix no other test uses, starting with `start`.
fn unique_prefix(start: &str) -> String {
    format!("{start}_{}", uuid::Uuid::new_v4().simple())
}

/// `imagepipe ARGS` in `dir` with exactly the environment `env` (nothing of the test
/// process's own `IMAGEPIPE_*` settings), off the async runtime's threads.
async fn imagepipe(dir: &Path, args: &[&str], env: Vec<(&str, String)>) -> Output {
    let (dir, args) = (dir.to_owned(), args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>());
    let env: Vec<(String, String)> = env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_imagepipe"))
            .args(args)
            .current_dir(dir)
            .env_clear()
            .envs(env)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The environment of a doctor run on NATS with Redis and the prepared model.
fn nats_env(prefix: &str, model_dir: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("IMAGEPIPE_BUS__KIND", "nats".into()),
        ("IMAGEPIPE_BUS__NATS__URL", common::nats_url()),
        ("IMAGEPIPE_BUS__PREFIX", prefix.into()),
        ("IMAGEPIPE_STORE__KIND", "redis".into()),
        ("IMAGEPIPE_STORE__REDIS__URL", "redis://127.0.0.1:6379".into()),
        ("IMAGEPIPE_AI__MODEL_DIR", model_dir.display().to_string()),
    ]
}

/// The line of check `name` (`FAIL  stream X ...`), which must exist.
fn line<'a>(stdout: &'a str, level: &str, name: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(level) && l[4..].trim_start().starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no `{level} {name}` line in:\n{stdout}"))
}

#[tokio::test]
async fn on_nats_with_the_prefix_streams_and_consumers_present_every_check_passes() {
    let Some(model_dir) = common::model_dir() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique_prefix("doctor_ok");
    let bus = NatsBus::connect(&prefix, &nats_config()).await.expect("NATS on 127.0.0.1:4222 (scripts/nats.sh)");
    let mut consumers = Vec::new();
    for queue in queues::ALL {
        consumers.push(bus.consume(queue, ConsumerConfig::default()).await.unwrap());
    }
    bus.send(queues::DOWNLOAD, imagepipe_bus::Message::new("waiting").with_key("k")).await.unwrap();

    let out = imagepipe(dir.path(), &["doctor"], nats_env(&prefix, &model_dir)).await;
    let stdout = text(&out.stdout);
    let streams = bus.stream_names();
    bus.delete_streams().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    for stream in &streams {
        line(&stdout, "ok", &format!("stream {stream}"));
    }
    assert!(line(&stdout, "ok", "stream").contains(&format!("captures {prefix}.tasks.>")), "{stdout}");
    assert!(line(&stdout, "ok", "consumer tasks.download").contains("lag 1 (waiting)"), "{stdout}");
    assert!(line(&stdout, "ok", "store").contains("answers PING"), "{stdout}");
    assert!(line(&stdout, "ok", "model").contains("files match manifest.json"), "{stdout}");
    for name in ["config", "bus", "allow-list download", "allow-list notification", "blob store"] {
        line(&stdout, "ok", name);
    }
    assert!(!stdout.lines().any(|l| l.starts_with("FAIL")), "{stdout}");
    drop(consumers);
}

#[tokio::test]
async fn on_nats_a_prefix_without_streams_fails_with_the_fix_and_the_prefix_that_has_them() {
    let Some(model_dir) = common::model_dir() else { return };
    let dir = tempfile::tempdir().unwrap();
    // Sorted first among the prefixes of the server, so it is among those named.
    let live = unique_prefix("a_doctor_live");
    let bus = NatsBus::connect(&live, &nats_config()).await.expect("NATS on 127.0.0.1:4222 (scripts/nats.sh)");
    let missing = unique_prefix("doctor_missing");

    let out = imagepipe(dir.path(), &["doctor"], nats_env(&missing, &model_dir)).await;
    let json = imagepipe(dir.path(), &["doctor", "--json"], nats_env(&missing, &model_dir)).await;
    let live_tasks = bus.stream_names()[0].clone();
    bus.delete_streams().await.unwrap();

    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let tasks = line(&stdout, "FAIL", &format!("stream {}_TASKS", missing.to_uppercase()));
    assert!(tasks.contains(&format!("a publish on {missing}.tasks.submit is lost")), "{tasks}");
    assert!(tasks.contains("fix: start the coordinator"), "{tasks}");
    assert!(tasks.contains("bus.prefix (IMAGEPIPE_BUS__PREFIX)"), "{tasks}");
    let other = line(&stdout, "warn", &format!("prefix {live}"));
    assert!(
        other.contains(&format!(
            "publishes on {live}.tasks.submit are captured by stream {live_tasks} of prefix {live}; this config uses \
             prefix {missing}: publish on {missing}.tasks.submit"
        )),
        "{other}"
    );

    assert_eq!(json.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&json.stdout).expect("--json prints JSON");
    assert_eq!(report["ok"], false);
    let failed: Vec<&Value> = report["checks"].as_array().unwrap().iter().filter(|c| c["level"] == "fail").collect();
    assert_eq!(failed.len(), 3, "the three streams: {report}");
    assert!(failed.iter().all(|c| c["fix"].as_str().is_some_and(|f| f.contains("IMAGEPIPE_BUS__PREFIX"))));
}

#[tokio::test]
async fn on_kafka_the_topics_of_the_prefix_and_the_lag_of_its_groups_are_checked() {
    let Some(model_dir) = common::model_dir() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique_prefix("doctor_kafka");
    let env = |prefix: &str| {
        vec![
            ("IMAGEPIPE_BUS__KIND", "kafka".to_owned()),
            ("IMAGEPIPE_BUS__KAFKA__BROKERS", kafka_brokers()),
            ("IMAGEPIPE_BUS__PREFIX", prefix.to_owned()),
            ("IMAGEPIPE_AI__MODEL_DIR", model_dir.display().to_string()),
        ]
    };
    let before = imagepipe(dir.path(), &["doctor"], env(&prefix)).await;
    let before_out = text(&before.stdout);
    assert_eq!(before.status.code(), Some(1), "{before_out}{}", text(&before.stderr));
    let submit = line(&before_out, "FAIL", &format!("topic {prefix}.tasks.submit"));
    assert!(submit.contains("bus.prefix (IMAGEPIPE_BUS__PREFIX)"), "{submit}");

    let bus = KafkaBus::connect(&prefix, &kafka_config()).await.expect("Kafka on 127.0.0.1:9092 (scripts/kafka.sh)");
    let consumer = bus.consume(queues::SUBMIT, ConsumerConfig::default()).await.unwrap();
    let after = imagepipe(dir.path(), &["doctor"], env(&prefix)).await;
    drop(consumer);
    let topics = bus.topics();
    bus.shutdown().await;
    KafkaBus::delete_topics(&kafka_config(), &topics).await.unwrap();

    let after_out = text(&after.stdout);
    line(&after_out, "ok", &format!("topic {prefix}.tasks.submit"));
    line(&after_out, "ok", &format!("topic {prefix}.events.task"));
    assert!(line(&after_out, "ok", "consumer tasks.submit").contains("lag 0"), "{after_out}");
    line(&after_out, "warn", "consumer tasks.download");
    line(&after_out, "warn", "store kind");
    assert!(!after_out.lines().any(|l| l.starts_with("FAIL")), "{after_out}");
}

#[tokio::test]
async fn a_bad_allow_list_cidr_fails_naming_the_key_and_its_variable() {
    let dir = tempfile::tempdir().unwrap();
    let env = vec![("IMAGEPIPE_NET__ALLOW_CIDRS", "10.0.0.0/8,not-a-cidr".to_owned())];
    let out = imagepipe(dir.path(), &["doctor"], env).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let config = line(&stdout, "FAIL", "config");
    assert!(config.contains("net.allow_cidrs[1]") && config.contains("\"not-a-cidr\""), "{config}");
    assert!(config.contains("IMAGEPIPE_NET__ALLOW_CIDRS"), "{config}");
    for client in ["download", "notification"] {
        let allow = line(&stdout, "FAIL", &format!("allow-list {client}"));
        assert!(
            allow.contains("fix: list CIDRs such as 10.0.0.0/8 in net.allow_cidrs[1] (IMAGEPIPE_NET__ALLOW_CIDRS)"),
            "{allow}"
        );
    }
    line(&stdout, "ok", "bus");
}

#[tokio::test]
async fn a_missing_model_dir_fails_naming_the_preparation_script() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("no-models");
    let env = vec![("IMAGEPIPE_AI__MODEL_DIR", models.display().to_string())];
    let out = imagepipe(dir.path(), &["doctor"], env).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let model = line(&stdout, "FAIL", "model");
    assert!(model.contains("scripts/prepare-model.sh"), "{model}");
    assert!(model.contains("ai.model_dir (IMAGEPIPE_AI__MODEL_DIR)"), "{model}");
    assert!(model.contains(&models.display().to_string()), "{model}");
}

#[tokio::test]
async fn config_print_json_is_the_effective_settings_with_secrets_masked() {
    let dir = tempfile::tempdir().unwrap();
    let env = vec![
        ("IMAGEPIPE_STORE__REDIS__URL", "redis://app:redis-pw@cache:6379".to_owned()),
        ("IMAGEPIPE_HTTP__AUTH_TOKEN", "api-token-0123456789abcdef0123456789".to_owned()),
        ("IMAGEPIPE_BUS__PREFIX", "prod".to_owned()),
    ];
    let out = imagepipe(dir.path(), &["config", "print", "--json"], env).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(!stdout.contains("redis-pw") && !stdout.contains("api-token"), "{stdout}");
    let settings: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(settings["bus"]["prefix"], "prod");
    assert_eq!(settings["store"]["redis"]["url"], "redis://***@cache:6379");
    assert_eq!(settings["http"]["auth_token"], "***");
    assert_eq!(settings["worker"]["ack_wait"], "30s");
}

#[tokio::test]
async fn an_unreachable_api_is_one_line_that_names_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port();
    let api = format!("http://127.0.0.1:{port}");
    let out = imagepipe(dir.path(), &["status", "tsk_nowhere", "--api", &api], Vec::new()).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot reach the imagepipe API"), "{stderr}");
    assert_eq!(stderr.matches("error sending request").count(), 1, "the cause is printed once: {stderr}");
}

/// `doctor --config FILE` (after the command, as docs/cli.md writes it) reads that file; a store
/// whose files another process holds (here: this test process) fails, naming `store.path`.
#[tokio::test]
async fn doctor_takes_config_after_the_command_and_fails_a_store_another_process_holds() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let config = dir.path().join("imagepipe.toml");
    std::fs::write(&config, format!("[store]\npath = {store:?}\n[net]\nallow_cidrs = [\"not-a-cidr\"]\n")).unwrap();
    let held = imagepipe_runtime::embedded::EmbeddedDb::open(&store.join("coordinator.redb")).unwrap();
    let out = imagepipe(dir.path(), &["doctor", "--config", config.to_str().unwrap()], Vec::new()).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let config_line = line(&stdout, "FAIL", "config");
    assert!(config_line.contains("net.allow_cidrs[0]"), "the file was read: {config_line}");
    let store_line = line(&stdout, "FAIL", "store");
    assert!(
        store_line.contains("another process holds the store") && store_line.contains("coordinator.redb"),
        "{store_line}"
    );
    assert!(store_line.contains("store.path (IMAGEPIPE_STORE__PATH)"), "{store_line}");

    drop(held);
    let out = imagepipe(dir.path(), &["doctor", "--config", config.to_str().unwrap()], Vec::new()).await;
    line(&text(&out.stdout), "ok", "store");
}
