use std::path::PathBuf;
use std::time::Duration;

use imagepipe_bus::BusKind;

use super::*;

/// A TOML file unique to this test, removed on drop.
struct TempToml(PathBuf);

impl TempToml {
    fn new(name: &str, contents: &str) -> Self {
        let path = std::env::temp_dir().join(format!("imagepipe-runtime-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        Self(path)
    }
}

impl Drop for TempToml {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn load(file: Option<&TempToml>, vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    Settings::load_from(file.map(|f| f.0.as_path()), env(vars))
}

#[test]
fn defaults_alone_are_valid() {
    let settings = load(None, &[]).unwrap();
    assert_eq!(settings, Settings::default());
    assert_eq!(settings.bus.kind, BusKind::Memory);
    assert_eq!(settings.store.kind, StoreKind::Embedded);
    assert_eq!(settings.http.port, 8080);
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(settings.worker.concurrency, 2 * cores);
}

#[test]
fn the_file_overrides_defaults_and_the_environment_overrides_the_file() {
    let file = TempToml::new(
        "layers",
        r#"
        [bus]
        kind = "nats"
        prefix = "from-file"
        [bus.nats]
        url = "nats://10.1.1.1:4222"
        [http]
        port = 9000
        [worker]
        ack_wait = "45s"
        concurrency = 3
        [net]
        allow_cidrs = ["10.0.0.0/8"]
        "#,
    );
    let settings = load(
        Some(&file),
        &[
            ("IMAGEPIPE_BUS__PREFIX", "from-env"),
            ("IMAGEPIPE_WORKER__HANDLER_TIMEOUT", "1m 30s"),
            ("IMAGEPIPE_NET__ALLOW_CIDRS", "192.168.0.0/16, fd00::/8"),
            ("IMAGEPIPE_STORE__KIND", "redis"),
            ("IMAGEPIPE_STORE__REDIS__URL", "redis://app:pw@cache:6379/2"),
            ("IMAGEPIPE_HTTP__AUTH_TOKEN", "007123-0123456789abcdef0123456789"),
            ("IMAGEPIPE_LOG__LEVEL", "debug"),
            ("PATH", "/usr/bin"),
        ],
    )
    .unwrap();
    assert_eq!(settings.bus.kind, BusKind::Nats);
    assert_eq!(settings.bus.prefix, "from-env");
    assert_eq!(settings.bus.nats.url, "nats://10.1.1.1:4222");
    assert_eq!(settings.http.port, 9000);
    assert_eq!(settings.worker.ack_wait, Duration::from_secs(45));
    assert_eq!(settings.worker.concurrency, 3);
    assert_eq!(settings.worker.handler_timeout, Duration::from_secs(90));
    assert_eq!(settings.net.allow_cidrs, ["192.168.0.0/16", "fd00::/8"]);
    assert_eq!(settings.net.allowed_networks().unwrap().len(), 2);
    assert_eq!(settings.store.kind, StoreKind::Redis);
    assert_eq!(settings.store.redis.url.expose(), "redis://app:pw@cache:6379/2");
    assert_eq!(
        settings.http.auth_token.as_ref().map(|t| t.expose().as_str()),
        Some("007123-0123456789abcdef0123456789")
    );
    assert_eq!(settings.log.filter, "debug");
}

#[test]
fn the_config_path_variable_is_not_a_key() {
    let settings = load(None, &[(CONFIG_PATH_ENV, "/etc/imagepipe.toml")]).unwrap();
    assert_eq!(settings, Settings::default());
}

#[test]
fn an_unknown_key_in_the_file_is_rejected_by_name() {
    let file = TempToml::new("unknown", "[bus]\nkindd = \"nats\"\n");
    let err = load(Some(&file), &[]).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, ConfigError::Key { .. }), "{err:?}");
    assert!(message.contains("bus") && message.contains("kindd"), "{message}");
}

#[test]
fn an_unknown_section_is_rejected_by_name() {
    let file = TempToml::new("unknown-section", "[buss]\nkind = \"nats\"\n");
    let message = load(Some(&file), &[]).unwrap_err().to_string();
    assert!(message.contains("buss"), "{message}");
}

#[test]
fn an_unknown_key_in_the_environment_is_rejected_by_name() {
    let err = load(None, &[("IMAGEPIPE_WORKER__CONCURENCY", "4")]).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("worker") && message.contains("concurency"), "{message}");

