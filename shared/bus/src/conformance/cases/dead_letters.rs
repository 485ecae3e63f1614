//! Dead letters: after `max_deliveries`, on an expired last delivery, on `terminate`; for task
//! queues and subscriber groups.

use std::time::{Duration, Instant};

use imagepipe_contracts::names::{self, headers, queues};

use crate::config::{StartPosition, Subscription};
use crate::conformance::Harness;
use crate::conformance::support::{PATIENCE, collect, collect_exactly, consumer_config, expect_none, unix_ms_now};
use crate::delivery::Delivery;
use crate::message::{Headers, Message};
use crate::selector::Selector;

const QUEUE: &str = queues::METADATA;

/// A message with everything a dead letter must keep.
fn precious(id: &str) -> Message {
    Message::new(format!(r#"{{"taskId":"tsk_dl","case":"{id}"}}"#))
        .with_key("tsk_dl")
        .with_id(id)
        .with_header(headers::TRACEPARENT, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .with_header(headers::SCHEMA, imagepipe_contracts::SCHEMA_VERSION)
}

/// Checks that `dead` is `original` (payload, key, id, headers) plus exactly the four
/// dead-letter headers, with these values, stamped between `since_ms` and now.
fn assert_dead_letter(dead: &Delivery, original: &Message, reason: &str, count: u32, source: &str, since_ms: u128) {
    let message = &dead.message;
    assert_eq!(message.payload, original.payload, "payload");
    assert_eq!(message.key, original.key, "key");
    assert_eq!(message.id, original.id, "id");
    let h = &message.headers;
    assert_eq!(h.get(headers::DLQ_REASON), Some(reason), "reason header");
    assert_eq!(h.get(headers::DLQ_DELIVERY_COUNT), Some(count.to_string().as_str()), "delivery count header");
    assert_eq!(h.get(headers::DLQ_SOURCE), Some(source), "source header");
    let stamp: u128 = h
        .get(headers::DLQ_TIMESTAMP)
        .expect("timestamp header")
        .parse()
        .expect("timestamp header is Unix milliseconds");
    assert!(
        since_ms.saturating_sub(1000) <= stamp && stamp <= unix_ms_now() + 1000,
        "timestamp {stamp} not between {since_ms} and now"
    );
    let mut expected: Headers = original.headers.clone();
    for name in [headers::DLQ_REASON, headers::DLQ_DELIVERY_COUNT, headers::DLQ_SOURCE, headers::DLQ_TIMESTAMP] {
        expected.insert(name, h.get(name).expect("checked above"));
    }
    assert_eq!(h, &expected, "the original headers plus the dead-letter headers, nothing else");
}

/// Nacked on its `max_deliveries`-th delivery, a message goes to `dlq.<queue>` with the
/// original payload, key, id and headers, the reason, the delivery count, the source and a
/// timestamp; it is not delivered again; the dead-letter queue is an ordinary queue.
pub async fn max_deliveries_dead_letters(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let since = unix_ms_now();
    let sent = precious("max-deliveries");
    bus.queues.send(QUEUE, sent.clone()).await.expect("send");
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 3)).await.expect("consume");
    for n in 1..=3 {
        let delivery = collect(&*consumer, 1, PATIENCE).await.pop().expect("a delivery");
        assert_eq!(delivery.delivery_count, n);
        assert_eq!(delivery.is_last_attempt(), n == 3);
        delivery.nack(Duration::ZERO, "boom").await.expect("nack");
    }
    expect_none(&*consumer, t.ack_wait + t.settle, "after the last allowed delivery").await;

    let dlq_name = names::dead_letter_queue(QUEUE);
    let dlq = bus.queues.consume(&dlq_name, consumer_config(&t, 5)).await.expect("consume the dead-letter queue");
    let dead = collect_exactly(&*dlq, 1, &t, "the dead letter").await.remove(0);
    assert_dead_letter(&dead, &sent, "max deliveries (3) reached; last error: boom", 3, QUEUE, since);
    assert_eq!(dead.source, dlq_name);
    assert_eq!(dead.delivery_count, 1);
    dead.ack().await.expect("ack the dead letter");
    expect_none(&*dlq, t.ack_wait + t.settle, "the acked dead letter").await;
}

/// When the `max_deliveries`-th delivery's ack deadline passes unsettled, the message is
/// dead-lettered with reason "ack deadline expired after N deliveries" instead of redelivered.
/// (A backend may act on the expiry when the queue is next fetched, as here.)
pub async fn expired_last_delivery_dead_letters(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let since = unix_ms_now();
    let sent = precious("expired");
    bus.queues.send(QUEUE, sent.clone()).await.expect("send");
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 2)).await.expect("consume");
    let first = collect(&*consumer, 1, PATIENCE).await.pop().expect("delivery 1");
    assert_eq!(first.delivery_count, 1);
    let second = collect(&*consumer, 1, PATIENCE).await.pop().expect("delivery 2, after the ack deadline");
    assert_eq!(second.delivery_count, 2);
    assert!(second.is_last_attempt());

    let dlq = bus.queues.consume(&names::dead_letter_queue(QUEUE), consumer_config(&t, 5)).await.expect("consume");
    let until = Instant::now() + t.ack_wait + PATIENCE;
    let dead = loop {
        let again = consumer.fetch(1, t.settle).await.expect("fetch");
        assert!(again.is_empty(), "delivered a third time despite max_deliveries = 2");
        if let Some(dead) = dlq.fetch(1, t.settle).await.expect("fetch").pop() {
            break dead;
        }
        assert!(Instant::now() < until, "no dead letter within {:?} of the last ack deadline", PATIENCE);
    };
    assert_dead_letter(&dead, &sent, "ack deadline expired after 2 deliveries", 2, QUEUE, since);
    dead.ack().await.expect("ack the dead letter");
    expect_none(&*consumer, t.settle, "the source, after dead-lettering").await;
    drop((first, second));
}

