//! imagepipe metadata-worker: the metadata worker: decodes the image, reads EXIF, hashes, writes a thumbnail.
//!
//! Not built yet: issue #5 builds it. The binary refuses to start until then.

/// The issue that builds this service.
pub const BUILT_BY_ISSUE: u32 = 5;