    let err = load(None, &[("IMAGEPIPE_BUS_KIND", "nats")]).unwrap_err();
    assert_eq!(err.key(), Some("bus_kind"));
    assert!(err.to_string().contains("IMAGEPIPE_BUS__KIND"), "the hint names the right variable: {err}");

    let err = load(None, &[("IMAGEPIPE_BUSS__KIND", "nats")]).unwrap_err();
    assert!(err.to_string().contains("buss"), "{err}");
}

#[test]
fn tooling_variables_without_a_section_are_not_config_keys() {
    let settings = load(
        None,
        &[("IMAGEPIPE_TEST_MODEL_DIR", "/models"), ("IMAGEPIPE_CACHE_DIR", "/cache"), ("IMAGEPIPE_BUS__PREFIX", "x")],
    )
    .unwrap();
    assert_eq!(settings.bus.prefix, "x");
}

#[test]
fn opentelemetry_variables_are_not_config_keys() {
    let settings = load(
        None,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SERVICE_NAME", "images"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("IMAGEPIPE_TELEMETRY__SERVICE_NAME", "images-eu"),
        ],
    )
    .unwrap();
    assert_eq!(settings.telemetry.service_name.as_deref(), Some("images-eu"));
}

#[test]
fn the_ai_runtime_is_layered_like_every_key() {
    assert_eq!(load(None, &[]).unwrap().ai.runtime, AiRuntime::Auto);
    let file = TempToml::new(
        "ai-runtime",
        r#"
        [ai]
        runtime = "tract"
        "#,
    );
    assert_eq!(load(Some(&file), &[]).unwrap().ai.runtime, AiRuntime::Tract);
    let settings = load(
        Some(&file),
        &[
            ("IMAGEPIPE_AI__RUNTIME", "onnxruntime"),
            ("IMAGEPIPE_AI__ONNXRUNTIME_LIBRARY", "/opt/ort/libonnxruntime.so"),
        ],
    )
    .unwrap();
    assert_eq!(settings.ai.runtime, AiRuntime::Onnxruntime);
    assert_eq!(settings.ai.onnxruntime_library.as_deref(), Some(std::path::Path::new("/opt/ort/libonnxruntime.so")));
    let err = load(None, &[("IMAGEPIPE_AI__RUNTIME", "torch")]).unwrap_err();
    assert_eq!(err.key(), Some("ai.runtime"), "{err}");
    let err = load(Some(&file), &[("IMAGEPIPE_AI__ONNXRUNTIME_LIBRARY", "/opt/ort/libonnxruntime.so")]).unwrap_err();
    assert_eq!(err.key(), Some("ai.onnxruntime_library"), "{err}");
}

#[test]
fn a_value_of_the_wrong_form_names_its_key() {
    let cases = [
        ("IMAGEPIPE_BUS__KIND", "rabbit", "bus.kind"),
        ("IMAGEPIPE_WORKER__ACK_WAIT", "30", "worker.ack_wait"),
        ("IMAGEPIPE_HTTP__PORT", "eighty", "http.port"),
        ("IMAGEPIPE_HTTP__BIND", "not-an-ip", "http.bind"),
        ("IMAGEPIPE_LOG__FORMAT", "xml", "log.format"),
    ];
    for (name, value, key) in cases {
        let err = load(None, &[(name, value)]).unwrap_err();
        assert_eq!(err.key(), Some(key), "{name}={value}: {err}");
        assert!(!err.to_string().contains("for key"), "the key is named once: {err}");
    }
}

