//! Fans the event topics out to `GET /v1/events` clients (Server-Sent Events).
//!
//! While at least one client watches, each coordinator process joins the event topics with its
//! own subscriber group (so every replica sees every event) and broadcasts them in-process; each
//! client filters its copy. With nobody watching it does not subscribe at all, so the broker
//! does not deliver every event to a process that would drop it (`loops::feed_hub`). At
//! most `http.max_sse_clients` clients watch at once, and every stream ends when the hub is
//! closed on shutdown (so a watching client never holds a stopping coordinator up).
//!
//! A client that reconnects with `Last-Event-ID` resumes: the hub keeps the last events it
//! handed out (as many as a client may buffer) while it is fed without a break, and a new watch
//! after one of them starts with the ones that followed it. When that id is not among them (too
//! old, never seen here, or the feed stopped since), the watch starts with [`Watched::Gap`] so
//! the client knows to reload what it shows instead of trusting the stream to be complete.
//!
//! Events enter the hub without `payload.callbackUrl` ([`Fanout`] strips it, for every client at
//! once): a callback URL may carry a credential in its query, and watching the stream is not
//! owning the task. `GET /v1/tasks/{id}` still shows it to the API client.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use imagepipe_bus::Delivery;
use imagepipe_contracts::Event;
use imagepipe_runtime::Shutdown;
use imagepipe_runtime::worker::{Handler, Outcome};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, watch};

/// One event as a client receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubEvent {
    /// `eventId`.
    pub event_id: String,
    /// `eventType`.
    pub event_type: String,
    /// `taskId`, when the event has one.
    pub task_id: Option<String>,
    /// The envelope as published, without `payload.callbackUrl`.
    pub json: String,
}

/// How long a new client waits for the hub's subscription to be in place before its stream
/// starts anyway (it then misses the events of the wait).
pub const FEED_WAIT: Duration = Duration::from_secs(10);

/// The in-process fan-out of events; cheap to clone.
#[derive(Clone)]
pub struct EventHub {
    tx: broadcast::Sender<Arc<HubEvent>>,
    clients: Arc<Semaphore>,
    max_clients: usize,
    closed: Shutdown,
    /// How many clients watch now.
    watchers: Arc<watch::Sender<usize>>,
    /// Whether events reach the hub: true unless a feeder that subscribes on demand says it
    /// is not subscribed yet.
    fed: Arc<watch::Sender<bool>>,
    /// The latest events, oldest first, handed out since the feed last (re)started: what a
    /// resuming client is replayed. Sending happens under this lock, so a new watch's replay and
    /// its live receiver neither overlap nor leave a hole.
    recent: Arc<Mutex<VecDeque<Arc<HubEvent>>>>,
    /// How many events `recent` keeps.
    replay: usize,
}

/// Every watching slot is taken (`http.max_sse_clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{max} event streams are open, the most allowed (http.max_sse_clients)")]
pub struct TooManyClients {
    /// The limit.
    pub max: usize,
}

/// What a watching client receives next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watched {
    /// An event.
    Event(Arc<HubEvent>),
    /// The client fell behind and missed this many events.
    Lagged(u64),
    /// The client resumed after an event the hub no longer holds: events since then may be
    /// missing from the stream.
    Gap,
}

/// One client's view of the hub; its slot is freed when it is dropped.
pub struct Watch {
    /// What comes before `rx`: the replay of a resumed watch, or its gap.
    first: VecDeque<Watched>,
    rx: broadcast::Receiver<Arc<HubEvent>>,
    closed: Shutdown,
    _slot: OwnedSemaphorePermit,
    _watching: Watching,
}

