//! The stage's [`StepHandler`]: read the task's image from the blob store, make its rendition on
//! the blocking pool, store it, and report where it is.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use imagepipe_blob::{BlobError, BlobKey, BlobStore};
use imagepipe_contracts::{StageBlobs, StageCommand, StepError};
use imagepipe_runtime::error_chain;
use imagepipe_runtime::step::{StepFailure, StepHandler, blob_code};
use serde_json::{Map, Value, json};

use crate::render::{Rendition, RenditionSpec, render};

/// Stable error codes of the stage's own failures (besides those of [`crate::render::codes`]
/// and the blob store's, [`imagepipe_runtime::step::codes`]).
pub mod codes {
    /// The decoder panicked on the image (permanent).
    pub const DECODER_PANICKED: &str = "decoder_panicked";
    /// The rendering task was cancelled: the worker is shutting down (retryable).
    pub const INTERRUPTED: &str = "interrupted";
}

/// Handles the stage's [`StageCommand`]s (see the module docs).
pub struct RenditionHandler {
    blobs: Arc<dyn BlobStore>,
    spec: Arc<RenditionSpec>,
}

/// The blob a rendition is made from: the preview the metadata step wrote when there is one (an
/// upright, moderately sized JPEG, whatever the source's format), else the original.
pub fn source_key(blobs: &StageBlobs) -> &str {
    blobs.preview.as_deref().unwrap_or(&blobs.original)
}

impl RenditionHandler {
    /// A handler reading images from and writing renditions to `blobs`, as `spec` says.
    pub fn new(blobs: Arc<dyn BlobStore>, spec: RenditionSpec) -> Self {
        Self { blobs, spec: Arc::new(spec) }
    }

    /// Renders `bytes` on the blocking pool, holding a share of the machine's CPUs.
    async fn render(&self, bytes: Bytes) -> Result<Rendition, StepFailure> {
        let cpu = imagepipe_runtime::gate::cpu().acquire().await;
        let spec = self.spec.clone();
        let rendered = tokio::task::spawn_blocking(move || {
            let rendered = render(&bytes, &spec);
            drop(cpu);
            rendered
        })
        .await;
        match rendered {
            Ok(Ok(rendition)) => Ok(rendition),
            Ok(Err(error)) => Err(StepFailure::permanent(error.code(), error.to_string())),
            Err(join) if join.is_panic() => {
                Err(StepFailure::permanent(codes::DECODER_PANICKED, "the decoder crashed on this image"))
            }
            Err(join) => Err(StepFailure::retryable(codes::INTERRUPTED, format!("rendering was cancelled: {join}"))),
        }
    }
}

/// A blob that cannot be read: retryable whatever the cause (a store that is down, a blob not
/// yet visible in an eventually consistent store); the stage's `attempts` bound the retries.
fn unreadable(error: &BlobError) -> StepFailure {
    StepFailure::Retryable { error: StepError::new(blob_code(error), error_chain(error)), retry_after: None }
}

#[async_trait]
impl StepHandler for RenditionHandler {
    type Command = StageCommand;