#[test]
fn unusable_values_are_rejected_naming_the_key() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("IMAGEPIPE_NET__ALLOW_CIDRS", "10.0.0.0/8,10.0.0.300/8")], "net.allow_cidrs[1]"),
        (&[("IMAGEPIPE_DOWNLOAD__ALLOW_CIDRS", "10.0.0.0/8,::1/128,10.0.0.0/33")], "download.allow_cidrs[2]"),
        (&[("IMAGEPIPE_NOTIFICATION__ALLOW_CIDRS", "fd00::/8,not-a-cidr")], "notification.allow_cidrs[1]"),
        (&[("IMAGEPIPE_DOWNLOAD__READ_TIMEOUT", "0s")], "download.read_timeout"),
        (&[("IMAGEPIPE_DOWNLOAD__READ_TIMEOUT", "1m")], "download.read_timeout"),
        (&[("IMAGEPIPE_DOWNLOAD__PER_HOST__CONCURRENCY", "0")], "download.per_host.concurrency"),
        (&[("IMAGEPIPE_DOWNLOAD__PER_HOST__RATE", "-1")], "download.per_host.rate"),
        (&[("IMAGEPIPE_DOWNLOAD__PER_HOST__RATE", "NaN")], "download.per_host.rate"),
        (&[("IMAGEPIPE_DOWNLOAD__PER_HOST__THROTTLE_MAX", "0s")], "download.per_host.throttle_max"),
        (&[("IMAGEPIPE_DOWNLOAD__PER_HOST__LEASE", "5s")], "download.per_host.lease"),
        (&[("IMAGEPIPE_COORDINATOR__RETRY_MIN_BACKOFF", "0s")], "coordinator.retry_min_backoff"),
        (&[("IMAGEPIPE_COORDINATOR__RETRY_MIN_BACKOFF", "2m")], "coordinator.retry_min_backoff"),
        (&[("IMAGEPIPE_HTTP__PORT", "0")], "http.port"),
        (&[("IMAGEPIPE_WORKER__CONCURRENCY", "0")], "worker.concurrency"),
        (&[("IMAGEPIPE_WORKER__MAX_DELIVERIES", "0")], "worker.max_deliveries"),
        (&[("IMAGEPIPE_WORKER__ACK_WAIT", "0s")], "worker.ack_wait"),
        (&[("IMAGEPIPE_WORKER__HANDLER_TIMEOUT", "0s")], "worker.handler_timeout"),
        (&[("IMAGEPIPE_STORE__KIND", "redis"), ("IMAGEPIPE_STORE__REDIS__URL", "http://x")], "store.redis.url"),
        (&[("IMAGEPIPE_STORE__PATH", "")], "store.path"),
        (&[("IMAGEPIPE_BLOB__DIR", "")], "blob.dir"),
        (&[("IMAGEPIPE_BUS__PREFIX", "bad prefix")], "bus.prefix"),
        (&[("IMAGEPIPE_LOG__FILTER", "info,[[[")], "log.filter"),
        (&[("IMAGEPIPE_HTTP__AUTH_TOKEN", "")], "http.auth_token"),
        (&[("IMAGEPIPE_HTTP__AUTH_TOKEN", "s3cret")], "http.auth_token"),
        (&[("IMAGEPIPE_HTTP__TOKENS", "ci:submit:short")], "http.tokens[0].token"),
        (&[("IMAGEPIPE_HTTP__AUTH_FAILURE_LIMIT", "0")], "http.auth_failure_limit"),
        (&[("IMAGEPIPE_HTTP__TRUSTED_PROXIES", "10.0.0.0/8,nope")], "http.trusted_proxies[1]"),
        (&[("IMAGEPIPE_TELEMETRY__SERVICE_NAME", " ")], "telemetry.service_name"),
        (&[("IMAGEPIPE_COORDINATOR__MAX_IN_FLIGHT", "0")], "coordinator.max_in_flight"),
        (&[("IMAGEPIPE_COORDINATOR__MAX_ATTEMPTS", "0")], "coordinator.max_attempts"),
        (&[("IMAGEPIPE_COORDINATOR__ANALYZE_DEADLINE", "0s")], "coordinator.analyze_deadline"),
        (&[("IMAGEPIPE_COORDINATOR__RETENTION", "0s")], "coordinator.retention"),
        (&[("IMAGEPIPE_COORDINATOR__SEARCH_URL", "tag-indexer-worker:8080")], "coordinator.search_url"),
        (&[("IMAGEPIPE_COORDINATOR__STATS_URL", "ftp://analytics/")], "coordinator.stats_url"),
        (&[("IMAGEPIPE_COORDINATOR__SIMILARITY_URL", "http://similar/?x=1")], "coordinator.similarity_url"),
        (&[("IMAGEPIPE_DLQ__MAX_ENTRIES", "0")], "dlq.max_entries"),
        (&[("IMAGEPIPE_DLQ__MAX_AGE", "0s")], "dlq.max_age"),
        (&[("IMAGEPIPE_SIMILARITY__PHASH_MAX_DISTANCE", "65")], "similarity.phash_max_distance"),
        (&[("IMAGEPIPE_SIMILARITY__DUPLICATE_THRESHOLD", "1.5")], "similarity.duplicate_threshold"),
        (&[("IMAGEPIPE_SIMILARITY__PAIR_FLOOR", "0.99")], "similarity.pair_floor"),
        (&[("IMAGEPIPE_SIMILARITY__EXACT_LIMIT", "0")], "similarity.exact_limit"),
        (&[("IMAGEPIPE_AI__TOP_K", "0")], "ai.top_k"),
        (&[("IMAGEPIPE_AI__THREADS", "0")], "ai.threads"),
        (&[("IMAGEPIPE_AI__TAG_MIN_SCORE", "1.5")], "ai.tag_min_score"),
        (&[("IMAGEPIPE_AI__MAX_PIXELS", "0")], "ai.max_pixels"),
    ];
    for (vars, key) in cases {
        let err = load(None, vars).unwrap_err();
        assert!(matches!(err, ConfigError::Invalid { .. }), "{vars:?}: {err:?}");
        assert_eq!(err.key(), Some(*key), "{vars:?}: {err}");
    }
}

