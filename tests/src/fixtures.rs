//! Loopback HTTP fixtures: the sample photos as download sources, and a webhook receiver.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use imagepipe_net::testing::{FixtureServer, Route};
use serde_json::Value;

/// The bundled sample photos (`services/imagepipe/samples`), by file name.
pub const SAMPLES: [&str; 4] = ["chelsea.jpg", "coffee.jpg", "rocket.jpg", "astronaut.jpg"];

/// Where [`Fixtures`] serves chelsea as a HEIC.
const HEIC_PATH: &str = "/photos/chelsea.heic";

/// `jpeg` encoded as HEIC by libheif's `heif-enc` (x265), the encoder the test scripts install
/// (`scripts/image-libs.sh`, `ensure_image_tools`).
pub fn heic_of(jpeg: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("photo.heic");
    let status = std::process::Command::new("heif-enc")
        .args(["-q", "85", "-o"])
        .arg(&out)
        .arg(jpeg)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| std::io::Error::other(format!("running heif-enc (install it with scripts/image-libs.sh): {e}")))?;
    if !status.success() {
        return Err(std::io::Error::other(format!("heif-enc failed: {status}")));
    }
    std::fs::read(out)
}

/// Path of a sample photo.
pub fn sample_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../services/imagepipe/samples").join(name)
}

/// Serves `/photos/<sample>` and accepts `POST /hook` with `200`, recording every request.
pub struct Fixtures {
    server: FixtureServer,
}

impl Fixtures {
    /// Starts the server on 127.0.0.1 and a free port.
    pub async fn start() -> std::io::Result<Self> {
        let mut routes = vec![("/hook", Route::status(200))];
        for (path, name) in [
            ("/photos/chelsea.jpg", SAMPLES[0]),
            ("/photos/coffee.jpg", SAMPLES[1]),
            ("/photos/rocket.jpg", SAMPLES[2]),
            ("/photos/astronaut.jpg", SAMPLES[3]),
        ] {
            routes.push((path, Route::ok("image/jpeg", std::fs::read(sample_path(name))?)));
        }
        routes.push((HEIC_PATH, Route::ok("image/heic", heic_of(&sample_path(SAMPLES[0]))?)));
        Ok(Self { server: FixtureServer::start(routes).await? })
    }

    /// URL of chelsea as a HEIC, as phones write photos (made by `heif-enc` at start).
    pub fn heic_url(&self) -> String {
        self.server.url(HEIC_PATH)
    }

    /// URL of a sample photo.
    pub fn photo_url(&self, sample: &str) -> String {
        self.server.url(&format!("/photos/{sample}"))
    }

    /// URL of the webhook receiver.
    pub fn hook_url(&self) -> String {
        self.server.url("/hook")
    }

    /// Distinct `eventId`s of the webhooks received, per `taskId`.
    pub fn webhooks_by_task(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut by_task: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for request in self.server.requests().into_iter().filter(|r| r.method == "POST" && r.target == "/hook") {
            if let Ok(body) = serde_json::from_slice::<Value>(&request.body) {
                let task = body["taskId"].as_str().unwrap_or_default().to_owned();
                let event = body["eventId"].as_str().unwrap_or_default().to_owned();
                by_task.entry(task).or_default().insert(event);
            }
        }
        by_task
    }
}
