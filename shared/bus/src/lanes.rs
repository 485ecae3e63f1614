//! [`Lanes`]: one [`Consumer`] over a queue's priority lanes (`tasks.download.high`,
//! `tasks.download`, `tasks.download.low`), serving higher lanes first while every backlogged
//! lane keeps a guaranteed share.
//!
//! - **Shares.** Each fetch hands its slots out by smooth weighted round-robin over the lanes
//!   (weights [`Shares`], 70/20/10 by default), the state kept across fetches, so a worker that
//!   takes one message at a time still serves the shares. A lane found empty gives its slots
//!   to the others, highest first: shares bind only under backlog.
//! - **Waiting.** When every lane is empty, one fetch per lane waits in the background and the
//!   first to bring messages wakes the caller. The others keep waiting; whatever they bring is
//!   kept (the *stash*) and handed out first by the next fetch, so no message is lost or left
//!   to its ack deadline by a cut-short fetch.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use imagepipe_contracts::Priority;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::config::ConsumerConfig;
use crate::delivery::Delivery;
use crate::error::BusError;
use crate::traits::{Consumer, TaskQueue};

/// Relative shares of the lanes under backlog, highest lane first: with `[70, 20, 10]`, of
/// every 100 messages taken while all three lanes wait, 70 are high, 20 normal, 10 low.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares(pub [u32; 3]);

impl Default for Shares {
    fn default() -> Self {
        Self([70, 20, 10])
    }
}

impl Shares {
    /// The share of `priority`.
    pub fn of(&self, priority: Priority) -> u32 {
        self.0[priority.index()]
    }
}

/// One lane: its consumer, what a background wait brought, and that wait.
struct Lane {
    priority: Priority,
    consumer: Arc<dyn Consumer>,
    stash: Mutex<VecDeque<Delivery>>,
    waiting: Mutex<Option<JoinHandle<()>>>,
}

/// A [`Consumer`] over the lanes of one queue (see the module docs).
pub struct Lanes {
    lanes: Vec<Arc<Lane>>,
    weights: Vec<i64>,
    /// Smooth weighted round-robin: each lane's current weight.
    current: Mutex<Vec<i64>>,
    woken: Arc<Notify>,
}

impl Lanes {
    /// Lanes over `consumers` (one per priority, any order) with `shares`. A share of 0 is
    /// served only when the other lanes are empty.
    pub fn new(consumers: Vec<(Priority, Box<dyn Consumer>)>, shares: Shares) -> Self {
        let mut lanes: Vec<Arc<Lane>> = consumers
            .into_iter()
            .map(|(priority, consumer)| {
                Arc::new(Lane {
                    priority,
                    consumer: Arc::from(consumer),
                    stash: Mutex::new(VecDeque::new()),
                    waiting: Mutex::new(None),
                })
            })
            .collect();
        lanes.sort_by_key(|lane| lane.priority);
        let weights = lanes.iter().map(|lane| i64::from(shares.of(lane.priority))).collect();
        let current = Mutex::new(vec![0; lanes.len()]);
        Self { lanes, weights, current, woken: Arc::new(Notify::new()) }
    }

    /// Opens a consumer on every lane of `queue` (see [`Priority::lane`]) and reads them as one.
    pub async fn open(
        queues: &dyn TaskQueue,
        queue: &str,
        config: ConsumerConfig,
        shares: Shares,
    ) -> Result<Self, BusError> {
        Ok(Self::new(Self::open_each(queues, queue, config).await?, shares))
    }

    /// Opens a consumer on every lane of `queue`, highest first, for a caller that reads some
    /// lanes on their own (the coordinator's express loops).
    pub async fn open_each(
        queues: &dyn TaskQueue,
        queue: &str,
        config: ConsumerConfig,
    ) -> Result<Vec<(Priority, Box<dyn Consumer>)>, BusError> {
        futures::future::try_join_all(Priority::ALL.map(|priority| {
            let (lane, config) = (priority.lane(queue), config.clone());
            async move { Ok::<_, BusError>((priority, queues.consume(&lane, config).await?)) }
        }))
        .await
    }

    /// Opens a consumer on partitions `partitions` of every lane of `queue`, highest first
    /// ([`TaskQueue::consume_partitions`]): the counterpart of [`open_each`](Self::open_each)
    /// for a coordinator reading the shards it owns. Each lane's partition `p` is its own
    /// (`tasks.results.high` partition 17 is not `tasks.results` partition 17).
    pub async fn open_each_partitions(
        queues: &dyn TaskQueue,
        queue: &str,
        partitions: &[u16],
        config: ConsumerConfig,
    ) -> Result<Vec<(Priority, Box<dyn Consumer>)>, BusError> {
        futures::future::try_join_all(Priority::ALL.map(|priority| {
            let (lane, config) = (priority.lane(queue), config.clone());
            async move { Ok::<_, BusError>((priority, queues.consume_partitions(&lane, partitions, config).await?)) }
        }))
        .await
    }

