//! Values that must never reach a log line or a printed config.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a secret prints as.
pub const MASK: &str = "***";

/// A secret value (token, password). `Debug`, `Display` and `Serialize` print [`MASK`];
/// only [`Secret::expose`] gives the value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> Self {
        Self(value)
    }

    /// The secret value itself, for the one place that needs it.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> From<T> for Secret<T> {
    fn from(value: T) -> Self {
        Self(value)
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl<T> Serialize for Secret<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(MASK)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Secret<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Self)
    }
}

/// A URL that may carry credentials (`redis://user:pass@host:6379`). It prints with its
/// user-info masked (`redis://***@host:6379`); [`SecretUrl::expose`] gives the full URL.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL with its credentials, for the client that connects.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with its credentials masked, for logs.
    pub fn masked(&self) -> String {
        mask_url_credentials(&self.0)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.masked())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.masked())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.masked())
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self)
    }
}

/// Replaces the user-info of every `scheme://user:pass@host` in `text` with [`MASK`]; handles
/// comma-separated URL lists. Text without credentials comes back unchanged.
pub fn mask_url_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(scheme_end) = rest.find("://") {
        let authority_start = scheme_end + 3;
        out.push_str(&rest[..authority_start]);
        rest = &rest[authority_start..];
        let authority_len = rest.find(['/', '?', '#', ',', ' ']).unwrap_or(rest.len());
        let authority = &rest[..authority_len];
        match authority.rfind('@') {
            Some(at) => {
                out.push_str(MASK);
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &rest[authority_len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints_its_value() {
        let token = Secret::new("hunter2".to_string());
        assert_eq!(format!("{token}"), MASK);
        assert_eq!(format!("{token:?}"), MASK);
        assert_eq!(serialized(&token), format!("\"{MASK}\""));
        assert_eq!(token.expose(), "hunter2");
    }

    #[test]
    fn url_credentials_are_masked_and_the_rest_kept() {
        let cases = [
            ("redis://user:pass@db:6379/0", "redis://***@db:6379/0"),
            ("redis://:pass@db:6379", "redis://***@db:6379"),
            ("redis://db:6379", "redis://db:6379"),
            ("nats://a:b@n1:4222,nats://n2:4222,nats://c:d@n3", "nats://***@n1:4222,nats://n2:4222,nats://***@n3"),
            ("https://h/path?q=a@b", "https://h/path?q=a@b"),
            ("no url here", "no url here"),
            ("127.0.0.1:4222", "127.0.0.1:4222"),
        ];
        for (input, want) in cases {
            assert_eq!(mask_url_credentials(input), want, "{input}");
        }
    }

    #[test]
    fn a_secret_url_prints_masked_but_exposes_the_full_url() {
        let url = SecretUrl::new("rediss://app:s3cret@cache:6380");
        assert_eq!(url.to_string(), "rediss://***@cache:6380");
        assert!(!format!("{url:?}").contains("s3cret"));
        assert_eq!(url.expose(), "rediss://app:s3cret@cache:6380");
    }

    fn serialized<T: Serialize>(value: &T) -> String {
        serde_json::to_string(value).unwrap()
    }
}
