//! What the machine needs from outside besides the task: the time, a jitter seed, and what the
//! stage queues are doing (paused, idle, holding messages).

use std::time::Duration;

use imagepipe_contracts::Step;
use imagepipe_runtime::clock::millis;

/// What the machine needs from outside: the time, a seed for the backoff jitter, which stage
/// queues operators have paused, and what the stage queues still hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// Now, Unix ms.
    pub now: u64,
    /// Seeds the jitter of a retry backoff, so a decision is a pure function of its inputs.
    pub seed: u64,
    /// The steps whose queues are paused: their deadlines start over instead of firing, and a
    /// cancel of an attempt waiting in one that runs nothing is at once.
    pub paused: PausedSteps,
    /// What each step's queue and the results queue held at the last look: a deadline whose
    /// command (or result) may still wait there is postponed instead of firing.
    pub held: HeldSteps,
}

/// How much younger than an attempt's deadline window a held message may be and still count
/// as possibly the attempt's command: the relay sends a command a moment after the transition
/// wrote it, and the broker dates it by its own clock.
pub const HELD_SLACK: Duration = Duration::from_secs(5);

/// What a stage queue still holds (waiting or being handled), as far as its broker can tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Held {
    /// Nothing, or the broker could not be asked.
    #[default]
    Nothing,
    /// Messages, the oldest enqueued at this time (Unix ms).
    Since(u64),
    /// Messages the broker cannot date (Kafka counts a group's lag, not its age).
    Undated,
}

impl Held {
    /// What two queues hold together: the older, an undated backlog counting as the oldest.
    pub fn and(self, other: Held) -> Held {
        match (self, other) {
            (Held::Undated, _) | (_, Held::Undated) => Held::Undated,
            (Held::Since(a), Held::Since(b)) => Held::Since(a.min(b)),
            (Held::Nothing, held) | (held, Held::Nothing) => held,
        }
    }
}

/// What each step's queue and the results queue (every priority lane of them) still hold,
/// together: the oldest message of either. Steps not named hold nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldSteps(Vec<(Step, Held)>);

impl HeldSteps {
    /// The same, with `step`'s queue holding `held`.
    pub fn with(mut self, step: Step, held: Held) -> Self {
        match self.0.iter_mut().find(|(s, _)| *s == step) {
            Some((_, h)) => *h = held,
            None => self.0.push((step, held)),
        }
        self
    }

    /// What `step`'s queue holds.
    pub fn get(&self, step: Step) -> Held {
        self.0.iter().find(|(s, _)| *s == step).map_or(Held::Nothing, |(_, held)| *held)
    }

    /// Why a command of `step` sent at `sent_at` (Unix ms) or earlier, or its result, may still
    /// wait: the step's queue or the results queue holds a message as old as that, or one the
    /// broker cannot date; `None` when everything they hold came later.
    pub(super) fn may_hold(&self, step: Step, sent_at: u64) -> Option<String> {
        match self.get(step) {
            Held::Nothing => None,
            Held::Since(since) if since > sent_at.saturating_add(millis(HELD_SLACK)) => None,
            Held::Since(since) => Some(format!(
                "a message enqueued at {since}, as old as the attempt's command, still waits in the {step} queue or \
                 the results queue"
            )),
            Held::Undated => {
                Some(format!("the {step} queue or the results queue holds messages its broker cannot date"))
            }
        }
    }
}

/// Which steps' queues are paused, which of them run nothing, and when each was last resumed;
/// built-in steps and stages of users' own alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PausedSteps(Vec<(Step, StepPause)>);

/// What [`PausedSteps`] knows of one step's queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct StepPause {
    paused: bool,
    idle: bool,
    resumed_at: u64,
}

impl PausedSteps {
    /// The set of `steps`.
    pub fn of(steps: impl IntoIterator<Item = Step>) -> Self {
        steps.into_iter().fold(Self::default(), |mut set, step| {
            set.entry(step).paused = true;
            set
        })
    }

    /// The same, with `step`'s queue last resumed at `at` (Unix ms).
    pub fn resumed(mut self, step: Step, at: u64) -> Self {
        if at != 0 || self.0.iter().any(|(s, _)| *s == step) {
            self.entry(step).resumed_at = at;
        }
        self
    }

    /// The same, with `step`'s paused queue running nothing: the pause is in force at every
    /// live consumer and none of them holds a message, so a command of `step` still waits.
    pub fn idle(mut self, step: Step) -> Self {
        if let Some((_, pause)) = self.0.iter_mut().find(|(s, _)| *s == step) {
            pause.idle = pause.paused;
        }
        self
    }

    /// Whether `step`'s queue is paused.
    pub fn contains(&self, step: Step) -> bool {
        self.get(step).paused
    }

    /// Whether `step`'s queue is paused and runs nothing (see [`PausedSteps::idle`]).
    pub fn is_idle(&self, step: Step) -> bool {
        let pause = self.get(step);
        pause.paused && pause.idle
    }

    /// When `step`'s queue was last resumed (0: never paused).
    pub fn resumed_at(&self, step: Step) -> u64 {
        self.get(step).resumed_at
    }

    fn get(&self, step: Step) -> StepPause {
        self.0.iter().find(|(s, _)| *s == step).map_or_else(StepPause::default, |(_, pause)| *pause)
    }

    fn entry(&mut self, step: Step) -> &mut StepPause {
        let i = match self.0.iter().position(|(s, _)| *s == step) {
            Some(i) => i,
            None => {
                self.0.push((step, StepPause::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[i].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_queue_and_the_results_queue_hold_the_older_of_their_messages() {
        assert_eq!(Held::Since(5).and(Held::Since(3)), Held::Since(3));
        assert_eq!(Held::Nothing.and(Held::Since(1)), Held::Since(1));
        assert_eq!(Held::Since(1).and(Held::Nothing), Held::Since(1));
        assert_eq!(Held::Since(1).and(Held::Undated), Held::Undated);
        assert_eq!(Held::Nothing.and(Held::Nothing), Held::Nothing);
    }
}
