//! [`QueueWaits`]: what each stage queue and the results queue still hold, looked up when a
//! step deadline comes due, so the state machine can tell a command (or its result) still
//! waiting behind a backlog, not charged its deadline, from one a worker took and went silent on.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use imagepipe_bus::{Bus, BusError};
use imagepipe_contracts::names::queues;
use imagepipe_contracts::{Priority, Step};
use imagepipe_runtime::clock::millis;
use imagepipe_runtime::error_chain;

use crate::machine::{Held, HeldSteps};

/// How long one look at a queue serves: the deadlines of a sweep that come due together share
/// it instead of asking the broker once each.
pub const FRESH_FOR: Duration = Duration::from_secs(1);

/// The queues looked at: the three stage queues in [`Step::ALL`] order, then the results queue.
const QUEUES: [&str; 4] = [queues::DOWNLOAD, queues::METADATA, queues::AI, queues::RESULTS];
const RESULTS: usize = 3;

/// The last look at each stage queue and the results queue (see the module docs).
pub struct QueueWaits {
    bus: Bus,
    /// Per queue of [`QUEUES`]: when it was looked at (Unix ms) and what it held.
    looked: Mutex<[(u64, Held); 4]>,
}

impl QueueWaits {
    /// Looks at the queues of `bus`.
    pub fn new(bus: Bus) -> Self {
        Self { bus, looked: Mutex::new([(0, Held::Nothing); 4]) }
    }

    /// What each step's queue and the results queue held at the last look (for the machine's
    /// [`Context`](crate::Context)).
    pub fn snapshot(&self) -> HeldSteps {
        let looked = *self.looked.lock().unwrap_or_else(PoisonError::into_inner);
        let results = looked[RESULTS].1;
        Step::ALL
            .into_iter()
            .zip(looked)
            .fold(HeldSteps::default(), |held, (step, (_, h))| held.with(step, h.and(results)))
    }

    /// Looks again at `step`'s queue and at the results queue, each unless its last look is
    /// under [`FRESH_FOR`] old at `now` (Unix ms). A broker that cannot be asked counts as
    /// holding nothing: the deadline then fires as it would without this check.
    pub async fn refresh(&self, step: Step, now: u64) {
        let stage = QUEUES.iter().position(|q| *q == step.queue()).unwrap_or_default();
        tokio::join!(self.look(stage, now), self.look(RESULTS, now));
    }

    /// Looks at queue `QUEUES[index]` unless the last look is fresh.
    async fn look(&self, index: usize, now: u64) {
        let last = self.looked.lock().unwrap_or_else(PoisonError::into_inner)[index].0;
        if last != 0 && now.saturating_sub(last) < millis(FRESH_FOR) {
            return;
        }
        let queue = QUEUES[index];
        let held = held(&self.bus, queue).await.unwrap_or_else(|error| {
            tracing::debug!(queue, error = %error_chain(&error), "asking what the queue holds");
            Held::Nothing
        });
        self.looked.lock().unwrap_or_else(PoisonError::into_inner)[index] = (now, held);
    }
}

/// What stage queue `queue` holds in all its priority lanes: since when, where the broker dates
/// its messages, else whether it has any.
pub async fn held(bus: &Bus, queue: &str) -> Result<Held, BusError> {
    let lanes = Priority::ALL.map(|p| p.lane(queue));
    let oldest = futures::future::try_join_all(lanes.iter().map(|lane| bus.queues.oldest(lane))).await?;
    if let Some(since) = oldest.into_iter().flatten().min() {
        return Ok(Held::Since(since));
    }
    let backlogs = futures::future::try_join_all(lanes.iter().map(|lane| bus.queues.backlog(lane))).await?;
    let undated = backlogs.into_iter().flatten().any(|b| b.depth() > 0);
    Ok(if undated { Held::Undated } else { Held::Nothing })
}
