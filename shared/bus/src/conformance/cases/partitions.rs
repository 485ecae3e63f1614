//! Partitioned queues ([`TaskQueue::consume_partitions`](crate::TaskQueue::consume_partitions)):
//! routing by partition number, several partitions read as one, retries and dead letters, and
//! handing a partition over to a new consumer.
//!
//! A backend that [routes sends by key](crate::TaskQueue::routes_by_key) has no unrouted
//! channel: there, what these cases say about [`consume`](crate::TaskQueue::consume) and sends
//! without a partition is not checked.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use imagepipe_contracts::Priority;
use imagepipe_contracts::names::{self, headers, queues};

use crate::config::ConsumerConfig;
use crate::conformance::Harness;
use crate::conformance::support::{
    PATIENCE, ack_all, bodies, body, collect, collect_exactly, consumer_config, expect_none,
};
use crate::delivery::Delivery;
use crate::message::Message;

const QUEUE: &str = queues::RESULTS;

/// A message for partition `partition` (`None`: the queue itself), keyed and identified by
/// its body.
fn to(partition: Option<u16>, key: &str, body: &str) -> Message {
    let message = Message::new(body.to_owned()).with_key(key).with_id(body);
    match partition {
        Some(p) => message.with_partition(p),
        None => message,
    }
}

/// Checks that every delivery came from `partition` of `queue`, as a first delivery.
fn assert_from(deliveries: &[Delivery], partition: Option<u16>, queue: &str) {
    for delivery in deliveries {
        assert_eq!(
            delivery.message.partition,
            partition,
            "partition of {}",
            String::from_utf8_lossy(&delivery.message.payload)
        );
        assert_eq!(delivery.source, queue, "source is the queue's name, without the partition");
        assert_eq!(delivery.delivery_count, 1);
    }
}

/// A message sent to partition `p` reaches a consumer of `[p]` only, in the order sent per
/// key, with `partition` set and the queue as its source: not a consumer of another partition,
/// nor `consume(queue)`, nor partition `p` of another lane of the queue; a message sent
/// without a partition reaches `consume(queue)` only.
pub async fn partition_messages_reach_only_their_partition(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let unrouted = !bus.queues.routes_by_key();
    let high = Priority::High.lane(QUEUE);
    let sent = [
        (QUEUE, to(Some(3), "tsk_a", "p3-a1")),
        (QUEUE, to(Some(5), "tsk_b", "p5-b1")),
        (QUEUE, to(Some(3), "tsk_a", "p3-a2")),
        (high.as_str(), to(Some(3), "tsk_c", "high-p3-c1")),
        (QUEUE, to(Some(3), "tsk_a", "p3-a3")),
    ];
    for (queue, message) in sent {
        bus.queues.send(queue, message).await.expect("send");
    }
    if unrouted {
        bus.queues.send(QUEUE, to(None, "tsk_d", "unpartitioned")).await.expect("send");
    }

    let config = consumer_config(&t, 5);
    let p3 = bus.queues.consume_partitions(QUEUE, &[3], config.clone()).await.expect("consume partition 3");
    let got = collect_exactly(&*p3, 3, &t, "partition 3").await;
    assert_eq!(bodies(&got), ["p3-a1", "p3-a2", "p3-a3"], "partition 3 in the order sent");
    assert_from(&got, Some(3), QUEUE);
    ack_all(got).await;

    let other = bus.queues.consume_partitions(QUEUE, &[7], config.clone()).await.expect("consume partition 7");
    expect_none(&*other, t.settle, "partition 7, to which nothing was sent").await;

    let high_p3 = bus.queues.consume_partitions(&high, &[3], config.clone()).await.expect("consume high partition 3");
    let got = collect_exactly(&*high_p3, 1, &t, "partition 3 of the high lane").await;
    assert_eq!(bodies(&got), ["high-p3-c1"]);
    assert_from(&got, Some(3), &high);
    ack_all(got).await;

    if unrouted {
        let whole = bus.queues.consume(QUEUE, config.clone()).await.expect("consume");
        let got = collect_exactly(&*whole, 1, &t, "the queue itself").await;
        assert_eq!(bodies(&got), ["unpartitioned"], "consume(queue) gets only what was sent without a partition");
        assert_from(&got, None, QUEUE);
        ack_all(got).await;
    }

    let p5 = bus.queues.consume_partitions(QUEUE, &[5], config).await.expect("consume partition 5");
    let got = collect_exactly(&*p5, 1, &t, "partition 5").await;
    assert_eq!(bodies(&got), ["p5-b1"]);
    assert_from(&got, Some(5), QUEUE);
    ack_all(got).await;
}

