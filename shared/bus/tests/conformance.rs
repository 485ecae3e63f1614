//! The backend conformance suite (`imagepipe_bus::conformance`), once per compiled-in backend.
//! Test names read `<backend>::<case>`; build with `--features conformance`.
//!
//! A backend adds a harness module below and one `conformance_suite!` line.
#![cfg(feature = "conformance")]

use imagepipe_bus::conformance::{Harness, Timing, async_trait, unique_prefix};

#[cfg(feature = "memory")]
mod memory_harness {
    use imagepipe_bus::Bus;
    use imagepipe_bus::memory::{MemoryBus, MemoryConfig};

    use super::*;

    /// A fresh in-process bus per case, with default limits.
    pub struct Memory;

    #[async_trait]
    impl Harness for Memory {
        fn name(&self) -> &str {
            "memory"
        }

        async fn bus(&self) -> Bus {
            MemoryBus::new(unique_prefix(), MemoryConfig::default()).into_bus()
        }

        fn timing(&self) -> Timing {
            Timing::IN_PROCESS
        }
    }
}

#[cfg(feature = "memory")]
imagepipe_bus::conformance_suite!(memory, memory_harness::Memory);

#[cfg(feature = "nats")]
mod nats_support;

#[cfg(feature = "nats")]
mod nats_harness {
    use std::sync::Mutex;

    use imagepipe_bus::Bus;
    use imagepipe_bus::nats::NatsBus;

    use super::nats_support::{delete_streams, nats_2_9_url, nats_latest_url, test_config};
    use super::*;

    /// A fresh prefix per case on one NATS server; the case's streams are deleted when the
    /// harness is dropped at the end of the case (passed or failed).
    pub struct Nats {
        name: &'static str,
        url: String,
        created: Mutex<Vec<NatsBus>>,
    }

    impl Nats {
        /// Debian's nats-server 2.9 on 127.0.0.1:4222 (`IMAGEPIPE_TEST_NATS_URL` overrides).
        pub fn v2_9() -> Self {
            Self { name: "nats 2.9", url: nats_2_9_url(), created: Mutex::new(Vec::new()) }
        }

        /// The current nats-server whose URL scripts/nats.sh exports; when it is not exported,
        /// a failure, or `None` (after printing `SKIPPED`) with `IMAGEPIPE_TEST_ALLOW_SKIP=1`.
        pub fn latest() -> Option<Self> {
            nats_latest_url().map(|url| Self { name: "nats latest", url, created: Mutex::new(Vec::new()) })
        }
    }

    #[async_trait]
    impl Harness for Nats {
        fn name(&self) -> &str {
            self.name
        }

        async fn bus(&self) -> Bus {
            let prefix = unique_prefix();
            let bus = NatsBus::connect(&prefix, &test_config(&self.url)).await.unwrap_or_else(|err| {
                panic!("{}: connecting to {} failed: {err:?} (scripts/nats.sh starts the servers)", self.name, self.url)
            });
            self.created.lock().expect("lock").push(bus.clone());
            bus.into_bus()
        }

        fn timing(&self) -> Timing {
            Timing::BROKER
        }
    }

    impl Drop for Nats {
        fn drop(&mut self) {
            // Closed first, so a task the case left running cannot recreate what is deleted.
            let buses = std::mem::take(&mut *self.created.lock().unwrap_or_else(|e| e.into_inner()));
            let streams: Vec<String> =
                buses.iter().inspect(|bus| bus.close()).flat_map(NatsBus::stream_names).collect();
            if !streams.is_empty() {
                delete_streams(&self.url, streams);
            }
        }
    }
}

#[cfg(feature = "nats")]
imagepipe_bus::conformance_suite!(nats_2_9, nats_harness::Nats::v2_9());

// Without the server the case fails; a skip allowed by `IMAGEPIPE_TEST_ALLOW_SKIP=1` returns
// from the test before the case runs (`latest()` printed `SKIPPED` and why).
#[cfg(feature = "nats")]
imagepipe_bus::conformance_suite!(
    nats_latest,
    match nats_harness::Nats::latest() {
        Some(harness) => harness,
        None => return,
    }
);

#[cfg(feature = "kafka")]
mod kafka_support;

#[cfg(feature = "kafka")]
mod kafka_harness {
    use std::sync::Mutex;

    use imagepipe_bus::Bus;
    use imagepipe_bus::kafka::KafkaBus;

    use super::kafka_support::{brokers, delete_topics, test_config};
    use super::*;

    /// A fresh prefix per case on the Kafka-compatible broker, with one partition per topic:
    /// the cases check the order of messages across keys, which Kafka keeps only within a
    /// partition (tests/kafka_backend.rs covers several partitions). When the harness is
    /// dropped, the case's buses are shut down and their topics deleted.
    pub struct Kafka {
        created: Mutex<Vec<KafkaBus>>,
    }

    impl Kafka {
        pub fn new() -> Self {
            Self { created: Mutex::new(Vec::new()) }
        }
    }

    #[async_trait]
    impl Harness for Kafka {
        fn name(&self) -> &str {
            "kafka"
        }

        async fn bus(&self) -> Bus {
            let config = imagepipe_bus::KafkaConfig {
                partitions: 1,
                shards: Some(imagepipe_contracts::shard::DEFAULT_SHARDS),
                ..test_config()
            };
            let bus = KafkaBus::connect(&unique_prefix(), &config).await.unwrap_or_else(|err| {
                panic!("kafka: connecting to {} failed: {err:?} (scripts/kafka.sh starts the broker)", brokers())
            });
            self.created.lock().expect("lock").push(bus.clone());
            bus.into_bus()
        }

        fn timing(&self) -> Timing {
            Timing::BROKER
        }
    }

    impl Drop for Kafka {
        fn drop(&mut self) {
            delete_topics(std::mem::take(&mut *self.created.lock().unwrap_or_else(|e| e.into_inner())));
        }
    }
}

#[cfg(feature = "kafka")]
imagepipe_bus::conformance_suite!(kafka, kafka_harness::Kafka::new());
