//! Binary of imagepipe tag-indexer-worker.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "imagepipe-tag-indexer-worker: not built yet (issue #{}); nothing was started",
        imagepipe_tag_indexer_worker::BUILT_BY_ISSUE
    );
    ExitCode::from(2)
}