#[test]
fn the_download_and_webhook_allowlists_inherit_net_allow_cidrs_until_set() {
    let defaults = load(None, &[]).unwrap();
    assert_eq!((&defaults.download.allow_cidrs, &defaults.notification.allow_cidrs), (&None, &None));
    assert_eq!(defaults.download.read_timeout, Duration::from_secs(10));
    assert_eq!(defaults.download.total_timeout, Duration::from_secs(20));
    assert_eq!(
        (defaults.coordinator.retry_min_backoff, defaults.coordinator.retry_max_backoff),
        (Duration::from_secs(1), Duration::from_secs(60))
    );

    let net: Vec<ipnet::IpNet> = vec!["192.168.0.0/16".parse().unwrap()];
    let inherited = load(None, &[("IMAGEPIPE_NET__ALLOW_CIDRS", "192.168.0.0/16")]).unwrap();
    assert_eq!(inherited.allowed_networks(Outbound::Download).unwrap(), net);
    assert_eq!(inherited.allowed_networks(Outbound::Notification).unwrap(), net);

    let own = load(
        None,
        &[
            ("IMAGEPIPE_NET__ALLOW_CIDRS", "192.168.0.0/16"),
            ("IMAGEPIPE_DOWNLOAD__ALLOW_CIDRS", "10.0.0.0/8,::1/128"),
            ("IMAGEPIPE_NOTIFICATION__ALLOW_CIDRS", ""),
        ],
    )
    .unwrap();
    assert_eq!(own.download.allow_cidrs.as_deref(), Some(&["10.0.0.0/8".to_owned(), "::1/128".to_owned()][..]));
    let download: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
    assert_eq!(own.allowed_networks(Outbound::Download).unwrap(), download, "replaces net.allow_cidrs");
    assert_eq!(own.allowed_networks(Outbound::Notification).unwrap(), [], "set to nothing: nothing");
    assert_eq!(own.net.allowed_networks().unwrap(), net);

    let file = TempToml::new("allowlists", "[download]\nallow_cidrs = [\"10.1.0.0/16\"]\nread_timeout = \"3s\"\n");
    let settings = load(Some(&file), &[]).unwrap();
    assert_eq!(settings.download.allow_cidrs, Some(vec!["10.1.0.0/16".to_owned()]));
    assert_eq!(settings.download.read_timeout, Duration::from_secs(3));
    let printed = TempToml::new("allowlists-printed", &settings.to_masked_toml().unwrap());
    assert_eq!(load(Some(&printed), &[]).unwrap(), settings, "set and unset allowlists survive printing");
}

