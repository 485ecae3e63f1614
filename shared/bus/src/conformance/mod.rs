//! The backend conformance suite: one set of behaviours every backend must show, written once
//! against [`Bus`] and run by each backend's test crate.
//!
//! A backend supplies a [`Harness`] (a fresh, isolated [`Bus`] per call, and the [`Timing`]
//! its broker needs) and expands [`conformance_suite!`](crate::conformance_suite) with it:
//!
//! ```ignore
//! struct Memory;
//!
//! #[imagepipe_bus::conformance::async_trait]
//! impl imagepipe_bus::conformance::Harness for Memory {
//!     fn name(&self) -> &str { "memory" }
//!     async fn bus(&self) -> imagepipe_bus::Bus { /* a bus with conformance::unique_prefix() */ }
//!     fn timing(&self) -> imagepipe_bus::conformance::Timing { imagepipe_bus::conformance::Timing::IN_PROCESS }
//! }
//!
//! imagepipe_bus::conformance_suite!(memory, Memory);
//! // or, naming the behaviours a backend cannot offer yet, and why:
//! imagepipe_bus::conformance_suite!(memory, Memory, skip { start_since_timestamp: "no timestamps" });
//! ```
//!
//! That makes `mod memory` with one `#[tokio::test]` per behaviour of [`cases`]; skipped ones
//! are `#[ignore = "why"]`, so the test runner lists them as skipped with the reason.
//!
//! The cases run in real time (a broker does not follow a paused tokio clock): timing-sensitive
//! ones scale with [`Timing`], and each case has [`CASE_LIMIT`] to finish.

pub mod cases;
mod suite;
mod support;

use std::future::Future;
use std::time::Duration;

pub use async_trait::async_trait;

use crate::bus::Bus;

/// The most time one case may take before it fails as hung.
pub const CASE_LIMIT: Duration = Duration::from_secs(30);

/// How a backend is set up for the suite.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// The backend's name, for failure messages.
    fn name(&self) -> &str;

    /// A connected bus whose prefix no other call returned (see [`unique_prefix`]), so cases
    /// run in parallel and on a broker holding old data. Panics when the backend is unreachable.
    async fn bus(&self) -> Bus;

    /// The durations the cases use with this backend.
    fn timing(&self) -> Timing {
        Timing::default()
    }
}

/// Durations the timing-sensitive cases use, so a real broker can run them in real time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The consumers' ack deadline.
    pub ack_wait: Duration,
    /// The delay of a delayed nack.
    pub nack_delay: Duration,
    /// How long to watch for deliveries that must not come, once the backend had time to send
    /// them. Must be under half of `ack_wait`.
    pub settle: Duration,
}

impl Timing {
    /// For in-process backends.
    pub const IN_PROCESS: Timing = Timing {
        ack_wait: Duration::from_millis(500),
        nack_delay: Duration::from_millis(300),
        settle: Duration::from_millis(100),
    };

    /// For brokers over the network (the default): whole-second deadlines, as brokers round
    /// their timers.
    pub const BROKER: Timing = Timing {
        ack_wait: Duration::from_secs(1),
        nack_delay: Duration::from_secs(1),
        settle: Duration::from_millis(300),
    };
}

impl Default for Timing {
    fn default() -> Self {
        Self::BROKER
    }
}

/// A fresh bus prefix: `ct_` and a random UUID.
pub fn unique_prefix() -> String {
    format!("ct_{}", uuid::Uuid::new_v4().simple())
}

/// Runs one case against `harness`, failing it when it takes longer than [`CASE_LIMIT`]
/// (used by [`conformance_suite!`](crate::conformance_suite)).
pub async fn run(harness: &dyn Harness, case: &str, test: impl Future<Output = ()>) {
    let timing = harness.timing();
    assert!(
        timing.settle * 2 < timing.ack_wait,
        "{} harness: Timing.settle ({:?}) must be under half of ack_wait ({:?})",
        harness.name(),
        timing.settle,
        timing.ack_wait
    );
    if tokio::time::timeout(CASE_LIMIT, test).await.is_err() {
        panic!("conformance case {case} on {} did not finish within {CASE_LIMIT:?}", harness.name());
    }
}
