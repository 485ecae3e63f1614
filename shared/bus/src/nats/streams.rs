//! The three streams, created or updated idempotently at start.

use std::time::Duration;

use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType, Stream};
use async_nats::jetstream::{self, ErrorCode, context::GetStreamErrorKind};

use super::names::Names;
use crate::config::{NatsConfig, NatsStorage};
use crate::error::BusError;

/// Handles on the streams of one prefix.
#[derive(Clone)]
pub(crate) struct Streams {
    /// Work queue of `<prefix>.tasks.>`.
    pub tasks: Stream,
    /// Events (`<prefix>.events.>`), retained by age.
    pub events: Stream,
    /// Dead letters (`<prefix>.dlq.>`).
    pub dlq: Stream,
}

/// The description of every prefix's task stream: how a task stream of another prefix is
/// recognised on a shared server.
pub(crate) const TASKS_DESCRIPTION: &str = "imagepipe task queues (work queue)";

/// The desired configs of the three streams.
pub(crate) fn configs(names: &Names, config: &NatsConfig) -> [Config; 3] {
    let base = Config {
        storage: match config.storage {
            NatsStorage::File => StorageType::File,
            NatsStorage::Memory => StorageType::Memory,
        },
        num_replicas: config.replicas,
        duplicate_window: config.dedup_window,
        max_bytes: limit(config.max_bytes),
        max_messages: limit(config.max_msgs),
        ..Config::default()
    };
    let tasks = Config {
        name: names.tasks_stream(),
        description: Some(TASKS_DESCRIPTION.into()),
        subjects: vec![names.tasks_subjects()],
        retention: RetentionPolicy::WorkQueue,
        // A full queue refuses new tasks rather than dropping queued ones.
        discard: DiscardPolicy::New,
        ..base.clone()
    };
    let events = Config {
        name: names.events_stream(),
        description: Some("imagepipe events".into()),
        subjects: vec![names.events_subjects()],
        retention: RetentionPolicy::Limits,
        discard: DiscardPolicy::Old,
        max_age: config.events_max_age,
        duplicate_window: dedup_within(config.dedup_window, config.events_max_age),
        ..base.clone()
    };
    let dlq = Config {
        name: names.dlq_stream(),
        description: Some("imagepipe dead letters".into()),
        subjects: vec![names.dlq_subjects()],
        retention: RetentionPolicy::Limits,
        discard: DiscardPolicy::New,
        max_age: config.dlq_max_age,
        duplicate_window: dedup_within(config.dedup_window, config.dlq_max_age),
        ..base
    };
    [tasks, events, dlq]
}

fn limit(value: u64) -> i64 {
    if value == 0 { -1 } else { i64::try_from(value).unwrap_or(i64::MAX) }
}

/// JetStream refuses a duplicate window longer than the stream's max age.
fn dedup_within(window: Duration, max_age: Duration) -> Duration {
    if max_age.is_zero() { window } else { window.min(max_age) }
}

/// Creates the streams of `names`, or brings existing ones to `config`.
pub(crate) async fn ensure(js: &jetstream::Context, names: &Names, config: &NatsConfig) -> Result<Streams, BusError> {
    let [tasks, events, dlq] = configs(names, config);
    Ok(Streams {
        tasks: ensure_one(js, tasks).await?,
        events: ensure_one(js, events).await?,
        dlq: ensure_one(js, dlq).await?,
    })
}

async fn ensure_one(js: &jetstream::Context, desired: Config) -> Result<Stream, BusError> {
    let what = format!("stream {}", desired.name);
    let setup = |source: crate::error::BoxError| BusError::Setup { what: what.clone(), source };
    // Two processes starting at once may both see "not found"; the loser of the create
    // goes round once more and finds the winner's stream.
    for _ in 0..2 {
        match js.get_stream(&desired.name).await {
            Ok(stream) => {
                let existing = &stream.cached_info().config;
                if existing.subjects != desired.subjects {
                    return Err(setup(
                        format!(
                            "it exists with subjects {:?}, not {:?}: another bus.prefix maps to the same stream name",
                            existing.subjects, desired.subjects
                        )
                        .into(),
                    ));
                }
                if !differs(existing, &desired) {
                    return Ok(stream);
                }
                tracing::info!(stream = %desired.name, "updating stream config");
                js.update_stream(&desired).await.map_err(|err| setup(Box::new(err)))?;
                return js.get_stream(&desired.name).await.map_err(|err| setup(Box::new(err)));
            }
            Err(err) if is_stream_not_found(err.kind()) => match js.create_stream(desired.clone()).await {
                Ok(stream) => {
                    tracing::info!(stream = %desired.name, "created stream");
                    return Ok(stream);
                }
                Err(err) if err.to_string().contains("already in use") => continue,
                Err(err) => return Err(setup(Box::new(err))),
            },
            Err(err) => return Err(setup(Box::new(err))),
        }
    }
    Err(setup("the stream kept changing while it was being set up".into()))
}

fn is_stream_not_found(kind: GetStreamErrorKind) -> bool {
    matches!(kind, GetStreamErrorKind::JetStream(err) if err.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// Whether an existing stream differs from the desired one in a setting this backend manages.
fn differs(existing: &Config, desired: &Config) -> bool {
    existing.retention != desired.retention
        || existing.discard != desired.discard
        || existing.storage != desired.storage
        || existing.num_replicas != desired.num_replicas
        || existing.max_age != desired.max_age
        || existing.max_bytes != desired.max_bytes
        || existing.max_messages != desired.max_messages
        || existing.duplicate_window != desired.duplicate_window
        || existing.description != desired.description
}

/// Deletes the streams of `names` (test teardown, `imagepipe` reset tooling). Missing ones are
/// fine.
pub(crate) async fn delete(js: &jetstream::Context, names: &Names) -> Result<(), BusError> {
    for name in [names.tasks_stream(), names.events_stream(), names.dlq_stream()] {
        match js.delete_stream(&name).await {
            Ok(_) => {}
            Err(err) if err.to_string().contains("not found") => {}
            Err(err) => return Err(BusError::Setup { what: format!("deleting stream {name}"), source: Box::new(err) }),
        }
    }
    Ok(())
}
