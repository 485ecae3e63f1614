//! Pull requests answered on an inbox the caller keeps: opening the inbox, and what each
//! message arriving on it says about the request ([`answer`]). Shared by the consumer of a
//! queue or group and the pullers of partitions.

use async_nats::{Client, StatusCode, Subject, Subscriber};

/// An inbox subscription that answers to pull requests come back on.
pub(crate) struct Inbox {
    pub(crate) subject: Subject,
    pub(crate) subscriber: Subscriber,
}

impl Inbox {
    /// A new inbox of `client`, subscribed.
    pub(crate) async fn open(client: &Client) -> Result<Self, async_nats::SubscribeError> {
        let subject = Subject::from(client.new_inbox());
        let subscriber = client.subscribe(subject.clone()).await?;
        Ok(Self { subject, subscriber })
    }
}

/// What one message on a pull request's inbox says.
pub(crate) enum Answer {
    /// A message of the consumer.
    Message(async_nats::Message),
    /// The server is still there; nothing to do.
    Heartbeat,
    /// The request ended: nothing more was there, or it expired.
    Ended,
    /// The server ended the request with an error (the reason).
    Refused(String),
}

/// Classifies `message`, which arrived on a pull request's inbox.
pub(crate) fn answer(message: async_nats::Message) -> Answer {
    match message.status {
        None | Some(StatusCode::OK) => Answer::Message(message),
        Some(StatusCode::IDLE_HEARTBEAT) => Answer::Heartbeat,
        Some(StatusCode::TIMEOUT | StatusCode::NOT_FOUND) => Answer::Ended,
        Some(status) => Answer::Refused(format!(
            "the server ended the pull request: {status} {}",
            message.description.unwrap_or_default()
        )),
    }
}
