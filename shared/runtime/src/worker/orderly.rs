//! Orderly dispatch: one lane per message key. A lane handles its deliveries one at a time in
//! fetch order and keeps the waiting ones alive with `progress`; lanes run in parallel.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::{Fetched, Handler, LoopConfig, process};

/// One lane per message key with deliveries held (per key, unlike the bus's priority
/// [`Lanes`](imagepipe_bus::Lanes)); a lane ends when it runs out.
#[derive(Default, Clone)]
pub(super) struct KeyLanes {
    open: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Fetched>>>>,
}

impl KeyLanes {
    /// Queues `fetched` behind the deliveries of its key, or handles it at once if it has none
    /// (keyless messages are unordered).
    pub(super) fn dispatch<H: Handler>(
        &self,
        fetched: Fetched,
        tasks: &mut JoinSet<()>,
        handler: &Arc<H>,
        config: &Arc<LoopConfig>,
    ) {
        let Some(key) = fetched.delivery.message.key.clone() else {
            tasks.spawn(process::handle(handler.clone(), fetched, config.clone()));
            return;
        };
        let mut open = self.lock();
        let fetched = match open.get(&key) {
            Some(lane) => match lane.send(fetched) {
                Ok(()) => return,
                // The lane's task is gone (aborted); start a new one.
                Err(mpsc::error::SendError(fetched)) => fetched,
            },
            None => fetched,
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        sender.send(fetched).expect("the receiver is alive");
        open.insert(key.clone(), sender);
        drop(open);
        tasks.spawn(run_lane(self.clone(), key, receiver, handler.clone(), config.clone()));
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, mpsc::UnboundedSender<Fetched>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Handles the deliveries of `key` in order until none is left, then closes the lane. The
/// lane is removed under the same lock [`KeyLanes::dispatch`] sends under, after checking that
/// nothing arrived, so no delivery is sent to a lane that is ending.
async fn run_lane<H: Handler>(
    lanes: KeyLanes,
    key: String,
    mut receiver: mpsc::UnboundedReceiver<Fetched>,
    handler: Arc<H>,
    config: Arc<LoopConfig>,
) {
    let mut waiting = VecDeque::new();
    let period = config.progress_interval();
    let mut keep_alive = tokio::time::interval_at(Instant::now() + period, period);
    keep_alive.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let next = match waiting.pop_front().or_else(|| receiver.try_recv().ok()) {
            Some(next) => next,
            None => {
                let mut open = lanes.lock();
                match receiver.try_recv() {
                    Ok(next) => next,
                    Err(_) => {
                        open.remove(&key);
                        return;
                    }
                }
            }
        };
        let handling = process::handle(handler.clone(), next, config.clone());
        tokio::pin!(handling);
        loop {
            tokio::select! {
                () = &mut handling => break,
                Some(more) = receiver.recv() => waiting.push_back(more),
                _ = keep_alive.tick() => {
                    for held in &waiting {
                        super::settle::progress(&held.delivery, &config).await;
                    }
                }
            }
        }
    }
}
