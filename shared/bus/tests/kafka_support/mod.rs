//! What the Kafka test files share: the broker address, test settings, fresh prefixes, and
//! topic cleanup.

#![allow(dead_code)]

use std::time::Duration;

use imagepipe_bus::KafkaConfig;
use imagepipe_bus::kafka::KafkaBus;

/// The broker `scripts/kafka.sh` starts (Tansu on 127.0.0.1:9092);
/// `IMAGEPIPE_TEST_KAFKA_BROKERS` overrides.
pub fn brokers() -> String {
    std::env::var("IMAGEPIPE_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Settings for tests: short timeouts and quick heartbeats, small delay tiers.
pub fn test_config() -> KafkaConfig {
    KafkaConfig {
        brokers: brokers(),
        partitions: 3,
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(5),
        send_timeout: Duration::from_secs(10),
        // Tansu delays a new group's first assignment by half the session timeout.
        session_timeout: Duration::from_secs(6),
        heartbeat_interval: Duration::from_millis(500),
        linger: Duration::from_millis(1),
        assignment_timeout: Duration::from_secs(20),
        ..KafkaConfig::default()
    }
}

/// A prefix no other test uses.
pub fn unique_prefix(test: &str) -> String {
    format!("kt_{test}_{}", uuid::Uuid::new_v4().simple())
}

/// Deletes the topics of every bus it tracked when dropped (passed or failed test).
#[derive(Default)]
pub struct Cleanup(std::sync::Mutex<Vec<KafkaBus>>);

impl Cleanup {
    /// Tracks `bus` and gives it back.
    pub fn track(&self, bus: KafkaBus) -> KafkaBus {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(bus.clone());
        bus
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        delete_topics(std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner())));
    }
}

/// Shuts `buses` down, drops them, then deletes every topic they used, on a runtime of its own
/// (so it works from `Drop`, inside or outside a runtime, and while panicking). Tansu keeps
/// topics in memory and slows down as they pile up.
pub fn delete_topics(buses: Vec<KafkaBus>) {
    if buses.is_empty() {
        return;
    }
    let cleanup = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async move {
            let mut topics = Vec::new();
            for bus in buses {
                bus.shutdown().await;
                topics.extend(bus.topics());
            }
            topics.sort();
            topics.dedup();
            if let Err(err) = KafkaBus::delete_topics(&test_config(), &topics).await {
                eprintln!("could not delete {} test topics: {err}", topics.len());
            }
        });
    });
    let _ = cleanup.join();
}
