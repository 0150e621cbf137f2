//! Tests of a response's audit: a panic's 500 and stage, and a watch whose
//! `ResponseComplete` comes when its body is dropped.

use std::sync::Arc;

use futures::future::BoxFuture;
use hyper::body::Frame;
use svc_config::audit::{Event, Policy};
use svc_core::user::UserInfo;

use super::*;
use crate::base::flags::AuditMode;
use crate::base::router::Route;
use crate::security::audit::{Auditor, Sink};

/// Keeps every event it is sent.
#[derive(Default)]
struct Recorder(parking_lot::Mutex<Vec<Arc<Event>>>);

impl Sink for Recorder {
    fn name(&self) -> &'static str {
        "log"
    }
    fn process<'a>(&'a self, events: &'a [Arc<Event>]) -> BoxFuture<'a, Result<(), String>> {
        self.0.lock().extend(events.iter().cloned());
        Box::pin(std::future::ready(Ok(())))
    }
}

fn auditor(policy: &str) -> (Arc<Auditor>, Arc<Recorder>) {
    let policy: Policy =
        svc_config::load(format!("apiVersion: audit.svc.io/v1\nkind: Policy\n{policy}").as_bytes())
            .unwrap();
    let rec = Arc::new(Recorder::default());
    let batch = crate::base::flags::Options::for_tests(".".into())
        .audit
        .log_batch();
    let metrics = crate::observe::metrics::Metrics::new().audit;
    let a = Auditor::new(
        &policy,
        vec![(rec.clone(), AuditMode::Blocking, batch)],
        metrics,
    );
    (Arc::new(a), rec)
}

fn stages(rec: &Recorder) -> Vec<Stage> {
    rec.0.lock().iter().map(|e| e.stage).collect()
}

#[tokio::test]
async fn a_panic_is_its_own_stage_with_a_500() {
    let (a, rec) = auditor("rules:\n- level: Metadata\n");
    let req = http::Request::get("/version").body(()).unwrap();
    let begun = a.begin(
        &req,
        None,
        &Route::NotFound,
        "get",
        Some(&UserInfo::default()),
    );
    let record = begun.record.unwrap();
    record.received().await.unwrap();
    let resp = panicked(record, "boom").await;
    assert_eq!(resp.status(), 500);
    assert_eq!(stages(&rec), [Stage::RequestReceived, Stage::Panic]);
    let ev = rec.0.lock()[1].clone();
    let status = ev.response_status.as_ref().unwrap();
    assert_eq!(status.code, 500);
    assert!(
        status.message.contains("APIServer panic'd: boom"),
        "{status:?}"
    );
}

#[tokio::test]
async fn a_long_running_response_completes_when_its_body_is_dropped() {
    let (a, rec) = auditor("omitStages: [RequestReceived]\nrules:\n- level: Request\n");
    let route = crate::base::router::route("/api/v1/namespaces");
    let req = http::Request::get("/api/v1/namespaces?watch=true")
        .body(())
        .unwrap();
    let begun = a.begin(&req, None, &route, "watch", Some(&UserInfo::default()));
    let record = begun.record.unwrap();
    record.received().await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
    let stream = http_body_util::StreamBody::new(tokio_stream_from(rx)).boxed();
    let resp = finish(record, Response::new(stream)).await;
    assert_eq!(
        stages(&rec),
        [Stage::ResponseStarted],
        "RequestReceived omitted"
    );
    tx.send(Ok(Frame::data(Bytes::from_static(b"{}\n"))))
        .await
        .unwrap();
    let mut body = resp.into_body();
    assert!(body.frame().await.is_some());
    assert_eq!(
        stages(&rec),
        [Stage::ResponseStarted],
        "events are not audited"
    );
    drop(body);
    assert_eq!(
        stages(&rec),
        [Stage::ResponseStarted, Stage::ResponseComplete]
    );
    let done = rec.0.lock()[1].clone();
    assert_eq!(done.verb, "watch");
    assert!(done.object_ref.is_none());
    assert_eq!(done.response_status.as_ref().unwrap().code, 200);
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
