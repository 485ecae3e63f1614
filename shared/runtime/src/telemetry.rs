//! Logs and traces: a `tracing` subscriber writing text or JSON lines, and an OpenTelemetry
//! tracer provider so that spans carry W3C trace ids, continued across messages through the
//! `traceparent` header.

use std::sync::LazyLock;

use imagepipe_bus::{Delivery, Headers};
use imagepipe_contracts::TraceId;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing::field::Empty;
use tracing::subscriber::Subscriber;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::{LogConfig, LogFormat, TelemetryConfig};

/// The environment variable whose filter, when set, replaces `log.filter`.
pub const RUST_LOG: &str = "RUST_LOG";

/// W3C trace context, the one propagation format on every message.
static PROPAGATOR: LazyLock<TraceContextPropagator> = LazyLock::new(TraceContextPropagator::new);

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
}

/// The installed telemetry; keep it alive for the life of the process and call
/// [`Telemetry::shutdown`] before exiting.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// The tracer provider, for exporters added later.
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// Flushes and stops the tracer provider.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "stopping the tracer provider");
        }
    }
}

/// Installs the process-wide subscriber for service `service`: lines on stderr in
/// `log.format`, filtered by `RUST_LOG` if set, else `log.filter`; spans traced under the
/// service name `telemetry.service_name` (default `service`). Also installs the W3C
/// propagator as OpenTelemetry's global one.
pub fn init(service: &str, log: &LogConfig, telemetry: &TelemetryConfig) -> Result<Telemetry, TelemetryError> {
    let filter = env_filter(std::env::var(RUST_LOG).ok(), &log.filter)?;
    let (subscriber, telemetry) = subscriber(service, log.format, filter, telemetry, std::io::stderr);
    subscriber.try_init().map_err(TelemetryError::AlreadyInstalled)?;
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    Ok(telemetry)
}

/// The filter: `rust_log` when set and non-blank, else `configured`.
pub fn env_filter(rust_log: Option<String>, configured: &str) -> Result<EnvFilter, TelemetryError> {
    let (filter, origin) = match rust_log {
        Some(value) if !value.trim().is_empty() => (value, RUST_LOG),
        _ => (configured.to_owned(), "log.filter"),
    };
    EnvFilter::try_new(&filter).map_err(|source| TelemetryError::Filter { filter, origin, source })
}

/// The subscriber [`init`] installs, writing to `writer`, without installing it (for tests
/// and embedding).
pub fn subscriber<W>(
    service: &str,
    format: LogFormat,
    filter: EnvFilter,
    telemetry: &TelemetryConfig,
    writer: W,
) -> (impl Subscriber + Send + Sync + for<'a> LookupSpan<'a> + use<W>, Telemetry)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let name = telemetry.service_name.clone().unwrap_or_else(|| service.to_owned());
    let provider = tracer_provider(name);
    let lines = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().with_writer(writer).boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer().json().with_current_span(true).with_writer(writer).boxed(),
    };
    let traces = tracing_opentelemetry::layer().with_tracer(provider.tracer("imagepipe"));
    let subscriber = Registry::default().with(filter).with(lines).with(traces);
    (subscriber, Telemetry { provider })
}

/// A tracer provider for `service_name` that records every span (export comes later).
pub fn tracer_provider(service_name: String) -> SdkTracerProvider {
    SdkTracerProvider::builder().with_resource(Resource::builder().with_service_name(service_name).build()).build()
}

/// The span one message is handled in: a consumer span whose parent is the trace context of
/// the message's `traceparent` header (a new trace when it has none). Its `trace_id` field
/// puts the trace id on every log line inside it.
pub fn message_span(delivery: &Delivery) -> Span {
    let span = tracing::info_span!(
        parent: None,
        "message",
        otel.name = %format!("{} process", delivery.source),
        otel.kind = "consumer",
        messaging.source = %delivery.source,
        messaging.position = %delivery.position(),
        messaging.delivery_count = delivery.delivery_count,
        messaging.key = delivery.message.key.as_deref(),
        trace_id = Empty,
    );
    let headers = &delivery.message.headers;
    if headers.traceparent().is_some() {
        let parent = PROPAGATOR.extract(&HeaderExtractor(headers));
        if let Err(e) = span.set_parent(parent) {
            tracing::debug!(error = %e, "message span not linked to its traceparent");
        }
    }
    let trace_id = trace_id_of(&span).or_else(|| headers.traceparent().and_then(TraceId::from_traceparent));
    if let Some(id) = trace_id {
        span.record("trace_id", tracing::field::display(id));
    }
    span
}

