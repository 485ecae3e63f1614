//! [`error_chain`]: an error and its sources as one line, for logs, dead letters and results.

/// An error and its sources, `: `-separated, for one log field, a dead letter's reason or a
/// command's last line. A source whose text the line already contains is left out: many
/// errors (`reqwest`'s, or a `thiserror` variant writing `{source}`) include their
/// source in their own text, and printing it again doubles it
/// (`error sending request for url (…): error sending request for url (…)`).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !message.is_empty() && !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    /// An error with `text` caused by `source`.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn a_cause_already_said_anywhere_in_the_line_is_left_out() {
        // reqwest's error for a request with a body: its own text comes back under hyper's.
        let inner = Layer("error sending request for url (http://h/v1/blobs)", None);
        let hyper = Layer("client error (SendRequest)", Some(Box::new(inner)));
        let outer = Layer("error sending request for url (http://h/v1/blobs)", Some(Box::new(hyper)));
        let top = Layer("uploading a.jpg", Some(Box::new(outer)));
        assert_eq!(
            error_chain(&top),
            "uploading a.jpg: error sending request for url (http://h/v1/blobs): client error (SendRequest)"
        );
    }
}
