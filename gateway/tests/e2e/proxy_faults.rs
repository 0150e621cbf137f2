//! The watch guarantees through proxy mode while the upstream and the proxy fail: writers
//! and watchers of `watch_guarantees.rs` go through a proxy in front of a scripted upstream
//! that keeps ServiceAccounts as kube-apiserver does (writes with revisions, watches from a
//! revision replayed from its history, label selectors), and the recorded history is
//! validated for ordered, unique, atomic, bookmarkable, reliable and resumable delivery. The
//! faults, one after another: the upstream's watch of the proxy goes silent (hung); the
//! upstream restarts (every watch dropped, every request refused for a second); the upstream
//! refuses the proxy's next watch with 410 (its history compacted), so the proxy relists; the
//! proxy restarts on the same port. Through all of them no client watch ends with 410 and
//! no client relists.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::proxy::{Out, Proxy, full, serve_scripted};
use crate::support::watch_validator::{End, Start};
use crate::watch_guarantees::{BASE, NS, run_with_fault};

type Line = Result<Frame<Bytes>, Infallible>;

struct Watch {
    selector: Option<(String, String)>,
    /// The proxy's own informer (its watches ask for 5 minutes or more).
    informer: bool,
    tx: futures::channel::mpsc::Sender<Line>,
}

#[derive(Default)]
struct State {
    rv: i64,
    objects: BTreeMap<String, Value>,
    log: Vec<(i64, &'static str, Value)>,
    /// Watches from before this revision are refused with 410.
    compacted: i64,
    watches: Vec<Watch>,
    /// The informer's watches get nothing while set (a hung upstream).
    hung: bool,
    /// The informer's next watch is refused with 410.
    refuse_next: bool,
    /// Every request is refused until then (a restart).
    down_until: Option<Instant>,
    /// Writes wait while set.
    paused: bool,
    /// Lists served.
    lists: usize,
}

struct Upstream {
    addr: SocketAddr,
    state: Mutex<State>,
    resumed: tokio::sync::Notify,
}

fn line(ty: &str, obj: &Value) -> Bytes {
    Bytes::from(format!("{}\n", json!({"type": ty, "object": obj})))
}

fn gone(from: i64, compacted: i64) -> Bytes {
    line(
        "ERROR",
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                "reason": "Expired",
                "message": format!("too old resource version: {from} ({compacted})")}),
    )
}

fn selects(selector: &Option<(String, String)>, obj: &Value) -> bool {
    selector
        .as_ref()
        .is_none_or(|(k, v)| obj["metadata"]["labels"][k] == v.as_str())
}

fn selector_of(query: &BTreeMap<String, String>) -> Option<(String, String)> {
    let s = query.get("labelSelector")?;
    let (k, v) = s.split_once('=')?;
    Some((k.to_string(), v.to_string()))
}

impl Upstream {
    /// Records a change and sends it to the watches it concerns.
    fn commit(s: &mut State, ty: &'static str, obj: Value) {
        let rv = s.rv;
        s.log.push((rv, ty, obj.clone()));
        let l = line(ty, &obj);
        let hung = s.hung;
        s.watches.retain_mut(|w| {
            if !selects(&w.selector, &obj) || (hung && w.informer) {
                return true;
            }
            w.tx.try_send(Ok(Frame::data(l.clone()))).is_ok()
        });
    }

