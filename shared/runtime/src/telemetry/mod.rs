//! Logs and traces: a `tracing` subscriber writing text or JSON lines, and an OpenTelemetry
//! tracer provider so that spans carry W3C trace ids, continued across messages through the
//! `traceparent` header ([`message_span`], [`inject_traceparent`]) and exported over OTLP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set ([`otlp`]).

mod context;
pub mod otlp;

use std::io::IsTerminal as _;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::subscriber::Subscriber;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::{LogConfig, LogFormat, TelemetryConfig};

pub use context::{continue_http_trace, current_trace_id, inject_trace, inject_traceparent, join_trace, message_span};
pub use otlp::OtlpConfig;

/// The environment variable whose filter, when set, replaces `log.filter`.
pub const RUST_LOG: &str = "RUST_LOG";

/// The environment variable naming the service on exported spans, unless
/// `telemetry.service_name` does.
pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";

/// Telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log filter does not parse.
    #[error("log filter {filter:?} (from {origin}) is invalid")]
    Filter {
        /// The filter text.
        filter: String,
        /// `RUST_LOG` or `log.filter`.
        origin: &'static str,
        /// Parser error.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// Another global subscriber is already installed in this process.
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled(#[source] tracing_subscriber::util::TryInitError),
    /// An `OTEL_EXPORTER_OTLP_*` variable has a value the span exporter cannot use.
    #[error("{variable}={value:?}: {reason}")]
    Setting {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The exporter's HTTP client could not be built.
    #[error("building the HTTP client of the OTLP span exporter")]
    HttpClient(#[source] reqwest::Error),
    /// The span exporter could not be built.
    #[error("building the OTLP span exporter for {endpoint}")]
    Exporter {
        /// Where spans were to go.
        endpoint: String,
        /// The exporter's error.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// The installed telemetry; keep it alive for the life of the process and call
/// [`Telemetry::shutdown`] before exiting.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// The tracer provider.
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// Exports the spans not sent yet and stops the tracer provider. Blocks until the last
    /// export finished or timed out; from async code, call it on a blocking thread.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "stopping the tracer provider");
        }
    }
}

/// Installs the process-wide subscriber for service `service`: lines on stderr in
/// `log.format` (coloured only when stderr is a terminal, see [`use_ansi`]), filtered by `RUST_LOG` if set, else `log.filter`; spans traced under the
/// name [`service_name`] picks and exported as the `OTEL_EXPORTER_OTLP_*` variables say
/// ([`OtlpConfig::from_env`]; nothing is exported without an endpoint). Also installs the W3C
/// propagator as OpenTelemetry's global one.
pub fn init(service: &str, log: &LogConfig, telemetry: &TelemetryConfig) -> Result<Telemetry, TelemetryError> {
    let filter = env_filter(std::env::var(RUST_LOG).ok(), &log.filter)?;
    let export = OtlpConfig::from_env()?;
    let name = service_name(service, telemetry, std::env::var(OTEL_SERVICE_NAME).ok());
    let provider = tracer_provider(&name, export.as_ref())?;
    let ansi = use_ansi(log.format, std::io::stderr().is_terminal());
    let (subscriber, telemetry) = subscriber_with(log.format, filter, provider, std::io::stderr, ansi);
    subscriber.try_init().map_err(TelemetryError::AlreadyInstalled)?;
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    if let Some(export) = &export {
        tracing::info!(endpoint = %export.endpoint, service_name = %name, "exporting spans over OTLP");
    }
    Ok(telemetry)
}

/// Libraries whose INFO lines are their own chatter, not the service's: ONNX Runtime (through
/// `ort`) logs every graph optimisation of every session it creates. Each logs at `warn` unless
/// the filter names its target (`RUST_LOG=info,ort=info` shows them).
pub const QUIET_TARGETS: &[&str] = &["ort"];

/// The filter: `rust_log` when set and non-blank, else `configured`; each of [`QUIET_TARGETS`]
/// the filter does not name at `warn`.
pub fn env_filter(rust_log: Option<String>, configured: &str) -> Result<EnvFilter, TelemetryError> {
    let (filter, origin) = match rust_log {
        Some(value) if !value.trim().is_empty() => (value, RUST_LOG),
        _ => (configured.to_owned(), "log.filter"),
    };
    let mut parsed = EnvFilter::try_new(&filter).map_err(|source| TelemetryError::Filter {
        filter: filter.clone(),
        origin,
        source,
    })?;
    for target in QUIET_TARGETS {
        let named = filter.split(',').any(|d| d.trim().split(['=', '[', ':']).next() == Some(*target));
        if !named {
            parsed = parsed.add_directive(format!("{target}=warn").parse().expect("a valid directive"));
        }
    }
    Ok(parsed)
}

/// The `service.name` of the spans: `telemetry.service_name` when configured, else
/// `otel_service_name` (the value of `OTEL_SERVICE_NAME`) when set and non-blank, else
/// `service`.
pub fn service_name(service: &str, telemetry: &TelemetryConfig, otel_service_name: Option<String>) -> String {
    telemetry
        .service_name
        .clone()
        .or(otel_service_name.filter(|name| !name.trim().is_empty()))
        .unwrap_or_else(|| service.to_owned())
}

/// A tracer provider whose spans carry `service.name` = `service_name` (and whatever
/// `OTEL_RESOURCE_ATTRIBUTES` adds), batched to the OTLP exporter `export` describes, or
/// recorded without export when it is `None`.
pub fn tracer_provider(service_name: &str, export: Option<&OtlpConfig>) -> Result<SdkTracerProvider, TelemetryError> {
    let resource = Resource::builder().with_service_name(service_name.to_owned()).build();
    let builder = SdkTracerProvider::builder().with_resource(resource);
    Ok(match export {
        Some(config) => builder.with_batch_exporter(otlp::span_exporter(config)?).build(),
        None => builder.build(),
    })
}

/// Whether log lines carry ANSI colours: text lines going to a terminal do; lines written to a
/// file or a pipe (a log collector, `2> service.log`) and JSON lines never do.
pub fn use_ansi(format: LogFormat, to_terminal: bool) -> bool {
    format == LogFormat::Text && to_terminal
}

/// The subscriber [`init`] installs, writing plain lines (no colours) to `writer` and tracing
/// into `provider`, without installing it (for tests and embedding).
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    provider: SdkTracerProvider,
    writer: W,
) -> (impl Subscriber + Send + Sync + for<'a> LookupSpan<'a> + use<W>, Telemetry)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    subscriber_with(format, filter, provider, writer, false)
}

