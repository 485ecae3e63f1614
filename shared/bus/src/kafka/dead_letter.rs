//! Writing a dead letter: the original message and headers, plus why, how often it was
//! delivered, where from and when, on `<prefix>.dlq.<queue>` (`dlq.events.<group>` for groups).

use std::time::{SystemTime, UNIX_EPOCH};

use imagepipe_contracts::names::headers;

use super::Shared;
use crate::error::BusError;
use crate::message::Message;

/// Longest reason kept in the header (the rest is cut, marked with `…`).
const MAX_REASON_BYTES: usize = 4096;

/// Sends the dead letter of `message`, delivered from `source` (a queue or subscriber group),
/// to `dlq_topic` and returns once the broker has it.
pub(crate) async fn write(
    shared: &Shared,
    source: &str,
    dlq_topic: &str,
    message: &Message,
    delivery_count: u32,
    reason: &str,
) -> Result<(), BusError> {
    let reason = bounded(reason, MAX_REASON_BYTES);
    let count = delivery_count.to_string();
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis().to_string();
    let extra = [
        (headers::DLQ_REASON, reason.as_str()),
        (headers::DLQ_DELIVERY_COUNT, count.as_str()),
        (headers::DLQ_SOURCE, source),
        (headers::DLQ_TIMESTAMP, now_ms.as_str()),
    ];
    shared.send(dlq_topic, message, None, &extra).await?;
    tracing::warn!(
        source,
        dead_letter_topic = dlq_topic,
        delivery_count,
        reason = %reason,
        "message dead-lettered"
    );
    Ok(())
}

/// `text` cut to at most `max` bytes (on a character boundary), marked with `…` when cut.
fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_reasons_are_cut_on_a_character_boundary() {
        assert_eq!(bounded("short", 10), "short");
        assert_eq!(bounded("ééé", 3), "é…");
    }
}
