//! Name resolution, behind a seam so tests can map names to any address without DNS.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;

use async_trait::async_trait;

/// Turns a host name into the addresses it points at.
#[async_trait]
pub trait Resolver: Send + Sync + 'static {
    /// Every address of `host` (a domain name, never an IP literal). An empty list is an error.
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>>;
}

/// The operating system's resolver, through tokio's `lookup_host`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let addrs: Vec<IpAddr> = tokio::net::lookup_host((host, 0)).await?.map(|a| a.ip()).collect();
        if addrs.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{host} has no addresses")));
        }
        Ok(addrs)
    }
}

/// A fixed table of names (for tests and pinned deployments); any other name fails to resolve.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    table: HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `host` (case-insensitive) to `addrs`, replacing any earlier entry.
    pub fn with(mut self, host: &str, addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        self.table.insert(host.to_ascii_lowercase(), addrs.into_iter().collect());
        self
    }
}

#[async_trait]
impl Resolver for StaticResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        match self.table.get(&host.to_ascii_lowercase()) {
            Some(addrs) if !addrs.is_empty() => Ok(addrs.clone()),
            _ => Err(io::Error::new(io::ErrorKind::NotFound, format!("{host} is not in the static table"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_static_table_answers_only_its_names() {
        let resolver = StaticResolver::new().with("Evil.test", ["169.254.169.254".parse().unwrap()]);
        assert_eq!(resolver.resolve("evil.TEST").await.unwrap(), vec!["169.254.169.254".parse::<IpAddr>().unwrap()]);
        assert_eq!(resolver.resolve("other.test").await.unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn the_system_resolver_answers_without_sending_a_query_for_literals() {
        // An IP literal is parsed, never looked up, so this test sends nothing.
        let addrs = SystemResolver.resolve("127.0.0.1").await.unwrap();
        assert_eq!(addrs, vec![IpAddr::from([127, 0, 0, 1])]);
    }
}
