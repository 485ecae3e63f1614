//! What every imagepipe service runs on: one configuration schema ([`config`]), logs and
//! traces ([`telemetry`]), Prometheus metrics ([`metrics`]) and the health server ([`http`]),
//! the shutdown signal ([`shutdown`]), retry delays ([`backoff`]), batched clean-ups ([`batches`]), connecting with retries at
//! start ([`connect`]), operator control state ([`control`]), the Redis connection of every Redis user, to one server or a
//! cluster ([`redis_connection`]), time ([`clock`]), memory
//! budgets for decoding ([`budget`]), the embedded store's files ([`embedded`]), event
//! subscribers with their dedup ([`dedup`]), the worker loop ([`worker`]) and the start-up that ties them together
//! ([`service`]).

pub mod backoff;
pub mod batches;
pub mod budget;
pub mod clock;
pub mod config;
pub mod connect;
pub mod control;
pub mod dedup;
pub mod embedded;
pub mod error_text;
pub mod gate;
pub mod http;
pub mod metrics;
pub mod redis_connection;
pub mod service;
pub mod shutdown;
pub mod step;
pub mod telemetry;
pub mod worker;

pub use config::{ConfigArgs, ConfigError, Settings};
pub use service::Service;
pub use shutdown::Shutdown;
pub use worker::{Handler, LoopConfig, Outcome, Worker, error_chain};
