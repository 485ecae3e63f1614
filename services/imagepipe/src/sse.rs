//! A Server-Sent Events parser for `imagepipe watch` (the subset `/v1/events` sends: `event`,
//! `id`, `data`, comments).

/// One event of the stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event` field (`message` when absent).
    pub event: String,
    /// The `id` field.
    pub id: Option<String>,
    /// The `data` lines, joined by `\n`.
    pub data: String,
}

/// Turns chunks of a `text/event-stream` body into events; chunks may split lines anywhere.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    event: Option<String>,
    id: Option<String>,
    data: Option<String>,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds `chunk` and returns the events it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &byte in chunk {
            if byte == b'\n' {
                let line = std::mem::take(&mut self.line);
                let line = String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(&line)).into_owned();
                if let Some(event) = self.line_done(&line) {
                    events.push(event);
                }
            } else {
                self.line.push(byte);
            }
        }
        events
    }

    fn line_done(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let data = self.data.take()?;
            return Some(SseEvent {
                event: self.event.take().unwrap_or_else(|| "message".to_owned()),
                id: self.id.take(),
                data,
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.event = Some(value.to_owned()),
            "id" => self.id = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_and_comments_are_parsed() {
        let mut parser = SseParser::new();
        let stream = ": keep-alive\n\nevent: task.completed\r\nid: e1\ndata: {\"a\":\ndata: 1}\n\ndata: plain\n\n";
        let mut events = Vec::new();
        for chunk in stream.as_bytes().chunks(5) {
            events.extend(parser.push(chunk));
        }
        assert_eq!(
            events,
            vec![
                SseEvent { event: "task.completed".into(), id: Some("e1".into()), data: "{\"a\":\n1}".into() },
                SseEvent { event: "message".into(), id: None, data: "plain".into() },
            ]
        );
    }
}
