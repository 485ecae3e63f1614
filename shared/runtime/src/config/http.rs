//! The `http` section: each service's HTTP server (health, metrics, its API).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use super::{ConfigError, Secret};

/// The `http` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Address to listen on.
    pub bind: IpAddr,
    /// Port of the service's HTTP server (health, metrics, its API).
    pub port: u16,
    /// Bearer token the HTTP API requires, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_token: Option<Secret<String>>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self { bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED), port: 8080, auth_token: None }
    }
}

impl HttpConfig {
    /// `bind:port`.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.port)
    }
}

impl HttpConfig {
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
        Ok(())
    }
}
