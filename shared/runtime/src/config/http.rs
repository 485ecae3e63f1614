//! The `http` section: each service's HTTP server (health, metrics, its API), and its closed
//! doors: loopback by default, tokens for anything wider (each of at least
//! [`MIN_TOKEN_BYTES`], with a [`Scope`]), failed attempts limited per client address, bounded
//! connections and timeouts.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, ListItem, Secret, list_or_comma_separated_of, positive};

/// Fewest bytes a token may have: 256 bits from `openssl rand -hex 32` (64 characters) or
/// `head -c 32 /dev/urandom | base64` (44) are beyond guessing.
pub const MIN_TOKEN_BYTES: usize = 32;

/// The command the token errors suggest.
const MAKE_A_TOKEN: &str = "make one with `openssl rand -hex 32`";

/// The name `http.auth_token` goes by among the tokens (in sessions and logs).
pub const AUTH_TOKEN_NAME: &str = "auth_token";

/// What a token may do; each scope includes the ones before it (`admin` ⊃ `operate` ⊃
/// `submit` ⊃ `read`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Sees tasks, blobs, stats, search results, queues, dead letters and events.
    Read,
    /// Also submits tasks (and uploads their images).
    Submit,
    /// Also pauses, resumes, cancels, retries, replays and reprocesses.
    Operate,
    /// Also purges dead letters and rebuilds the similarity index.
    Admin,
}

impl Scope {
    /// Every scope, least first.
    pub const ALL: [Scope; 4] = [Self::Read, Self::Submit, Self::Operate, Self::Admin];

    /// `read`, `submit`, `operate` or `admin`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Submit => "submit",
            Self::Operate => "operate",
            Self::Admin => "admin",
        }
    }

    /// Whether a holder of this scope may do what `needed` allows.
    pub fn allows(self, needed: Scope) -> bool {
        self >= needed
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|scope| scope.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("{s:?} is not a scope: read, submit, operate or admin"))
    }
}

/// One entry of `http.tokens`: a named token with its scope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScopedToken {
    /// Who holds it (`grafana`, `ci`): 1-64 characters of `[A-Za-z0-9_-]`, shown in logs and
    /// kept in the sessions it opens.
    pub name: String,
    /// The bearer token, at least 32 bytes ([`MIN_TOKEN_BYTES`]) without whitespace or commas.
    #[schemars(with = "String")]
    pub token: Secret<String>,
    /// What it may do.
    pub scope: Scope,
}

