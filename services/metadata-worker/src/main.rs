//! Binary of imagepipe metadata-worker.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "imagepipe-metadata-worker: not built yet (issue #{}); nothing was started",
        imagepipe_metadata_worker::BUILT_BY_ISSUE
    );
    ExitCode::from(2)
}
