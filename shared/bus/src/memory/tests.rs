//! Timing and capacity behaviours of the memory backend, on paused tokio time.
//! (Behaviours every backend shares are in the conformance suite.)

use std::time::Duration;

use imagepipe_contracts::names::{self, headers};
use tokio::time::Instant;

use super::*;
use crate::config::StartPosition;
use crate::selector::Selector;
use crate::traits::Consumer;

const QUEUE: &str = "tasks.download";

fn bus_with(config: MemoryConfig) -> MemoryBus {
    MemoryBus::new("unit".into(), config)
}

fn bus() -> MemoryBus {
    bus_with(MemoryConfig::default())
}

fn consumer_config(ack_wait_secs: u64, max_deliveries: u32) -> ConsumerConfig {
    ConsumerConfig { ack_wait: Duration::from_secs(ack_wait_secs), max_deliveries }
}

fn msg(body: &str) -> Message {
    Message::new(body.to_owned())
}

async fn one(consumer: &dyn Consumer, wait: Duration) -> Option<crate::Delivery> {
    let mut got = consumer.fetch(1, wait).await.expect("fetch");
    assert!(got.len() <= 1);
    got.pop()
}

#[tokio::test(start_paused = true)]
async fn send_to_a_full_queue_waits_then_fails_with_full() {
    let bus = bus_with(MemoryConfig { capacity: 2, send_timeout: Duration::from_secs(5), ..MemoryConfig::default() });
    bus.send(QUEUE, msg("a")).await.unwrap();
    bus.send(QUEUE, msg("b")).await.unwrap();
    let started = Instant::now();
    let err = bus.send(QUEUE, msg("c")).await.unwrap_err();
    assert!(
        matches!(&err, BusError::Full { destination, waited } if destination == "unit.tasks.download" && *waited >= Duration::from_secs(5)),
        "{err:?}"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(bus.queue(QUEUE).len(), 2, "the rejected message was not stored");
}

#[tokio::test(start_paused = true)]
async fn in_flight_and_delayed_messages_count_against_capacity_and_an_ack_makes_room() {
    let bus = bus_with(MemoryConfig { capacity: 2, send_timeout: Duration::from_secs(5), ..MemoryConfig::default() });
    bus.send(QUEUE, msg("a")).await.unwrap();
    bus.send(QUEUE, msg("b")).await.unwrap();
    let consumer = bus.consume(QUEUE, consumer_config(60, 5)).await.unwrap();
    let a = one(&*consumer, Duration::ZERO).await.unwrap();
    let b = one(&*consumer, Duration::ZERO).await.unwrap();
    b.nack(Duration::from_secs(30), "later").await.unwrap();

    let sender = {
        let bus = bus.clone();
        tokio::spawn(async move { bus.send(QUEUE, msg("c")).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!sender.is_finished(), "one in flight + one delayed fill a queue of 2");
    a.ack().await.unwrap();
    sender.await.unwrap().expect("the ack made room");
    assert_eq!(bus.queue(QUEUE).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_unsettled_delivery_comes_back_exactly_at_its_ack_deadline() {
    let bus = bus();
    bus.send(QUEUE, msg("a")).await.unwrap();
    let consumer = bus.consume(QUEUE, consumer_config(30, 5)).await.unwrap();
    let started = Instant::now();
    let first = one(&*consumer, Duration::ZERO).await.unwrap();
    assert_eq!(first.delivery_count, 1);
    assert!(one(&*consumer, Duration::from_millis(29_999)).await.is_none());
    let again = one(&*consumer, Duration::from_secs(10)).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    assert_eq!((again.delivery_count, again.message.payload.as_ref()), (2, b"a".as_ref()));
}

#[tokio::test(start_paused = true)]
async fn progress_restarts_the_ack_deadline() {
    let bus = bus();
    bus.send(QUEUE, msg("a")).await.unwrap();
    let consumer = bus.consume(QUEUE, consumer_config(30, 5)).await.unwrap();
    let started = Instant::now();
    let delivery = one(&*consumer, Duration::ZERO).await.unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    delivery.progress().await.unwrap();
    assert!(one(&*consumer, Duration::from_millis(29_999)).await.is_none(), "deadline moved to 50 s");
    let again = one(&*consumer, Duration::from_secs(1)).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(50));
    assert_eq!(again.delivery_count, 2);
}

#[tokio::test(start_paused = true)]
async fn settling_a_stale_delivery_fails_and_changes_nothing() {
    let bus = bus();
    bus.send(QUEUE, msg("a")).await.unwrap();
    let consumer = bus.consume(QUEUE, consumer_config(10, 5)).await.unwrap();
    let stale_ack = one(&*consumer, Duration::ZERO).await.unwrap();
    let stale_nack = one(&*consumer, Duration::from_secs(11)).await.unwrap();
    let current = one(&*consumer, Duration::from_secs(11)).await.unwrap();
    assert_eq!(current.delivery_count, 3);

    let err = stale_ack.ack().await.unwrap_err();
    assert!(matches!(&err, BusError::Settle { action: "ack", .. }), "{err:?}");
    let err = stale_nack.nack(Duration::ZERO, "late").await.unwrap_err();
    assert!(matches!(&err, BusError::Settle { action: "nack", .. }), "{err:?}");
    assert!(one(&*consumer, Duration::from_secs(5)).await.is_none(), "a stale nack must not requeue a copy");

    current.ack().await.unwrap();
    assert_eq!(bus.queue(QUEUE).len(), 0);
    assert!(one(&*consumer, Duration::from_secs(60)).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn the_expired_last_delivery_is_dead_lettered_with_the_reason() {
    let bus = bus();
    bus.send(QUEUE, msg("a").with_key("k").with_id("id-1").with_header(headers::TRACEPARENT, "00-x-y-01"))
        .await
        .unwrap();
    let consumer = bus.consume(QUEUE, consumer_config(10, 2)).await.unwrap();
    let _first = one(&*consumer, Duration::ZERO).await.unwrap();
    let second = one(&*consumer, Duration::from_secs(11)).await.unwrap();
    assert!(second.is_last_attempt());
    assert!(one(&*consumer, Duration::from_secs(11)).await.is_none(), "not delivered a third time");

    let dlq = bus.consume(&names::dead_letter_queue(QUEUE), consumer_config(10, 5)).await.unwrap();
    let dead = one(&*dlq, Duration::ZERO).await.expect("dead letter");
    let h = &dead.message.headers;
    assert_eq!(h.get(headers::DLQ_REASON), Some("ack deadline expired after 2 deliveries"));
    assert_eq!(h.get(headers::DLQ_DELIVERY_COUNT), Some("2"));
    assert_eq!(h.get(headers::DLQ_SOURCE), Some(QUEUE));
    assert_eq!(h.traceparent(), Some("00-x-y-01"));
    assert_eq!((dead.message.key.as_deref(), dead.message.id.as_deref()), (Some("k"), Some("id-1")));
    assert_eq!(dead.source, "dlq.tasks.download");
    assert_eq!(bus.queue(QUEUE).len(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_dead_letter_queue_keeps_the_message_where_it_is() {
    let bus = bus_with(MemoryConfig { capacity: 1, send_timeout: Duration::from_secs(2), ..MemoryConfig::default() });
    let dlq_name = names::dead_letter_queue(QUEUE);
    bus.send(&dlq_name, msg("older dead letter")).await.unwrap();
    bus.send(QUEUE, msg("a")).await.unwrap();
    let consumer = bus.consume(QUEUE, consumer_config(60, 5)).await.unwrap();
    let delivery = one(&*consumer, Duration::ZERO).await.unwrap();

    let err = delivery.terminate("bad").await.unwrap_err();
    assert!(matches!(&err, BusError::Full { destination, .. } if destination == "unit.dlq.tasks.download"), "{err:?}");
    assert_eq!(bus.queue(QUEUE).len(), 1, "still held, still in flight");
    let again = one(&*consumer, Duration::from_secs(61)).await.expect("redelivered after the ack deadline");
    assert_eq!(again.delivery_count, 2);

    let dlq = bus.consume(&dlq_name, consumer_config(60, 5)).await.unwrap();
    one(&*dlq, Duration::ZERO).await.unwrap().ack().await.unwrap();
    again.terminate("bad").await.unwrap();
    assert_eq!(one(&*dlq, Duration::ZERO).await.unwrap().message.headers.get(headers::DLQ_REASON), Some("bad"));
}

#[tokio::test(start_paused = true)]
async fn a_terminate_waits_for_room_in_the_dead_letter_queue() {
    let bus = bus_with(MemoryConfig { capacity: 1, send_timeout: Duration::from_secs(30), ..MemoryConfig::default() });
    let dlq_name = names::dead_letter_queue(QUEUE);
    bus.send(&dlq_name, msg("older dead letter")).await.unwrap();
    bus.send(QUEUE, msg("a")).await.unwrap();
    let consumer = bus.consume(QUEUE, consumer_config(60, 5)).await.unwrap();
    let delivery = one(&*consumer, Duration::ZERO).await.unwrap();
    let terminate = tokio::spawn(async move { delivery.terminate("bad").await });

    let dlq = bus.consume(&dlq_name, consumer_config(60, 5)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!terminate.is_finished());
    one(&*dlq, Duration::ZERO).await.unwrap().ack().await.unwrap();
    terminate.await.unwrap().expect("moved once there was room");
    assert_eq!(bus.queue(QUEUE).len(), 0);
    assert_eq!(one(&*dlq, Duration::ZERO).await.unwrap().message.payload.as_ref(), b"a");
}

#[tokio::test(start_paused = true)]
async fn a_message_id_is_deduplicated_only_within_the_window() {
    let bus = bus_with(MemoryConfig { dedup_window: Duration::from_secs(120), ..MemoryConfig::default() });
    bus.send(QUEUE, msg("1").with_id("x")).await.unwrap();
    bus.send(QUEUE, msg("2").with_id("x")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    bus.send(QUEUE, msg("3").with_id("x")).await.unwrap();
    let consumer = bus.consume(QUEUE, consumer_config(60, 5)).await.unwrap();
    let got: Vec<_> = consumer.fetch(10, Duration::ZERO).await.unwrap();
    let bodies: Vec<_> = got.iter().map(|d| d.message.payload.clone()).collect();
    assert_eq!(bodies, ["1", "3"]);
}

#[tokio::test(start_paused = true)]
async fn a_topic_retains_only_its_newest_events() {
    let bus = bus_with(MemoryConfig { retention: 3, ..MemoryConfig::default() });
    for i in 0..5 {
        bus.publish("image.downloaded", msg(&i.to_string())).await.unwrap();
    }
    bus.publish("task.completed", msg("other topic")).await.unwrap();
    let sub = Subscription::new("g", Selector::all()).starting(StartPosition::Beginning);
    let consumer = bus.subscribe(sub).await.unwrap();
    let got = consumer.fetch(10, Duration::ZERO).await.unwrap();
    let bodies: Vec<_> = got.iter().map(|d| d.message.payload.clone()).collect();
    assert_eq!(bodies, ["2", "3", "4", "other topic"]);
}

#[tokio::test(start_paused = true)]
async fn a_publish_reaches_every_group_or_none() {
    let bus = bus_with(MemoryConfig { capacity: 1, send_timeout: Duration::from_secs(3), ..MemoryConfig::default() });
    let g1 = bus.subscribe(Subscription::new("g1", Selector::all())).await.unwrap();
    let g2 = bus.subscribe(Subscription::new("g2", Selector::all())).await.unwrap();
    bus.publish("task.created", msg("1")).await.unwrap();
    one(&*g1, Duration::ZERO).await.unwrap().ack().await.unwrap();

    let err = bus.publish("task.created", msg("2")).await.unwrap_err();
    assert!(matches!(&err, BusError::Full { destination, .. } if destination == "unit.events[g2]"), "{err:?}");
    assert!(one(&*g1, Duration::ZERO).await.is_none(), "g1 must not get an event g2 could not take");

    let publish = {
        let bus = bus.clone();
        tokio::spawn(async move { bus.publish("task.created", msg("3")).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    one(&*g2, Duration::ZERO).await.unwrap().ack().await.unwrap();
    publish.await.unwrap().expect("room in every group");
    for group in [&g1, &g2] {
        assert_eq!(one(&**group, Duration::ZERO).await.unwrap().message.payload.as_ref(), b"3");
    }
}

#[tokio::test(start_paused = true)]
async fn a_group_expiring_when_idle_goes_with_its_last_member() {
    let bus = bus_with(MemoryConfig { capacity: 1, send_timeout: Duration::from_secs(1), ..MemoryConfig::default() });
    let group = || Subscription::new("sse", Selector::all()).expiring_when_idle(Duration::from_secs(60));
    let (a, b) = (bus.subscribe(group()).await.unwrap(), bus.subscribe(group()).await.unwrap());
    bus.publish("task.created", msg("1")).await.unwrap();
    drop(a);
    assert_eq!(one(&*b, Duration::ZERO).await.unwrap().message.payload.as_ref(), b"1", "one member left");
    drop(b);
    for i in 2..5 {
        bus.publish("task.created", msg(&i.to_string())).await.expect("no group is left to fill up");
    }
    let rejoined = bus.subscribe(group()).await.unwrap();
    assert!(one(&*rejoined, Duration::ZERO).await.is_none(), "a new group, starting at new events");

    let durable = bus.subscribe(Subscription::new("kept", Selector::all())).await.unwrap();
    drop((rejoined, durable));
    bus.publish("task.created", msg("5")).await.unwrap();
    let durable = bus.subscribe(Subscription::new("kept", Selector::all())).await.unwrap();
    assert_eq!(one(&*durable, Duration::ZERO).await.unwrap().message.payload.as_ref(), b"5", "a durable group stays");
}

#[tokio::test(start_paused = true)]
async fn a_nack_with_a_short_delay_wakes_a_waiting_fetch() {
    let bus = bus();
    bus.send(QUEUE, msg("a")).await.unwrap();
    let consumer = bus.consume(QUEUE, consumer_config(600, 5)).await.unwrap();
    let delivery = one(&*consumer, Duration::ZERO).await.unwrap();
    let started = Instant::now();
    let nacker = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        delivery.nack(Duration::from_secs(2), "retry").await
    });
    let again = one(&*consumer, Duration::from_secs(60)).await.expect("redelivered after the nack delay");
    nacker.await.unwrap().unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(again.delivery_count, 2);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_bus_closes_its_consumers() {
    let bus = bus();
    let consumer = bus.consume(QUEUE, consumer_config(60, 5)).await.unwrap();
    let waiting = tokio::spawn(async move { consumer.fetch(1, Duration::from_secs(3600)).await });
    tokio::task::yield_now().await;
    drop(bus);
    let result = waiting.await.unwrap();
    assert!(matches!(result, Err(BusError::Closed)), "{result:?}");
}

#[tokio::test(start_paused = true)]
async fn bad_requests_are_rejected_with_a_reason() {
    let bus = bus();
    let invalid = |r: Result<(), BusError>| matches!(r, Err(BusError::Invalid(_)));
    assert!(invalid(bus.send("bad name", msg("x")).await));
    assert!(invalid(bus.publish("Image.Downloaded", msg("x")).await));
    assert!(invalid(bus.consume(QUEUE, consumer_config(0, 5)).await.map(drop)));
    assert!(invalid(bus.consume(QUEUE, consumer_config(10, 0)).await.map(drop)));
    assert!(invalid(bus.subscribe(Subscription::new("a.b", Selector::all())).await.map(drop)));
    let consumer = bus.consume(QUEUE, consumer_config(10, 5)).await.unwrap();
    assert!(invalid(consumer.fetch(0, Duration::ZERO).await.map(drop)));
}