/// One unit of [`EventHub::watchers`] while alive.
struct Watching(Arc<watch::Sender<usize>>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Watch {
    /// The next event, or `None` once the hub is closed.
    pub async fn next(&mut self) -> Option<Watched> {
        if let Some(first) = self.first.pop_front() {
            return Some(first);
        }
        tokio::select! {
            biased;
            () = self.closed.wait() => None,
            received = self.rx.recv() => match received {
                Ok(event) => Some(Watched::Event(event)),
                Err(RecvError::Lagged(missed)) => Some(Watched::Lagged(missed)),
                Err(RecvError::Closed) => None,
            },
        }
    }
}

impl EventHub {
    /// A hub buffering up to `capacity` events per slow client before it lags, and keeping as
    /// many for resuming clients, for at most `max_clients` clients at once.
    pub fn new(capacity: usize, max_clients: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            tx: broadcast::channel(capacity).0,
            clients: Arc::new(Semaphore::new(max_clients)),
            max_clients,
            closed: Shutdown::new(),
            watchers: Arc::new(watch::channel(0).0),
            fed: Arc::new(watch::channel(true).0),
            recent: Arc::new(Mutex::new(VecDeque::with_capacity(capacity))),
            replay: capacity,
        }
    }

    /// Every event from now on, while a slot is free. Waits (up to [`FEED_WAIT`]) until the
    /// hub's subscription is in place when a feeder is only now subscribing for this client.
    pub async fn watch(&self) -> Result<Watch, TooManyClients> {
        self.watch_after(None).await
    }

    /// Like [`EventHub::watch`], resuming after the event `last_event_id` when given (a
    /// reconnecting client's `Last-Event-ID`): the events the hub handed out since then come
    /// first, or [`Watched::Gap`] when the hub does not hold that event.
    pub async fn watch_after(&self, last_event_id: Option<&str>) -> Result<Watch, TooManyClients> {
        let slot = self.clients.clone().try_acquire_owned().map_err(|_| TooManyClients { max: self.max_clients })?;
        self.watchers.send_modify(|n| *n += 1);
        let watching = Watching(self.watchers.clone());
        let (first, rx) = {
            let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
            let first = match last_event_id {
                None => VecDeque::new(),
                Some(id) => match recent.iter().rposition(|event| event.event_id == id) {
                    Some(at) => recent.iter().skip(at + 1).cloned().map(Watched::Event).collect(),
                    None => VecDeque::from([Watched::Gap]),
                },
            };
            (first, self.tx.subscribe())
        };
        let mut fed = self.fed.subscribe();
        if tokio::time::timeout(FEED_WAIT, fed.wait_for(|fed| *fed)).await.is_err() {
            tracing::warn!("the event subscription is not in place yet; the stream starts without it");
        }
        Ok(Watch { first, rx, closed: self.closed.clone(), _slot: slot, _watching: watching })
    }

    /// How many clients watch, as it changes (for a feeder that subscribes on demand).
    pub fn watchers(&self) -> watch::Receiver<usize> {
        self.watchers.subscribe()
    }

    /// Tells new clients whether events reach the hub now (a feeder that subscribes on demand
    /// sets it false until its subscription is in place).
    pub fn set_fed(&self, fed: bool) {
        if !fed {
            // Events may pass unseen until the feed is back: what is kept no longer runs up to now.
            self.recent.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
        self.fed.send_replace(fed);
    }

    /// Whether events reach the hub now: false while a feeder that subscribes on demand has no
    /// subscription in place (nobody watches).
    pub fn is_fed(&self) -> bool {
        *self.fed.borrow()
    }

    /// Ends every stream, now and later: the coordinator is stopping.
    pub fn close(&self) {
        self.closed.trigger();
    }

    /// Hands `event` to every client.
    pub fn send(&self, event: HubEvent) {
        let event = Arc::new(event);
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.len() == self.replay {
            recent.pop_front();
        }
        recent.push_back(event.clone());
        // no receivers is fine: nobody is watching
        let _ = self.tx.send(event);
    }
}

/// The payload field the hub leaves out.
const CALLBACK_URL: &str = "callbackUrl";

/// The worker handler feeding the hub from the coordinator's event subscription; it strips
/// `payload.callbackUrl` on the way in, and skips events published before `since` (Unix ms): a
/// subscriber group that resumes after nobody watched for a while replays what it missed, and
/// a client asked for events from now on.
pub struct Fanout {
    /// The hub fed.
    pub hub: EventHub,
    /// Events older than this are not handed on.
    pub since: u64,
}

#[async_trait]
impl Handler for Fanout {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        match Event::<serde_json::Value>::from_json(&delivery.message.payload) {
            Ok(event) if event.timestamp < self.since => Outcome::Ack,
            Ok(event) => {
                let published = &delivery.message.payload;
                let json = if event.payload.get(CALLBACK_URL).is_some() {
                    match without_callback_url(published) {
                        Ok(json) => json,
                        Err(e) => {
                            return Outcome::reject(format!("re-encoding the event without its callbackUrl: {e}"));
                        }
                    }
                } else {
                    String::from_utf8_lossy(published).into_owned()
                };
                self.hub.send(HubEvent {
                    event_id: event.event_id.to_string(),
                    event_type: event.event_type.as_str().to_owned(),
                    task_id: event.task_id,
                    json,
                });
                Outcome::Ack
            }
            Err(e) => Outcome::reject(e),
        }
    }
}