/// A consumer over several partitions gets the messages of all of them, and one fetch hands
/// out messages of several partitions when they wait; per-partition order is kept.
pub async fn one_consumer_reads_several_partitions(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let mut sent = Vec::new();
    for i in 0..4 {
        for partition in [11u16, 12] {
            sent.push(to(Some(partition), &format!("tsk_{partition}"), &format!("p{partition}-{i}")));
        }
    }
    bus.queues.send_batch(QUEUE, sent).await.expect("send_batch");

    let consumer =
        bus.queues.consume_partitions(QUEUE, &[11, 12], consumer_config(&t, 5)).await.expect("consume partitions");
    tokio::time::sleep(t.settle).await;
    let first = consumer.fetch(8, PATIENCE).await.expect("fetch");
    let partitions: BTreeSet<Option<u16>> = first.iter().map(|d| d.message.partition).collect();
    assert_eq!(
        partitions,
        BTreeSet::from([Some(11), Some(12)]),
        "one fetch with messages of both partitions waiting: {:?}",
        bodies(&first)
    );
    let rest = collect_exactly(&*consumer, 8 - first.len(), &t, "the rest of both partitions").await;
    let all: Vec<Delivery> = first.into_iter().chain(rest).collect();
    for partition in [11u16, 12] {
        let of: Vec<String> = all
            .iter()
            .filter(|d| d.message.partition == Some(partition))
            .map(|d| String::from_utf8_lossy(&d.message.payload).into_owned())
            .collect();
        let expected: Vec<String> = (0..4).map(|i| format!("p{partition}-{i}")).collect();
        assert_eq!(of, expected, "partition {partition} in the order sent");
    }
    for delivery in &all {
        assert_eq!(delivery.source, QUEUE, "source is the queue's name, without the partition");
    }
    ack_all(all).await;
}

/// A partition delivery settles like any other: `progress` works, a nack brings the message
/// back in its partition (not to `consume(queue)`), the last allowed delivery and `terminate`
/// dead-letter it to `dlq.<queue>` with the reason and the queue as source.
pub async fn partition_deliveries_retry_and_dead_letter(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let unrouted = !bus.queues.routes_by_key();
    bus.queues.send(QUEUE, to(Some(4), "tsk_r", "retried")).await.expect("send");
    bus.queues.send(QUEUE, to(Some(4), "tsk_t", "terminated")).await.expect("send");
    let consumer = bus.queues.consume_partitions(QUEUE, &[4], consumer_config(&t, 2)).await.expect("consume");
    let whole =
        if unrouted { Some(bus.queues.consume(QUEUE, consumer_config(&t, 2)).await.expect("consume")) } else { None };

    let mut got = collect_exactly(&*consumer, 2, &t, "both messages").await;
    assert_eq!(bodies(&got), ["retried", "terminated"]);
    let terminated = got.pop().expect("two");
    let retried = got.pop().expect("two");
    retried.progress().await.expect("progress");
    retried.nack(t.nack_delay, "try again").await.expect("nack");
    terminated.terminate("unusable result").await.expect("terminate");

    let again = collect(&*consumer, 1, t.nack_delay + PATIENCE).await;
    assert_eq!(bodies(&again), ["retried"], "the nacked message comes back");
    assert_eq!(again[0].message.partition, Some(4), "in its partition");
    assert_eq!(again[0].delivery_count, 2);
    assert!(again[0].is_last_attempt());
    if let Some(whole) = &whole {
        expect_none(&**whole, t.settle, "the queue itself, while its partition retries").await;
    }
    let last = again.into_iter().next().expect("one");
    last.nack(Duration::ZERO, "still failing").await.expect("nack the last allowed delivery");
    expect_none(&*consumer, t.settle, "after the last allowed delivery").await;

    let dlq_name = names::dead_letter_queue(QUEUE);
    let dlq = bus.queues.consume(&dlq_name, consumer_config(&t, 5)).await.expect("consume the dead-letter queue");
    let dead = collect_exactly(&*dlq, 2, &t, "both dead letters").await;
    for letter in &dead {
        let h = &letter.message.headers;
        assert_eq!(h.get(headers::DLQ_SOURCE), Some(QUEUE), "source of {:?}", letter.message.id);
        assert_eq!(letter.message.partition, None, "the dead-letter queue has no partitions");
        let expected = match letter.message.id.as_deref() {
            Some("retried") => "max deliveries (2) reached; last error: still failing",
            Some("terminated") => "unusable result",
            other => panic!("unexpected dead letter {other:?}"),
        };
        assert_eq!(h.get(headers::DLQ_REASON), Some(expected));
    }
    ack_all(dead).await;
}

