//! The one skeleton of every pipeline step: [`Reporting`] wraps a [`StepHandler`] (the step's
//! own work) into the worker's [`Handler`]. Per delivery it decodes the command (malformed →
//! dead letter), runs the step, reports the result through the [`StepReporter`] and says how
//! to settle the delivery (a report that could not be sent is retried).

use async_trait::async_trait;
use imagepipe_bus::Delivery;
use imagepipe_contracts::{StepCommand, decode};

use super::{Attempt, StepFailure, StepReporter};
use crate::control::CancelRegistry;
use crate::worker::{Handler, Outcome, error_chain};

/// A pipeline step's own work: from its command to its output, or how it failed.
#[async_trait]
pub trait StepHandler: Send + Sync + 'static {
    /// The command it consumes; its [`StepCommand::step`] is the step it runs.
    type Command: StepCommand;

    /// Runs one attempt of the step for `command`. Once it returns `Ok`, the output must be
    /// durable (blobs written): the success is announced right after.
    async fn process(&self, command: &Self::Command) -> Result<<Self::Command as StepCommand>::Output, StepFailure>;
}

/// The worker [`Handler`] of a [`StepHandler`] (see the module docs).
pub struct Reporting<H> {
    step: H,
    reporter: StepReporter,
    cancels: Option<CancelRegistry>,
}

/// The error code a step reports when an operator cancelled its task while it ran.
pub const CANCELLED: &str = "cancelled";

impl<H: StepHandler> Reporting<H> {
    /// `step`, reporting through `reporter`.
    pub fn new(step: H, reporter: StepReporter) -> Self {
        Self { step, reporter, cancels: None }
    }

    /// Registers every running step in `cancels`, so cancelling its task stops it at once: the
    /// step's work is dropped and the attempt reported as failed with code [`CANCELLED`] (the
    /// coordinator, which asked for it, then cancels the task).
    pub fn with_cancels(mut self, cancels: CancelRegistry) -> Self {
        self.cancels = Some(cancels);
        self
    }

    /// The step's own handler.
    pub fn step(&self) -> &H {
        &self.step
    }
}

#[async_trait]
impl<H: StepHandler> Handler for Reporting<H> {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let command: H::Command = match decode(&delivery.message.payload) {
            Ok(command) => command,
            Err(error) => return Outcome::reject(error),
        };
        let priority = imagepipe_contracts::lane_of(&delivery.source).1;
        let attempt = Attempt::of(&command).in_lane(priority).in_shard(super::report::command_shard(&delivery.message));
        let (task_id, step) = (attempt.task_id.as_str(), attempt.step);
        let running = self.cancels.as_ref().map(|c| c.register(task_id));
        if priority == imagepipe_contracts::Priority::High {
            crate::gate::cpu().note_high();
        }
        let work = crate::gate::with_priority(priority, self.step.process(&command));
        let processed = match &running {
            Some(running) => tokio::select! {
                processed = work => processed,
                () = running.cancelled() => {
                    tracing::info!(task_id, %step, "step stopped: its task was cancelled");
                    Err(StepFailure::retryable(CANCELLED, "the task was cancelled while the step ran"))
                }
            },
            None => work.await,
        };
        drop(running);
        let reported = match processed {
            Ok(output) => {
                tracing::info!(task_id, %step, attempt = attempt.attempt, "step succeeded");
                let (event, output) = command.announce(output);
                self.reporter.succeeded(&attempt, event, output).await
            }
            Err(StepFailure::Retryable { error, retry_after }) => {
                tracing::warn!(task_id, %step, %error, ?retry_after, "step failed; the coordinator retries it");
                self.reporter.retryable(&attempt, error, retry_after).await
            }
            Err(StepFailure::Permanent(error)) => {
                tracing::info!(task_id, %step, %error, "step failed permanently");
                self.reporter.permanent(&attempt, error).await
            }
            Err(StepFailure::Deferred { reason, retry_after }) => {
                tracing::debug!(task_id, %step, %reason, ?retry_after, "step deferred; the coordinator sends it again");
                self.reporter.deferred(&attempt, reason, retry_after).await
            }
        };
        match reported {
            Ok(()) => Outcome::Ack,
            Err(error) => Outcome::retry(format!("reporting the {step} step: {}", error_chain(&error))),
        }
    }
}
