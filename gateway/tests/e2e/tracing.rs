//! Traces end to end: a gateway with a TracingConfiguration sends its spans over OTLP/gRPC to
//! a collector in the test (the collector's generated `TraceService` server on 127.0.0.1), and
//! the spans it receives have the structure, trace ids and sampling the configuration and the
//! incoming `traceparent` ask for. A dead collector never slows a request.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use serde_json::json;

use crate::support::client::{Client, TestServer, create_namespace, eventually};
use crate::support::process::free_port;

/// One span as the collector received it (ids in hex; an empty parent is a root).
#[derive(Clone, Debug)]
struct Received {
    service: String,
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    attributes: HashMap<String, String>,
    links: Vec<(String, String)>,
}

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<parking_lot::Mutex<Vec<Received>>>,
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

#[async_trait::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut out = self.spans.lock();
        for rs in request.into_inner().resource_spans {
            let resource = rs
                .resource
                .as_ref()
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for span in rs.scope_spans.iter().flat_map(|s| &s.spans) {
                out.push(Received {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    name: span.name.clone(),
                    attributes: attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Serves OTLP/gRPC (h2 without TLS) on a free loopback port until the test ends.
    async fn start() -> (Self, SocketAddr) {
        let collector = Collector::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = hyper_util::service::TowerToHyperService::new(service.clone());
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        (collector, addr)
    }

    fn trace(&self, trace_id: &str) -> Vec<Received> {
        self.spans
            .lock()
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect()
    }

    fn all(&self) -> Vec<Received> {
        self.spans.lock().clone()
    }
}

async fn gateway(endpoint: &str, rate: Option<u32>) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tracing.yaml");
    let rate = rate.map_or(String::new(), |r| format!("samplingRatePerMillion: {r}\n"));
    std::fs::write(
        &file,
        format!(
            "apiVersion: apiserver.svc.io/v1beta1\nkind: TracingConfiguration\n\
             endpoint: {endpoint}\n{rate}"
        ),
    )
    .unwrap();
    let srv = TestServer::start_with(|o| o.tracing_config_file = Some(file)).await;
    // The server has read the file; the directory may go.
    drop(dir);
    srv
}

/// Sends the spans the gateway has queued and waits for the export.
async fn flush(srv: &TestServer) {
    srv.handle().app.api.tracer.as_ref().unwrap().flush().await;
}

fn traceparent(trace: &str, span: &str, sampled: bool) -> String {
    format!("00-{trace}-{span}-{}", if sampled { "01" } else { "00" })
}

async fn get_with(c: &Client, path: &str, headers: &[(&str, &str)]) -> StatusCode {
    c.request(Method::GET, path, "", headers).await.status
}

fn children<'a>(spans: &'a [Received], parent: &Received) -> Vec<&'a str> {
    let mut names: Vec<&str> = spans
        .iter()
        .filter(|s| s.parent == parent.span_id)
        .map(|s| s.name.as_str())
        .collect();
    names.sort_unstable();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_spans_with_authentication_authorization_and_store_children() {
    let (collector, addr) = Collector::start().await;
    let srv = gateway(&addr.to_string(), Some(1_000_000)).await;
    let c = srv.admin();
    create_namespace(&c, "traced").await;

    // A create under a sampled parent of the caller's.
    let (trace, parent) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let r = c
        .request(
            Method::POST,
            "/api/v1/namespaces/traced/serviceaccounts",
            &json!({"metadata": {"name": "robot"}}).to_string(),
            &[
                ("content-type", "application/json"),
                ("traceparent", &traceparent(trace, parent, true)),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    // A list with no parent: the gateway starts the trace.
    let list_path = "/api/v1/namespaces/traced/serviceaccounts?limit=500";
    assert_eq!(get_with(&c, list_path, &[]).await, StatusCode::OK);
    flush(&srv).await;

    let spans = collector.trace(trace);
    let request = spans
        .iter()
        .find(|s| s.name == "POST /api/v1/namespaces/{:namespace}/serviceaccounts")
        .unwrap_or_else(|| panic!("no request span in {spans:#?}"));
    assert_eq!(request.parent, parent, "the caller's span is the parent");
    assert_eq!(request.service, "apiserver");
    assert_eq!(request.attributes["http.method"], "POST");
    assert_eq!(request.attributes["http.status_code"], "201");
    assert_eq!(
        request.attributes["http.target"],
        "/api/v1/namespaces/traced/serviceaccounts"
    );
    assert_eq!(
        children(&spans, request),
        [
            "authentication",
            "authorization",
            "store create",
            "store get"
        ],
        "{spans:#?}"
    );
    let key = |name: &str| spans.iter().find(|s| s.name == name).unwrap().attributes["key"].clone();
    // The create reads its namespace (it must exist and not be terminating), then commits.
    assert_eq!(key("store get"), "/registry/namespaces/traced");
    assert_eq!(
        key("store create"),
        "/registry/serviceaccounts/traced/robot"
    );

    let all = collector.all();
    let list_request = all
        .iter()
        .find(|s| s.attributes.get("http.target").map(String::as_str) == Some(list_path))
        .unwrap_or_else(|| panic!("no list request span in {all:#?}"));
    assert_eq!(
        list_request.name,
        "GET /api/v1/namespaces/{:namespace}/serviceaccounts"
    );
    assert!(list_request.parent.is_empty(), "a root: {list_request:?}");
    assert_ne!(list_request.trace_id, trace);
    let spans = collector.trace(&list_request.trace_id);
    assert_eq!(
        children(&spans, list_request),
        ["authentication", "authorization", "list"],
        "{spans:#?}"
    );
    let list = spans.iter().find(|s| s.name == "list").unwrap();
    assert_eq!(list.attributes["type"], "serviceaccounts");
    // A consistent list asks the store for its current revision first.
    assert_eq!(
        children(&spans, list),
        ["store getCurrentResourceVersion"],
        "{spans:#?}"
    );

    // Someone outside system:masters and system:monitoring cannot choose the parent: the
    // request starts its own trace, linked to theirs.
    let (their_trace, their_span) = ("5bf92f3577b34da6a3ce929d0e0e4736", "10f067aa0ba902b7");
    let alice = srv.user("alice", &[]);
    let tp = traceparent(their_trace, their_span, true);
    assert_eq!(
        get_with(
            &alice,
            "/api/v1/namespaces/traced/serviceaccounts",
            &[("traceparent", &tp)]
        )
        .await,
        StatusCode::FORBIDDEN
    );
    flush(&srv).await;
    assert!(collector.trace(their_trace).is_empty());
    let linked = collector
        .all()
        .into_iter()
        .find(|s| s.links.contains(&(their_trace.into(), their_span.into())))
        .expect("a span linked to the untrusted parent");
    assert!(linked.parent.is_empty());
    assert_eq!(linked.attributes["http.status_code"], "403");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_follows_the_rate_and_the_incoming_parent() {
    let (collector, addr) = Collector::start().await;
    let srv = gateway(&addr.to_string(), Some(0)).await;
    let c = srv.admin();
    let path = "/api/v1/namespaces/default/serviceaccounts";
    let unsampled = "1af7651916cd43dd8448eb211c80319c";
    let sampled = "2af7651916cd43dd8448eb211c80319c";
    assert_eq!(get_with(&c, path, &[]).await, StatusCode::OK);
    let tp = traceparent(unsampled, "b7ad6b7169203331", false);
    assert_eq!(
        get_with(&c, path, &[("traceparent", &tp)]).await,
        StatusCode::OK
    );
    let tp = traceparent(sampled, "c7ad6b7169203331", true);
    assert_eq!(
        get_with(&c, path, &[("traceparent", &tp)]).await,
        StatusCode::OK
    );
    flush(&srv).await;

    // Spans leave in the order they end: the sampled request's came last.
    eventually(
        Duration::from_secs(10),
        "the sampled trace arrives",
        || async {
            collector
                .trace(sampled)
                .iter()
                .any(|s| s.name.starts_with("GET "))
        },
    )
    .await;
    let all = collector.all();
    assert!(
        all.iter().all(|s| s.trace_id == sampled),
        "only the sampled parent's trace: {all:#?}"
    );
    let request = all.iter().find(|s| s.name.starts_with("GET ")).unwrap();
    assert_eq!(request.parent, "c7ad6b7169203331");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_never_slows_requests() {
    let port = free_port();
    let srv = gateway(&format!("127.0.0.1:{port}"), Some(1_000_000)).await;
    let c = srv.admin();
    create_namespace(&c, "dead").await;
    tokio::time::timeout(Duration::from_secs(30), async {
        for i in 0..30 {
            let (s, body) = c
                .post(
                    "/api/v1/namespaces/dead/serviceaccounts",
                    json!({"metadata": {"name": format!("sa-{i}")}}),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{body}");
            let (s, _) = c.get("/api/v1/namespaces/dead/serviceaccounts").await;
            assert_eq!(s, StatusCode::OK);
        }
    })
    .await
    .expect("requests are not held up by the collector");
    // The spans that could not be sent are counted.
    eventually(
        Duration::from_secs(30),
        "failed exports are counted",
        || async {
            let (_, body) = c.get("/metrics").await;
            let text = body.as_str().unwrap_or_default().to_string();
            text.lines().any(|l| {
                l.starts_with("apiserver_tracing_dropped_spans_total{reason=\"export_failed\"}")
                    && !l.ends_with(" 0")
            })
        },
    )
    .await;
}
