//! Tests of the sampler the configuration maps to and of `traceparent` parsing.

use opentelemetry::trace::SpanKind;
use opentelemetry_sdk::trace::{SamplingDecision, ShouldSample};

use super::*;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN: &str = "00f067aa0ba902b7";

fn decision(rate: Option<i32>, parent: Option<SpanContext>, trace_id: TraceId) -> SamplingDecision {
    let config = TracingConfiguration {
        endpoint: None,
        sampling_rate_per_million: rate,
    };
    let cx = parent.map(|sc| Context::new().with_remote_span_context(sc));
    sampler(&config)
        .should_sample(cx.as_ref(), trace_id, "GET", &SpanKind::Server, &[], &[])
        .decision
}

fn parent(sampled: bool) -> SpanContext {
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    SpanContext::new(
        TraceId::from_hex(TRACE).unwrap(),
        SpanId::from_hex(SPAN).unwrap(),
        flags,
        true,
        TraceState::default(),
    )
}

#[test]
fn the_rate_samples_new_traces_and_parents_decide_for_theirs() {
    let id = |n: u128| TraceId::from_bytes(n.to_be_bytes());
    let sampled = SamplingDecision::RecordAndSample;
    // Unset or 0: a new trace is never sampled; a sampled parent still is followed.
    for rate in [None, Some(0)] {
        assert_eq!(decision(rate, None, id(1)), SamplingDecision::Drop);
        assert_eq!(decision(rate, None, id(u128::MAX)), SamplingDecision::Drop);
        assert_eq!(decision(rate, Some(parent(true)), id(1)), sampled);
        assert_eq!(
            decision(rate, Some(parent(false)), id(1)),
            SamplingDecision::Drop
        );
    }
    // A million per million: every new trace; an unsampled parent still wins.
    assert_eq!(decision(Some(1_000_000), None, id(u128::MAX)), sampled);
    assert_eq!(
        decision(Some(1_000_000), Some(parent(false)), id(1)),
        SamplingDecision::Drop
    );
    // A ratio decides by the trace id: low ids in, high ids out (about half at 500,000).
    assert_eq!(decision(Some(500_000), None, id(1)), sampled);
    assert_eq!(
        decision(Some(500_000), None, id(u128::MAX)),
        SamplingDecision::Drop
    );
    let kept = (0..1000u128)
        .filter(|i| decision(Some(500_000), None, id(i * (u128::MAX / 1000))) == sampled)
        .count();
    assert!((400..=600).contains(&kept), "{kept}");
}

#[test]
fn a_valid_traceparent_is_read() {
    let sc = parse_traceparent(format!("00-{TRACE}-{SPAN}-01").as_bytes()).unwrap();
    assert_eq!(sc.trace_id().to_string(), TRACE);
    assert_eq!(sc.span_id().to_string(), SPAN);
    assert!(sc.is_sampled() && sc.is_remote());
    let sc = parse_traceparent(format!("00-{TRACE}-{SPAN}-00").as_bytes()).unwrap();
    assert!(!sc.is_sampled());
    // Unknown flag bits are dropped; a later version may append fields.
    let sc = parse_traceparent(format!("00-{TRACE}-{SPAN}-03").as_bytes()).unwrap();
    assert_eq!(sc.trace_flags(), TraceFlags::SAMPLED);
    assert!(parse_traceparent(format!("01-{TRACE}-{SPAN}-01-what-ever").as_bytes()).is_some());

    let mut headers = http::HeaderMap::new();
    headers.insert(
        "traceparent",
        format!("00-{TRACE}-{SPAN}-01").parse().unwrap(),
    );
    headers.insert("tracestate", "vendor=value".parse().unwrap());
    let sc = incoming(&headers).unwrap();
    assert_eq!(sc.trace_state().get("vendor"), Some("value"));
    headers.insert("tracestate", "=,=bad".parse().unwrap());
    assert!(incoming(&headers).is_some(), "a bad tracestate is dropped");
}