/// Writes the current span's trace context into `headers` (`traceparent`, and `tracestate`
/// when it has one), so the receiver continues the trace. Returns false, writing nothing, when
/// there is no traced span.
pub fn inject_traceparent(headers: &mut Headers) -> bool {
    let context = Span::current().context();
    if !context.span().span_context().is_valid() {
        return false;
    }
    PROPAGATOR.inject_context(&context, &mut HeaderInjector(headers));
    true
}

/// The trace id of the current span (the envelope's `traceId`), if it is traced.
pub fn current_trace_id() -> Option<TraceId> {
    trace_id_of(&Span::current())
}

fn trace_id_of(span: &Span) -> Option<TraceId> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| TraceId::from_bytes(span_context.trace_id().to_bytes())).flatten()
}

struct HeaderExtractor<'a>(&'a Headers);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k).collect()
    }
}

struct HeaderInjector<'a>(&'a mut Headers);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if !value.is_empty() {
            self.0.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use imagepipe_bus::{Bus, BusConfig, ConsumerConfig, Message};
    use imagepipe_contracts::names::headers;

    use super::*;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    async fn deliver(message: Message) -> Delivery {
        let bus = Bus::connect(&BusConfig::default()).await.unwrap();
        bus.queues.send("tasks.telemetry-test", message).await.unwrap();
        let consumer = bus.queues.consume("tasks.telemetry-test", ConsumerConfig::default()).await.unwrap();
        consumer.fetch(1, Duration::from_secs(1)).await.unwrap().pop().expect("one delivery")
    }

    /// Collected log output.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;

        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    fn test_subscriber(format: LogFormat) -> (impl Subscriber + Send + Sync, Captured) {
        let captured = Captured::default();
        let filter = env_filter(None, "info").unwrap();
        let (subscriber, _telemetry) =
            subscriber("telemetry-test", format, filter, &TelemetryConfig::default(), captured.clone());
        (subscriber, captured)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_handler_span_continues_the_message_trace_and_passes_it_on() {
        let (subscriber, _) = test_subscriber(LogFormat::Text);
        let _guard = tracing::subscriber::set_default(subscriber);
        let delivery = deliver(Message::new("{}").with_header(headers::TRACEPARENT, TRACEPARENT)).await;

        let span = message_span(&delivery);
        let _entered = span.enter();

        assert_eq!(current_trace_id().map(|id| id.to_string()).as_deref(), Some(TRACE_ID));
        let mut outgoing = Headers::new();
        assert!(inject_traceparent(&mut outgoing));
        let sent = outgoing.traceparent().expect("traceparent injected");
        assert_eq!(TraceId::from_traceparent(sent).unwrap().to_string(), TRACE_ID);
        assert_ne!(sent, TRACEPARENT, "the outgoing parent is the handler's span, not the sender's");
        assert!(sent.ends_with("-01"), "sampled flag kept: {sent}");
        assert_eq!(outgoing.get("tracestate"), None, "no empty tracestate");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_message_without_traceparent_starts_a_new_trace() {
        let (subscriber, _) = test_subscriber(LogFormat::Text);
        let _guard = tracing::subscriber::set_default(subscriber);
        let first = message_span(&deliver(Message::new("{}")).await);
        let second = message_span(&deliver(Message::new("{}")).await);
        let id = |span: &Span| span.in_scope(current_trace_id).expect("traced");
        assert_ne!(id(&first), id(&second));
    }

    #[test]
    fn without_a_traced_span_nothing_is_injected() {
        let mut headers = Headers::new();
        assert!(!inject_traceparent(&mut headers));
        assert!(headers.is_empty());
        assert_eq!(current_trace_id(), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn json_lines_carry_the_trace_id_of_the_message() {
        let (subscriber, captured) = test_subscriber(LogFormat::Json);
        let _guard = tracing::subscriber::set_default(subscriber);
        let delivery = deliver(Message::new("{}").with_header(headers::TRACEPARENT, TRACEPARENT)).await;
        message_span(&delivery).in_scope(|| tracing::info!(answer = 42, "handled"));

        let output = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let line = output.lines().find(|l| l.contains("handled")).expect("log line written");
        let json: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(json["fields"]["answer"], 42);
        assert_eq!(json["span"]["trace_id"], TRACE_ID);
        assert_eq!(json["span"]["messaging.source"], "tasks.telemetry-test");
    }

    #[test]
    fn rust_log_wins_over_the_configured_filter_and_bad_filters_are_named() {
        assert!(env_filter(Some("debug".into()), "info").unwrap().to_string().contains("debug"));
        assert!(env_filter(Some(" ".into()), "warn").unwrap().to_string().contains("warn"));
        let err = env_filter(Some("info,[[[".into()), "info").unwrap_err();
        assert!(err.to_string().contains("RUST_LOG"), "{err}");
    }
}
