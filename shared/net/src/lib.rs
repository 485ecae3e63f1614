//! Outbound HTTP for imagepipe's download and webhook clients, guarded against SSRF
//! (docs/design.md, "Security defaults").
//!
//! - [`policy`]: one pure function deciding whether an IP address may be reached, with an
//!   allowlist of CIDRs (`net.allow_cidrs`) for tests and private deployments.
//! - [`GuardedClient`]: an HTTP(S) client (reqwest, rustls) that resolves every host itself
//!   through a [`Resolver`], checks every address before the connector sees it and connects only
//!   to approved ones (no second lookup), follows at most [`Limits::max_redirects`] redirects by
//!   hand (each hop re-checked, http and https only), and enforces connect, read (idle) and
//!   total timeouts and a body size limit while the body streams. Every refusal names the
//!   setting that would allow the address ([`ClientBuilder::allowlist_setting`]); every URL in
//!   an error is [redacted](redacted_url) to scheme, host and path.
//! - [`retry_after`]: the `Retry-After` header, in seconds or as an HTTP date.
//!
//! With the `testing` feature, [`testing`] offers a loopback fixture server and a dial check
//! that refuses (and records) every address beyond loopback.

mod client;
mod error;
mod guard;
pub mod policy;
mod resolve;
pub mod retry_after;
#[cfg(feature = "testing")]
pub mod testing;

pub use client::{ClientBuilder, GuardedClient, Limits, Request, Response, redacted as redacted_url};
pub use error::{BuildError, FetchError, TimeoutKind};
pub use guard::DialCheck;
pub use policy::Blocked;
pub use reqwest::{Method, StatusCode, Url, header};
pub use resolve::{Resolver, StaticResolver, SystemResolver};
