//! For tests (the `testing` feature): the `blob.s3` settings of the S3-compatible server the test
//! scripts start (SeaweedFS's S3 gateway, `scripts/seaweedfs.sh`), read from the variables the
//! script exports.

use std::time::Duration;

use imagepipe_secret::Secret;

use crate::S3Config;

/// Where the S3 gateway listens (`http://127.0.0.1:<port>`).
pub const ENDPOINT_ENV: &str = "IMAGEPIPE_TEST_S3_ENDPOINT";
/// The bucket the script created.
pub const BUCKET_ENV: &str = "IMAGEPIPE_TEST_S3_BUCKET";
/// The access key id the gateway admits.
pub const ACCESS_KEY_ID_ENV: &str = "IMAGEPIPE_TEST_S3_ACCESS_KEY_ID";
/// Its secret.
pub const SECRET_ACCESS_KEY_ENV: &str = "IMAGEPIPE_TEST_S3_SECRET_ACCESS_KEY";

/// The test server's `blob.s3` settings with blobs under `prefix`, each request retried for up to
/// `retry_timeout`; `None` (after failing, or printing `SKIPPED` under
/// `IMAGEPIPE_TEST_ALLOW_SKIP=1`) when the script provided no server.
pub fn s3_config(prefix: &str, retry_timeout: Duration) -> Option<S3Config> {
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
    Some(S3Config {
        bucket,
        prefix: prefix.to_owned(),
        region: Some("us-east-1".into()),
        endpoint: Some(endpoint),
        access_key_id: Some(id),
        secret_access_key: Some(Secret::new(secret)),
        allow_http: true,
        retry_timeout,
    })
}
