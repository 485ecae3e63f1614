//! imagepipe ai-worker: the AI worker: labels and tags images with a real model.
//!
//! Not built yet: issue #5 builds it. The binary refuses to start until then.

/// The issue that builds this service.
pub const BUILT_BY_ISSUE: u32 = 5;
