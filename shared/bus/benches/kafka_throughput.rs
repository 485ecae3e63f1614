//! Send and consume-with-ack rates through the bus traits on the Kafka-compatible broker at
//! `IMAGEPIPE_BENCH_KAFKA_BROKERS` (default 127.0.0.1:9092; `scripts/kafka.sh` starts Tansu
//! there). A benchmark, not a test:
//! `cargo bench -p imagepipe-bus --features kafka --bench kafka_throughput`.

use std::time::{Duration, Instant};

use futures::future::join_all;
use imagepipe_bus::kafka::KafkaBus;
use imagepipe_bus::{ConsumerConfig, KafkaConfig, Message, TaskQueue};

const SINGLE: usize = 2_000;
const BATCHED: usize = 20_000;
const BATCH: usize = 500;
const FETCH: usize = 256;
const PAYLOAD: usize = 256;

fn rate(what: &str, n: usize, took: Duration) {
    println!("{what:<48} {n:>7} msgs in {:>7.2?}  {:>9.0} msgs/s", took, n as f64 / took.as_secs_f64());
}

fn message(i: usize) -> Message {
    Message::new(vec![b'x'; PAYLOAD])
        .with_key(format!("tsk_{}", i % 64))
        .with_id(format!("bench-{i}"))
        .with_header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .with_header("imagepipe-schema", "1")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let brokers = std::env::var("IMAGEPIPE_BENCH_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let prefix = format!("bench_{}", uuid::Uuid::new_v4().simple());
    let config = KafkaConfig { brokers: brokers.clone(), ..KafkaConfig::default() };
    let bus = KafkaBus::connect(&prefix, &config).await.expect("connect (scripts/kafka.sh starts a broker)");
    println!("brokers {brokers}, {} partitions, payload {PAYLOAD} B + 4 headers", config.partitions);

    let started = Instant::now();
    for i in 0..SINGLE {
        bus.send("tasks.bench", message(i)).await.expect("send");
    }
    rate("bus: send, one at a time (await each ack)", SINGLE, started.elapsed());

    let started = Instant::now();
    for chunk in 0..BATCHED / BATCH {
        let messages = (0..BATCH).map(|i| message(SINGLE + chunk * BATCH + i)).collect();
        bus.send_batch("tasks.bench", messages).await.expect("send_batch");
    }
    rate(&format!("bus: send_batch of {BATCH} (pipelined)"), BATCHED, started.elapsed());

    let total = SINGLE + BATCHED;
    let started = Instant::now();
    let consumer = bus
        .consume("tasks.bench", ConsumerConfig { ack_wait: Duration::from_secs(30), max_deliveries: 5 })
        .await
        .expect("consume");
    println!("{:<48} {:>7.2?}", "bus: consume (join the group, first assignment)", started.elapsed());
    let started = Instant::now();
    let mut done = 0;
    while done < total / 2 {
        for delivery in consumer.fetch(FETCH, Duration::from_secs(1)).await.expect("fetch") {
            delivery.ack().await.expect("ack");
            done += 1;
        }
    }
    rate(&format!("bus: fetch({FETCH}) + ack each in turn"), done, started.elapsed());

    let started = Instant::now();
    let mut concurrent = 0;
    while done + concurrent < total {
        let batch = consumer.fetch(FETCH, Duration::from_secs(1)).await.expect("fetch");
        concurrent += batch.len();
        for result in join_all(batch.into_iter().map(|d| d.ack())).await {
            result.expect("ack");
        }
    }
    rate(&format!("bus: fetch({FETCH}) + acks concurrently"), concurrent, started.elapsed());
    drop(consumer);
    bus.shutdown().await;
}
