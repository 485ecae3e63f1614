//! The last hour: what finished tasks, measured latencies and failures add, in one bucket per
//! minute ([`Minute`]), and the [`Window`] of the 60 minutes up to now that `/v1/stats` reports
//! as `lastHour`.
//!
//! An event counts in the minute of its own `timestamp`, but no later than the minute it is
//! recorded in (an event from a clock running ahead counts now); an event from before the
//! window's first minute counts in the all-time statistics only. A latency counts in the minute
//! of the event that completed its measurement (the later stage's, unless the events came out
//! of order). The window is the minute `now` is in and the 59 before it.
//!
//! A minute holds finished tasks by outcome, a [`Histogram`] per span and failures by error
//! code: at most [`MAX_CODES_PER_MINUTE`] codes by name, any further code counting as
//! [`OTHER_CODE`], so a flood of unique codes cannot grow it. Stores keep a bucket only while
//! its minute is in the window (and [`MINUTE_GRACE`] longer), in the fields of
//! [`Minute::fields`].

use std::collections::BTreeMap;
use std::time::Duration;

use crate::histogram::Histogram;
use crate::store::StoreError;
use crate::update::{Span, TaskOutcome, Update};

/// A minute, ms.
pub const MINUTE_MS: u64 = 60_000;
/// Minutes in the window.
pub const WINDOW_MINUTES: u64 = 60;
/// The window's length, ms.
pub const WINDOW_MS: u64 = WINDOW_MINUTES * MINUTE_MS;
/// Failure codes a minute counts by name; failures with any further code count as
/// [`OTHER_CODE`].
pub const MAX_CODES_PER_MINUTE: usize = 32;
/// The code failures beyond [`MAX_CODES_PER_MINUTE`] distinct codes count as.
pub const OTHER_CODE: &str = "other";
/// How long a store keeps a minute's bucket after the minute left the window: room for
/// replicas whose clocks disagree a little.
pub const MINUTE_GRACE: Duration = Duration::from_secs(5 * 60);

/// The field of a stored minute holding how many codes it counts by name (all but
/// [`OTHER_CODE`]): the Redis script reads it to apply [`MAX_CODES_PER_MINUTE`].
pub const FAILURE_CODES: &str = "failure_codes";

/// The start of the minute `ms` (Unix ms) is in.
pub const fn minute_of(ms: u64) -> u64 {
    ms - ms % MINUTE_MS
}

/// The minute an event stamped `timestamp` counts in when recorded at `now` (both Unix ms):
/// the minute of `timestamp`, or of `now` when that is earlier; `None` when it is before the
/// window ending at `now`.
pub fn bucket_minute(timestamp: u64, now: u64) -> Option<u64> {
    let minute = minute_of(timestamp.min(now));
    (minute >= Window::ending_at(now).first_minute()).then_some(minute)
}

/// How long a store keeps the bucket of `minute` written at `now` (both Unix ms): until the
/// minute leaves the window, plus [`MINUTE_GRACE`]; at most an hour and five minutes.
pub fn bucket_ttl(minute: u64, now: u64) -> Duration {
    Duration::from_millis((minute + WINDOW_MS).saturating_sub(now)) + MINUTE_GRACE
}

/// What one minute added (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Minute {
    /// Finished tasks by outcome.
    pub tasks: BTreeMap<TaskOutcome, u64>,
    /// Latency histograms of the spans measured in the minute.
    pub latencies: BTreeMap<Span, Histogram>,
    /// Failed tasks by error code.
    pub failures: BTreeMap<String, u64>,
}

impl Minute {
    /// Adds what `update` adds, with the `latencies` recording it completed.
    pub fn record(&mut self, update: &Update, latencies: &[(Span, u64)]) {
        if let Some(outcome) = update.outcome {
            *self.tasks.entry(outcome).or_default() += 1;
        }
        for &(span, ms) in latencies {
            self.latencies.entry(span).or_default().record(ms);
        }
        if let Some(code) = &update.failure_code {
            let code = self.failure_label(code).to_owned();
            *self.failures.entry(code).or_default() += 1;
        }
    }

    /// Whether recording `update` with `latencies` changes a minute.
    pub fn changed_by(update: &Update, latencies: &[(Span, u64)]) -> bool {
        update.outcome.is_some() || !latencies.is_empty() || update.failure_code.is_some()
    }

