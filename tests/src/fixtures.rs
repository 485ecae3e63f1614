//! Loopback HTTP fixtures: the sample photos as download sources, and a webhook receiver.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use imagepipe_net::testing::{FixtureServer, Route};
use serde_json::Value;

/// The bundled sample photos (`services/imagepipe/samples`), by file name.
pub const SAMPLES: [&str; 4] = ["chelsea.jpg", "coffee.jpg", "rocket.jpg", "astronaut.jpg"];

/// Where [`Fixtures`] serves chelsea as a HEIC.
const HEIC_PATH: &str = "/photos/chelsea.heic";
/// Where [`Fixtures`] serves chelsea as a HEIC grid of tiles.
const HEIC_GRID_PATH: &str = "/photos/chelsea-grid.heic";
/// The tile edge of [`grid_heic_of`]: phones write 512-pixel tiles of a 12 MP photo; this edge
/// makes the 451×300 sample a grid of 4×3 tiles, the last column and row cropped.
const GRID_TILE: u32 = 128;

/// `jpeg` encoded as HEIC by libheif's `heif-enc` (x265), the encoder the test scripts install
/// (`scripts/image-libs.sh`, `ensure_image_tools`).
pub fn heic_of(jpeg: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let dir = tempfile::tempdir()?;
    std::fs::copy(jpeg, dir.path().join("photo.jpg"))?;
    heif_enc(dir.path(), &["-q", "85", "-o", "photo.heic", "photo.jpg"], "photo.heic")
}

/// `jpeg` encoded as phones store photos: a HEIC whose primary image is a grid of
/// [`GRID_TILE`]-pixel HEVC tiles, the last column and row cropped to the image's size
/// (`heif-enc`'s tiled input, libheif ≥ 1.18, from PNG tiles).
pub fn grid_heic_of(jpeg: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let source = image::open(jpeg).map_err(std::io::Error::other)?.to_rgb8();
    let dir = tempfile::tempdir()?;
    let (width, height) = source.dimensions();
    for row in 0..height.div_ceil(GRID_TILE) {
        for column in 0..width.div_ceil(GRID_TILE) {
            // Tiles past the edge repeat its last pixels (the grid crops them away).
            let tile = image::RgbImage::from_fn(GRID_TILE, GRID_TILE, |x, y| {
                *source.get_pixel((column * GRID_TILE + x).min(width - 1), (row * GRID_TILE + y).min(height - 1))
            });
            tile.save(dir.path().join(format!("tile-{row:02}-{column:02}.png"))).map_err(std::io::Error::other)?;
        }
    }
    let (width, height) = (width.to_string(), height.to_string());
    let args = [
        "-q",
        "85",
        "-T",
        "--tiled-image-width",
        &width,
        "--tiled-image-height",
        &height,
        "-o",
        "grid.heic",
        "tile-00-00.png",
    ];
    heif_enc(dir.path(), &args, "grid.heic")
}

/// Runs `heif-enc args` in `dir` and reads what it wrote to `out` there.
fn heif_enc(dir: &std::path::Path, args: &[&str], out: &str) -> std::io::Result<Vec<u8>> {
    let status = std::process::Command::new("heif-enc")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| std::io::Error::other(format!("running heif-enc (install it with scripts/image-libs.sh): {e}")))?;
    if !status.success() {
        return Err(std::io::Error::other(format!("heif-enc {args:?} failed: {status}")));
    }
    std::fs::read(dir.join(out))
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
        routes.push((HEIC_GRID_PATH, Route::ok("image/heic", grid_heic_of(&sample_path(SAMPLES[0]))?)));
        Ok(Self { server: FixtureServer::start(routes).await? })
    }

    /// URL of chelsea as a HEIC, as phones write photos (made by `heif-enc` at start).
    pub fn heic_url(&self) -> String {
        self.server.url(HEIC_PATH)
    }

    /// URL of chelsea as a HEIC grid of tiles, as phones write photos (made by `heif-enc` at
    /// start).
    pub fn heic_grid_url(&self) -> String {
        self.server.url(HEIC_GRID_PATH)
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
