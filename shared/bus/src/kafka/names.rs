//! Topic and consumer group names derived from `bus.prefix` and logical names.
//!
//! Queue topics are `<prefix>.` + the queue name (`imagepipe.tasks.download`, dead letters
//! `imagepipe.dlq.tasks.download`); events go to one topic per event family
//! (`imagepipe.events.image`, `imagepipe.events.task`). Every queue and subscriber group is a
//! consumer group named after its "home" (`tasks.download`, `events.<group>`), with its own retry
//! topics `<prefix>.retry.<home>.<tier>`, so a nack in one group never reaches another.

use std::time::Duration;

use imagepipe_contracts::names::{DLQ, topics};

use crate::error::BusError;

/// First token of every task queue name (`tasks.download`).
const TASKS: &str = "tasks";
/// The token of retry topics.
const RETRY: &str = "retry";
/// Kafka's limit on topic name length.
const MAX_TOPIC_LEN: usize = 249;

/// Every name the backend derives from one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    prefix: String,
}

impl Names {
    pub(crate) fn new(prefix: &str) -> Self {
        Self { prefix: prefix.to_owned() }
    }

    /// The topic of a queue (`tasks.download` or `dlq.tasks.download`) after checking its name.
    pub(crate) fn queue_topic(&self, queue: &str) -> Result<String, BusError> {
        if !crate::config::is_valid_name(queue) {
            return Err(BusError::Invalid(format!(
                "queue name {queue:?} must be dot-separated tokens of [A-Za-z0-9_-]"
            )));
        }
        match queue.split('.').next() {
            Some(TASKS | DLQ) if queue.contains('.') => self.topic(queue),
            _ => Err(BusError::Invalid(format!(
                "queue name {queue:?} must start with `{TASKS}.` (task queues) or `{DLQ}.` (dead letters)"
            ))),
        }
    }

    /// The topic of an event type (`task.completed` → `<prefix>.events.task`) after checking it.
    pub(crate) fn event_topic(&self, event_type: &str) -> Result<String, BusError> {
        if !crate::selector::is_valid_event_type(event_type) {
            return Err(BusError::Invalid(format!(
                "event type {event_type:?} must be dot-separated tokens of [a-z0-9_]"
            )));
        }
        self.topic(&imagepipe_contracts::names::topic_of_event_type(event_type))
    }

    /// The topics of the event families a subscriber of `patterns` reads: the families its
    /// patterns name, or the image and task families for patterns starting with a wildcard.
    pub(crate) fn event_topics_for(&self, patterns: &[String]) -> Vec<String> {
        let mut families: Vec<&str> = Vec::new();
        for pattern in patterns {
            match pattern.split('.').next() {
                Some(family) if family != "*" && family != ">" => families.push(family),
                _ => families.extend(DEFAULT_FAMILIES),
            }
        }
        families.sort_unstable();
        families.dedup();
        families.into_iter().map(|family| format!("{}.{}.{family}", self.prefix, topics::EVENTS)).collect()
    }

    /// The topics every bus of this prefix creates at start: the task queues, their dead-letter
    /// queues and the event topics.
    pub(crate) fn standard_topics(&self) -> Vec<String> {
        let queues = imagepipe_contracts::names::queues::all_lanes();
        let mut out: Vec<String> = queues.iter().map(|q| format!("{}.{q}", self.prefix)).collect();
        out.extend(
            queues.iter().map(|q| format!("{}.{}", self.prefix, imagepipe_contracts::names::dead_letter_queue(q))),
        );
        out.extend(
            [topics::IMAGE_EVENTS, topics::TASK_EVENTS, topics::STAGE_EVENTS].map(|t| format!("{}.{t}", self.prefix)),
        );
        // The lanes of a queue share its dead-letter queue.
        let mut seen = std::collections::HashSet::new();
        out.retain(|topic| seen.insert(topic.clone()));
        out
    }

    /// The topics of the coordinator's input queues, partitioned by shard: submissions and step
    /// results, every lane.
    pub(crate) fn sharded_topics(&self) -> Vec<String> {
        use imagepipe_contracts::Priority;
        use imagepipe_contracts::names::queues::{RESULTS, SUBMIT};
        [SUBMIT, RESULTS]
            .into_iter()
            .flat_map(|queue| [Priority::High, Priority::Normal, Priority::Low].map(|p| p.lane(queue)))
            .map(|queue| format!("{}.{queue}", self.prefix))
            .collect()
    }

