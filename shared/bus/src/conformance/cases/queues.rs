//! Task queues: send, fetch, settle, competing consumers, order, dedup.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use imagepipe_contracts::names::{headers, queues};

use crate::config::{StartPosition, Subscription};
use crate::conformance::Harness;
use crate::conformance::support::{
    PATIENCE, ack_all, bodies, body, collect, collect_exactly, consumer_config, expect_none, ids,
};
use crate::error::BusError;
use crate::message::Message;
use crate::selector::Selector;
use crate::traits::Consumer;

const QUEUE: &str = queues::DOWNLOAD;

/// `send` then `fetch` delivers payload, key and id unchanged, once, as first delivery from
/// the named queue; a message without key or id arrives without them.
pub async fn send_fetch_delivers_payload_key_id(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let full = Message::new(r#"{"taskId":"tsk_1","url":"https://example.com/a.jpg"}"#)
        .with_key("tsk_1")
        .with_id("cmd-tsk_1-download-1");
    let bare = Message::new("no key, no id");
    bus.queues.send(QUEUE, full.clone()).await.expect("send");
    bus.queues.send(QUEUE, bare.clone()).await.expect("send");

    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let got = collect_exactly(&*consumer, 2, &t, "the two sent messages").await;
    for (delivery, sent) in got.iter().zip([&full, &bare]) {
        assert_eq!(delivery.message.payload, sent.payload);
        assert_eq!(delivery.message.key, sent.key, "key of {}", body(delivery));
        assert_eq!(delivery.message.id, sent.id, "id of {}", body(delivery));
        assert_eq!(delivery.delivery_count, 1);
        assert_eq!(delivery.max_deliveries, 5);
        assert!(!delivery.is_last_attempt());
        assert_eq!(delivery.source, QUEUE);
        assert!(!delivery.position().is_empty());
    }
    ack_all(got).await;
}

/// Headers arrive exactly as sent: trace context, schema version, CloudEvents attributes
/// (under their neutral names, whatever the binding calls them on the wire; values that need
/// percent-encoding on NATS too) and custom headers (names lowercased), nothing lost and nothing
/// added.
pub async fn headers_round_trip(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let attributes = imagepipe_contracts::CloudEvent::of_command(
        imagepipe_contracts::CommandType::Download,
        "with-headers",
        "tsk_ümlaut 1",
        "a worker \"quoted\" 100%",
        1_763_800_000_123,
    );
    let sent = Message::new("{}")
        .with_cloud_event(&attributes)
        .with_id("with-headers")
        .with_header(headers::TRACEPARENT, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .with_header("tracestate", "vendor=abc,other=x:y")
        .with_header(headers::SCHEMA, imagepipe_contracts::SCHEMA_VERSION)
        .with_header("X-Imagepipe-Test", "Mixed Case value; with = signs");
    assert_eq!(sent.headers.get("x-imagepipe-test"), Some("Mixed Case value; with = signs"));
    bus.queues.send(QUEUE, sent.clone()).await.expect("send");

    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let got = collect_exactly(&*consumer, 1, &t, "the sent message").await;
    assert_eq!(got[0].message.headers, sent.headers);
    assert_eq!(got[0].message.headers.traceparent(), sent.headers.traceparent());
    assert_eq!(got[0].message.headers.cloud_event(), Ok(attributes));
    ack_all(got).await;
}

/// On an empty queue, `fetch` waits about its `wait` and returns nothing.
pub async fn fetch_waits_then_returns_empty(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let wait = t.settle * 2;
    let started = Instant::now();
    let got = consumer.fetch(10, wait).await.expect("fetch");
    let took = started.elapsed();
    assert!(got.is_empty());
    assert!(took >= wait.mul_f64(0.8), "fetch returned after {took:?}, before its wait of {wait:?}");
    assert!(took < wait + PATIENCE, "fetch took {took:?} for a wait of {wait:?}");
}

/// A waiting `fetch` returns as soon as a message arrives, not when its wait ends, even when
/// fewer than `max` are available.
pub async fn fetch_returns_as_soon_as_a_message_arrives(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let sender = {
        let bus = bus.clone();
        let delay = t.settle;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            bus.queues.send(QUEUE, Message::new("late").with_id("late")).await
        })
    };
    let wait = Duration::from_secs(6);
    let started = Instant::now();
    let got = consumer.fetch(10, wait).await.expect("fetch");
    let took = started.elapsed();
    sender.await.expect("sender task").expect("send");
    assert_eq!(bodies(&got), ["late"]);
    assert!(took < wait / 2, "fetch held a ready message until {took:?} (wait {wait:?})");
    ack_all(got).await;
}

