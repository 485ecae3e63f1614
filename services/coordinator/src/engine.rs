//! The coordinator's core: applies inputs to tasks through the store, relays the outbox,
//! fires timers and starts queued tasks under the in-flight cap.

use std::sync::Arc;
use std::time::Duration;

use imagepipe_bus::{Bus, BusError, Message};
use imagepipe_contracts::names::{self, headers};
use imagepipe_contracts::{ImageSource, Priority, SCHEMA_VERSION, StepError, SubmitError, SubmitTask, TraceId};
use imagepipe_runtime::clock::Clock;
use imagepipe_runtime::control::{ControlStore, MemoryControl};
use imagepipe_runtime::shutdown::Shutdown;
use imagepipe_runtime::telemetry::{current_trace_id, inject_trace, join_trace};
use metrics::{counter, gauge};
use tracing::{Instrument, Span};

use crate::control::QueueControls;
use crate::machine::{self, Context, Decision, Ignored, IllegalTransition, Input, Policy, Verdict};
use crate::metrics as m;
use crate::queue_wait::QueueWaits;
use crate::store::{Applied, Created, DeadLetter, ListQuery, Settled, StoreError, TaskStore};
use crate::task::{Destination, OutboxEntry, Task, TaskState, TimerKind};

/// How many times a transition is decided again after losing its compare-and-set.
const MAX_CONFLICTS: usize = 16;

/// Engine settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Retry and deadline rules.
    pub policy: Policy,
    /// Most tasks started and unfinished at once.
    pub max_in_flight: u64,
    /// How long a claimed wake-index entry is this replica's before another may take it.
    pub lease: Duration,
    /// Most due tasks handled per sweep.
    pub sweep_batch: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self { policy: Policy::default(), max_in_flight: 1_000, lease: Duration::from_secs(30), sweep_batch: 256 }
    }
}

/// Something that kept an input from being handled.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The store failed; try again. (Shared: one failed batch call fails each of its inputs.)
    #[error(transparent)]
    Store(Arc<StoreError>),
    /// No task has this id.
    #[error("no task {0}")]
    UnknownTask(String),
    /// The input has no edge from the task's state (logged and counted).
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
    /// Other writers kept changing the task; try again.
    #[error("task {0} kept changing under {MAX_CONFLICTS} attempts to update it")]
    Contention(String),
}

impl From<StoreError> for EngineError {
    fn from(error: StoreError) -> Self {
        Self::Store(Arc::new(error))
    }
}

/// What [`Engine::decide`] made of an input.
enum Decided {
    Apply(Box<Decision>),
    Ignore(Ignored),
}

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

/// What an input did.
#[derive(Debug, Clone, PartialEq)]
pub enum Handled {
    /// A transition was written; the task after it.
    Applied(Box<Task>),
    /// Acknowledged without effect.
    Ignored(Ignored),
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

/// The coordinator: the only writer of task state. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    store: Arc<dyn TaskStore>,
    bus: Bus,
    clock: Arc<dyn Clock>,
    config: Arc<EngineConfig>,
    /// One [`Engine::start_queued`] pass at a time in this process: passes racing each other
    /// would only lose compare-and-sets to each other.
    starting: Arc<tokio::sync::Mutex<()>>,
    /// The tasks this process wrote last, so the next input is decided without reading.
    recent: Arc<Recent>,
    /// The operator controls: which stages are paused (their deadlines start over).
    controls: QueueControls,
    /// What the stage queues hold (a deadline whose command may still wait is postponed).
    waits: Arc<QueueWaits>,
}

/// Tasks as this process last wrote them (unfinished ones, at most four times the in-flight
/// cap): the next input of such a task is decided on this copy instead of a store read. A copy
/// gone stale (another replica wrote the task since) loses its compare-and-set, and an input it
/// would not apply is decided again on the stored task, so a stale copy costs a read, never a
/// wrong transition.
#[derive(Default)]
struct Recent(std::sync::Mutex<std::collections::HashMap<String, Task>>);

