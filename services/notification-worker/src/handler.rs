//! The notification [`EventHandler`]: post a finished task's event to its callback URL and to
//! every configured subscriber, signed, once per event and target.
//!
//! It runs inside the dedup layer, which skips an event whose `eventId` was handled; per event
//! it posts to every target not reached yet (each success is remembered as `<eventId>:<url>`
//! through the same layer, so a retry does not post twice to a target that already answered
//! 2xx).
//! Any retryable failure (timeouts, connection errors, non-2xx answers) retries the delivery
//! with backoff, until the last attempt dead-letters it; a target that can never be reached
//! (refused by the SSRF guard, not a URL) dead-letters it at once, after the other targets
//! were served.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use imagepipe_bus::Selector;
use imagepipe_contracts::Event;
use imagepipe_net::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use imagepipe_net::{GuardedClient, Request, redacted_url};
use imagepipe_runtime::config::Secret;
use imagepipe_runtime::dedup::{EventHandler, Seen};
use imagepipe_runtime::{Outcome, error_chain};
use serde_json::Value;

use crate::metrics;
use crate::sign::{EVENT_ID_HEADER, EVENT_TYPE_HEADER, SIGNATURE_HEADER, signature};

/// Longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Handles `task.completed`, `task.failed` and `task.cancelled` events (see the module docs).
pub struct NotifyHandler {
    client: GuardedClient,
    subscribers: Vec<String>,
    secret: Option<Secret<String>>,
    selector: Selector,
}

/// How posting to one target went.
enum Posted {
    Delivered,
    Retry { reason: String, after: Option<Duration> },
    Permanent(String),
}

impl NotifyHandler {
    /// A handler posting with `client` to each event's callback URL and to `subscribers`,
    /// signing with `secret` when set, handling only events `selector` accepts.
    pub fn new(
        client: GuardedClient,
        subscribers: Vec<String>,
        secret: Option<Secret<String>>,
        selector: Selector,
    ) -> Self {
        Self { client, subscribers, secret, selector }
    }

    /// Where `event` goes: its `callbackUrl` (if any), then the subscribers, without repeats.
    fn targets(&self, event: &Event<Value>) -> Result<Vec<String>, String> {
        let mut targets = Vec::new();
        match event.payload.get("callbackUrl") {
            None | Some(Value::Null) => {}
            Some(Value::String(url)) => targets.push(url.clone()),
            Some(other) => return Err(format!("payload.callbackUrl is not a string: {other}")),
        }
        for url in &self.subscribers {
            if !targets.contains(url) {
                targets.push(url.clone());
            }
        }
        Ok(targets)
    }

    async fn post(&self, url: &str, event: &Event<Value>, body: &[u8]) -> Posted {
        let mut request = Request::post(url, body.to_vec())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(HeaderName::from_static(EVENT_ID_HEADER), header_value(&event.event_id.to_string()))
            .header(HeaderName::from_static(EVENT_TYPE_HEADER), header_value(event.event_type.as_str()));
        if let Some(secret) = &self.secret {
            let signed = signature(secret.expose().as_bytes(), body);
            request = request.header(HeaderName::from_static(SIGNATURE_HEADER), header_value(&signed));
        }
        let posted = match self.client.send(request).await {
            Ok(response) if response.status.is_success() => Posted::Delivered,
            Ok(response) => Posted::Retry {
                reason: format!("{}: answered {}", redacted_url(&response.final_url), response.status),
                after: response.retry_after(SystemTime::now()).map(|d| d.min(MAX_RETRY_AFTER)),
            },
            Err(error) if error.is_retryable() => Posted::Retry { reason: error_chain(&error), after: None },
            Err(error) => Posted::Permanent(error_chain(&error)),
        };
        let result = match &posted {
            Posted::Delivered => metrics::RESULT_DELIVERED,
            Posted::Retry { .. } => metrics::RESULT_RETRY,
            Posted::Permanent(_) => metrics::RESULT_REFUSED,
        };
        ::metrics::counter!(metrics::WEBHOOKS, metrics::RESULT => result).increment(1);
        posted
    }
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).expect("ids, event types and hex signatures are visible ASCII")
}

#[async_trait]
impl EventHandler for NotifyHandler {
    async fn apply(&self, event: Event<Value>, seen: &Seen<'_>) -> Outcome {
        if !self.selector.matches(event.event_type.as_str()) {
            return Outcome::reject(format!("{} is not an event the notification worker handles", event.event_type));
        }
        let targets = match self.targets(&event) {
            Ok(targets) => targets,
            Err(reason) => return Outcome::reject(reason),
        };
        let body = &seen.delivery.message.payload;
        let event_id = event.event_id.to_string();

        let (mut retry, mut refused, mut retry_after) = (Vec::new(), Vec::new(), None::<Duration>);
        for url in &targets {
            match seen.is_done(url).await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(error) => return Outcome::retry(format!("checking the delivery to a target: {error}")),
            }
            match self.post(url, &event, body).await {
                Posted::Delivered => {
                    tracing::info!(event_id, event_type = %event.event_type, task_id = ?event.task_id,
                        "webhook delivered");
                    if let Err(error) = seen.mark_done(url).await {
                        return Outcome::retry(format!("remembering a delivered webhook: {error}"));
                    }
                }
                Posted::Retry { reason, after } => {
                    retry_after = after.max(retry_after);
                    retry.push(reason);
                }
                Posted::Permanent(reason) => refused.push(reason),
            }
        }

        if !retry.is_empty() {
            let reason = format!("webhook not delivered: {}", retry.join("; "));
            tracing::warn!(event_id, attempt = seen.delivery.delivery_count, reason, "webhook retry");
            return match retry_after {
                Some(after) => Outcome::retry_after(after, reason),
                None => Outcome::retry(reason),
            };
        }
        if !refused.is_empty() {
            return Outcome::reject(format!("webhook target refused: {}", refused.join("; ")));
        }
        Outcome::Ack
    }
}