/// A fetch dropped while it waits (a caller's timeout, a worker stopping) loses nothing and
/// leaves the consumer working: what is sent next reaches later fetches of the same consumer,
/// each message once, at the latest after its ack deadline.
pub async fn a_fetch_dropped_while_waiting_loses_nothing(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    for _ in 0..2 {
        let cut = tokio::time::timeout(t.settle, consumer.fetch(1, Duration::from_secs(30))).await;
        assert!(cut.is_err(), "nothing was sent, yet the fetch returned {:?}", cut.map(|got| got.map(|d| bodies(&d))));
    }
    for i in 0..3 {
        bus.queues.send(QUEUE, Message::new(format!("after {i}")).with_id(format!("after-{i}"))).await.expect("send");
    }
    let got = collect(&*consumer, 3, t.ack_wait + PATIENCE).await;
    let expected: BTreeSet<String> = (0..3).map(|i| format!("after-{i}")).collect();
    assert_eq!(ids(&got), expected, "every message sent after the dropped fetches: {:?}", bodies(&got));
    assert_eq!(got.len(), 3, "each message once: {:?}", bodies(&got));
    ack_all(got).await;
    expect_none(&*consumer, t.settle, "after the messages were acked").await;
}

/// `fetch(max, ..)` never returns more than `max`; the rest stay for later fetches.
pub async fn fetch_returns_at_most_max(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    for i in 0..5 {
        bus.queues.send(QUEUE, Message::new(format!("m{i}")).with_id(format!("m{i}"))).await.expect("send");
    }
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let first = consumer.fetch(2, PATIENCE).await.expect("fetch");
    assert!((1..=2).contains(&first.len()), "fetch(max = 2) returned {}", first.len());
    let rest = collect_exactly(&*consumer, 5 - first.len(), &t, "the other messages").await;
    let all: BTreeSet<_> = ids(&first).union(&ids(&rest)).cloned().collect();
    assert_eq!(all.len(), 5, "every message exactly once: {:?} + {:?}", bodies(&first), bodies(&rest));
    ack_all(first).await;
    ack_all(rest).await;
}

/// An acked message is never delivered again: not after its ack deadline, not to a new
/// consumer.
pub async fn ack_removes_for_good(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    bus.queues.send(QUEUE, Message::new("once").with_id("once")).await.expect("send");
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let got = collect_exactly(&*consumer, 1, &t, "the sent message").await;
    ack_all(got).await;
    expect_none(&*consumer, t.ack_wait + t.settle * 2, "after the ack, past the ack deadline").await;
    let other = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    expect_none(&*other, t.settle, "a new consumer after the ack").await;
}

/// A nack with a delay brings the message back, not before the delay, as delivery 2.
pub async fn nack_with_delay(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let sent = Message::new("retry me").with_key("tsk_n").with_id("retry-me");
    bus.queues.send(QUEUE, sent.clone()).await.expect("send");
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let first = collect_exactly(&*consumer, 1, &t, "the first delivery").await.remove(0);
    assert_eq!(first.delivery_count, 1);

    let nacked_at = Instant::now();
    first.nack(t.nack_delay, "transient failure").await.expect("nack");
    expect_none(&*consumer, t.nack_delay / 2, "before the nack delay passed").await;
    let again = collect_exactly(&*consumer, 1, &t, "the redelivery").await.remove(0);
    let after = nacked_at.elapsed();
    assert!(after >= t.nack_delay.mul_f64(0.9), "redelivered {after:?} after a nack delayed {:?}", t.nack_delay);
    assert_eq!(again.delivery_count, 2);
    assert_eq!(again.message, sent);
    again.ack().await.expect("ack");
}

/// A delivery not settled within `ack_wait` is delivered again (delivery 2, same message), not
/// before the deadline; acking the redelivery settles the message for good.
pub async fn redelivery_after_ack_deadline(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let sent = Message::new("slow handler").with_key("tsk_r").with_id("slow").with_header(headers::SCHEMA, "1");
    bus.queues.send(QUEUE, sent.clone()).await.expect("send");
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let started = Instant::now();
    let first = collect(&*consumer, 1, PATIENCE).await;
    assert_eq!(first.len(), 1, "the first delivery");
    assert_eq!(first[0].delivery_count, 1);

    expect_none(&*consumer, t.ack_wait / 2, "before the ack deadline").await;
    let again = collect(&*consumer, 1, PATIENCE).await;
    let after = started.elapsed();
    assert_eq!(again.len(), 1, "no redelivery within {PATIENCE:?} after the ack deadline");
    assert!(after >= t.ack_wait.mul_f64(0.9), "redelivered after {after:?}, ack_wait is {:?}", t.ack_wait);
    assert_eq!(again[0].delivery_count, 2);
    assert_eq!(again[0].message, sent);
    ack_all(again).await;
    expect_none(&*consumer, t.ack_wait + t.settle, "after acking the redelivery").await;
    drop(first);
}

