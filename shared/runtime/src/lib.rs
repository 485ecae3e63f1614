//! What every imagepipe service runs on.

pub mod backoff;
pub mod clock;
pub mod config;
pub mod shutdown;
pub mod telemetry;

pub use config::{ConfigArgs, ConfigError, Settings};
