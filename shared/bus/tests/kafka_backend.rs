//! Kafka-specific behaviour on the broker `scripts/kafka.sh` starts (Tansu on 127.0.0.1:9092):
//! partitions, the idempotent producer, commits below unfinished messages, dead-letter headers,
//! retry tiers and topic creation. Build with `--features kafka`.
#![cfg(feature = "kafka")]

mod kafka_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use imagepipe_bus::kafka::KafkaBus;
use imagepipe_bus::{
    Bus, BusConfig, BusError, BusKind, ConsumerConfig, Delivery, KafkaConfig, Message, Selector, StartPosition,
    Subscription,
};
use imagepipe_contracts::names::{headers, queues};
use kafka_support::{Cleanup, brokers, test_config, unique_prefix};

const PATIENCE: Duration = Duration::from_secs(10);

/// A bus whose topics `cleanup` deletes at the end of the test.
async fn connect(cleanup: &Cleanup, prefix: &str, config: &KafkaConfig) -> KafkaBus {
    let bus = KafkaBus::connect(prefix, config).await.unwrap_or_else(|err| {
        panic!("connecting to {} failed: {err:?} (scripts/kafka.sh starts the broker)", brokers())
    });
    cleanup.track(bus)
}

fn consumer_config(max_deliveries: u32) -> ConsumerConfig {
    ConsumerConfig { ack_wait: Duration::from_secs(30), max_deliveries }
}

/// Fetches until `n` deliveries arrived or `within` passed.
async fn collect(consumer: &dyn imagepipe_bus::Consumer, n: usize, within: Duration) -> Vec<Delivery> {
    let until = Instant::now() + within;
    let mut got = Vec::new();
    while got.len() < n && Instant::now() < until {
        got.extend(
            consumer.fetch(n - got.len(), until.saturating_duration_since(Instant::now())).await.expect("fetch"),
        );
    }
    got
}

fn body(delivery: &Delivery) -> String {
    String::from_utf8(delivery.message.payload.to_vec()).expect("UTF-8 body")
}

/// The partition in a delivery's position (`topic[partition]@offset`).
fn partition_of(delivery: &Delivery) -> i32 {
    let position = delivery.position();
    let start = position.rfind('[').expect("position has a partition") + 1;
    let end = position.rfind(']').expect("position has a partition");
    position[start..end].parse().expect("numeric partition")
}

/// How many messages `topic` has ever held, over all partitions.
async fn total_messages(bus: &KafkaBus, topic: &str) -> i64 {
    bus.watermarks(topic).await.expect("watermarks").iter().map(|(_, high)| high).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_keyed_by_task_id_keep_their_partition_and_order() {
    let cleanup = Cleanup::default();
    let prefix = unique_prefix("order");
    let bus = connect(&cleanup, &prefix, &KafkaConfig { partitions: 3, ..test_config() }).await;
    const KEYS: usize = 6;
    const PER_KEY: usize = 15;
    let mut batch = Vec::new();
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            batch.push(Message::new(i.to_string()).with_key(format!("tsk_{k}")).with_id(format!("k{k}-{i}")));
        }
    }
    let queues = bus.clone().into_bus().queues;
    queues.send_batch(queues::DOWNLOAD, batch).await.expect("send_batch");
    let consumer = queues.consume(queues::DOWNLOAD, consumer_config(5)).await.expect("consume");
    let got = collect(&*consumer, KEYS * PER_KEY, PATIENCE).await;
    assert_eq!(got.len(), KEYS * PER_KEY, "every message delivered");
    let mut by_key: BTreeMap<String, (Vec<i32>, Vec<usize>)> = BTreeMap::new();
    for delivery in &got {
        let entry = by_key.entry(delivery.message.key.clone().expect("key")).or_default();
        entry.0.push(partition_of(delivery));
        entry.1.push(body(delivery).parse().expect("sequence number"));
    }
    let mut partitions_used = std::collections::BTreeSet::new();
    for (key, (partitions, order)) in &by_key {
        assert!(partitions.windows(2).all(|w| w[0] == w[1]), "{key} spread over partitions {partitions:?}");
        assert_eq!(order, &(0..PER_KEY).collect::<Vec<_>>(), "order of {key}");
        partitions_used.insert(partitions[0]);
    }
    assert!(partitions_used.len() > 1, "{KEYS} keys all landed in one of 3 partitions");
    for delivery in got {
        delivery.ack().await.expect("ack");
    }
    bus.shutdown().await;
}

