//! A scripted upstream for tests: Pods in namespace `ns` served over plain HTTP as
//! kube-apiserver serves them (paged lists, no streaming lists, watches from a revision with
//! its history replayed, 410 before the oldest revision kept), changed by the test, which
//! also sees the requests made. With it the proxy's cache source is tested over the real
//! protocol, from the registry's tests, without the registry naming an HTTP type.
// Test code: a panic on a broken expectation is the point.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use parking_lot::Mutex;
use svc_storage::Revision;
use tokio::sync::mpsc;

use crate::outbound::upstream::Upstream;

/// What the scripted upstream serves, and what it was asked.
#[derive(Default)]
pub struct Served {
    pub revision: Revision,
    pub objects: BTreeMap<String, Revision>,
    /// Every event, as its watch line, with its revision.
    pub history: Vec<(Revision, Bytes)>,
    /// Watches from before this revision are answered 410.
    pub oldest: Revision,
    pub watchers: Vec<mpsc::UnboundedSender<Bytes>>,
    /// Requests seen, as `list`, `watch@R`, `streaming`.
    pub requests: Vec<String>,
    /// Changes are not sent to the open watches.
    pub deaf: bool,
}

/// The server, and an `Upstream` that reaches it.
pub struct Scripted {
    pub served: Arc<Mutex<Served>>,
    pub upstream: Upstream,
    _dir: tempfile::TempDir,
}

/// A Pod of namespace `ns` at `rev`, as the upstream sends it.
pub fn pod(name: &str, rev: Revision) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rev}"}}}}"#
    )
}

fn line(ty: &str, object: &str) -> Bytes {
    Bytes::from(format!("{{\"type\":\"{ty}\",\"object\":{object}}}\n"))
}

type Body = BoxBody<Bytes, Infallible>;

fn whole(status: u16, body: String) -> http::Response<Body> {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap()
}

fn answer(served: &Mutex<Served>, uri: &http::Uri) -> http::Response<Body> {
    let query: BTreeMap<String, String> =
        form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let mut s = served.lock();
    if query.get("sendInitialEvents").map(String::as_str) == Some("true") {
        // No streaming lists here: the source lists in pages.
        s.requests.push("streaming".into());
        return whole(400, r#"{"kind":"Status","code":400}"#.into());
    }
    if query.get("watch").map(String::as_str) == Some("1") {
        let from: Revision = query["resourceVersion"].parse().unwrap();
        s.requests.push(format!("watch@{from}"));
        if from < s.oldest {
            return whole(
                410,
                r#"{"kind":"Status","code":410,"reason":"Expired"}"#.into(),
            );
        }
        let (tx, rx) = mpsc::unbounded_channel();
        for (_, l) in s.history.iter().filter(|(rev, _)| *rev > from) {
            let _ = tx.send(l.clone());
        }
        s.watchers.push(tx);
        let frames = futures::stream::unfold(rx, |mut rx| async move {
            let l = rx.recv().await?;
            Some((Ok::<_, Infallible>(Frame::data(l)), rx))
        });
        return http::Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(StreamBody::new(frames).boxed())
            .unwrap();
    }
    s.requests.push("list".into());
    let items: Vec<String> = s.objects.iter().map(|(n, rev)| pod(n, *rev)).collect();
    whole(
        200,
        format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"{}"}},"items":[{}]}}"#,
            s.revision,
            items.join(",")
        ),
    )
}

/// An `Upstream` of `http://127.0.0.1:{port}` with a token, and the directory of its
/// kubeconfig (removed when dropped).
pub fn plain_upstream(port: u16) -> (Upstream, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
             current-context: x\n"
        ),
    )
    .unwrap();
    let upstream =
        Upstream::from_kubeconfig_file(&path, &crate::outbound::egress::Egress::direct(), 1)
            .unwrap();
    (upstream, dir)
}

/// An upstream over plain HTTP/1.1 on a free port whose every request `handle` answers, and
/// an `Upstream` that reaches it.
pub async fn serve<F, Fut, B>(handle: F) -> (Upstream, tempfile::TempDir)
where
    F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = http::Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let handle = handle.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let answer = handle(req);
                    async move { Ok::<_, Infallible>(answer.await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    plain_upstream(port)
}

impl Scripted {
    pub async fn new() -> Self {
        let served = Arc::new(Mutex::new(Served::default()));
        let state = served.clone();
        let (upstream, dir) = serve(move |req| std::future::ready(answer(&state, req.uri()))).await;
        Scripted {
            served,
            upstream,
            _dir: dir,
        }
    }

    /// Creates, changes (`ADDED`, `MODIFIED`) or deletes (`DELETED`) the Pod `name`; its
    /// revision.
    pub fn change(&self, name: &str, ty: &str) -> Revision {
        let mut s = self.served.lock();
        s.revision += 1;
        let rev = s.revision;
        if ty == "DELETED" {
            s.objects.remove(name);
        } else {
            s.objects.insert(name.to_string(), rev);
        }
        let l = line(ty, &pod(name, rev));
        s.history.push((rev, l.clone()));
        if !s.deaf {
            s.watchers.retain(|w| w.send(l.clone()).is_ok());
        }
        rev
    }

    /// The upstream's history before now is gone, and its open watches end: the next
    /// watch from an older revision is a 410.
    pub fn compact(&self) {
        let mut s = self.served.lock();
        s.oldest = s.revision;
        s.watchers.clear();
    }

    /// The requests seen so far, as `list`, `watch@R`, `streaming`.
    pub fn requests(&self) -> Vec<String> {
        self.served.lock().requests.clone()
    }
}
