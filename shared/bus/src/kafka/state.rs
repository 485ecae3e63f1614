//! What one group member knows about its partitions and the messages it received: commit points,
//! deduplication windows, redeliveries held until due, and every message from receipt to settle.
//!
//! Pure bookkeeping (no I/O): the member's poll thread and the delivery handles drive it under one
//! lock, and act on what it returns (offsets to commit, messages to dead-letter, partitions to
//! pause).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::codec::Received;
use super::dedup::DedupWindow;
use super::offsets::OffsetTracker;
use crate::config::ConsumerConfig;
use crate::message::Message;

/// A topic partition.
pub(crate) type Tp = (Arc<str>, i32);

/// One received message: where it is in the log.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct EntryId {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
}

impl EntryId {
    fn tp(&self) -> Tp {
        (self.topic.clone(), self.partition)
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]@{}", self.topic, self.partition, self.offset)
    }
}

/// What kind of topic a partition belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TopicRole {
    /// The queue's topic or an event family topic: deduplicated, filtered by selector.
    Main,
    /// A retry topic: messages carry their delivery count and due time.
    Retry,
}

struct PartitionState {
    /// Changes on every assignment of the partition; handles of an older epoch are stale.
    epoch: u64,
    role: TopicRole,
    tracker: OffsetTracker,
    dedup: DedupWindow,
    /// Redeliveries not yet due, in log order, with their due time (Unix ms).
    held: VecDeque<(i64, EntryId)>,
}

enum Phase {
    /// Waiting in the ready queue.
    Ready,
    /// Held on its retry partition until due.
    Held,
    /// Handed to a handler.
    Out { deadline: Instant, ack_wait: Duration, max_deliveries: u32 },
    /// Being redelivered or dead-lettered.
    Settling { ack_wait: Duration, max_deliveries: u32 },
}

struct Entry {
    message: Message,
    delivery_count: u32,
    /// Bumped on every hand-out: handles of an older attempt may ack, but no longer nack.
    attempt: u32,
    phase: Phase,
}

/// A message handed to a handler.
pub(crate) struct Handout {
    pub id: EntryId,
    pub epoch: u64,
    pub attempt: u32,
    pub message: Message,
    pub delivery_count: u32,
}

/// A message whose last allowed delivery expired: to be dead-lettered.
pub(crate) struct Expired {
    pub id: EntryId,
    pub epoch: u64,
    pub message: Message,
    pub delivery_count: u32,
}

/// What a settle may do with a delivery.
pub(crate) enum Claim {
    /// It is this handle's to redeliver or dead-letter: here is the message.
    Granted { message: Message, delivery_count: u32 },
    /// A later delivery of the same message owns it now, or it was already settled.
    Stale,
    /// Its partition went to another member (or this one again) since: it is redelivered.
    Revoked,
}

/// What the poll thread must do after a tick.
pub(crate) struct Tick {
    pub expired: Vec<Expired>,
    /// Partitions to keep paused.
    pub pause: HashSet<Tp>,
    /// When the next held message is due or the next deadline expires.
    pub next_timer: Option<Instant>,
    /// Whether anything became ready.
    pub released: bool,
}

/// The bookkeeping of one member.
pub(crate) struct State {
    partitions: HashMap<Tp, PartitionState>,
    entries: HashMap<EntryId, Entry>,
    ready: VecDeque<EntryId>,
    /// Commit points that moved since the poll thread last committed.
    commits: HashMap<Tp, i64>,
    next_epoch: u64,
    assignments: u64,
    dedup_window_ms: i64,
    prefetch: usize,
    /// Set when the buffer reached `prefetch`; cleared once it is down to half.
    full: bool,
}

/// What [`State::receive`] made of a record.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Receipt {
    /// Ready to hand out (or held until due).
    Queued,
    /// Dropped and finished at once (duplicate id, or an event the selector rejects), with the
    /// partition's new commit point when it moved.
    Skipped(Option<i64>),
    /// Not for this member (refetched, or its partition is not assigned).
    Ignored,
}

