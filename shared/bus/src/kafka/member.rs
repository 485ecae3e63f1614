//! One consumer group member: a librdkafka consumer on the group's topics (main and retry),
//! driven by a thread of its own, and shared by every [`Consumer`](crate::Consumer) this
//! process opens on the same queue or subscriber group.
//!
//! The thread polls continuously, so the member heartbeats, takes part in rebalances and
//! keeps its partitions whatever the handlers do; it feeds received records into the
//! [`State`], releases redeliveries when due, redelivers deliveries whose ack deadline passed,
//! dead-letters those past their last allowed delivery, and pauses partitions that hold a
//! message not yet due (or all of them while the local buffer is full). Offsets are committed
//! as handlers finish, each partition only up to its highest offset below which everything is
//! finished, batched per tick of the thread; on revoke and on close the current points are
//! committed synchronously.
//!
//! Sharing one member per process and group means one join per group (a join takes seconds) and
//! no rebalance between a process's own consumers; replicas in other processes are other
//! members, and the group divides the partitions among them.
//!
//! A member of chosen partitions ([`MemberSpec::assigned`]) never joins: its thread assigns it
//! those partitions of every topic by hand, starting from the offsets committed in the group
//! (Kafka's "simple consumer": OffsetFetch and OffsetCommit without a generation), so whoever
//! reads a partition next resumes where it stopped. Everything else is the same machinery.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::Notify;

use super::Shared;
use super::client::{self, ms};
use super::codec;
use super::dead_letter;
use super::retry::{now_ms, unix_ms};
use super::state::{EntryId, Receipt, State, TopicRole, Tp};
use crate::config::StartPosition;
use crate::error::BusError;
use crate::selector::Selector;

/// Longest the poll thread blocks before it looks at its timers again.
const POLL: Duration = Duration::from_millis(50);

/// How long a member of chosen partitions waits before it tries again to take them.
const ASSIGN_RETRY: Duration = Duration::from_secs(1);

/// What a member reads and where its failures go.
#[derive(Debug, Clone)]
pub(crate) struct MemberSpec {
    /// The queue or subscriber group deliveries name as their source.
    pub source: String,
    /// The consumer group id.
    pub group_id: String,
    /// The queue topic, or the event family topics.
    pub main_topics: Vec<String>,
    /// Retry topic of each delay tier.
    pub retry_topics: Vec<(Duration, String)>,
    /// Where dead letters go.
    pub dlq_topic: String,
    /// For subscriber groups (always set): which event types to deliver (others are skipped
    /// unread).
    pub selector: Option<Selector>,
    /// Where the group starts on a main topic partition without a committed offset.
    pub start: StartPosition,
    /// For a consumer of chosen partitions: those partitions of every main and retry topic,
    /// assigned by hand (no rebalancing), sorted; `None`: the group assigns them.
    pub assigned: Option<Vec<u16>>,
    /// Fewest partitions the main and retry topics must have.
    pub min_partitions: i32,
}

impl MemberSpec {
    fn role(&self, topic: &str) -> TopicRole {
        if self.retry_topics.iter().any(|(_, t)| t == topic) { TopicRole::Retry } else { TopicRole::Main }
    }

    /// The retry topic for a redelivery after `delay`.
    pub(crate) fn retry_topic(&self, tier: Duration) -> &str {
        self.retry_topics.iter().find(|(t, _)| *t == tier).map_or(self.main_topics[0].as_str(), |(_, topic)| topic)
    }

    /// What tells this member from the others of its group in one process: its selector, or
    /// the partitions it reads.
    pub(crate) fn member_key(&self) -> String {
        match &self.assigned {
            Some(partitions) => {
                let listed: Vec<String> = partitions.iter().map(u16::to_string).collect();
                format!("[{}]", listed.join(","))
            }
            None => self.selector.as_ref().map(ToString::to_string).unwrap_or_default(),
        }
    }

