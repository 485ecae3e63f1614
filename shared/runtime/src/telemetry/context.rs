//! Trace context across messages and requests: the span a delivery is handled in continues the
//! trace of its `traceparent` header, outgoing messages carry the current span's, and work done
//! for a task outside its messages joins the task's trace.

use std::sync::LazyLock;

use axum::http::HeaderMap;
use imagepipe_bus::{Delivery, Headers};
use imagepipe_contracts::TraceId;
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{self, SpanContext, SpanId, TraceContextExt, TraceFlags, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// W3C trace context, the one propagation format on every message.
static PROPAGATOR: LazyLock<TraceContextPropagator> = LazyLock::new(TraceContextPropagator::new);

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

/// Writes a `traceparent` of trace `trace_id` into `headers`: the current span's when it is in
/// that trace, else one naming a fresh span of the trace (whose sender is not traced here).
pub fn inject_trace(headers: &mut Headers, trace_id: TraceId) {
    if current_trace_id() == Some(trace_id) && inject_traceparent(headers) {
        return;
    }
    let context = Context::new().with_remote_span_context(remote_span(trace_id));
    PROPAGATOR.inject_context(&context, &mut HeaderInjector(headers));
}

/// Makes `span` part of trace `trace_id`; call it before entering `span`. The span stays the
/// child of the current span when that is in the trace; otherwise its parent becomes a remote
/// span of the trace, so that work done for a task outside the task's own messages (a timer, a
/// sweep, a task started while another was being submitted) still lands in the task's trace.
pub fn join_trace(span: &Span, trace_id: TraceId) {
    if current_trace_id() == Some(trace_id) {
        return;
    }
    if let Err(e) = span.set_parent(Context::new().with_remote_span_context(remote_span(trace_id))) {
        tracing::debug!(error = %e, %trace_id, "span not joined to the task's trace");
    }
}

/// Makes `span` continue the trace of an HTTP request's `traceparent` header, when it has one;
/// call it before entering `span`.
pub fn continue_http_trace(span: &Span, headers: &HeaderMap) {
    if !headers.contains_key(imagepipe_contracts::names::headers::TRACEPARENT) {
        return;
    }
    if let Err(e) = span.set_parent(PROPAGATOR.extract(&HttpHeaderExtractor(headers))) {
        tracing::debug!(error = %e, "request span not linked to its traceparent");
    }
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

/// A sampled remote span of trace `trace_id` with a fresh span id.
fn remote_span(trace_id: TraceId) -> SpanContext {
    let span_id = loop {
        let id = SpanId::from_bytes(rand::random::<u64>().to_be_bytes());
        if id != SpanId::INVALID {
            break id;
        }
    };
    SpanContext::new(
        trace::TraceId::from_bytes(trace_id.to_bytes()),
        span_id,
        TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    )
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

struct HttpHeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HttpHeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use imagepipe_bus::{Bus, BusConfig, ConsumerConfig, Message};
    use imagepipe_contracts::names::headers;

    use super::*;
    use crate::config::LogFormat;
    use crate::telemetry::{env_filter, subscriber, tracer_provider};
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
    use tracing::subscriber::Subscriber;
    use tracing_subscriber::fmt::MakeWriter;

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

    #[test]
    fn lines_carry_escape_codes_only_when_asked() {
        let written = |ansi| {
            let captured = Captured::default();
            let filter = env_filter(None, "info").unwrap();
            let provider = tracer_provider("ansi-test", None).unwrap();
            let (subscriber, _telemetry) =
                crate::telemetry::subscriber_with(LogFormat::Text, filter, provider, captured.clone(), ansi);
            tracing::subscriber::with_default(subscriber, || tracing::warn!(field = 1, "coloured or not"));
            String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
        };
        let plain = written(false);
        assert!(plain.contains("coloured or not") && !plain.contains('\u{1b}'), "{plain:?}");
        let coloured = written(true);
        assert!(coloured.contains('\u{1b}'), "{coloured:?}");
    }

    fn test_subscriber(format: LogFormat) -> (impl Subscriber + Send + Sync, Captured) {
        let captured = Captured::default();
        let filter = env_filter(None, "info").unwrap();
        let provider = tracer_provider("telemetry-test", None).unwrap();
        let (subscriber, _telemetry) = subscriber(format, filter, provider, captured.clone());
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

    #[tokio::test(flavor = "current_thread")]
    async fn messages_of_a_task_carry_its_trace_inside_and_outside_its_spans() {
        let (subscriber, _) = test_subscriber(LogFormat::Text);
        let _guard = tracing::subscriber::set_default(subscriber);
        let task: TraceId = TRACE_ID.parse().unwrap();

        let mut outside = Headers::new();
        inject_trace(&mut outside, task);
        let first = outside.traceparent().expect("traceparent written").to_owned();
        assert_eq!(TraceId::from_traceparent(&first), Some(task));

        let delivery = deliver(Message::new("{}").with_header(headers::TRACEPARENT, TRACEPARENT)).await;
        let span = message_span(&delivery);
        let _entered = span.enter();
        let mut inside = Headers::new();
        inject_trace(&mut inside, task);
        let mut current = Headers::new();
        assert!(inject_traceparent(&mut current));
        assert_eq!(inside.traceparent(), current.traceparent(), "the handler's own span is the parent");

        let other = TraceId::random();
        let mut elsewhere = Headers::new();
        inject_trace(&mut elsewhere, other);
        assert_eq!(elsewhere.traceparent().and_then(TraceId::from_traceparent), Some(other));
    }

    /// Ended spans, collected in memory.
    #[derive(Debug, Clone, Default)]
    struct Ended(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Ended {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    impl Ended {
        fn named(&self, name: &str) -> SpanData {
            let spans = self.0.lock().unwrap();
            spans.iter().find(|s| s.name == name).cloned().unwrap_or_else(|| panic!("no span {name}"))
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_joined_span_is_in_the_task_trace_and_a_child_when_it_already_was() {
        let ended = Ended::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(ended.clone()).build();
        let (subscriber, _telemetry) =
            subscriber(LogFormat::Text, env_filter(None, "info").unwrap(), provider, std::io::sink);
        let _guard = tracing::subscriber::set_default(subscriber);
        let task: TraceId = TRACE_ID.parse().unwrap();

        tracing::info_span!("unrelated").in_scope(|| {
            let span = tracing::info_span!("joined");
            join_trace(&span, task);
            span.in_scope(|| assert_eq!(current_trace_id(), Some(task)));
        });
        let delivery = deliver(Message::new("{}").with_header(headers::TRACEPARENT, TRACEPARENT)).await;
        message_span(&delivery).in_scope(|| {
            let span = tracing::info_span!("child");
            join_trace(&span, task);
            span.in_scope(|| {});
        });

        let unrelated = ended.named("unrelated");
        let joined = ended.named("joined");
        assert_ne!(unrelated.span_context.trace_id().to_bytes(), task.to_bytes());
        assert_eq!(joined.span_context.trace_id().to_bytes(), task.to_bytes());
        assert!(joined.parent_span_is_remote, "parent stands for the task's trace here");
        let message = ended.named("tasks.telemetry-test process");
        let child = ended.named("child");
        assert_eq!(child.span_context.trace_id().to_bytes(), task.to_bytes());
        assert_eq!(child.parent_span_id, message.span_context.span_id());
        assert!(!child.parent_span_is_remote);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_span_continues_the_request_traceparent() {
        let (subscriber, _) = test_subscriber(LogFormat::Text);
        let _guard = tracing::subscriber::set_default(subscriber);
        let mut request = HeaderMap::new();
        request.insert(headers::TRACEPARENT, TRACEPARENT.parse().unwrap());
        let span = tracing::info_span!("request");
        continue_http_trace(&span, &request);
        assert_eq!(span.in_scope(current_trace_id).map(|id| id.to_string()).as_deref(), Some(TRACE_ID));

        let untraced = tracing::info_span!("request");
        continue_http_trace(&untraced, &HeaderMap::new());
        assert_ne!(untraced.in_scope(current_trace_id).map(|id| id.to_string()).as_deref(), Some(TRACE_ID));
    }
}