    async fn process(&self, command: &StageCommand) -> Result<Map<String, Value>, StepFailure> {
        let source = source_key(&command.blobs);
        let key: BlobKey = source.parse().map_err(|e| StepFailure::invalid_blob_key(&e))?;
        let bytes = self.blobs.get(&key).await.map_err(|e| unreadable(&e))?;
        let rendition = self.render(bytes).await?;
        let size = rendition.bytes.len();
        let stored = self.blobs.put(Bytes::from(rendition.bytes)).await?;
        tracing::debug!(task_id = command.task_id, %stored, size, "rendition stored");
        let output = json!({
            "key": stored.as_str(),
            "width": rendition.width,
            "height": rendition.height,
            "format": rendition.format.as_str(),
            "bytes": size,
            "source": source,
        });
        match output {
            Value::Object(map) => Ok(map),
            _ => unreachable!("json! of an object"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use image::{Rgb, RgbImage};
    use imagepipe_blob::LocalBlobStore;
    use imagepipe_contracts::Step;

    use super::*;
    use crate::render::{Band, OutputFormat};

    fn store() -> (tempfile::TempDir, Arc<dyn BlobStore>) {
        let dir = tempfile::tempdir().unwrap();
        let blobs: Arc<dyn BlobStore> = Arc::new(LocalBlobStore::new(dir.path()));
        (dir, blobs)
    }

    fn command(blobs: StageBlobs) -> StageCommand {
        StageCommand {
            task_id: "tsk_rendition".into(),
            stage: Step::named("rendition").unwrap(),
            attempt: 1,
            blobs,
            format: "png".into(),
            inputs: Default::default(),
            labels: Default::default(),
        }
    }

    fn png(width: u32, height: u32, colour: [u8; 3]) -> Bytes {
        let mut bytes = Vec::new();
        RgbImage::from_pixel(width, height, Rgb(colour))
            .write_to(&mut Cursor::new(&mut bytes), image::ImageFormat::Png)
            .unwrap();
        Bytes::from(bytes)
    }

    #[tokio::test]
    async fn the_preview_is_rendered_stored_and_reported() {
        let (_dir, blobs) = store();
        let original = blobs.put(png(900, 600, [10, 10, 10])).await.unwrap();
        let preview = blobs.put(png(600, 400, [200, 180, 160])).await.unwrap();
        let spec = RenditionSpec { max_side: 300, ..RenditionSpec::default() };
        let handler = RenditionHandler::new(blobs.clone(), spec);
        let output = handler
            .process(&command(StageBlobs {
                original: original.to_string(),
                derivatives: Default::default(),
                preview: Some(preview.to_string()),
            }))
            .await
            .unwrap();
        assert_eq!(output["width"], 300);
        assert_eq!(output["height"], 200);
        assert_eq!(output["format"], OutputFormat::Jpeg.as_str());
        assert_eq!(output["source"], preview.as_str(), "the preview, not the original");
        let key: BlobKey = output["key"].as_str().unwrap().parse().unwrap();
        let stored = blobs.get(&key).await.unwrap();
        assert_eq!(output["bytes"], stored.len());
        let image = image::load_from_memory(&stored).unwrap().into_rgb8();
        assert_eq!(image.dimensions(), (300, 200));
        // The preview's colour above the band, not the original's; darker in it.
        let above = image.get_pixel(150, 20).0;
        assert!(above.iter().zip([200, 180, 160]).all(|(a, b)| a.abs_diff(b) <= 3), "{above:?}");
        let in_band = image.get_pixel(299, Band::of(200).top + 2).0;
        assert!(in_band.iter().zip([90, 81, 72]).all(|(a, b)| a.abs_diff(b) <= 4), "{in_band:?}");
    }

    #[tokio::test]
    async fn without_a_preview_the_original_is_rendered() {
        let (_dir, blobs) = store();
        let original = blobs.put(png(100, 50, [50, 100, 150])).await.unwrap();
        let handler = RenditionHandler::new(blobs, RenditionSpec::default());
        let output = handler
            .process(&command(StageBlobs { original: original.to_string(), ..StageBlobs::default() }))
            .await
            .unwrap();
        assert_eq!((output["width"].as_u64(), output["height"].as_u64()), (Some(100), Some(50)), "not enlarged");
        assert_eq!(output["source"], original.as_str());
    }

    #[tokio::test]
    async fn a_blob_that_cannot_be_read_is_retryable_and_an_undecodable_one_permanent() {
        let (dir, blobs) = store();
        let handler = RenditionHandler::new(blobs.clone(), RenditionSpec::default());
        let missing = BlobKey::of(b"never stored");
        let failure = handler
            .process(&command(StageBlobs { original: missing.to_string(), ..StageBlobs::default() }))
            .await
            .unwrap_err();
        assert!(failure.is_retryable(), "{failure:?}");
        assert_eq!(failure.error().code, "blob_not_found");

        let not_an_image = blobs.put(Bytes::from_static(b"plain text, no pixels")).await.unwrap();
        let failure = handler
            .process(&command(StageBlobs { original: not_an_image.to_string(), ..StageBlobs::default() }))
            .await
            .unwrap_err();
        assert!(!failure.is_retryable(), "{failure:?}");
        assert_eq!(failure.error().code, crate::render::codes::UNDECODABLE);

        let failure = handler
            .process(&command(StageBlobs { original: "md5:nope".into(), ..StageBlobs::default() }))
            .await
            .unwrap_err();
        assert_eq!((failure.error().code.as_str(), failure.is_retryable()), ("invalid_blob_key", false));

        // A store that fails to read (its directory is a file now): retryable too.
        let stored = blobs.put(png(8, 8, [1, 2, 3])).await.unwrap();
        std::fs::remove_dir_all(dir.path()).unwrap();
        std::fs::write(dir.path(), b"not a directory").unwrap();
        let failure = handler
            .process(&command(StageBlobs { original: stored.to_string(), ..StageBlobs::default() }))
            .await
            .unwrap_err();
        assert!(failure.is_retryable(), "{failure:?}");
        let _ = std::fs::remove_file(dir.path());
    }
}
