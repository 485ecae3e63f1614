//! [`error_chain`]: an error and its sources as one line, for logs, dead letters and results.

/// An error and its sources, `: `-separated, for one log field, a dead letter's reason or a
/// command's last line. A source whose text the previous message already contains is left
/// out: many errors (`reqwest`'s, or a `thiserror` variant writing `{source}`) include their
/// source in their own text, and printing it again doubles it
/// (`error sending request for url (…): error sending request for url (…)`).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut previous = error.to_string();
    let mut text = previous.clone();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !message.is_empty() && !previous.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        previous = message;
        source = cause.source();
    }
    text
}
