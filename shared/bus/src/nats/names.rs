//! Subjects, stream names and consumer names derived from `bus.prefix` and logical names.
//!
//! Subjects are `<prefix>.` + the logical name (`imagepipe.tasks.download`), events are
//! `<prefix>.events.<eventType>`, dead letters `<prefix>.dlq.<queue>`. Stream and consumer
//! names cannot contain dots, so they replace them with `_` (`IMAGEPIPE_TASKS`,
//! `tasks_download`); two names that collide that way are caught at setup through the
//! stream subjects and the consumer description. Partition `p` of a task queue is the subject
//! `<prefix>.<queue>.<p>` with the consumer `<queue consumer>_p<p>`; so that no queue's subject
//! is a partition's, queue names do not end in a number.

use imagepipe_contracts::names::{DLQ, topics};

use crate::error::BusError;

/// First token of every task queue name (`tasks.download`).
const TASKS: &str = "tasks";

/// Which stream a queue name lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueKind {
    /// `tasks.*`: the work-queue stream.
    Tasks,
    /// `dlq.*`: the dead-letter stream.
    DeadLetters,
}

/// Every name the backend derives from one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    prefix: String,
    stream_base: String,
}

impl Names {
    pub(crate) fn new(prefix: &str) -> Self {
        Self { prefix: prefix.to_owned(), stream_base: sanitize(prefix).to_ascii_uppercase() }
    }

    /// The work-queue stream of task queues.
    pub(crate) fn tasks_stream(&self) -> String {
        format!("{}_TASKS", self.stream_base)
    }

    /// The limits stream of events.
    pub(crate) fn events_stream(&self) -> String {
        format!("{}_EVENTS", self.stream_base)
    }

    /// The limits stream of dead letters.
    pub(crate) fn dlq_stream(&self) -> String {
        format!("{}_DLQ", self.stream_base)
    }

    /// Subjects captured by the work-queue stream.
    pub(crate) fn tasks_subjects(&self) -> String {
        format!("{}.{TASKS}.>", self.prefix)
    }

    /// The prefix whose task stream captures `subjects` (`imagepipe.tasks.>` → `imagepipe`).
    pub(crate) fn prefix_of_tasks_subjects(subjects: &str) -> Option<&str> {
        subjects.strip_suffix(".>")?.strip_suffix(TASKS)?.strip_suffix('.').filter(|prefix| !prefix.is_empty())
    }

    /// Subjects captured by the events stream.
    pub(crate) fn events_subjects(&self) -> String {
        format!("{}.{}.>", self.prefix, topics::EVENTS)
    }

    /// Subjects captured by the dead-letter stream.
    pub(crate) fn dlq_subjects(&self) -> String {
        format!("{}.{DLQ}.>", self.prefix)
    }

    /// The subject of a queue (`tasks.download` or `dlq.tasks.download`) after checking its name.
    pub(crate) fn queue_subject(&self, queue: &str) -> Result<(QueueKind, String), BusError> {
        if !crate::config::is_valid_name(queue) {
            return Err(BusError::Invalid(format!(
                "queue name {queue:?} must be dot-separated tokens of [A-Za-z0-9_-]"
            )));
        }
        let kind = match queue.split('.').next() {
            Some(TASKS) if queue.len() > TASKS.len() => QueueKind::Tasks,
            Some(DLQ) if queue.len() > DLQ.len() => QueueKind::DeadLetters,
            _ => {
                return Err(BusError::Invalid(format!(
                    "queue name {queue:?} must start with `{TASKS}.` (task queues) or `{DLQ}.` (dead letters)"
                )));
            }
        };
        if queue.rsplit('.').next().is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit())) {
            return Err(BusError::Invalid(format!(
                "queue name {queue:?} must not end in a number: `<queue>.<number>` is the subject of a partition"
            )));
        }
        Ok((kind, format!("{}.{queue}", self.prefix)))
    }

    /// The subject of partition `partition` of task queue `queue` (`imagepipe.tasks.results.17`),
    /// after checking the name. Dead-letter queues have no partitions.
    pub(crate) fn partition_subject(&self, queue: &str, partition: u16) -> Result<String, BusError> {
        match self.queue_subject(queue)? {
            (QueueKind::Tasks, subject) => Ok(format!("{subject}.{partition}")),
            (QueueKind::DeadLetters, _) => {
                Err(BusError::Invalid(format!("{queue}: a dead-letter queue has no partitions")))
            }
        }
    }

    /// The subject of an event type after checking it (`task.completed`).
    pub(crate) fn event_subject(&self, event_type: &str) -> Result<String, BusError> {
        if !crate::selector::is_valid_event_type(event_type) {
            return Err(BusError::Invalid(format!(
                "event type {event_type:?} must be dot-separated tokens of [a-z0-9_]"
            )));
        }
        Ok(format!("{}.{}.{event_type}", self.prefix, topics::EVENTS))
    }

    /// The subject filter that covers an event-type pattern (`image.*`, or `>` for all).
    pub(crate) fn event_filter(&self, pattern: &str) -> String {
        format!("{}.{}.{pattern}", self.prefix, topics::EVENTS)
    }

    /// The event type carried by an event subject, if it is one of ours.
    pub(crate) fn event_type_of<'a>(&self, subject: &'a str) -> Option<&'a str> {
        subject.strip_prefix(self.prefix.as_str())?.strip_prefix('.')?.strip_prefix(topics::EVENTS)?.strip_prefix('.')
    }

    /// The subject a dead-letter queue name (`dlq.tasks.download`) maps to.
    pub(crate) fn dlq_subject(&self, dead_letter_queue: &str) -> String {
        format!("{}.{dead_letter_queue}", self.prefix)
    }
}