    /// The partitions a member of chosen partitions reads: each of them in every topic.
    fn assignment(&self) -> Option<TopicPartitionList> {
        let partitions = self.assigned.as_ref()?;
        let mut tpl = TopicPartitionList::new();
        for topic in self.topics() {
            for partition in partitions {
                tpl.add_partition(&topic, i32::from(*partition));
            }
        }
        Some(tpl)
    }

    /// Every topic the member subscribes to.
    pub(crate) fn topics(&self) -> Vec<String> {
        self.main_topics.iter().chain(self.retry_topics.iter().map(|(_, t)| t)).cloned().collect()
    }
}

/// What the member's thread, its context and the delivery handles share.
pub(crate) struct Core {
    pub spec: MemberSpec,
    pub shared: Arc<Shared>,
    state: Mutex<State>,
    /// Woken when messages become ready or the member is assigned partitions.
    pub ready: Notify,
}

impl Core {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits `points`; only the poll thread commits, so one partition's commits reach the
    /// broker in order.
    fn commit(&self, consumer: &BaseConsumer<MemberContext>, points: &[(Tp, i64)], mode: CommitMode) {
        if points.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::with_capacity(points.len());
        for ((topic, partition), offset) in points {
            let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset));
        }
        if let Err(err) = consumer.commit(&tpl, mode) {
            tracing::warn!(group = %self.spec.group_id, error = %err, "committing offsets failed; their messages may be redelivered");
        }
    }

    fn receive(&self, record: &rdkafka::message::BorrowedMessage<'_>) {
        use rdkafka::Message as _;
        let topic: Arc<str> = Arc::from(record.topic());
        let id = EntryId { topic: topic.clone(), partition: record.partition(), offset: record.offset() };
        let mut received = codec::decode(record);
        if self.spec.assigned.is_some() {
            received.message.partition = u16::try_from(record.partition()).ok();
        }
        let selected = match &self.spec.selector {
            Some(selector) if !selector.is_all() && self.spec.role(&topic) == TopicRole::Main => received
                .message
                .headers
                .get(imagepipe_contracts::names::headers::EVENT_TYPE)
                .is_some_and(|t| selector.matches(t)),
            _ => true,
        };
        let receipt = self.lock().receive(id, received, selected, now_ms());
        if receipt == Receipt::Queued {
            self.ready.notify_waiters();
        }
    }

    /// Where each newly assigned partition starts: its committed offset, or for a partition
    /// the group never read, the start position (retry topics and queues from the beginning).
    /// Returns the offsets of the never-read ones, to commit once assigned.
    fn start_offsets(&self, consumer: &BaseConsumer<MemberContext>, tpl: &mut TopicPartitionList) -> Vec<(Tp, i64)> {
        let timeout = self.shared.config.request_timeout;
        let committed = match consumer.committed_offsets(tpl.clone(), timeout) {
            Ok(committed) => committed,
            Err(err) => {
                tracing::error!(group = %self.spec.group_id, error = %err, "cannot read the group's committed offsets; starting from the configured reset");
                return Vec::new();
            }
        };
        let mut fresh = Vec::new();
        let since = match self.spec.start {
            StartPosition::Since(at) => Some(unix_ms(at)),
            _ => None,
        };
        for element in committed.elements() {
            let (topic, partition) = (element.topic().to_owned(), element.partition());
            let start = match element.offset() {
                Offset::Offset(offset) => offset,
                _ => {
                    let is_event_main = self.spec.selector.is_some() && self.spec.role(&topic) == TopicRole::Main;
                    match self.fresh_start(consumer, &topic, partition, is_event_main, since) {
                        Ok(offset) => {
                            fresh.push(((Arc::from(topic.as_str()), partition), offset));
                            offset
                        }
                        Err(err) => {
                            tracing::error!(%topic, partition, error = %err, "cannot look up where to start; using the configured reset");
                            continue;
                        }
                    }
                }
            };
            let _ = tpl.set_partition_offset(&topic, partition, Offset::Offset(start));
        }
        fresh
    }

    fn fresh_start(
        &self,
        consumer: &BaseConsumer<MemberContext>,
        topic: &str,
        partition: i32,
        is_event_main: bool,
        since: Option<i64>,
    ) -> KafkaResult<i64> {
        let timeout = self.shared.config.request_timeout;
        let (low, high) = consumer.fetch_watermarks(topic, partition, timeout)?;
        if !is_event_main {
            return Ok(low);
        }
        match (self.spec.start, since) {
            (StartPosition::New, _) => Ok(high),
            (StartPosition::Beginning, _) => Ok(low),
            (StartPosition::Since(_), Some(at)) => {
                let mut query = TopicPartitionList::with_capacity(1);
                query.add_partition_offset(topic, partition, Offset::Offset(at))?;
                let found = consumer.offsets_for_times(query, timeout)?;
                Ok(match found.find_partition(topic, partition).map(|e| e.offset()) {
                    Some(Offset::Offset(offset)) => offset,
                    _ => high,
                })
            }
            (StartPosition::Since(_), None) => Ok(low),
        }
    }

    /// Partitions were assigned (context callback, or the chosen partitions; on the poll
    /// thread). Returns whether they were taken: chosen partitions are taken all or none, only
    /// once every start offset is known (the caller tries again).
    fn on_assign(&self, consumer: &BaseConsumer<MemberContext>, tpl: &mut TopicPartitionList) -> bool {
        let fresh = self.start_offsets(consumer, tpl);
        if self.spec.assigned.is_some() && tpl.elements().iter().any(|e| !matches!(e.offset(), Offset::Offset(_))) {
            return false;
        }
        if let Err(err) = consumer.assign(tpl) {
            tracing::error!(group = %self.spec.group_id, error = %err, "assigning partitions failed");
            return false;
        }
        // The group starts here for good: a member taking over later resumes from these.
        self.commit(consumer, &fresh, CommitMode::Sync);
        let partitions: Vec<(Tp, TopicRole, i64)> = tpl
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(start) => {
                    Some(((Arc::from(e.topic()), e.partition()), self.spec.role(e.topic()), start))
                }
                _ => None,
            })
            .collect();
        tracing::info!(group = %self.spec.group_id, partitions = partitions.len(), "partitions assigned");
        self.lock().assign(partitions);
        self.ready.notify_waiters();
        true
    }

    /// Partitions were revoked (context callback): commit their points, forget their messages.
    fn on_revoke(&self, consumer: &BaseConsumer<MemberContext>, tpl: &TopicPartitionList) {
        let partitions: Vec<Tp> = tpl.elements().iter().map(|e| (Arc::from(e.topic()), e.partition())).collect();
        let points = self.lock().revoke(&partitions);
        self.commit(consumer, &points, CommitMode::Sync);
        if let Err(err) = consumer.unassign() {
            tracing::error!(group = %self.spec.group_id, error = %err, "unassigning partitions failed");
        }
        tracing::info!(group = %self.spec.group_id, partitions = partitions.len(), "partitions revoked");
    }
}

