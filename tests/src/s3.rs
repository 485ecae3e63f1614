//! The S3-compatible server of the tests (SeaweedFS's S3 gateway, started by
//! `scripts/seaweedfs.sh`): the `blob.s3` settings of a run on it, as a service's environment and
//! as a test-side client that looks at what the services stored.

use std::time::Duration;

use imagepipe_blob::{BlobConfig, BlobKind, S3Config};
use imagepipe_secret::Secret;

/// Where the S3 gateway listens (`http://127.0.0.1:<port>`).
pub const ENDPOINT_ENV: &str = "IMAGEPIPE_TEST_S3_ENDPOINT";
/// The bucket the script created.
pub const BUCKET_ENV: &str = "IMAGEPIPE_TEST_S3_BUCKET";
/// The access key id the gateway admits.
pub const ACCESS_KEY_ID_ENV: &str = "IMAGEPIPE_TEST_S3_ACCESS_KEY_ID";
/// Its secret.
pub const SECRET_ACCESS_KEY_ENV: &str = "IMAGEPIPE_TEST_S3_SECRET_ACCESS_KEY";

/// `blob.kind = "s3"` on the test server with blobs under `prefix`, or `None` (after failing, or
/// printing `SKIPPED` under `IMAGEPIPE_TEST_ALLOW_SKIP=1`) when no server was provided.
pub fn blob_config(prefix: &str) -> Option<BlobConfig> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(endpoint), Some(bucket), Some(id), Some(secret)) =
        (var(ENDPOINT_ENV), var(BUCKET_ENV), var(ACCESS_KEY_ID_ENV), var(SECRET_ACCESS_KEY_ENV))
    else {
        imagepipe_contracts::testing::environment_missing(&format!(
            "no S3 server: {ENDPOINT_ENV}, {BUCKET_ENV}, {ACCESS_KEY_ID_ENV} and {SECRET_ACCESS_KEY_ENV} are unset \
             (source scripts/seaweedfs.sh and run ensure_seaweedfs)"
        ));
        return None;
    };
    let s3 = S3Config {
        bucket,
        prefix: prefix.to_owned(),
        region: Some("us-east-1".into()),
        endpoint: Some(endpoint),
        access_key_id: Some(id),
        secret_access_key: Some(Secret::new(secret)),
        allow_http: true,
        retry_timeout: Duration::from_secs(30),
    };
    Some(BlobConfig { kind: BlobKind::S3, s3, ..BlobConfig::default() })
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