/// A consumer dropped with messages it fetched for no one yet (a NATS consumer prefetches)
/// gives them back: a new consumer of the partition gets them within seconds, long before
/// their ack deadline, in the order sent.
pub async fn dropped_partition_consumer_hands_over_at_once(h: &dyn Harness) {
    let bus = h.bus().await;
    let long = ConsumerConfig { ack_wait: Duration::from_secs(20), max_deliveries: 5 };
    for i in 0..4 {
        bus.queues.send(QUEUE, to(Some(6), "tsk_h", &format!("h{i}"))).await.expect("send");
    }
    let first = bus.queues.consume_partitions(QUEUE, &[6], long.clone()).await.expect("consume");
    let got = collect(&*first, 1, PATIENCE).await;
    assert_eq!(bodies(&got), ["h0"]);
    ack_all(got).await;
    // Let a prefetching backend pull the rest before the consumer goes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(first);

    let started = Instant::now();
    let next = bus.queues.consume_partitions(QUEUE, &[6], long.clone()).await.expect("consume again");
    let got = collect(&*next, 3, PATIENCE).await;
    let seen: Vec<String> =
        got.iter().map(|d| format!("{} (delivery {}) at {}", body(d), d.delivery_count, d.position())).collect();
    assert_eq!(
        bodies(&got),
        ["h1", "h2", "h3"],
        "the next consumer of the partition gets what the dropped one held, in order, within {PATIENCE:?} \
         (ack deadline {:?}): {seen:?}",
        long.ack_wait
    );
    assert!(started.elapsed() < long.ack_wait / 2, "handed over after {:?}", started.elapsed());
    ack_all(got).await;
}

/// A consumer over 64 partitions (a coordinator owning every shard) opens within seconds,
/// gets a message sent to any of them promptly, and opens again as quickly (the broker's
/// consumers are reused); the queue's own backlog and oldest message do not count partition
/// messages.
pub async fn many_partitions_open_quickly_and_deliver_from_any(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let all: Vec<u16> = (0..64).collect();
    let quick = Duration::from_secs(5);
    let started = Instant::now();
    let consumer = bus.queues.consume_partitions(QUEUE, &all, consumer_config(&t, 5)).await.expect("consume 64");
    let opened = started.elapsed();
    assert!(opened < quick, "opening a consumer over 64 partitions took {opened:?}");

    for partition in [0u16, 31, 63] {
        bus.queues.send(QUEUE, to(Some(partition), "tsk_m", &format!("m{partition}"))).await.expect("send");
    }
    if !bus.queues.routes_by_key() {
        let oldest = bus.queues.oldest(QUEUE).await.expect("oldest of the queue");
        assert_eq!(oldest, None, "the queue itself holds nothing; its partitions do");
        let backlog = bus.queues.backlog(QUEUE).await.expect("backlog of the queue");
        assert!(backlog.is_none_or(|b| b.waiting == 0 && b.unacked == 0), "the queue's own backlog: {backlog:?}");
    }
    let got = collect(&*consumer, 3, PATIENCE).await;
    let partitions: BTreeSet<Option<u16>> = got.iter().map(|d| d.message.partition).collect();
    assert_eq!(partitions, BTreeSet::from([Some(0), Some(31), Some(63)]), "got {:?}", bodies(&got));
    ack_all(got).await;
    drop(consumer);

    let started = Instant::now();
    let again = bus.queues.consume_partitions(QUEUE, &all, consumer_config(&t, 5)).await.expect("consume 64 again");
    let reopened = started.elapsed();
    assert!(reopened < quick, "opening the 64 partitions again took {reopened:?}");
    expect_none(&*again, t.settle, "after everything was acked").await;
}
