//! The `imagepipe` command line's library: every service in one process, and the API client.
//!
//! - [`pipeline`]: [`Pipeline::start`] runs all seven services (coordinator, download, metadata
//!   and AI workers, notification, tag-indexer and analytics subscribers) on one bus with one
//!   HTTP server; used by `imagepipe run`, `imagepipe demo` and tests.
//! - [`client`]: the HTTP API client of the operator commands; [`sse`]: its event-stream parser.
//! - [`bench`]: `imagepipe bench`, the coordinator and the bus under load, measured.
//! - [`samples`]: the demo's photos; [`model`]: preparing the AI model for the demo.

pub mod bench;
pub mod client;
pub mod model;
pub mod pipeline;
pub mod samples;
pub mod sse;

pub use client::ApiClient;
pub use pipeline::{Pipeline, PipelineError};
