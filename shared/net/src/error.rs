//! What can go wrong fetching a URL through the guarded client.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use crate::policy::Blocked;

/// Which time limit ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutKind {
    /// Resolving and connecting to one hop took longer than the connect timeout.
    Connect,
    /// No byte arrived within the read timeout: no response head after the request went out,
    /// or no next piece of the body.
    Read,
    /// The whole exchange (every redirect and the body) took longer than the total timeout.
    Total,
}

/// A request that did not produce a response. Every variant names the URL (without its password).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL does not parse or has no host.
    #[error("{url:?} is not a usable URL: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The URL's scheme is neither http nor https.
    #[error("{url}: scheme {scheme:?} is not allowed (only http and https)")]
    Scheme {
        /// The URL.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// The SSRF guard refused an address the host resolves to; nothing was sent to it.
    #[error("{url}: {host} resolves to {addr}, {reason}, which is not allowed{}", way_out(*.addr, .allowlist_setting.as_deref()))]
    Refused {
        /// The URL.
        url: String,
        /// Its host.
        host: String,
        /// The refused address.
        addr: IpAddr,
        /// Why it is refused.
        reason: Blocked,
        /// The setting that would allow it ([`ClientBuilder::allowlist_setting`]).
        ///
        /// [`ClientBuilder::allowlist_setting`]: crate::ClientBuilder::allowlist_setting
        allowlist_setting: Option<String>,
    },
    /// The host name could not be resolved.
    #[error("{url}: resolving {host}")]
    Resolve {
        /// The URL.
        url: String,
        /// Its host.
        host: String,
        /// The resolver's error.
        #[source]
        source: io::Error,
    },
    /// A redirect went past the limit.
    #[error("{url}: more than {limit} redirects")]
    TooManyRedirects {
        /// The URL that redirected once too often.
        url: String,
        /// The limit.
        limit: u32,
    },
    /// A redirect's `Location` is missing or not a URL.
    #[error("{url}: redirect with an unusable Location {location:?}")]
    BadRedirect {
        /// The redirecting URL.
        url: String,
        /// The `Location` header, as received.
        location: String,
    },
    /// The body is larger than the limit; the transfer was cut off when it passed it.
    #[error("{url}: body larger than the limit of {limit} bytes")]
    TooLarge {
        /// The URL.
        url: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// A time limit ran out.
    #[error("{url}: timed out after {after:?} ({kind:?} timeout)")]
    Timeout {
        /// The URL being fetched when time ran out.
        url: String,
        /// Which limit.
        kind: TimeoutKind,
        /// Its length.
        after: Duration,
    },
    /// No connection could be made.
    #[error("{url}: connection failed")]
    Connect {
        /// The URL.
        url: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },
    /// The connection failed during the exchange.
    #[error("{url}: transfer failed")]
    Transport {
        /// The URL.
        url: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },
    /// The client's dial check (an extra check of every address before it is dialled) refused one.
    #[error("{url}: the dial check refused {addr}")]
    DialRefused {
        /// The URL.
        url: String,
        /// The refused address.
        addr: IpAddr,
    },
}

impl FetchError {
    /// Whether a later attempt may succeed: timeouts, failed resolution, connection and transfer
    /// errors. A refused address, a bad URL, a redirect loop or an oversized body will not change.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            FetchError::Resolve { .. }
                | FetchError::Timeout { .. }
                | FetchError::Connect { .. }
                | FetchError::Transport { .. }
        )
    }
}

/// How a refusal tells the way out: the single-address entry of `setting` that allows `addr`.
fn way_out(addr: IpAddr, setting: Option<&str>) -> String {
    let Some(setting) = setting else { return String::new() };
    let prefix = if addr.is_ipv4() { 32 } else { 128 };
    format!("; to reach it anyway, add {addr}/{prefix} to {setting}")
}

/// The client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the HTTP client")]
pub struct BuildError(#[source] pub(crate) reqwest::Error);