impl Recent {
    fn get(&self, id: &str) -> Option<Task> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(id).cloned()
    }

    fn put(&self, task: &Task, max_in_flight: u64) {
        let mut tasks = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if task.state.is_terminal() {
            tasks.remove(&task.id);
            return;
        }
        if tasks.get(&task.id).is_some_and(|known| known.version >= task.version) {
            return;
        }
        if tasks.len() as u64 >= max_in_flight.saturating_mul(4).max(64) {
            tasks.clear();
        }
        tasks.insert(task.id.clone(), task.clone());
    }
}

/// One input of an [`Engine::apply_round`], on its task.
struct Item<'a> {
    task: Task,
    input: &'a Input,
    /// Whether `task` is this process's copy ([`Recent`]) rather than read from the store.
    recent: bool,
    /// The span the input arrived in.
    parent: &'a Span,
}

impl<'a> Item<'a> {
    fn new(task: Task, input: &'a Input, parent: &'a Span, recent: bool) -> Self {
        Self { task, input, recent, parent }
    }
}

impl Engine {
    /// An engine over `store`, sending on `bus`, telling time by `clock`.
    pub fn new(store: Arc<dyn TaskStore>, bus: Bus, clock: Arc<dyn Clock>, config: EngineConfig) -> Self {
        gauge!(m::IN_FLIGHT_CAP).set(config.max_in_flight as f64);
        Self {
            store,
            waits: Arc::new(QueueWaits::new(bus.clone())),
            controls: QueueControls::new(Arc::new(MemoryControl::ephemeral()), clock.clone()),
            bus,
            clock,
            config: Arc::new(config),
            starting: Arc::default(),
            recent: Arc::default(),
        }
    }

    /// The same engine with its operator controls kept in `control` (by default in this
    /// engine's memory only).
    pub fn with_control(mut self, control: Arc<dyn ControlStore>) -> Self {
        self.controls = QueueControls::new(control, self.clock.clone());
        self
    }

