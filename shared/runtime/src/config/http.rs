//! The `http` section: each service's HTTP server (health, metrics, its API), and its closed
//! doors: loopback by default, a token for anything wider, bounded connections and timeouts.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Secret, positive};

/// The `http` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Address to listen on: loopback by default. Any other address needs `auth_token`, or
    /// `allow_unauthenticated = true` said explicitly.
    pub bind: IpAddr,
    /// Port of the service's HTTP server (health, metrics, its API).
    pub port: u16,
    /// Bearer token every `/v1` route requires, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_token: Option<Secret<String>>,
    /// Allows a non-loopback `bind` without `auth_token` (e.g. behind a private network whose
    /// other doors are closed).
    pub allow_unauthenticated: bool,
    /// Most connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// Most `/v1/events` streams open at once; more are answered `503`.
    pub max_sse_clients: usize,
    /// A client that has not sent a whole request head within this time is disconnected (it
    /// also bounds how long a kept-alive connection waits for its next request).
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection on which no byte moved either way for this long is closed (event streams
    /// send a keep-alive every 15 s).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 8080,
            auth_token: None,
            allow_unauthenticated: false,
            max_connections: 1024,
            max_sse_clients: 64,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

impl HttpConfig {
    /// `bind:port`.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.port)
    }

    /// Refuses a listener beyond loopback without a token, unless `allow_unauthenticated` says
    /// so; checked at every service start, whatever built the settings.
    pub fn check_exposure(&self) -> Result<(), ConfigError> {
        if self.bind.is_loopback() || self.auth_token.is_some() || self.allow_unauthenticated {
            return Ok(());
        }
        Err(ConfigError::invalid(
            "http.bind",
            format!(
                "{} is not a loopback address and http.auth_token is not set: set http.auth_token \
                 (IMAGEPIPE_HTTP__AUTH_TOKEN), bind 127.0.0.1, or set http.allow_unauthenticated = true",
                self.bind
            ),
        ))
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.port == 0 {
            return Err(ConfigError::invalid("http.port", "must be 1-65535 (a server needs a fixed port)"));
        }
        if let Some(token) = &self.auth_token {
            let token = token.expose();
            if token.is_empty() || token.chars().any(char::is_whitespace) {
                return Err(ConfigError::invalid("http.auth_token", "must be non-empty without whitespace"));
            }
        }
        if self.max_connections == 0 {
            return Err(ConfigError::invalid("http.max_connections", "must be at least 1"));
        }
        positive("http.header_read_timeout", self.header_read_timeout)?;
        positive("http.idle_timeout", self.idle_timeout)?;
        self.check_exposure()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wider_bind_needs_a_token_or_an_explicit_opt_out() {
        let open = HttpConfig { bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED), ..HttpConfig::default() };
        let error = open.validate().unwrap_err().to_string();
        assert!(error.contains("http.bind") && error.contains("http.auth_token"), "{error}");
        assert!(!error.contains('\n'), "one line: {error}");

        let with_token = HttpConfig { auth_token: Some("t".to_owned().into()), ..open.clone() };
        assert!(with_token.validate().is_ok());
        let opted_out = HttpConfig { allow_unauthenticated: true, ..open };
        assert!(opted_out.validate().is_ok());
        assert!(HttpConfig::default().validate().is_ok(), "loopback by default");
        let v6 = HttpConfig { bind: "::1".parse().unwrap(), ..HttpConfig::default() };
        assert!(v6.validate().is_ok());
    }
}