impl State {
    pub(crate) fn new(dedup_window: Duration, prefetch: usize) -> Self {
        Self {
            partitions: HashMap::new(),
            entries: HashMap::new(),
            ready: VecDeque::new(),
            commits: HashMap::new(),
            next_epoch: 1,
            assignments: 0,
            dedup_window_ms: i64::try_from(dedup_window.as_millis()).unwrap_or(i64::MAX),
            prefetch,
            full: false,
        }
    }

    /// How many assignments the member has had (0: it has not joined yet).
    pub(crate) fn assignments(&self) -> u64 {
        self.assignments
    }

    /// Partitions were assigned, each read from its start offset.
    pub(crate) fn assign(&mut self, partitions: impl IntoIterator<Item = (Tp, TopicRole, i64)>) {
        for (tp, role, start) in partitions {
            let epoch = self.next_epoch;
            self.next_epoch += 1;
            let state = PartitionState {
                epoch,
                role,
                tracker: OffsetTracker::new(start),
                dedup: DedupWindow::new(if role == TopicRole::Main { self.dedup_window_ms } else { 0 }),
                held: VecDeque::new(),
            };
            self.partitions.insert(tp, state);
        }
        self.assignments += 1;
    }

    /// Partitions were revoked: forgets them and their messages. Returns the commit point of
    /// each, to commit before letting them go.
    pub(crate) fn revoke(&mut self, partitions: &[Tp]) -> Vec<(Tp, i64)> {
        let mut points = Vec::new();
        for tp in partitions {
            if let Some(state) = self.partitions.remove(tp) {
                points.push((tp.clone(), state.tracker.commit_point()));
            }
        }
        let gone: HashSet<&Tp> = partitions.iter().collect();
        self.commits.retain(|tp, _| !gone.contains(tp));
        self.entries.retain(|id, _| !gone.contains(&id.tp()));
        self.ready.retain(|id| !gone.contains(&id.tp()));
        points
    }

    /// The commit points that moved since the last call, to commit now.
    pub(crate) fn take_commits(&mut self) -> Vec<(Tp, i64)> {
        self.commits.drain().collect()
    }

    /// The member stops: revokes every partition (later settles of its deliveries fail as
    /// revoked) and returns their commit points.
    pub(crate) fn revoke_all(&mut self) -> Vec<(Tp, i64)> {
        let partitions: Vec<Tp> = self.partitions.keys().cloned().collect();
        self.revoke(&partitions)
    }

    /// Takes in a received record. `selected` says whether a main-topic event passes the
    /// subscriber's selector; `now_ms` is the wall clock in Unix ms.
    pub(crate) fn receive(&mut self, id: EntryId, record: Received, selected: bool, now_ms: i64) -> Receipt {
        let Some(partition) = self.partitions.get_mut(&id.tp()) else { return Receipt::Ignored };
        if !partition.tracker.receive(id.offset) {
            return Receipt::Ignored;
        }
        let (delivery_count, due) = match partition.role {
            TopicRole::Main => {
                let duplicate = record
                    .message
                    .id
                    .as_deref()
                    .is_some_and(|mid| partition.dedup.is_duplicate(mid, record.timestamp_ms.unwrap_or(now_ms)));
                if !selected || duplicate {
                    if duplicate {
                        tracing::debug!(position = %id, "dropped a duplicate message id");
                    }
                    let point = partition.tracker.finish(id.offset);
                    if let Some(point) = point {
                        self.commits.insert(id.tp(), point);
                    }
                    return Receipt::Skipped(point);
                }
                (1, None)
            }
            TopicRole::Retry => (record.delivery_count.unwrap_or(2).max(1), record.due_ms),
        };
        let held = match due {
            Some(due) if due > now_ms || !partition.held.is_empty() => {
                partition.held.push_back((due, id.clone()));
                true
            }
            _ => false,
        };
        let phase = if held { Phase::Held } else { Phase::Ready };
        self.entries.insert(id.clone(), Entry { message: record.message, delivery_count, attempt: 0, phase });
        if !held {
            self.ready.push_back(id);
        }
        Receipt::Queued
    }

