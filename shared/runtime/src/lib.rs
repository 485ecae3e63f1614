//! What every imagepipe service runs on.

pub mod config;

pub use config::{ConfigArgs, ConfigError, Settings};
