//! Many producers and competing consumers at once, with random nacks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use imagepipe_contracts::names::queues;

use crate::config::ConsumerConfig;
use crate::conformance::Harness;
use crate::conformance::support::expect_none;

const PRODUCERS: usize = 4;
const PER_PRODUCER: usize = 500;
const CONSUMERS: usize = 4;
/// Chance that a consumer nacks a delivery (at most twice per message) instead of acking it.
const NACK_PROBABILITY: f64 = 0.1;
const DEADLINE: Duration = Duration::from_secs(20);

/// 4 producers send 500 messages each while 4 consumers of the same queue handle them,
/// nacking about one delivery in ten: every message is acked exactly once, none is lost,
/// nothing unknown shows up, and the queue is empty afterwards.
pub async fn concurrent_stress(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let queue = queues::AI;
    let total = PRODUCERS * PER_PRODUCER;
    // Long enough that no delivery expires while the machine is busy: every redelivery here
    // comes from a nack, so "acked exactly once" is exact.
    let config = ConsumerConfig { ack_wait: Duration::from_secs(60), max_deliveries: 100 };
    let started = Instant::now();

    let acked: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let nacks = Arc::new(AtomicUsize::new(0));
    let mut consumers = Vec::new();
    for c in 0..CONSUMERS {
        let consumer = bus.queues.consume(queue, config.clone()).await.expect("consume");
        let (acked, nacks) = (acked.clone(), nacks.clone());
        consumers.push(tokio::spawn(async move {
            while acked.lock().expect("lock").len() < total && started.elapsed() < DEADLINE {
                for delivery in consumer.fetch(32, Duration::from_millis(200)).await.expect("fetch") {
                    let id = delivery.message.id.clone().expect("every message has an id");
                    if delivery.delivery_count <= 2 && rand::random_bool(NACK_PROBABILITY) {
                        nacks.fetch_add(1, Ordering::Relaxed);
                        delivery.nack(Duration::ZERO, "random nack").await.expect("nack");
                    } else {
                        delivery.ack().await.unwrap_or_else(|e| panic!("consumer {c}: ack of {id}: {e}"));
                        *acked.lock().expect("lock").entry(id).or_default() += 1;
                    }
                }
            }
        }));
    }
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let bus = bus.clone();
        producers.push(tokio::spawn(async move {
            for i in 0..PER_PRODUCER {
                let message = crate::Message::new(format!("producer {p} message {i}"))
                    .with_key(format!("tsk_{}", i % 16))
                    .with_id(format!("p{p}-m{i}"));
                bus.queues.send(queue, message).await.expect("send");
            }
        }));
    }
    for task in producers.into_iter().chain(consumers) {
        task.await.expect("producer or consumer panicked");
    }

    let acked = acked.lock().expect("lock").clone();
    let expected: BTreeSet<String> =
        (0..PRODUCERS).flat_map(|p| (0..PER_PRODUCER).map(move |i| format!("p{p}-m{i}"))).collect();
    let missing: Vec<_> = expected.iter().filter(|id| !acked.contains_key(*id)).take(10).collect();
    assert!(missing.is_empty(), "{} of {total} never acked within {DEADLINE:?}, e.g. {missing:?}", total - acked.len());
    let unknown: Vec<_> = acked.keys().filter(|id| !expected.contains(*id)).collect();
    assert!(unknown.is_empty(), "acked ids nobody sent: {unknown:?}");
    let twice: Vec<_> = acked.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "acked more than once: {twice:?}");
    assert!(nacks.load(Ordering::Relaxed) > 0, "no nack happened, so redelivery was not exercised");

    let check = bus.queues.consume(queue, config).await.expect("consume");
    expect_none(&*check, t.settle, "the queue after every message was acked").await;
}