/// The `http` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Address to listen on: loopback by default. Any other address needs a token
    /// (`auth_token` or `tokens`), or `allow_unauthenticated = true` said explicitly.
    pub bind: IpAddr,
    /// Port of the service's HTTP server (health, metrics, its API).
    pub port: u16,
    /// Bearer token of scope `admin` every `/v1` route of every service accepts, when set (at
    /// least 32 bytes: `openssl rand -hex 32`); the dashboard's login token, and the token
    /// services send each other.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub auth_token: Option<Secret<String>>,
    /// More bearer tokens, each `{ name, token, scope }` with `scope` one of `read`, `submit`,
    /// `operate`, `admin`, each token at least 32 bytes; in the environment one string of
    /// comma-separated `name:scope:token` entries (`IMAGEPIPE_HTTP__TOKENS=grafana:read:<token>`).
    #[serde(deserialize_with = "list_or_comma_separated_of", skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<ScopedToken>,
    /// Allows a non-loopback `bind` without a token (e.g. behind a private network whose
    /// other doors are closed).
    pub allow_unauthenticated: bool,
    /// CIDRs of reverse proxies whose `X-Forwarded-For` and `X-Forwarded-Proto` are believed
    /// (the client address failed attempts are counted by, the `Secure` flag of the session
    /// cookie); comma-separated in the environment. Empty by default: no proxy is believed.
    #[serde(deserialize_with = "list_or_comma_separated_of")]
    pub trusted_proxies: Vec<String>,
    /// Failed token attempts (a wrong bearer token, a wrong login) one client address may make
    /// within `auth_failure_window`; beyond it, the address is answered `429 too_many_failures`
    /// with `Retry-After` until the window ends, whatever it sends.
    pub auth_failure_limit: u32,
    /// The window `auth_failure_limit` counts in.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub auth_failure_window: Duration,
    /// Most connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// Most `/v1/events` streams open at once; more are answered `503 too_many_clients`.
    pub max_sse_clients: usize,
    /// Most uploads (`POST /v1/blobs`, `POST /v1/search/similar`) each route group receives at
    /// once; each holds up to `download.max_bytes` in memory.
    pub max_uploads: usize,
    /// How long an upload waits for one of `max_uploads` before it is answered `503 busy` with
    /// `Retry-After`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub upload_wait: Duration,
    /// A client that has not sent a whole request head within this time is disconnected (it
    /// also bounds how long a kept-alive connection waits for its next request).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub header_read_timeout: Duration,
    /// A connection on which no byte moved either way for this long is closed (event streams
    /// send a keep-alive every 15 s).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub idle_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 8080,
            auth_token: None,
            tokens: Vec::new(),
            allow_unauthenticated: false,
            trusted_proxies: Vec::new(),
            auth_failure_limit: 10,
            auth_failure_window: Duration::from_secs(60),
            max_connections: 1024,
            max_sse_clients: 64,
            max_uploads: 8,
            upload_wait: Duration::from_secs(2),
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

    /// Whether any token is set (`auth_token` or `tokens`): without one, `/v1` is open to
    /// loopback.
    pub fn has_tokens(&self) -> bool {
        self.auth_token.is_some() || !self.tokens.is_empty()
    }

    /// Every token with its name and scope: `auth_token` first (named
    /// [`AUTH_TOKEN_NAME`], scope `admin`), then `tokens`.
    pub fn scoped_tokens(&self) -> Vec<ScopedToken> {
        let admin = self.auth_token.iter().map(|token| ScopedToken {
            name: AUTH_TOKEN_NAME.to_owned(),
            token: token.clone(),
            scope: Scope::Admin,
        });
        admin.chain(self.tokens.iter().cloned()).collect()
    }

    /// The networks of `trusted_proxies`, parsed; the error names the offending entry.
    pub fn trusted_proxy_networks(&self) -> Result<Vec<IpNet>, ConfigError> {
        super::net::parse_cidrs("http.trusted_proxies", &self.trusted_proxies)
    }

    /// Refuses a listener beyond loopback without a token, unless `allow_unauthenticated` says
    /// so, and a token anyone could guess; checked at every service start, whatever built the
    /// settings.
    pub fn check_exposure(&self) -> Result<(), ConfigError> {
        self.check_tokens()?;
        if self.bind.is_loopback() || self.has_tokens() || self.allow_unauthenticated {
            return Ok(());
        }
        Err(ConfigError::invalid(
            "http.bind",
            format!(
                "{} is not a loopback address and http.auth_token is not set: set http.auth_token \
                 (IMAGEPIPE_HTTP__AUTH_TOKEN; {MAKE_A_TOKEN}), bind 127.0.0.1, or set \
                 http.allow_unauthenticated = true",
                self.bind
            ),
        ))
    }

    /// Every token at least [`MIN_TOKEN_BYTES`] long without whitespace or commas, every name
    /// well-formed, no name or token twice.
    fn check_tokens(&self) -> Result<(), ConfigError> {
        if let Some(token) = &self.auth_token {
            check_token("http.auth_token", token)?;
        }
        for (i, entry) in self.tokens.iter().enumerate() {
            let key = format!("http.tokens[{i}]");
            let name = &entry.name;
            let well_formed = (1..=64).contains(&name.len())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !well_formed || name == AUTH_TOKEN_NAME {
                return Err(ConfigError::invalid(
                    format!("{key}.name"),
                    format!("{name:?} must be 1-64 characters of [A-Za-z0-9_-] and not {AUTH_TOKEN_NAME:?}"),
                ));
            }
            check_token(&format!("{key}.token"), &entry.token)?;
        }
        let all = self.scoped_tokens();
        for (i, entry) in all.iter().enumerate() {
            let before = &all[..i];
            if before.iter().any(|other| other.name == entry.name) {
                return Err(ConfigError::invalid("http.tokens", format!("the name {:?} is given twice", entry.name)));
            }
            if before.iter().any(|other| other.token == entry.token) {
                return Err(ConfigError::invalid(
                    "http.tokens",
                    format!("{:?} has the same token as another entry: give each its own", entry.name),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.port == 0 {
            return Err(ConfigError::invalid("http.port", "must be 1-65535 (a server needs a fixed port)"));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::invalid("http.max_connections", "must be at least 1"));
        }
        if self.max_uploads == 0 {
            return Err(ConfigError::invalid("http.max_uploads", "must be at least 1"));
        }
        positive("http.upload_wait", self.upload_wait)?;
        if self.auth_failure_limit == 0 {
            return Err(ConfigError::invalid("http.auth_failure_limit", "must be at least 1"));
        }
        positive("http.auth_failure_window", self.auth_failure_window)?;
        positive("http.header_read_timeout", self.header_read_timeout)?;
        positive("http.idle_timeout", self.idle_timeout)?;
        self.trusted_proxy_networks()?;
        self.check_exposure()
    }
}

fn check_token(key: &str, token: &Secret<String>) -> Result<(), ConfigError> {
    let token = token.expose();
    if token.chars().any(|c| c.is_whitespace() || c == ',') {
        return Err(ConfigError::invalid(key, "must be without whitespace or commas"));
    }
    if token.len() < MIN_TOKEN_BYTES {
        return Err(ConfigError::invalid(
            key,
            format!("is {} bytes; a token needs at least {MIN_TOKEN_BYTES}: {MAKE_A_TOKEN}", token.len()),
        ));
    }
    Ok(())
}

/// `http.tokens` in the environment: one string of comma-separated `name:scope:token` entries;
/// blank entries are dropped.
impl ListItem for ScopedToken {
    const EXPECTING: &'static str =
        "a list of { name, token, scope } tables, or one string of comma-separated name:scope:token";

    fn from_piece(entry: &str) -> Result<Option<Self>, String> {
        let entry = entry.trim();
        if entry.is_empty() {
            return Ok(None);
        }
        let mut parts = entry.splitn(3, ':');
        let (Some(name), Some(scope), Some(token)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("an entry is name:scope:token, not {:?}", mask(entry)));
        };
        Ok(Some(ScopedToken { name: name.to_owned(), token: Secret::new(token.to_owned()), scope: scope.parse()? }))
    }
}

/// `entry` with what follows its second `:` (the token) masked, for an error message.
fn mask(entry: &str) -> String {
    let mut parts = entry.splitn(3, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(name), Some(scope), Some(_)) => format!("{name}:{scope}:{}", super::MASK),
        (Some(name), Some(_), None) => format!("{name}:{}", super::MASK),
        _ => super::MASK.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_wider_bind_needs_a_token_or_an_explicit_opt_out() {
        let open = HttpConfig { bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED), ..HttpConfig::default() };
        let error = open.validate().unwrap_err().to_string();
        assert!(error.contains("http.bind") && error.contains("http.auth_token"), "{error}");
        assert!(error.contains("openssl rand -hex 32"), "{error}");
        assert!(!error.contains('\n'), "one line: {error}");

        let with_token = HttpConfig { auth_token: Some(GOOD.to_owned().into()), ..open.clone() };
        assert!(with_token.validate().is_ok());
        let scoped = ScopedToken { name: "grafana".into(), token: GOOD.to_owned().into(), scope: Scope::Read };
        let with_scoped = HttpConfig { tokens: vec![scoped], ..open.clone() };
        assert!(with_scoped.validate().is_ok(), "a scoped token is a token too");
        let opted_out = HttpConfig { allow_unauthenticated: true, ..open };
        assert!(opted_out.validate().is_ok());
        assert!(HttpConfig::default().validate().is_ok(), "loopback by default");
        let v6 = HttpConfig { bind: "::1".parse().unwrap(), ..HttpConfig::default() };
        assert!(v6.validate().is_ok());
    }

    #[test]
    fn a_token_shorter_than_32_bytes_is_refused_with_the_command_that_makes_one() {
        for short in ["Qz", "s3cret", &GOOD[..31]] {
            let config = HttpConfig { auth_token: Some(short.to_owned().into()), ..HttpConfig::default() };
            let error = config.check_exposure().unwrap_err().to_string();
            assert!(error.contains("http.auth_token") && error.contains("at least 32"), "{error}");
            assert!(error.contains("openssl rand -hex 32"), "{error}");
            assert!(!error.contains(short), "the token is not printed: {error}");
        }
        let scoped = ScopedToken { name: "ci".into(), token: "short".to_owned().into(), scope: Scope::Submit };
        let config = HttpConfig { tokens: vec![scoped], ..HttpConfig::default() };
        assert!(config.validate().unwrap_err().to_string().contains("http.tokens[0].token"));
        let spaced = HttpConfig { auth_token: Some(format!("{GOOD} x").into()), ..HttpConfig::default() };
        assert!(spaced.validate().unwrap_err().to_string().contains("whitespace"));
    }

    #[test]
    fn token_names_are_well_formed_and_nothing_is_given_twice() {
        let entry = |name: &str, token: &str| ScopedToken {
            name: name.to_owned(),
            token: token.to_owned().into(),
            scope: Scope::Read,
        };
        let other = "fedcba9876543210fedcba9876543210";
        let cases = [
            (vec![entry("bad name", GOOD)], "http.tokens[0].name"),
            (vec![entry(AUTH_TOKEN_NAME, GOOD)], "http.tokens[0].name"),
            (vec![entry("a", GOOD), entry("a", other)], "given twice"),
            (vec![entry("a", GOOD), entry("b", GOOD)], "same token"),
        ];
        for (tokens, expected) in cases {
            let error = HttpConfig { tokens, ..HttpConfig::default() }.validate().unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
        let config = HttpConfig {
            auth_token: Some(GOOD.to_owned().into()),
            tokens: vec![entry("b", GOOD)],
            ..HttpConfig::default()
        };
        assert!(config.validate().unwrap_err().to_string().contains("same token"), "auth_token counts");
    }

    #[test]
    fn scopes_are_ordered() {
        assert!(Scope::Admin.allows(Scope::Operate) && Scope::Operate.allows(Scope::Submit));
        assert!(Scope::Submit.allows(Scope::Read) && Scope::Read.allows(Scope::Read));
        assert!(!Scope::Read.allows(Scope::Submit) && !Scope::Operate.allows(Scope::Admin));
        assert_eq!("Operate".parse::<Scope>(), Ok(Scope::Operate));
        assert!("root".parse::<Scope>().unwrap_err().contains("read, submit, operate or admin"));
    }

    #[test]
    fn trusted_proxies_are_cidrs() {
        let config = HttpConfig { trusted_proxies: vec!["10.0.0.0/8".into(), "nope".into()], ..HttpConfig::default() };
        assert!(config.validate().unwrap_err().to_string().contains("http.trusted_proxies[1]"));
    }
}
