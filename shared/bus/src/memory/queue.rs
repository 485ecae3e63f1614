//! One bounded queue with in-flight tracking: a task queue, a dead-letter queue, or the backlog
//! of one subscriber group.
//!
//! Every message is ready, delayed (nacked with a delay) or in flight (delivered, not settled).
//! Due times live in one ordered set and are acted on lazily by `fetch`, which sleeps until the
//! earliest of them: no background task, nothing to stop when the bus is dropped.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use imagepipe_contracts::names::headers;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::dedup::DedupWindow;
use crate::config::ConsumerConfig;
use crate::error::BusError;
use crate::inspect::Backlog;
use crate::message::Message;

/// A settle call named a delivery that is no longer the message's current one.
#[derive(Debug, thiserror::Error)]
#[error(
    "delivery {attempt} is no longer in flight: it was settled already, or its ack deadline passed and the message \
     was redelivered or dead-lettered"
)]
pub(super) struct NotInFlight {
    attempt: u32,
}

/// A message handed out by [`Queue::fetch`].
pub(super) struct Taken {
    pub(super) seq: u64,
    /// The delivery count, which also names this delivery for settling.
    pub(super) attempt: u32,
    pub(super) max_deliveries: u32,
    pub(super) message: Message,
}

/// One bounded queue, shared by every consumer opened on it.
pub(super) struct Queue {
    name: String,
    display: String,
    capacity: usize,
    send_timeout: Duration,
    state: Mutex<State>,
    /// Messages became ready, or due times changed: fetchers look again.
    changed: Notify,
    /// Notified with `changed`, for consumers that wait on several queues at once (the
    /// partitions of one queue share it).
    family: Option<Arc<Notify>>,
    /// Room was freed: senders look again.
    room: Notify,
    closed: AtomicBool,
}