/// The librdkafka context of a member: rebalances and commit results go to its [`Core`].
pub(crate) struct MemberContext {
    core: Arc<Core>,
}

impl ClientContext for MemberContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, line: &str) {
        client::log(level, facility, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        client::client_error(&error, reason);
    }
}

impl ConsumerContext for MemberContext {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.core.on_assign(consumer, tpl);
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.core.on_revoke(consumer, tpl),
            other => {
                tracing::error!(group = %self.core.spec.group_id, error = ?other, "rebalance failed");
                self.core.on_revoke(consumer, tpl);
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(err) = result {
            tracing::warn!(group = %self.core.spec.group_id, error = %err, offsets = ?offsets.to_topic_map(), "offset commit failed; the messages may be redelivered");
        }
    }
}

/// A group member and its poll thread; stops when the last [`Consumer`](crate::Consumer)
/// using it is dropped.
pub(crate) struct Member {
    pub core: Arc<Core>,
    stop: Arc<AtomicBool>,
    departure: Arc<Departure>,
}

/// Set once a member's thread has left the group. A new member of the same group in this
/// process waits for it: joining while the old member is still leaving can stall the rebalance
/// until the broker times the old one out.
#[derive(Default)]
pub(crate) struct Departure {
    left: AtomicBool,
    notify: Notify,
}