    /// Hands out up to `max` ready messages to a handler with `config`.
    pub(crate) fn take(&mut self, max: usize, config: &ConsumerConfig, now: Instant) -> Vec<Handout> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(id) = self.ready.pop_front() else { break };
            let (Some(entry), Some(partition)) = (self.entries.get_mut(&id), self.partitions.get(&id.tp())) else {
                continue;
            };
            if !matches!(entry.phase, Phase::Ready) {
                continue;
            }
            entry.attempt += 1;
            entry.phase = Phase::Out {
                deadline: now + config.ack_wait,
                ack_wait: config.ack_wait,
                max_deliveries: config.max_deliveries,
            };
            out.push(Handout {
                epoch: partition.epoch,
                attempt: entry.attempt,
                message: entry.message.clone(),
                delivery_count: entry.delivery_count,
                id,
            });
        }
        out
    }

    /// Whether anything is ready to hand out.
    #[cfg(test)]
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The handler finished the message (ack), or it was redelivered elsewhere or dead-lettered:
    /// forget it. Returns the new commit point of its partition when it moved (the poll thread
    /// commits it with the next [`take_commits`](Self::take_commits)).
    pub(crate) fn finish(&mut self, id: &EntryId, epoch: u64) -> Result<Option<i64>, Revoked> {
        let partition = self.partitions.get_mut(&id.tp()).filter(|p| p.epoch == epoch).ok_or(Revoked)?;
        if self.entries.remove(id).is_none() {
            return Ok(None);
        }
        let point = partition.tracker.finish(id.offset);
        if let Some(point) = point {
            self.commits.insert(id.tp(), point);
        }
        Ok(point)
    }

    /// An ack from attempt `attempt`: finishes the message unless a redelivery or dead letter of
    /// it is being written.
    pub(crate) fn ack(&mut self, id: &EntryId, epoch: u64) -> Result<Option<i64>, Revoked> {
        if self.partitions.get(&id.tp()).is_none_or(|p| p.epoch != epoch) {
            return Err(Revoked);
        }
        match self.entries.get(id) {
            Some(entry) if matches!(entry.phase, Phase::Out { .. } | Phase::Ready | Phase::Held) => {
                self.ready.retain(|r| r != id);
                self.finish(id, epoch)
            }
            _ => Ok(None),
        }
    }

    /// Claims the message for a nack or dead letter by attempt `attempt`.
    pub(crate) fn claim(&mut self, id: &EntryId, epoch: u64, attempt: u32) -> Claim {
        if self.partitions.get(&id.tp()).is_none_or(|p| p.epoch != epoch) {
            return Claim::Revoked;
        }
        let Some(entry) = self.entries.get_mut(id) else { return Claim::Stale };
        match entry.phase {
            Phase::Out { ack_wait, max_deliveries, .. } if entry.attempt == attempt => {
                entry.phase = Phase::Settling { ack_wait, max_deliveries };
                Claim::Granted { message: entry.message.clone(), delivery_count: entry.delivery_count }
            }
            _ => Claim::Stale,
        }
    }

    /// A claimed settle failed: the message is out again, redelivered after its ack deadline.
    pub(crate) fn release(&mut self, id: &EntryId, now: Instant) {
        if let Some(entry) = self.entries.get_mut(id)
            && let Phase::Settling { ack_wait, max_deliveries } = entry.phase
        {
            entry.phase = Phase::Out { deadline: now + ack_wait, ack_wait, max_deliveries };
        }
    }

    /// Restarts the ack deadline of attempt `attempt`.
    pub(crate) fn progress(&mut self, id: &EntryId, epoch: u64, attempt: u32, now: Instant) -> Result<(), Revoked> {
        if self.partitions.get(&id.tp()).is_none_or(|p| p.epoch != epoch) {
            return Err(Revoked);
        }
        if let Some(entry) = self.entries.get_mut(id)
            && entry.attempt == attempt
            && let Phase::Out { deadline, ack_wait, .. } = &mut entry.phase
        {
            *deadline = now + *ack_wait;
        }
        Ok(())
    }

    /// Releases held messages that are due, redelivers expired ones (or returns them for dead-
    /// lettering after their last allowed delivery), and says which partitions to keep paused.
    pub(crate) fn tick(&mut self, now: Instant, now_ms: i64) -> Tick {
        let mut released = false;
        let mut next_due_ms: Option<i64> = None;
        let mut pause = HashSet::new();
        for (tp, partition) in &mut self.partitions {
            while let Some((due, _)) = partition.held.front() {
                if *due > now_ms {
                    next_due_ms = Some(next_due_ms.map_or(*due, |n| n.min(*due)));
                    pause.insert(tp.clone());
                    break;
                }
                let (_, id) = partition.held.pop_front().expect("front exists");
                if let Some(entry) = self.entries.get_mut(&id) {
                    entry.phase = Phase::Ready;
                    self.ready.push_back(id);
                    released = true;
                }
            }
        }
        let mut expired = Vec::new();
        let mut next_deadline: Option<Instant> = None;
        for (id, entry) in &mut self.entries {
            let Phase::Out { deadline, ack_wait, max_deliveries } = entry.phase else { continue };
            if deadline > now {
                next_deadline = Some(next_deadline.map_or(deadline, |n| n.min(deadline)));
                continue;
            }
            if entry.delivery_count >= max_deliveries {
                entry.phase = Phase::Settling { ack_wait, max_deliveries };
                let epoch = self.partitions.get(&id.tp()).map_or(0, |p| p.epoch);
                expired.push(Expired {
                    id: id.clone(),
                    epoch,
                    message: entry.message.clone(),
                    delivery_count: entry.delivery_count,
                });
            } else {
                entry.delivery_count += 1;
                entry.phase = Phase::Ready;
                self.ready.push_back(id.clone());
                released = true;
            }
        }
        // Resuming at half rather than just below the limit lets the next fetch from the broker
        // overlap with handling what is buffered.
        if self.ready.len() >= self.prefetch {
            self.full = true;
        } else if self.ready.len() <= self.prefetch / 2 {
            self.full = false;
        }
        if self.full {
            pause.extend(self.partitions.keys().cloned());
        }
        let next_due = next_due_ms.map(|due| now + Duration::from_millis(u64::try_from(due - now_ms).unwrap_or(0)));
        let next_timer = match (next_due, next_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Tick { expired, pause, next_timer, released }
    }
}

