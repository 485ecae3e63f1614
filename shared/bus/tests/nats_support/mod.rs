//! What the NATS test files share: server URLs, fresh prefixes, and stream cleanup.

#![allow(dead_code)]

use std::time::Duration;

use imagepipe_bus::NatsConfig;
use imagepipe_bus::nats::NatsBus;

/// The Debian nats-server (2.9) the test command starts; `IMAGEPIPE_TEST_NATS_URL` overrides.
pub fn nats_2_9_url() -> String {
    std::env::var("IMAGEPIPE_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// The current nats-server `scripts/nats.sh` starts, when its URL is exported. Without it the
/// test fails, or with `IMAGEPIPE_TEST_ALLOW_SKIP=1` skips that server (`None`).
pub fn nats_latest_url() -> Option<String> {
    match std::env::var("IMAGEPIPE_TEST_NATS_LATEST_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            imagepipe_contracts::testing::environment_missing(
                "the current NATS server is not running: IMAGEPIPE_TEST_NATS_LATEST_URL is not set \
                 (run the tests through scripts/test.sh, or `source scripts/nats.sh && ensure_nats_latest`)",
            );
            None
        }
    }
}

/// Every server version the tests run against.
pub fn servers() -> Vec<String> {
    std::iter::once(nats_2_9_url()).chain(nats_latest_url()).collect()
}

/// Settings for tests: short timeouts, memory storage unless a test needs files.
pub fn test_config(url: &str) -> NatsConfig {
    NatsConfig {
        url: url.to_owned(),
        connect_timeout: Duration::from_secs(3),
        request_timeout: Duration::from_secs(3),
        ..NatsConfig::default()
    }
}

/// A prefix no other test uses.
pub fn unique_prefix(test: &str) -> String {
    format!("nt_{test}_{}", uuid::Uuid::new_v4().simple())
}

/// A connected bus on a fresh prefix whose streams are deleted when this is dropped.
pub struct TestBus {
    pub bus: NatsBus,
    pub prefix: String,
    url: String,
}

impl TestBus {
    pub async fn new(url: &str, test: &str) -> Self {
        Self::with_config(test_config(url), test).await
    }

    pub async fn with_config(config: NatsConfig, test: &str) -> Self {
        let prefix = unique_prefix(test);
        let bus = NatsBus::connect(&prefix, &config).await.unwrap_or_else(|err| {
            panic!("connecting to {} failed: {err:?} (run scripts/nats.sh to start the servers)", config.url)
        });
        Self { bus, prefix, url: config.url }
    }
}

impl Drop for TestBus {
    fn drop(&mut self) {
        self.bus.close();
        delete_streams(&self.url, self.bus.stream_names().to_vec());
    }
}

/// Deletes `streams` over a connection of its own, so it works from `Drop`, inside or outside
/// a runtime, and while panicking.
pub fn delete_streams(url: &str, streams: Vec<String>) {
    let url = url.to_owned();
    let cleanup = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async move {
            let Ok(client) = async_nats::connect(&url).await else { return };
            let js = async_nats::jetstream::new(client);
            for stream in streams {
                let _ = js.delete_stream(&stream).await;
            }
        });
    });
    let _ = cleanup.join();
}
