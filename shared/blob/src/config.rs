//! The `blob` section of the config and the store it opens.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use imagepipe_secret::Secret;
use object_store::RetryConfig;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{BlobStore, LocalBlobStore, ObjectBlobStore};

/// Which blob store to use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BlobKind {
    /// A local directory, `blob.dir` (one host, or a volume shared by the containers).
    #[default]
    Local,
    /// An S3-compatible object store, `blob.s3.*`.
    S3,
}

/// The `blob` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct BlobConfig {
    /// Backend.
    pub kind: BlobKind,
    /// Directory of the local blob store.
    pub dir: PathBuf,
    /// S3 settings.
    pub s3: S3Config,
    /// How long a blob no task references is kept after it was last written (uploaded, or
    /// stored by a worker) before the coordinator deletes it: submit an upload within it. The
    /// blobs of an expired task go at once when they are this old.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub orphan_grace: Duration,
}

impl Default for BlobConfig {
    fn default() -> Self {
        Self {
            kind: BlobKind::Local,
            dir: PathBuf::from(".imagepipe/blobs"),
            s3: S3Config::default(),
            orphan_grace: Duration::from_secs(24 * 3600),
        }
    }
}

/// The `blob.s3` section. Credentials left empty come from the usual AWS environment
/// (`AWS_ACCESS_KEY_ID`, instance metadata, ...). Any S3-compatible service will do (AWS S3,
/// MinIO, Ceph, R2, SeaweedFS's S3 gateway: the tests run on SeaweedFS). Blobs over 8 MiB go up
/// as multipart uploads; docs/blobs.md has the details.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix inside the bucket, kept as written (spaces, reserved and non-ASCII characters
    /// included; no control character, no empty, `.` or `..` segment).
    pub prefix: String,
    /// Region, e.g. `eu-west-1`.
    pub region: Option<String>,
    /// Endpoint of an S3-compatible service, e.g. `http://minio:9000`.
    pub endpoint: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key (masked whenever printed).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub secret_access_key: Option<Secret<String>>,
    /// Allow plain-HTTP endpoints (local MinIO).
    pub allow_http: bool,
    /// How long a request to the service is tried again (with backoff, from 100 ms up to 15 s
    /// apart) when it fails on the network or with a 5xx, before the blob operation fails with
    /// a retryable error (a worker step is then retried by the pipeline; the API answers `503`).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub retry_timeout: Duration,
}

impl Default for S3Config {
    fn default() -> Self {
        Self {
            bucket: String::new(),
            prefix: String::new(),
            region: None,
            endpoint: None,
            access_key_id: None,
            secret_access_key: None,
            allow_http: false,
            retry_timeout: Duration::from_secs(180),
        }
    }
}

/// A blob config that cannot open a store; names the key.
#[derive(Debug, thiserror::Error)]
pub enum BlobConfigError {
    /// A required key is missing or a value is unusable.
    #[error("{key}: {reason}")]
    Invalid {
        /// The config key.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl S3Config {
    /// A client of the bucket (no request is made yet): what [`BlobConfig::open`] stores blobs
    /// in, under [`S3Config::prefix`].
    pub fn object_store(&self) -> Result<AmazonS3, BlobConfigError> {
        // The time bounds the retries, not a count: the default 10 retries, jittered from
        // 100 ms, ran out within seconds of an outage, long before `retry_timeout`.
        let retry =
            RetryConfig { retry_timeout: self.retry_timeout, max_retries: usize::MAX, ..RetryConfig::default() };
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&self.bucket)
            .with_allow_http(self.allow_http)
            .with_retry(retry);
        if let Some(region) = &self.region {
            builder = builder.with_region(region);
        }
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(id) = &self.access_key_id {
            builder = builder.with_access_key_id(id);
        }
        if let Some(secret) = &self.secret_access_key {
            builder = builder.with_secret_access_key(secret.expose());
        }
        builder.build().map_err(|e| BlobConfigError::Invalid { key: "blob.s3", reason: e.to_string() })
    }
}

impl BlobConfig {
    /// Checks the values the chosen backend needs.
    pub fn validate(&self) -> Result<(), BlobConfigError> {
        if self.orphan_grace.is_zero() {
            return Err(BlobConfigError::Invalid {
                key: "blob.orphan_grace",
                reason: "must be longer than zero (e.g. 24h): an upload needs time to be submitted".into(),
            });
        }
        match self.kind {
            BlobKind::Local if self.dir.as_os_str().is_empty() => {
                Err(BlobConfigError::Invalid { key: "blob.dir", reason: "must not be empty".into() })
            }
            BlobKind::S3 if self.s3.bucket.is_empty() => Err(BlobConfigError::Invalid {
                key: "blob.s3.bucket",
                reason: "required when blob.kind = \"s3\"".into(),
            }),
            BlobKind::S3 if object_store::path::Path::parse(self.s3.prefix.trim_matches('/')).is_err() => {
                Err(BlobConfigError::Invalid {
                    key: "blob.s3.prefix",
                    reason: format!(
                        "{:?} is no object key prefix: no empty, `.` or `..` segment, no control character",
                        self.s3.prefix
                    ),
                })
            }
            BlobKind::S3 if self.s3.retry_timeout.is_zero() => Err(BlobConfigError::Invalid {
                key: "blob.s3.retry_timeout",
                reason: "must be longer than zero (e.g. 3m)".into(),
            }),
            _ => Ok(()),
        }
    }

    /// Opens the configured store.
    pub fn open(&self) -> Result<Arc<dyn BlobStore>, BlobConfigError> {
        self.validate()?;
        match self.kind {
            BlobKind::Local => Ok(Arc::new(LocalBlobStore::new(&self.dir))),
            BlobKind::S3 => {
                let store = self.s3.object_store()?;
                Ok(Arc::new(ObjectBlobStore::new(Arc::new(store), self.s3.prefix.clone())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_needs_a_bucket_and_says_so() {
        let config = BlobConfig { kind: BlobKind::S3, ..BlobConfig::default() };
        let err = config.open().err().unwrap();
        assert!(err.to_string().starts_with("blob.s3.bucket"), "{err}");
    }

    #[test]
    fn an_s3_prefix_must_be_an_object_path() {
        for bad in ["a//b", "a/../b", "tab\there"] {
            let s3 = S3Config { bucket: "images".into(), prefix: bad.into(), ..S3Config::default() };
            let err = BlobConfig { kind: BlobKind::S3, s3, ..BlobConfig::default() }.open().err().unwrap();
            assert!(err.to_string().starts_with("blob.s3.prefix"), "{bad}: {err}");
        }
        let s3 = S3Config { bucket: "images".into(), prefix: "/photos 2024/été+ü/".into(), ..S3Config::default() };
        assert!(BlobConfig { kind: BlobKind::S3, s3, ..BlobConfig::default() }.open().is_ok());
    }

    #[test]
    fn an_s3_store_opens_without_contacting_the_service() {
        let s3 = S3Config {
            bucket: "images".into(),
            endpoint: Some("http://127.0.0.1:9".into()),
            region: Some("us-east-1".into()),
            access_key_id: Some("id".into()),
            secret_access_key: Some(Secret::new("secret".into())),
            allow_http: true,
            prefix: "blobs".into(),
            ..S3Config::default()
        };
        let config = BlobConfig { kind: BlobKind::S3, s3, ..BlobConfig::default() };
        assert!(config.open().is_ok());
        assert!(!format!("{config:?}").contains("secret\""), "secret printed: {config:?}");
    }
}
