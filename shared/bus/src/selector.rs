//! Which event types a subscriber group wants: `task.completed || task.failed`, `image.*`, `*`.

use std::fmt;
use std::str::FromStr;

/// A disjunction of event-type patterns. A pattern is dot-separated tokens where `*` matches
/// exactly one token; a lone `*` (or `>`) matches every event type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selector {
    patterns: Vec<String>,
}

/// A selector string that does not parse; says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid selector {selector:?}: {reason}")]
pub struct InvalidSelector {
    /// The rejected selector.
    pub selector: String,
    /// What is wrong with it.
    pub reason: String,
}

impl Selector {
    /// Most alternatives (`a || b || ...`) a selector may have.
    pub const MAX_ALTERNATIVES: usize = 32;
    /// Longest selector string, in bytes.
    pub const MAX_LEN: usize = 2048;

    /// Matches every event.
    pub fn all() -> Self {
        Self { patterns: vec![">".into()] }
    }

    /// Parses `a.b || c.*`.
    pub fn parse(s: &str) -> Result<Self, InvalidSelector> {
        let invalid = |reason: String| InvalidSelector { selector: s.to_owned(), reason };
        if s.len() > Self::MAX_LEN {
            return Err(invalid(format!("longer than {} bytes", Self::MAX_LEN)));
        }
        let mut patterns = Vec::new();
        for (i, alternative) in s.split("||").enumerate() {
            if i == Self::MAX_ALTERNATIVES {
                return Err(invalid(format!("more than {} alternatives", Self::MAX_ALTERNATIVES)));
            }
            let pattern = alternative.trim();
            if pattern.is_empty() {
                return Err(invalid("empty alternative".into()));
            }
            if pattern == "*" || pattern == ">" {
                return Ok(Self::all());
            }
            for token in pattern.split('.') {
                if token != "*" && !is_type_token(token) {
                    return Err(invalid(format!("bad token {token:?} in {pattern:?}: use [a-z0-9_]+ or *")));
                }
            }
            if !patterns.iter().any(|p| p == pattern) {
                patterns.push(pattern.to_owned());
            }
        }
        Ok(Self { patterns })
    }

    /// Whether the selector accepts every event type.
    pub fn is_all(&self) -> bool {
        self.patterns.len() == 1 && self.patterns[0] == ">"
    }

    /// The patterns, each a NATS-style subject filter (`>` for all).
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether `event_type` is accepted.
    pub fn matches(&self, event_type: &str) -> bool {
        self.patterns.iter().any(|p| pattern_matches(p, event_type))
    }

    /// The first pattern that accepts none of `known` (a typo such as `task.complete`), if any.
    pub fn pattern_matching_none(&self, known: &[&str]) -> Option<&str> {
        self.patterns.iter().find(|p| !known.iter().any(|t| pattern_matches(p, t))).map(String::as_str)
    }
}

/// Whether `event_type` is a concrete event type a selector can match: dot-separated
/// `[a-z0-9_]+` tokens, no wildcards.
#[cfg(any(feature = "memory", feature = "nats", feature = "kafka"))]
pub(crate) fn is_valid_event_type(event_type: &str) -> bool {
    event_type.split('.').all(is_type_token)
}

fn is_type_token(token: &str) -> bool {
    !token.is_empty() && token.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn pattern_matches(pattern: &str, event_type: &str) -> bool {
    if pattern == ">" {
        return true;
    }
    let mut want = pattern.split('.');
    let mut have = event_type.split('.');
    loop {
        match (want.next(), have.next()) {
            (None, None) => return true,
            (Some("*"), Some(_)) => {}
            (Some(w), Some(h)) if w == h => {}
            _ => return false,
        }
    }
}

impl FromStr for Selector {
    type Err = InvalidSelector;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_all() {
            return f.write_str("*");
        }
        f.write_str(&self.patterns.join(" || "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matching_no_known_type_is_named() {
        let known = ["task.completed", "image.analyzed"];
        assert_eq!(Selector::parse("task.completed || image.*").unwrap().pattern_matching_none(&known), None);
        assert_eq!(Selector::all().pattern_matching_none(&known), None);
        let typo = Selector::parse("image.* || task.complete").unwrap();
        assert_eq!(typo.pattern_matching_none(&known), Some("task.complete"));
    }

    #[test]
    fn alternatives_and_length_are_capped() {
        let within = vec!["task.completed"; Selector::MAX_ALTERNATIVES].join(" || ");
        assert!(Selector::parse(&within).is_ok());
        let over = format!("{within} || task.failed");
        assert!(Selector::parse(&over).unwrap_err().reason.contains("more than 32 alternatives"));
        let long = "a".repeat(Selector::MAX_LEN + 1);
        assert!(Selector::parse(&long).unwrap_err().reason.contains("longer than"));
    }

    #[test]
    fn alternatives_match_exact_types() {
        let s = Selector::parse("task.completed || task.failed").unwrap();
        assert!(s.matches("task.completed"));
        assert!(s.matches("task.failed"));
        assert!(!s.matches("task.created"));
        assert!(!s.matches("task.completed.extra"));
        assert_eq!(s.to_string(), "task.completed || task.failed");
    }

    #[test]
    fn star_matches_one_token() {
        let s = Selector::parse("image.*").unwrap();
        assert!(s.matches("image.downloaded"));
        assert!(!s.matches("task.completed"));
        assert!(!s.matches("image"));
    }

    #[test]
    fn lone_star_matches_everything() {
        for all in ["*", ">", "task.created || *"] {
            let s = Selector::parse(all).unwrap();
            assert!(s.is_all());
            assert!(s.matches("anything.at_all"));
        }
    }

    #[test]
    fn malformed_selectors_are_rejected_with_a_reason() {
        for bad in ["", "task.completed ||", "Task.Completed", "task..x", "task.comp leted"] {
            let err = Selector::parse(bad).unwrap_err();
            assert!(!err.reason.is_empty(), "{bad}");
        }
    }
}