impl Departure {
    /// Whether the member has left its group.
    pub(crate) fn has_left(&self) -> bool {
        self.left.load(Ordering::Acquire)
    }

    fn done(&self) {
        self.left.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Waits until the member has left its group, at most `timeout`.
    pub(crate) async fn wait(&self, timeout: Duration) {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.left.load(Ordering::Acquire) || tokio::time::timeout_at(until, notified).await.is_err() {
                return;
            }
        }
    }
}

impl Member {
    /// Joins the group of `spec` (or takes its chosen partitions): creates its topics,
    /// subscribes, and starts the poll thread.
    pub(crate) async fn start(shared: Arc<Shared>, spec: MemberSpec) -> Result<Arc<Self>, BusError> {
        shared.topics.ensure_at_least(&spec.topics(), spec.min_partitions).await?;
        shared.topics.ensure(std::slice::from_ref(&spec.dlq_topic)).await?;
        let config = &shared.config;
        let core = Arc::new(Core {
            state: Mutex::new(State::new(config.dedup_window, config.prefetch)),
            spec: spec.clone(),
            shared: shared.clone(),
            ready: Notify::new(),
        });
        let reset = match spec.start {
            StartPosition::New if spec.selector.is_some() => "latest",
            _ => "earliest",
        };
        let mut c = client::base_config(config);
        c.set("group.id", &spec.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", reset)
            .set("enable.partition.eof", "false")
            .set("session.timeout.ms", ms(config.session_timeout))
            .set("heartbeat.interval.ms", ms(config.heartbeat_interval))
            .set("fetch.wait.max.ms", ms(config.fetch_wait_max));
        let setup = |source: crate::error::BoxError| BusError::Setup {
            what: format!("consumer group {}", spec.group_id),
            source,
        };
        let consumer: BaseConsumer<MemberContext> =
            c.create_with_context(MemberContext { core: core.clone() }).map_err(|e| setup(Box::new(e)))?;
        let topics = spec.topics();
        let assignment = spec.assignment();
        if assignment.is_none() {
            let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
            consumer.subscribe(&topic_refs).map_err(|e| setup(Box::new(e)))?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let departure = Arc::new(Departure::default());
        let runtime = tokio::runtime::Handle::current();
        {
            let (core, stop, departure) = (core.clone(), stop.clone(), departure.clone());
            std::thread::Builder::new()
                .name(format!("kafka-{}", spec.source))
                .spawn(move || {
                    if let Some(assignment) = assignment {
                        while !stop.load(Ordering::Acquire) && !core.on_assign(&consumer, &mut assignment.clone()) {
                            tracing::warn!(group = %core.spec.group_id, "cannot take the chosen partitions yet; trying again");
                            std::thread::sleep(ASSIGN_RETRY);
                        }
                    }
                    poll_loop(&core, &consumer, &stop, &runtime);
                    departure.done();
                })
                .map_err(|e| setup(Box::new(e)))?;
        }
        match &spec.assigned {
            Some(partitions) => {
                tracing::info!(group = %spec.group_id, topics = ?topics, ?partitions, "reading chosen partitions");
            }
            None => tracing::info!(group = %spec.group_id, topics = ?topics, "joining consumer group"),
        }
        Ok(Arc::new(Self { core, stop, departure }))
    }

    /// Waits until the group assigned this member its partitions (possibly none), at most
    /// `timeout`.
    pub(crate) async fn wait_assigned(&self, timeout: Duration) -> bool {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.core.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.core.lock().assignments() > 0 {
                return true;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return self.core.lock().assignments() > 0;
            }
        }
    }

    /// Set once this member has left its group.
    pub(crate) fn departure(&self) -> Arc<Departure> {
        self.departure.clone()
    }

    /// Stops the poll thread, which commits and leaves the group.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop();
    }
}

