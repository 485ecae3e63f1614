//! The pipeline steps' seam: what the download, metadata and AI workers share.
//!
//! - [`StepHandler`]: a step's own work, command in, output or [`StepFailure`] out.
//! - [`Reporting`]: the one worker [`Handler`](crate::Handler) around any step handler:
//!   decode, process, report, settle.
//! - [`StepFailure`] and the blob store's failures with their [`codes`].
//! - [`StepReporter`]: the step's event and result on the bus.

mod failure;
mod handler;
mod report;
mod serve;

pub use failure::{StepFailure, blob_code, codes, with_blob};
pub use handler::{CANCELLED, Reporting, StepHandler};
pub use report::{Attempt, StepReporter, command_shard, event_message, outgoing};
pub use serve::{StepRunError, run_step};