    fn write(&self, method: &Method, name: Option<&str>, body: &[u8]) -> Response<Out> {
        let mut s = self.state.lock();
        let sent: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let name = name
            .map(str::to_string)
            .or_else(|| sent["metadata"]["name"].as_str().map(str::to_string))
            .unwrap_or_default();
        let exists = s.objects.contains_key(&name);
        let not_found = || {
            full(
                StatusCode::NOT_FOUND,
                json!({"kind": "Status", "code": 404}),
            )
        };
        match *method {
            Method::POST if exists => {
                full(StatusCode::CONFLICT, json!({"kind": "Status", "code": 409}))
            }
            Method::POST | Method::PUT => {
                if *method == Method::PUT && !exists {
                    return not_found();
                }
                s.rv += 1;
                let mut obj = sent;
                obj["apiVersion"] = json!("v1");
                obj["kind"] = json!("ServiceAccount");
                obj["metadata"]["namespace"] = json!(NS);
                obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
                s.objects.insert(name, obj.clone());
                let (ty, code) = if exists {
                    ("MODIFIED", StatusCode::OK)
                } else {
                    ("ADDED", StatusCode::CREATED)
                };
                Self::commit(&mut s, ty, obj.clone());
                full(code, obj)
            }
            Method::DELETE => {
                let Some(before) = s.objects.remove(&name) else {
                    return not_found();
                };
                s.rv += 1;
                let mut obj = before.clone();
                obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
                Self::commit(&mut s, "DELETED", obj);
                full(StatusCode::OK, before)
            }
            _ => full(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"kind": "Status", "code": 405}),
            ),
        }
    }

    fn watch(self: &Arc<Self>, query: &BTreeMap<String, String>) -> Response<Out> {
        let (mut tx, rx) = futures::channel::mpsc::channel::<Line>(4096);
        let mut s = self.state.lock();
        let from: i64 = query
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(s.rv);
        let informer = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .is_some_and(|t| t >= 300);
        if informer && std::mem::take(&mut s.refuse_next) {
            let _ = tx.try_send(Ok(Frame::data(gone(from, s.rv))));
        } else if from < s.compacted {
            let _ = tx.try_send(Ok(Frame::data(gone(from, s.compacted))));
        } else {
            let selector = selector_of(query);
            for (rv, ty, obj) in &s.log {
                if *rv > from && selects(&selector, obj) {
                    let _ = tx.try_send(Ok(Frame::data(line(ty, obj))));
                }
            }
            // The stream ends at its timeout with a bookmark at the newest revision when
            // asked (kube-apiserver sends one before a watch's deadline).
            if let Some(t) = query
                .get("timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                && !informer
            {
                let mut end = tx.clone();
                let bookmarks = query
                    .get("allowWatchBookmarks")
                    .is_some_and(|b| b == "true");
                let up = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(t)).await;
                    if bookmarks {
                        // Under the lock: no event of a later revision goes before it.
                        let s = up.state.lock();
                        let mark = json!({"kind": "ServiceAccount", "apiVersion": "v1",
                                          "metadata": {"resourceVersion": s.rv.to_string()}});
                        let _ = end.try_send(Ok(Frame::data(line("BOOKMARK", &mark))));
                    }
                    end.close_channel();
                });
            }
            s.watches.push(Watch {
                selector,
                informer,
                tx,
            });
        }
        Response::new(StreamBody::new(rx).boxed_unsync())
    }

    fn list(&self, query: &BTreeMap<String, String>) -> Response<Out> {
        let mut s = self.state.lock();
        s.lists += 1;
        let selector = selector_of(query);
        let items: Vec<Value> = s
            .objects
            .values()
            .filter(|o| selects(&selector, o))
            .cloned()
            .collect();
        full(
            StatusCode::OK,
            json!({"kind": "ServiceAccountList", "apiVersion": "v1",
                   "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
        )
    }
}

async fn answer(up: Arc<Upstream>, req: Request<Incoming>) -> Response<Out> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    if up
        .state
        .lock()
        .down_until
        .is_some_and(|t| Instant::now() < t)
    {
        return full(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"kind": "Status", "code": 503}),
        );
    }
    let query: BTreeMap<String, String> = parts
        .uri
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let path = parts.uri.path();
    let watching = query.get("watch").is_some_and(|w| w == "1" || w == "true");
    match (&parts.method, path) {
        (_, "/readyz") => full(StatusCode::OK, json!("ok")),
        (&Method::GET, "/api") => full(
            StatusCode::OK,
            json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
                   "items": [{"metadata": {}, "versions": [{"version": "v1", "resources": [
                       {"resource": "serviceaccounts", "responseKind": {"group": "", "version": "v1", "kind": "ServiceAccount"},
                        "scope": "Namespaced", "singularResource": "serviceaccount",
                        "verbs": ["create", "delete", "get", "list", "update", "watch"]}]}]}]}),
        ),
        (&Method::GET, "/apis") => full(
            StatusCode::OK,
            json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "items": []}),
        ),
        (&Method::POST, "/apis/authorization.k8s.io/v1/subjectaccessreviews") => full(
            StatusCode::CREATED,
            json!({"kind": "SubjectAccessReview", "status": {"allowed": true}}),
        ),
        // Streaming lists are not offered: the proxy passes the reads that need them.
        (&Method::GET, _) if query.contains_key("sendInitialEvents") => full(
            StatusCode::BAD_REQUEST,
            json!({"kind": "Status", "code": 400}),
        ),
        (&Method::GET, "/api/v1/serviceaccounts") | (&Method::GET, BASE) if watching => {
            up.watch(&query)
        }
        (&Method::GET, "/api/v1/serviceaccounts") | (&Method::GET, BASE) => up.list(&query),
        (m, p) if p.starts_with(BASE) => {
            loop {
                let resumed = up.resumed.notified();
                if !up.state.lock().paused {
                    break;
                }
                resumed.await;
            }
            // As long as a store's commit takes, so the writers do not outrun the slowest
            // watcher by more than the run can drain.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let name = p.trim_start_matches(BASE).trim_start_matches('/');
            up.write(m, (!name.is_empty()).then_some(name), &body)
        }
        _ => full(
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "code": 404}),
        ),
    }
}

