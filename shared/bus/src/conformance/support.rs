//! Helpers the cases share: collecting deliveries with a deadline, asserting silence.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::Timing;
use crate::config::ConsumerConfig;
use crate::delivery::Delivery;
use crate::traits::Consumer;

/// How long a case waits for deliveries that should come promptly.
pub(super) const PATIENCE: Duration = Duration::from_secs(5);

/// A consumer with the harness's ack deadline.
pub(super) fn consumer_config(timing: &Timing, max_deliveries: u32) -> ConsumerConfig {
    ConsumerConfig { ack_wait: timing.ack_wait, max_deliveries }
}

/// Fetches until `n` deliveries arrived or `within` passed; never asks for more than `n`.
pub(super) async fn collect(consumer: &dyn Consumer, n: usize, within: Duration) -> Vec<Delivery> {
    let until = Instant::now() + within;
    let mut got = Vec::new();
    while got.len() < n {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let want = n - got.len();
        let batch = consumer.fetch(want, left).await.expect("fetch");
        assert!(batch.len() <= want, "fetch(max = {want}) returned {} deliveries", batch.len());
        got.extend(batch);
    }
    got
}

/// Collects exactly `n` deliveries within [`PATIENCE`], then checks no more come within
/// `timing.settle`. The deliveries are left unsettled.
pub(super) async fn collect_exactly(consumer: &dyn Consumer, n: usize, timing: &Timing, what: &str) -> Vec<Delivery> {
    let got = collect(consumer, n, PATIENCE).await;
    assert_eq!(got.len(), n, "{what}: expected {n} deliveries within {PATIENCE:?}, got {:?}", bodies(&got));
    expect_none(consumer, timing.settle, what).await;
    got
}

/// Fails if anything is delivered within `wait`.
pub(super) async fn expect_none(consumer: &dyn Consumer, wait: Duration, what: &str) {
    let got = consumer.fetch(16, wait).await.expect("fetch");
    assert!(got.is_empty(), "{what}: unexpected deliveries {:?}", describe(&got));
}

/// Acks every delivery.
pub(super) async fn ack_all(deliveries: Vec<Delivery>) {
    for delivery in deliveries {
        delivery.ack().await.expect("ack");
    }
}

/// The payload as text.
pub(super) fn body(delivery: &Delivery) -> &str {
    std::str::from_utf8(&delivery.message.payload).expect("payloads in the cases are UTF-8")
}

/// Every payload, in delivery order.
pub(super) fn bodies(deliveries: &[Delivery]) -> Vec<String> {
    deliveries.iter().map(|d| body(d).to_owned()).collect()
}

/// Every message id, as a set.
pub(super) fn ids(deliveries: &[Delivery]) -> BTreeSet<String> {
    deliveries.iter().map(|d| d.message.id.clone().expect("messages in the cases have ids")).collect()
}

fn describe(deliveries: &[Delivery]) -> Vec<String> {
    deliveries.iter().map(|d| format!("{} (delivery {}) at {}", body(d), d.delivery_count, d.position())).collect()
}

/// Milliseconds since the Unix epoch, as in the dead-letter timestamp header.
pub(super) fn unix_ms_now() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock after 1970").as_millis()
}
