//! Consumers of chosen partitions against the real broker (`scripts/kafka.sh` starts Tansu on
//! 127.0.0.1:9092; `IMAGEPIPE_TEST_KAFKA_BROKERS` overrides). Every test uses a prefix of its
//! own and deletes its topics at the end.

use std::time::{Duration, Instant};

use imagepipe_contracts::names::{headers, queues};
use imagepipe_contracts::shard::shard_of;

use super::KafkaBus;
use crate::config::{ConsumerConfig, KafkaConfig};
use crate::delivery::Delivery;
use crate::error::BusError;
use crate::message::Message;
use crate::traits::{Consumer, TaskQueue};

const PATIENCE: Duration = Duration::from_secs(30);

fn test_config(shards: Option<u16>) -> KafkaConfig {
    KafkaConfig {
        brokers: std::env::var("IMAGEPIPE_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into()),
        partitions: 2,
        shards,
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(5),
        send_timeout: Duration::from_secs(10),
        session_timeout: Duration::from_secs(6),
        heartbeat_interval: Duration::from_millis(500),
        retry_tiers: vec![Duration::from_millis(200), Duration::from_secs(1)],
        ..KafkaConfig::default()
    }
}

/// Buses of one test, whose topics are deleted when it ends (passed or failed).
struct Buses {
    prefix: String,
    buses: Vec<KafkaBus>,
}

impl Buses {
    fn new(test: &str) -> Self {
        Self { prefix: format!("kp_{test}_{}", uuid::Uuid::new_v4().simple()), buses: Vec::new() }
    }

    async fn connect(&mut self, config: &KafkaConfig) -> Result<KafkaBus, BusError> {
        let bus = KafkaBus::connect(&self.prefix, config).await?;
        self.buses.push(bus.clone());
        Ok(bus)
    }
}

impl Drop for Buses {
    fn drop(&mut self) {
        let (buses, prefix) = (std::mem::take(&mut self.buses), self.prefix.clone());
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let mut topics = super::names::Names::new(&prefix).standard_topics();
                for bus in buses {
                    bus.shutdown().await;
                    topics.extend(bus.topics());
                }
                topics.sort();
                topics.dedup();
                if let Err(err) = KafkaBus::delete_topics(&test_config(None), &topics).await {
                    eprintln!("could not delete {} test topics: {err}", topics.len());
                }
            });
        });
        let _ = cleanup.join();
    }
}

fn consumer_config(max_deliveries: u32) -> ConsumerConfig {
    ConsumerConfig { ack_wait: Duration::from_secs(30), max_deliveries }
}