fn poll_loop(
    core: &Arc<Core>,
    consumer: &BaseConsumer<MemberContext>,
    stop: &AtomicBool,
    runtime: &tokio::runtime::Handle,
) {
    let mut paused: HashSet<Tp> = HashSet::new();
    let mut seen_assignments = 0;
    let mut next_timer: Option<Instant> = None;
    let mut last_tick = Instant::now();
    let mut last_error: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        let wait = next_timer.map_or(POLL, |t| t.saturating_duration_since(Instant::now()).min(POLL));
        match consumer.poll(wait) {
            Some(Ok(record)) => core.receive(&record),
            Some(Err(err)) if last_error.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) => {
                tracing::warn!(group = %core.spec.group_id, error = %err, "consumer error; the client retries");
                last_error = Some(Instant::now());
            }
            Some(Err(_)) | None => {}
        }
        let now = Instant::now();
        if now.duration_since(last_tick) < Duration::from_millis(10) && next_timer.is_none_or(|t| t > now) {
            continue;
        }
        last_tick = now;
        let (tick, assignments, commits) = {
            let mut state = core.lock();
            (state.tick(now, now_ms()), state.assignments(), state.take_commits())
        };
        core.commit(consumer, &commits, CommitMode::Async);
        next_timer = tick.next_timer;
        if tick.released {
            core.ready.notify_waiters();
        }
        for expired in tick.expired {
            runtime.spawn(dead_letter_expired(core.clone(), expired));
        }
        if assignments != seen_assignments {
            seen_assignments = assignments;
            paused.clear();
        }
        reconcile_pauses(consumer, &mut paused, tick.pause);
    }
    let points = core.lock().revoke_all();
    core.commit(consumer, &points, CommitMode::Sync);
    if let Err(err) = consumer.close_queue() {
        tracing::warn!(group = %core.spec.group_id, error = %err, "closing the consumer failed");
        return;
    }
    let until = Instant::now() + Duration::from_secs(30);
    while !consumer.closed() && Instant::now() < until {
        let _ = consumer.poll(Duration::from_millis(100));
    }
    tracing::info!(group = %core.spec.group_id, "left consumer group");
}

fn reconcile_pauses(consumer: &BaseConsumer<MemberContext>, paused: &mut HashSet<Tp>, wanted: HashSet<Tp>) {
    let list = |tps: &mut dyn Iterator<Item = &Tp>| {
        let mut tpl = TopicPartitionList::new();
        for (topic, partition) in tps {
            tpl.add_partition(topic, *partition);
        }
        tpl
    };
    let to_pause: Vec<&Tp> = wanted.difference(paused).collect();
    if !to_pause.is_empty()
        && let Err(err) = consumer.pause(&list(&mut to_pause.into_iter()))
    {
        tracing::warn!(error = %err, "pausing partitions failed");
    }
    let to_resume: Vec<&Tp> = paused.difference(&wanted).collect();
    if !to_resume.is_empty()
        && let Err(err) = consumer.resume(&list(&mut to_resume.into_iter()))
    {
        tracing::warn!(error = %err, "resuming partitions failed");
    }
    *paused = wanted;
}

async fn dead_letter_expired(core: Arc<Core>, expired: super::state::Expired) {
    let reason = format!("ack deadline expired after {} deliveries", expired.delivery_count);
    let written = dead_letter::write(
        &core.shared,
        &core.spec.source,
        &core.spec.dlq_topic,
        &expired.message,
        expired.delivery_count,
        &reason,
    )
    .await;
    let mut state = core.lock();
    match written {
        Ok(()) => {
            let _ = state.finish(&expired.id, expired.epoch);
        }
        Err(err) => {
            tracing::error!(position = %expired.id, error = %err, "dead-lettering an expired message failed; retried after its ack deadline");
            state.release(&expired.id, Instant::now());
        }
    }
}
