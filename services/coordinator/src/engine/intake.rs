//! Intake: submissions (one or a batch) become queued tasks, started at once as far as the
//! in-flight cap has room; the rest wait for [`Engine::start_queued`].

use std::sync::atomic::Ordering;

use imagepipe_contracts::{ImageSource, Priority, SubmitError, SubmitTask, TraceId};
use imagepipe_runtime::error_text::error_chain;
use imagepipe_runtime::telemetry::current_trace_id;
use metrics::{counter, gauge};
use tracing::{Instrument, Span};

use super::apply::Item;
use super::relay::Outgoing;
use super::{Engine, EngineError, Handled, task_span};
use crate::machine::{self, Decision, Input, Verdict};
use crate::metrics as m;
use crate::slots::Slots;
use crate::store::{Applied, Created, ListQuery, StoreError};
use crate::task::{Task, TaskState};

/// Why a submission was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitFailure {
    /// The submit command breaks a rule; it never will be accepted.
    #[error(transparent)]
    Invalid(#[from] SubmitError),
    /// The `taskId` names an existing task with another source: a repeat must be the same
    /// submission. (An idempotency key returns its task whatever the source: the key is the
    /// caller's word that the two are one.)
    #[error(
        "task {} already exists with another source ({}); submit the new image under another taskId",
        .existing.id,
        describe_source(&.existing.source)
    )]
    Conflict {
        /// The existing task.
        existing: Box<Task>,
    },
    /// The store failed; try again.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A source for an error message: the URL without user info, query or fragment, or the blob key.
fn describe_source(source: &ImageSource) -> String {
    match source {
        ImageSource::Url(url) => {
            let end = url.find(['?', '#']).unwrap_or(url.len());
            url[..end].to_owned()
        }
        ImageSource::Blob(key) => key.clone(),
    }
}

/// A handled submission.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    /// The task (new, or the existing one with this id or idempotency key).
    pub task: Task,
    /// Whether this submission created it.
    pub created: bool,
}

/// One submission of a [`Engine::submit_batch`].
#[derive(Debug)]
pub struct Submission {
    /// The command.
    pub command: SubmitTask,
    /// The id of the task when the command has no `taskId`.
    pub derived_id: String,
    /// The span the submission arrived in: the new task joins its trace.
    pub span: Span,
}

/// Where a submission came from, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The submit queue.
    Bus,
    /// `POST /v1/tasks`.
    Http,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Bus => "bus",
            Origin::Http => "http",
        }
    }
}

impl Engine {
    /// Accepts a submission: validates it, returns the existing task for a known id or
    /// idempotency key, else creates a queued task (id from the command, or `new_id()`).
    /// Call [`start_queued`](Self::start_queued) afterwards to start it under the cap.
    pub async fn submit(
        &self,
        submit: &SubmitTask,
        origin: Origin,
        new_id: impl FnOnce() -> String,
    ) -> Result<Submitted, SubmitFailure> {
        let source = submit.validate().inspect_err(|_| {
            counter!(m::SUBMISSIONS_REJECTED, "origin" => origin.as_str()).increment(1);
        })?;
        if let Some(key) = &submit.idempotency_key
            && let Some(owner) = self.store.find_by_idempotency_key(key).await?
            && let Some(task) = self.store.get(&owner).await?
        {
            return Ok(Submitted { task, created: false });
        }
        let id = submit.task_id.clone().unwrap_or_else(new_id);
        if let Some(task) = self.store.get(&id).await? {
            if task.source != source {
                counter!(m::SUBMISSIONS_REJECTED, "origin" => origin.as_str()).increment(1);
                return Err(SubmitFailure::Conflict { existing: Box::new(task) });
            }
            return Ok(Submitted { task, created: false });
        }
        let trace_id = current_trace_id().unwrap_or_else(TraceId::random);
        let decision = machine::create(id, submit, source, trace_id, self.clock.unix_ms());
        match self.store.create(&decision).await? {
            Created::New => {
                counter!(m::TASKS_CREATED, "origin" => origin.as_str()).increment(1);
                tracing::info!(task_id = %decision.task.id, %trace_id, "task created");
                self.publish(&decision.task.id, &decision.outbox).await;
                Ok(Submitted { task: decision.task, created: true })
            }
            Created::Existing(task) => Ok(Submitted { task: *task, created: false }),
        }
    }

