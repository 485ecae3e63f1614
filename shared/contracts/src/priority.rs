//! Task priorities and the queue lanes that carry them.
//!
//! Every stage queue (`tasks.submit`, `tasks.download`, `tasks.metadata`, `tasks.ai`) has one
//! lane per [`Priority`]: `normal` is the queue itself (so a consumer that knows nothing of
//! priorities keeps working), `high` and `low` are the queue's name with `.high` / `.low`
//! appended. Workers read the lanes with guaranteed shares (`imagepipe_bus::Lanes`).

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How soon a task's work is taken from its queues, relative to other tasks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Ahead of everything else (new uploads a user waits for).
    High,
    /// The default.
    #[default]
    Normal,
    /// Behind everything else, with a guaranteed share (backfills, reprocessing).
    Low,
}

impl Priority {
    /// Every priority, highest first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// The wire name: `high`, `normal`, `low`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// Position in [`Priority::ALL`] (0 = high).
    pub const fn index(self) -> usize {
        match self {
            Priority::High => 0,
            Priority::Normal => 1,
            Priority::Low => 2,
        }
    }

    /// Whether this is the default, so serializers can leave it out.
    pub fn is_normal(&self) -> bool {
        *self == Priority::Normal
    }

    /// The lane of `queue` that carries this priority: the queue itself for `normal`,
    /// `<queue>.high` / `<queue>.low` otherwise.
    pub fn lane(self, queue: &str) -> String {
        match self {
            Priority::Normal => queue.to_owned(),
            other => format!("{queue}.{}", other.as_str()),
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A priority name that is not `high`, `normal` or `low`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("priority must be one of high, normal, low (got {0:?})")]
pub struct UnknownPriority(pub String);

impl FromStr for Priority {
    type Err = UnknownPriority;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::ALL.into_iter().find(|p| p.as_str() == s).ok_or_else(|| UnknownPriority(s.to_owned()))
    }
}

/// The stage queue a lane belongs to and the lane's priority: `tasks.download.high` →
/// (`tasks.download`, high), and so for a custom stage's (`tasks.faces.low`); a queue that is
/// no lane (`tasks.results`) is its own, `normal`.
pub fn lane_of(queue: &str) -> (&str, Priority) {
    for priority in [Priority::High, Priority::Low] {
        if let Some(base) = queue.strip_suffix(priority.as_str()).and_then(|q| q.strip_suffix('.'))
            && (crate::names::queues::LANED.contains(&base) || is_stage_queue(base))
        {
            return (base, priority);
        }
    }
    (queue, Priority::Normal)
}

/// Whether `queue` is a custom stage's queue (`tasks.<stage>`): laned like the built-in ones.
fn is_stage_queue(queue: &str) -> bool {
    queue.strip_prefix("tasks.").is_some_and(|name| {
        !name.contains('.')
            && crate::names::queues::ALL.iter().all(|q| *q != queue)
            && crate::StageName::check(name).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::queues;

    #[test]
    fn lanes_round_trip() {
        for queue in queues::LANED {
            for priority in Priority::ALL {
                let lane = priority.lane(queue);
                assert_eq!(lane_of(&lane), (queue, priority));
            }
        }
        assert_eq!(lane_of(queues::RESULTS), (queues::RESULTS, Priority::Normal));
        assert_eq!(lane_of("tasks.faces.high"), ("tasks.faces", Priority::High), "a custom stage's lane");
        assert_eq!(lane_of("events.image.high"), ("events.image.high", Priority::Normal), "not a laned queue");
        assert_eq!(lane_of("tasks.Bad.high"), ("tasks.Bad.high", Priority::Normal), "no stage name");
    }

    #[test]
    fn names_parse_and_default_is_normal() {
        assert_eq!("low".parse::<Priority>(), Ok(Priority::Low));
        assert!("urgent".parse::<Priority>().is_err());
        assert_eq!(Priority::default(), Priority::Normal);
        assert_eq!(serde_json::to_string(&Priority::High).unwrap(), "\"high\"");
    }
}
