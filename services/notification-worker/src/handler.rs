//! The notification [`EventHandler`]: post a finished task's event to its callback URL and to
//! every configured subscriber, signed the Standard Webhooks way ([`crate::sign`]), once per
//! event and target.
//!
//! It runs inside the dedup layer, which skips an event whose `eventId` was handled; per event
//! it posts to every target not reached yet (each success is remembered as `<eventId>:<url>`
//! through the same layer, so a retry does not post twice to a target that already answered
//! 2xx).
//! Any retryable failure (timeouts, connection errors, non-2xx answers) retries the delivery
//! with backoff, until the last attempt dead-letters it; a target that can never be reached
//! (refused by the SSRF guard, not a URL) dead-letters it at once, after the other targets
//! were served.
//!
//! URLs reach logs and dead-letter reasons [redacted](redacted_url) to scheme, host and path:
//! a callback URL's query or user info may hold a credential.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use imagepipe_bus::Selector;
use imagepipe_contracts::Event;
use imagepipe_net::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use imagepipe_net::{GuardedClient, Request, Url, redacted_url};
use imagepipe_runtime::config::{NotificationConfig, WebhookSecret};
use imagepipe_runtime::dedup::{EventHandler, Seen};
use imagepipe_runtime::{Outcome, error_chain};
use serde_json::Value;

use crate::metrics;
use crate::sign::{EVENT_TYPE_HEADER, ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, signature, unix_seconds};

/// Longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Where webhooks go and which keys sign each: every task's `callbackUrl` with
/// `notification.secret`, and each subscriber with its own keys or else those.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Targets {
    callback_keys: Vec<WebhookSecret>,
    subscribers: Vec<(String, Vec<WebhookSecret>)>,
}

impl Targets {
    /// The targets `config` describes (`notification.secret`, `notification.subscribers`).
    pub fn from_config(config: &NotificationConfig) -> Self {
        let subscribers = config
            .subscribers
            .iter()
            .map(|target| {
                let keys = if target.secret.is_empty() { &config.secret } else { &target.secret };
                (target.url.clone(), keys.clone())
            })
            .collect();
        Self { callback_keys: config.secret.clone(), subscribers }
    }

    /// The targets whose webhooks go out unsigned, redacted: `every task's callbackUrl` without
    /// `notification.secret`, and each subscriber without a key.
    pub fn unsigned(&self) -> Vec<String> {
        let callbacks = self.callback_keys.is_empty().then(|| "every task's callbackUrl".to_owned());
        let subscribers = self.subscribers.iter().filter(|(_, keys)| keys.is_empty()).map(|(url, _)| shown(url));
        callbacks.into_iter().chain(subscribers).collect()
    }

    /// Logs one warning naming the [unsigned](Self::unsigned) targets, if there are any.
    pub fn warn_unsigned(&self) {
        let unsigned = self.unsigned();
        if !unsigned.is_empty() {
            tracing::warn!(
                targets = unsigned.join(", "),
                "webhooks to these targets are not signed, so their receivers cannot tell them from forgeries: \
                 set notification.secret, or a secret for the subscriber"
            );
        }
    }

    /// Where `event` goes: its `callbackUrl` (if any), then the subscribers, without repeats;
    /// each with the keys that sign for it (a callback URL that is also a subscriber is signed
    /// as the subscriber).
    fn of(&self, event: &Event<Value>) -> Result<Vec<(String, &[WebhookSecret])>, String> {
        let mut targets: Vec<(String, &[WebhookSecret])> = Vec::new();
        match event.payload.get("callbackUrl") {
            None | Some(Value::Null) => {}
            Some(Value::String(url)) => {
                let keys = self.subscribers.iter().find(|(configured, _)| configured == url).map(|(_, keys)| keys);
                targets.push((url.clone(), keys.unwrap_or(&self.callback_keys)));
            }
            Some(other) => return Err(format!("payload.callbackUrl is not a string but {}", json_kind(other))),
        }
        for (url, keys) in &self.subscribers {
            if !targets.iter().any(|(target, _)| target == url) {
                targets.push((url.clone(), keys));
            }
        }
        Ok(targets)
    }
}

/// Handles `task.completed`, `task.failed` and `task.cancelled` events (see the module docs).
pub struct NotifyHandler {
    client: GuardedClient,
    targets: Targets,
    selector: Selector,
}

/// How posting to one target went.
enum Posted {
    Delivered,
    Retry { reason: String, after: Option<Duration> },
    Permanent(String),
}

impl NotifyHandler {
    /// A handler posting with `client` to `targets`, handling only events `selector` accepts.
    pub fn new(client: GuardedClient, targets: Targets, selector: Selector) -> Self {
        Self { client, targets, selector }
    }

    /// Posts `body` (the event as published) to `url`, signed with `keys` for this attempt.
    async fn post(&self, url: &str, keys: &[WebhookSecret], event: &Event<Value>, body: &[u8]) -> Posted {
        let id = event.event_id.to_string();
        let timestamp = unix_seconds(SystemTime::now());
        let mut request = Request::post(url, body.to_vec())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(HeaderName::from_static(ID_HEADER), header_value(&id))
            .header(HeaderName::from_static(TIMESTAMP_HEADER), HeaderValue::from(timestamp))
            .header(HeaderName::from_static(EVENT_TYPE_HEADER), header_value(event.event_type.as_str()));
        if !keys.is_empty() {
            let signed = signature(keys, &id, timestamp, body);
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
    HeaderValue::from_str(text).expect("ids, event types and base64 signatures are visible ASCII")
}

/// `url` as logs show it: scheme, host and path ([`redacted_url`]).
fn shown(url: &str) -> String {
    Url::parse(url).map_or_else(|_| "a URL that does not parse".to_owned(), |url| redacted_url(&url))
}

/// What kind of JSON value `value` is, for an error that must not repeat it.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[async_trait]
impl EventHandler for NotifyHandler {
    async fn apply(&self, event: Event<Value>, seen: &Seen<'_>) -> Outcome {
        if !self.selector.matches(event.event_type.as_str()) {
            return Outcome::reject(format!("{} is not an event the notification worker handles", event.event_type));
        }
        let targets = match self.targets.of(&event) {
            Ok(targets) => targets,
            Err(reason) => return Outcome::reject(reason),
        };
        let body = &seen.delivery.message.payload;
        let event_id = event.event_id.to_string();

        let (mut retry, mut refused, mut retry_after) = (Vec::new(), Vec::new(), None::<Duration>);
        for (url, keys) in &targets {
            match seen.is_done(url).await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(error) => return Outcome::retry(format!("checking the delivery to a target: {error}")),
            }
            match self.post(url, keys, &event, body).await {
                Posted::Delivered => {
                    tracing::info!(event_id, event_type = %event.event_type, task_id = ?event.task_id,
                        target = shown(url), "webhook delivered");
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
