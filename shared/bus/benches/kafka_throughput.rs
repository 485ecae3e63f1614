//! Send and consume-with-ack rates through the bus traits on the Kafka-compatible broker at
//! `IMAGEPIPE_BENCH_KAFKA_BROKERS` (default 127.0.0.1:9092; `scripts/kafka.sh` starts Tansu
//! there). A benchmark, not a test:
//! `cargo bench -p imagepipe-bus --features kafka --bench kafka_throughput`.

mod support;

use imagepipe_bus::KafkaConfig;
use imagepipe_bus::kafka::KafkaBus;
use support::PAYLOAD;

const SINGLE: usize = 2_000;
const BATCHED: usize = 20_000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let brokers = std::env::var("IMAGEPIPE_BENCH_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let prefix = format!("bench_{}", uuid::Uuid::new_v4().simple());
    let config = KafkaConfig { brokers: brokers.clone(), ..KafkaConfig::default() };
    let bus = KafkaBus::connect(&prefix, &config).await.expect("connect (scripts/kafka.sh starts a broker)");
    println!("brokers {brokers}, {} partitions, payload {PAYLOAD} B + 4 headers", config.partitions);

    support::trait_phases(&bus, SINGLE, BATCHED).await;
    bus.shutdown().await;
}