    /// The code a failure with `code` counts as here: `code` when it is counted already or
    /// fewer than [`MAX_CODES_PER_MINUTE`] codes are, else [`OTHER_CODE`].
    pub fn failure_label<'a>(&self, code: &'a str) -> &'a str {
        if code == OTHER_CODE || self.failures.contains_key(code) || self.named_codes() < MAX_CODES_PER_MINUTE {
            code
        } else {
            OTHER_CODE
        }
    }

    /// Codes counted by name (all but [`OTHER_CODE`]).
    fn named_codes(&self) -> usize {
        self.failures.len() - usize::from(self.failures.contains_key(OTHER_CODE))
    }

    /// Finished tasks with `outcome`.
    pub fn finished(&self, outcome: TaskOutcome) -> u64 {
        self.tasks.get(&outcome).copied().unwrap_or(0)
    }

    /// Adds everything `other` counted (codes are not capped again: a sum of minutes holds
    /// every code any of them holds).
    pub fn merge(&mut self, other: &Minute) {
        for (outcome, n) in &other.tasks {
            let count = self.tasks.entry(*outcome).or_default();
            *count = count.saturating_add(*n);
        }
        for (span, histogram) in &other.latencies {
            self.latencies.entry(*span).or_default().merge(histogram);
        }
        for (code, n) in &other.failures {
            let count = self.failures.entry(code.clone()).or_default();
            *count = count.saturating_add(*n);
        }
    }

    /// The fields a store keeps it in, with their values: `tasks:<outcome>`,
    /// `latencies:<span>:<histogram field>` (see [`Histogram::fields`]), `failures:<code>`, and
    /// [`FAILURE_CODES`] when it counts failures. [`Minute::set_field`] reads them back.
    pub fn fields(&self) -> Vec<(String, u64)> {
        let mut fields: Vec<(String, u64)> =
            self.tasks.iter().map(|(outcome, n)| (format!("tasks:{}", outcome.as_str()), *n)).collect();
        for (span, histogram) in &self.latencies {
            let parts = histogram.fields().into_iter();
            fields.extend(parts.map(|(part, n)| (format!("latencies:{}:{part}", span.as_str()), n)));
        }
        fields.extend(self.failures.iter().map(|(code, n)| (format!("failures:{code}"), *n)));
        if !self.failures.is_empty() {
            fields.push((FAILURE_CODES.to_owned(), self.named_codes() as u64));
        }
        fields
    }

    /// Sets `field` (one of [`Minute::fields`]) to `value`; [`FAILURE_CODES`] is derived, so
    /// it is accepted and not kept.
    pub fn set_field(&mut self, field: &str, value: u64) -> Result<(), StoreError> {
        let corrupt = || StoreError::Corrupt { what: "minute field", value: field.to_owned() };
        match field.split_once(':') {
            Some(("tasks", name)) => {
                self.tasks.insert(TaskOutcome::parse(name).ok_or_else(corrupt)?, value);
            }
            Some(("latencies", rest)) => {
                let (name, part) = rest.split_once(':').ok_or_else(corrupt)?;
                let span = Span::parse(name).ok_or_else(corrupt)?;
                self.latencies.entry(span).or_default().set_field(part, value).map_err(|_| corrupt())?;
            }
            Some(("failures", code)) => {
                self.failures.insert(code.to_owned(), value);
            }
            _ if field == FAILURE_CODES => {}
            _ => return Err(corrupt()),
        }
        Ok(())
    }
}

/// The last hour as a store read it: the minute `now` is in and the 59 before it, with the
/// buckets of those that hold something.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Window {
    /// The start of its last minute (the one `now` is in), Unix ms.
    pub last_minute: u64,
    /// The buckets of its minutes that hold something, by the minute's start (Unix ms).
    pub minutes: BTreeMap<u64, Minute>,
}

impl Window {
    /// The window ending at `now` (Unix ms), before any bucket is read into it.
    pub fn ending_at(now: u64) -> Self {
        Self { last_minute: minute_of(now), minutes: BTreeMap::new() }
    }

    /// The start of its first minute, Unix ms.
    pub fn first_minute(&self) -> u64 {
        self.last_minute.saturating_sub(WINDOW_MS - MINUTE_MS)
    }

    /// The starts of its 60 minutes, oldest first (Unix ms; minutes before 1970 read as 0).
    pub fn minute_starts(&self) -> impl Iterator<Item = u64> + use<> {
        let last = self.last_minute;
        (0..WINDOW_MINUTES).rev().map(move |back| last.saturating_sub(back * MINUTE_MS))
    }

    /// Whether `minute` (a minute's start) is one of its minutes.
    pub fn contains(&self, minute: u64) -> bool {
        (self.first_minute()..=self.last_minute).contains(&minute)
    }

    /// The bucket of `minute` to read a stored bucket into; `None` when `minute` is not one of
    /// the window's (a bucket the store has yet to expire).
    pub fn bucket_mut(&mut self, minute: u64) -> Option<&mut Minute> {
        self.contains(minute).then(|| self.minutes.entry(minute).or_default())
    }

