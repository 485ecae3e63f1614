//! Why a configuration could not be loaded, validated or printed.

use std::path::PathBuf;

/// A configuration that could not be used. Every variant names the file or key involved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The `--config` file does not exist.
    #[error("config file {} not found", path.display())]
    FileNotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The config file could not be read or is not valid TOML.
    #[error("reading config file {}", path.display())]
    File {
        /// The path given.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: config::ConfigError,
    },
    /// A key is unknown or its value has the wrong type or form.
    #[error("config key `{key}`: {message}")]
    Key {
        /// Dotted key (`bus.kind`, `worker.ack_wait`).
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A value is well-formed but unusable (bad CIDR, port 0, zero concurrency, ...).
    #[error("invalid config `{key}`: {reason}")]
    Invalid {
        /// Dotted key.
        key: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The settings could not be rendered as TOML.
    #[error("rendering the config as TOML")]
    Print(#[source] toml::ser::Error),
    /// The settings could not be rendered as JSON.
    #[error("rendering the config as JSON")]
    PrintJson(#[source] serde_json::Error),
}

impl ConfigError {
    /// The dotted key the error is about, when it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Key { key, .. } | Self::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }

    pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid { key: key.into(), reason: reason.into() }
    }
}
