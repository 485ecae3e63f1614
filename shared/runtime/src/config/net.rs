//! The `net` section: the outbound network policy of the download and webhook clients.

use imagepipe_net::{ClientBuilder, GuardedClient, Limits};
use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::load::key_to_env_name;
use super::{ConfigError, Settings, list_or_comma_separated_of};

/// The `net` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// CIDRs the download and webhook clients may reach despite the SSRF guard
    /// (`10.0.0.0/8`, `::1/128`); a comma-separated list in the environment. The default of
    /// `download.allow_cidrs` and `notification.allow_cidrs`, each of which replaces it for its
    /// client when set.
    #[serde(deserialize_with = "list_or_comma_separated_of")]
    pub allow_cidrs: Vec<String>,
}

impl NetConfig {
    /// The allowed networks, parsed; the error names the offending entry.
    pub fn allowed_networks(&self) -> Result<Vec<IpNet>, ConfigError> {
        parse_cidrs("net.allow_cidrs", &self.allow_cidrs)
    }
}

/// An outbound HTTP client with an allowlist of its own, which inherits `net.allow_cidrs`
/// while it is unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outbound {
    /// The download worker's client: `download.allow_cidrs`.
    Download,
    /// The notification worker's webhook client: `notification.allow_cidrs`.
    Notification,
}

impl Outbound {
    /// The client's allowlist key.
    pub const fn allowlist_key(self) -> &'static str {
        match self {
            Outbound::Download => "download.allow_cidrs",
            Outbound::Notification => "notification.allow_cidrs",
        }
    }
}

impl Settings {
    /// The networks `client` may reach despite the SSRF guard: its own allowlist when set,
    /// `net.allow_cidrs` otherwise. The error names the offending entry of the key it came from
    /// (`download.allow_cidrs[2]`).
    pub fn allowed_networks(&self, client: Outbound) -> Result<Vec<IpNet>, ConfigError> {
        let own = match client {
            Outbound::Download => &self.download.allow_cidrs,
            Outbound::Notification => &self.notification.allow_cidrs,
        };
        match own {
            Some(cidrs) => parse_cidrs(client.allowlist_key(), cidrs),
            None => self.net.allowed_networks(),
        }
    }

    /// The SSRF-guarded client `client` may use, with `limits`, `user_agent` and the system
    /// resolver; its refusals name the client's allowlist key and environment variable. Tests
    /// replace the resolver and add a dial check before building it.
    pub fn client_builder(
        &self,
        client: Outbound,
        limits: Limits,
        user_agent: impl Into<String>,
    ) -> Result<ClientBuilder, ConfigError> {
        let key = client.allowlist_key();
        Ok(GuardedClient::builder()
            .allow(self.allowed_networks(client)?)
            .allowlist_setting(format!("{key} ({})", key_to_env_name(key)))
            .limits(limits)
            .user_agent(user_agent.into()))
    }
}

/// `cidrs`, the value of `key`, parsed; the error names the offending entry (`key[2]`).
pub(super) fn parse_cidrs(key: &str, cidrs: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    cidrs
        .iter()
        .enumerate()
        .map(|(i, cidr)| {
            cidr.trim().parse().map_err(|e| ConfigError::Invalid {
                key: format!("{key}[{i}]"),
                reason: format!("{cidr:?} is not a CIDR such as 10.0.0.0/8 ({e})"),
            })
        })
        .collect()
}
