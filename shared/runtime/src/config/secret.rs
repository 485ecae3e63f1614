//! Secrets in config are [`imagepipe_secret`] types, so one masking rule
//! covers every section.

pub use imagepipe_secret::{MASK, Secret, SecretUrl, mask_url_credentials};