/// The envelope `published` with its `payload.callbackUrl` removed.
fn without_callback_url(published: &[u8]) -> Result<String, serde_json::Error> {
    let mut envelope: serde_json::Value = serde_json::from_slice(published)?;
    if let Some(payload) = envelope.get_mut("payload").and_then(serde_json::Value::as_object_mut) {
        payload.remove(CALLBACK_URL);
    }
    serde_json::to_string(&envelope)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: usize) -> HubEvent {
        HubEvent { event_id: format!("e{id}"), event_type: "task.created".into(), task_id: None, json: "{}".into() }
    }

    async fn ids(watch: &mut Watch, n: usize) -> Vec<String> {
        let mut ids = Vec::new();
        for _ in 0..n {
            match watch.next().await.unwrap() {
                Watched::Event(event) => ids.push(event.event_id.clone()),
                other => ids.push(format!("{other:?}")),
            }
        }
        ids
    }

    #[tokio::test]
    async fn a_resumed_watch_gets_what_followed_then_the_live_events_once() {
        let hub = EventHub::new(8, 4);
        (1..=3).for_each(|i| hub.send(event(i)));
        let mut watch = hub.watch_after(Some("e1")).await.unwrap();
        hub.send(event(4));
        assert_eq!(ids(&mut watch, 3).await, ["e2", "e3", "e4"]);
        let mut latest = hub.watch_after(Some("e4")).await.unwrap();
        hub.send(event(5));
        assert_eq!(ids(&mut latest, 1).await, ["e5"]);
    }

    #[tokio::test]
    async fn a_watch_after_an_event_no_longer_held_starts_with_a_gap() {
        let hub = EventHub::new(4, 4);
        (1..=6).for_each(|i| hub.send(event(i)));
        assert_eq!(hub.recent.lock().unwrap().len(), 4, "bounded");
        let mut evicted = hub.watch_after(Some("e2")).await.unwrap();
        assert_eq!(ids(&mut evicted, 1).await, ["Gap"]);
        let mut held = hub.watch_after(Some("e3")).await.unwrap();
        assert_eq!(ids(&mut held, 3).await, ["e4", "e5", "e6"]);
    }

    #[tokio::test]
    async fn a_break_in_the_feed_forgets_what_was_held() {
        let hub = EventHub::new(8, 4);
        (1..=2).for_each(|i| hub.send(event(i)));
        hub.set_fed(false);
        hub.set_fed(true);
        hub.send(event(3));
        let mut watch = hub.watch_after(Some("e1")).await.unwrap();
        assert_eq!(ids(&mut watch, 1).await, ["Gap"], "e2 was held, but events may have passed unseen since");
        let mut fresh = hub.watch().await.unwrap();
        hub.send(event(4));
        assert_eq!(ids(&mut fresh, 1).await, ["e4"]);
    }
}
