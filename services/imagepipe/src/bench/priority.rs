//! `imagepipe bench --scenario priority`: how long a `high` task takes with a backlog of `low`
//! ones ahead of it, beside the same on an idle pipeline.
//!
//! 1. *Idle*: `probes` high tasks, one at a time: submit → `task.completed`.
//! 2. *Backlog*: `backlog` low tasks submitted at once on the low submit lane; once they are
//!    sent, `probes` high tasks one at a time again, each timed the same way, while the low
//!    ones drain. How many low tasks finished meanwhile, and how many were left when the last
//!    probe finished, show the backlog was there throughout.
//! 3. Every low task is waited for, so the run ends clean.

use std::collections::HashSet;
use std::time::Duration;

use imagepipe_bus::Bus;
use imagepipe_contracts::{Priority, SubmitTask};
use serde::Serialize;
use tokio::time::Instant;

use super::driver::{DriverError, Observer, Phase, submit_message};
use super::stats::Percentiles;

/// Submit commands go out in batches of this many.
const SUBMIT_BATCH: usize = 128;

/// What the priority scenario measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PriorityFigures {
    /// Low tasks queued ahead of the probes.
    pub backlog: usize,
    /// High tasks timed in each phase.
    pub probes: usize,
    /// A high task on an idle pipeline: submit → `task.completed`.
    pub idle: Percentiles,
    /// A high task with the low backlog queued.
    pub under_backlog: Percentiles,
    /// `under_backlog.p50 / idle.p50`: the target is at most 3.
    pub ratio_p50: f64,
    /// Low tasks that finished while the probes ran.
    pub low_done_during_probes: usize,
    /// Low tasks not yet finished when the last probe finished.
    pub low_left_after_probes: usize,
    /// Low tasks per second over the whole backlog.
    pub low_tasks_per_s: f64,
}

impl PriorityFigures {
    /// Each figure's median across `runs`; `None` without any.
    pub fn median(runs: &[&Self]) -> Option<Self> {
        let first = runs.first()?;
        let median = |f: &dyn Fn(&Self) -> f64| super::stats::median(runs.iter().map(|r| f(r)));
        let percentiles =
            |f: &dyn Fn(&Self) -> Percentiles| Percentiles::median(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
        Some(Self {
            backlog: first.backlog,
            probes: first.probes,
            idle: percentiles(&|r| r.idle),
            under_backlog: percentiles(&|r| r.under_backlog),
            ratio_p50: median(&|r| r.ratio_p50),
            low_done_during_probes: median(&|r| r.low_done_during_probes as f64) as usize,
            low_left_after_probes: median(&|r| r.low_left_after_probes as f64) as usize,
            low_tasks_per_s: median(&|r| r.low_tasks_per_s),
        })
    }
}

/// The high and low submit commands of a run.
pub struct Probes {
    /// High tasks for the idle phase.
    pub idle: Vec<SubmitTask>,
    /// Low tasks of the backlog.
    pub backlog: Vec<SubmitTask>,
    /// High tasks for the backlog phase.
    pub under_backlog: Vec<SubmitTask>,
}

/// Runs the scenario's phases; the low phase as a [`Phase`] too (for the run's load figures).
pub async fn phases(
    bus: &Bus,
    observer: &mut Observer,
    probes: Probes,
    timeout: Duration,
) -> Result<(PriorityFigures, Phase), DriverError> {
    let count = probes.idle.len();
    let idle = time_each(bus, observer, &probes.idle, timeout, &mut |_| {}).await?;

    let low_ids: HashSet<String> = probes.backlog.iter().filter_map(|s| s.task_id.clone()).collect();
    let started = Instant::now();
    for chunk in probes.backlog.chunks(SUBMIT_BATCH) {
        let lane = Priority::Low.lane(imagepipe_contracts::names::queues::SUBMIT);
        bus.queues.send_batch(&lane, chunk.iter().map(submit_message).collect()).await.map_err(DriverError::Submit)?;
    }
    let mut low_done = HashSet::new();
    let mut count_low = |id: &str| {
        if low_ids.contains(id) {
            low_done.insert(id.to_owned());
        }
    };
    let under = time_each(bus, observer, &probes.under_backlog, timeout, &mut count_low).await?;
    let done_during = low_done.len();
    let left = low_ids.len() - done_during;
    let deadline = Instant::now() + timeout;
    let mut last = Instant::now();
    while low_done.len() < low_ids.len() {
        match observer.next(deadline).await {
            Some(end) => {
                if low_ids.contains(&end.task_id) && low_done.insert(end.task_id) {
                    last = end.at;
                }
            }
            None => {
                return Err(DriverError::Timeout {
                    expected: low_ids.len(),
                    finished: low_done.len(),
                    waited: timeout,
                });
            }
        }
    }
    let wall = last.saturating_duration_since(started);
    let (idle_p, under_p) = (Percentiles::of(&idle), Percentiles::of(&under));
    let figures = PriorityFigures {
        backlog: low_ids.len(),
        probes: count,
        ratio_p50: if idle_p.p50_ms > 0.0 { under_p.p50_ms / idle_p.p50_ms } else { 0.0 },
        idle: idle_p,
        under_backlog: under_p,
        low_done_during_probes: done_during,
        low_left_after_probes: left,
        low_tasks_per_s: low_ids.len() as f64 / wall.as_secs_f64().max(1e-9),
    };
    let phase = Phase { submitted: low_ids.len(), completed: low_ids.len(), failed: 0, wall, latencies: under };
    Ok((figures, phase))
}

/// Submits each of `submits` on its priority's submit lane and waits for its end before the
/// next; every other task's end goes to `other`. The latencies, in order.
async fn time_each(
    bus: &Bus,
    observer: &mut Observer,
    submits: &[SubmitTask],
    timeout: Duration,
    other: &mut dyn FnMut(&str),
) -> Result<Vec<Duration>, DriverError> {
    let mut latencies = Vec::with_capacity(submits.len());
    for (n, submit) in submits.iter().enumerate() {
        let id = submit.task_id.clone().unwrap_or_default();
        let lane = submit.lane();
        let sent = Instant::now();
        bus.queues.send(&lane, submit_message(submit)).await.map_err(DriverError::Submit)?;
        let deadline = sent + timeout;
        loop {
            match observer.next(deadline).await {
                Some(end) if end.task_id == id => {
                    latencies.push(end.at.saturating_duration_since(sent));
                    break;
                }
                Some(end) => other(&end.task_id),
                None => return Err(DriverError::Timeout { expected: submits.len(), finished: n, waited: timeout }),
            }
        }
    }
    Ok(latencies)
}
