//! An OTLP/HTTP trace receiver on 127.0.0.1: it accepts `POST /v1/traces` with protobuf bodies
//! (gzip-compressed or not), as the services' exporters send them, and keeps one
//! [`ReceivedSpan`] per span so that a test can wait for the spans of a trace.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The media type of OTLP/HTTP protobuf bodies.
const PROTOBUF: &str = "application/x-protobuf";

/// One span as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSpan {
    /// The exporting service's `service.name` resource attribute (empty when missing).
    pub service_name: String,
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// 16 lowercase hex digits; `None` for a root span.
    pub parent_span_id: Option<String>,
    /// The span's name.
    pub name: String,
}

/// The receiver did not see what a test waited for in time.
#[derive(Debug, thiserror::Error)]
#[error("no matching spans within {waited:?}; {} spans received", received.len())]
pub struct WaitTimedOut {
    /// How long it waited.
    pub waited: Duration,
    /// Every span received by then.
    pub received: Vec<ReceivedSpan>,
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    gzip_requests: usize,
}

#[derive(Clone)]
struct Shared {
    received: Arc<Mutex<Received>>,
    changed: watch::Sender<usize>,
}

/// A running receiver; it stops when dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    shared: Shared,
    server: JoinHandle<()>,
}

impl OtlpReceiver {
    /// Starts a receiver on 127.0.0.1 at a free port.
    pub async fn start() -> std::io::Result<Self> {
        let shared = Shared { received: Arc::default(), changed: watch::Sender::new(0) };
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let app = Router::new().route("/v1/traces", post(export)).with_state(shared.clone());
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("OTLP receiver stopped: {e}");
            }
        });
        Ok(Self { addr, shared, server })
    }

    /// The base URL, the value of `OTEL_EXPORTER_OTLP_ENDPOINT` for a service.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The traces URL itself (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
    pub fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.endpoint())
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.shared.received.lock().expect("receiver lock").spans.clone()
    }

    /// How many export requests came gzip-compressed.
    pub fn gzip_requests(&self) -> usize {
        self.shared.received.lock().expect("receiver lock").gzip_requests
    }

    /// Waits until `predicate` holds for the spans received, at most `within`; returns them.
    pub async fn wait_for(
        &self,
        predicate: impl Fn(&[ReceivedSpan]) -> bool,
        within: Duration,
    ) -> Result<Vec<ReceivedSpan>, WaitTimedOut> {
        let deadline = tokio::time::Instant::now() + within;
        let mut changed = self.shared.changed.subscribe();
        loop {
            changed.mark_unchanged();
            let spans = self.spans();
            if predicate(&spans) {
                return Ok(spans);
            }
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                return Err(WaitTimedOut { waited: within, received: self.spans() });
            }
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn export(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if !content_type.starts_with(PROTOBUF) {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, format!("expected {PROTOBUF}, got {content_type:?}"))
            .into_response();
    }
    let gzip = headers.get(header::CONTENT_ENCODING).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    let body = if gzip {
        let mut inflated = Vec::new();
        if let Err(e) = flate2::read::GzDecoder::new(&body[..]).read_to_end(&mut inflated) {
            return (StatusCode::BAD_REQUEST, format!("bad gzip body: {e}")).into_response();
        }
        Bytes::from(inflated)
    } else {
        body
    };
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(request) => request,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("not an ExportTraceServiceRequest: {e}")).into_response(),
    };
    let spans = received_spans(request);
    {
        let mut received = shared.received.lock().expect("receiver lock");
        received.spans.extend(spans);
        received.gzip_requests += usize::from(gzip);
        shared.changed.send_replace(received.spans.len());
    }
    let answer = ExportTraceServiceResponse { partial_success: None }.encode_to_vec();
    ([(header::CONTENT_TYPE, PROTOBUF)], answer).into_response()
}

fn received_spans(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let service_name = service_name(resource_spans.resource.as_ref());
        for span in resource_spans.scope_spans.into_iter().flat_map(|scope| scope.spans) {
            out.push(ReceivedSpan {
                service_name: service_name.clone(),
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: (!span.parent_span_id.is_empty()).then(|| hex(&span.parent_span_id)),
                name: span.name,
            });
        }
    }
    out
}

fn service_name(resource: Option<&Resource>) -> String {
    resource
        .into_iter()
        .flat_map(|r| &r.attributes)
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(name) => Some(name.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use imagepipe_runtime::config::LogFormat;
    use imagepipe_runtime::telemetry::{OtlpConfig, current_trace_id, env_filter, subscriber, tracer_provider};

    use super::*;

    /// Spans from the runtime's own exporter, in this one process.
    async fn export_two_spans(config: OtlpConfig) -> String {
        let provider = tracer_provider("otlp-receiver-test", Some(&config)).unwrap();
        let filter = env_filter(None, "info").unwrap();
        let (subscriber, telemetry) = subscriber(LogFormat::Text, filter, provider, std::io::sink);
        let trace_id = tracing::subscriber::with_default(subscriber, || {
            tracing::info_span!("outer").in_scope(|| {
                tracing::info_span!("inner").in_scope(|| {});
                current_trace_id().expect("traced").to_string()
            })
        });
        tokio::task::spawn_blocking(move || telemetry.shutdown()).await.unwrap();
        trace_id
    }

    #[tokio::test]
    async fn spans_exported_by_the_runtime_are_received_once_the_shutdown_flushed_them() {
        let receiver = OtlpReceiver::start().await.unwrap();
        let trace_id = export_two_spans(OtlpConfig::new(receiver.traces_url())).await;

        // The batch delay is 5 s by default: these spans went out with the shutdown's flush.
        let spans = receiver.spans();
        let named = |name: &str| spans.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("{name}: {spans:?}"));
        let (outer, inner) = (named("outer"), named("inner"));
        assert_eq!(spans.len(), 2, "{spans:?}");
        assert!(spans.iter().all(|s| s.service_name == "otlp-receiver-test" && s.trace_id == trace_id));
        assert_eq!(outer.parent_span_id, None);
        assert_eq!(inner.parent_span_id.as_deref(), Some(outer.span_id.as_str()));
        assert_eq!(receiver.gzip_requests(), 0);
    }

    #[tokio::test]
    async fn gzip_bodies_are_inflated() {
        let receiver = OtlpReceiver::start().await.unwrap();
        let config = OtlpConfig { gzip: true, ..OtlpConfig::new(receiver.traces_url()) };
        let trace_id = export_two_spans(config).await;
        let spans = receiver.wait_for(|spans| spans.len() == 2, Duration::from_secs(5)).await.unwrap();
        assert!(spans.iter().all(|s| s.trace_id == trace_id), "{spans:?}");
        assert_eq!(receiver.gzip_requests(), 1);
    }

    #[tokio::test]
    async fn waiting_ends_at_the_deadline_with_what_was_received() {
        let receiver = OtlpReceiver::start().await.unwrap();
        let err = receiver.wait_for(|spans| !spans.is_empty(), Duration::from_millis(50)).await.unwrap_err();
        assert!(err.received.is_empty());
        let client = reqwest::Client::new();
        let response = client.post(receiver.traces_url()).body("{}").send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let response = client
            .post(receiver.traces_url())
            .header(header::CONTENT_TYPE, PROTOBUF)
            .body("\u{7}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
}