    /// [`submit`](Self::submit) for a batch, one result per submission, in order: the new ids
    /// are looked up in one store round trip, the new tasks written in one and, when nothing
    /// older is queued, started in one more as far as the cap has room; then their
    /// `task.created` events and first commands are relayed together. A new task returned
    /// still queued waits for [`start_queued`](Self::start_queued). A submission with an
    /// idempotency key, or with an id an earlier one of the batch has, takes the one-by-one path
    /// (after the others), as does every one of a batch whose store call failed.
    pub async fn submit_batch(
        &self,
        submissions: &[Submission],
        origin: Origin,
    ) -> Vec<Result<Submitted, SubmitFailure>> {
        let mut results = Slots::new(submissions.len());
        let (mut fresh, mut one_by_one) = (Vec::new(), Vec::new());
        let mut ids = std::collections::HashSet::new();
        for (i, submission) in submissions.iter().enumerate() {
            let command = &submission.command;
            let id = command.task_id.clone().unwrap_or_else(|| submission.derived_id.clone());
            match command.validate() {
                Err(e) => {
                    counter!(m::SUBMISSIONS_REJECTED, "origin" => origin.as_str()).increment(1);
                    results.fill(i, Err(e.into()));
                }
                Ok(_) if command.idempotency_key.is_some() || !ids.insert(id.clone()) => one_by_one.push(i),
                Ok(source) => fresh.push((i, id, source)),
            }
        }
        let lookup: Vec<&str> = fresh.iter().map(|(_, id, _)| id.as_str()).collect();
        match self.store.get_many(&lookup).await {
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "submissions not looked up as a batch; one by one instead");
                one_by_one.extend(fresh.iter().map(|(i, _, _)| *i));
                fresh.clear();
            }
            Ok(existing) => {
                let mut new = Vec::with_capacity(fresh.len());
                for ((i, id, source), existing) in fresh.drain(..).zip(existing) {
                    match existing {
                        Some(task) if task.source != source => {
                            counter!(m::SUBMISSIONS_REJECTED, "origin" => origin.as_str()).increment(1);
                            results.fill(i, Err(SubmitFailure::Conflict { existing: Box::new(task) }));
                        }
                        Some(task) => results.fill(i, Ok(Submitted { task, created: false })),
                        None => new.push((i, id, source)),
                    }
                }
                fresh = new;
            }
        }
        let now = self.clock.unix_ms();
        let decisions: Vec<Decision> = fresh
            .iter()
            .map(|(i, id, source)| {
                let submission = &submissions[*i];
                let trace_id = submission.span.in_scope(current_trace_id).unwrap_or_else(TraceId::random);
                machine::create(id.clone(), &submission.command, source.clone(), trace_id, now)
            })
            .collect();
        match self.store.apply_many(&decisions).await {
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "submissions not written as a batch; one by one instead");
                one_by_one.extend(fresh.iter().map(|(i, _, _)| *i));
            }
            Ok(applied) => {
                let mut created = Vec::new();
                for (((i, _, _), decision), applied) in fresh.iter().zip(decisions).zip(applied) {
                    match applied {
                        Applied::Yes => {
                            counter!(m::TASKS_CREATED, "origin" => origin.as_str()).increment(1);
                            let span =
                                submissions[*i].span.in_scope(|| task_span(&decision.task, "transition", "create"));
                            let (id, trace_id) = (&decision.task.id, decision.task.trace_id);
                            span.in_scope(|| tracing::info!(task_id = %id, %trace_id, "task created"));
                            created.push((*i, decision, span));
                        }
                        // created meanwhile by someone else: the one-by-one path reads it
                        Applied::Conflict | Applied::Fenced => one_by_one.push(*i),
                    }
                }
                let started = self.start_created(&created).await;
                let outgoing: Vec<Outgoing<'_>> = created
                    .iter()
                    .zip(&started)
                    .map(|((_, created, span), started)| {
                        let out = Outgoing::new(&created.task.id, None).with(&created.outbox, span.clone());
                        match started {
                            Some((start, span)) => {
                                Outgoing { state: Some(start.task.state), ..out }.with(&start.outbox, span.clone())
                            }
                            None => out,
                        }
                    })
                    .collect();
                self.relay_batch(&outgoing).await;
                for ((i, created, _), started) in created.into_iter().zip(started) {
                    let task = started.map_or(created.task, |(start, _)| start.task);
                    results.fill(i, Ok(Submitted { task, created: true }));
                }
            }
        }
        one_by_one.sort_unstable();
        for i in one_by_one {
            let submission = &submissions[i];
            let submitted = self.submit(&submission.command, origin, || submission.derived_id.clone());
            results.fill(i, submitted.instrument(submission.span.clone()).await);
        }
        self.start_wanted_passes().await;
        results.into_vec()
    }

    /// Starts just-created tasks (in order, as many as the cap has room for) without reading
    /// them again, when no other task is queued: an older queued task starts first, through
    /// [`start_queued`](Self::start_queued). The start decision and its span per task, `None`
    /// where it was not started. Its outbox is left to relay, after the creation's.
    async fn start_created(&self, created: &[(usize, Decision, Span)]) -> Vec<Option<(Decision, Span)>> {
        let mut started: Vec<Option<(Decision, Span)>> = created.iter().map(|_| None).collect();
        if created.is_empty() {
            return started;
        }
        let _one_pass = self.starting.lock().await;
        let (in_flight, queued) = tokio::join!(self.in_flight(), self.store.count_queued());
        let (Ok(in_flight), Ok(queued)) = (in_flight, queued) else { return started };
        // Older queued tasks start first (start_queued), but a high one never waits behind a
        // backlog: it may take the cap's headroom.
        let others_queued = queued > created.len() as u64;
        let mut room = usize::try_from(self.config.max_in_flight.saturating_sub(in_flight)).unwrap_or(usize::MAX);
        let mut high_room = usize::try_from(self.high_cap().saturating_sub(in_flight)).unwrap_or(usize::MAX);
        let now = self.clock.unix_ms();
        let (mut decisions, mut which) = (Vec::new(), Vec::new());
        let startable = created.iter().enumerate().filter(|(_, (_, created, _))| {
            let high = created.task.priority == Priority::High;
            let fits = if high { high_room > 0 } else { !others_queued && room > 0 };
            if fits {
                high_room = high_room.saturating_sub(1);
                room = room.saturating_sub(1);
            }
            fits
        });
        for (k, (_, created, parent)) in startable {
            let span = parent.in_scope(|| task_span(&created.task, "transition", Input::Start.kind()));
            if let Ok(Verdict::Apply(mut decision)) = span.in_scope(|| self.decide(&created.task, &Input::Start, now))
                && self.fence(&mut decision, &Input::Start).is_ok()
            {
                decisions.push(*decision);
                which.push((k, span));
            }
        }
        match self.store.apply_many(&decisions).await {
            Ok(applied) => {
                for ((decision, (k, span)), applied) in decisions.into_iter().zip(which).zip(applied) {
                    if applied == Applied::Yes {
                        span.in_scope(|| self.written(&decision));
                        started[k] = Some((decision, span));
                    } else {
                        counter!(m::CONFLICTS).increment(1);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "new tasks not started; start_queued starts them"),
        }
        started
    }

    /// Starts the oldest queued tasks while there is room under the cap; returns how many this
    /// call started. One pass at a time per process: a call while a pass runs does not wait
    /// for it but has it (or the next holder of the pass) run once more, so a loop that just
    /// finished tasks is not held up by another loop's pass and no request for a pass is lost.
    pub async fn start_queued(&self) -> Result<usize, EngineError> {
        self.start_wanted.store(true, Ordering::SeqCst);
        let mut started = 0;
        loop {
            {
                // Held: its holder sees the flag once it lets go.
                let Ok(_one_pass) = self.starting.try_lock() else { return Ok(started) };
                if self.start_wanted.swap(false, Ordering::SeqCst) {
                    started += self.start_pass().await?;
                    continue;
                }
            }
            // A call between the swap and the unlock found the pass held and left it to us.
            if !self.start_wanted.load(Ordering::SeqCst) {
                return Ok(started);
            }
        }
    }

    /// Has a start pass run if one was asked for while [`start_created`](Self::start_created)
    /// held the pass.
    async fn start_wanted_passes(&self) {
        if self.start_wanted.load(Ordering::SeqCst)
            && let Err(e) = self.start_queued().await
        {
            tracing::warn!(error = %e, "queued tasks not started; the sweeper starts them");
        }
    }

    /// One pass of [`start_queued`](Self::start_queued), under its lock: reads only what
    /// can start (nothing while no task is queued anywhere; past the room under the cap, only
    /// high tasks), and starts it as one batch.
    async fn start_pass(&self) -> Result<usize, EngineError> {
        let (in_flight, queued) = tokio::try_join!(self.in_flight(), self.store.count_queued())?;
        let room = self.config.max_in_flight.saturating_sub(in_flight);
        let high_room = self.high_cap().saturating_sub(in_flight);
        if high_room == 0 || queued == 0 {
            return Ok(0);
        }
        // Queued tasks list high first: past the cap, only high ones start (in its headroom).
        let limit = high_room.min(256) as usize;
        let queued = match &self.ownership {
            Some(ownership) => {
                let owned = ownership.shards();
                if owned.is_empty() {
                    return Ok(0);
                }
                self.store.queued_in(&owned, room.min(256) as usize, limit).await?
            }
            None => {
                let query = ListQuery { state: Some(TaskState::Queued), limit, ..ListQuery::default() };
                self.store.list(&query).await?.tasks
            }
        };
        let queued: Vec<Task> = queued
            .into_iter()
            .enumerate()
            .filter(|(i, task)| (*i as u64) < room || task.priority == Priority::High)
            .map(|(_, task)| task)
            .collect();
        let start = Input::Start;
        let mut started = 0;
        let current = Span::current();
        let items = queued.into_iter().map(|task| Item::new(task, &start, &current, false)).collect();
        for handled in self.apply_round(items).await {
            if let Handled::Applied(_) = handled? {
                started += 1;
            }
        }
        Ok(started)
    }

    /// The in-flight cap as `high` tasks see it: `max_in_flight` and a tenth more, so a high
    /// task starts at once even when a backlog fills the cap.
    pub fn high_cap(&self) -> u64 {
        let cap = self.config.max_in_flight;
        cap.saturating_add((cap / 10).max(1))
    }

    /// Tasks started and unfinished now (also sets the gauge).
    pub async fn in_flight(&self) -> Result<u64, StoreError> {
        let n = self.store.count_in_flight().await?;
        gauge!(m::IN_FLIGHT).set(n as f64);
        Ok(n)
    }

    /// Whether there is room under the cap (also sets the gauges, so `/metrics` says why
    /// submissions wait).
    pub async fn has_room(&self) -> Result<bool, StoreError> {
        let room = self.in_flight().await? < self.config.max_in_flight;
        gauge!(m::SUBMISSIONS_PAUSED, "reason" => m::PAUSED_BY_CAP).set(if room { 0.0 } else { 1.0 });
        Ok(room)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use imagepipe_bus::memory::{MemoryBus, MemoryConfig};
    use imagepipe_contracts::SubmitTask;
    use imagepipe_runtime::clock::ManualClock;

    use super::*;
    use crate::engine::EngineConfig;
    use crate::store::TaskStore;
    use crate::store::embedded::EmbeddedStore;

    #[tokio::test]
    async fn a_start_asked_for_during_a_pass_does_not_wait_and_is_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn TaskStore> = Arc::new(EmbeddedStore::open(dir.path(), Duration::from_secs(5)).unwrap());
        let bus = MemoryBus::new("imagepipe".into(), MemoryConfig::default()).into_bus();
        let clock = Arc::new(ManualClock::at_unix_ms(1_700_000_000_000));
        let engine = Engine::new(store, bus, clock, EngineConfig { max_in_flight: 10, ..EngineConfig::default() });
        for i in 0..3 {
            let submit =
                SubmitTask { task_id: Some(format!("tsk_wait{i}")), ..SubmitTask::url("https://example.com/a.jpg") };
            engine.submit(&submit, Origin::Http, || unreachable!()).await.unwrap();
        }
        // Another loop's pass holds the lock: asking returns at once, leaving the request behind.
        let held = engine.starting.clone().try_lock_owned().unwrap();
        let asked = tokio::time::timeout(Duration::from_secs(1), engine.start_queued()).await;
        assert_eq!(asked.expect("asking for a pass does not wait for the running one").unwrap(), 0);
        assert!(engine.start_wanted.load(Ordering::SeqCst), "the request is left for the holder");
        drop(held);
        // The holder (here the next caller) runs the pass that was asked for.
        assert_eq!(engine.start_queued().await.unwrap(), 3);
        assert!(!engine.start_wanted.load(Ordering::SeqCst));
    }
}
