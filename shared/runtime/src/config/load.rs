//! Reading [`Settings`] from defaults, a TOML file and the environment, and printing them.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use config::{Config, Environment, File, FileFormat};

use super::secret::mask_url_credentials;
use super::{ConfigError, Settings};

/// Prefix of every configuration environment variable (`IMAGEPIPE_BUS__KIND`).
pub const ENV_PREFIX: &str = "IMAGEPIPE";

/// Environment variable naming the config file when `--config` is not given; it is not a
/// configuration key itself.
pub const CONFIG_PATH_ENV: &str = "IMAGEPIPE_CONFIG";

/// Separator between levels in environment variable names.
const ENV_LEVEL_SEPARATOR: &str = "__";

/// The top-level sections of [`Settings`], read off the type itself.
fn sections() -> Vec<String> {
    toml::Table::try_from(Settings::default()).map(|table| table.keys().cloned().collect()).unwrap_or_default()
}

/// Whether the variable `IMAGEPIPE_<rest>` is meant as a configuration key: it has a level
/// separator, or it starts with a section name (a key written with `_` for `__`, reported with a
/// hint). Others (`IMAGEPIPE_TEST_MODEL_DIR`, `IMAGEPIPE_CACHE_DIR`) belong to tooling.
fn is_config_variable(rest: &str, sections: &[String]) -> bool {
    let rest = rest.to_ascii_lowercase();
    rest.contains(ENV_LEVEL_SEPARATOR) || sections.iter().any(|s| rest == *s || rest.starts_with(&format!("{s}_")))
}

/// The `--config` option every binary takes (flatten it into the binary's `clap` arguments).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// TOML config file; `IMAGEPIPE_<SECTION>__<KEY>` environment variables override it.
    #[arg(long = "config", value_name = "FILE", env = CONFIG_PATH_ENV, global = true)]
    pub config: Option<PathBuf>,
}

impl ConfigArgs {
    /// Loads and validates the settings from this file (if any) and the process environment.
    pub fn load(&self) -> Result<Settings, ConfigError> {
        Settings::load(self.config.as_deref())
    }

    /// Loads the settings like [`load`](Self::load) without [`Settings::validate`], for a
    /// checker that reports every unusable value by itself (`imagepipe doctor`); keys and types
    /// are still checked.
    pub fn load_unvalidated(&self) -> Result<Settings, ConfigError> {
        Settings::read(self.config.as_deref(), std::env::vars_os())
    }
}

impl Settings {
    /// Loads defaults < `file` < the process environment, then validates.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, std::env::vars_os())
    }

    /// Loads defaults < `file` < the variables `env`, then validates. `IMAGEPIPE_*` variables
    /// with a `__` or starting with a section name are read (except [`CONFIG_PATH_ENV`]), and
    /// every one of them must name a key; other `IMAGEPIPE_*` variables belong to tooling.
    pub fn load_from<I, K, V>(file: Option<&Path>, env: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        let settings = Self::read(file, env)?;
        settings.validate()?;
        Ok(settings)
    }

    /// [`load_from`](Self::load_from) without the validation.
    pub(super) fn read<I, K, V>(file: Option<&Path>, env: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        let mut builder = Config::builder();
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::FileNotFound { path: path.to_owned() });
            }
            builder = builder.add_source(File::from(path).format(FileFormat::Toml).required(true));
        }
        builder = builder.add_source(
            Environment::with_prefix(ENV_PREFIX)
                .prefix_separator("_")
                .separator(ENV_LEVEL_SEPARATOR)
                .source(Some(config_variables(env)?)),
        );
        let config = builder.build().map_err(|source| match file {
            Some(path) => ConfigError::File { path: path.to_owned(), source },
            None => ConfigError::Key { key: ENV_PREFIX.to_owned(), message: source.to_string() },
        })?;
        let settings: Settings = serde_path_to_error::deserialize(config).map_err(|e| {
            let key = e.path().to_string();
            let message = key_error_message(&key, &e.into_inner().to_string());
            ConfigError::Key { key, message }
        })?;
        Ok(settings)
    }

    /// The bus settings every service connects with: `bus`, with the Kafka backend told the
    /// coordinator's shard count (`coordinator.shards`), so that the coordinator's input topics
    /// get a partition per shard whichever service creates them first.
    pub fn bus_config(&self) -> imagepipe_bus::BusConfig {
        let mut bus = self.bus.clone();
        bus.kafka.shards = Some(self.coordinator.shards);
        bus
    }

    /// The settings as TOML with every secret and URL credential masked, for
    /// `imagepipe config print`.
    pub fn to_masked_toml(&self) -> Result<String, ConfigError> {
        toml::to_string_pretty(&self.masked_table()?).map_err(ConfigError::Print)
    }

    /// The settings as a JSON object, masked like [`to_masked_toml`](Self::to_masked_toml)
    /// (durations as the same strings), for `imagepipe config print --json`.
    pub fn to_masked_json(&self) -> Result<serde_json::Value, ConfigError> {
        serde_json::to_value(self.masked_table()?).map_err(ConfigError::PrintJson)
    }

    /// Every key with its value, secrets and URL credentials masked.
    fn masked_table(&self) -> Result<toml::Table, ConfigError> {
        let mut table = toml::Table::try_from(self).map_err(ConfigError::Print)?;
        mask_strings(&mut table);
        Ok(table)
    }
}