    /// The operator controls.
    pub fn controls(&self) -> &QueueControls {
        &self.controls
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn TaskStore> {
        &self.store
    }

    /// The bus.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

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
        let mut results: Vec<Option<Result<Submitted, SubmitFailure>>> = submissions.iter().map(|_| None).collect();
        let (mut fresh, mut one_by_one) = (Vec::new(), Vec::new());
        let mut ids = std::collections::HashSet::new();
        for (i, submission) in submissions.iter().enumerate() {
            let command = &submission.command;
            let id = command.task_id.clone().unwrap_or_else(|| submission.derived_id.clone());
            match command.validate() {
                Err(e) => {
                    counter!(m::SUBMISSIONS_REJECTED, "origin" => origin.as_str()).increment(1);
                    results[i] = Some(Err(e.into()));
                }
                Ok(_) if command.idempotency_key.is_some() || !ids.insert(id.clone()) => one_by_one.push(i),
                Ok(source) => fresh.push((i, id, source)),
            }
        }
        let lookup: Vec<&str> = fresh.iter().map(|(_, id, _)| id.as_str()).collect();
        match self.store.get_many(&lookup).await {
            Err(e) => {
                tracing::warn!(error = %e, "submissions not looked up as a batch; one by one instead");
                one_by_one.extend(fresh.iter().map(|(i, _, _)| *i));
                fresh.clear();
            }
            Ok(existing) => {
                let mut new = Vec::with_capacity(fresh.len());
                for ((i, id, source), existing) in fresh.drain(..).zip(existing) {
                    match existing {
                        Some(task) if task.source != source => {
                            counter!(m::SUBMISSIONS_REJECTED, "origin" => origin.as_str()).increment(1);
                            results[i] = Some(Err(SubmitFailure::Conflict { existing: Box::new(task) }));
                        }
                        Some(task) => results[i] = Some(Ok(Submitted { task, created: false })),
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
                tracing::warn!(error = %e, "submissions not written as a batch; one by one instead");
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
                        Applied::Conflict => one_by_one.push(*i),
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
                    results[i] = Some(Ok(Submitted { task, created: true }));
                }
            }
        }
        one_by_one.sort_unstable();
        for i in one_by_one {
            let submission = &submissions[i];
            let submitted = self.submit(&submission.command, origin, || submission.derived_id.clone());
            results[i] = Some(submitted.instrument(submission.span.clone()).await);
        }
        results.into_iter().map(|r| r.expect("every submission has a result")).collect()
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
            if let Ok(Decided::Apply(decision)) = span.in_scope(|| self.decide(&created.task, &Input::Start, now)) {
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

    /// Applies `input` to task `id`: decides, writes with compare-and-set (deciding again on
    /// a conflict), then relays the transition's outbox; all of it in a span of the task's trace.
    pub async fn handle(&self, id: &str, input: Input) -> Result<Handled, EngineError> {
        let mut handled = self.handle_batch(vec![(id.to_owned(), input, Span::current())]).await;
        handled.pop().unwrap_or_else(|| Err(EngineError::UnknownTask(id.to_owned())))
    }

    /// Applies a batch of inputs `(task id, input)`, one result per input, in order. Inputs of
    /// one task are applied in their order, one per round; each round reads its tasks in one
    /// store round trip, decides each with [`machine::decide`], writes every transition in one
    /// round trip (each its own compare-and-set), then relays every outbox
    /// ([`relay_batch`](Self::relay_batch)). A transition that lost its compare-and-set is
    /// read, decided and written again on its own.
    ///
    /// Each input comes with the span it arrived in (a message's): the task's work on it is
    /// a child of that span.
    pub async fn handle_batch(&self, inputs: Vec<(String, Input, Span)>) -> Vec<Result<Handled, EngineError>> {
        let mut rounds: Vec<Vec<usize>> = Vec::new();
        let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for (i, (id, _, _)) in inputs.iter().enumerate() {
            let round = seen.entry(id.as_str()).or_default();
            if rounds.len() == *round {
                rounds.push(Vec::new());
            }
            rounds[*round].push(i);
            *round += 1;
        }
        let mut results: Vec<Option<Result<Handled, EngineError>>> = inputs.iter().map(|_| None).collect();
        for round in rounds {
            let mut found = Vec::with_capacity(round.len());
            let mut unread = Vec::new();
            for &i in &round {
                match self.recent.get(&inputs[i].0) {
                    Some(task) => found.push((i, task, true)),
                    None => unread.push(i),
                }
            }
            let ids: Vec<&str> = unread.iter().map(|&i| inputs[i].0.as_str()).collect();
            let tasks = match self.store.get_many(&ids).await {
                Ok(tasks) => tasks,
                Err(e) => {
                    let e = Arc::new(e);
                    for &i in &unread {
                        results[i] = Some(Err(EngineError::Store(e.clone())));
                    }
                    Vec::new()
                }
            };
            for (&i, task) in unread.iter().zip(tasks) {
                match task {
                    Some(task) => found.push((i, task, false)),
                    None => results[i] = Some(Err(EngineError::UnknownTask(inputs[i].0.clone()))),
                }
            }
            let (indexes, items): (Vec<usize>, Vec<Item<'_>>) = found
                .into_iter()
                .map(|(i, task, recent)| (i, Item::new(task, &inputs[i].1, &inputs[i].2, recent)))
                .unzip();
            for (i, handled) in indexes.into_iter().zip(self.apply_round(items).await) {
                results[i] = Some(handled);
            }
        }
        results.into_iter().map(|r| r.expect("every input belongs to one round")).collect()
    }

    /// Decides each `(task as read, input)` (of distinct tasks), writes the transitions in one
    /// store call, relays their outboxes together, and handles the lost compare-and-sets one
    /// by one. One result per item, in order.
    async fn apply_round(&self, items: Vec<Item<'_>>) -> Vec<Result<Handled, EngineError>> {
        let now = self.clock.unix_ms();
        let mut results: Vec<Option<Result<Handled, EngineError>>> = items.iter().map(|_| None).collect();
        let (mut decisions, mut decided) = (Vec::new(), Vec::new());
        let mut lost = Vec::new();
        for (i, Item { task, input, recent, parent }) in items.iter().enumerate() {
            let span = parent.in_scope(|| task_span(task, "transition", input.kind()));
            if *recent {
                // Only a transition is checked by its compare-and-set: anything else is decided
                // again on the stored task.
                match self.verdict(task, input, now) {
                    Ok(Verdict::Apply(decision)) => {
                        decisions.push(*decision);
                        decided.push((i, span));
                    }
                    _ => lost.push((i, span)),
                }
                continue;
            }
            match span.in_scope(|| self.decide(task, input, now)) {
                Ok(Decided::Apply(decision)) => {
                    decisions.push(*decision);
                    decided.push((i, span));
                }
                Ok(Decided::Ignore(why)) => results[i] = Some(Ok(Handled::Ignored(why))),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let applied = match self.store.apply_many(&decisions).await {
            Ok(applied) => applied,
            Err(e) => {
                let e = Arc::new(e);
                for (i, _) in &decided {
                    results[*i] = Some(Err(EngineError::Store(e.clone())));
                }
                return results.into_iter().map(|r| r.expect("every item has a result")).collect();
            }
        };
        let mut written = Vec::new();
        for ((decision, (i, span)), applied) in decisions.into_iter().zip(decided).zip(applied) {
            match applied {
                Applied::Yes => {
                    span.in_scope(|| self.written(&decision));
                    written.push((i, decision, span));
                }
                Applied::Conflict => {
                    counter!(m::CONFLICTS).increment(1);
                    lost.push((i, span));
                }
            }
        }
        let outgoing: Vec<Outgoing<'_>> = written
            .iter()
            .map(|(_, d, span)| Outgoing::new(&d.task.id, Some(d.task.state)).with(&d.outbox, span.clone()))
            .collect();
        self.relay_batch(&outgoing).await;
        for (i, decision, _) in written {
            results[i] = Some(Ok(Handled::Applied(Box::new(decision.task))));
        }
        for (i, span) in lost {
            let Item { task, input, .. } = &items[i];
            results[i] = Some(self.transition(&task.id, input).instrument(span).await);
        }
        results.into_iter().map(|r| r.expect("every item has a result")).collect()
    }

    /// After a transition was written: counts and logs it (in the task's span) and keeps the
    /// task as written for its next input ([`Recent`]).
    fn written(&self, decision: &Decision) {
        let history = &decision.history;
        counter!(m::TRANSITIONS, "to" => decision.task.state.as_str(), "event" => format!("{:?}", history.event))
            .increment(1);
        tracing::info!(
            task_id = %decision.task.id,
            from = ?history.from,
            to = %history.to,
            event = ?history.event,
            step = ?history.step,
            attempt = ?history.attempt,
            "transition"
        );
        self.recent.put(&decision.task, self.config.max_in_flight);
    }

    /// The decision of `input` on `task` at `now`; an illegal input is an error (an ignored or
    /// illegal input is counted and logged).
    fn decide(&self, task: &Task, input: &Input, now: u64) -> Result<Decided, EngineError> {
        match self.verdict(task, input, now) {
            Ok(Verdict::Apply(decision)) => Ok(Decided::Apply(decision)),
            Ok(Verdict::Ignore(why)) => {
                counter!(m::IGNORED, "reason" => why.as_str()).increment(1);
                tracing::debug!(task_id = %task.id, input = input.kind(), reason = why.as_str(), "input ignored");
                Ok(Decided::Ignore(why))
            }
            Err(illegal) => {
                counter!(m::ILLEGAL, "input" => illegal.input, "state" => illegal.state.as_str()).increment(1);
                tracing::warn!(task_id = %task.id, error = %illegal, "illegal transition refused");
                Err(illegal.into())
            }
        }
    }

    /// [`machine::decide`] under this engine's policy, with a fresh jitter seed.
    fn verdict(&self, task: &Task, input: &Input, now: u64) -> Result<Verdict, IllegalTransition> {
        let ctx =
            Context { now, seed: rand::random(), paused: self.controls.paused_steps(), held: self.waits.snapshot() };
        machine::decide(task, input, &ctx, &self.config.policy)
    }

    async fn get(&self, id: &str) -> Result<Task, EngineError> {
        self.store.get(id).await?.ok_or_else(|| EngineError::UnknownTask(id.to_owned()))
    }

    /// Reads task `id` again, decides `input` and writes it, until a compare-and-set holds
    /// (at most [`MAX_CONFLICTS`] times); then relays the transition's outbox.
    async fn transition(&self, id: &str, input: &Input) -> Result<Handled, EngineError> {
        for _ in 0..MAX_CONFLICTS {
            let task = self.get(id).await?;
            self.recent.put(&task, self.config.max_in_flight);
            let decision = match self.decide(&task, input, self.clock.unix_ms())? {
                Decided::Apply(decision) => *decision,
                Decided::Ignore(why) => return Ok(Handled::Ignored(why)),
            };
            match self.store.apply(&decision).await? {
                Applied::Yes => {
                    self.written(&decision);
                    self.publish(id, &decision.outbox).await;
                    return Ok(Handled::Applied(Box::new(decision.task)));
                }
                Applied::Conflict => counter!(m::CONFLICTS).increment(1),
            }
        }
        Err(EngineError::Contention(id.to_owned()))
    }

    /// Publishes `entries` of task `id` in order and removes the confirmed ones; stops at the
    /// first failure (what is left is relayed by a later sweep). Returns how many went out.
    ///
    /// An entry the bus can never carry (too large) is archived as a dead letter and removed
    /// instead of being retried forever, and the task fails with the reason.
    pub async fn publish(&self, id: &str, entries: &[OutboxEntry]) -> usize {
        self.relay_batch(&[Outgoing::new(id, None).with(entries, Span::current())]).await
    }

    /// [`publish`](Self::publish) for several tasks at once: every task's entries go out in
    /// order (each segment in its own span), the tasks side by side (so the bus pipelines them
    /// and their confirmations are awaited together); then one [`TaskStore::settle`] removes
    /// the relayed entries of all of them and settles the states they were written in.
    async fn relay_batch(&self, outgoing: &[Outgoing<'_>]) -> usize {
        if outgoing.iter().all(|o| o.state.is_none() && o.segments.iter().all(|(entries, _)| entries.is_empty())) {
            return 0;
        }
        let relayed = futures::future::join_all(outgoing.iter().map(|o| async move {
            let mut relay = Relay::default();
            for (entries, span) in &o.segments {
                let more = self.relay_entries(o.task, entries, &mut relay).instrument(span.clone()).await;
                if !more {
                    break;
                }
            }
            relay
        }))
        .await;
        let settled: Vec<Settled<'_>> = outgoing
            .iter()
            .zip(&relayed)
            .map(|(o, r)| Settled { task: o.task, relayed: &r.settled, state: o.state })
            .collect();
        if let Err(e) = self.store.settle(&settled).await {
            tracing::warn!(error = %e, tasks = settled.len(), "relayed outbox entries not removed; they will be sent again");
        }
        for (o, relay) in outgoing.iter().zip(&relayed) {
            if let Some(reason) = &relay.undeliverable {
                let error = StepError::new(machine::MESSAGE_TOO_LARGE, reason.clone());
                let span = o.segments.last().map_or_else(Span::current, |(_, span)| span.clone());
                // The failure's own outbox is one small event, so this recursion ends there.
                let failed = Box::pin(self.handle(o.task, Input::Undeliverable { error })).instrument(span).await;
                if let Err(e) = failed {
                    tracing::warn!(task_id = o.task, error = %e, "task with an undeliverable message not failed");
                }
            }
        }
        relayed.iter().map(|r| r.sent).sum()
    }

    /// Sends `entries` of task `id` in order into `relay`, up to the first failure; whether all
    /// of them were settled (so that later entries of the task may follow).
    async fn relay_entries(&self, id: &str, entries: &[OutboxEntry], relay: &mut Relay) -> bool {
        for entry in entries {
            match self.send(id, entry).await {
                Ok(()) => {
                    relay.settled.push(entry.id.clone());
                    relay.sent += 1;
                }
                Err(e @ BusError::TooLarge { .. }) => {
                    counter!(m::OUTBOX_UNDELIVERABLE).increment(1);
                    tracing::error!(task_id = id, entry = %entry.id, error = %e, "outbox message can never be sent; dead-lettered");
                    if let Err(store) = self.store.put_dead_letter(&self.undeliverable_letter(id, entry, &e)).await {
                        tracing::warn!(task_id = id, error = %store, "undeliverable outbox entry not archived; will retry");
                        return false;
                    }
                    relay.settled.push(entry.id.clone());
                    relay.undeliverable.get_or_insert(e.to_string());
                }
                Err(e) => {
                    counter!(m::OUTBOX_ERRORS).increment(1);
                    tracing::warn!(task_id = id, entry = %entry.id, error = %e, "outbox publish failed; will retry");
                    return false;
                }
            }
        }
        true
    }

    /// The archive entry of an outbox entry the bus refused for good (the store cuts its body
    /// to what the archive keeps, marking it so it is never replayed cut).
    fn undeliverable_letter(&self, id: &str, entry: &OutboxEntry, error: &BusError) -> DeadLetter {
        let (source, dlq) = match &entry.destination {
            Destination::Queue(queue) => (queue.clone(), names::dead_letter_queue(queue)),
            Destination::Event(event_type) => {
                (event_type.clone(), names::dead_letter_queue(&names::topic_of_event_type(event_type)))
            }
        };
        DeadLetter {
            id: format!("dl_{}_{}", id, entry.id),
            source,
            dlq,
            reason: error.to_string(),
            delivery_count: 0,
            dead_lettered_at: self.clock.unix_ms(),
            key: Some(id.to_owned()),
            message_id: Some(entry.message_id.clone()),
            headers: vec![(headers::SCHEMA.to_owned(), SCHEMA_VERSION.to_owned())],
            body: entry.body.clone(),
        }
    }

    async fn send(&self, id: &str, entry: &OutboxEntry) -> Result<(), BusError> {
        let mut message = Message::new(entry.body.clone().into_bytes())
            .with_key(id)
            .with_id(entry.message_id.clone())
            .with_header(headers::SCHEMA, SCHEMA_VERSION);
        inject_trace(&mut message.headers, entry.trace_id);
        match &entry.destination {
            Destination::Queue(queue) => {
                self.bus.queues.send(queue, message).await?;
                counter!(m::OUTBOX_PUBLISHED, "kind" => "queue").increment(1);
            }
            Destination::Event(event_type) => {
                self.bus.events.publish(event_type, message).await?;
                counter!(m::OUTBOX_PUBLISHED, "kind" => "event").increment(1);
            }
        }
        Ok(())
    }

    /// Relays every pending outbox entry of task `id`.
    pub async fn relay(&self, id: &str) -> Result<usize, StoreError> {
        let entries = self.store.outbox(id).await?;
        Ok(if entries.is_empty() { 0 } else { self.publish(id, &entries).await })
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

    /// Re-sends the command of every running attempt, with a fresh deadline; returns how many.
    /// For a bus that keeps nothing across a restart (the in-process bus): the commands in flight
    /// died with the process, and waiting for their old deadlines would stall the tasks.
    pub async fn redispatch_running(&self) -> Result<usize, EngineError> {
        let mut running = Vec::new();
        for state in [TaskState::Downloading, TaskState::ExtractingMetadata, TaskState::Analyzing] {
            let mut cursor = None;
            loop {
                let page = self
                    .store
                    .list(&ListQuery { state: Some(state), limit: 256, cursor, ..ListQuery::default() })
                    .await?;
                running.extend(page.tasks.into_iter().map(|task| task.id));
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
        }
        let mut resent = 0;
        for id in &running {
            if let Handled::Applied(_) = self.handle(id, Input::Redispatch).await? {
                resent += 1;
            }
        }
        Ok(resent)
    }

    /// Starts the oldest queued tasks while there is room under the cap; returns how many.
    /// One pass at a time per process; the listed tasks are started as one batch.
    pub async fn start_queued(&self) -> Result<usize, EngineError> {
        let _one_pass = self.starting.lock().await;
        let in_flight = self.in_flight().await?;
        let room = self.config.max_in_flight.saturating_sub(in_flight);
        let high_room = self.high_cap().saturating_sub(in_flight);
        if high_room == 0 {
            return Ok(0);
        }
        // Queued tasks list high first: past the cap, only high ones start (in its headroom).
        let query =
            ListQuery { state: Some(TaskState::Queued), limit: high_room.min(256) as usize, ..ListQuery::default() };
        let queued: Vec<Task> = self
            .store
            .list(&query)
            .await?
            .tasks
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

    /// One sweep: claims due tasks, relays their leftover outbox, fires their due timers,
    /// releases them; then starts queued tasks. Returns how many tasks were claimed.
    pub async fn sweep(&self) -> Result<usize, EngineError> {
        let now = self.clock.unix_ms();
        let ids = self.store.claim_due(now, self.config.lease, self.config.sweep_batch).await?;
        for id in &ids {
            if let Err(e) = self.wake(id, now).await {
                counter!(m::SWEEP_ERRORS).increment(1);
                tracing::warn!(task_id = %id, error = %e, "due task not handled; retried when its lease ends");
                continue;
            }
            if let Err(e) = self.store.release(id, self.clock.unix_ms()).await {
                counter!(m::SWEEP_ERRORS).increment(1);
                tracing::warn!(task_id = %id, error = %e, "due task not released; retried when its lease ends");
            }
        }
        self.start_queued().await?;
        Ok(ids.len())
    }

    async fn wake(&self, id: &str, now: u64) -> Result<(), EngineError> {
        let Some(task) = self.store.get(id).await? else { return Ok(()) };
        let span = task_span(&task, "wake", "due");
        self.fire(task, now).instrument(span).await
    }

    /// Relays the leftover outbox of `task` and fires its timer if it is due at `now`.
    async fn fire(&self, task: Task, now: u64) -> Result<(), EngineError> {
        let id = task.id.as_str();
        self.relay(id).await?;
        if let Some(timer) = task.timer.filter(|t| t.due_at <= now) {
            if timer.kind == TimerKind::Deadline {
                self.waits.refresh(timer.step, now).await;
            }
            match self.handle(id, Input::Timer(timer)).await {
                Ok(Handled::Applied(_)) => {
                    let kind = match timer.kind {
                        TimerKind::Deadline => "deadline",
                        TimerKind::Retry => "retry",
                    };
                    counter!(m::TIMERS_FIRED, "kind" => kind).increment(1);
                }
                Ok(Handled::Ignored(_)) | Err(EngineError::Illegal(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sweeps every `interval` until `shutdown`.
    pub async fn run_sweeper(&self, interval: Duration, shutdown: Shutdown) {
        loop {
            if let Err(e) = self.sweep().await {
                counter!(m::SWEEP_ERRORS).increment(1);
                tracing::warn!(error = %e, "sweep failed");
            }
            if !shutdown.sleep(interval).await {
                return;
            }
        }
    }
}

/// One task's part of a [`Engine::relay_batch`].
struct Outgoing<'a> {
    task: &'a str,
    /// Its entries in order, each run of them relayed in its span.
    segments: Vec<(&'a [OutboxEntry], Span)>,
    /// The state its transition wrote, to settle ([`Settled::state`]).
    state: Option<TaskState>,
}

impl<'a> Outgoing<'a> {
    fn new(task: &'a str, state: Option<TaskState>) -> Self {
        Self { task, segments: Vec::new(), state }
    }

    fn with(mut self, entries: &'a [OutboxEntry], span: Span) -> Self {
        self.segments.push((entries, span));
        self
    }
}

/// What relaying one task's outbox entries did.
#[derive(Default)]
struct Relay {
    /// Entries that need no relaying any more: sent, or archived as undeliverable.
    settled: Vec<String>,
    /// How many were sent.
    sent: usize,
    /// Why an entry can never be sent, when one cannot.
    undeliverable: Option<String>,
}

/// The span the coordinator works on `task` in (`kind` is `transition` or `wake`, `what` the
/// input or cause), in the task's trace so that what it sends continues that trace.
fn task_span(task: &Task, kind: &'static str, what: &'static str) -> Span {
    let span = tracing::info_span!(
        "task",
        otel.name = %format!("task {kind} {what}"),
        task_id = %task.id,
        trace_id = %task.trace_id,
    );
    join_trace(&span, task.trace_id);
    span
}