/// The partition of a delivery was revoked since it was handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Revoked;

#[cfg(test)]
mod tests {
    use super::*;

    fn id(offset: i64) -> EntryId {
        EntryId { topic: "t".into(), partition: 0, offset }
    }

    fn record(body: &str) -> Received {
        Received {
            message: Message::new(body.to_owned()).with_id(body.to_owned()),
            delivery_count: None,
            due_ms: None,
            timestamp_ms: Some(0),
        }
    }

    fn config(max_deliveries: u32) -> ConsumerConfig {
        ConsumerConfig { ack_wait: Duration::from_secs(1), max_deliveries }
    }

    fn state_with(role: TopicRole) -> State {
        let mut state = State::new(Duration::from_secs(60), 100);
        state.assign([(("t".into(), 0), role, 0)]);
        state
    }

    #[test]
    fn acks_out_of_order_commit_below_the_gap() {
        let mut s = state_with(TopicRole::Main);
        for o in 0..3 {
            assert_eq!(s.receive(id(o), record(&format!("m{o}")), true, 0), Receipt::Queued);
        }
        let out = s.take(3, &config(5), Instant::now());
        assert_eq!(out.len(), 3);
        assert_eq!(s.ack(&id(2), out[2].epoch), Ok(None));
        assert_eq!(s.ack(&id(0), out[0].epoch), Ok(Some(1)));
        assert_eq!(s.ack(&id(1), out[1].epoch), Ok(Some(3)));
        assert_eq!(s.take_commits(), vec![(("t".into(), 0), 3)], "the latest point, once");
        assert!(s.take_commits().is_empty());
    }

    #[test]
    fn duplicates_and_rejected_events_are_finished_unseen() {
        let mut s = state_with(TopicRole::Main);
        assert_eq!(s.receive(id(0), record("a"), true, 0), Receipt::Queued);
        assert_eq!(s.receive(id(1), record("a"), true, 0), Receipt::Skipped(None), "0 is unfinished");
        assert_eq!(s.receive(id(2), record("b"), false, 0), Receipt::Skipped(None));
        let out = s.take(10, &config(5), Instant::now());
        assert_eq!(out.len(), 1);
        assert_eq!(s.ack(&id(0), out[0].epoch), Ok(Some(3)));
    }

