//! `imagepipe watch [--task ID] [--type T,...]`: tails events until interrupted, or, for one
//! task, until it has finished. A stream that breaks (the coordinator restarted, a proxy cut
//! it) is reopened with a jittered backoff and `Last-Event-ID`, so no event is printed twice and
//! a gap the server cannot fill is reported (`reset`), not passed over.

use std::pin::Pin;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use imagepipe::ApiClient;
use imagepipe::client::ClientError;
use imagepipe::sse::SseEvent;
use imagepipe_bus::Selector;
use imagepipe_contracts::EventType;
use imagepipe_coordinator::api::TaskView;
use imagepipe_runtime::backoff::{Attempts, ExponentialBackoff};
use reqwest::StatusCode;

use super::show::{outcome, time};
use crate::ApiArgs;

/// Options of `imagepipe watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only events of this task; ends once the task has finished, with its final state (at
    /// once when it already has).
    #[arg(long = "task")]
    task_id: Option<String>,
    /// Only these event types, a comma-separated list: `task.completed,task.failed`, `image.*`.
    #[arg(long = "type", value_delimiter = ',', value_parser = parse_event_type)]
    event_types: Vec<String>,
    /// Print each event envelope (and, with --task, the finished task) as one JSON line.
    #[arg(long)]
    json: bool,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<usize>,
}

/// Prints events as they arrive.
pub async fn run(api: &ApiArgs, args: WatchArgs) -> anyhow::Result<ExitCode> {
    let client = api.client()?;
    let selector = selector(&args.event_types);
    // Following one task, every event of it comes and the types are chosen here, so the end of
    // the task is seen whatever `--type` says.
    let server_selector = if args.task_id.is_some() { None } else { selector.as_deref() };
    let query = EventQuery { client: &client, task_id: args.task_id.as_deref(), selector: server_selector };
    let mut events = query.open(None).await?;
    let wanted = match &selector {
        Some(s) => Selector::parse(s)?,
        None => Selector::all(),
    };
    if let Some(id) = &args.task_id {
        match task(&client, id).await? {
            Some(view) if view.task.state.is_terminal() => {
                print_final(&view, args.json)?;
                return Ok(ExitCode::SUCCESS);
            }
            Some(view) => eprintln!("imagepipe watch: following {id} ({}); waiting for its events", view.task.state),
            None => eprintln!("imagepipe watch: no task {id} yet; waiting for its events"),
        }
    }
    let mut seen = 0;
    let mut last_event_id: Option<String> = None;
    let mut reconnects = ExponentialBackoff::broker_reconnect().attempts();
    while args.count.is_none_or(|n| seen < n) {
        let event = match events.next().await {
            Some(Ok(event)) => event,
            broken @ (None | Some(Err(ClientError::Unreachable { .. }))) => {
                let why = broken.and_then(Result::err).map_or_else(|| "it closed".to_owned(), |e| e.to_string());
                eprintln!("imagepipe watch: the event stream broke ({why})");
                events = query.reopen(last_event_id.as_deref(), &mut reconnects).await?;
                continue;
            }
            Some(Err(e)) => return Err(e.into()),
        };
        reconnects.reset();
        if event.id.is_some() {
            last_event_id.clone_from(&event.id);
        }
        if event.event == "lagged" || event.event == "reset" {
            let what = if event.event == "lagged" { "too slow, missed events" } else { "events may be missing" };
            eprintln!("imagepipe watch: {what}: {}", event.data);
            if let Some(id) = &args.task_id
                && finished(&client, id, args.json).await?
            {
                break;
            }
            continue;
        }
        if wanted.matches(&event.event) {
            seen += 1;
            print_event(&event.data, args.json)?;
        }
        let ends_task = matches!(
            event.event.parse::<EventType>(),
            Ok(EventType::TaskCompleted | EventType::TaskFailed | EventType::TaskCancelled)
        );
        if let Some(id) = &args.task_id
            && ends_task
            && finished(&client, id, args.json).await?
        {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The event stream as the client reads it.
type EventStream = Pin<Box<dyn futures::Stream<Item = Result<SseEvent, ClientError>>>>;

/// What `imagepipe watch` asked the API for.
struct EventQuery<'a> {
    client: &'a ApiClient,
    task_id: Option<&'a str>,
    selector: Option<&'a str>,
}

impl EventQuery<'_> {
    /// The stream, after event `last_event_id` when given.
    async fn open(&self, last_event_id: Option<&str>) -> Result<EventStream, ClientError> {
        Ok(Box::pin(self.client.events(self.task_id, self.selector, last_event_id).await?))
    }

    /// The stream opened again after `last_event_id`, retried with `reconnects`' delays while
    /// the API cannot be reached.
    async fn reopen(&self, last_event_id: Option<&str>, reconnects: &mut Attempts) -> Result<EventStream, ClientError> {
        loop {
            let delay = reconnects.next_delay();
            eprintln!("imagepipe watch: reconnecting in {delay:?}");
            tokio::time::sleep(delay).await;
            match self.open(last_event_id).await {
                Ok(reopened) => return Ok(reopened),
                Err(e @ ClientError::Unreachable { .. }) => eprintln!("imagepipe watch: {e}"),
                Err(e) => return Err(e),
            }
        }
    }
}

/// One `--type` entry, when well formed and naming at least one event type (an argument
/// mistake otherwise).
fn parse_event_type(t: &str) -> Result<String, String> {
    let t = t.trim();
    if t.is_empty() {
        return Ok(String::new());
    }
    let selector = Selector::parse(t).map_err(|e| e.to_string())?;
    if !EventType::ALL.iter().any(|known| selector.matches(known.as_str())) {
        let known: Vec<_> = EventType::ALL.iter().map(|k| k.as_str()).collect();
        return Err(format!("{t:?} is no event type; known: {} (or a family: task.*, image.*)", known.join(", ")));
    }
    Ok(t.to_owned())
}

/// The `--type` list as one selector (`a || b`).
fn selector(types: &[String]) -> Option<String> {
    let types: Vec<&str> = types.iter().map(String::as_str).filter(|t| !t.is_empty()).collect();
    (!types.is_empty()).then(|| types.join(" || "))
}

/// One event: its envelope as a JSON line, or time, type, task and source.
fn print_event(data: &str, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{data}");
        return Ok(());
    }
    let envelope: serde_json::Value =
        serde_json::from_str(data).with_context(|| format!("an event that is not JSON: {data}"))?;
    let field = |name: &str| envelope[name].as_str().unwrap_or("-").to_owned();
    let at = envelope["timestamp"].as_u64().map_or_else(|| "-".into(), time);
    outln!("{at} {:<26} {:<40} {}", field("eventType"), field("taskId"), field("source"));
    Ok(())
}

/// Task `id`, or `None` when there is no such task (yet).
async fn task(client: &ApiClient, id: &str) -> anyhow::Result<Option<TaskView>> {
    match client.task(id).await {
        Ok(view) => Ok(Some(view)),
        Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether task `id` has finished; if so, prints its final state.
async fn finished(client: &ApiClient, id: &str, json: bool) -> anyhow::Result<bool> {
    match task(client, id).await? {
        Some(view) if view.task.state.is_terminal() => print_final(&view, json).map(|()| true),
        _ => Ok(false),
    }
}

/// A finished task's final state: its id and outcome, or the task as one JSON line.
fn print_final(view: &TaskView, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string(view)?);
    } else {
        outln!("{}  {}", view.task.id, outcome(&view.task));
    }
    Ok(())
}
