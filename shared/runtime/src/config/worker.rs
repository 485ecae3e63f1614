//! The `worker` section: how every worker loop consumes its queue or subscriber group.

use std::time::Duration;

use imagepipe_bus::{ConsumerConfig, Shares};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, positive};

/// The `worker` section: how a worker consumes its queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Most messages handled at once (default 2 × cores); `PUT /v1/queues/{queue}/concurrency`
    /// overrides it live for a stage.
    #[schemars(extend("x-default" = "2 × the number of cores"))]
    pub concurrency: usize,
    /// A delivery not settled (nor extended by progress) within this time is redelivered.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub ack_wait: Duration,
    /// Deliveries allowed before a message is dead-lettered.
    pub max_deliveries: u32,
    /// A handler running longer is abandoned and its message retried.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub handler_timeout: Duration,
    /// On shutdown, how long in-flight handlers may take to finish.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub shutdown_grace: Duration,
    /// Shares of the priority lanes under backlog (`high`, `normal`, `low`, each at least 1): the
    /// guaranteed part of the messages a worker takes while every lane waits.
    pub priority_shares: PriorityShares,
}

/// `worker.priority_shares`: relative shares of the priority lanes under backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PriorityShares {
    /// Share of the `high` lane (default 70).
    pub high: u32,
    /// Share of the `normal` lane (default 20).
    pub normal: u32,
    /// Share of the `low` lane (default 10); at least 1, so a backfill is never starved.
    pub low: u32,
}

impl Default for PriorityShares {
    fn default() -> Self {
        let Shares([high, normal, low]) = Shares::default();
        Self { high, normal, low }
    }
}

impl PriorityShares {
    /// The shares as the bus's [`Lanes`](imagepipe_bus::Lanes) take them.
    pub fn shares(&self) -> Shares {
        Shares([self.high, self.normal, self.low])
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            concurrency: 2 * cores,
            ack_wait: Duration::from_secs(30),
            max_deliveries: 5,
            handler_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(25),
            priority_shares: PriorityShares::default(),
        }
    }
}

impl WorkerConfig {
    /// The consumer settings to open the worker's queue with.
    pub fn consumer_config(&self) -> ConsumerConfig {
        ConsumerConfig { ack_wait: self.ack_wait, max_deliveries: self.max_deliveries }
    }
}

impl WorkerConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.concurrency == 0 {
            return Err(ConfigError::invalid("worker.concurrency", "must be at least 1"));
        }
        if self.max_deliveries == 0 {
            return Err(ConfigError::invalid("worker.max_deliveries", "must be at least 1"));
        }
        let PriorityShares { high, normal, low } = self.priority_shares;
        if low == 0 || normal == 0 || high == 0 {
            return Err(ConfigError::invalid(
                "worker.priority_shares",
                format!(
                    "every lane needs a share of at least 1, or it could starve (got high {high}, normal {normal}, low {low})"
                ),
            ));
        }
        if u64::from(high) + u64::from(normal) + u64::from(low) > 1_000_000 {
            return Err(ConfigError::invalid("worker.priority_shares", "the shares must add up to at most 1000000"));
        }
        positive("worker.ack_wait", self.ack_wait)?;
        positive("worker.handler_timeout", self.handler_timeout)
    }
}
