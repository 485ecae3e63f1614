//! imagepipe notification-worker: an event subscriber that posts every finished task's event
//! (`task.completed`, `task.failed`, `task.cancelled`) as a signed webhook to the task's
//! `callbackUrl` and to the subscribers of `notification.subscribers`.
//!
//! It is also the model of a subscriber of your own: join a durable group with a
//! [`Selector`], write the side effect as an
//! [`EventHandler`](imagepipe_runtime::dedup::EventHandler), and run it with [`run_subscriber`]:
//! inside [`Deduplicated`](imagepipe_runtime::dedup::Deduplicated) (one effect per `eventId`),
//! with the runtime's [`Worker`](imagepipe_runtime::Worker) settling each delivery (retry with
//! backoff, dead letter after the last attempt). It never changes task state.
//!
//! - [`sign`]: the Standard Webhooks signature (`webhook-id`, `webhook-timestamp`,
//!   `webhook-signature`), and its check for receivers.
//! - [`handler`]: the [`EventHandler`](imagepipe_runtime::dedup::EventHandler).
//! - [`run`]: the subscriber on a connected bus, for the binary, `imagepipe run` and tests.

pub mod handler;
pub mod sign;

use imagepipe_bus::{Bus, ConsumerConfig, Selector, Subscription};
use imagepipe_net::{BuildError, ClientBuilder, GuardedClient, Limits};
use imagepipe_runtime::backoff::{ExponentialBackoff, InvalidBackoff, Jitter};
use imagepipe_runtime::config::{ConfigError, Outbound};
use imagepipe_runtime::dedup::{Subscriber, SubscriberRunError, run_subscriber};
use imagepipe_runtime::{Service, Settings, Shutdown};

pub use handler::{NotifyHandler, Targets};

/// The service's name in logs and traces.
pub const SERVICE: &str = "notification-worker";
/// The durable subscriber group; its dead letters are `dlq.events.notification`.
pub const GROUP: &str = "notification";
/// The events it notifies.
pub const SELECTOR: &str = "task.completed || task.failed || task.cancelled";
/// Largest webhook response body read.
const MAX_RESPONSE_BYTES: u64 = 1024 * 1024;

/// Metric names of the notification worker.
pub mod metrics {
    /// Webhook requests, by `result`.
    pub const WEBHOOKS: &str = "imagepipe_notification_webhooks_total";
    /// Label: how a request went.
    pub const RESULT: &str = "result";
    /// `result`: a 2xx answer.
    pub const RESULT_DELIVERED: &str = "delivered";
    /// `result`: failed for now (non-2xx, timeout, connection); the event is retried.
    pub const RESULT_RETRY: &str = "retry";
    /// `result`: the target can never be reached (SSRF guard, bad URL); dead-lettered.
    pub const RESULT_REFUSED: &str = "refused";

    /// Gives each of these metrics its `# HELP` text (at start; again is harmless).
    pub fn describe() {
        use ::metrics::{Unit, describe_counter};
        describe_counter!(WEBHOOKS, Unit::Count, "Webhook requests, by result (delivered, retry, refused).");
    }
}

/// The worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// `notification.allow_cidrs` (or, while it is unset, `net.allow_cidrs`) does not parse.
    #[error("reading the webhook allowlist")]
    Allowlist(#[source] Box<ConfigError>),
    /// The HTTP client could not be built.
    #[error(transparent)]
    Client(#[from] BuildError),
    /// `notification.retry_min`/`retry_max` make no backoff.
    #[error("notification retry backoff")]
    Backoff(#[source] InvalidBackoff),
    /// The subscriber could not join its group, or its worker stopped with an error.
    #[error(transparent)]
    Subscriber(#[from] SubscriberRunError),
}

/// The webhook client `settings` describe (`notification.*` timeouts, `notification.allow_cidrs`
/// or else `net.allow_cidrs`), with the system resolver; tests replace the resolver and add a
/// dial check before building it. A receiver silent for the client's default read timeout (or
/// `notification.total_timeout`, when shorter) fails the post.
pub fn client_builder(settings: &Settings) -> Result<ClientBuilder, RunError> {
    let notification = &settings.notification;
    let limits = Limits {
        max_bytes: MAX_RESPONSE_BYTES,
        connect_timeout: notification.connect_timeout,
        read_timeout: Limits::default().read_timeout.min(notification.total_timeout),
        total_timeout: notification.total_timeout,
        max_redirects: 0,
    };
    let user_agent = concat!("imagepipe-notification-worker/", env!("CARGO_PKG_VERSION"));
    settings.client_builder(Outbound::Notification, limits, user_agent).map_err(|e| RunError::Allowlist(Box::new(e)))
}

/// The subscription: group [`GROUP`], selector [`SELECTOR`], `notification.max_attempts`
/// deliveries per event.
pub fn subscription(settings: &Settings) -> Subscription {
    let selector = Selector::parse(SELECTOR).expect("the selector is valid");
    let consumer =
        ConsumerConfig { ack_wait: settings.worker.ack_wait, max_deliveries: settings.notification.max_attempts };
    Subscription::new(GROUP, selector).with_consumer(consumer)
}

/// The service as its binary runs it, on a started [`Service`]: posts webhooks until the
/// service's shutdown.
pub async fn serve(service: &Service) -> Result<(), RunError> {
    run(service.bus.clone(), &service.settings, service.shutdown.clone()).await
}

/// Posts webhooks for the events on `bus` until `shutdown` fires and in-flight posts are done;
/// logs a warning at start when some target's webhooks go out unsigned
/// ([`Targets::warn_unsigned`]).
pub async fn run(bus: Bus, settings: &Settings, shutdown: Shutdown) -> Result<(), RunError> {
    let client = client_builder(settings)?.build()?;
    run_with_client(bus, settings, client, shutdown).await
}

/// [`run`] with a client built by the caller.
pub async fn run_with_client(
    bus: Bus,
    settings: &Settings,
    client: GuardedClient,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    metrics::describe();
    let notification = &settings.notification;
    let backoff = ExponentialBackoff::new(notification.retry_min, notification.retry_max, Jitter::Proportional(0.5))
        .map_err(RunError::Backoff)?;
    let subscription = subscription(settings);
    let targets = Targets::from_config(notification);
    targets.warn_unsigned();
    let notify = NotifyHandler::new(client, targets, subscription.selector.clone());
    let subscriber = Subscriber::new(subscription, notify, &settings.worker).retry_backoff(backoff);
    Ok(run_subscriber(bus, settings, subscriber, shutdown).await?)
}
