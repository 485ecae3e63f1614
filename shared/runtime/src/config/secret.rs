//! Secrets in config are the bus crate's [`imagepipe_bus::secret`] types, so one masking rule
//! covers every section.

pub use imagepipe_bus::secret::{MASK, Secret, SecretUrl, mask_url_credentials};
