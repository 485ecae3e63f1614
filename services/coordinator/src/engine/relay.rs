//! The outbox relay: a transition's messages, written with it, are sent on the bus in order
//! and then removed; what the bus refuses for good is archived as a dead letter and fails the
//! task.

use imagepipe_bus::{BusError, Message};
use imagepipe_contracts::names::{self, headers};
use imagepipe_contracts::{CloudEvent, CommandType, SCHEMA_VERSION, StepError};
use imagepipe_runtime::telemetry::inject_trace;
use metrics::counter;
use tracing::{Instrument, Span};

use super::Engine;
use crate::machine::{self, Input};
use crate::metrics as m;
use crate::store::{DeadLetter, Settled, StoreError};
use crate::task::{Destination, OutboxEntry, TaskState};

impl Engine {
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
    pub(super) async fn relay_batch(&self, outgoing: &[Outgoing<'_>]) -> usize {
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
        match self.cloud_event(id, entry) {
            Some(attributes) => {
                message.headers.insert_cloud_event(&attributes);
            }
            None => {
                tracing::warn!(task_id = id, entry = %entry.id, "outbox entry sent without CloudEvents attributes");
            }
        }
        match &entry.destination {
            Destination::Queue(queue) => {
                if let Some(ownership) = &self.ownership {
                    message.headers.insert(headers::SHARD, ownership.shard_of(id).to_string());
                }
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

    /// The CloudEvents attributes of outbox entry `entry` of task `id`: an event's from its
    /// envelope, a command's from its queue, its message id and the time it is sent. `None`
    /// (logged by the caller) for a body that is no envelope or a queue of no command type,
    /// which the machine never writes.
    fn cloud_event(&self, id: &str, entry: &OutboxEntry) -> Option<CloudEvent> {
        match &entry.destination {
            Destination::Queue(queue) => CommandType::of_queue(queue).map(|command_type| {
                CloudEvent::of_command(command_type, &entry.message_id, id, machine::SOURCE, self.clock.unix_ms())
            }),
            Destination::Event(_) => CloudEvent::of_event_json(entry.body.as_bytes())
                .inspect_err(|e| tracing::warn!(task_id = id, error = %e, "outbox event is not an envelope"))
                .ok(),
        }
    }

    /// Relays every pending outbox entry of task `id`.
    pub async fn relay(&self, id: &str) -> Result<usize, StoreError> {
        let entries = self.store.outbox(id).await?;
        Ok(if entries.is_empty() { 0 } else { self.publish(id, &entries).await })
    }
}

/// One task's part of a [`Engine::relay_batch`].
pub(super) struct Outgoing<'a> {
    pub(super) task: &'a str,
    /// Its entries in order, each run of them relayed in its span.
    pub(super) segments: Vec<(&'a [OutboxEntry], Span)>,
    /// The state its transition wrote, to settle ([`Settled::state`]).
    pub(super) state: Option<TaskState>,
}

impl<'a> Outgoing<'a> {
    pub(super) fn new(task: &'a str, state: Option<TaskState>) -> Self {
        Self { task, segments: Vec::new(), state }
    }

    pub(super) fn with(mut self, entries: &'a [OutboxEntry], span: Span) -> Self {
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
