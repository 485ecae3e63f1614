//! Connecting: server list, credentials, TLS, reconnect backoff, connection events.

use std::str::FromStr;
use std::time::Duration;

use async_nats::{ConnectOptions, Event, ServerAddr};
use rand::Rng;

use crate::config::NatsConfig;
use crate::error::BusError;
use imagepipe_secret::mask_url_credentials;

/// Connects to the servers of `config`. The client then reconnects by itself, forever, with
/// exponential backoff and jitter between attempts.
pub(crate) async fn connect(config: &NatsConfig) -> Result<async_nats::Client, BusError> {
    validate(config).map_err(BusError::Invalid)?;
    let shown = mask_url_credentials(&config.url);
    let servers = parse_servers(&config.url)?;
    let options = options(config).await.map_err(|source| BusError::Connect { url: shown.clone(), source })?;
    // async-nats bounds each attempt by `connection_timeout`; this bounds the whole list.
    let deadline = config.connect_timeout * servers.len() as u32 + Duration::from_secs(1);
    let client = match tokio::time::timeout(deadline, options.connect(servers)).await {
        Ok(Ok(client)) => client,
        Ok(Err(err)) => return Err(BusError::Connect { url: shown, source: Box::new(err) }),
        Err(_) => {
            let source = format!("no server answered within {deadline:?}").into();
            return Err(BusError::Connect { url: shown, source });
        }
    };
    let info = client.server_info();
    tracing::info!(url = %shown, server_version = %info.version, jetstream = info.jetstream, "connected to NATS");
    if !info.jetstream {
        return Err(BusError::Connect {
            url: shown,
            source: "the server has JetStream disabled (start it with -js)".into(),
        });
    }
    Ok(client)
}

fn validate(config: &NatsConfig) -> Result<(), String> {
    if config.url.trim().is_empty() {
        return Err("bus.nats.url: no server given".into());
    }
    if config.reconnect_delay_min.is_zero() || config.reconnect_delay_min > config.reconnect_delay_max {
        return Err(format!(
            "bus.nats.reconnect_delay_min ({:?}) must be above zero and at most bus.nats.reconnect_delay_max ({:?})",
            config.reconnect_delay_min, config.reconnect_delay_max
        ));
    }
    if config.connect_timeout.is_zero() || config.request_timeout.is_zero() {
        return Err("bus.nats.connect_timeout and bus.nats.request_timeout must be above zero".into());
    }
    if config.user.is_some() != config.password.is_some() {
        return Err("bus.nats.user and bus.nats.password go together".into());
    }
    let auth_methods = [config.credentials_file.is_some(), config.user.is_some(), config.token.is_some()]
        .iter()
        .filter(|set| **set)
        .count();
    if auth_methods > 1 {
        return Err("bus.nats: set only one of credentials_file, user/password and token".into());
    }
    if config.tls.cert_file.is_some() != config.tls.key_file.is_some() {
        return Err("bus.nats.tls.cert_file and bus.nats.tls.key_file go together".into());
    }
    if config.replicas == 0 || config.replicas > 5 {
        return Err(format!("bus.nats.replicas: {} is not between 1 and 5", config.replicas));
    }
    Ok(())
}

fn parse_servers(urls: &str) -> Result<Vec<ServerAddr>, BusError> {
    urls.split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(|url| {
            ServerAddr::from_str(url).map_err(|err| {
                BusError::Invalid(format!(
                    "bus.nats.url: {} is not a NATS server URL: {err}",
                    mask_url_credentials(url)
                ))
            })
        })
        .collect()
}

async fn options(config: &NatsConfig) -> Result<ConnectOptions, crate::error::BoxError> {
    let mut options = ConnectOptions::new()
        .connection_timeout(config.connect_timeout)
        .request_timeout(Some(config.request_timeout))
        .max_reconnects(None)
        .reconnect_delay_callback({
            let (min, max) = (config.reconnect_delay_min, config.reconnect_delay_max);
            move |attempts| reconnect_delay(attempts, min, max, &mut rand::rng())
        })
        .event_callback(|event| async move { log_event(&event) });
    if let Some(name) = &config.name {
        options = options.name(name);
    }
    if let Some(path) = &config.credentials_file {
        options = options
            .credentials_file(path)
            .await
            .map_err(|err| format!("reading credentials file {}: {err}", path.display()))?;
    }
    if let (Some(user), Some(password)) = (&config.user, &config.password) {
        options = options.user_and_password(user.clone(), password.expose().to_owned());
    }
    if let Some(token) = &config.token {
        options = options.token(token.expose().to_owned());
    }
    let tls = &config.tls;
    if tls.required || tls.ca_file.is_some() || tls.cert_file.is_some() || tls.handshake_first {
        options = options.require_tls(true);
    }
    if let Some(ca) = &tls.ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if tls.handshake_first {
        options = options.tls_first();
    }
    Ok(options)
}