    /// The dead-letter topic of a dead-letter queue name (`dlq.tasks.download`).
    pub(crate) fn dlq_topic(&self, dead_letter_queue: &str) -> Result<String, BusError> {
        self.topic(dead_letter_queue)
    }

    /// The consumer group of a home (`tasks.download`, `events.analytics`).
    pub(crate) fn group_id(&self, home: &str) -> String {
        format!("{}.{home}", self.prefix)
    }

    /// The retry topic of `home` for delay tier `tier` (`<prefix>.retry.tasks.download.10s`).
    pub(crate) fn retry_topic(&self, home: &str, tier: Duration) -> Result<String, BusError> {
        self.topic(&format!("{RETRY}.{home}.{}", tier_label(tier)))
    }

    fn topic(&self, logical: &str) -> Result<String, BusError> {
        let topic = format!("{}.{logical}", self.prefix);
        if topic.len() > MAX_TOPIC_LEN {
            return Err(BusError::Invalid(format!(
                "topic {topic:?} is longer than Kafka's {MAX_TOPIC_LEN} characters"
            )));
        }
        Ok(topic)
    }
}

/// The families a wildcard selector covers.
const DEFAULT_FAMILIES: [&str; 3] = ["image", "stage", "task"];

/// The home of a subscriber group: `events.<group>`, like its dead-letter queue `dlq.events.<group>`.
pub(crate) fn group_home(group: &str) -> String {
    format!("{}.{group}", topics::EVENTS)
}

/// A delay as a topic-name token: `500ms`, `1s`, `10m`, `2h`.
pub(crate) fn tier_label(tier: Duration) -> String {
    let ms = tier.as_millis();
    match ms {
        _ if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        _ if ms % 1000 == 0 => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_derive_from_the_prefix() {
        let names = Names::new("imagepipe");
        assert_eq!(names.queue_topic("tasks.download").unwrap(), "imagepipe.tasks.download");
        assert_eq!(names.queue_topic("dlq.tasks.download").unwrap(), "imagepipe.dlq.tasks.download");
        assert_eq!(names.event_topic("task.completed").unwrap(), "imagepipe.events.task");
        assert_eq!(names.event_topic("image.analyzed").unwrap(), "imagepipe.events.image");
        assert_eq!(names.group_id("tasks.download"), "imagepipe.tasks.download");
        assert_eq!(names.group_id(&group_home("analytics")), "imagepipe.events.analytics");
        assert_eq!(
            names.retry_topic("tasks.download", Duration::from_secs(60)).unwrap(),
            "imagepipe.retry.tasks.download.1m"
        );
    }

    #[test]
    fn the_coordinators_input_queues_are_sharded() {
        assert_eq!(
            Names::new("p").sharded_topics(),
            [
                "p.tasks.submit.high",
                "p.tasks.submit",
                "p.tasks.submit.low",
                "p.tasks.results.high",
                "p.tasks.results",
                "p.tasks.results.low"
            ]
        );
    }

    #[test]
    fn selectors_map_to_the_topics_of_their_families() {
        let names = Names::new("p");
        let topics =
            |patterns: &[&str]| names.event_topics_for(&patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>());
        assert_eq!(topics(&["task.completed", "task.failed"]), ["p.events.task"]);
        assert_eq!(topics(&["image.*"]), ["p.events.image"]);
        assert_eq!(topics(&[">"]), ["p.events.image", "p.events.stage", "p.events.task"]);
        assert_eq!(
            topics(&["*.failed", "audit.x"]),
            ["p.events.audit", "p.events.image", "p.events.stage", "p.events.task"]
        );
        assert_eq!(topics(&["stage.completed"]), ["p.events.stage"]);
    }

    #[test]
    fn tiers_label_in_the_largest_whole_unit() {
        let labels: Vec<String> = [500, 1000, 10_000, 60_000, 600_000, 7_200_000, 1500]
            .map(|ms| tier_label(Duration::from_millis(ms)))
            .into();
        assert_eq!(labels, ["500ms", "1s", "10s", "1m", "10m", "2h", "1500ms"]);
    }

    #[test]
    fn bad_names_are_rejected_with_a_reason() {
        let names = Names::new("imagepipe");
        for bad in ["", "tasks", "dlq", "events.image", "tasks..x", "tasks.a b", "tasks.*"] {
            assert!(matches!(names.queue_topic(bad), Err(BusError::Invalid(_))), "{bad}");
        }
        assert!(names.event_topic("task.*").is_err());
        assert!(names.event_topic("Task.Completed").is_err());
    }
}
