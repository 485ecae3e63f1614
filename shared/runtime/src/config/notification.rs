//! The `notification` section: where and how the notification worker posts webhooks.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    ConfigError, ListItem, MASK, Secret, list_or_comma_separated_of, mask_url_credentials,
    optional_list_or_comma_separated_of,
};

/// The `notification` section: where and how the notification worker posts webhooks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct NotificationConfig {
    /// Targets that receive every `task.completed`, `task.failed` and `task.cancelled` event,
    /// besides the task's own `callbackUrl`: each a URL, or a table `{ url, secret }` with a
    /// key of its own; a comma-separated list of URLs in the environment.
    #[serde(deserialize_with = "list_or_comma_separated_of")]
    #[schemars(extend("x-type" = "list of URLs or `{ url, secret }` tables"))]
    pub subscribers: Vec<WebhookTarget>,
    /// Keys of the Standard Webhooks signature (`webhook-signature`) for every `callbackUrl`
    /// and every subscriber without a key of its own: one key, or several while a key is
    /// rotated (each one signs; comma-separated in the environment). A key is `whsec_` followed
    /// by its bytes in standard base64 (the Standard Webhooks form), or any other string, whose
    /// UTF-8 bytes are the key. Without a key, webhooks are not signed.
    #[serde(deserialize_with = "list_or_comma_separated_of", skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<String>")]
    pub secret: Vec<WebhookSecret>,
    /// Longest time to resolve and connect to a webhook target.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub connect_timeout: Duration,
    /// Longest time for one webhook request, redirects and response included.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub total_timeout: Duration,
    /// Deliveries of one event before it is dead-lettered (each one posts to every target not
    /// yet reached).
    pub max_attempts: u32,
    /// Delay before the first retry; it doubles per attempt (with jitter) up to `retry_max`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub retry_min: Duration,
    /// Longest delay between two attempts.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub retry_max: Duration,
    /// CIDRs webhooks may reach despite the SSRF guard; a comma-separated list in the
    /// environment. Unset, webhooks use `net.allow_cidrs`; set (even to an empty list), it
    /// replaces `net.allow_cidrs` for webhooks.
    #[serde(
        default,
        deserialize_with = "optional_list_or_comma_separated_of",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_cidrs: Option<Vec<String>>,
}

impl Default for NotificationConfig {
    fn default() -> Self {
        Self {
            subscribers: Vec::new(),
            secret: Vec::new(),
            connect_timeout: Duration::from_secs(5),
            total_timeout: Duration::from_secs(15),
            max_attempts: 8,
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            allow_cidrs: None,
        }
    }
}

impl NotificationConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (i, target) in self.subscribers.iter().enumerate() {
            let scheme = target.url.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
            if !matches!(scheme.as_deref(), Some("http" | "https")) {
                return Err(ConfigError::invalid(
                    format!("notification.subscribers[{i}]"),
                    format!("{:?} is not an http(s) URL", mask_url_credentials(&target.url)),
                ));
            }
        }
        for (key, value) in [
            ("notification.connect_timeout", self.connect_timeout),
            ("notification.total_timeout", self.total_timeout),
            ("notification.retry_min", self.retry_min),
        ] {
            if value.is_zero() {
                return Err(ConfigError::invalid(key, "must be longer than 0s"));
            }
        }
        if self.connect_timeout > self.total_timeout {
            return Err(ConfigError::invalid(
                "notification.connect_timeout",
                "must not be longer than notification.total_timeout",
            ));
        }
        if self.retry_min > self.retry_max {
            return Err(ConfigError::invalid(
                "notification.retry_min",
                "must not be longer than notification.retry_max",
            ));
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::invalid("notification.max_attempts", "must be at least 1"));
        }
        Ok(())
    }
}

/// A key that signs webhooks (HMAC-SHA256, the Standard Webhooks way): written as `whsec_`
/// followed by the key's bytes in standard base64 (the Standard Webhooks form, which receivers'
/// libraries take as it is), or as any other string, whose UTF-8 bytes are the key. Surrounding
/// whitespace is ignored. It prints as [`MASK`]; [`WebhookSecret::expose`] gives the key.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Secret<Vec<u8>>);

/// A webhook key that cannot sign anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidWebhookSecret {
    /// Nothing but whitespace, or `whsec_` alone.
    #[error("a webhook key must not be empty")]
    Empty,
    /// `whsec_` followed by something that is not standard base64.
    #[error("a webhook key starting with `whsec_` must continue with the key in standard base64")]
    NotBase64,
}

