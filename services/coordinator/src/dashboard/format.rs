//! How the pages write times, durations and counts.

use std::time::{Duration, UNIX_EPOCH};

/// Unix ms as `2026-11-26 08:13:24 UTC`.
pub fn at(ms: u64) -> String {
    let time = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(time).to_string().replace('T', " ").replace('Z', " UTC")
}

/// How long before `now_ms` the time `ms` was: `just now`, `42 s ago`, `3 min ago`, ...
pub fn ago(now_ms: u64, ms: u64) -> String {
    let seconds = now_ms.saturating_sub(ms) / 1000;
    match seconds {
        0..=1 => "just now".to_owned(),
        2..=119 => format!("{seconds} s ago"),
        120..=7_199 => format!("{} min ago", seconds / 60),
        7_200..=172_799 => format!("{} h ago", seconds / 3600),
        _ => format!("{} days ago", seconds / 86_400),
    }
}

/// A duration in ms for people: `850 ms`, `1.24 s`, `2 min 5 s`, `3 h 12 min`.
pub fn duration_ms(ms: f64) -> String {
    if ms < 1_000.0 {
        format!("{ms:.0} ms")
    } else if ms < 60_000.0 {
        format!("{:.2} s", ms / 1_000.0)
    } else if ms < 3_600_000.0 {
        let seconds = (ms / 1_000.0) as u64;
        format!("{} min {} s", seconds / 60, seconds % 60)
    } else {
        let minutes = (ms / 60_000.0) as u64;
        format!("{} h {} min", minutes / 60, minutes % 60)
    }
}

/// A count with its noun in the right number: `1 delivery`, `2 deliveries`, `0 letters`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A `datetime-local` form value (`2026-11-26T08:13`, UTC) as Unix ms; `None` for an empty
/// value, an error message for one that is no time.
pub fn parse_form_time(value: &str, field: &str) -> Result<Option<u64>, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let full = if value.len() == 16 { format!("{value}:00") } else { value.to_owned() };
    let time = humantime::parse_rfc3339_weak(full.trim_end_matches('Z'))
        .map_err(|e| format!("{field}: {value:?} is not a time like 2026-11-26T08:13 ({e})"))?;
    let ms = time.duration_since(UNIX_EPOCH).map_err(|_| format!("{field}: {value:?} is before 1970"))?;
    Ok(Some(imagepipe_runtime::clock::millis(ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_read_well() {
        assert_eq!(at(1_764_144_804_000), "2025-11-26 08:13:24 UTC");
        assert_eq!(ago(10_000, 9_500), "just now");
        assert_eq!(ago(100_000, 0), "100 s ago");
        assert_eq!(ago(600_000, 0), "10 min ago");
        assert_eq!(duration_ms(849.6), "850 ms");
        assert_eq!(duration_ms(1_240.0), "1.24 s");
        assert_eq!(duration_ms(125_000.0), "2 min 5 s");
        assert_eq!(duration_ms(11_520_000.0), "3 h 12 min");
    }

    #[test]
    fn counts_take_the_singular_only_for_one() {
        assert_eq!(count(1u32, "delivery", "deliveries"), "1 delivery");
        assert_eq!(count(2u32, "delivery", "deliveries"), "2 deliveries");
        assert_eq!(count(0u64, "letter", "letters"), "0 letters");
        assert_eq!(count(1u64, "letter", "letters"), "1 letter");
    }

    #[test]
    fn form_times_are_read_as_utc_and_bad_ones_are_named() {
        let ms = parse_form_time("2025-11-26T08:13", "after").unwrap().unwrap();
        assert_eq!(ms, 1_764_144_780_000);
        assert_eq!(parse_form_time(" ", "after").unwrap(), None);
        assert!(parse_form_time("yesterday", "after").unwrap_err().starts_with("after: "));
    }
}
