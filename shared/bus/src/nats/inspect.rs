//! What the server holds for a prefix, read without creating or changing anything
//! ([`inspect`], for `imagepipe doctor`), and the backlog of one durable consumer (for
//! [`TaskQueue::backlog`](crate::TaskQueue::backlog)).

use async_nats::jetstream::{self, consumer, stream};
use futures::TryStreamExt;
use imagepipe_contracts::names::{queues, topics};

use super::connect;
use super::consumers::is_missing;
use super::names::{Names, durable_name};
use super::streams::TASKS_DESCRIPTION;
use crate::config::NatsConfig;
use crate::error::{BoxError, BusError};
use crate::inspect::{Backlog, BrokerReport, ConsumerReport, OtherPrefix, StoreReport};

/// A durable consumer's backlog as the server counts it: `num_pending` messages not yet
/// delivered, `num_ack_pending` delivered and unacknowledged.
pub(crate) fn backlog_of(info: &consumer::Info) -> Backlog {
    Backlog { waiting: info.num_pending, unacked: info.num_ack_pending as u64 }
}

/// The backlog of the durable consumer `durable` on `stream`; `None` when it does not exist.
pub(crate) async fn consumer_backlog(stream: &stream::Stream, durable: &str) -> Result<Option<Backlog>, BusError> {
    match stream.consumer_info(durable).await {
        Ok(info) => Ok(Some(backlog_of(&info))),
        Err(err) if is_missing(&err) => Ok(None),
        Err(err) => Err(inspect_error(format!("consumer {durable}"), Box::new(err))),
    }
}

fn inspect_error(what: String, source: BoxError) -> BusError {
    BusError::Inspect { what, source }
}

/// Connects to `config.url` and reports what the server holds for `prefix`: whether its three
/// streams exist and capture the right subjects, the durable consumer of every task queue and
/// of every subscriber group with its backlog, and the task streams of other prefixes. Creates
/// nothing, unlike [`NatsBus::connect`](super::NatsBus::connect).
pub async fn inspect(prefix: &str, config: &NatsConfig) -> Result<BrokerReport, BusError> {
    let client = connect::connect(config).await?;
    let js = jetstream::ContextBuilder::new().timeout(config.request_timeout).build(client.clone());
    let names = Names::new(prefix);
    let streams: Vec<stream::Info> =
        js.streams().try_collect().await.map_err(|e| inspect_error("the streams".into(), Box::new(e)))?;

    let wanted = [
        (names.tasks_stream(), names.tasks_subjects()),
        (names.events_stream(), names.events_subjects()),
        (names.dlq_stream(), names.dlq_subjects()),
    ];
    let stores = wanted
        .iter()
        .map(|(name, subjects)| {
            let found = streams.iter().find(|info| &info.config.name == name);
            StoreReport {
                name: name.clone(),
                captures: subjects.clone(),
                exists: found.is_some(),
                problem: found.filter(|info| info.config.subjects != [subjects.clone()]).map(|info| {
                    format!(
                        "it captures {:?}, not {subjects}: another bus.prefix maps to the same stream name",
                        info.config.subjects
                    )
                }),
                messages: found.map(|info| info.state.messages),
            }
        })
        .collect();

    let mut consumers = Vec::new();
    if streams.iter().any(|info| info.config.name == names.tasks_stream()) {
        let tasks = js
            .get_stream(names.tasks_stream())
            .await
            .map_err(|e| inspect_error(format!("stream {}", names.tasks_stream()), Box::new(e)))?;
        for queue in queues::all_lanes() {
            let queue = queue.as_str();
            let durable = durable_name(queue);
            let backlog = consumer_backlog(&tasks, &durable).await?;
            consumers.push(ConsumerReport { serves: (*queue).to_owned(), name: durable, backlog });
        }
    }
    if streams.iter().any(|info| info.config.name == names.events_stream()) {
        let events = js
            .get_stream(names.events_stream())
            .await
            .map_err(|e| inspect_error(format!("stream {}", names.events_stream()), Box::new(e)))?;
        let mut groups: Vec<consumer::Info> = events
            .consumers()
            .try_collect()
            .await
            .map_err(|e| inspect_error(format!("consumers of {}", names.events_stream()), Box::new(e)))?;
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        consumers.extend(groups.iter().map(|info| ConsumerReport {
            serves: format!("{}.{}", topics::EVENTS, info.name),
            name: info.name.clone(),
            backlog: Some(backlog_of(info)),
        }));
    }

    let mut other_prefixes: Vec<OtherPrefix> = streams
        .iter()
        .filter(|info| info.config.name != names.tasks_stream())
        .filter(|info| info.config.description.as_deref() == Some(TASKS_DESCRIPTION))
        .filter_map(|info| {
            let captures = info.config.subjects.first()?;
            let prefix = Names::prefix_of_tasks_subjects(captures)?;
            Some(OtherPrefix {
                prefix: prefix.to_owned(),
                stream: info.config.name.clone(),
                captures: captures.clone(),
            })
        })
        .collect();
    other_prefixes.sort_by(|a, b| a.prefix.cmp(&b.prefix));

    Ok(BrokerReport {
        server: format!("nats-server {}", client.server_info().version),
        prefix: prefix.to_owned(),
        stores,
        consumers,
        other_prefixes,
    })
}
