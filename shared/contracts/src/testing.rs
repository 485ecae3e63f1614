//! What a test does when its environment is missing (a server's URL, a prepared model): it
//! fails with the reason, so a plain `cargo nextest run` never counts a test that tested
//! nothing as passed. With `IMAGEPIPE_TEST_ALLOW_SKIP=1` it prints `SKIPPED <test>: <reason>`
//! to stderr instead and returns early. `scripts/test.sh` provides every test's environment
//! and never allows a skip.

/// The variable that lets tests whose environment is missing skip (`1`) instead of failing.
pub const ALLOW_SKIP_ENV: &str = "IMAGEPIPE_TEST_ALLOW_SKIP";

/// Whether `IMAGEPIPE_TEST_ALLOW_SKIP=1` is set.
pub fn skipping_allowed() -> bool {
    std::env::var(ALLOW_SKIP_ENV).is_ok_and(|value| value == "1")
}

/// The calling test's environment is missing, for `reason` (which says how to provide it):
/// panics with it, or, when skipping is allowed, prints `SKIPPED <test>: <reason>` and returns
/// so that the caller can skip what it cannot test.
#[track_caller]
pub fn environment_missing(reason: &str) {
    if !skipping_allowed() {
        panic!("{reason}\n(scripts/test.sh provides it; {ALLOW_SKIP_ENV}=1 skips such tests instead of failing them)");
    }
    let thread = std::thread::current();
    eprintln!("SKIPPED {}: {reason}", thread.name().unwrap_or("a test"));
}
