//! Span export over OTLP/HTTP with protobuf bodies, set up by the standard variables:
//!
//! | variable | meaning |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | the URL spans are posted to, as is |
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | the collector's base URL; spans go to `<base>/v1/traces` |
//! | `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` | `http/protobuf` (the only one built in) |
//! | `OTEL_EXPORTER_OTLP_[TRACES_]COMPRESSION` | `gzip` or `none` |
//! | `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` | milliseconds one export may take (default 10000) |
//! | `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS` | `key=value,...` sent with every export |
//!
//! Without an endpoint nothing is exported. Spans are batched by the SDK's batch processor
//! (`OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`, ...), which exports from a thread of
//! its own; the HTTP client is therefore reqwest's blocking one.

use std::io::Read;
use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{
    Compression, OTEL_EXPORTER_OTLP_COMPRESSION, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL_HTTP_PROTOBUF, OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_TRACES_TIMEOUT,
    Protocol, SpanExporter, WithExportConfig, WithHttpConfig,
};

use super::TelemetryError;

/// The path of the traces endpoint under a collector's base URL.
pub const TRACES_PATH: &str = "/v1/traces";

/// How long one export may take unless a variable says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most of a collector's response that is read.
const MAX_RESPONSE_BYTES: u64 = 4 * 1024 * 1024;

/// Where and how spans are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The URL spans are posted to (`http://collector:4318/v1/traces`).
    pub endpoint: String,
    /// Whether request bodies are gzip-compressed.
    pub gzip: bool,
    /// How long one export may take.
    pub timeout: Duration,
}

impl OtlpConfig {
    /// Export to `endpoint` (the traces URL itself), uncompressed, with the default timeout.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self { endpoint: endpoint.into(), gzip: false, timeout: DEFAULT_TIMEOUT }
    }

    /// The export the process environment asks for (see the module docs); `None` when no
    /// endpoint is set.
    pub fn from_env() -> Result<Option<Self>, TelemetryError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The export the variables `var` returns ask for; blank values count as unset.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, TelemetryError> {
        let var = |name: &'static str| var(name).filter(|v| !v.trim().is_empty()).map(|v| (name, v));
        let endpoint = match (var(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), var(OTEL_EXPORTER_OTLP_ENDPOINT)) {
            (Some((name, url)), _) => checked_url(name, url.trim().to_owned())?,
            (None, Some((name, base))) => {
                checked_url(name, format!("{}{TRACES_PATH}", base.trim().trim_end_matches('/')))?
            }
            (None, None) => return Ok(None),
        };
        if let Some((name, protocol)) = var(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL).or(var(OTEL_EXPORTER_OTLP_PROTOCOL))
            && !protocol.trim().eq_ignore_ascii_case(OTEL_EXPORTER_OTLP_PROTOCOL_HTTP_PROTOBUF)
        {
            return Err(setting(name, protocol, "unsupported protocol; the only one built in is http/protobuf"));
        }
        let gzip = match var(OTEL_EXPORTER_OTLP_TRACES_COMPRESSION).or(var(OTEL_EXPORTER_OTLP_COMPRESSION)) {
            None => false,
            Some((_, value)) if value.trim().eq_ignore_ascii_case("none") => false,
            Some((_, value)) if value.trim().eq_ignore_ascii_case("gzip") => true,
            Some((name, value)) => return Err(setting(name, value, "unsupported compression; use gzip or none")),
        };
        let timeout = match var(OTEL_EXPORTER_OTLP_TRACES_TIMEOUT).or(var(OTEL_EXPORTER_OTLP_TIMEOUT)) {
            None => DEFAULT_TIMEOUT,
            Some((name, value)) => match value.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => return Err(setting(name, value, "not a positive number of milliseconds")),
            },
        };
        Ok(Some(Self { endpoint, gzip, timeout }))
    }
}

/// `url` when it is an http or https URL; the error names `variable`.
fn checked_url(variable: &'static str, url: String) -> Result<String, TelemetryError> {
    match reqwest::Url::parse(&url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => Ok(url),
        Ok(_) => Err(setting(variable, url, "not an http or https URL")),
        Err(e) => Err(setting(variable, url, e.to_string())),
    }
}

fn setting(variable: &'static str, value: String, reason: impl Into<String>) -> TelemetryError {
    TelemetryError::Setting { variable, value, reason: reason.into() }
}

/// The OTLP/HTTP protobuf span exporter `config` describes (headers from
/// `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`).
pub(super) fn span_exporter(config: &OtlpConfig) -> Result<SpanExporter, TelemetryError> {
    let client = BlockingClient::new(config.timeout)?;
    let builder = SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_endpoint(config.endpoint.clone())
        .with_protocol(Protocol::HttpBinary)
        .with_timeout(config.timeout);
    let builder = if config.gzip { builder.with_compression(Compression::Gzip) } else { builder };
    builder.build().map_err(|source| TelemetryError::Exporter { endpoint: config.endpoint.clone(), source })
}