    /// Everything its minutes counted.
    pub fn total(&self) -> Minute {
        let mut total = Minute::default();
        for minute in self.minutes.values() {
            total.merge(minute);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use imagepipe_contracts::EventType;

    use super::*;

    /// 2025-11-22 08:26:40 UTC, 40 s into a minute.
    const NOW: u64 = 1_763_800_000_000;

    fn failed(code: &str) -> Update {
        Update {
            event_id: format!("failed-{code}"),
            event_type: EventType::TaskFailed,
            task_id: Some("t".to_owned()),
            timestamp: NOW,
            stage: None,
            outcome: Some(TaskOutcome::Failed),
            format: None,
            bytes: 0,
            failure_code: Some(code.to_owned()),
        }
    }

    #[test]
    fn events_count_in_their_minute_clamped_to_now_and_not_before_the_window() {
        let current = minute_of(NOW);
        assert_eq!(current, 1_763_799_960_000);
        assert_eq!(bucket_minute(NOW - 1, NOW), Some(current));
        assert_eq!(bucket_minute(current - 1, NOW), Some(current - MINUTE_MS));
        assert_eq!(bucket_minute(NOW + 3_600_000, NOW), Some(current), "a clock ahead counts now");
        let first = current - 59 * MINUTE_MS;
        assert_eq!(bucket_minute(first, NOW), Some(first));
        assert_eq!(bucket_minute(first - 1, NOW), None, "before the window: all-time only");
        assert_eq!(bucket_minute(0, NOW), None);
        assert_eq!(bucket_minute(5, 10), Some(0), "near the epoch the window starts at 0");
    }

    #[test]
    fn a_bucket_is_kept_until_its_minute_leaves_the_window_and_a_grace() {
        let current = minute_of(NOW);
        assert_eq!(bucket_ttl(current, current), Duration::from_secs(65 * 60));
        assert_eq!(bucket_ttl(current, NOW), Duration::from_secs(64 * 60 + 20));
        let first = current - 59 * MINUTE_MS;
        assert_eq!(bucket_ttl(first, NOW), Duration::from_secs(20) + MINUTE_GRACE);
    }

    #[test]
    fn the_window_is_60_minutes_up_to_the_current_one() {
        let window = Window::ending_at(NOW);
        let starts: Vec<u64> = window.minute_starts().collect();
        assert_eq!(starts.len(), 60);
        assert_eq!(*starts.last().unwrap(), minute_of(NOW));
        assert_eq!(starts[0], window.first_minute());
        assert!(starts.windows(2).all(|pair| pair[1] - pair[0] == MINUTE_MS));
        assert!(window.contains(starts[0]) && window.contains(starts[59]));
        assert!(!window.contains(starts[0] - MINUTE_MS) && !window.contains(starts[59] + MINUTE_MS));
        assert_eq!(Window::ending_at(0).minute_starts().count(), 60);
    }

    #[test]
    fn a_minute_counts_32_codes_by_name_and_the_rest_as_other() {
        let mut minute = Minute::default();
        for i in 0..MAX_CODES_PER_MINUTE {
            minute.record(&failed(&format!("code_{i:02}")), &[]);
        }
        minute.record(&failed("one_too_many"), &[]);
        minute.record(&failed("another"), &[]);
        minute.record(&failed("code_07"), &[]);
        minute.record(&failed(OTHER_CODE), &[]);
        assert_eq!(minute.failures.len(), MAX_CODES_PER_MINUTE + 1);
        assert_eq!(minute.failures[OTHER_CODE], 3);
        assert_eq!(minute.failures["code_07"], 2, "a code held still counts by name");
        assert!(!minute.failures.contains_key("one_too_many"));
        assert_eq!(minute.finished(TaskOutcome::Failed), 36);

        let mut early = Minute::default();
        early.record(&failed(OTHER_CODE), &[]);
        early.record(&failed("http_404"), &[]);
        assert_eq!(early.failures.len(), 2, "`other` is not one of the 32");
    }

    #[test]
    fn fields_read_back_into_the_same_minute() {
        let mut minute = Minute::default();
        minute.record(&failed("http_404"), &[(Span::Download, 120), (Span::EndToEnd, 4_000)]);
        minute.record(&failed("odd:code"), &[(Span::Download, 80)]);
        let mut read = Minute::default();
        for (field, value) in minute.fields() {
            read.set_field(&field, value).unwrap();
        }
        assert_eq!(read, minute);
        assert!(minute.fields().contains(&(FAILURE_CODES.to_owned(), 2)));
        for bad in ["tasks:lost", "latencies:download", "latencies:nowhere:count", "latencies:download:median", "x"] {
            assert!(read.set_field(bad, 1).is_err(), "{bad}");
        }
    }

    #[test]
    fn merging_sums_every_minute() {
        let (mut a, mut b) = (Minute::default(), Minute::default());
        a.record(&failed("http_404"), &[(Span::Download, 10)]);
        b.record(&failed("http_404"), &[(Span::Download, 30)]);
        b.record(&failed("timeout"), &[]);
        let mut window = Window::ending_at(NOW);
        *window.bucket_mut(minute_of(NOW)).unwrap() = a;
        *window.bucket_mut(minute_of(NOW) - 59 * MINUTE_MS).unwrap() = b;
        assert!(window.bucket_mut(minute_of(NOW) - 60 * MINUTE_MS).is_none());
        let total = window.total();
        assert_eq!(total.finished(TaskOutcome::Failed), 3);
        assert_eq!(total.failures, BTreeMap::from([("http_404".to_owned(), 2), ("timeout".to_owned(), 1)]));
        let download = &total.latencies[&Span::Download];
        assert_eq!((download.count, download.min_ms, download.max_ms), (2, 10, 30));
    }
}
