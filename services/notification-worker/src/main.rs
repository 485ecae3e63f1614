//! Binary of imagepipe notification-worker.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "imagepipe-notification-worker: not built yet (issue #{}); nothing was started",
        imagepipe_notification_worker::BUILT_BY_ISSUE
    );
    ExitCode::from(2)
}
