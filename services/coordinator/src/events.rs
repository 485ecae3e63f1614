//! Fans the event topics out to `GET /v1/events` clients (Server-Sent Events).
//!
//! Each coordinator process joins the event topics with its own subscriber group (so every
//! replica sees every event) and broadcasts them in-process; each client filters its copy.

use std::sync::Arc;

use async_trait::async_trait;
use imagepipe_bus::Delivery;
use imagepipe_contracts::Event;
use imagepipe_runtime::worker::{Handler, Outcome};
use tokio::sync::broadcast;

/// One event as a client receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubEvent {
    /// `eventId`.
    pub event_id: String,
    /// `eventType`.
    pub event_type: String,
    /// `taskId`, when the event has one.
    pub task_id: Option<String>,
    /// The envelope, as published.
    pub json: String,
}

/// The in-process fan-out of events; cheap to clone.
#[derive(Clone)]
pub struct EventHub {
    tx: broadcast::Sender<Arc<HubEvent>>,
}

impl EventHub {
    /// A hub buffering up to `capacity` events per slow client before it lags.
    pub fn new(capacity: usize) -> Self {
        Self { tx: broadcast::channel(capacity.max(1)).0 }
    }

    /// Receives every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<HubEvent>> {
        self.tx.subscribe()
    }

    /// Hands `event` to every client.
    pub fn send(&self, event: HubEvent) {
        // no receivers is fine: nobody is watching
        let _ = self.tx.send(Arc::new(event));
    }
}

/// The worker handler feeding the hub from the coordinator's event subscription.
pub struct Fanout(pub EventHub);

#[async_trait]
impl Handler for Fanout {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        match Event::<serde_json::Value>::from_json(&delivery.message.payload) {
            Ok(event) => {
                self.0.send(HubEvent {
                    event_id: event.event_id.to_string(),
                    event_type: event.event_type.as_str().to_owned(),
                    task_id: event.task_id,
                    json: String::from_utf8_lossy(&delivery.message.payload).into_owned(),
                });
                Outcome::Ack
            }
            Err(e) => Outcome::reject(e),
        }
    }
}
