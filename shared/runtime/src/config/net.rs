//! The `net` section: the outbound network policy of the download and webhook clients.

use imagepipe_net::{ClientBuilder, GuardedClient, Limits};
use serde::{Deserialize, Serialize};

use super::{ConfigError, list_or_comma_separated};

/// The `net` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// CIDRs the download and webhook clients may reach despite the SSRF guard
    /// (`10.0.0.0/8`, `::1/128`); a comma-separated list in the environment.
    #[serde(deserialize_with = "list_or_comma_separated")]
    pub allow_cidrs: Vec<String>,
}

impl NetConfig {
    /// The allowed networks, parsed; the error names the offending entry.
    pub fn allowed_networks(&self) -> Result<Vec<ipnet::IpNet>, ConfigError> {
        self.allow_cidrs
            .iter()
            .enumerate()
            .map(|(i, cidr)| {
                cidr.trim().parse().map_err(|e| ConfigError::Invalid {
                    key: format!("net.allow_cidrs[{i}]"),
                    reason: format!("{cidr:?} is not a CIDR such as 10.0.0.0/8 ({e})"),
                })
            })
            .collect()
    }

    /// The SSRF-guarded client these settings allow, with `limits` and `user_agent` and the
    /// system resolver; tests replace the resolver and add a dial check before building it.
    pub fn client_builder(&self, limits: Limits, user_agent: impl Into<String>) -> Result<ClientBuilder, ConfigError> {
        Ok(GuardedClient::builder().allow(self.allowed_networks()?).limits(limits).user_agent(user_agent.into()))
    }
}
