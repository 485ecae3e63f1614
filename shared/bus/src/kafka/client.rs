//! librdkafka client settings shared by the producer, the admin client and every consumer, and
//! the context that sends librdkafka's log lines to `tracing`.

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;

use crate::config::KafkaConfig;

/// The settings every client of `config` starts from: brokers, client id, security, the
/// operator's extra properties.
pub(crate) fn base_config(config: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", config.brokers.trim())
        .set("client.id", &config.client_id)
        .set("socket.keepalive.enable", "true")
        .set_log_level(RDKafkaLogLevel::Warning);
    if let Some(protocol) = &config.security_protocol {
        c.set("security.protocol", protocol);
    }
    if let Some(mechanism) = &config.sasl_mechanism {
        c.set("sasl.mechanism", mechanism);
    }
    if let (Some(user), Some(password)) = (&config.sasl_username, &config.sasl_password) {
        c.set("sasl.username", user).set("sasl.password", password.expose());
    }
    if let Some(ca) = &config.ssl_ca_file {
        c.set("ssl.ca.location", ca.display().to_string());
    }
    for (key, value) in &config.client {
        c.set(key, value);
    }
    c
}

/// Milliseconds of a duration, as librdkafka settings want them.
pub(crate) fn ms(duration: std::time::Duration) -> String {
    duration.as_millis().max(1).to_string()
}

/// Logs librdkafka's own lines through `tracing` (target `librdkafka`).
pub(crate) fn log(level: RDKafkaLogLevel, facility: &str, line: &str) {
    match level {
        RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
            tracing::error!(target: "librdkafka", facility, "{line}");
        }
        RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{line}"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => tracing::info!(target: "librdkafka", facility, "{line}"),
        RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{line}"),
    }
}

/// Logs a client-wide error (a broker down, authentication failing); the client retries.
pub(crate) fn client_error(error: &KafkaError, reason: &str) {
    tracing::warn!(target: "librdkafka", error = %error, "{reason}");
}

/// The context of clients that need nothing but logging (the admin client).
pub(crate) struct LogContext;

impl ClientContext for LogContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, line: &str) {
        log(level, facility, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        client_error(&error, reason);
    }
}
