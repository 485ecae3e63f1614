//! [`run_step`]: the one way a stage worker runs its step: consume every priority lane of its
//! queue, follow the operator controls of the queue, stop a step whose task is cancelled, and
//! report each attempt.

use std::sync::Arc;

use imagepipe_bus::{Bus, BusError};

use super::{Reporting, StepHandler, StepReporter};
use crate::Settings;
use crate::clock::SystemClock;
use crate::control::{self, Control, ControlError};
use crate::shutdown::Shutdown;
use crate::worker::{LoopConfig, Worker, WorkerError, consume_lanes};

/// Why a stage worker stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum StepRunError {
    /// The queue's consumers could not be opened.
    #[error("opening the consumers of {queue}")]
    Consume {
        /// The stage queue.
        queue: String,
        /// Why.
        #[source]
        source: BusError,
    },
    /// The control state could not be reached.
    #[error("connecting to the control state")]
    Control(#[source] ControlError),
    /// The worker loop stopped with an error.
    #[error("running the worker of {queue}")]
    Worker {
        /// The stage queue.
        queue: String,
        /// Why.
        #[source]
        source: WorkerError,
    },
}

/// Runs `step` on the stage queue `queue` of `bus` until `shutdown` fires and its in-flight
/// attempts are finished, publishing as `service` (see the module docs).
pub async fn run_step<H: StepHandler>(
    bus: Bus,
    settings: &Settings,
    queue: &str,
    service: &str,
    step: H,
    shutdown: Shutdown,
) -> Result<(), StepRunError> {
    let consumer = consume_lanes(&bus, queue, &settings.worker)
        .await
        .map_err(|source| StepRunError::Consume { queue: queue.to_owned(), source })?;
    let control = Control::new(control::connect(settings).await.map_err(StepRunError::Control)?, queue);
    let handler =
        Reporting::new(step, StepReporter::new(bus, service, Arc::new(SystemClock))).with_cancels(control.cancels());
    let config = LoopConfig::from_settings(queue, &settings.worker);
    Worker::new(consumer, handler, config)
        .controlled(control)
        .run(shutdown)
        .await
        .map_err(|source| StepRunError::Worker { queue: queue.to_owned(), source })
}