/// The delay before reconnect attempt `attempts` (1-based): nothing before the first, then
/// `min` doubling up to `max`, each drawn uniformly from its upper half ("equal jitter") so
/// that many clients losing one server do not come back in lockstep.
pub(crate) fn reconnect_delay(attempts: usize, min: Duration, max: Duration, rng: &mut impl Rng) -> Duration {
    if attempts <= 1 {
        return Duration::ZERO;
    }
    let exponent = (attempts - 2).min(32) as u32;
    let ceiling = min.saturating_mul(2u32.saturating_pow(exponent)).min(max);
    let half = ceiling / 2;
    half + half.mul_f64(rng.random::<f64>())
}

fn log_event(event: &Event) {
    match event {
        Event::Connected => tracing::info!("NATS connection up"),
        Event::Disconnected => tracing::warn!("NATS connection lost; reconnecting"),
        Event::Closed => tracing::warn!("NATS connection closed"),
        Event::LameDuckMode => tracing::warn!("NATS server entered lame duck mode; it will shut down"),
        Event::SlowConsumer(sid) => tracing::warn!(sid, "NATS slow consumer: messages dropped client-side"),
        other => tracing::warn!(event = %other, "NATS client event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delay_grows_exponentially_with_jitter_up_to_the_cap() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(5));
        let mut rng = rand::rng();
        assert_eq!(reconnect_delay(1, min, max, &mut rng), Duration::ZERO);
        for attempts in 2..40 {
            let ceiling = (min * 2u32.pow((attempts as u32 - 2).min(20))).min(max);
            for _ in 0..50 {
                let d = reconnect_delay(attempts, min, max, &mut rng);
                assert!(
                    d >= ceiling / 2 && d <= ceiling,
                    "attempt {attempts}: {d:?} not in [{:?}, {ceiling:?}]",
                    ceiling / 2
                );
            }
        }
        let draws: std::collections::HashSet<_> = (0..20).map(|_| reconnect_delay(5, min, max, &mut rng)).collect();
        assert!(draws.len() > 1, "no jitter");
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(mask_url_credentials("nats://u:secret@h:4222, tls://tok@h2"), "nats://***@h:4222, tls://***@h2");
        assert_eq!(mask_url_credentials("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(mask_url_credentials("127.0.0.1:4222"), "127.0.0.1:4222");
    }

    #[test]
    fn contradictory_settings_are_rejected() {
        let mut config = NatsConfig { user: Some("u".into()), ..NatsConfig::default() };
        assert!(validate(&config).unwrap_err().contains("password"));
        config.password = Some(imagepipe_secret::Secret::new("p".to_owned()));
        assert!(validate(&config).is_ok());
        config.token = Some(imagepipe_secret::Secret::new("t".to_owned()));
        assert!(validate(&config).unwrap_err().contains("only one"));
        let config = NatsConfig { replicas: 0, ..NatsConfig::default() };
        assert!(validate(&config).is_err());
        assert!(matches!(parse_servers("nats://[::1"), Err(BusError::Invalid(_))));
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let config = NatsConfig {
            user: Some("u".into()),
            password: Some(imagepipe_secret::Secret::new("hunter2".to_owned())),
            token: Some(imagepipe_secret::Secret::new("tok3n".to_owned())),
            ..NatsConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("tok3n"), "{shown}");
        let config = NatsConfig { url: "nats://app:pa55@n1:4222,nats://n2".into(), ..NatsConfig::default() };
        let shown = format!("{config:?}");
        assert!(!shown.contains("pa55") && shown.contains("nats://***@n1:4222,nats://n2"), "{shown}");
    }
}
