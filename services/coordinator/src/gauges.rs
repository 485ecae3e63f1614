//! The backlog gauges, sampled by one loop every [`SAMPLE_INTERVAL`]: each task queue's depth
//! and consumer lag as the broker counts them ([`TaskQueue::backlog`]: pending counts of the
//! durable consumer on NATS, the group's lag on Kafka, the queue's length in memory), and the
//! dead letters in the archive. Every coordinator replica samples the same numbers, so
//! aggregate them with `max`, not `sum`.
//!
//! [`TaskQueue::backlog`]: imagepipe_bus::TaskQueue::backlog

use std::time::Duration;

use imagepipe_bus::Bus;
use imagepipe_contracts::names::queues;
use imagepipe_runtime::error_chain;
use imagepipe_runtime::shutdown::Shutdown;
use metrics::gauge;

use crate::metrics as m;
use crate::store::TaskStore;

/// How often the gauges are sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// Samples the gauges every `interval` until `shutdown`.
pub async fn run(bus: Bus, store: std::sync::Arc<dyn TaskStore>, interval: Duration, shutdown: Shutdown) {
    loop {
        sample(&bus, store.as_ref()).await;
        if !shutdown.sleep(interval).await {
            return;
        }
    }
}

/// Sets the gauges once. A queue nothing has consumed yet keeps no gauge; what the broker or
/// the store cannot answer now is logged at debug level (readiness reports an unreachable
/// broker) and sampled again next time.
pub async fn sample(bus: &Bus, store: &dyn TaskStore) {
    for queue in queues::all_lanes() {
        let queue = queue.as_str();
        match bus.queues.backlog(queue).await {
            Ok(Some(backlog)) => {
                gauge!(m::QUEUE_DEPTH, m::QUEUE => queue.to_owned()).set(backlog.depth() as f64);
                gauge!(m::CONSUMER_LAG, m::QUEUE => queue.to_owned()).set(backlog.waiting as f64);
            }
            Ok(None) => {}
            Err(error) => tracing::debug!(queue, error = %error_chain(&error), "sampling the queue's backlog"),
        }
    }
    match store.count_dead_letters().await {
        Ok(count) => gauge!(m::DEAD_LETTERS).set(count as f64),
        Err(error) => tracing::debug!(error = %error_chain(&error), "counting the archived dead letters"),
    }
}