/// `progress` restarts the ack deadline: a handler that keeps reporting progress for twice
/// `ack_wait` is not redelivered, and its ack then settles the message.
pub async fn progress_extends_deadline(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    bus.queues.send(QUEUE, Message::new("long job").with_id("long")).await.expect("send");
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let delivery = collect(&*consumer, 1, PATIENCE).await.pop().expect("the first delivery");
    let until = Instant::now() + t.ack_wait * 2 + t.settle;
    while Instant::now() < until {
        expect_none(&*consumer, t.ack_wait / 4, "while the handler reports progress").await;
        delivery.progress().await.expect("progress");
    }
    delivery.ack().await.expect("ack after progress");
    expect_none(&*consumer, t.ack_wait + t.settle, "after the ack").await;
}

/// Every redelivery counts: nacked three times, the fourth delivery says 4.
pub async fn delivery_count_increments(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    bus.queues.send(QUEUE, Message::new("flaky").with_id("flaky")).await.expect("send");
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 10)).await.expect("consume");
    for expected in 1..=4 {
        let delivery = collect(&*consumer, 1, PATIENCE).await.pop().expect("a delivery");
        assert_eq!(delivery.delivery_count, expected);
        assert_eq!(delivery.max_deliveries, 10);
        assert!(!delivery.is_last_attempt());
        if expected < 4 {
            delivery.nack(Duration::ZERO, "again").await.expect("nack");
        } else {
            delivery.ack().await.expect("ack");
        }
    }
    expect_none(&*consumer, t.settle, "after the ack").await;
}

/// Consumers opened on one queue share it: what one holds in flight the other does not get;
/// together they get every message exactly once.
pub async fn competing_consumers_share_queue(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let sent: Vec<Message> = (0..20)
        .map(|i| Message::new(format!("job {i}")).with_key(format!("tsk_{i}")).with_id(format!("job-{i}")))
        .collect();
    bus.queues.send_batch(QUEUE, sent.clone()).await.expect("send_batch");
    let a = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let b = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    assert_shared(&*a, &*b, &sent, &t).await;
}

/// Checks that `a` and `b` split `sent` between them: disjoint, together everything.
pub(super) async fn assert_shared(
    a: &dyn Consumer,
    b: &dyn Consumer,
    sent: &[Message],
    t: &crate::conformance::Timing,
) {
    let n = sent.len();
    let held_by_a = a.fetch(n / 2, PATIENCE).await.expect("fetch");
    assert!(!held_by_a.is_empty(), "the first consumer got nothing");
    let got_by_b = collect_exactly(b, n - held_by_a.len(), t, "what the first consumer does not hold").await;
    let (ids_a, ids_b) = (ids(&held_by_a), ids(&got_by_b));
    assert!(ids_a.is_disjoint(&ids_b), "both consumers got {:?}", ids_a.intersection(&ids_b).collect::<Vec<_>>());
    let all: BTreeSet<String> = sent.iter().map(|m| m.id.clone().expect("id")).collect();
    assert_eq!(ids_a.union(&ids_b).cloned().collect::<BTreeSet<_>>(), all);
    ack_all(held_by_a).await;
    ack_all(got_by_b).await;
    expect_none(a, t.settle, "first consumer, after everything was acked").await;
    expect_none(b, t.settle, "second consumer, after everything was acked").await;
}

/// Messages with the same key are first delivered in send order (interleaved keys, batches
/// of fetches).
pub async fn per_key_order(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    const KEYS: usize = 3;
    const PER_KEY: usize = 10;
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            let message = Message::new(format!("{i}")).with_key(format!("tsk_{k}")).with_id(format!("k{k}-{i}"));
            bus.queues.send(QUEUE, message).await.expect("send");
        }
    }
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let mut seen: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut total = 0;
    let until = Instant::now() + PATIENCE;
    while total < KEYS * PER_KEY && Instant::now() < until {
        let batch = consumer.fetch(4, t.settle).await.expect("fetch");
        for delivery in batch {
            assert_eq!(delivery.delivery_count, 1, "no redeliveries expected");
            let key = delivery.message.key.clone().expect("key");
            seen.entry(key).or_default().push(body(&delivery).parse().expect("sequence number"));
            total += 1;
            delivery.ack().await.expect("ack");
        }
    }
    assert_eq!(total, KEYS * PER_KEY, "every message delivered");
    for (key, order) in &seen {
        assert_eq!(order, &(0..PER_KEY).collect::<Vec<_>>(), "order of key {key}");
    }
    assert_eq!(seen.len(), KEYS);
}

