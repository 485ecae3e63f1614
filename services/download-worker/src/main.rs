//! Binary of imagepipe download-worker.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "imagepipe-download-worker: not built yet (issue #{}); nothing was started",
        imagepipe_download_worker::BUILT_BY_ISSUE
    );
    ExitCode::from(2)
}
