//! What one event adds to the statistics: an [`Update`], read from the event by
//! [`Update::from_event`], and the task stages and latency [`Span`]s it is measured on.

use imagepipe_contracts::payload::{ImageDownloaded, TaskFailed};
use imagepipe_contracts::{DecodeError, Event, EventType};
use serde_json::Value;

/// A point in a task's life whose time is the timestamp of the event that reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// `task.created`.
    Created,
    /// `image.downloaded`.
    Downloaded,
    /// `image.metadata_extracted`.
    MetadataExtracted,
    /// `image.analyzed`.
    Analyzed,
    /// `task.completed`.
    Completed,
}

impl Stage {
    /// Every stage, in pipeline order.
    pub const ALL: [Stage; 5] =
        [Self::Created, Self::Downloaded, Self::MetadataExtracted, Self::Analyzed, Self::Completed];

    /// The stage an event type reports, if any.
    pub fn of(event_type: EventType) -> Option<Self> {
        Self::ALL.into_iter().find(|stage| stage.event_type() == event_type)
    }

    /// The event type reporting it.
    pub const fn event_type(self) -> EventType {
        match self {
            Self::Created => EventType::TaskCreated,
            Self::Downloaded => EventType::ImageDownloaded,
            Self::MetadataExtracted => EventType::ImageMetadataExtracted,
            Self::Analyzed => EventType::ImageAnalyzed,
            Self::Completed => EventType::TaskCompleted,
        }
    }

    /// Its name (a field of the per-task state).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Downloaded => "downloaded",
            Self::MetadataExtracted => "metadata_extracted",
            Self::Analyzed => "analyzed",
            Self::Completed => "completed",
        }
    }
}

/// A measured latency: from one stage to a later one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Span {
    /// `task.created` → `image.downloaded`.
    Download,
    /// `image.downloaded` → `image.metadata_extracted`.
    Metadata,
    /// `image.metadata_extracted` → `image.analyzed`.
    Analysis,
    /// `image.analyzed` → `task.completed`.
    Completion,
    /// `task.created` → `task.completed`.
    EndToEnd,
}

impl Span {
    /// Every span.
    pub const ALL: [Span; 5] = [Self::Download, Self::Metadata, Self::Analysis, Self::Completion, Self::EndToEnd];

    /// Its name in `/v1/stats`, the store and the `span` metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Download => "download",
            Self::Metadata => "metadata",
            Self::Analysis => "analysis",
            Self::Completion => "completion",
            Self::EndToEnd => "end_to_end",
        }
    }

    /// The span named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|span| span.as_str() == name)
    }

    /// Where it starts and ends.
    pub const fn stages(self) -> (Stage, Stage) {
        match self {
            Self::Download => (Stage::Created, Stage::Downloaded),
            Self::Metadata => (Stage::Downloaded, Stage::MetadataExtracted),
            Self::Analysis => (Stage::MetadataExtracted, Stage::Analyzed),
            Self::Completion => (Stage::Analyzed, Stage::Completed),
            Self::EndToEnd => (Stage::Created, Stage::Completed),
        }
    }

    /// The spans that start or end at `stage`.
    pub fn touching(stage: Stage) -> impl Iterator<Item = Span> {
        Self::ALL.into_iter().filter(move |span| {
            let (from, to) = span.stages();
            from == stage || to == stage
        })
    }

    /// Its latency given the two stage times: `to - from`, 0 when clocks disagree.
    pub fn latency(from_ms: u64, to_ms: u64) -> u64 {
        to_ms.saturating_sub(from_ms)
    }
}

/// How a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskOutcome {
    /// `task.completed`.
    Completed,
    /// `task.failed`.
    Failed,
    /// `task.cancelled`.
    Cancelled,
}

impl TaskOutcome {
    /// Every outcome.
    pub const ALL: [TaskOutcome; 3] = [Self::Completed, Self::Failed, Self::Cancelled];

    /// The outcome an event type reports, if it ends a task.
    pub fn of(event_type: EventType) -> Option<Self> {
        match event_type {
            EventType::TaskCompleted => Some(Self::Completed),
            EventType::TaskFailed => Some(Self::Failed),
            EventType::TaskCancelled => Some(Self::Cancelled),
            _ => None,
        }
    }

    /// Its name in `/v1/stats`, the store and the `outcome` metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The outcome named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|outcome| outcome.as_str() == name)
    }
}

/// What one event adds: counters, and the time of the task stage it reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// The event's id, by which a redelivered event is recognised.
    pub event_id: String,
    /// The event's type.
    pub event_type: EventType,
    /// The task it belongs to; `None` for a queue event (`queue.paused`, `queue.resumed`), which
    /// reports no stage and ends no task: it only counts.
    pub task_id: Option<String>,
    /// The event's timestamp, Unix ms.
    pub timestamp: u64,
    /// The stage it reports, if any.
    pub stage: Option<Stage>,
    /// How the task ended, for a terminal event.
    pub outcome: Option<TaskOutcome>,
    /// The downloaded image's format (`image.downloaded`), as a bounded label.
    pub format: Option<String>,
    /// Bytes downloaded (`image.downloaded`), else 0.
    pub bytes: u64,
    /// Why the task failed (`task.failed`): its error's code, at most [`MAX_CODE_LEN`] bytes.
    pub failure_code: Option<String>,
}

/// Longest format name kept as it is; longer or odd names count as [`OTHER_FORMAT`].
const MAX_FORMAT_LEN: usize = 16;
/// The format counted for names that are not short lowercase alphanumerics.
pub const OTHER_FORMAT: &str = "other";

