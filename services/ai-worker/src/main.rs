//! Binary of imagepipe ai-worker.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "imagepipe-ai-worker: not built yet (issue #{}); nothing was started",
        imagepipe_ai_worker::BUILT_BY_ISSUE
    );
    ExitCode::from(2)
}
