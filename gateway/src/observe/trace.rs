//! Traces (`--tracing-config-file`): OpenTelemetry spans for each request, its authentication
//! and authorization, store calls, list serving and watch setup, exported over OTLP/gRPC to
//! the configured collector in bounded batches (`trace/export.rs`).
//!
//! Spans are made with the OpenTelemetry API directly rather than through
//! `tracing-opentelemetry`: the request span's parent is chosen only after authentication (as
//! Kubernetes does, an incoming `traceparent` is trusted from `system:masters` and
//! `system:monitoring` only; anyone else's becomes a link), which needs explicit start times,
//! and with tracing off nothing is built at all: the pipeline takes one branch on
//! `Api::tracer` and every other hook finds no current span. Log events stay with the
//! `tracing` crate.
//!
//! Sampling is Kubernetes': parent-based, and for traces that start here a ratio of
//! `samplingRatePerMillion` (unset or 0: never).
//!
//! The current span travels with the request's future (`FutureExt::with_context`), so the
//! store wrapper (`metrics/store.rs`) finds its parent without it being passed down; spawned
//! tasks and watch streams, polled outside it, make no spans. A webhook call (authorization,
//! admission) is traced the same way: wrapped in [`in_span`] (`webhook` spans, `SpanKind`
//! aside), with [`inject_current`] on its request so the webhook can join the trace.

pub mod export;
pub mod file;

use std::borrow::Cow;
use std::future::Future;
use std::str::FromStr;
use std::time::SystemTime;

use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::{Injector, TextMapPropagator as _};
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, SpanExporter as _};
use svc_core::user::UserInfo;

pub use export::DroppedSpans;
pub use file::TracingConfiguration;

/// The service name spans are reported under (Kubernetes' API server reports `apiserver`).
pub const SERVICE_NAME: &str = "apiserver";

/// Groups whose `traceparent` is trusted (Kubernetes' `system:masters` and
/// `system:monitoring`); from anyone else it only links the request's own trace.
pub const TRUSTED_GROUPS: &[&str] = &["system:masters", "system:monitoring"];

/// The tracer of a server with tracing on: cheap to clone.
#[derive(Clone, Debug)]
pub struct Tracer {
    tracer: SdkTracer,
    /// Keeps the export pipeline alive as long as any tracer does.
    _provider: SdkTracerProvider,
    flusher: export::Flusher,
}

/// What went wrong starting the exporter.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("tracing configuration: {0}")]
    Config(String),
    #[error("OTLP exporter: {0}")]
    Exporter(String),
}

/// Parent-based sampling with a ratio of `samplingRatePerMillion` for new traces (unset or 0:
/// never), as Kubernetes samples.
pub fn sampler(config: &TracingConfiguration) -> Sampler {
    let root = match config.sampling_rate_per_million {
        Some(rate) if rate >= file::PER_MILLION => Sampler::AlwaysOn,
        Some(rate) if rate > 0 => {
            Sampler::TraceIdRatioBased(f64::from(rate) / f64::from(file::PER_MILLION))
        }
        _ => Sampler::AlwaysOff,
    };
    Sampler::ParentBased(Box::new(root))
}

impl Tracer {
    /// Starts the OTLP exporter (lazily connected: an absent collector costs nothing here) and
    /// the batch task; needs a Tokio runtime. `dropped` counts spans that never left.
    pub fn start(config: &TracingConfiguration, dropped: DroppedSpans) -> Result<Self, TraceError> {
        let uri = file::collector_uri(config).map_err(TraceError::Config)?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(uri)
            .with_timeout(export::EXPORT_TIMEOUT)
            .build()
            .map_err(|e| TraceError::Exporter(e.to_string()))?;
        let resource = Resource::builder().with_service_name(SERVICE_NAME).build();
        exporter.set_resource(&resource);
        let processor = export::BoundedBatch::start(exporter, dropped);
        let flusher = processor.flusher();
        let provider = SdkTracerProvider::builder()
            .with_sampler(sampler(config))
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        Ok(Tracer {
            tracer: provider.tracer("svc-gateway"),
            _provider: provider,
            flusher,
        })
    }

    /// Sends the spans queued now and waits for the export (bounded): shutdown calls it.
    pub async fn flush(&self) {
        self.flusher.flush().await;
    }

    /// The request's span, begun at `start` (before authentication, which decided whether
    /// `incoming` is its parent), and the context that carries it.
    pub fn request_span(
        &self,
        name: Cow<'static, str>,
        attributes: Vec<KeyValue>,
        incoming: Option<SpanContext>,
        user: Option<&UserInfo>,
        start: SystemTime,
    ) -> Context {
        let trusted = user.is_some_and(|u| TRUSTED_GROUPS.iter().any(|g| u.in_group(g)));
        let mut builder = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_start_time(start)
            .with_attributes(attributes);
        let parent = match incoming {
            Some(sc) if trusted => Context::new().with_remote_span_context(sc),
            Some(sc) => {
                builder = builder.with_links(vec![Link::with_context(sc)]);
                Context::new()
            }
            None => Context::new(),
        };
        let span = builder.start_with_context(&self.tracer, &parent);
        Context::new().with_span(span)
    }