/// reqwest's blocking client, for the batch processor's export thread (outside any async
/// runtime).
#[derive(Debug)]
struct BlockingClient(reqwest::blocking::Client);

impl BlockingClient {
    /// Builds the client on a thread of its own: reqwest refuses to build one inside an async
    /// runtime, and services set telemetry up inside theirs.
    fn new(timeout: Duration) -> Result<Self, TelemetryError> {
        let build = || reqwest::blocking::Client::builder().timeout(timeout).build();
        std::thread::scope(|scope| scope.spawn(build).join())
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            .map(Self)
            .map_err(TelemetryError::HttpClient)
    }
}

#[async_trait::async_trait]
impl HttpClient for BlockingClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::blocking::Request::try_from(request)?;
        let response = self.0.execute(request)?;
        let status = response.status();
        let headers = response.headers().clone();
        let mut body = Vec::new();
        response.take(MAX_RESPONSE_BYTES).read_to_end(&mut body)?;
        let mut answer = Response::builder().status(status).body(Bytes::from(body))?;
        *answer.headers_mut() = headers;
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<Option<OtlpConfig>, TelemetryError> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        OtlpConfig::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn nothing_is_exported_without_an_endpoint() {
        assert_eq!(config(&[]).unwrap(), None);
        assert_eq!(config(&[(OTEL_EXPORTER_OTLP_ENDPOINT, " "), (OTEL_EXPORTER_OTLP_PROTOCOL, "grpc")]).unwrap(), None);
    }

    #[test]
    fn the_base_endpoint_gets_the_traces_path_and_the_traces_endpoint_is_taken_as_is() {
        let base = config(&[(OTEL_EXPORTER_OTLP_ENDPOINT, "http://127.0.0.1:4318/")]).unwrap().unwrap();
        assert_eq!(base, OtlpConfig::new("http://127.0.0.1:4318/v1/traces"));
        let both = config(&[
            (OTEL_EXPORTER_OTLP_ENDPOINT, "http://collector:4318"),
            (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "https://traces.example/ingest"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(both.endpoint, "https://traces.example/ingest");
    }

    #[test]
    fn compression_and_timeout_come_from_the_traces_variable_first() {
        let got = config(&[
            (OTEL_EXPORTER_OTLP_ENDPOINT, "http://collector:4318"),
            (OTEL_EXPORTER_OTLP_COMPRESSION, "none"),
            (OTEL_EXPORTER_OTLP_TRACES_COMPRESSION, "GZIP"),
            (OTEL_EXPORTER_OTLP_TIMEOUT, "2500"),
            (OTEL_EXPORTER_OTLP_PROTOCOL, "http/protobuf"),
        ])
        .unwrap()
        .unwrap();
        assert!(got.gzip);
        assert_eq!(got.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn unsupported_settings_are_named_in_the_error() {
        let endpoint = (OTEL_EXPORTER_OTLP_ENDPOINT, "http://collector:4318");
        for (vars, variable) in [
            (vec![endpoint, (OTEL_EXPORTER_OTLP_PROTOCOL, "grpc")], OTEL_EXPORTER_OTLP_PROTOCOL),
            (vec![endpoint, (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "http/json")], OTEL_EXPORTER_OTLP_TRACES_PROTOCOL),
            (vec![endpoint, (OTEL_EXPORTER_OTLP_COMPRESSION, "zstd")], OTEL_EXPORTER_OTLP_COMPRESSION),
            (vec![endpoint, (OTEL_EXPORTER_OTLP_TIMEOUT, "10s")], OTEL_EXPORTER_OTLP_TIMEOUT),
            (vec![(OTEL_EXPORTER_OTLP_ENDPOINT, "collector:4318")], OTEL_EXPORTER_OTLP_ENDPOINT),
            (vec![(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "ftp://collector/")], OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
        ] {
            let err = config(&vars).unwrap_err();
            assert!(matches!(&err, TelemetryError::Setting { variable: v, .. } if *v == variable), "{err:?}");
            assert!(err.to_string().starts_with(variable), "{err}");
        }
    }

    #[tokio::test]
    async fn an_exporter_builds_inside_an_async_runtime() {
        let provider =
            crate::telemetry::tracer_provider("otlp-test", Some(&OtlpConfig::new("http://127.0.0.1:9/v1/traces")))
                .unwrap();
        tokio::task::spawn_blocking(move || provider.shutdown()).await.unwrap().unwrap();
    }
}
