//! imagepipe notification-worker: the notification worker: posts signed webhooks for finished tasks.
//!
//! Not built yet: issue #6 builds it. The binary refuses to start until then.

/// The issue that builds this service.
pub const BUILT_BY_ISSUE: u32 = 6;
