//! imagepipe download-worker: the download worker: fetches a task's source image into the blob store.
//!
//! Not built yet: issue #5 builds it. The binary refuses to start until then.

/// The issue that builds this service.
pub const BUILT_BY_ISSUE: u32 = 5;