impl WebhookSecret {
    /// The prefix of a key written the Standard Webhooks way.
    pub const PREFIX: &str = "whsec_";

    /// The key `text` writes (see the type's docs); the error never repeats the text.
    pub fn parse(text: &str) -> Result<Self, InvalidWebhookSecret> {
        let text = text.trim();
        let key = match text.strip_prefix(Self::PREFIX) {
            Some(encoded) => BASE64.decode(encoded).map_err(|_| InvalidWebhookSecret::NotBase64)?,
            None => text.as_bytes().to_vec(),
        };
        if key.is_empty() {
            return Err(InvalidWebhookSecret::Empty);
        }
        Ok(Self(Secret::new(key)))
    }

    /// The key's bytes, for the HMAC.
    pub fn expose(&self) -> &[u8] {
        self.0.expose()
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl Serialize for WebhookSecret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(MASK)
    }
}

impl<'de> Deserialize<'de> for WebhookSecret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(de::Error::custom)
    }
}

/// A URL, or a table `{ url, secret }`.
impl JsonSchema for WebhookTarget {
    fn schema_name() -> Cow<'static, str> {
        "WebhookTarget".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [
                { "type": "string" },
                {
                    "type": "object",
                    "properties": { "url": { "type": "string" }, "secret": { "type": "array", "items": { "type": "string" } } },
                    "required": ["url"],
                    "additionalProperties": false
                }
            ]
        })
    }
}

/// One subscriber of `notification.subscribers`: where it is posted to, and the keys that sign
/// what it receives (none: `notification.secret`'s). Written as its URL, or as a table
/// `{ url = "...", secret = "whsec_..." }` (one key or a list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookTarget {
    /// The URL webhooks are posted to.
    pub url: String,
    /// Its own keys; empty, `notification.secret` signs for it.
    pub secret: Vec<WebhookSecret>,
}

impl WebhookTarget {
    /// A target at `url` signed with `notification.secret`.
    pub fn new(url: impl Into<String>) -> Self {
        Self { url: url.into(), secret: Vec::new() }
    }

    /// The target with `secret` as one of its own keys.
    pub fn with_secret(mut self, secret: WebhookSecret) -> Self {
        self.secret.push(secret);
        self
    }
}