async fn collect(consumer: &dyn Consumer, n: usize, within: Duration) -> Vec<Delivery> {
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

/// A key whose shard among `shards` is `shard`.
fn key_in(shard: u16, shards: u16, salt: &str) -> String {
    (0..).map(|i| format!("tsk_{salt}_{i}")).find(|k| shard_of(k, shards) == shard).expect("some key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_consumer_reads_only_its_partitions_and_keys_go_to_their_shard() {
    let mut buses = Buses::new("routing");
    let bus = buses.connect(&test_config(Some(4))).await.expect("connect");
    let prefix = buses.prefix.clone();
    for lane in ["tasks.results", "tasks.results.high", "tasks.submit.low"] {
        assert_eq!(bus.partitions_of(&format!("{prefix}.{lane}")), Some(4), "{lane} has a partition per shard");
    }
    assert_eq!(bus.partitions_of(&format!("{prefix}.tasks.download")), Some(2), "other queues keep `partitions`");
    assert!(bus.routes_by_key());

    let queue = queues::RESULTS;
    let (key1, key2) = (key_in(1, 4, "a"), key_in(2, 4, "b"));
    bus.send(queue, Message::new("explicit-1").with_key(key_in(3, 4, "c")).with_partition(1)).await.expect("send");
    bus.send(queue, Message::new("explicit-3").with_partition(3)).await.expect("send");
    bus.send_batch(queue, vec![Message::new("keyed-1").with_key(&key1), Message::new("keyed-2").with_key(&key2)])
        .await
        .expect("send_batch");
    let refused = bus.send(queue, Message::new("nowhere").with_partition(4)).await;
    assert!(matches!(&refused, Err(BusError::Invalid(m)) if m.contains("4 partitions")), "{refused:?}");
    let refused = bus.consume_partitions(queue, &[4], consumer_config(3)).await.err();
    assert!(matches!(&refused, Some(BusError::Invalid(m)) if m.contains("partition 4")), "{refused:?}");

    let one = bus.consume_partitions(queue, &[1], consumer_config(3)).await.expect("consume [1]");
    let rest = bus.consume_partitions(queue, &[3, 2], consumer_config(3)).await.expect("consume [2, 3]");
    let whole = bus.consume(queue, consumer_config(3)).await.err();
    assert!(matches!(&whole, Some(BusError::Invalid(m)) if m.contains("cannot share")), "{whole:?}");
    let got = collect(&*one, 2, PATIENCE).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["explicit-1", "keyed-1"], "partition 1, in order");
    for delivery in &got {
        assert_eq!(delivery.message.partition, Some(1));
        assert_eq!(delivery.source, queue);
    }
    let mut others = collect(&*rest, 2, PATIENCE).await;
    others.sort_by_key(body);
    assert_eq!(
        others.iter().map(|d| (body(d), d.message.partition)).collect::<Vec<_>>(),
        [("explicit-3".to_owned(), Some(3)), ("keyed-2".to_owned(), Some(2))]
    );
    assert!(one.fetch(10, Duration::from_millis(500)).await.expect("fetch").is_empty(), "nothing else in [1]");
    for delivery in got.into_iter().chain(others) {
        delivery.ack().await.expect("ack");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_consumer_of_a_partition_resumes_from_the_committed_offset() {
    let mut buses = Buses::new("handover");
    let bus = buses.connect(&test_config(Some(2))).await.expect("connect");
    let queue = queues::SUBMIT;
    for i in 0..4 {
        bus.send(queue, Message::new(format!("m{i}")).with_id(format!("id-{i}")).with_partition(0))
            .await
            .expect("send");
    }
    let first = bus.consume_partitions(queue, &[0], consumer_config(5)).await.expect("consume");
    let got = collect(&*first, 4, PATIENCE).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["m0", "m1", "m2", "m3"]);
    let mut got = got.into_iter();
    let (m0, m1, m2) = (got.next().unwrap(), got.next().unwrap(), got.next().unwrap());
    m0.ack().await.expect("ack");
    m2.ack().await.expect("ack");
    let busy = bus.consume_partitions(queue, &[0, 1], consumer_config(5)).await.err();
    assert!(matches!(&busy, Some(BusError::Invalid(m)) if m.contains("already read")), "{busy:?}");
    drop(first);
    // m1 and m3 were not finished: the next owner of partition 0 gets them (m2 again too,
    // since the commit point stops below m1), once the first consumer has committed and left.
    let next = bus.consume_partitions(queue, &[0, 1], consumer_config(5)).await.expect("consume again");
    let again = collect(&*next, 3, PATIENCE).await;
    assert_eq!(again.iter().map(body).collect::<Vec<_>>(), ["m1", "m2", "m3"]);
    assert!(again.iter().all(|d| d.delivery_count == 1), "read afresh by a new owner");
    assert!(m1.ack().await.is_err(), "the first consumer's deliveries are gone with it");
    for delivery in again {
        delivery.ack().await.expect("ack");
    }
    drop(next);

    let other = buses.connect(&test_config(Some(2))).await.expect("another process");
    other.send(queue, Message::new("m4").with_partition(0)).await.expect("send");
    let third = other.consume_partitions(queue, &[0], consumer_config(5)).await.expect("consume in another bus");
    let rest = collect(&*third, 2, Duration::from_secs(3)).await;
    assert_eq!(rest.iter().map(body).collect::<Vec<_>>(), ["m4"], "everything before was committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_consumer_retries_in_its_partition_and_dead_letters() {
    let mut buses = Buses::new("retry");
    let bus = buses.connect(&test_config(Some(3))).await.expect("connect");
    let queue = queues::RESULTS;
    let consumer = bus.consume_partitions(queue, &[2], consumer_config(2)).await.expect("consume");
    let others = bus.consume_partitions(queue, &[0, 1], consumer_config(2)).await.expect("consume the rest");
    bus.send(queue, Message::new("flaky").with_key(key_in(2, 3, "r")).with_id("flaky-1")).await.expect("send");

    let first = collect(&*consumer, 1, PATIENCE).await.pop().expect("first delivery");
    assert_eq!((body(&first), first.delivery_count, first.message.partition), ("flaky".into(), 1, Some(2)));
    let sent = Instant::now();
    first.nack(Duration::from_millis(150), "not yet").await.expect("nack");
    let second = collect(&*consumer, 1, PATIENCE).await.pop().expect("redelivery");
    // Due times are whole milliseconds of the wall clock.
    assert!(sent.elapsed() >= Duration::from_millis(145), "redelivered after its delay: {:?}", sent.elapsed());
    assert_eq!((body(&second), second.delivery_count, second.message.partition), ("flaky".into(), 2, Some(2)));
    let retry_topic = format!("{}.retry.{queue}.200ms", buses.prefix);
    let held: Vec<i64> = bus.watermarks(&retry_topic).await.expect("watermarks").iter().map(|(_, h)| *h).collect();
    assert_eq!(held, [0, 0, 1], "the redelivery went through partition 2 of the retry topic");
    assert!(others.fetch(10, Duration::from_millis(300)).await.expect("fetch").is_empty(), "not seen elsewhere");
    second.nack(Duration::ZERO, "still failing").await.expect("nack on the last delivery dead-letters");

    let dead = bus.consume(&imagepipe_contracts::names::dead_letter_queue(queue), consumer_config(1)).await;
    let letter = collect(&*dead.expect("consume dead letters"), 1, PATIENCE).await.pop().expect("a dead letter");
    assert_eq!(body(&letter), "flaky");
    assert_eq!(letter.message.headers.get(headers::DLQ_DELIVERY_COUNT), Some("2"));
    assert_eq!(letter.message.headers.get(headers::DLQ_SOURCE), Some(queue));
    assert!(letter.message.headers.get(headers::DLQ_REASON).is_some_and(|r| r.contains("still failing")));
    letter.ack().await.expect("ack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_queue_with_too_few_partitions_is_grown_or_refused() {
    let mut buses = Buses::new("grow");
    buses.connect(&test_config(None)).await.expect("connect without shards");
    let topic = format!("{}.{}", buses.prefix, queues::SUBMIT);
    match buses.connect(&test_config(Some(5))).await {
        Ok(bus) => assert_eq!(bus.partitions_of(&topic), Some(5), "grown (Kafka)"),
        Err(err) => {
            let shown = err.to_string();
            assert!(shown.contains(&topic) && shown.contains("has 2 partitions and needs at least 5"), "{shown}");
        }
    }
}