    /// A finished child of `parent` that ran from `start` to `end` (authentication, timed
    /// before its parent span existed).
    pub fn record_child(
        &self,
        parent: &Context,
        name: &'static str,
        start: SystemTime,
        end: SystemTime,
        error: Option<String>,
    ) {
        if !parent.span().span_context().is_sampled() {
            return;
        }
        let mut span = self
            .tracer
            .span_builder(name)
            .with_start_time(start)
            .start_with_context(&self.tracer, parent);
        if let Some(e) = error {
            span.set_status(Status::error(e));
        }
        span.end_with_timestamp(end);
    }

    /// A child of the current span, or `None` when no sampled span is current (work outside
    /// a request, or a request that is not traced).
    pub fn child(&self, name: &'static str, attributes: Vec<KeyValue>) -> Option<Context> {
        let cx = Context::current();
        if !cx.span().span_context().is_sampled() {
            return None;
        }
        let span = self
            .tracer
            .span_builder(name)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &cx);
        Some(cx.with_span(span))
    }
}

/// Runs `fut` inside a child span of the current one (when tracing is on and the request is
/// traced), so spans it starts are that span's children; `failed` says whether its output
/// marks the span as an error.
pub async fn in_span<F: Future>(
    tracer: Option<&Tracer>,
    name: &'static str,
    attributes: impl FnOnce() -> Vec<KeyValue>,
    fut: F,
    failed: impl FnOnce(&F::Output) -> Option<String>,
) -> F::Output {
    let Some(cx) = tracer.and_then(|t| t.child(name, attributes())) else {
        return fut.await;
    };
    let out = fut.with_context(cx.clone()).await;
    let span = cx.span();
    if let Some(e) = failed(&out) {
        span.set_status(Status::error(e));
    }
    span.end();
    out
}

/// Ends the span a context carries, with the HTTP status of the response (5xx marks an
/// error, as OpenTelemetry's HTTP server conventions say).
pub fn end_request(cx: &Context, code: u16) {
    let span = cx.span();
    span.set_attribute(KeyValue::new("http.status_code", i64::from(code)));
    if code >= 500 {
        span.set_status(Status::error(""));
    }
    span.end();
}

/// Adds the current span's W3C `traceparent` (and `tracestate`) to a request this server
/// sends (a webhook call) while serving one with tracing on, through OpenTelemetry's own
/// propagator; its flag says whether the request is sampled, so the webhook follows the same
/// decision. Nothing is added outside a span.
pub fn inject_current(headers: &mut http::HeaderMap) {
    struct Headers<'a>(&'a mut http::HeaderMap);
    impl Injector for Headers<'_> {
        fn set(&mut self, key: &str, value: String) {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(key.as_bytes()),
                http::HeaderValue::from_str(&value),
            ) && !value.is_empty()
            {
                self.0.insert(name, value);
            }
        }
    }
    TraceContextPropagator::new().inject_context(&Context::current(), &mut Headers(headers));
}

/// The W3C `traceparent` of a request, if it has a valid one (`tracestate` kept when it
/// parses). Anything malformed is ignored, as the W3C specification asks.
pub fn incoming(headers: &http::HeaderMap) -> Option<SpanContext> {
    let parent = headers.get("traceparent")?;
    let sc = parse_traceparent(parent.as_bytes())?;
    let state = headers
        .get("tracestate")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| TraceState::from_str(v).ok())
        .unwrap_or_default();
    Some(SpanContext::new(
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags(),
        true,
        state,
    ))
}

/// `version-traceid-parentid-flags`, lowercase hex; version `ff` and all-zero ids are
/// invalid; version 00 has exactly these four fields, later versions may append more.
///
/// Incoming headers are read here rather than by OpenTelemetry's `TraceContextPropagator`
/// (which writes outgoing ones, [`inject_current`]): the propagator parses fields with
/// `from_str_radix`, so it accepts what the W3C specification says to ignore (a 31-digit
/// trace ID, a one-digit version or flags field, a `+`), and a client's malformed header
/// would then become the parent of our spans.
pub fn parse_traceparent(value: &[u8]) -> Option<SpanContext> {
    let s = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
    let mut fields = s.split('-');
    let (version, trace, span, flags) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let lower_hex = |f: &str, len: usize| {
        f.len() == len && f.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if !lower_hex(version, 2) || version == "ff" || !lower_hex(flags, 2) {
        return None;
    }
    if version == "00" && fields.next().is_some() {
        return None;
    }
    if !lower_hex(trace, 32) || !lower_hex(span, 16) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    ))
}

/// Kubernetes' request span name: the method for non-resource requests, else the method and
/// the path with the namespace and name replaced (`GET /api/v1/namespaces/{:namespace}/pods`).
pub fn request_span_name(
    method: &http::Method,
    resource: Option<(&svc_core::ResourceInfo, bool, bool, Option<&str>)>,
) -> Cow<'static, str> {
    let Some((info, namespaced, named, subresource)) = resource else {
        return Cow::Owned(method.as_str().to_string());
    };
    let mut name = format!("{} /", method.as_str());
    if info.group.is_empty() {
        name.push_str("api");
    } else {
        name.push_str("apis/");
        name.push_str(info.group);
    }
    name.push('/');
    name.push_str(info.version);
    if namespaced {
        name.push_str("/namespaces/{:namespace}");
    }
    name.push('/');
    name.push_str(info.plural);
    if named {
        name.push_str("/{:name}");
    }
    if let Some(sub) = subresource {
        name.push('/');
        name.push_str(sub);
    }
    Cow::Owned(name)
}

#[cfg(test)]
mod tests;
