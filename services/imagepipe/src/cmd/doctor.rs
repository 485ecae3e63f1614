//! `imagepipe doctor`: loads the configuration every service loads (`--config`, `IMAGEPIPE_*`)
//! and checks what the services will need from it: the settings themselves, the allow-lists,
//! the broker (the streams or topics of `bus.prefix`, the consumers of its queues and their
//! lag, and on NATS the streams of other prefixes a publish may land in), the store, the blob
//! store and the AI model. Each check prints `ok`, `warn` or `FAIL` with one line of what it
//! found and, when something is wrong, the fix, naming the config key and its variable. Exits 1
//! when a check fails. Changes nothing but a probe blob and a probe file, both removed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use imagepipe_ai_worker::{Model, ModelError};
use imagepipe_blob::{BlobConfig, BlobKind};
use imagepipe_bus::{BrokerReport, BusError, BusKind, ConsumerReport, kafka, nats};
use imagepipe_runtime::config::{ConfigError, Outbound, StoreKind, key_to_env_name, mask_url_credentials};
use imagepipe_runtime::{ConfigArgs, Settings, error_chain};
use serde::Serialize;

/// How long a check of a server (Redis, the blob store) may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// The prefix the documentation's examples publish on (`imagepipe.tasks.submit`).
const DEFAULT_PREFIX: &str = "imagepipe";

/// Other prefixes named at most when this configuration's streams are missing.
const OTHER_PREFIXES_SHOWN: usize = 10;

/// `imagepipe doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the checks as one JSON object (`{"ok": bool, "checks": [...]}`).
    #[arg(long)]
    json: bool,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// As it should be.
    Ok,
    /// Works, but probably not as intended.
    Warn,
    /// Will not work; the services would fail or lose messages.
    Fail,
}

impl Level {
    fn label(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked (`config`, `bus`, `stream IMAGEPIPE_TASKS`, `store`, ...).
    pub name: String,
    /// How it came out.
    pub level: Level,
    /// What was found, in one line.
    pub message: String,
    /// What to do about it, naming the config key and its environment variable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: impl Into<String>, message: impl Into<String>) -> Self {
        Self { name: name.into(), level: Level::Ok, message: message.into(), fix: None }
    }

    fn warn(name: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name: name.into(), level: Level::Warn, message: message.into(), fix: Some(fix.into()) }
    }

    fn fail(name: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name: name.into(), level: Level::Fail, message: message.into(), fix: Some(fix.into()) }
    }
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct Report<'a> {
    ok: bool,
    checks: &'a [Check],
}

/// `key (VARIABLE)`, how every fix names a setting.
fn setting(key: &str) -> String {
    format!("{key} ({})", key_to_env_name(key))
}