/// The producer is idempotent (the broker assigned it a producer id), which only keeps its own
/// retries from duplicating: a message sent again with the same id is stored again, and the
/// consumer's deduplication window delivers it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_is_idempotent_and_a_message_sent_twice_is_delivered_once() {
    let cleanup = Cleanup::default();
    let prefix = unique_prefix("idempotence");
    let bus = connect(&cleanup, &prefix, &test_config()).await;
    let queues = bus.clone().into_bus().queues;
    let message = |body: &str, id: &str| Message::new(body.to_owned()).with_key("tsk_x").with_id(id);
    queues.send(queues::SUBMIT, message("first", "dup")).await.expect("send");
    queues.send(queues::SUBMIT, message("again", "dup")).await.expect("a message sent again is accepted");
    queues.send(queues::SUBMIT, message("next", "other")).await.expect("send");
    let until = Instant::now() + PATIENCE;
    let idempotence = loop {
        match bus.idempotence() {
            Some(state) if state.state == "Assigned" => break state,
            other => assert!(Instant::now() < until, "no producer id assigned within {PATIENCE:?}: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(idempotence.producer_id >= 0, "{idempotence:?}");
    let topic = format!("{prefix}.{}", queues::SUBMIT);
    assert_eq!(total_messages(&bus, &topic).await, 3, "each send stored once, the second one of `dup` included");

    let consumer = queues.consume(queues::SUBMIT, consumer_config(5)).await.expect("consume");
    // One key, one partition, in order: once `next` is delivered, the copy before it was passed.
    let got = collect(&*consumer, 2, PATIENCE).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["first", "next"], "`dup` delivered once");
    for delivery in got {
        delivery.ack().await.expect("ack");
    }
    assert!(bus.is_connected());
    bus.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_are_committed_only_below_unfinished_messages() {
    let cleanup = Cleanup::default();
    let prefix = unique_prefix("commit");
    let config = KafkaConfig { partitions: 1, ..test_config() };
    let session = || async { connect(&cleanup, &prefix, &config).await };
    let send = |bus: KafkaBus| async move {
        let queues = bus.into_bus().queues;
        for name in ["a", "b", "c"] {
            queues.send(queues::AI, Message::new(name).with_key("tsk_same").with_id(name)).await.expect("send");
        }
    };
    let fetch_all = |bus: KafkaBus, n: usize| async move {
        let consumer = bus.into_bus().queues.consume(queues::AI, consumer_config(5)).await.expect("consume");
        let got = collect(&*consumer, n, PATIENCE).await;
        (consumer, got)
    };

    let first = session().await;
    send(first.clone()).await;
    let (consumer, mut got) = fetch_all(first.clone(), 3).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["a", "b", "c"]);
    let a = got.remove(0);
    for later in got {
        later.ack().await.expect("ack b and c");
    }
    drop((a, consumer));
    first.shutdown().await;

    let second = session().await;
    let (consumer, mut got) = fetch_all(second.clone(), 3).await;
    assert_eq!(
        got.iter().map(body).collect::<Vec<_>>(),
        ["a", "b", "c"],
        "a was unfinished: nothing was committed past it"
    );
    got.remove(0).ack().await.expect("ack a");
    drop((got, consumer));
    second.shutdown().await;

    let third = session().await;
    let (consumer, got) = fetch_all(third.clone(), 2).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["b", "c"], "committed up to b, the first unfinished");
    for delivery in got {
        delivery.ack().await.expect("ack");
    }
    assert!(consumer.fetch(5, Duration::from_millis(500)).await.expect("fetch").is_empty());
    third.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_carry_reason_and_delivery_count() {
    let cleanup = Cleanup::default();
    let prefix = unique_prefix("dlq");
    let bus =
        connect(&cleanup, &prefix, &KafkaConfig { retry_tiers: vec![Duration::from_millis(200)], ..test_config() })
            .await;
    let events = bus.clone().into_bus().events;
    let group = "webhooks";
    let subscription = Subscription::new(group, Selector::parse("task.failed").expect("selector"))
        .starting(StartPosition::New)
        .with_consumer(consumer_config(3));
    let member = events.subscribe(subscription).await.expect("subscribe");
    let event = Message::new(r#"{"taskId":"tsk_d"}"#).with_key("tsk_d").with_id("evt-d");
    events.publish("task.failed", event).await.expect("publish");
    for n in 1..=3 {
        let delivery = collect(&*member, 1, PATIENCE).await.pop().unwrap_or_else(|| panic!("delivery {n}"));
        assert_eq!(delivery.delivery_count, n, "the count survives the trip through the retry topic");
        delivery.nack(Duration::ZERO, "webhook answered 503").await.expect("nack");
    }
    let dlq_topic = format!("{prefix}.dlq.events.{group}");
    let until = Instant::now() + PATIENCE;
    while total_messages(&bus, &dlq_topic).await < 1 {
        assert!(Instant::now() < until, "nothing reached {dlq_topic}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let queues = bus.clone().into_bus().queues;
    let dlq = queues.consume(&format!("dlq.events.{group}"), consumer_config(5)).await.expect("consume the DLQ");
    let dead = collect(&*dlq, 1, PATIENCE).await.pop().expect("the dead letter");
    let h = &dead.message.headers;
    assert_eq!(h.get(headers::DLQ_REASON), Some("max deliveries (3) reached; last error: webhook answered 503"));
    assert_eq!(h.get(headers::DLQ_DELIVERY_COUNT), Some("3"));
    assert_eq!(h.get(headers::DLQ_SOURCE), Some(group));
    assert_eq!(h.get(headers::EVENT_TYPE), Some("task.failed"));
    assert_eq!(dead.message.id.as_deref(), Some("evt-d"));
    assert_eq!(dead.message.key.as_deref(), Some("tsk_d"));
    assert!(h.iter().all(|(name, _)| !name.starts_with("imagepipe-kafka-")), "internal headers leaked: {h:?}");
    dead.ack().await.expect("ack");
    bus.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_nack_goes_to_its_tier_while_the_queue_keeps_flowing() {
    let cleanup = Cleanup::default();
    let prefix = unique_prefix("tiers");
    let tiers = vec![Duration::from_secs(1), Duration::from_secs(4)];
    let bus = connect(&cleanup, &prefix, &KafkaConfig { partitions: 1, retry_tiers: tiers, ..test_config() }).await;
    let queues = bus.clone().into_bus().queues;
    let consumer = queues.consume(queues::METADATA, consumer_config(5)).await.expect("consume");
    queues.send(queues::METADATA, Message::new("slow").with_key("tsk_1").with_id("slow")).await.expect("send");
    let slow = collect(&*consumer, 1, PATIENCE).await.pop().expect("the first delivery");
    let nacked_at = Instant::now();
    slow.nack(Duration::from_secs(3), "not yet").await.expect("nack");
    let retry = |tier: &str| format!("{prefix}.retry.tasks.metadata.{tier}");
    assert_eq!(total_messages(&bus, &retry("4s")).await, 1, "a 3 s delay goes to the 4 s tier");
    assert_eq!(total_messages(&bus, &retry("1s")).await, 0);

    queues.send(queues::METADATA, Message::new("next").with_key("tsk_2").with_id("next")).await.expect("send");
    let next = collect(&*consumer, 1, PATIENCE).await.pop().expect("a later message while the nacked one waits");
    assert_eq!(body(&next), "next");
    assert!(nacked_at.elapsed() < Duration::from_secs(3), "the later message waited for the held one");
    next.ack().await.expect("ack");

    let again = collect(&*consumer, 1, PATIENCE).await.pop().expect("the redelivery");
    let after = nacked_at.elapsed();
    assert!(after >= Duration::from_millis(2900), "redelivered {after:?} after a 3 s nack");
    assert_eq!((body(&again), again.delivery_count), ("slow".to_owned(), 2));
    again.ack().await.expect("ack");
    bus.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_created_with_the_configured_partitions() {
    let cleanup = Cleanup::default();
    let prefix = unique_prefix("topics");
    let bus = connect(&cleanup, &prefix, &KafkaConfig { partitions: 4, ..test_config() }).await;
    for logical in ["tasks.submit", "tasks.download", "tasks.results", "dlq.tasks.ai", "events.image", "events.task"] {
        let topic = format!("{prefix}.{logical}");
        assert_eq!(bus.partitions_of(&topic), Some(4), "{topic}");
        assert_eq!(bus.watermarks(&topic).await.expect("watermarks").len(), 4, "{topic} on the broker");
    }
    let custom = format!("{prefix}.tasks.custom");
    assert_eq!(bus.partitions_of(&custom), None, "not created before use");
    bus.clone().into_bus().queues.send("tasks.custom", Message::new("x")).await.expect("send to a new queue");
    assert_eq!(bus.partitions_of(&custom), Some(4));
    assert_eq!(total_messages(&bus, &custom).await, 1);

    let again = connect(&cleanup, &prefix, &KafkaConfig { partitions: 2, ..test_config() }).await;
    again.clone().into_bus().queues.send("tasks.custom", Message::new("y")).await.expect("send");
    assert_eq!(again.partitions_of(&custom), Some(4), "an existing topic keeps its partitions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_kind_kafka_connects_through_the_bus_config() {
    let cleanup = Cleanup::default();
    let prefix = unique_prefix("config");
    let config =
        BusConfig { kind: BusKind::Kafka, prefix: prefix.clone(), kafka: test_config(), ..BusConfig::default() };
    let bus = Bus::connect(&config).await.expect("connect");
    assert!(bus.is_connected());
    bus.queues.send(queues::SUBMIT, Message::new("{}").with_key("tsk_c")).await.expect("send");
    let same_prefix = connect(&cleanup, &prefix, &test_config()).await;
    assert_eq!(total_messages(&same_prefix, &format!("{prefix}.tasks.submit")).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_no_broker_fails_with_the_address() {
    let config =
        KafkaConfig { brokers: "127.0.0.1:1".into(), connect_timeout: Duration::from_secs(2), ..test_config() };
    let started = Instant::now();
    let err = KafkaBus::connect(&unique_prefix("down"), &config).await.err().expect("no broker listens on port 1");
    assert!(matches!(&err, BusError::Connect { url, .. } if url == "127.0.0.1:1"), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_settings_are_refused_by_key() {
    let cases = [
        (KafkaConfig { partitions: 0, ..test_config() }, "bus.kafka.partitions"),
        (KafkaConfig { retry_tiers: vec![], ..test_config() }, "bus.kafka.retry_tiers"),
        (
            KafkaConfig { retry_tiers: vec![Duration::from_secs(10), Duration::from_secs(1)], ..test_config() },
            "bus.kafka.retry_tiers",
        ),
        (
            KafkaConfig { client: [("enable.idempotence".to_owned(), "false".to_owned())].into(), ..test_config() },
            "bus.kafka.client.enable.idempotence",
        ),
        (KafkaConfig { sasl_username: Some("app".into()), ..test_config() }, "bus.kafka.sasl_username"),
    ];
    for (config, key) in cases {
        match KafkaBus::connect(&unique_prefix("invalid"), &config).await {
            Err(BusError::Invalid(message)) => assert!(message.contains(key), "{message} names {key}"),
            other => panic!("{key}: expected Invalid, got {:?}", other.err()),
        }
    }
}

#[test]
fn credentials_never_print() {
    let config = KafkaConfig {
        brokers: "sasl://user:pw@b1:9093,b2:9093".into(),
        sasl_username: Some("app".into()),
        sasl_password: Some("hunter2".to_owned().into()),
        client: [("ssl.key.password".to_owned(), "s3cret".to_owned())].into(),
        ..KafkaConfig::default()
    };
    let printed = format!("{config:?}");
    assert!(!printed.contains("hunter2") && !printed.contains("s3cret") && !printed.contains(":pw@"), "{printed}");
    assert!(printed.contains("b2:9093") && printed.contains("app"), "{printed}");
}