impl Queue {
    /// A queue called `name` (logical, as in [`crate::Delivery::source`]) and `display` in logs
    /// and errors; `family`, when set, is notified whenever its fetchers are.
    pub(super) fn new(
        name: String,
        display: String,
        capacity: usize,
        send_timeout: Duration,
        dedup_window: Duration,
        family: Option<Arc<Notify>>,
    ) -> Self {
        Self {
            name,
            display,
            capacity,
            send_timeout,
            state: Mutex::new(State::new(dedup_window)),
            changed: Notify::new(),
            family,
            room: Notify::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// The logical name.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The name with the bus prefix, for logs and errors.
    pub(super) fn display(&self) -> &str {
        &self.display
    }

    /// Where message `seq` sits, for logs.
    pub(super) fn position(&self, seq: u64) -> String {
        format!("{}#{seq}", self.display)
    }

    /// How many messages the queue holds: ready, delayed and in flight.
    pub(super) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Messages waiting (ready or delayed) and in flight.
    pub(super) fn backlog(&self) -> Backlog {
        let state = self.lock();
        let unacked = state.entries.values().filter(|e| matches!(e.status, Status::InFlight(_))).count();
        let waiting = state.entries.len() - unacked;
        Backlog { waiting: waiting as u64, unacked: unacked as u64 }
    }

    /// When the oldest message still held (waiting or in flight) was enqueued, Unix ms.
    pub(super) fn oldest(&self) -> Option<u64> {
        self.lock().entries.values().map(|e| e.enqueued_at).min()
    }

    /// Whether another message fits.
    pub(super) fn has_room(&self) -> bool {
        self.lock().entries.len() < self.capacity
    }

    /// The bus was dropped: every waiter wakes up and gets [`BusError::Closed`].
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake();
        self.room.notify_waiters();
    }

    /// Enqueues `message`, waiting up to the send timeout for room. With `dedup`, a message
    /// whose id was accepted within the dedup window is accepted and dropped.
    pub(super) async fn push(&self, message: Message, dedup: bool) -> Result<(), BusError> {
        let started = Instant::now();
        let give_up = after(started, self.send_timeout);
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let now = Instant::now();
                let mut state = self.lock();
                self.check_open()?;
                let id = message.id.as_deref().filter(|_| dedup);
                if let Some(id) = id
                    && state.dedup.is_duplicate(id, now)
                {
                    tracing::debug!(queue = %self.display, id, "duplicate message id; dropped");
                    return Ok(());
                }
                if state.entries.len() < self.capacity {
                    if let Some(id) = id {
                        state.dedup.record(id, now);
                    }
                    state.insert(message);
                    drop(state);
                    self.wake();
                    return Ok(());
                }
            }
            if tokio::time::timeout_at(give_up, room).await.is_err() {
                return Err(BusError::Full { destination: self.display.clone(), waited: started.elapsed() });
            }
        }
    }

    /// Enqueues `messages` whether or not they fit (a new subscriber group's retained backlog).
    pub(super) fn push_unbounded(&self, messages: impl IntoIterator<Item = Message>) {
        let mut state = self.lock();
        for message in messages {
            state.insert(message);
        }
        drop(state);
        self.wake();
    }

    /// Waits until there is room, or until `deadline`; false on timeout.
    pub(super) async fn wait_for_room(&self, deadline: Instant) -> Result<bool, BusError> {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            self.check_open()?;
            if self.has_room() {
                return Ok(true);
            }
            if tokio::time::timeout_at(deadline, room).await.is_err() {
                return Ok(self.has_room());
            }
        }
    }

    /// Waits up to `wait` for ready messages and hands out at most `max` of them, in flight
    /// under `config`. Expired deliveries are made ready again first, or moved to `dlq` when
    /// they were the last allowed delivery.
    pub(super) async fn fetch(
        &self,
        max: usize,
        wait: Duration,
        config: &ConsumerConfig,
        dlq: &Queue,
    ) -> Result<Vec<Taken>, BusError> {
        let until = after(Instant::now(), wait);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = Instant::now();
            let (taken, next_due) = self.take_now(max, now, config, dlq)?;
            if !taken.is_empty() {
                return Ok(taken);
            }
            if now >= until {
                return Ok(Vec::new());
            }
            let wake = next_due.map_or(until, |due| due.min(until));
            tokio::select! {
                _ = &mut changed => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Without waiting: acts on the due times up to `now` (as [`fetch`](Self::fetch) does),
    /// hands out at most `max` ready messages, and says when the next due time is (a delayed
    /// message becoming ready, an ack deadline).
    pub(super) fn take_now(
        &self,
        max: usize,
        now: Instant,
        config: &ConsumerConfig,
        dlq: &Queue,
    ) -> Result<(Vec<Taken>, Option<Instant>), BusError> {
        let mut state = self.lock();
        self.check_open()?;
        self.act_on_due(&mut state, now, dlq);
        let taken = state.take(max, now, config);
        Ok((taken, state.next_due()))
    }

    /// The message is handled: remove it for good.
    pub(super) fn ack(&self, seq: u64, attempt: u32) -> Result<(), BusError> {
        let mut state = self.lock();
        self.check_open()?;
        self.current(&state, seq, attempt, "ack")?;
        state.remove(seq);
        drop(state);
        self.room.notify_waiters();
        Ok(())
    }

    /// The attempt failed: ready again after `delay`.
    pub(super) fn nack(&self, seq: u64, attempt: u32, delay: Duration) -> Result<(), BusError> {
        let mut state = self.lock();
        self.check_open()?;
        self.current(&state, seq, attempt, "nack")?;
        let status =
            if delay.is_zero() { Status::Ready } else { Status::Delayed { due: after(Instant::now(), delay) } };
        state.set_status(seq, status);
        drop(state);
        self.wake();
        Ok(())
    }

    /// Still working: restart the ack deadline.
    pub(super) fn progress(&self, seq: u64, attempt: u32) -> Result<(), BusError> {
        let mut state = self.lock();
        self.check_open()?;
        let flight = self.current(&state, seq, attempt, "progress")?;
        let deadline = after(Instant::now(), flight.ack_wait);
        state.set_status(seq, Status::InFlight(InFlight { deadline, ..flight }));
        Ok(())
    }

    /// Moves the message out of this queue into `dlq` with the dead-letter headers, waiting up
    /// to `dlq`'s send timeout for room there. Until it is moved the delivery stays in flight,
    /// so a failure here loses nothing.
    pub(super) async fn dead_letter(
        &self,
        seq: u64,
        attempt: u32,
        delivery_count: u32,
        reason: &str,
        dlq: &Queue,
    ) -> Result<(), BusError> {
        let started = Instant::now();
        let give_up = after(started, dlq.send_timeout);
        loop {
            let room = dlq.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut state = self.lock();
                self.check_open()?;
                self.current(&state, seq, attempt, "terminate")?;
                let mut dead = dlq.lock();
                if dead.entries.len() < dlq.capacity {
                    let entry = state.remove(seq);
                    tracing::warn!(queue = %self.display, position = %self.position(seq), delivery_count, reason,
                        "dead-lettered to {}", dlq.display);
                    dead.insert(dead_letter_message(entry.message, &self.name, delivery_count, reason));
                    drop((dead, state));
                    self.room.notify_waiters();
                    dlq.wake();
                    return Ok(());
                }
            }
            if tokio::time::timeout_at(give_up, room).await.is_err() {
                return Err(BusError::Full { destination: dlq.display.clone(), waited: started.elapsed() });
            }
        }
    }

    /// Acts on every due time up to `now`: delayed messages become ready, expired deliveries
    /// are redelivered or, when they were the last allowed one, dead-lettered into `dlq`.
    fn act_on_due(&self, state: &mut State, now: Instant, dlq: &Queue) {
        let mut dead_lettered = false;
        for seq in state.due(now) {
            let entry = &state.entries[&seq];
            match entry.status {
                Status::Delayed { .. } => state.set_status(seq, Status::Ready),
                Status::InFlight(flight) if entry.deliveries >= flight.max_deliveries => {
                    let deliveries = entry.deliveries;
                    let reason = format!("ack deadline expired after {deliveries} deliveries");
                    let mut dead = dlq.lock();
                    if dead.entries.len() < dlq.capacity {
                        let entry = state.remove(seq);
                        tracing::warn!(queue = %self.display, position = %self.position(seq), reason,
                            "dead-lettered to {}", dlq.display);
                        dead.insert(dead_letter_message(entry.message, &self.name, deliveries, &reason));
                        dead_lettered = true;
                    } else {
                        tracing::warn!(queue = %self.display, position = %self.position(seq), reason,
                            "dead-letter queue {} is full; keeping the message until there is room", dlq.display);
                        let deadline = after(now, flight.ack_wait);
                        state.set_status(seq, Status::InFlight(InFlight { deadline, ..flight }));
                    }
                }
                Status::InFlight(_) => {
                    tracing::debug!(queue = %self.display, position = %self.position(seq), "ack deadline expired; redelivering");
                    state.set_status(seq, Status::Ready);
                }
                Status::Ready => unreachable!("ready messages have no due time"),
            }
        }
        if dead_lettered {
            self.room.notify_waiters();
            dlq.wake();
        }
    }

    /// The in-flight state of delivery `attempt` of `seq`, or the error for settling a stale one.
    fn current(&self, state: &State, seq: u64, attempt: u32, action: &'static str) -> Result<InFlight, BusError> {
        match state.entries.get(&seq).map(|e| e.status) {
            Some(Status::InFlight(flight)) if flight.attempt == attempt => Ok(flight),
            _ => Err(BusError::Settle {
                action,
                message: self.position(seq),
                source_name: self.name.clone(),
                source: Box::new(NotInFlight { attempt }),
            }),
        }
    }

    /// Wakes this queue's fetchers and its family's.
    fn wake(&self) {
        self.changed.notify_waiters();
        if let Some(family) = &self.family {
            family.notify_waiters();
        }
    }

    fn check_open(&self) -> Result<(), BusError> {
        if self.closed.load(Ordering::SeqCst) { Err(BusError::Closed) } else { Ok(()) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("memory bus queue lock poisoned")
    }
}

/// `message` as it is stored in a dead-letter queue: unchanged, plus the dead-letter headers
/// (the dead-letter queue itself has no partitions).
fn dead_letter_message(mut message: Message, source: &str, delivery_count: u32, reason: &str) -> Message {
    message.partition = None;
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    message
        .headers
        .insert(headers::DLQ_REASON, reason)
        .insert(headers::DLQ_DELIVERY_COUNT, delivery_count.to_string())
        .insert(headers::DLQ_SOURCE, source)
        .insert(headers::DLQ_TIMESTAMP, now_ms.to_string());
    message
}

/// `now + d`, saturating far in the future instead of overflowing.
pub(super) fn after(now: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(60 * 60 * 24 * 365 * 30);
    now.checked_add(d).unwrap_or_else(|| now + FAR)
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    attempt: u32,
    deadline: Instant,
    ack_wait: Duration,
    max_deliveries: u32,
}

#[derive(Debug, Clone, Copy)]
enum Status {
    Ready,
    Delayed { due: Instant },
    InFlight(InFlight),
}

impl Status {
    fn due(self) -> Option<Instant> {
        match self {
            Status::Ready => None,
            Status::Delayed { due } => Some(due),
            Status::InFlight(flight) => Some(flight.deadline),
        }
    }
}

struct Entry {
    message: Message,
    deliveries: u32,
    status: Status,
    /// When it was enqueued, Unix ms.
    enqueued_at: u64,
}

/// The queue's contents. Invariant: a message is in `ready` iff its status is `Ready`, and in
/// `timers` (at its due time) iff it is delayed or in flight.
struct State {
    next_seq: u64,
    entries: HashMap<u64, Entry>,
    /// Ready messages, oldest first: first deliveries keep send order (and so per-key order),
    /// and redeliveries go before newer messages.
    ready: BTreeSet<u64>,
    timers: BTreeSet<(Instant, u64)>,
    dedup: DedupWindow,
}

impl State {
    fn new(dedup_window: Duration) -> Self {
        Self {
            next_seq: 1,
            entries: HashMap::new(),
            ready: BTreeSet::new(),
            timers: BTreeSet::new(),
            dedup: DedupWindow::new(dedup_window),
        }
    }

    fn insert(&mut self, message: Message) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let enqueued_at = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        self.entries.insert(seq, Entry { message, deliveries: 0, status: Status::Ready, enqueued_at });
        self.ready.insert(seq);
    }

    fn take(&mut self, max: usize, now: Instant, config: &ConsumerConfig) -> Vec<Taken> {
        let mut taken = Vec::new();
        while taken.len() < max {
            let Some(seq) = self.ready.pop_first() else { break };
            let entry = self.entries.get_mut(&seq).expect("ready messages exist");
            entry.deliveries += 1;
            let flight = InFlight {
                attempt: entry.deliveries,
                deadline: after(now, config.ack_wait),
                ack_wait: config.ack_wait,
                max_deliveries: config.max_deliveries,
            };
            entry.status = Status::InFlight(flight);
            self.timers.insert((flight.deadline, seq));
            taken.push(Taken {
                seq,
                attempt: flight.attempt,
                max_deliveries: flight.max_deliveries,
                message: entry.message.clone(),
            });
        }
        taken
    }

    fn set_status(&mut self, seq: u64, status: Status) {
        let entry = self.entries.get_mut(&seq).expect("status of a stored message");
        match entry.status.due() {
            Some(due) => self.timers.remove(&(due, seq)),
            None => self.ready.remove(&seq),
        };
        match status.due() {
            Some(due) => self.timers.insert((due, seq)),
            None => self.ready.insert(seq),
        };
        entry.status = status;
    }

    fn remove(&mut self, seq: u64) -> Entry {
        let entry = self.entries.remove(&seq).expect("removing a stored message");
        match entry.status.due() {
            Some(due) => self.timers.remove(&(due, seq)),
            None => self.ready.remove(&seq),
        };
        entry
    }

    fn due(&self, now: Instant) -> Vec<u64> {
        self.timers.iter().take_while(|(due, _)| *due <= now).map(|&(_, seq)| seq).collect()
    }

    fn next_due(&self) -> Option<Instant> {
        self.timers.first().map(|&(due, _)| due)
    }
}
