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

/// The last look at each stage queue and the results queue (see the module docs).
pub struct QueueWaits {
    bus: Bus,
    /// The pipeline's steps, in order.
    steps: Box<[Step]>,
    /// Per step of `steps`, then the results queue: when it was looked at (Unix ms) and what
    /// it held.
    looked: Mutex<Vec<(u64, Held)>>,
}

impl QueueWaits {
    /// Looks at the queues of `steps` (the pipeline's) and the results queue on `bus`.
    pub fn new(bus: Bus, steps: impl IntoIterator<Item = Step>) -> Self {
        let steps: Box<[Step]> = steps.into_iter().collect();
        let looked = Mutex::new(vec![(0, Held::Nothing); steps.len() + 1]);
        Self { bus, steps, looked }
    }

    /// What each step's queue and the results queue held at the last look (for the machine's
    /// [`Context`](crate::Context)).
    pub fn snapshot(&self) -> HeldSteps {
        let looked = self.looked.lock().unwrap_or_else(PoisonError::into_inner);
        let results = looked[self.steps.len()].1;
        self.steps.iter().zip(looked.iter()).fold(HeldSteps::default(), |held, (&step, &(_, h))| match h.and(results) {
            Held::Nothing => held,
            h => held.with(step, h),
        })
    }

    /// Looks again at `step`'s queue and at the results queue, each unless its last look is
    /// under [`FRESH_FOR`] old at `now` (Unix ms). A broker that cannot be asked counts as
    /// holding nothing: the deadline then fires as it would without this check.
    pub async fn refresh(&self, step: Step, now: u64) {
        let results = self.steps.len();
        match self.steps.iter().position(|s| *s == step) {
            Some(index) => {
                tokio::join!(self.look(index, now), self.look(results, now));
            }
            None => self.look(results, now).await,
        }
    }

    /// Looks at the queue of slot `index` (a step of `steps`, or the results queue) unless the
    /// last look is fresh.
    async fn look(&self, index: usize, now: u64) {
        let last = self.looked.lock().unwrap_or_else(PoisonError::into_inner)[index].0;
        if last != 0 && now.saturating_sub(last) < millis(FRESH_FOR) {
            return;
        }
        let queue = self.steps.get(index).map_or(queues::RESULTS, |step| step.queue());
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