/// Longest failure code kept (bytes); a longer one is cut there (at a character boundary), so
/// a strange payload cannot make the stored codes large.
pub const MAX_CODE_LEN: usize = 64;
/// The code counted for a failure whose error has an empty code.
pub const UNKNOWN_CODE: &str = "unknown";

/// An event lacked what the statistics need.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// A pipeline event without a `taskId`.
    #[error("{0} without a taskId")]
    NoTaskId(EventType),
    /// The payload did not match its event type.
    #[error(transparent)]
    Payload(#[from] DecodeError),
}

impl Update {
    /// Reads what `event` adds.
    pub fn from_event(event: Event<Value>) -> Result<Self, UpdateError> {
        let event_type = event.event_type;
        let event_id = event.event_id.to_string();
        let queue_event = matches!(event_type, EventType::QueuePaused | EventType::QueueResumed);
        let task_id = match event.task_id.clone() {
            None if !queue_event => return Err(UpdateError::NoTaskId(event_type)),
            task_id => task_id,
        };
        let timestamp = event.timestamp;
        let (mut format, mut bytes, mut failure_code) = (None, 0, None);
        match event_type {
            EventType::ImageDownloaded => {
                let image = event.into_typed::<ImageDownloaded>()?.payload.image;
                (format, bytes) = (Some(format_label(&image.format)), image.size);
            }
            EventType::TaskFailed => {
                failure_code = Some(code_label(&event.into_typed::<TaskFailed>()?.payload.error.code));
            }
            _ => {}
        }
        Ok(Self {
            event_id,
            event_type,
            task_id,
            timestamp,
            stage: Stage::of(event_type),
            outcome: TaskOutcome::of(event_type),
            format,
            bytes,
            failure_code,
        })
    }

    /// Whether the task's stage times can be forgotten once this event is recorded: it failed
    /// or was cancelled, so no later stage comes. (A completed task's times are forgotten once
    /// every stage is known.)
    pub fn ends_measurement(&self) -> bool {
        matches!(self.outcome, Some(TaskOutcome::Failed | TaskOutcome::Cancelled))
    }
}

/// `format` lowercased when it is a short alphanumeric name, else [`OTHER_FORMAT`], so a
/// strange payload cannot grow the counters or metric labels without bound.
fn format_label(format: &str) -> String {
    let format = format.trim().to_ascii_lowercase();
    if !format.is_empty() && format.len() <= MAX_FORMAT_LEN && format.bytes().all(|b| b.is_ascii_alphanumeric()) {
        format
    } else {
        OTHER_FORMAT.to_owned()
    }
}

/// `code` trimmed and cut at [`MAX_CODE_LEN`] bytes, or [`UNKNOWN_CODE`] when empty.
fn code_label(code: &str) -> String {
    let code = code.trim();
    if code.is_empty() {
        return UNKNOWN_CODE.to_owned();
    }
    let mut end = code.len().min(MAX_CODE_LEN);
    while !code.is_char_boundary(end) {
        end -= 1;
    }
    code[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_span_joins_two_stages_in_pipeline_order() {
        for span in Span::ALL {
            let (from, to) = span.stages();
            assert!(from < to, "{span:?}");
            assert_eq!(Span::parse(span.as_str()), Some(span));
        }
        let touching: Vec<_> = Span::touching(Stage::Created).collect();
        assert_eq!(touching, [Span::Download, Span::EndToEnd]);
        assert_eq!(Span::latency(1_000, 1_250), 250);
        assert_eq!(Span::latency(1_250, 1_000), 0, "a clock running backwards is not a negative latency");
    }

    #[test]
    fn formats_are_bounded_labels() {
        assert_eq!(format_label("JPEG"), "jpeg");
        assert_eq!(format_label("webp"), "webp");
        assert_eq!(format_label(""), OTHER_FORMAT);
        assert_eq!(format_label("x/../y"), OTHER_FORMAT);
        assert_eq!(format_label(&"a".repeat(17)), OTHER_FORMAT);
    }

    #[test]
    fn failure_codes_are_cut_at_64_bytes_on_a_character_boundary() {
        assert_eq!(code_label("http_404"), "http_404");
        assert_eq!(code_label("  timeout "), "timeout");
        assert_eq!(code_label(""), UNKNOWN_CODE);
        assert_eq!(code_label(&"x".repeat(200)), "x".repeat(64));
        let accented = format!("{}é", "x".repeat(63));
        assert_eq!(code_label(&accented), "x".repeat(63), "é would straddle byte 64");
        assert_eq!(code_label(&"é".repeat(40)).len(), 64);
    }

    #[test]
    fn a_failed_task_carries_its_error_code() {
        use imagepipe_contracts::{Step, StepError, TraceId};
        let payload = TaskFailed {
            step: Step::Download,
            attempt: 2,
            error: StepError::new("http_404", "not found"),
            callback_url: None,
            labels: Default::default(),
        };
        let json = Event::for_task("t1", 2, TraceId::random(), 5_000, "coordinator", payload).to_json();
        let update = Update::from_event(Event::from_json(&json).unwrap()).unwrap();
        assert_eq!(update.failure_code.as_deref(), Some("http_404"));
        assert_eq!(update.outcome, Some(TaskOutcome::Failed));
        assert_eq!(TaskOutcome::parse("failed"), Some(TaskOutcome::Failed));
        assert_eq!(TaskOutcome::parse("lost"), None);
    }
}
