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
