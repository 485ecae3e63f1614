//! The SSRF guard between the HTTP client and the network: it resolves a host itself, checks
//! every address with the [policy](crate::policy), and hands the connector only approved
//! addresses, so the address checked is the address dialled (no second lookup).

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::policy::{self, Blocked};
use crate::resolve::Resolver;

/// A last check of every address just before it is dialled, after the policy approved it.
/// Production clients have none; tests install one that fails on anything beyond loopback.
pub trait DialCheck: Send + Sync + 'static {
    /// Whether `addr` may be dialled.
    fn allow(&self, addr: IpAddr) -> bool;
}

impl<F: Fn(IpAddr) -> bool + Send + Sync + 'static> DialCheck for F {
    fn allow(&self, addr: IpAddr) -> bool {
        self(addr)
    }
}

/// Why the guard gave the connector no address.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GuardError {
    #[error("{host} resolves to {addr}, {reason}")]
    Refused { host: String, addr: IpAddr, reason: Blocked },
    #[error("resolving {host}")]
    Resolve {
        host: String,
        #[source]
        source: io::Error,
    },
    #[error("the dial check refused {addr}")]
    DialRefused { addr: IpAddr },
}

/// The policy, the resolver and the dial check of one client.
pub(crate) struct Guard {
    allow: Vec<IpNet>,
    resolver: Arc<dyn Resolver>,
    dial_check: Option<Arc<dyn DialCheck>>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard").field("allow", &self.allow).finish_non_exhaustive()
    }
}

impl Guard {
    pub(crate) fn new(allow: Vec<IpNet>, resolver: Arc<dyn Resolver>, dial_check: Option<Arc<dyn DialCheck>>) -> Self {
        Self { allow, resolver, dial_check }
    }

    /// Checks an address that is about to be dialled as `host`.
    pub(crate) fn approve(&self, host: &str, addr: IpAddr) -> Result<(), GuardError> {
        policy::check(addr, &self.allow).map_err(|reason| GuardError::Refused {
            host: host.to_owned(),
            addr,
            reason,
        })?;
        match &self.dial_check {
            Some(check) if !check.allow(addr) => Err(GuardError::DialRefused { addr }),
            _ => Ok(()),
        }
    }

    /// Resolves `host` and approves every address; one refused address refuses the host.
    pub(crate) async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, GuardError> {
        let addrs = self
            .resolver
            .resolve(host)
            .await
            .map_err(|source| GuardError::Resolve { host: host.to_owned(), source })?;
        if addrs.is_empty() {
            let source = io::Error::new(io::ErrorKind::NotFound, "no addresses");
            return Err(GuardError::Resolve { host: host.to_owned(), source });
        }
        for &addr in &addrs {
            self.approve(host, addr)?;
        }
        Ok(addrs)
    }
}

/// The guard as reqwest's DNS resolver: the only way the client learns an address.
#[derive(Debug, Clone)]
pub(crate) struct GuardedDns(pub(crate) Arc<Guard>);

impl Resolve for GuardedDns {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.0.clone();
        Box::pin(async move {
            let addrs = guard.resolve(name.as_str()).await?;
            // Port 0 is replaced by the URL's port (or the scheme's default) when connecting.
            let addrs: Addrs = Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}
