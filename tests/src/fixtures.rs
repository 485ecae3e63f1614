//! Loopback HTTP fixtures: the sample photos as download sources, and a webhook receiver.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use imagepipe_net::testing::{FixtureServer, Route};
use serde_json::Value;

/// The bundled sample photos (`services/imagepipe/samples`), by file name.
pub const SAMPLES: [&str; 4] = ["chelsea.jpg", "coffee.jpg", "rocket.jpg", "astronaut.jpg"];

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
        Ok(Self { server: FixtureServer::start(routes).await? })
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
