//! Binary of imagepipe coordinator.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "imagepipe-coordinator: not built yet (issue #{}); nothing was started",
        imagepipe_coordinator::BUILT_BY_ISSUE
    );
    ExitCode::from(2)
}