async fn start_upstream() -> Arc<Upstream> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = Arc::new(Upstream {
        addr: listener.local_addr().unwrap(),
        // Revision 1 is the upstream's start (a list names its revision, never 0).
        state: Mutex::new(State {
            rv: 1,
            ..State::default()
        }),
        resumed: tokio::sync::Notify::new(),
    });
    serve_scripted(listener, up.clone(), answer);
    up
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_guarantees_hold_through_upstream_faults_and_a_proxy_restart() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let up = start_upstream().await;
        let proxy = Proxy::start(up.addr, |o| {
            o.upstream_watch_idle_timeout = Duration::from_secs(1);
        })
        .await
        .unwrap();
        let client = proxy.user("alice", &[], false);
        let ready = || async {
            loop {
                if client.get("/readyz").await.0 == StatusCode::OK {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), ready())
            .await
            .is_err()
        {
            let r = client
                .request(Method::GET, "/readyz?verbose", "", &[])
                .await;
            panic!("the proxy never got ready: {}", r.text());
        }
        let mut opts = proxy.opts.clone();
        opts.secure_port = proxy.handle.addr.port();
        let handle = Arc::new(tokio::sync::Mutex::new(Some(proxy.handle)));
        let (up2, handle2, ready_client) = (up.clone(), handle.clone(), client.clone());
        let history = run_with_fault(client.clone(), move || async move {
            // Hung: the proxy's watch goes silent while writes go on; it reopens it after
            // the idle timeout and catches up from the upstream's history.
            let t0 = Instant::now();
            eprintln!("fault: hung");
            up2.state.lock().hung = true;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            {
                let mut s = up2.state.lock();
                s.hung = false;
                s.watches.retain(|w| !w.informer);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            eprintln!("fault: upstream restart at {:?}", t0.elapsed());
            // A restart: every watch dropped, every request refused for a second.
            {
                let mut s = up2.state.lock();
                s.watches.clear();
                s.down_until = Some(Instant::now() + Duration::from_secs(1));
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
            eprintln!("fault: compacted at {:?}", t0.elapsed());
            // Compacted: the proxy's watch ends and its next is refused with 410, so the
            // proxy lists again. Writes wait meanwhile: history lost while writes go on is
            // history no one can deliver (the relist's differences reach watchers as one
            // event per object, `proxy_cache.rs` checks that), and this checks that the
            // relist itself costs the watchers nothing.
            up2.state.lock().paused = true;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let lists = {
                let mut s = up2.state.lock();
                s.refuse_next = true;
                s.watches.retain(|w| !w.informer);
                s.lists
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while up2.state.lock().lists == lists {
                assert!(Instant::now() < deadline, "the proxy never listed again");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            up2.state.lock().paused = false;
            up2.resumed.notify_waiters();
            tokio::time::sleep(Duration::from_millis(500)).await;
            // The proxy restarts on the same port, with the same data directory.
            eprintln!("fault: proxy restart at {:?}", t0.elapsed());
            let old = handle2.lock().await.take().unwrap();
            old.shutdown().await;
            eprintln!("fault: proxy stopped at {:?}", t0.elapsed());
            let new = svc_gateway::run::start(opts).await.unwrap();
            eprintln!("fault: proxy started at {:?}", t0.elapsed());
            *handle2.lock().await = Some(new);
            let deadline = Instant::now() + Duration::from_secs(20);
            while ready_client.get("/readyz").await.0 != StatusCode::OK {
                assert!(
                    Instant::now() < deadline,
                    "the restarted proxy never got ready"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            eprintln!("fault: proxy ready at {:?}", t0.elapsed());
        })
        .await;
        // No client watch ended with 410, and none relisted after its first list.
        for w in &history.watchers {
            for (i, s) in w.streams.iter().enumerate() {
                assert_ne!(s.end, End::Gone, "{}: stream {i} ended with 410", w.name);
                if i > 0 {
                    assert!(
                        !matches!(s.start, Start::Relist { .. }),
                        "{}: stream {i} relisted",
                        w.name
                    );
                }
            }
            assert!(
                w.streams.len() > 1,
                "{}: its watch was never resumed",
                w.name
            );
        }
        if let Some(h) = handle.lock().await.take() {
            h.shutdown().await;
        }
    })
    .await
    .expect("the test ran over its time limit");
}