/// `send_batch` enqueues every message, in order.
pub async fn send_batch(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let sent: Vec<Message> =
        (0..50).map(|i| Message::new(format!("{i}")).with_key("tsk_batch").with_id(format!("batch-{i}"))).collect();
    bus.queues.send_batch(QUEUE, sent.clone()).await.expect("send_batch");
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let got = collect_exactly(&*consumer, 50, &t, "the batch").await;
    let expected: Vec<String> = (0..50).map(|i| i.to_string()).collect();
    assert_eq!(bodies(&got), expected);
    for (delivery, message) in got.iter().zip(&sent) {
        assert_eq!(&delivery.message, message);
    }
    ack_all(got).await;
}

/// A message whose id was already accepted on the queue is accepted and dropped; other ids
/// go through.
pub async fn publish_dedup_by_message_id_queue(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    bus.queues.send(QUEUE, Message::new("first").with_id("dup")).await.expect("send");
    bus.queues.send(QUEUE, Message::new("second").with_id("dup")).await.expect("a duplicate is accepted");
    bus.queues.send(QUEUE, Message::new("third").with_id("other")).await.expect("send");
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let got = collect_exactly(&*consumer, 2, &t, "the two distinct ids").await;
    assert_eq!(bodies(&got), ["first", "third"]);
    ack_all(got).await;
    expect_none(&*consumer, t.settle, "after the two distinct ids").await;
}

/// Bad names are refused with [`BusError::Invalid`]: queue names, event types, group names.
pub async fn invalid_names_are_rejected(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let invalid = |what: &str, result: Result<(), BusError>| {
        assert!(matches!(result, Err(BusError::Invalid(_))), "{what}: expected BusError::Invalid, got {result:?}");
    };
    invalid("queue with a space", bus.queues.send("tasks.down load", Message::new("x")).await);
    invalid("queue with an empty token", bus.queues.send("tasks..download", Message::new("x")).await);
    invalid("empty queue", bus.queues.consume("", consumer_config(&t, 5)).await.map(drop));
    invalid("upper-case event type", bus.events.publish("Image.Downloaded", Message::new("x")).await);
    invalid("wildcard event type", bus.events.publish("image.*", Message::new("x")).await);
    let group = |name: &str| Subscription::new(name, Selector::all()).starting(StartPosition::New);
    invalid("group with a dot", bus.events.subscribe(group("bad.group")).await.map(drop));
    invalid("group with a space", bus.events.subscribe(group("bad group")).await.map(drop));
    invalid("empty group", bus.events.subscribe(group("")).await.map(drop));
}

/// A message over the bus's size limit is refused with [`BusError::TooLarge`] before it
/// reaches the broker, on `send`, `send_batch` (nothing of the batch is sent) and `publish`;
/// one of exactly the limit goes through.
pub async fn messages_over_the_size_limit_are_refused(h: &dyn Harness) {
    const MAX: usize = 4096;
    let t = h.timing();
    let bus = h.bus().await.with_max_message_bytes(MAX);
    let sized = |size: usize, id: &str| {
        let message = Message::new("").with_key("tsk_big").with_id(id);
        let body = "x".repeat(size - message.size());
        Message { payload: body.into(), ..message }
    };
    let too_large = |what: &str, result: Result<(), BusError>| {
        assert!(
            matches!(&result, Err(BusError::TooLarge { size, max: MAX, .. }) if *size == MAX + 1),
            "{what}: expected BusError::TooLarge of {} bytes, got {result:?}",
            MAX + 1
        );
    };
    too_large("send", bus.queues.send(QUEUE, sized(MAX + 1, "over")).await);
    too_large("send_batch", bus.queues.send_batch(QUEUE, vec![sized(100, "small"), sized(MAX + 1, "over")]).await);
    too_large("publish", bus.events.publish("image.downloaded", sized(MAX + 1, "over")).await);
    bus.queues.send(QUEUE, sized(MAX, "fits")).await.expect("a message of exactly the limit is sent");

    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let got = collect_exactly(&*consumer, 1, &t, "only the message that fits").await;
    assert_eq!(got[0].message.id.as_deref(), Some("fits"));
    ack_all(got).await;
}