    #[test]
    fn an_expired_delivery_comes_back_then_goes_to_dead_letters() {
        let mut s = state_with(TopicRole::Main);
        s.receive(id(0), record("a"), true, 0);
        let start = Instant::now();
        let first = s.take(1, &config(2), start).pop().unwrap();
        assert_eq!(first.delivery_count, 1);
        let tick = s.tick(start + Duration::from_millis(1500), 0);
        assert!(tick.released && tick.expired.is_empty());
        let second = s.take(1, &config(2), start).pop().unwrap();
        assert_eq!((second.delivery_count, second.attempt), (2, 2));
        assert!(matches!(s.claim(&first.id, first.epoch, first.attempt), Claim::Stale), "an old attempt cannot nack");
        let tick = s.tick(start + Duration::from_secs(5), 0);
        assert_eq!(tick.expired.len(), 1);
        assert_eq!(tick.expired[0].delivery_count, 2);
        assert_eq!(s.finish(&tick.expired[0].id, tick.expired[0].epoch), Ok(Some(1)));
    }

    #[test]
    fn an_old_attempt_may_still_ack() {
        let mut s = state_with(TopicRole::Main);
        s.receive(id(0), record("a"), true, 0);
        let start = Instant::now();
        let first = s.take(1, &config(5), start).pop().unwrap();
        s.tick(start + Duration::from_secs(2), 0);
        let second = s.take(1, &config(5), start).pop().unwrap();
        assert_eq!(s.ack(&first.id, first.epoch), Ok(Some(1)));
        assert_eq!(s.ack(&second.id, second.epoch), Ok(None), "already settled");
    }

    #[test]
    fn retry_records_are_held_until_due_in_order() {
        let mut s = state_with(TopicRole::Retry);
        let mut r = record("late");
        r.delivery_count = Some(3);
        r.due_ms = Some(1000);
        assert_eq!(s.receive(id(0), r, true, 0), Receipt::Queued);
        let mut early = record("early");
        early.due_ms = Some(10);
        s.receive(id(1), early, true, 0);
        let now = Instant::now();
        let tick = s.tick(now, 500);
        assert!(!tick.released && tick.pause.contains(&("t".into(), 0)));
        assert!(tick.next_timer.is_some());
        assert!(s.take(5, &config(5), now).is_empty(), "the later one waits behind the held head");
        let tick = s.tick(now, 1000);
        assert!(tick.released && tick.pause.is_empty());
        let out = s.take(5, &config(5), now);
        assert_eq!(out.iter().map(|h| h.delivery_count).collect::<Vec<_>>(), [3, 2]);
    }

    #[test]
    fn revoked_partitions_drop_their_messages_and_handles() {
        let mut s = state_with(TopicRole::Main);
        s.receive(id(0), record("a"), true, 0);
        s.receive(id(1), record("b"), true, 0);
        let out = s.take(1, &config(5), Instant::now());
        s.receive(id(2), record("c"), false, 0);
        assert_eq!(s.revoke(&[("t".into(), 0)]), vec![(("t".into(), 0), 0)]);
        assert!(s.take_commits().is_empty(), "nothing left to commit for a revoked partition");
        assert!(!s.has_ready());
        assert_eq!(s.ack(&out[0].id, out[0].epoch), Err(Revoked));
        s.assign([(("t".into(), 0), TopicRole::Main, 0)]);
        assert_eq!(s.ack(&out[0].id, out[0].epoch), Err(Revoked), "a new epoch");
    }

    #[test]
    fn a_full_buffer_pauses_every_partition_until_half_empty() {
        let mut s = State::new(Duration::ZERO, 4);
        s.assign([(("t".into(), 0), TopicRole::Main, 0), (("u".into(), 1), TopicRole::Main, 0)]);
        for o in 0..3 {
            s.receive(id(o), record(&format!("m{o}")), true, 0);
        }
        assert!(s.tick(Instant::now(), 0).pause.is_empty());
        s.receive(id(3), record("m3"), true, 0);
        assert_eq!(s.tick(Instant::now(), 0).pause.len(), 2);
        s.take(1, &config(5), Instant::now());
        assert_eq!(s.tick(Instant::now(), 0).pause.len(), 2, "3 of 4 buffered: still paused");
        s.take(1, &config(5), Instant::now());
        assert!(s.tick(Instant::now(), 0).pause.is_empty(), "half empty: resumed");
    }
}