/// Runs every check and prints them; exit status 1 when one failed.
pub async fn run(config: &ConfigArgs, args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let checks = checks(config).await;
    let failed = checks.iter().any(|c| c.level == Level::Fail);
    if args.json {
        super::print_json(&Report { ok: !failed, checks: &checks })?;
    } else {
        out!("{}", render(&checks));
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// The checks of the configuration `config` loads; the configuration's own check only, when it
/// does not load.
pub async fn checks(config: &ConfigArgs) -> Vec<Check> {
    let settings = match config.load_unvalidated() {
        Ok(settings) => settings,
        Err(error) => return vec![config_failure(&error)],
    };
    let mut checks = vec![config_check(config, &settings)];
    checks.extend(allowlist_checks(&settings));
    checks.extend(bus_checks(&settings).await);
    checks.extend(store_checks(&settings).await);
    checks.push(blob_check(&settings.blob).await);
    checks.push(model_check(&settings.ai).await);
    checks
}

/// Text lines: `LEVEL  name  message; fix: ...`, then a count.
fn render(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut text = String::new();
    for check in checks {
        let _ = write!(text, "{:<4}  {:<width$}  {}", check.level.label(), check.name, check.message);
        if let Some(fix) = &check.fix {
            let _ = write!(text, "; fix: {fix}");
        }
        text.push('\n');
    }
    let count = |level| checks.iter().filter(|c| c.level == level).count();
    let _ = writeln!(text, "{} ok, {} warn, {} FAIL", count(Level::Ok), count(Level::Warn), count(Level::Fail));
    text
}

fn config_failure(error: &ConfigError) -> Check {
    let fix = match error.key() {
        Some(key) => format!("correct {} in the config file or the environment", setting(key)),
        None => "correct the config file (--config, IMAGEPIPE_CONFIG)".to_owned(),
    };
    Check::fail("config", error_chain(error), fix)
}

fn config_check(config: &ConfigArgs, settings: &Settings) -> Check {
    for checked in [settings.validate(), settings.http.check_exposure()] {
        if let Err(error) = checked {
            return config_failure(&error);
        }
    }
    let source = match &config.config {
        Some(file) => format!("{} and the environment", file.display()),
        None => "defaults and the environment".to_owned(),
    };
    Check::ok("config", format!("valid (from {source}); `imagepipe config print` shows every value"))
}

/// One check per allow-list: it parses, and does not open everything.
fn allowlist_checks(settings: &Settings) -> Vec<Check> {
    let own = |client| match client {
        Outbound::Download => settings.download.allow_cidrs.is_some(),
        Outbound::Notification => settings.notification.allow_cidrs.is_some(),
    };
    [Outbound::Download, Outbound::Notification]
        .into_iter()
        .map(|client| {
            let key = if own(client) { client.allowlist_key() } else { "net.allow_cidrs" };
            let name = format!("allow-list {}", client.allowlist_key().split('.').next().unwrap_or_default());
            match settings.allowed_networks(client) {
                Err(error) => {
                    let fix = format!("list CIDRs such as 10.0.0.0/8 in {}", setting(error.key().unwrap_or(key)));
                    Check::fail(name, error_chain(&error), fix)
                }
                Ok(networks) if networks.iter().any(|n| n.prefix_len() == 0) => Check::warn(
                    name,
                    format!("{key} holds a /0: the SSRF guard lets this client reach every address"),
                    format!("list only the private networks it needs in {}", setting(key)),
                ),
                Ok(networks) if networks.is_empty() => {
                    Check::ok(name, format!("public addresses only ({key} is empty)"))
                }
                Ok(networks) => {
                    let shown: Vec<String> = networks.iter().map(ToString::to_string).collect();
                    Check::ok(name, format!("public addresses and {} (from {key})", shown.join(", ")))
                }
            }
        })
        .collect()
}

async fn bus_checks(settings: &Settings) -> Vec<Check> {
    let bus = &settings.bus;
    match bus.kind {
        BusKind::Memory => vec![Check::ok(
            "bus",
            "bus.kind = memory: in-process, so only `imagepipe run` (every service in one process) can use it; \
             services in separate processes need bus.kind = nats or kafka (IMAGEPIPE_BUS__KIND)",
        )],
        BusKind::Nats => {
            let url = mask_url_credentials(&bus.nats.url);
            match nats::inspect(&bus.prefix, &bus.nats).await {
                Ok(report) => broker_checks(&report, &format!("{} at {url}", report.server), Broker::Nats),
                Err(error) => vec![unreachable_broker(&error, &url, "bus.nats.url", "start nats-server with -js")],
            }
        }
        BusKind::Kafka => {
            let brokers = mask_url_credentials(&bus.kafka.brokers);
            match kafka::inspect(&bus.prefix, &bus.kafka).await {
                Ok(report) => broker_checks(&report, &report.server, Broker::Kafka),
                Err(error) => {
                    vec![unreachable_broker(&error, &brokers, "bus.kafka.brokers", "start a Kafka broker")]
                }
            }
        }
    }
}

fn unreachable_broker(error: &BusError, at: &str, key: &str, start: &str) -> Check {
    let fix = match error {
        BusError::Connect { .. } => format!("{start}, or set {}", setting(key)),
        BusError::Invalid(_) => "correct the bus.* settings named in the message".to_owned(),
        _ => format!("check the broker at {at} and its permissions"),
    };
    Check::fail("bus", error_chain(error), fix)
}

/// Which broker a report is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broker {
    Nats,
    Kafka,
}

/// The checks of a broker's report: the broker, each stream or topic, each consumer, and on
/// NATS the other prefixes a publish may be captured by.
fn broker_checks(report: &BrokerReport, server: &str, broker: Broker) -> Vec<Check> {
    let prefix = &report.prefix;
    let submit = format!("{prefix}.tasks.submit");
    let mut checks = vec![Check::ok("bus", format!("{server} answers (bus.prefix = {prefix})"))];
    let what = match broker {
        Broker::Nats => "stream",
        Broker::Kafka => "topic",
    };
    let mut missing = 0;
    for store in &report.stores {
        let name = format!("{what} {}", store.name);
        let held = store.messages.map(|n| format!(" ({n} stored)")).unwrap_or_default();
        if !store.exists {
            missing += 1;
            let lost = if broker == Broker::Nats && store.captures == format!("{prefix}.tasks.>") {
                format!(
                    "; a publish on {submit} is lost until it does (NATS core drops a publish no stream \
                     captures, without an error)"
                )
            } else {
                String::new()
            };
            checks.push(Check::fail(
                name,
                format!("does not exist: nothing of bus.prefix = {prefix} has started on this broker{lost}"),
                format!(
                    "start the coordinator (every service creates the streams and topics of its prefix), or set \
                     {} to the prefix the services use",
                    setting("bus.prefix")
                ),
            ));
        } else if let Some(problem) = &store.problem {
            checks.push(Check::fail(name, problem.clone(), format!("use another {}", setting("bus.prefix"))));
        } else if broker == Broker::Nats {
            checks.push(Check::ok(name, format!("captures {}{held}", store.captures)));
        } else {
            checks.push(Check::ok(name, format!("exists{held}")));
        }
    }
    checks.extend(report.consumers.iter().map(|c| consumer_check(c, prefix)));
    checks.extend(other_prefix_checks(report, missing > 0));
    checks
}

fn consumer_check(consumer: &ConsumerReport, prefix: &str) -> Check {
    let name = format!("consumer {}", consumer.serves);
    match consumer.backlog {
        Some(backlog) => Check::ok(
            name,
            format!("{}: lag {} (waiting), {} unacknowledged", consumer.name, backlog.waiting, backlog.unacked),
        ),
        None => {
            let who = match consumer.serves.rsplit('.').next() {
                Some("submit" | "results") => "the coordinator",
                Some("download") => "a download worker",
                Some("metadata") => "a metadata worker",
                Some("ai") => "an AI worker",
                _ => "its service",
            };
            Check::warn(
                name,
                format!(
                    "no consumer yet: {who} has not started on bus.prefix = {prefix}; messages of {prefix}.{} wait",
                    consumer.serves
                ),
                format!("start {who} with the same {}", setting("bus.prefix")),
            )
        }
    }
}

/// Task streams of other prefixes: the documented `imagepipe.tasks.submit` lands in the default
/// prefix's stream, where a service of another prefix never reads it; when this prefix has no
/// streams, every other prefix is named (the services may use one of them).
fn other_prefix_checks(report: &BrokerReport, ours_missing: bool) -> Vec<Check> {
    let prefix = &report.prefix;
    let shown: Vec<_> = report
        .other_prefixes
        .iter()
        .filter(|other| ours_missing || other.prefix == DEFAULT_PREFIX)
        .take(OTHER_PREFIXES_SHOWN)
        .map(|other| {
            Check::warn(
                format!("prefix {}", other.prefix),
                format!(
                    "publishes on {}.tasks.submit are captured by stream {} of prefix {}; this config uses prefix \
                     {prefix}: publish on {prefix}.tasks.submit",
                    other.prefix, other.stream, other.prefix
                ),
                format!(
                    "publish on {prefix}.tasks.submit, or set {} = \"{}\" if the services use that prefix",
                    setting("bus.prefix"),
                    other.prefix
                ),
            )
        })
        .collect();
    let hidden = report.other_prefixes.len().saturating_sub(OTHER_PREFIXES_SHOWN);
    let mut checks = shown;
    if ours_missing && hidden > 0 {
        checks.push(Check::ok("prefixes", format!("{hidden} more prefixes have streams on this server")));
    }
    checks
}

async fn store_checks(settings: &Settings) -> Vec<Check> {
    match settings.store.kind {
        StoreKind::Redis => vec![redis_check(settings.store.redis.url.expose()).await],
        StoreKind::Embedded => {
            let mut checks = vec![embedded_store_check(&settings.store.path)];
            if settings.bus.kind != BusKind::Memory {
                checks.push(Check::warn(
                    "store kind",
                    "store.kind = embedded keeps tasks in one coordinator process and the analytics, tag index \
                     and dedup of each service in its own memory, while the bus connects separate processes",
                    format!("use Redis: {} = \"redis\" and {}", setting("store.kind"), setting("store.redis.url")),
                ));
            }
            checks
        }
    }
}

async fn redis_check(url: &str) -> Check {
    let shown = mask_url_credentials(url);
    let ping = async {
        let mut connection = imagepipe_runtime::redis_connection::RedisConnection::open(url).await?;
        redis::cmd("PING").query_async::<String>(&mut connection).await
    };
    let fix = format!("start Redis, or set {}", setting("store.redis.url"));
    match tokio::time::timeout(CHECK_TIMEOUT, ping).await {
        Ok(Ok(_)) => Check::ok("store", format!("Redis at {shown} answers PING")),
        Ok(Err(error)) => Check::fail("store", format!("Redis at {shown}: {}", error_chain(&error)), fix),
        Err(_) => Check::fail("store", format!("Redis at {shown} did not answer within {CHECK_TIMEOUT:?}"), fix),
    }
}

/// The embedded store's directory: writable, and its files open in no other process (a second
/// `imagepipe run` on it would stop at its start).
fn embedded_store_check(dir: &Path) -> Check {
    let held = imagepipe_runtime::embedded::held_by_another_process(dir);
    if held.is_empty() {
        return directory_check("store", "store.path", dir);
    }
    let files: Vec<String> =
        held.iter().filter_map(|f| f.file_name()).map(|f| f.to_string_lossy().into_owned()).collect();
    Check::fail(
        "store",
        format!("another process holds the store in {} (store.path): {}", dir.display(), files.join(", ")),
        format!("stop that process (another `imagepipe run`?), or set {} to another directory", setting("store.path")),
    )
}

/// A directory a service writes (`store.path`, `blob.dir`): writable, or creatable in its
/// nearest existing ancestor.
fn directory_check(name: &str, key: &str, dir: &Path) -> Check {
    let fix = format!("make it writable for the services' user, or set {}", setting(key));
    if dir.is_dir() {
        return match probe_writable(dir) {
            Ok(()) => Check::ok(name, format!("{} is a writable directory ({key})", dir.display())),
            Err(error) => Check::fail(name, format!("{} is not writable: {error}", dir.display()), fix),
        };
    }
    if dir.exists() {
        return Check::fail(name, format!("{} exists and is not a directory", dir.display()), fix);
    }
    let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    let Some(ancestor) = absolute.ancestors().skip(1).find(|a| a.is_dir()).map(PathBuf::from) else {
        return Check::fail(name, format!("{} has no existing parent directory", dir.display()), fix);
    };
    match probe_writable(&ancestor) {
        Ok(()) => Check::ok(name, format!("{} does not exist yet; it is created at start ({key})", dir.display())),
        Err(error) => Check::fail(
            name,
            format!("{} does not exist and {} is not writable: {error}", dir.display(), ancestor.display()),
            fix,
        ),
    }
}

/// Creates and removes a file in `dir`.
fn probe_writable(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".imagepipe-doctor-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&probe, b"probe")?;
    std::fs::remove_file(&probe)
}

async fn blob_check(blob: &BlobConfig) -> Check {
    if blob.kind == BlobKind::Local && !blob.dir.is_dir() {
        return directory_check("blob store", "blob.dir", &blob.dir);
    }
    let (what, key) = match blob.kind {
        BlobKind::Local => (format!("local directory {}", blob.dir.display()), "blob.dir"),
        BlobKind::S3 => (format!("s3 bucket {}", blob.s3.bucket), "blob.s3.bucket"),
    };
    let fix = match blob.kind {
        BlobKind::Local => format!("make it writable for the services' user, or set {}", setting(key)),
        BlobKind::S3 => format!(
            "check the bucket, its permissions and the blob.s3.* settings ({}, credentials from the AWS environment)",
            setting(key)
        ),
    };
    match tokio::time::timeout(CHECK_TIMEOUT, probe_blob_store(blob)).await {
        Ok(Ok(())) => Check::ok("blob store", format!("{what}: a probe blob was written, read back and deleted")),
        Ok(Err(reason)) => Check::fail("blob store", format!("{what}: {reason}"), fix),
        Err(_) => Check::fail("blob store", format!("{what} did not answer within {CHECK_TIMEOUT:?}"), fix),
    }
}

/// Writes a blob no image can have, reads it back and deletes it.
async fn probe_blob_store(blob: &BlobConfig) -> Result<(), String> {
    let store = blob.open().map_err(|e| error_chain(&e))?;
    let bytes = Bytes::from(format!("imagepipe doctor probe {}", uuid::Uuid::new_v4()));
    let key = store.put(bytes.clone()).await.map_err(|e| format!("writing: {}", error_chain(&e)))?;
    let read = store.get(&key).await.map_err(|e| format!("reading back: {}", error_chain(&e)));
    let deleted = store.delete(&key).await.map_err(|e| format!("deleting: {}", error_chain(&e)));
    if read? != bytes {
        return Err("the probe read back differs from what was written".into());
    }
    deleted
}

async fn model_check(ai: &imagepipe_runtime::config::AiConfig) -> Check {
    let dir = ai.model_dir.as_path();
    let (owned, options) = (dir.to_owned(), imagepipe_ai_worker::RuntimeOptions::from(ai));
    let loaded = tokio::task::spawn_blocking(move || Model::load_with(&owned, &options)).await;
    let prepare = format!(
        "run `{} --out {}`, or set {} to the prepared directory",
        imagepipe_ai_worker::PREPARE_COMMAND,
        dir.display(),
        setting("ai.model_dir")
    );
    match loaded {
        Ok(Ok(model)) => Check::ok(
            "model",
            format!(
                "{} in {}: files match manifest.json, the graph loads in {}",
                model.name(),
                dir.display(),
                model.runtime().as_str()
            ),
        ),
        Ok(Err(error @ (ModelError::Missing { .. } | ModelError::Read { .. }))) => {
            Check::fail("model", error_chain(&error), prepare)
        }
        Ok(Err(error)) => Check::fail(
            "model",
            error_chain(&error),
            format!("re-run `{} --force --out {}`", imagepipe_ai_worker::PREPARE_COMMAND, dir.display()),
        ),
        Err(error) => Check::fail("model", format!("loading the model crashed: {error}"), prepare),
    }
}

#[cfg(test)]
mod tests {
    use imagepipe_bus::{Backlog, OtherPrefix, StoreReport};

    use super::*;

    fn report(prefix: &str, exists: bool, others: &[&str]) -> BrokerReport {
        BrokerReport {
            server: "nats-server 2.9.0".into(),
            prefix: prefix.into(),
            stores: vec![StoreReport {
                name: format!("{}_TASKS", prefix.to_uppercase()),
                captures: format!("{prefix}.tasks.>"),
                exists,
                problem: None,
                messages: exists.then_some(2),
            }],
            consumers: vec![
                ConsumerReport {
                    serves: "tasks.submit".into(),
                    name: "tasks_submit".into(),
                    backlog: Some(Backlog { waiting: 3, unacked: 1 }),
                },
                ConsumerReport { serves: "tasks.ai".into(), name: "tasks_ai".into(), backlog: None },
            ],
            other_prefixes: others
                .iter()
                .map(|p| OtherPrefix {
                    prefix: (*p).into(),
                    stream: format!("{}_TASKS", p.to_uppercase()),
                    captures: format!("{p}.tasks.>"),
                })
                .collect(),
        }
    }

    #[test]
    fn a_missing_stream_fails_naming_the_subject_and_the_prefix_key() {
        let checks = broker_checks(&report("prod", false, &["imagepipe", "staging"]), "nats", Broker::Nats);
        let missing = checks.iter().find(|c| c.name == "stream PROD_TASKS").unwrap();
        assert_eq!(missing.level, Level::Fail);
        assert!(missing.message.contains("a publish on prod.tasks.submit is lost"), "{missing:?}");
        assert!(missing.fix.as_ref().unwrap().contains("bus.prefix (IMAGEPIPE_BUS__PREFIX)"), "{missing:?}");
        let other = checks.iter().find(|c| c.name == "prefix imagepipe").unwrap();
        assert_eq!(
            other.message,
            "publishes on imagepipe.tasks.submit are captured by stream IMAGEPIPE_TASKS of prefix imagepipe; \
             this config uses prefix prod: publish on prod.tasks.submit"
        );
        assert!(checks.iter().any(|c| c.name == "prefix staging"), "with ours missing, every prefix is named");
    }

    #[test]
    fn with_its_streams_present_only_the_documented_prefix_is_pointed_out() {
        let checks = broker_checks(&report("prod", true, &["imagepipe", "staging"]), "nats", Broker::Nats);
        assert_eq!(checks.iter().find(|c| c.name == "stream PROD_TASKS").unwrap().level, Level::Ok);
        assert!(checks.iter().any(|c| c.name == "prefix imagepipe" && c.level == Level::Warn));
        assert!(!checks.iter().any(|c| c.name == "prefix staging"));
        let submit = checks.iter().find(|c| c.name == "consumer tasks.submit").unwrap();
        assert_eq!(submit.message, "tasks_submit: lag 3 (waiting), 1 unacknowledged");
        let ai = checks.iter().find(|c| c.name == "consumer tasks.ai").unwrap();
        assert_eq!(ai.level, Level::Warn);
        assert!(ai.message.contains("an AI worker has not started"), "{ai:?}");
        let own = broker_checks(&report("imagepipe", true, &[]), "nats", Broker::Nats);
        assert!(!own.iter().any(|c| c.name.starts_with("prefix ")));
    }

    #[test]
    fn the_text_has_one_line_per_check_and_a_count() {
        let checks = vec![Check::ok("config", "valid"), Check::fail("store", "down", "start Redis")];
        let text = render(&checks);
        assert_eq!(text, "ok    config  valid\nFAIL  store   down; fix: start Redis\n1 ok, 0 warn, 1 FAIL\n");
    }
}
