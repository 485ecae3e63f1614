//! What the Kafka test files share: the broker address, test settings, fresh prefixes.

#![allow(dead_code)]

use std::time::Duration;

use imagepipe_bus::KafkaConfig;

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
