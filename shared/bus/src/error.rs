//! Errors of bus operations, each naming where it happened.

use std::time::Duration;

/// Any underlying client error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A bus operation that failed. Variants carry the destination involved and the client's
/// error as `source`.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// Could not reach the broker.
    #[error("connecting to {url}")]
    Connect {
        /// Broker address.
        url: String,
        /// Client error.
        #[source]
        source: BoxError,
    },
    /// Creating or updating a stream, topic or consumer failed.
    #[error("setting up {what}")]
    Setup {
        /// What was being set up (`stream imagepipe_tasks`, `consumer tasks_download`).
        what: String,
        /// Client error.
        #[source]
        source: BoxError,
    },
    /// The broker did not confirm a publish.
    #[error("publishing to {destination}")]
    Publish {
        /// Subject or topic.
        destination: String,
        /// Client error.
        #[source]
        source: BoxError,
    },
    /// Fetching deliveries failed.
    #[error("receiving from {source_name}")]
    Receive {
        /// Queue or group.
        source_name: String,
        /// Client error.
        #[source]
        source: BoxError,
    },
    /// Settling a delivery (ack, nack, progress, terminate) failed; the broker will redeliver.
    #[error("{action} of message {message} from {source_name}")]
    Settle {
        /// `ack`, `nack`, `progress` or `terminate`.
        action: &'static str,
        /// Backend's message position (stream sequence, offset).
        message: String,
        /// Queue or group.
        source_name: String,
        /// Client error.
        #[source]
        source: BoxError,
    },
    /// A bounded queue stayed full for the whole wait.
    #[error("{destination} is full; gave up after {waited:?}")]
    Full {
        /// Queue or group.
        destination: String,
        /// How long the send waited for room.
        waited: Duration,
    },
    /// The message is larger than the bus carries (`bus.max_message_bytes`, or the broker's
    /// own limit); sending it again cannot succeed.
    #[error("a message of {size} bytes is larger than the {max} bytes {destination} takes")]
    TooLarge {
        /// Queue or event type.
        destination: String,
        /// The message's size: body, headers, key and id.
        size: usize,
        /// The limit it broke.
        max: usize,
    },
    /// Asking the broker what it holds (streams, consumers, offsets) failed.
    #[error("asking the broker about {what}")]
    Inspect {
        /// What was asked about (`consumer tasks_download`, `the streams`).
        what: String,
        /// Client error.
        #[source]
        source: BoxError,
    },
    /// The request itself is invalid (bad name, bad selector, bad config).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The bus was shut down.
    #[error("the bus is closed")]
    Closed,
}