/// [`subscriber`] with ANSI colours in text lines when `ansi` is set (see [`use_ansi`]).
pub fn subscriber_with<W>(
    format: LogFormat,
    filter: EnvFilter,
    provider: SdkTracerProvider,
    writer: W,
    ansi: bool,
) -> (impl Subscriber + Send + Sync + for<'a> LookupSpan<'a> + use<W>, Telemetry)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let lines = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(writer).boxed(),
        LogFormat::Json => {
            tracing_subscriber::fmt::layer().json().with_ansi(false).with_current_span(true).with_writer(writer).boxed()
        }
    };
    let traces = tracing_opentelemetry::layer().with_tracer(provider.tracer("imagepipe"));
    let subscriber = Registry::default().with(filter).with(lines).with(traces);
    (subscriber, Telemetry { provider })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_wins_over_the_configured_filter_and_bad_filters_are_named() {
        assert!(env_filter(Some("debug".into()), "info").unwrap().to_string().contains("debug"));
        assert!(env_filter(Some(" ".into()), "warn").unwrap().to_string().contains("warn"));
        let err = env_filter(Some("info,[[[".into()), "info").unwrap_err();
        assert!(err.to_string().contains("RUST_LOG"), "{err}");
    }

    /// Whether `filter` lets an INFO line of `target` through.
    fn shows_info(filter: EnvFilter, target: &'static str) -> bool {
        let subscriber = Registry::default().with(filter);
        tracing::subscriber::with_default(subscriber, || match target {
            "ort::logging" => tracing::enabled!(target: "ort::logging", tracing::Level::INFO),
            _ => tracing::enabled!(target: "imagepipe_runtime::service", tracing::Level::INFO),
        })
    }

    #[test]
    fn onnx_runtimes_info_lines_are_left_out_unless_the_filter_names_them() {
        let default = || env_filter(None, &LogConfig::default().filter).unwrap();
        assert!(!shows_info(default(), "ort::logging"), "ONNX Runtime's chatter is off by default");
        assert!(shows_info(default(), "imagepipe_runtime::service"), "the service's own lines are not");
        assert!(!shows_info(env_filter(Some("info".into()), "warn").unwrap(), "ort::logging"));
        assert!(shows_info(env_filter(Some("info,ort=info".into()), "warn").unwrap(), "ort::logging"));
        assert!(shows_info(env_filter(None, "ort[x]=debug,info").unwrap(), "ort::logging"));
    }

    #[test]
    fn colours_only_in_text_lines_to_a_terminal() {
        assert!(use_ansi(LogFormat::Text, true));
        assert!(!use_ansi(LogFormat::Text, false), "a file or a pipe gets plain text");
        assert!(!use_ansi(LogFormat::Json, true));
        assert!(!use_ansi(LogFormat::Json, false));
    }

    #[test]
    fn the_configured_service_name_wins_over_otel_service_name_which_wins_over_the_service() {
        let configured = TelemetryConfig { service_name: Some("images-eu".into()), ..TelemetryConfig::default() };
        let unset = TelemetryConfig::default();
        assert_eq!(service_name("coordinator", &configured, Some("from-env".into())), "images-eu");
        assert_eq!(service_name("coordinator", &unset, Some("from-env".into())), "from-env");
        assert_eq!(service_name("coordinator", &unset, Some(" ".into())), "coordinator");
        assert_eq!(service_name("coordinator", &unset, None), "coordinator");
    }
}
