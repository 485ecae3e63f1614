//! `GET /v1/events`: the events of the event topics as Server-Sent Events, from the
//! coordinator's [`EventHub`](crate::events::EventHub), resumed after `Last-Event-ID`.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use imagepipe_bus::Selector;
use imagepipe_contracts::EventType;
use imagepipe_contracts::command::is_valid_id;
use imagepipe_runtime::http::ApiError;
use imagepipe_runtime::http::Scope::Read;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::ApiState;
use super::route::{Answer, Content, ID_PATTERN, Operation, Route, Schema, query};
use crate::events::Watched;

/// Longest `Last-Event-ID` taken (event ids are UUIDs; this leaves room for other ids).
const MAX_LAST_EVENT_ID: usize = 128;

/// The event stream's route.
pub(super) fn routes() -> Vec<Route<ApiState>> {
    let stream = Content::new("text/event-stream", Schema::Inline(json!({ "type": "string" })));
    let watch = Operation::get(
        "/v1/events",
        Read,
        "watchEvents",
        "Server-Sent Events of the event topics (each `data` is an event envelope)",
    )
    .describe(
        "Each event's SSE `id` is its `eventId` and its SSE `event` its `eventType`. A client that \
         reconnects with `Last-Event-ID` (browsers' EventSource does) gets the events that followed that one \
         first, when this coordinator still holds them (the last 1,024 while it was fed without a break); \
         otherwise the stream starts with an event `reset`, after which the client should reload what it \
         shows. An event `lagged` (`{\"missed\": n}`) says a slow client missed n events.",
    )
    .param(query("taskId", "Only events of this task", json!({ "type": "string", "pattern": ID_PATTERN })))
    .param(query(
        "type",
        "Event type selector, e.g. `task.completed || task.failed` or `image.*`",
        json!({ "type": "string" }),
    ))
    .param(json!({
        "name": "Last-Event-ID",
        "in": "header",
        "required": false,
        "description": "Resume after this event (the `id` of the last event received)",
        "schema": { "type": "string", "maxLength": MAX_LAST_EVENT_ID }
    }))
    .answer(Answer::with(200, "An event stream", stream))
    .error(400, "A bad parameter")
    .error(503, "Too many event streams at once (http.max_sse_clients)");
    vec![Route::new(watch, events)]
}

/// Query of `GET /v1/events`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventParams {
    /// Only events of this task.
    pub task_id: Option<String>,
    /// Only these event types: a selector such as `task.completed || task.failed` or `image.*`.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
}

async fn events(
    State(state): State<ApiState>,
    headers: HeaderMap,
    query: Result<Query<EventParams>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let Query(params) = query?;
    let last_event_id = match headers.get("last-event-id").map(|value| value.to_str()) {
        None => None,
        Some(Ok(id)) if id.len() <= MAX_LAST_EVENT_ID => Some(id.trim()).filter(|id| !id.is_empty()),
        Some(_) => {
            return Err(ApiError::invalid(format!(
                "`Last-Event-ID` must be visible ASCII, at most {MAX_LAST_EVENT_ID} characters"
            )));
        }
    };
    let selector = match params.event_type.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => Selector::parse(s).map_err(|e| ApiError::invalid(format!("`type`: {e}")))?,
        None => Selector::all(),
    };
    let known = EventType::ALL.map(EventType::as_str);
    if let Some(pattern) = selector.pattern_matching_none(&known) {
        return Err(ApiError::invalid(format!(
            "`type`: {pattern:?} matches no event type; known: {}",
            known.join(", ")
        )));
    }
    let task_id = params.task_id.filter(|t| !t.is_empty());
    if let Some(id) = &task_id
        && !is_valid_id(id)
    {
        return Err(ApiError::invalid(format!("`taskId` {id:?} must be 1 to 128 characters of [A-Za-z0-9_.-]")));
    }
    let watch = state
        .hub
        .watch_after(last_event_id)
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "too_many_clients", e.to_string()))?;
    let stream = futures::stream::unfold((watch, selector, task_id), |(mut watch, selector, task_id)| async move {
        loop {
            match watch.next().await? {
                Watched::Event(event) => {
                    let wanted = selector.matches(&event.event_type)
                        && task_id.as_ref().is_none_or(|id| event.task_id.as_deref() == Some(id.as_str()));
                    if wanted {
                        let sse = SseEvent::default().event(&event.event_type).id(&event.event_id).data(&event.json);
                        return Some((Ok(sse), (watch, selector, task_id)));
                    }
                }
                Watched::Lagged(missed) => {
                    let sse = SseEvent::default().event("lagged").data(format!("{{\"missed\":{missed}}}"));
                    return Some((Ok(sse), (watch, selector, task_id)));
                }
                Watched::Gap => {
                    let sse = SseEvent::default()
                        .event("reset")
                        .data(r#"{"reason":"the events after Last-Event-ID are no longer held: reload"}"#);
                    return Some((Ok(sse), (watch, selector, task_id)));
                }
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