#[test]
fn the_current_span_is_passed_on_to_outgoing_requests() {
    let outgoing = || {
        let mut h = http::HeaderMap::new();
        inject_current(&mut h);
        h
    };
    assert!(outgoing().is_empty(), "no span, no header");
    let cx = Context::new().with_remote_span_context(parent(true));
    let _guard = cx.attach();
    assert_eq!(
        outgoing()["traceparent"],
        format!("00-{TRACE}-{SPAN}-01").as_str()
    );
    drop(_guard);
    let cx = Context::new().with_remote_span_context(parent(false));
    let _guard = cx.attach();
    let h = outgoing();
    assert_eq!(
        h["traceparent"],
        format!("00-{TRACE}-{SPAN}-00").as_str(),
        "not sampled here, so not downstream either"
    );
    assert!(
        !h.contains_key("tracestate"),
        "an empty tracestate is not sent"
    );
}

#[test]
fn malformed_traceparents_are_ignored() {
    let zeros32 = "0".repeat(32);
    let zeros16 = "0".repeat(16);
    let upper = TRACE.to_uppercase();
    let bad: Vec<String> = vec![
        String::new(),
        "-".into(),
        "00".into(),
        "00---".into(),
        format!("00-{TRACE}-{SPAN}"),
        format!("00-{TRACE}-{SPAN}-01-extra"),
        format!("ff-{TRACE}-{SPAN}-01"),
        format!("0-{TRACE}-{SPAN}-01"),
        format!("zz-{TRACE}-{SPAN}-01"),
        format!("00-{zeros32}-{SPAN}-01"),
        format!("00-{TRACE}-{zeros16}-01"),
        format!("00-{upper}-{SPAN}-01"),
        format!("00-{}-{SPAN}-01", &TRACE[1..]),
        format!("00-{TRACE}-{}-01", &SPAN[1..]),
        format!("00-{TRACE}-{SPAN}-1"),
        format!("00-{TRACE}-{SPAN}-0x"),
        format!("00-{TRACE}x-{SPAN}-01"),
        format!("00-{}é-{SPAN}-01", &TRACE[2..]),
        format!("00_{TRACE}_{SPAN}_01"),
    ];
    for b in &bad {
        assert!(parse_traceparent(b.as_bytes()).is_none(), "{b:?}");
    }
    assert!(parse_traceparent(&[0xff, 0xfe, b'-', 0x80]).is_none());
    // Arbitrary bytes never panic.
    for n in 0..2000u32 {
        let bytes: Vec<u8> = (0..(n % 64))
            .map(|i| (n.wrapping_mul(2_654_435_761).rotate_left(i) & 0xff) as u8)
            .collect();
        let _ = parse_traceparent(&bytes);
    }
}

#[test]
fn request_spans_are_named_as_kubernetes_names_them() {
    let info = svc_core::registry::all()
        .iter()
        .find(|r| r.plural == "serviceaccounts")
        .copied()
        .unwrap();
    assert_eq!(
        request_span_name(&http::Method::GET, Some((info, true, false, None))),
        "GET /api/v1/namespaces/{:namespace}/serviceaccounts"
    );
    assert_eq!(
        request_span_name(&http::Method::POST, Some((info, true, true, Some("token")))),
        "POST /api/v1/namespaces/{:namespace}/serviceaccounts/{:name}/token"
    );
    assert_eq!(request_span_name(&http::Method::GET, None), "GET");
}

/// An exporter whose exports never finish: a collector that accepts and never answers.
#[derive(Debug)]
struct Stuck;

impl opentelemetry_sdk::trace::SpanExporter for Stuck {
    async fn export(
        &self,
        _batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        std::future::pending().await
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_export_queue_drops_and_counts_instead_of_waiting() {
    let dropped = DroppedSpans::default();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(export::BoundedBatch::start(Stuck, dropped.clone()))
        .build();
    let tracer = provider.tracer("test");
    let extra = 100;
    // The export task cannot run before this test yields: the queue takes its capacity and
    // every span past it is dropped at once.
    for _ in 0..export::QUEUE_CAPACITY + extra {
        tracer.start("s").end();
    }
    let count = |reason| {
        dropped
            .get_or_create(&export::DropLabels::new(reason))
            .get()
    };
    assert_eq!(count("queue_full"), extra as u64);
    // The task takes a batch and hangs on it; the queue has room again, and no more.
    tokio::task::yield_now().await;
    for _ in 0..export::MAX_BATCH + extra {
        tracer.start("s").end();
    }
    assert!(count("queue_full") >= 2 * extra as u64);
    assert!(count("queue_full") <= (2 * extra + export::MAX_BATCH) as u64);
}