/// A consumer name for a logical queue or group name (`tasks.download` → `tasks_download`).
pub(crate) fn durable_name(logical: &str) -> String {
    sanitize(logical)
}

/// The consumer name of partition `partition` of queue `queue`: the queue's own consumer name
/// and `_p<partition>` (`tasks.results`, 17 → `tasks_results_p17`).
pub(crate) fn partition_durable(queue: &str, partition: u16) -> String {
    format!("{}_p{partition}", durable_name(queue))
}

/// The partition whose consumer is `durable`, if it is one of `queue`'s (see
/// [`partition_durable`]).
pub(crate) fn partition_of_durable(queue: &str, durable: &str) -> Option<u16> {
    let digits = durable.strip_prefix(&durable_name(queue))?.strip_prefix("_p")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The name of a consumer reading a group of `queue`'s partitions through one filter subject
/// each (NATS 2.10+): the queue's own consumer name, `_g` and `unique` (one per opening, so a
/// group never reuses another's delivery state).
pub(crate) fn group_durable(queue: &str, unique: &str) -> String {
    format!("{}_g{unique}", durable_name(queue))
}

/// Whether `durable` reads partitions of `queue`: a partition's own consumer
/// ([`partition_durable`]) or a group's ([`group_durable`]).
pub(crate) fn reads_partitions_of(queue: &str, durable: &str) -> bool {
    partition_of_durable(queue, durable).is_some()
        || durable
            .strip_prefix(&durable_name(queue))
            .and_then(|rest| rest.strip_prefix("_g"))
            .is_some_and(|u| !u.is_empty() && u.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The partition a message of a partition's subject (`<queue subject>.<p>`) belongs to.
pub(crate) fn partition_of_subject(subject: &str) -> Option<u16> {
    let digits = subject.rsplit('.').next()?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// The narrowest single subject pattern that matches every pattern given: equal tokens are
/// kept, differing tokens become `*`, and patterns of different lengths end in `>`. NATS 2.9
/// filters a consumer by one subject, so a selector of several patterns is filtered to this
/// and the rest is done client-side.
pub(crate) fn covering_pattern(patterns: &[String]) -> String {
    if patterns.iter().any(|p| p == ">") || patterns.is_empty() {
        return ">".into();
    }
    let split: Vec<Vec<&str>> = patterns.iter().map(|p| p.split('.').collect()).collect();
    let min_len = split.iter().map(Vec::len).min().unwrap_or(0);
    let same_len = split.iter().all(|tokens| tokens.len() == min_len);
    let mut out = Vec::with_capacity(min_len);
    for i in 0..min_len {
        if !same_len && i == min_len - 1 {
            out.push(">");
            break;
        }
        let first = split[0][i];
        out.push(if split.iter().all(|tokens| tokens[i] == first) { first } else { "*" });
    }
    out.join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cover(patterns: &[&str]) -> String {
        covering_pattern(&patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn covering_pattern_is_the_narrowest_single_filter() {
        assert_eq!(cover(&["task.completed"]), "task.completed");
        assert_eq!(cover(&["task.completed", "task.failed"]), "task.*");
        assert_eq!(cover(&["image.*", "task.failed"]), "*.*");
        assert_eq!(cover(&["a.b", "a.b.c"]), "a.>");
        assert_eq!(cover(&["a", "a.b"]), ">");
        assert_eq!(cover(&[">", "a"]), ">");
    }

    /// NATS subject matching: `*` is one token, a final `>` one or more.
    fn subject_matches(filter: &str, subject: &str) -> bool {
        let (mut f, mut s) = (filter.split('.'), subject.split('.'));
        loop {
            match (f.next(), s.next()) {
                (Some(">"), Some(_)) => return true,
                (Some("*"), Some(_)) => {}
                (Some(a), Some(b)) if a == b => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    #[test]
    fn covering_pattern_matches_everything_its_patterns_match() {
        let cases = [vec!["task.completed", "task.failed"], vec!["a.b", "a.b.c", "x.y"], vec!["image.*", "image.x.y"]];
        for patterns in cases {
            let cover = cover(&patterns);
            for p in &patterns {
                let concrete = p.replace('*', "any");
                assert!(subject_matches(&cover, &concrete), "{cover} does not cover {concrete}");
            }
        }
        assert!(!subject_matches("task.*", "image.downloaded"));
    }

    #[test]
    fn names_derive_from_the_prefix() {
        let names = Names::new("imagepipe");
        assert_eq!(names.tasks_stream(), "IMAGEPIPE_TASKS");
        assert_eq!(names.events_stream(), "IMAGEPIPE_EVENTS");
        assert_eq!(names.dlq_stream(), "IMAGEPIPE_DLQ");
        assert_eq!(
            names.queue_subject("tasks.download").unwrap(),
            (QueueKind::Tasks, "imagepipe.tasks.download".into())
        );
        assert_eq!(
            names.queue_subject("dlq.tasks.download").unwrap(),
            (QueueKind::DeadLetters, "imagepipe.dlq.tasks.download".into())
        );
        assert_eq!(names.event_subject("task.completed").unwrap(), "imagepipe.events.task.completed");
        assert_eq!(names.event_type_of("imagepipe.events.task.completed"), Some("task.completed"));
        assert_eq!(names.event_type_of("other.events.task.completed"), None);
        assert_eq!(Names::new("test.run-1").tasks_stream(), "TEST_RUN-1_TASKS");
        assert_eq!(durable_name("tasks.download"), "tasks_download");
        assert_eq!(Names::prefix_of_tasks_subjects(&names.tasks_subjects()), Some("imagepipe"));
        assert_eq!(Names::prefix_of_tasks_subjects("a.b.tasks.>"), Some("a.b"));
        assert_eq!(Names::prefix_of_tasks_subjects("tasks.>"), None);
        assert_eq!(Names::prefix_of_tasks_subjects("a.events.>"), None);
        assert_eq!(names.partition_subject("tasks.results", 17).unwrap(), "imagepipe.tasks.results.17");
        assert_eq!(names.partition_subject("tasks.results.high", 0).unwrap(), "imagepipe.tasks.results.high.0");
        assert!(matches!(names.partition_subject("dlq.tasks.results", 1), Err(BusError::Invalid(_))));
        assert_eq!(partition_durable("tasks.results.high", 63), "tasks_results_high_p63");
        assert_eq!(partition_of_durable("tasks.results.high", "tasks_results_high_p63"), Some(63));
        assert_eq!(partition_of_durable("tasks.results", "tasks_results_high_p63"), None);
        assert_eq!(partition_of_durable("tasks.results", "tasks_results_p"), None);
        assert_eq!(partition_of_durable("tasks.results", "tasks_results"), None);
        assert_eq!(group_durable("tasks.results.high", "0af3"), "tasks_results_high_g0af3");
        assert!(reads_partitions_of("tasks.results.high", "tasks_results_high_g0af3"));
        assert!(reads_partitions_of("tasks.results.high", "tasks_results_high_p7"));
        assert!(!reads_partitions_of("tasks.results", "tasks_results_high_g0af3"));
        assert!(!reads_partitions_of("tasks.results", "tasks_results_g"));
        assert!(!reads_partitions_of("tasks.results", "tasks_results"));
        assert_eq!(partition_of_subject("imagepipe.tasks.results.high.17"), Some(17));
        assert_eq!(partition_of_subject("imagepipe.tasks.results.high"), None);
    }

    #[test]
    fn bad_queue_names_are_rejected_with_a_reason() {
        let names = Names::new("imagepipe");
        for bad in
            ["", "tasks", "dlq", "events.image", "tasks..x", "tasks.a b", "tasks.>", "tasks.*", "tasks.results.17"]
        {
            let err = names.queue_subject(bad).unwrap_err();
            assert!(matches!(err, BusError::Invalid(_)), "{bad}: {err}");
        }
        assert!(names.event_subject("task.*").is_err());
    }
}
