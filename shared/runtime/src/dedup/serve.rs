//! [`run_subscriber`]: the one way an event subscriber runs its [`EventHandler`]: open its
//! group's dedup store (waiting while Redis is unreachable), join its group, and hand every
//! event to the handler inside [`Deduplicated`], settled by the runtime's [`Worker`] (retry
//! with backoff, dead letter after the last attempt). What differs between subscribers is a
//! [`Subscriber`].

use futures::future::BoxFuture;
use imagepipe_bus::{Bus, BusError, Subscription};

use super::{DedupError, Deduplicated, EventHandler, connect_with_retry};
use crate::Settings;
use crate::backoff::ExponentialBackoff;
use crate::config::WorkerConfig;
use crate::shutdown::Shutdown;
use crate::worker::{LoopConfig, Worker, WorkerError};

/// Why a subscriber stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum SubscriberRunError {
    /// The group's dedup store could not be opened.
    #[error("opening the dedup store of {group}")]
    Dedup {
        /// The subscriber group.
        group: String,
        /// Why.
        #[source]
        source: DedupError,
    },
    /// The group's subscription could not be opened.
    #[error("subscribing the {group} group")]
    Subscribe {
        /// The subscriber group.
        group: String,
        /// Why.
        #[source]
        source: BusError,
    },
    /// The worker loop stopped with an error.
    #[error("running the worker of {group}")]
    Worker {
        /// The subscriber group.
        group: String,
        /// Why.
        #[source]
        source: WorkerError,
    },
}

/// One subscriber as [`run_subscriber`] runs it: its group's subscription (group, selector,
/// redeliveries), its handler, its worker's settings, and what runs beside the worker.
pub struct Subscriber<H> {
    subscription: Subscription,
    handler: H,
    config: LoopConfig,
    alongside: Option<BoxFuture<'static, ()>>,
}

impl<H: EventHandler> Subscriber<H> {
    /// `handler` on the events of `subscription`, by a worker named after the group with the
    /// `worker` section's settings, handling events as they come.
    pub fn new(subscription: Subscription, handler: H, worker: &WorkerConfig) -> Self {
        let config = LoopConfig::from_settings(subscription.group.clone(), worker);
        Self { subscription, handler, config, alongside: None }
    }

    /// Handles one event per message key at a time ([`LoopConfig::orderly`]).
    pub fn orderly(mut self) -> Self {
        self.config = self.config.orderly();
        self
    }

    /// Redelivers a failed event after `backoff` (by delivery count) instead of the default
    /// retry backoff.
    pub fn retry_backoff(mut self, backoff: ExponentialBackoff) -> Self {
        self.config.retry_backoff = backoff;
        self
    }

    /// Runs `task` in its own task from when the group is joined until the worker stops (it is
    /// aborted then); not at all when the subscriber stops before joining.
    pub fn alongside(mut self, task: impl Future<Output = ()> + Send + 'static) -> Self {
        self.alongside = Some(Box::pin(task));
        self
    }
}

/// Runs `subscriber` on the events of `bus` until `shutdown` fires and its in-flight events are
/// finished (see the module docs); `Ok` also when `shutdown` fires while it waits for its dedup
/// store.
pub async fn run_subscriber<H: EventHandler>(
    bus: Bus,
    settings: &Settings,
    subscriber: Subscriber<H>,
    shutdown: Shutdown,
) -> Result<(), SubscriberRunError> {
    let Subscriber { subscription, handler, config, alongside } = subscriber;
    let group = subscription.group.clone();
    let dedup = match connect_with_retry(settings, &group, &shutdown).await {
        Ok(Some(dedup)) => dedup,
        Ok(None) => return Ok(()),
        Err(source) => return Err(SubscriberRunError::Dedup { group, source }),
    };
    let consumer = match bus.events.subscribe(subscription).await {
        Ok(consumer) => consumer,
        Err(source) => return Err(SubscriberRunError::Subscribe { group, source }),
    };
    let alongside = alongside.map(tokio::spawn);
    let handler = Deduplicated::new(handler, dedup, group.clone());
    let handled = Worker::new(consumer, handler, config).run(shutdown).await;
    if let Some(task) = alongside {
        task.abort();
    }
    handled.map_err(|source| SubscriberRunError::Worker { group, source })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use async_trait::async_trait;
    use imagepipe_bus::{BusConfig, Message, Selector};
    use imagepipe_contracts::Event;
    use serde_json::{Value, json};
    use tokio::sync::oneshot;

    use super::*;
    use crate::dedup::Seen;
    use crate::worker::Outcome;

    /// Remembers the ids of the events it applied.
    #[derive(Clone, Default)]
    struct Applied(Arc<Mutex<Vec<String>>>);

    #[async_trait]
    impl EventHandler for Applied {
        async fn apply(&self, event: Event<Value>, _seen: &Seen<'_>) -> Outcome {
            self.0.lock().unwrap().push(event.event_id.to_string());
            Outcome::Ack
        }
    }

    fn event(id: u8) -> Message {
        let body = json!({
            "eventId": format!("00000000-0000-4000-8000-0000000000{id:02}"),
            "eventType": "task.completed",
            "taskId": "t1",
            "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
            "timestamp": 1_763_800_000_000u64,
            "source": "test",
            "payload": {}
        });
        Message::new(serde_json::to_vec(&body).unwrap()).with_key("t1")
    }

    #[tokio::test]
    async fn a_subscriber_applies_each_event_once_with_its_companion_until_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::default();
        settings.store.path = dir.path().join("store");
        let bus = Bus::connect(&BusConfig::default()).await.unwrap();
        let applied = Applied::default();
        let (joined, on_join) = oneshot::channel();
        let (companion_alive, companion_gone) = oneshot::channel::<()>();
        let companion = async move {
            let _alive = companion_alive;
            joined.send(()).unwrap();
            std::future::pending::<()>().await;
        };
        let subscription = Subscription::new("run-subscriber-test", Selector::parse("task.*").unwrap());
        let subscriber =
            Subscriber::new(subscription, applied.clone(), &settings.worker).orderly().alongside(companion);
        let shutdown = Shutdown::new();
        let running = tokio::spawn({
            let (bus, shutdown) = (bus.clone(), shutdown.clone());
            async move { run_subscriber(bus, &settings, subscriber, shutdown).await }
        });

        tokio::time::timeout(Duration::from_secs(10), on_join).await.unwrap().unwrap();
        for id in [1, 1, 2] {
            bus.events.publish("task.completed", event(id)).await.unwrap();
        }
        let ids = |applied: &Applied| applied.0.lock().unwrap().clone();
        tokio::time::timeout(Duration::from_secs(10), async {
            while ids(&applied).len() < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
        assert_eq!(
            ids(&applied),
            ["00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"],
            "the redelivered id is skipped, in key order"
        );

        shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(10), running).await.unwrap().unwrap().unwrap();
        let gone = tokio::time::timeout(Duration::from_secs(10), companion_gone).await.unwrap();
        assert!(gone.is_err(), "the companion stops with the worker");
    }
}
