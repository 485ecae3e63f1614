//! [`Rebuild`]: regenerates the index from the event stream. It clears the store (a new epoch,
//! so every replica's live index starts over), then reads every retained
//! `image.metadata_extracted` and `image.analyzed` event through a group of its own that starts
//! from the beginning, indexing each without announcing duplicates again, until no event has come
//! for [`IDLE_END`]. The live group goes on meanwhile: both write the same entries, so what
//! either indexes stays.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use imagepipe_bus::{Bus, Selector, StartPosition, Subscription};
use imagepipe_contracts::Event;
use imagepipe_runtime::clock::{Clock, SystemClock};
use imagepipe_runtime::{Shutdown, error_chain};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::handler::IndexHandler;
use crate::live::LiveIndex;
use crate::store::SimilarityStore;

/// A rebuild ends once no event came for this long.
pub const IDLE_END: Duration = Duration::from_secs(2);
/// Events fetched at once.
const BATCH: usize = 256;
/// How long the broker keeps a rebuild's group once nobody reads it.
const GROUP_IDLE: Duration = Duration::from_secs(60);

/// Where a rebuild is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RebuildState {
    /// Reading the stream.
    Running,
    /// Caught up with the stream.
    Done,
    /// Stopped by an error (see `error`).
    Failed,
}

/// How a rebuild went (`GET /v1/similarity/rebuild`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebuildStatus {
    /// Its subscriber group.
    pub group: String,
    /// Where it is.
    pub state: RebuildState,
    /// When it started, Unix ms.
    pub started: u64,
    /// When it ended, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<u64>,
    /// Events read so far.
    pub events: u64,
    /// Events that could not be indexed (unreadable), skipped.
    pub skipped: u64,
    /// Milliseconds from start to the end of the stream, once done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A replica's rebuilds: at most one at a time.
pub struct Rebuild {
    bus: Bus,
    store: Arc<dyn SimilarityStore>,
    live: Arc<LiveIndex>,
    shutdown: Shutdown,
    status: Arc<Mutex<Option<RebuildStatus>>>,
}

impl Rebuild {
    /// Rebuilds of the store `store` from `bus`'s events, ending with `shutdown`.
    pub fn new(bus: Bus, store: Arc<dyn SimilarityStore>, live: Arc<LiveIndex>, shutdown: Shutdown) -> Self {
        Self { bus, store, live, shutdown, status: Arc::new(Mutex::new(None)) }
    }

    /// The latest rebuild's status.
    pub fn status(&self) -> Option<RebuildStatus> {
        self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Starts a rebuild in the background and returns its status, or the running one's as the
    /// error.
    pub fn start(&self) -> Result<RebuildStatus, RebuildStatus> {
        let mut status = self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(running) = status.as_ref().filter(|s| s.state == RebuildState::Running) {
            return Err(running.clone());
        }
        let started = SystemClock.unix_ms();
        let fresh = RebuildStatus {
            group: format!("{}-rebuild-{started}", crate::GROUP),
            state: RebuildState::Running,
            started,
            finished: None,
            events: 0,
            skipped: 0,
            duration_ms: None,
            error: None,
        };
        *status = Some(fresh.clone());
        drop(status);
        let (bus, store, live, shutdown, shared) =
            (self.bus.clone(), self.store.clone(), self.live.clone(), self.shutdown.clone(), self.status.clone());
        let group = fresh.group.clone();
        tokio::spawn(async move {
            let clock = Instant::now();
            let result = run(&bus, store, live, &group, &shutdown, |events, skipped| {
                if let Some(status) = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_mut() {
                    (status.events, status.skipped) = (events, skipped);
                }
            })
            .await;
            let mut status = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(status) = status.as_mut() {
                status.finished = Some(SystemClock.unix_ms());
                match result {
                    Ok(()) => {
                        status.state = RebuildState::Done;
                        status.duration_ms = Some(u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX));
                        tracing::info!(events = status.events, ms = status.duration_ms, "similarity index rebuilt");
                    }
                    Err(error) => {
                        tracing::warn!(%error, "similarity index rebuild failed");
                        status.state = RebuildState::Failed;
                        status.error = Some(error);
                    }
                }
            }
        });
        Ok(fresh)
    }
}

/// Clears `store` and indexes every retained event through group `group` until the stream is
/// caught up (see the module docs); `progress` hears the events read and skipped so far.
pub async fn run(
    bus: &Bus,
    store: Arc<dyn SimilarityStore>,
    live: Arc<LiveIndex>,
    group: &str,
    shutdown: &Shutdown,
    mut progress: impl FnMut(u64, u64),
) -> Result<(), String> {
    let selector = Selector::parse(crate::SELECTOR).expect("the selector is valid");
    let subscription =
        Subscription::new(group, selector).starting(StartPosition::Beginning).expiring_when_idle(GROUP_IDLE);
    store.clear().await.map_err(|e| error_chain(&e))?;
    let consumer = bus.events.subscribe(subscription).await.map_err(|e| error_chain(&e))?;
    let handler = IndexHandler::quiet(store, live);
    let (mut events, mut skipped) = (0u64, 0u64);
    loop {
        let deliveries = tokio::select! {
            fetched = consumer.fetch(BATCH, IDLE_END) => fetched.map_err(|e| error_chain(&e))?,
            () = shutdown.wait() => return Err("the service is stopping".into()),
        };
        if deliveries.is_empty() {
            return Ok(());
        }
        for delivery in deliveries {
            events += 1;
            match Event::<Value>::from_json(&delivery.message.payload) {
                Ok(event) => match handler.index(event).await {
                    Ok(()) => {}
                    Err(imagepipe_runtime::Outcome::Retry { reason, .. }) => return Err(reason),
                    Err(_) => skipped += 1,
                },
                Err(_) => skipped += 1,
            }
            delivery.ack().await.map_err(|e| error_chain(&e))?;
        }
        progress(events, skipped);
    }
}