/// `terminate` dead-letters at once, with exactly the given reason and the delivery count; the
/// message is not redelivered.
pub async fn terminate_dead_letters_immediately(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let since = unix_ms_now();
    let sent = precious("terminate");
    bus.queues.send(QUEUE, sent.clone()).await.expect("send");
    let consumer = bus.queues.consume(QUEUE, consumer_config(&t, 5)).await.expect("consume");
    let delivery = collect(&*consumer, 1, PATIENCE).await.pop().expect("a delivery");
    let reason = "not an image: unsupported format \"text/html\"";
    delivery.terminate(reason).await.expect("terminate");

    let dlq = bus.queues.consume(&names::dead_letter_queue(QUEUE), consumer_config(&t, 5)).await.expect("consume");
    let dead = collect_exactly(&*dlq, 1, &t, "the dead letter").await.remove(0);
    assert_dead_letter(&dead, &sent, reason, 1, QUEUE, since);
    dead.ack().await.expect("ack the dead letter");
    expect_none(&*consumer, t.ack_wait + t.settle, "the terminated message").await;
}

/// A subscriber group's dead letters go to `dlq.events.<group>`, naming the group as source and
/// keeping the event-type header.
pub async fn group_dead_letters_go_to_group_dlq(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let group = "notifier";
    let subscription = Subscription::new(group, Selector::parse("task.failed").expect("selector"))
        .starting(StartPosition::New)
        .with_consumer(consumer_config(&t, 5));
    let member = bus.events.subscribe(subscription).await.expect("subscribe");
    let since = unix_ms_now();
    let published = precious("group-dead-letter");
    bus.events.publish("task.failed", published.clone()).await.expect("publish");
    let delivery = collect_exactly(&*member, 1, &t, "the event").await.remove(0);
    assert_eq!(delivery.source, group);
    delivery.terminate("webhook answered 410 Gone").await.expect("terminate");

    let dlq_name = names::dead_letter_queue_of_group(group);
    let dlq = bus.queues.consume(&dlq_name, consumer_config(&t, 5)).await.expect("consume");
    let dead = collect_exactly(&*dlq, 1, &t, "the dead letter").await.remove(0);
    let mut expected = published.clone();
    expected.headers.insert(headers::EVENT_TYPE, "task.failed");
    assert_dead_letter(&dead, &expected, "webhook answered 410 Gone", 1, group, since);
    dead.ack().await.expect("ack the dead letter");
    expect_none(&*member, t.ack_wait + t.settle, "the terminated event").await;
}
