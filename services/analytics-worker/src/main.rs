//! Binary of imagepipe analytics-worker.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "imagepipe-analytics-worker: not built yet (issue #{}); nothing was started",
        imagepipe_analytics_worker::BUILT_BY_ISSUE
    );
    ExitCode::from(2)
}