#[test]
fn per_host_politeness_is_layered_and_its_lease_follows_the_total_timeout() {
    let defaults = load(None, &[]).unwrap().download;
    let per_host = &defaults.per_host;
    assert_eq!((per_host.concurrency, per_host.rate, per_host.rate_limited()), (4, 0.0, false));
    assert_eq!((per_host.max_wait, per_host.throttle_max), (Duration::from_secs(2), Duration::from_secs(60)));
    assert_eq!(defaults.per_host_lease(), Duration::from_secs(30), "total_timeout (20 s) + 10 s");

    let file = TempToml::new("per-host", "[download]\ntotal_timeout = \"40s\"\n[download.per_host]\nrate = 2\n");
    let settings = load(
        Some(&file),
        &[("IMAGEPIPE_DOWNLOAD__PER_HOST__CONCURRENCY", "2"), ("IMAGEPIPE_DOWNLOAD__PER_HOST__MAX_WAIT", "500ms")],
    )
    .unwrap();
    let download = &settings.download;
    assert_eq!((download.per_host.concurrency, download.per_host.rate), (2, 2.0));
    assert_eq!(download.per_host.max_wait, Duration::from_millis(500));
    assert_eq!(download.per_host_lease(), Duration::from_secs(50), "an unset lease follows total_timeout");
    let fractional = load(None, &[("IMAGEPIPE_DOWNLOAD__PER_HOST__RATE", "0.5")]).unwrap();
    assert_eq!(fractional.download.per_host.rate, 0.5);
    let leased = load(None, &[("IMAGEPIPE_DOWNLOAD__PER_HOST__LEASE", "2m")]).unwrap();
    assert_eq!(leased.download.per_host_lease(), Duration::from_secs(120));
    let printed = TempToml::new("per-host-printed", &settings.to_masked_toml().unwrap());
    assert_eq!(load(Some(&printed), &[]).unwrap(), settings, "per_host survives printing");
}

#[tokio::test]
async fn a_refusal_names_the_allowlist_of_its_client() {
    let settings = Settings::default();
    for (client, hint) in [
        (Outbound::Download, "add 10.0.0.1/32 to download.allow_cidrs (IMAGEPIPE_DOWNLOAD__ALLOW_CIDRS)"),
        (Outbound::Notification, "add 10.0.0.1/32 to notification.allow_cidrs (IMAGEPIPE_NOTIFICATION__ALLOW_CIDRS)"),
    ] {
        let builder = settings.client_builder(client, imagepipe_net::Limits::default(), "test").unwrap();
        let client = builder.dial_check(|_| false).build().unwrap();
        // 10.0.0.1 is refused before anything is dialled (and the dial check refuses all).
        let error = client.get("http://10.0.0.1/a.jpg").await.unwrap_err();
        assert!(error.to_string().ends_with(hint), "{error}");
    }
}

#[test]
fn a_missing_or_broken_file_is_reported_with_its_path() {
    let missing = PathBuf::from("/nonexistent/imagepipe-runtime-test.toml");
    let err = Settings::load_from(Some(&missing), env(&[])).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/imagepipe-runtime-test.toml"), "{err}");

    let broken = TempToml::new("broken", "[bus\nkind = ");
    let err = load(Some(&broken), &[]).unwrap_err();
    assert!(matches!(err, ConfigError::File { .. }), "{err:?}");
    assert!(err.to_string().contains(&broken.0.display().to_string()), "{err}");
}

