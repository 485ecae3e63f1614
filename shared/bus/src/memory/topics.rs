//! Event topics: a retained log per topic, and one bounded queue per subscriber group.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use imagepipe_contracts::names::{headers, topic_of_event_type};
use tokio::time::Instant;

use super::dedup::DedupWindow;
use super::queue::{Queue, after};
use crate::config::{GroupLifetime, MemoryConfig, StartPosition, Subscription};
use crate::error::BusError;
use crate::message::Message;
use crate::selector::Selector;

/// Every topic and subscriber group of one bus.
pub(super) struct Events {
    prefix: String,
    config: MemoryConfig,
    state: Mutex<State>,
}

struct State {
    /// Publish order across topics, so a new group's backlog interleaves topics correctly.
    next_seq: u64,
    topics: HashMap<String, Topic>,
    groups: HashMap<String, Group>,
}

struct Topic {
    log: VecDeque<Retained>,
    dedup: DedupWindow,
}

struct Retained {
    seq: u64,
    published: SystemTime,
    event_type: String,
    message: Message,
}

struct Group {
    selector: Selector,
    queue: Arc<Queue>,
    /// Members of a group that goes with its last one ([`GroupLifetime::UntilIdle`]); `None`
    /// for a durable group.
    members: Option<usize>,
}

impl Events {
    pub(super) fn new(prefix: String, config: MemoryConfig) -> Self {
        let state = State { next_seq: 1, topics: HashMap::new(), groups: HashMap::new() };
        Self { prefix, config, state: Mutex::new(state) }
    }

    /// Appends the event to its topic's log and to every group whose selector accepts it.
    /// Waits up to the send timeout until every such group has room, so an event reaches all
    /// of them or none.
    pub(super) async fn publish(&self, event_type: &str, mut message: Message) -> Result<(), BusError> {
        message.headers.insert(headers::EVENT_TYPE, event_type);
        let topic_name = topic_of_event_type(event_type);
        let started = Instant::now();
        let give_up = after(started, self.config.send_timeout);
        loop {
            let full = {
                let now = Instant::now();
                let mut state = self.lock();
                let state = &mut *state;
                let topic = state.topics.entry(topic_name.clone()).or_insert_with(|| Topic {
                    log: VecDeque::new(),
                    dedup: DedupWindow::new(self.config.dedup_window),
                });
                if let Some(id) = &message.id
                    && topic.dedup.is_duplicate(id, now)
                {
                    tracing::debug!(topic = %format_args!("{}.{topic_name}", self.prefix), id, "duplicate event id; dropped");
                    return Ok(());
                }
                let targets: Vec<&Arc<Queue>> =
                    state.groups.values().filter(|g| g.selector.matches(event_type)).map(|g| &g.queue).collect();
                match targets.iter().find(|q| !q.has_room()) {
                    Some(full) => Arc::clone(full),
                    None => {
                        // Only publishers (serialized by this lock) add to groups, so the room
                        // just checked is still there.
                        for queue in targets {
                            queue.push_unbounded([message.clone()]);
                        }
                        if let Some(id) = &message.id {
                            topic.dedup.record(id, now);
                        }
                        let seq = state.next_seq;
                        state.next_seq += 1;
                        let published = SystemTime::now();
                        topic.log.push_back(Retained { seq, published, event_type: event_type.to_owned(), message });
                        while topic.log.len() > self.config.retention {
                            topic.log.pop_front();
                        }
                        return Ok(());
                    }
                }
            };
            if !full.wait_for_room(give_up).await? {
                return Err(BusError::Full { destination: full.display().to_owned(), waited: started.elapsed() });
            }
        }
    }

    /// The queue of `subscription`'s group: the existing one (resumed; its start position is
    /// ignored, a changed selector applies to later events), or a new one holding the retained
    /// events its start position and selector ask for. A member of a group that expires when
    /// idle is counted; [`leave`](Self::leave) drops the group with its last member.
    pub(super) fn join(&self, subscription: &Subscription) -> Arc<Queue> {
        let mut state = self.lock();
        let state = &mut *state;
        if let Some(group) = state.groups.get_mut(&subscription.group) {
            if let Some(members) = &mut group.members {
                *members += 1;
            }
            if group.selector != subscription.selector {
                tracing::info!(group = %subscription.group, from = %group.selector, to = %subscription.selector,
                    "subscriber group selector changed");
                group.selector = subscription.selector.clone();
            }
            return group.queue.clone();
        }
        let queue = Arc::new(Queue::new(
            subscription.group.clone(),
            format!("{}.events[{}]", self.prefix, subscription.group),
            self.config.capacity,
            self.config.send_timeout,
            self.config.dedup_window,
            None,
        ));
        let mut backlog: Vec<&Retained> = state
            .topics
            .values()
            .flat_map(|t| t.log.iter())
            .filter(|r| subscription.selector.matches(&r.event_type) && starts_at(subscription.start, r))
            .collect();
        backlog.sort_by_key(|r| r.seq);
        if backlog.len() > self.config.capacity {
            tracing::warn!(group = %subscription.group, backlog = backlog.len(), capacity = self.config.capacity,
                "new subscriber group starts with more retained events than its capacity; publishers wait until it drains");
        }
        queue.push_unbounded(backlog.into_iter().map(|r| r.message.clone()));
        tracing::info!(group = %subscription.group, selector = %subscription.selector, start = ?subscription.start,
            backlog = queue.len(), "subscriber group created");
        let members = match subscription.lifetime {
            GroupLifetime::Durable => None,
            GroupLifetime::UntilIdle(_) => Some(1),
        };
        state.groups.insert(
            subscription.group.clone(),
            Group { selector: subscription.selector.clone(), queue: queue.clone(), members },
        );
        queue
    }

    /// A member of `group` is gone: a group that expires when idle is deleted with its last
    /// member (in one process, a member nobody holds is idle for ever).
    pub(super) fn leave(&self, group: &str) {
        let mut state = self.lock();
        let Some(members) = state.groups.get_mut(group).and_then(|g| g.members.as_mut()) else { return };
        *members = members.saturating_sub(1);
        if *members == 0
            && let Some(gone) = state.groups.remove(group)
        {
            gone.queue.close();
            tracing::info!(group, "subscriber group deleted with its last member");
        }
    }

    /// Closes every group's queue.
    pub(super) fn close(&self) {
        for group in self.lock().groups.values() {
            group.queue.close();
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("memory bus events lock poisoned")
    }
}

fn starts_at(start: StartPosition, event: &Retained) -> bool {
    match start {
        StartPosition::New => false,
        StartPosition::Beginning => true,
        StartPosition::Since(t) => event.published >= t,
    }
}
