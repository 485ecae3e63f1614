//! What a broker holds for one `bus.prefix`, read without changing anything: how many messages
//! wait in a queue ([`Backlog`], for the coordinator's gauges), and which streams or topics,
//! consumers and their lag exist ([`BrokerReport`], for `imagepipe doctor`).

use serde::Serialize;

/// The messages of one task queue its consumer has not finished, as the broker counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Backlog {
    /// Stored and not yet delivered to any consumer: the consumer's lag. On Kafka, the
    /// messages past the group's committed offsets (delivered but uncommitted ones included).
    pub waiting: u64,
    /// Delivered and not yet acknowledged (always 0 on Kafka, whose broker does not know).
    pub unacked: u64,
}

impl Backlog {
    /// The queue's depth: every message not yet finished.
    pub fn depth(&self) -> u64 {
        self.waiting.saturating_add(self.unacked)
    }
}

/// A broker's streams (NATS) or topics (Kafka) of one prefix, the durable consumers or groups
/// of its task queues, and the stores of other prefixes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BrokerReport {
    /// The server (NATS: its version) or brokers (Kafka: the bootstrap list, credentials masked).
    pub server: String,
    /// The prefix inspected.
    pub prefix: String,
    /// The streams or topics the prefix needs, in a fixed order.
    pub stores: Vec<StoreReport>,
    /// The consumers of the prefix's task queues and, on NATS, of its subscriber groups.
    pub consumers: Vec<ConsumerReport>,
    /// Task streams of other prefixes on the same server (NATS only).
    pub other_prefixes: Vec<OtherPrefix>,
}

/// One stream or topic a prefix needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreReport {
    /// Stream or topic name (`IMAGEPIPE_TASKS`, `imagepipe.tasks.submit`).
    pub name: String,
    /// The subjects it must capture (NATS), or the topic itself (Kafka).
    pub captures: String,
    /// Whether it exists.
    pub exists: bool,
    /// What is wrong with it when it exists but does not fit (captures other subjects).
    pub problem: Option<String>,
    /// Messages it holds now, when the broker says cheaply.
    pub messages: Option<u64>,
}

/// The durable consumer (NATS) or consumer group (Kafka) of one queue or subscriber group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerReport {
    /// The queue (`tasks.download`) or subscriber group (`events.analytics`) it serves.
    pub serves: String,
    /// Its name on the broker (`tasks_download`, `imagepipe.tasks.download`).
    pub name: String,
    /// Its backlog; `None` when it does not exist (nothing has consumed the queue yet).
    pub backlog: Option<Backlog>,
}

/// A task stream of another prefix on the same NATS server: publishes on its subjects are
/// stored there, where no service of this configuration reads them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OtherPrefix {
    /// The other prefix (`imagepipe`).
    pub prefix: String,
    /// Its task stream (`IMAGEPIPE_TASKS`).
    pub stream: String,
    /// The subjects it captures (`imagepipe.tasks.>`).
    pub captures: String,
}