#[test]
fn printed_config_masks_secrets_and_url_credentials() {
    let settings = load(
        None,
        &[
            ("IMAGEPIPE_STORE__REDIS__URL", "redis://app:redis-pw@cache:6379"),
            ("IMAGEPIPE_BUS__NATS__URL", "nats://nats-user:nats-pw@broker:4222"),
            ("IMAGEPIPE_HTTP__AUTH_TOKEN", "api-token-0123456789abcdef0123456789"),
            ("IMAGEPIPE_HTTP__TOKENS", "grafana:read:grafana-token-0123456789abcdef012345"),
        ],
    )
    .unwrap();
    let printed = settings.to_masked_toml().unwrap();
    for secret in ["redis-pw", "nats-pw", "nats-user", "api-token", "grafana-token"] {
        assert!(!printed.contains(secret), "{secret} leaked:\n{printed}");
    }
    assert!(printed.contains("redis://***@cache:6379"), "{printed}");
    assert!(printed.contains("auth_token = \"***\""), "{printed}");
    assert!(printed.contains("ack_wait = \"30s\""), "{printed}");
    let debug = format!("{:?}", settings.store);
    assert!(!debug.contains("redis-pw"), "{debug}");
}

#[test]
fn the_printed_config_of_a_secretless_setup_loads_back_unchanged() {
    let file = TempToml::new("round-trip", "[worker]\nconcurrency = 7\n[net]\nallow_cidrs = [\"10.0.0.0/8\"]\n");
    let settings = load(Some(&file), &[]).unwrap();
    let printed = TempToml::new("round-trip-printed", &settings.to_masked_toml().unwrap());
    assert_eq!(load(Some(&printed), &[]).unwrap(), settings);
}

#[test]
fn the_coordinator_forwards_to_the_urls_set_and_a_blank_one_is_unset() {
    let defaults = load(None, &[]).unwrap().coordinator;
    assert_eq!((defaults.search_url, defaults.stats_url, defaults.similarity_url), (None, None, None));
    let set = load(
        None,
        &[
            ("IMAGEPIPE_COORDINATOR__SEARCH_URL", "http://tag-indexer-worker:8080"),
            ("IMAGEPIPE_COORDINATOR__STATS_URL", " "),
        ],
    )
    .unwrap()
    .coordinator;
    assert_eq!(set.search_url.as_deref(), Some("http://tag-indexer-worker:8080"));
    assert_eq!(set.stats_url, None, "blank is unset");
}

#[test]
fn scoped_tokens_come_from_a_file_or_one_variable() {
    let file = TempToml::new(
        "http-tokens",
        r#"
        [http]
        tokens = [
          { name = "grafana", token = "grafana-token-0123456789abcdef012345", scope = "read" },
          { name = "ci", token = "ci-token-0123456789abcdef0123456789ab", scope = "submit" },
        ]
        "#,
    );
    let settings = load(Some(&file), &[]).unwrap();
    let scoped: Vec<(&str, Scope)> = settings.http.tokens.iter().map(|t| (t.name.as_str(), t.scope)).collect();
    assert_eq!(scoped, [("grafana", Scope::Read), ("ci", Scope::Submit)]);

    let env = [(
        "IMAGEPIPE_HTTP__TOKENS",
        "ops:operate:ops-token-0123456789abcdef0123456789a, ci:SUBMIT:ci:token-0123456789abcdef0123456789",
    )];
    let settings = load(None, &env).unwrap();
    let scoped: Vec<(&str, Scope, &str)> =
        settings.http.tokens.iter().map(|t| (t.name.as_str(), t.scope, t.token.expose().as_str())).collect();
    assert_eq!(
        scoped,
        [
            ("ops", Scope::Operate, "ops-token-0123456789abcdef0123456789a"),
            ("ci", Scope::Submit, "ci:token-0123456789abcdef0123456789")
        ]
    );
    let error =
        load(None, &[("IMAGEPIPE_HTTP__TOKENS", "ops:root:ops-token-0123456789abcdef0123456789a")]).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("http.tokens") && message.contains("not a scope"), "{message}");
    assert!(!message.contains("ops-token"), "the token is not printed: {message}");
}