/// The `IMAGEPIPE_*` variables of `env` that are configuration keys.
fn config_variables<I, K, V>(env: I) -> Result<HashMap<String, String>, ConfigError>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<OsString>,
    V: Into<OsString>,
{
    let prefix = format!("{ENV_PREFIX}_");
    let sections = sections();
    let mut variables = HashMap::new();
    for (name, value) in env {
        let Ok(name) = name.into().into_string() else { continue };
        if !name.to_ascii_uppercase().starts_with(&prefix)
            || name == CONFIG_PATH_ENV
            || !is_config_variable(&name[prefix.len()..], &sections)
        {
            continue;
        }
        let value = value.into().into_string().map_err(|_| ConfigError::Key {
            key: env_name_to_key(&name),
            message: format!("environment variable {name} is not valid UTF-8"),
        })?;
        variables.insert(name, value);
    }
    Ok(variables)
}

/// The `config` crate's message without its own ` for key `…`` (the error names the key
/// already), with a hint when a top-level key looks like a variable that used `_` where `__`
/// separates levels (`IMAGEPIPE_BUS_KIND`).
fn key_error_message(key: &str, message: &str) -> String {
    let mut message = message.to_owned();
    if let Some(start) = message.find(" for key `")
        && let Some(len) = message[start + 10..].find('`')
    {
        message.replace_range(start..start + 10 + len + 1, "");
    }
    let section = key.split_once('_').map(|(section, _)| section);
    if !key.contains('.') && section.is_some_and(|s| sections().iter().any(|known| known == s)) {
        message.push_str(&format!(
            " (in environment variables, levels are separated by `__`: {ENV_PREFIX}_{})",
            key.to_ascii_uppercase().replacen('_', ENV_LEVEL_SEPARATOR, 1)
        ));
    }
    message
}

/// `worker.ack_wait` → `IMAGEPIPE_WORKER__ACK_WAIT`, the environment variable that sets a key
/// (for an entry of a list, `net.allow_cidrs[1]`, the variable of the whole list).
pub fn key_to_env_name(key: &str) -> String {
    let key = key.split_once('[').map_or(key, |(list, _)| list);
    format!("{ENV_PREFIX}_{}", key.to_ascii_uppercase().replace('.', ENV_LEVEL_SEPARATOR))
}

/// `IMAGEPIPE_WORKER__ACK_WAIT` → `worker.ack_wait`.
fn env_name_to_key(name: &str) -> String {
    name[ENV_PREFIX.len() + 1..].to_ascii_lowercase().replace(ENV_LEVEL_SEPARATOR, ".")
}

fn mask_strings(table: &mut toml::Table) {
    for (_, value) in table.iter_mut() {
        mask_value(value);
    }
}

fn mask_value(value: &mut toml::Value) {
    match value {
        toml::Value::String(s) => *s = mask_url_credentials(s),
        toml::Value::Array(items) => items.iter_mut().for_each(mask_value),
        toml::Value::Table(table) => mask_strings(table),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_print_has_the_keys_values_and_masks_of_the_toml_print() {
        let env = [
            ("IMAGEPIPE_STORE__REDIS__URL", "redis://app:redis-pw@cache:6379"),
            ("IMAGEPIPE_HTTP__AUTH_TOKEN", "api-token-0123456789abcdef0123456789"),
        ];
        let settings = Settings::load_from(None, env).unwrap();
        let json = settings.to_masked_json().unwrap();
        let text = json.to_string();
        assert!(!text.contains("redis-pw") && !text.contains("api-token"), "{text}");
        assert_eq!(json["store"]["redis"]["url"], "redis://***@cache:6379");
        assert_eq!(json["http"]["auth_token"], "***");
        assert_eq!(json["worker"]["ack_wait"], "30s");
        let toml: toml::Table = toml::from_str(&settings.to_masked_toml().unwrap()).unwrap();
        assert_eq!(serde_json::to_value(toml).unwrap(), json, "the same keys and values as the TOML print");
    }

    #[test]
    fn reading_without_validation_keeps_an_unusable_value_for_a_checker() {
        let env = [("IMAGEPIPE_NET__ALLOW_CIDRS", "10.0.0.0/8,not-a-cidr")];
        let err = Settings::load_from(None, env).unwrap_err();
        assert_eq!(err.key(), Some("net.allow_cidrs[1]"));
        let settings = Settings::read(None, env).unwrap();
        assert_eq!(settings.net.allow_cidrs, ["10.0.0.0/8", "not-a-cidr"]);
        assert_eq!(settings.validate().unwrap_err().key(), Some("net.allow_cidrs[1]"));
        assert!(Settings::read(None, [("IMAGEPIPE_NET__NO_SUCH_KEY", "1")]).is_err(), "keys are still checked");
    }

    #[test]
    fn a_key_names_the_variable_that_sets_it() {
        assert_eq!(key_to_env_name("worker.ack_wait"), "IMAGEPIPE_WORKER__ACK_WAIT");
        assert_eq!(key_to_env_name("net.allow_cidrs[1]"), "IMAGEPIPE_NET__ALLOW_CIDRS");
    }
}