    /// How many of `slots` each lane gets, by smooth weighted round-robin over the lanes in
    /// `open`; a lane with weight 0 gets slots only when every open lane has weight 0.
    fn allot(&self, slots: usize, open: &[bool]) -> Vec<usize> {
        let mut counts = vec![0; self.lanes.len()];
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let weighted: Vec<usize> = (0..self.lanes.len()).filter(|&i| open[i] && self.weights[i] > 0).collect();
        if weighted.is_empty() {
            if let Some(first) = (0..self.lanes.len()).find(|&i| open[i]) {
                counts[first] = slots;
            }
            return counts;
        }
        let total: i64 = weighted.iter().map(|&i| self.weights[i]).sum();
        for _ in 0..slots {
            for &i in &weighted {
                current[i] += self.weights[i];
            }
            let best = weighted.iter().copied().max_by_key(|&i| (current[i], std::cmp::Reverse(i))).expect("not empty");
            current[best] -= total;
            counts[best] += 1;
        }
        counts
    }

    /// Takes up to `want` deliveries from `lane`: its stash first, then what its consumer has
    /// now (no waiting).
    async fn take(lane: &Lane, want: usize) -> Result<Vec<Delivery>, BusError> {
        let mut got: Vec<Delivery> = {
            let mut stash = lane.stash.lock().unwrap_or_else(|e| e.into_inner());
            let n = want.min(stash.len());
            stash.drain(..n).collect()
        };
        if got.len() < want {
            got.extend(lane.consumer.fetch(want - got.len(), Duration::ZERO).await?);
        }
        Ok(got)
    }

    /// Up to `max` deliveries available now, shared out between the lanes.
    async fn take_now(&self, max: usize) -> Result<Vec<Delivery>, BusError> {
        let mut open = vec![true; self.lanes.len()];
        let mut got = Vec::with_capacity(max);
        let mut first_error = None;
        while got.len() < max && open.iter().any(|o| *o) {
            let counts = self.allot(max - got.len(), &open);
            let takes = self
                .lanes
                .iter()
                .zip(&counts)
                .map(|(lane, &n)| async move { if n == 0 { Ok(Vec::new()) } else { Self::take(lane, n).await } });
            let results = futures::future::join_all(takes).await;
            for (i, result) in results.into_iter().enumerate() {
                match result {
                    Ok(batch) => {
                        if batch.len() < counts[i] {
                            open[i] = false;
                        }
                        got.extend(batch);
                    }
                    Err(error) => {
                        open[i] = false;
                        first_error.get_or_insert(error);
                    }
                }
            }
        }
        match first_error {
            Some(error) if got.is_empty() => Err(error),
            _ => Ok(got),
        }
    }

    /// Makes sure every lane has a background fetch waiting up to `wait`; each one stashes
    /// what it gets and wakes the caller when it ends.
    fn wait_all(&self, wait: Duration) {
        for lane in &self.lanes {
            let mut waiting = lane.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if waiting.as_ref().is_some_and(|handle| !handle.is_finished()) {
                continue;
            }
            let (lane_ref, woken) = (lane.clone(), self.woken.clone());
            *waiting = Some(tokio::spawn(async move {
                match lane_ref.consumer.fetch(1, wait).await {
                    Ok(batch) => lane_ref.stash.lock().unwrap_or_else(|e| e.into_inner()).extend(batch),
                    Err(error) => {
                        tracing::debug!(lane = %lane_ref.priority, error = %error, "waiting fetch of a lane failed");
                    }
                }
                // Empty-handed too: the caller then starts this lane's next wait.
                woken.notify_one();
            }));
        }
    }
}

#[async_trait]
impl Consumer for Lanes {
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let got = self.take_now(max).await?;
        if !got.is_empty() || wait.is_zero() {
            return Ok(got);
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.woken.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            self.wait_all(deadline.saturating_duration_since(tokio::time::Instant::now()));
            let woke = tokio::time::timeout_at(deadline, notified).await.is_ok();
            let got = self.take_now(max).await?;
            if !got.is_empty() || !woke {
                return Ok(got);
            }
        }
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        for lane in &self.lanes {
            if let Some(handle) = lane.waiting.lock().unwrap_or_else(|e| e.into_inner()).take() {
                handle.abort();
            }
        }
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests;