impl Serialize for WebhookTarget {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Table<'a> {
            url: &'a str,
            secret: &'a [WebhookSecret],
        }
        if self.secret.is_empty() {
            serializer.serialize_str(&self.url)
        } else {
            Table { url: &self.url, secret: &self.secret }.serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for WebhookTarget {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TargetVisitor;

        impl<'de> Visitor<'de> for TargetVisitor {
            type Value = WebhookTarget;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a URL or a table { url, secret }")
            }

            fn visit_str<E: de::Error>(self, url: &str) -> Result<Self::Value, E> {
                Ok(WebhookTarget::new(url.trim()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Table {
                    url: String,
                    #[serde(default, deserialize_with = "list_or_comma_separated_of")]
                    secret: Vec<WebhookSecret>,
                }
                let Table { url, secret } = Table::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(WebhookTarget { url: url.trim().to_owned(), secret })
            }
        }

        deserializer.deserialize_any(TargetVisitor)
    }
}

/// `notification.subscribers` in the environment: one string of comma-separated URLs; a target
/// with a blank URL is dropped (in a list as in the string).
impl ListItem for WebhookTarget {
    const EXPECTING: &'static str = "a list of URLs or { url, secret } tables, or one comma-separated string of URLs";

    fn from_piece(url: &str) -> Result<Option<Self>, String> {
        Ok(WebhookTarget::new(url.trim()).keep())
    }

    fn keep(self) -> Option<Self> {
        (!self.url.is_empty()).then_some(self)
    }
}

/// A `secret` key: one key, a list of keys, or one string of comma-separated keys (how lists
/// arrive from the environment). An empty key is refused, not dropped: an unset variable must
/// not quietly turn signing off.
impl ListItem for WebhookSecret {
    const EXPECTING: &'static str = "a key, a list of keys or one comma-separated string of keys";

    fn from_piece(key: &str) -> Result<Option<Self>, String> {
        WebhookSecret::parse(key).map(Some).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    /// The Standard Webhooks test vector's key.
    const SPEC_KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    /// Settings from the TOML `file` and the environment `vars`.
    fn load(name: &str, file: &str, vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let path =
            std::env::temp_dir().join(format!("imagepipe-runtime-{}-notification-{name}.toml", std::process::id()));
        std::fs::write(&path, file).unwrap();
        let loaded = Settings::load_from(Some(&path), vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        std::fs::remove_file(&path).unwrap();
        loaded
    }

    #[test]
    fn a_whsec_key_is_its_base64_and_any_other_key_its_bytes() {
        let spec = WebhookSecret::parse(SPEC_KEY).unwrap();
        assert_eq!(spec.expose(), BASE64.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap());
        assert_eq!(WebhookSecret::parse(" plain-key ").unwrap().expose(), b"plain-key");
        assert_eq!(WebhookSecret::parse("whsec_not base64!"), Err(InvalidWebhookSecret::NotBase64));
        assert_eq!(WebhookSecret::parse("whsec_"), Err(InvalidWebhookSecret::Empty));
        assert_eq!(WebhookSecret::parse("  "), Err(InvalidWebhookSecret::Empty));
        assert_eq!(format!("{spec:?}"), MASK);
    }

    #[test]
    fn subscribers_carry_their_own_keys_and_the_secret_may_be_several() {
        let file = format!(
            r#"
            [notification]
            secret = ["{SPEC_KEY}", "old-key"]
            subscribers = ["https://a.example/hook", {{ url = "https://b.example/hook", secret = "b-key" }}]
            "#
        );
        let notification = load("targets", &file, &[]).unwrap().notification;
        assert_eq!(
            notification.secret.iter().map(WebhookSecret::expose).collect::<Vec<_>>(),
            [WebhookSecret::parse(SPEC_KEY).unwrap().expose(), b"old-key"]
        );
        let b = WebhookTarget::new("https://b.example/hook").with_secret(WebhookSecret::parse("b-key").unwrap());
        assert_eq!(notification.subscribers, [WebhookTarget::new("https://a.example/hook"), b]);

        let env = [
            ("IMAGEPIPE_NOTIFICATION__SECRET", "new-key, old-key"),
            ("IMAGEPIPE_NOTIFICATION__SUBSCRIBERS", "https://c.example/hook,"),
        ];
        let notification = load("targets-env", "", &env).unwrap().notification;
        assert_eq!(notification.secret.len(), 2);
        assert_eq!(notification.subscribers, [WebhookTarget::new("https://c.example/hook")]);
    }

    #[test]
    fn an_empty_or_broken_key_is_refused_naming_it_without_its_value() {
        let cases = [
            ("", &[("IMAGEPIPE_NOTIFICATION__SECRET", "")][..], "notification.secret"),
            ("", &[("IMAGEPIPE_NOTIFICATION__SECRET", "a-key,")][..], "notification.secret"),
            ("[notification]\nsecret = \"whsec_%%secret%%\"\n", &[][..], "notification.secret"),
            (
                "[notification]\nsubscribers = [\"https://a.example\", { url = \"https://b.example\", secret = \"whsec_%%secret%%\" }]\n",
                &[][..],
                "notification.subscribers[1].secret",
            ),
        ];
        for (i, (file, vars, key)) in cases.into_iter().enumerate() {
            let err = load(&format!("bad-key-{i}"), file, vars).unwrap_err();
            assert_eq!(err.key(), Some(key), "{err}");
            assert!(!err.to_string().contains("%%secret%%"), "{err}");
        }
        let file = "[notification]\nsubscribers = [{ url = \"https://b.example\", token = \"x\" }]\n";
        let err = load("unknown-target-key", file, &[]).unwrap_err();
        assert!(err.to_string().contains("token"), "{err}");
    }

    #[test]
    fn printed_keys_are_masked_and_a_keyless_target_prints_as_its_url() {
        let mut settings = Settings::default();
        settings.notification.secret = vec![WebhookSecret::parse("global-key").unwrap()];
        settings.notification.subscribers = vec![
            WebhookTarget::new("https://a.example/hook"),
            WebhookTarget::new("https://b.example/hook").with_secret(WebhookSecret::parse("b-key").unwrap()),
        ];
        let printed = settings.to_masked_toml().unwrap();
        assert!(!printed.contains("global-key") && !printed.contains("b-key"), "{printed}");
        assert!(printed.contains("\"https://a.example/hook\""), "{printed}");
        assert!(printed.contains(&format!("secret = [\"{MASK}\"]")), "{printed}");
    }
}
