//! Applying inputs: each is decided by [`machine::decide`] on the task as last written, and
//! the transition written with compare-and-set (decided again when another writer won), then
//! its outbox relayed.

use std::sync::Arc;

use metrics::counter;
use tracing::{Instrument, Span};

use super::relay::Outgoing;
use super::{Engine, EngineError, Handled, task_span};
use crate::machine::{self, Context, Decision, Input, Verdict};
use crate::metrics as m;
use crate::slots::Slots;
use crate::store::Applied;
use crate::task::Task;

/// How many times a transition is decided again after losing its compare-and-set.
pub(super) const MAX_CONFLICTS: usize = 16;

/// One input of an [`Engine::apply_round`], on its task.
pub(super) struct Item<'a> {
    task: Task,
    input: &'a Input,
    /// Whether `task` is this process's copy ([`Recent`]) rather than read from the store.
    recent: bool,
    /// The span the input arrived in.
    parent: &'a Span,
}

impl<'a> Item<'a> {
    pub(super) fn new(task: Task, input: &'a Input, parent: &'a Span, recent: bool) -> Self {
        Self { task, input, recent, parent }
    }
}

impl Engine {
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
        let mut results = Slots::new(inputs.len());
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
                        results.fill(i, Err(EngineError::Store(e.clone())));
                    }
                    Vec::new()
                }
            };
            for (&i, task) in unread.iter().zip(tasks) {
                match task {
                    Some(task) => found.push((i, task, false)),
                    None => results.fill(i, Err(EngineError::UnknownTask(inputs[i].0.clone()))),
                }
            }
            let (indexes, items): (Vec<usize>, Vec<Item<'_>>) = found
                .into_iter()
                .map(|(i, task, recent)| (i, Item::new(task, &inputs[i].1, &inputs[i].2, recent)))
                .unzip();
            for (i, handled) in indexes.into_iter().zip(self.apply_round(items).await) {
                results.fill(i, handled);
            }
        }
        results.into_vec()
    }

    /// Decides each `(task as read, input)` (of distinct tasks), writes the transitions in one
    /// store call, relays their outboxes together, and handles the lost compare-and-sets one
    /// by one. One result per item, in order.
    pub(super) async fn apply_round(&self, items: Vec<Item<'_>>) -> Vec<Result<Handled, EngineError>> {
        let now = self.clock.unix_ms();
        let mut results = Slots::new(items.len());
        let (mut decisions, mut decided) = (Vec::new(), Vec::new());
        let mut lost = Vec::new();
        for (i, Item { task, input, recent, parent }) in items.iter().enumerate() {
            let span = parent.in_scope(|| task_span(task, "transition", input.kind()));
            if *recent {
                // Only a transition is checked by its compare-and-set: anything else is decided
                // again on the stored task.
                match machine::decide(task, input, &self.context(now), &self.config.policy) {
                    Ok(Verdict::Apply(mut decision)) => match self.fence(&mut decision, input) {
                        Ok(()) => {
                            decisions.push(*decision);
                            decided.push((i, span));
                        }
                        Err(e) => results.fill(i, Err(e)),
                    },
                    _ => lost.push((i, span)),
                }
                continue;
            }
            match span.in_scope(|| self.decide(task, input, now)) {
                Ok(Verdict::Apply(mut decision)) => match self.fence(&mut decision, input) {
                    Ok(()) => {
                        decisions.push(*decision);
                        decided.push((i, span));
                    }
                    Err(e) => results.fill(i, Err(e)),
                },
                Ok(Verdict::Ignore(why)) => results.fill(i, Ok(Handled::Ignored(why))),
                Err(e) => results.fill(i, Err(e)),
            }
        }
        let applied = match self.store.apply_many(&decisions).await {
            Ok(applied) => applied,
            Err(e) => {
                let e = Arc::new(e);
                for (i, _) in &decided {
                    results.fill(*i, Err(EngineError::Store(e.clone())));
                }
                return results.into_vec();
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
                Applied::Fenced => results.fill(i, Err(self.fenced(&decision))),
            }
        }
        let outgoing: Vec<Outgoing<'_>> = written
            .iter()
            .map(|(_, d, span)| Outgoing::new(&d.task.id, Some(d.task.state)).with(&d.outbox, span.clone()))
            .collect();
        self.relay_batch(&outgoing).await;
        for (i, decision, _) in written {
            results.fill(i, Ok(Handled::Applied(Box::new(decision.task))));
        }
        for (i, span) in lost {
            let Item { task, input, .. } = &items[i];
            results.fill(i, self.transition(&task.id, input).instrument(span).await);
        }
        results.into_vec()
    }

    /// After a transition was written: counts and logs it (in the task's span) and keeps the
    /// task as written for its next input ([`Recent`]).
    pub(super) fn written(&self, decision: &Decision) {
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

    /// The verdict of [`machine::decide`] on `input` for `task` at `now`, under this engine's
    /// policy; an illegal input is an error (an ignored or illegal input is counted and logged).
    pub(super) fn decide(&self, task: &Task, input: &Input, now: u64) -> Result<Verdict, EngineError> {
        match machine::decide(task, input, &self.context(now), &self.config.policy) {
            Ok(Verdict::Apply(decision)) => Ok(Verdict::Apply(decision)),
            Ok(Verdict::Ignore(why)) => {
                counter!(m::IGNORED, "reason" => why.as_str()).increment(1);
                tracing::debug!(task_id = %task.id, input = input.kind(), reason = why.as_str(), "input ignored");
                Ok(Verdict::Ignore(why))
            }
            Err(illegal) => {
                counter!(m::ILLEGAL, "input" => illegal.input, "state" => illegal.state.as_str()).increment(1);
                tracing::warn!(task_id = %task.id, error = %illegal, "illegal transition refused");
                Err(illegal.into())
            }
        }
    }

    /// What [`machine::decide`] knows of the world at `now`: a fresh jitter seed, the paused
    /// stages and what their queues hold.
    fn context(&self, now: u64) -> Context {
        Context { now, seed: rand::random(), paused: self.controls.paused_steps(), held: self.waits.snapshot() }
    }

    /// Fences `decision` with this replica's lease on its task's shard (and names the replica
    /// in its history entry). Without the lease, an input only the shard's owner may apply (a
    /// step result, a timer, a start) is refused with [`EngineError::NotOwner`]; an operator's
    /// request is written unfenced, by compare-and-set alone, from whichever replica took it.
    pub(super) fn fence(&self, decision: &mut Decision, input: &Input) -> Result<(), EngineError> {
        let Some(ownership) = &self.ownership else { return Ok(()) };
        match ownership.fence(&decision.task.id, self.clock.unix_ms()) {
            Ok(fence) => {
                decision.fence = Some(fence);
                decision.history.replica = Some(ownership.replica().to_owned());
                Ok(())
            }
            Err(_) if !owner_only(input) => Ok(()),
            Err(shard) => Err(EngineError::NotOwner { task: decision.task.id.clone(), shard }),
        }
    }

    /// The store refused `decision`'s write: its lease is gone, and so is this replica's
    /// ownership of the shard.
    fn fenced(&self, decision: &Decision) -> EngineError {
        counter!(m::WRITES_FENCED).increment(1);
        let shard = decision.fence.map_or(0, |f| f.shard);
        if let Some(ownership) = &self.ownership {
            ownership.lose(shard);
        }
        EngineError::NotOwner { task: decision.task.id.clone(), shard }
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
            let mut decision = match self.decide(&task, input, self.clock.unix_ms())? {
                Verdict::Apply(decision) => *decision,
                Verdict::Ignore(why) => return Ok(Handled::Ignored(why)),
            };
            self.fence(&mut decision, input)?;
            match self.store.apply(&decision).await? {
                Applied::Yes => {
                    self.written(&decision);
                    self.publish(id, &decision.outbox).await;
                    return Ok(Handled::Applied(Box::new(decision.task)));
                }
                Applied::Conflict => counter!(m::CONFLICTS).increment(1),
                Applied::Fenced => return Err(self.fenced(&decision)),
            }
        }
        Err(EngineError::Contention(id.to_owned()))
    }
}

/// Whether only the owner of the task's shard may apply `input`: what arrives through the
/// shard's partitions (step results, submissions' starts) and its timers. An operator's
/// request (cancel, pause, resume, reprocess) and what follows from one (a redispatch, a
/// command the bus refused) may be written by any replica.
fn owner_only(input: &Input) -> bool {
    matches!(input, Input::Result(_) | Input::Timer(_) | Input::Start)
}
