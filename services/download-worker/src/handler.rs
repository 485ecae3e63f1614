//! The download step's [`StepHandler`]: fetch the image (or read the uploaded blob), check by
//! its magic bytes that it is an image, and store it under its content address.
//!
//! With [`Politeness`], a URL is fetched only once its host's slot is held (waiting in place
//! at most `download.per_host.max_wait`, else the step is deferred); the slot is given back as
//! soon as the response is in, before the blob is written. A 429 or 503 pauses the host that
//! answered it (the final URL's, after redirects) and is still reported as retryable.
//!
//! A URL leaves this module, in a log, an error or the step's output, only as
//! [`redacted_url`] shows it (scheme, host and path): user info and query strings often carry
//! credentials.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use imagepipe_blob::{BlobKey, BlobStore};
use imagepipe_contracts::command::{DownloadCommand, ImageSource};
use imagepipe_contracts::step::DownloadOutput;
use imagepipe_net::{GuardedClient, Response, redacted_url};
use imagepipe_runtime::step::{StepFailure, StepHandler};

use crate::error::{DownloadError, MAX_RETRY_AFTER};
use crate::metrics;
use crate::politeness::{Politeness, host_key, url_host_key};
use imagepipe_blob::sniff::{ImageFormat, Sniffed, sniff};

/// Handles `tasks.download` commands (see the module docs).
pub struct DownloadHandler {
    client: GuardedClient,
    blobs: Arc<dyn BlobStore>,
    politeness: Option<Politeness>,
}

impl DownloadHandler {
    /// A handler fetching with `client` (whose limits apply to uploaded blobs too) and storing
    /// into `blobs`, without per-host limits (see [`with_politeness`](Self::with_politeness)).
    pub fn new(client: GuardedClient, blobs: Arc<dyn BlobStore>) -> Self {
        Self { client, blobs, politeness: None }
    }

    /// This handler, holding each URL's host to the limits of `politeness`.
    pub fn with_politeness(mut self, politeness: Politeness) -> Self {
        self.politeness = Some(politeness);
        self
    }

    /// Brings the image of `source` into the blob store and describes it.
    pub async fn download(&self, source: &ImageSource) -> Result<DownloadOutput, DownloadError> {
        let started = Instant::now();
        let (kind, result) = match source {
            ImageSource::Url(url) => (metrics::SOURCE_URL, self.fetch(url).await),
            ImageSource::Blob(key) => (metrics::SOURCE_BLOB, self.validate_blob(key).await),
        };
        // A deferral downloaded nothing and failed nothing: the politeness metrics count it.
        if matches!(result, Err(DownloadError::Deferred(_))) {
            return result;
        }
        ::metrics::histogram!(metrics::DOWNLOAD_DURATION, metrics::SOURCE => kind)
            .record(started.elapsed().as_secs_f64());
        match &result {
            Ok(output) => {
                ::metrics::counter!(metrics::DOWNLOADED_BYTES, metrics::SOURCE => kind).increment(output.size)
            }
            Err(error) => ::metrics::counter!(metrics::FAILURES, metrics::CODE => error.code()).increment(1),
        }
        result
    }

    async fn fetch(&self, url: &str) -> Result<DownloadOutput, DownloadError> {
        let response = match (&self.politeness, host_key(url)) {
            (Some(politeness), Some(host)) => self.fetch_politely(politeness, &host, url).await?,
            _ => self.client.get(url).await?,
        };
        let final_url = redacted_url(&response.final_url);
        if !response.status.is_success() {
            let retry_after = response.retry_after(SystemTime::now()).map(|d| d.min(MAX_RETRY_AFTER));
            return Err(DownloadError::Status { url: final_url, status: response.status, retry_after });
        }
        let format = image_format(&response.body)?;
        let size = response.body.len() as u64;
        let key = self.blobs.put(response.body).await?;
        Ok(output(key, size, format, Some(final_url)))
    }

    /// `GET url` holding a slot of `host`; a 429 or 503 pauses the host that answered.
    async fn fetch_politely(&self, politeness: &Politeness, host: &str, url: &str) -> Result<Response, DownloadError> {
        let slot = politeness.acquire(host).await?;
        let response = match self.client.get(url).await {
            Ok(response) => response,
            Err(error) => {
                slot.release(false).await;
                return Err(error.into());
            }
        };
        let status = response.status;
        let throttled = matches!(status.as_u16(), 429 | 503);
        if throttled {
            let answered = url_host_key(&response.final_url).unwrap_or_else(|| host.to_owned());
            let retry_after = response.retry_after(SystemTime::now()).map(|d| d.min(MAX_RETRY_AFTER));
            politeness.throttled(&answered, status, retry_after).await;
        }
        slot.release(!throttled && !status.is_server_error()).await;
        Ok(response)
    }

    async fn validate_blob(&self, key: &str) -> Result<DownloadOutput, DownloadError> {
        let key: BlobKey = key.parse()?;
        let bytes: Bytes = self.blobs.get(&key).await?;
        let (size, limit) = (bytes.len() as u64, self.client.limits().max_bytes);
        if size > limit {
            return Err(DownloadError::BlobTooLarge { size, limit });
        }
        let format = image_format(&bytes)?;
        Ok(output(key, size, format, None))
    }
}

fn image_format(bytes: &[u8]) -> Result<ImageFormat, DownloadError> {
    match sniff(bytes) {
        Sniffed::Image(format) => Ok(format),
        Sniffed::Other(detected) => Err(DownloadError::NotAnImage { detected }),
    }
}

fn output(key: BlobKey, size: u64, format: ImageFormat, final_url: Option<String>) -> DownloadOutput {
    DownloadOutput {
        sha256: key.hex().to_owned(),
        blob_key: key.to_string(),
        size,
        format: format.as_str().to_owned(),
        final_url,
    }
}

#[async_trait]
impl StepHandler for DownloadHandler {
    type Command = DownloadCommand;

    async fn process(&self, command: &DownloadCommand) -> Result<DownloadOutput, StepFailure> {
        let image = self.download(&command.source).await?;
        tracing::info!(task_id = %command.task_id, blob_key = %image.blob_key, size = image.size,
            format = %image.format, final_url = image.final_url.as_deref(), "image downloaded");
        Ok(image)
    }
}
