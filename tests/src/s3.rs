//! The S3-compatible server of the tests (SeaweedFS's S3 gateway, started by
//! `scripts/seaweedfs.sh`): the `blob.s3` settings of a run on it, as a service's environment and
//! as a test-side client that looks at what the services stored.

use std::time::Duration;

use imagepipe_blob::{BlobConfig, BlobKind};

pub use imagepipe_blob::testing::{ACCESS_KEY_ID_ENV, BUCKET_ENV, ENDPOINT_ENV, SECRET_ACCESS_KEY_ENV};

/// `blob.kind = "s3"` on the test server with blobs under `prefix`, or `None` (after failing, or
/// printing `SKIPPED` under `IMAGEPIPE_TEST_ALLOW_SKIP=1`) when no server was provided.
pub fn blob_config(prefix: &str) -> Option<BlobConfig> {
    let s3 = imagepipe_blob::testing::s3_config(prefix, Duration::from_secs(30))?;
    Some(BlobConfig { kind: BlobKind::S3, s3, ..BlobConfig::default() })
}

/// `config` with every service storing its blobs as `blob` says.
pub fn with_blobs(mut config: crate::cluster::ClusterConfig, blob: &BlobConfig) -> crate::cluster::ClusterConfig {
    for (key, value) in service_env(blob) {
        config = config.env(&key, value);
    }
    config
}

/// The `IMAGEPIPE_BLOB__…` environment of a service storing its blobs as `config` says.
pub fn service_env(config: &BlobConfig) -> Vec<(String, String)> {
    let s3 = &config.s3;
    let mut env = vec![
        ("IMAGEPIPE_BLOB__KIND".to_owned(), "s3".to_owned()),
        ("IMAGEPIPE_BLOB__S3__BUCKET".to_owned(), s3.bucket.clone()),
        ("IMAGEPIPE_BLOB__S3__PREFIX".to_owned(), s3.prefix.clone()),
        ("IMAGEPIPE_BLOB__S3__ALLOW_HTTP".to_owned(), s3.allow_http.to_string()),
        ("IMAGEPIPE_BLOB__S3__RETRY_TIMEOUT".to_owned(), format!("{}s", s3.retry_timeout.as_secs())),
    ];
    let optional = [
        ("IMAGEPIPE_BLOB__S3__REGION", s3.region.clone()),
        ("IMAGEPIPE_BLOB__S3__ENDPOINT", s3.endpoint.clone()),
        ("IMAGEPIPE_BLOB__S3__ACCESS_KEY_ID", s3.access_key_id.clone()),
        ("IMAGEPIPE_BLOB__S3__SECRET_ACCESS_KEY", s3.secret_access_key.as_ref().map(|s| s.expose().clone())),
    ];
    env.extend(optional.into_iter().filter_map(|(name, value)| Some((name.to_owned(), value?))));
    env
}
