//! Proxy mode's caches through real sockets, in front of a scripted upstream that keeps
//! ConfigMaps the way kube-apiserver does (aggregated discovery, paginated lists, watches from
//! a resourceVersion with a history it can lose): lists and watches served from the cache
//! without reaching the upstream, a relist after the upstream's history is gone whose
//! differences reach a connected watcher as ordinary events, authorization by the upstream's
//! SubjectAccessReview with the selectors, what passes through, and a proxy started again
//! resuming its clients from where they were.
//! `interop/proxy/` runs the same against a real kube-apiserver.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::proxy::{Out, Proxy, full, serve_scripted};
use crate::support::client::{
    Client, Resp, assert_goaway_and_listener_closed, eventually, summary,
};

type Line = Result<Frame<Bytes>, Infallible>;

/// The ConfigMaps of namespace `ns`, kept as kube-apiserver keeps them.
#[derive(Default)]
struct State {
    rv: i64,
    objects: BTreeMap<String, Value>,
    /// Every change, for watches from a resourceVersion: (rv, type, object).
    log: Vec<(i64, &'static str, Value)>,
    /// Watches from before this revision are refused with 410 (compacted); from it on, they
    /// are served.
    compacted: i64,
    watchers: Vec<futures::channel::mpsc::Sender<Line>>,
    /// The last SubjectAccessReview's resource attributes.
    last_review: Value,
    /// The `timeoutSeconds` of every watch asked for.
    watch_timeouts: Vec<u64>,
    /// The revision of every Exact list asked for.
    exact_lists: Vec<i64>,
    /// Watches (only) from before this revision are refused with 410 too: the watch cache's
    /// history is shorter than etcd's.
    watch_compacted: i64,
    /// The name of every one-object streaming list asked for.
    object_proofs: Vec<String>,
    /// SubjectAccessReviews asked, and whether eve is granted (she is not, at first).
    reviews: usize,
    eve_granted: bool,
    /// Starting again: `/readyz` fails and every review is denied, as a kube-apiserver's
    /// before its RBAC caches are filled.
    not_ready: bool,
    /// Short watches (`timeoutSeconds` of 5 or less, a proof's second step) answered with
    /// nothing until they end, as a busy kube-apiserver may bookmark too late: the first this
    /// many. Past them (when set), a short watch is bookmarked at once.
    silent_short_watches: usize,
    short_watches: usize,
    /// The first step of a proof of a whole collection (a streaming list of a name no
    /// object has): the next ones answered only after these delays, in order, and then
    /// this many more answered with kube-apiserver's error for a cache not fresh in time.
    probe_delays: std::collections::VecDeque<Duration>,
    busy_probes: usize,
    /// Streaming lists of everything asked for (refused with 400): reads passed through.
    streaming_lists: usize,
}

struct Upstream {
    addr: SocketAddr,
    state: Mutex<State>,
    lists: AtomicUsize,
    watches: AtomicUsize,
}

fn object(name: &str, data: &str, rv: i64) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv.to_string(),
                        "labels": {"app": "web"}},
           "data": {"k": data}})
}

fn line(ty: &str, obj: &Value) -> Bytes {
    Bytes::from(format!("{}\n", json!({"type": ty, "object": obj})))
}

impl Upstream {
    /// Writes (or, with `data` None, deletes) a ConfigMap; `quiet` keeps it out of the log and
    /// from watchers, as if it happened while the proxy was not watching.
    fn change(&self, name: &str, data: Option<&str>, quiet: bool) {
        let mut s = self.state.lock();
        s.rv += 1;
        let rv = s.rv;
        let (ty, obj) = match data {
            Some(d) => {
                let ty = if s.objects.contains_key(name) {
                    "MODIFIED"
                } else {
                    "ADDED"
                };
                let obj = object(name, d, rv);
                s.objects.insert(name.into(), obj.clone());
                (ty, obj)
            }
            None => {
                let mut obj = s.objects.remove(name).expect("deleting a missing object");
                obj["metadata"]["resourceVersion"] = json!(rv.to_string());
                ("DELETED", obj)
            }
        };
        if quiet {
            return;
        }
        s.log.push((rv, ty, obj.clone()));
        let l = line(ty, &obj);
        s.watchers
            .retain_mut(|w| w.try_send(Ok(Frame::data(l.clone()))).is_ok());
    }

    /// Whether a watch is open to be sent changes and bookmarks: counted in `watches` when
    /// asked for, it is sent them only once answered.
    fn watched(&self) -> bool {
        self.state.lock().watchers.iter().any(|w| !w.is_closed())
    }

    /// Waits until a watch is open (see `watched`): a bookmark sent before would reach none.
    async fn until_watched(&self) {
        eventually(
            Duration::from_secs(10),
            "the upstream watch open",
            || async { self.watched() },
        )
        .await;
    }

    /// A bookmark at the current revision to every open watch, as kube-apiserver sends them
    /// for the resources it watch-caches.
    fn bookmark(&self) {
        let mut s = self.state.lock();
        let obj = json!({"kind": "ConfigMap", "apiVersion": "v1",
                         "metadata": {"resourceVersion": s.rv.to_string()}});
        let l = line("BOOKMARK", &obj);
        s.watchers
            .retain_mut(|w| w.try_send(Ok(Frame::data(l.clone()))).is_ok());
    }

    /// The history is compacted past every revision so far, and open watches end: the next
    /// watch from an old revision is refused with 410.
    fn compact_and_drop_watches(&self) {
        let mut s = self.state.lock();
        s.compacted = s.rv;
        s.log.clear();
        s.watchers.clear();
    }
}

async fn answer(up: Arc<Upstream>, req: Request<Incoming>) -> Response<Out> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let query: BTreeMap<String, String> = parts
        .uri
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    match (parts.method.clone(), parts.uri.path()) {
        (_, "/readyz") if up.state.lock().not_ready => full(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!("[-]poststarthook/rbac/bootstrap-roles failed"),
        ),
        (_, "/readyz") => full(StatusCode::OK, json!("ok")),
        (Method::GET, "/api") => full(
            StatusCode::OK,
            json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
                   "items": [{"metadata": {}, "versions": [{"version": "v1", "resources": [
                       {"resource": "configmaps", "responseKind": {"group": "", "version": "v1", "kind": "ConfigMap"},
                        "scope": "Namespaced", "singularResource": "configmap",
                        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]}]}]}),
        ),
        (Method::GET, "/apis") => full(
            StatusCode::OK,
            json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "items": []}),
        ),
        // A streaming list of one object, from the newest state: the object, then the end
        // of the initial events (the proxy's proof for a read of one object).
        (Method::GET, "/api/v1/configmaps" | "/api/v1/namespaces/ns/configmaps")
            if query.contains_key("sendInitialEvents")
                && query
                    .get("fieldSelector")
                    .is_some_and(|f| f.starts_with("metadata.name=")) =>
        {
            let mut s = up.state.lock();
            let name = &query["fieldSelector"]["metadata.name=".len()..];
            s.object_proofs.push(name.to_string());
            let probe = name == "SVC-PROXY-FRESHNESS-PROBE";
            if probe && s.probe_delays.is_empty() && s.busy_probes > 0 {
                s.busy_probes -= 1;
                let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "code": 504, "reason": "Timeout",
                                    "message": "Too large resource version"});
                return Response::new(
                    http_body_util::Full::new(line("ERROR", &status))
                        .map_err(|never| match never {})
                        .boxed_unsync(),
                );
            }
            let delay = if probe {
                s.probe_delays.pop_front()
            } else {
                None
            };
            let mut body = Vec::new();
            if let Some(obj) = s.objects.get(name) {
                body.extend_from_slice(&line("ADDED", obj));
            }
            let end = json!({"kind": "ConfigMap", "apiVersion": "v1",
                             "metadata": {"resourceVersion": s.rv.to_string(),
                                          "annotations": {"k8s.io/initial-events-end": "true"}}});
            body.extend_from_slice(&line("BOOKMARK", &end));
            if let Some(delay) = delay {
                // Read now, answered late: a busy upstream whose cache catches up slowly.
                let (mut tx, rx) = futures::channel::mpsc::channel::<Line>(1);
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = tx.try_send(Ok(Frame::data(Bytes::from(body))));
                });
                return Response::new(StreamBody::new(rx).boxed_unsync());
            }
            Response::new(
                http_body_util::Full::new(Bytes::from(body))
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
        }
        // Streaming lists of everything are not offered: the proxy lists in pages.
        (Method::GET, _) if query.contains_key("sendInitialEvents") => {
            up.state.lock().streaming_lists += 1;
            full(
                StatusCode::BAD_REQUEST,
                json!({"kind": "Status", "code": 400}),
            )
        }
        (Method::GET, "/api/v1/configmaps" | "/api/v1/namespaces/ns/configmaps")
            if query.get("watch").is_some_and(|w| w == "1" || w == "true") =>
        {
            up.watches.fetch_add(1, Ordering::SeqCst);
            let from: i64 = query
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let (mut tx, rx) = futures::channel::mpsc::channel::<Line>(64);
            let mut s = up.state.lock();
            if let Some(t) = query.get("timeoutSeconds").and_then(|t| t.parse().ok()) {
                s.watch_timeouts.push(t);
            }
            if from < s.compacted.max(s.watch_compacted) {
                let gone = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "code": 410, "reason": "Expired",
                                  "message": format!("too old resource version: {from} ({})", s.compacted)});
                let _ = tx.try_send(Ok(Frame::data(line("ERROR", &gone))));
                drop(tx);
            } else {
                let short = query
                    .get("timeoutSeconds")
                    .and_then(|t| t.parse::<u64>().ok())
                    .filter(|t| *t <= 5 && s.silent_short_watches > 0);
                if let Some(t) = short {
                    s.short_watches += 1;
                    if s.short_watches <= s.silent_short_watches {
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(t)).await;
                            drop(tx);
                        });
                        return Response::new(StreamBody::new(rx).boxed_unsync());
                    }
                }
                for (rv, ty, obj) in &s.log {
                    if *rv > from {
                        let _ = tx.try_send(Ok(Frame::data(line(ty, obj))));
                    }
                }
                if short.is_some() {
                    let obj = json!({"kind": "ConfigMap", "apiVersion": "v1",
                                     "metadata": {"resourceVersion": s.rv.to_string()}});
                    let _ = tx.try_send(Ok(Frame::data(line("BOOKMARK", &obj))));
                }
                s.watchers.push(tx);
            }
            Response::new(StreamBody::new(rx).boxed_unsync())
        }
        (Method::GET, "/api/v1/configmaps" | "/api/v1/namespaces/ns/configmaps")
            if query
                .get("resourceVersionMatch")
                .is_some_and(|m| m == "Exact") =>
        {
            // The state at a past revision, from the history (which holds every change).
            up.lists.fetch_add(1, Ordering::SeqCst);
            let mut s = up.state.lock();
            let at: i64 = query["resourceVersion"].parse().unwrap();
            s.exact_lists.push(at);
            if at < s.compacted || at > s.rv {
                return full(
                    StatusCode::GONE,
                    json!({"kind": "Status", "code": 410, "reason": "Expired"}),
                );
            }
            let mut objects = BTreeMap::new();
            for (_, ty, obj) in s.log.iter().filter(|(rv, _, _)| *rv <= at) {
                let name = obj["metadata"]["name"].as_str().unwrap().to_string();
                if *ty == "DELETED" {
                    objects.remove(&name);
                } else {
                    objects.insert(name, obj.clone());
                }
            }
            full(
                StatusCode::OK,
                json!({"kind": "ConfigMapList", "apiVersion": "v1",
                       "metadata": {"resourceVersion": at.to_string()},
                       "items": objects.into_values().collect::<Vec<_>>()}),
            )
        }
        (Method::GET, "/api/v1/configmaps" | "/api/v1/namespaces/ns/configmaps") => {
            up.lists.fetch_add(1, Ordering::SeqCst);
            let s = up.state.lock();
            // Built-in kinds' list items come without apiVersion and kind.
            let items: Vec<Value> = s
                .objects
                .values()
                .map(|o| {
                    let mut o = o.clone();
                    let m = o.as_object_mut().unwrap();
                    m.remove("apiVersion");
                    m.remove("kind");
                    o
                })
                .collect();
            full(
                StatusCode::OK,
                json!({"kind": "ConfigMapList", "apiVersion": "v1",
                       "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
            )
        }
        (Method::POST, "/apis/authorization.k8s.io/v1/subjectaccessreviews") => {
            let review: Value = serde_json::from_slice(&body).unwrap();
            let spec = &review["spec"];
            let mut s = up.state.lock();
            s.last_review = spec["resourceAttributes"].clone();
            s.reviews += 1;
            let allowed = !s.not_ready && (spec["user"] != "eve" || s.eve_granted);
            full(
                StatusCode::CREATED,
                json!({"kind": "SubjectAccessReview", "status": {"allowed": allowed}}),
            )
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
        state: Mutex::new(State::default()),
        lists: AtomicUsize::new(0),
        watches: AtomicUsize::new(0),
    });
    serve_scripted(listener, up.clone(), answer);
    up
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            format!(
                "{}={}",
                o["metadata"]["name"].as_str().unwrap(),
                o["data"]["k"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_watches_come_from_the_cache_and_survive_a_relist() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    up.change("b", Some("1"), false);
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &["dev"], false);
    until_filled(&alice).await;
    assert_eq!(
        up.lists.load(Ordering::SeqCst),
        1,
        "one list fills the cache"
    );

    // rv=0: the cache answers, the upstream sees no list; items carry no type, as
    // kube-apiserver lists its built-in kinds.
    let (status, list) = alice
        .get("/api/v1/namespaces/ns/configmaps?resourceVersion=0")
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(names(&list), ["a=1", "b=1"]);
    assert_eq!(list["kind"], "ConfigMapList");
    assert_eq!(list["metadata"]["resourceVersion"], "2");
    assert!(list["items"][0].get("kind").is_none(), "{list}");
    assert!(list["items"][0].get("apiVersion").is_none(), "{list}");
    assert_eq!(up.lists.load(Ordering::SeqCst), 1);
    let review = up.state.lock().last_review.clone();
    assert_eq!(
        review,
        json!({"namespace": "ns", "verb": "list", "version": "v1", "resource": "configmaps"})
    );

    // Selectors are evaluated by the cache and shown to the upstream's authorizer.
    let (status, list) = alice
        .get("/api/v1/namespaces/ns/configmaps?resourceVersion=0&labelSelector=app%3Dweb&fieldSelector=metadata.name%3Db")
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(names(&list), ["b=1"]);
    let review = up.state.lock().last_review.clone();
    assert_eq!(review["labelSelector"]["rawSelector"], "app=web");
    assert_eq!(review["fieldSelector"]["rawSelector"], "metadata.name=b");

    // A consistent list (rv unset) goes upstream.
    let (status, _) = alice.get("/api/v1/namespaces/ns/configmaps").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(up.lists.load(Ordering::SeqCst), 2);

    // A watch from the list's version is served from the cache.
    let watches_before = up.watches.load(Ordering::SeqCst);
    let mut watch = alice
        .watch("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=2")
        .await;
    up.change("c", Some("1"), false);
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(summary(&ev), ("ADDED".into(), "c".into(), "3".into()));
    assert_eq!(up.watches.load(Ordering::SeqCst), watches_before);

    // The upstream loses its history while changes happen unseen; the proxy's watch is
    // refused with 410, it lists again, and the watcher is told the differences.
    let lists_before = up.lists.load(Ordering::SeqCst);
    up.change("a", Some("2"), true);
    up.change("b", None, true);
    up.change("d", Some("1"), true);
    up.compact_and_drop_watches();
    let mut got = Vec::new();
    for _ in 0..3 {
        let ev = watch.next_within(Duration::from_secs(20)).await.unwrap();
        let (ty, name, _) = summary(&ev);
        got.push(format!("{ty} {name}"));
    }
    assert_eq!(got, ["MODIFIED a", "ADDED d", "DELETED b"]);
    assert_eq!(up.lists.load(Ordering::SeqCst), lists_before + 1);

    // The watch goes on with live events after the relist.
    up.change("e", Some("1"), false);
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(summary(&ev).1, "e");
    let (_, list) = alice
        .get("/api/v1/namespaces/ns/configmaps?resourceVersion=0")
        .await;
    assert_eq!(names(&list), ["a=2", "c=1", "d=1", "e=1"]);

    // A watch from before the cache's start goes upstream (which refuses it here: compacted).
    let mut old = alice
        .watch("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=1")
        .await;
    let ev = old.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_list_only_the_caches_the_proxy_runs() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &[], false);
    until_filled(&alice).await;
    let r = alice.request(Method::GET, "/metrics", "", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let text = r.text();
    assert!(
        text.lines()
            .any(|l| l.starts_with("svc_proxy_cache_objects{")
                && l.contains("resource=\"configmaps\"")),
        "{text}"
    );
    // The standalone server's caches (namespaces, secrets, ...) never run in a proxy: no
    // series of theirs, empty or not.
    let uncached: Vec<&str> = text
        .lines()
        .filter(|l| {
            [
                "apiserver_watch_cache_",
                "apiserver_storage_objects",
                "apiserver_resource_objects",
            ]
            .iter()
            .any(|p| l.starts_with(p))
                && l.contains("resource=")
                && !l.contains("resource=\"configmaps\"")
        })
        .collect();
    assert!(uncached.is_empty(), "{uncached:#?}");
    // Nor any family of what only a standalone server has: a store, authorizers, admission
    // webhooks, validation, audit, token authenticators and their reloads.
    let standalone: Vec<&str> = text
        .lines()
        .filter(|l| {
            [
                "etcd_request",
                "apiserver_authorization_",
                "apiserver_admission_",
                "declarative_validation_",
                "apiserver_audit_",
                "apiserver_authentication_",
            ]
            .iter()
            .any(|p| {
                l.trim_start_matches("# HELP ")
                    .trim_start_matches("# TYPE ")
                    .starts_with(p)
            })
        })
        .collect();
    assert!(standalone.is_empty(), "{standalone:#?}");
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_decides_who_reads_the_cache() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let eve = proxy.user("eve", &[], true);
    until_filled(&proxy.user("alice", &[], false)).await;
    let (status, body) = eve
        .get("/api/v1/namespaces/ns/configmaps?resourceVersion=0")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        body["message"],
        "configmaps is forbidden: User \"eve\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"ns\""
    );
    assert_eq!(body["reason"], "Forbidden");
    let r = eve
        .request(
            Method::GET,
            "/api/v1/configmaps?watch=1&resourceVersion=0",
            "",
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    assert!(r.text().contains("cannot watch resource"), "{}", r.text());
    assert_eq!(
        up.lists.load(Ordering::SeqCst),
        1,
        "nothing reached the upstream's lists"
    );
    // A refusal is not kept: granted upstream (as the Node authorizer grants a kubelet its
    // pod's ConfigMap once it learns of the binding), eve reads at once.
    let reviews = up.state.lock().reviews;
    up.state.lock().eve_granted = true;
    let (status, body) = eve
        .get("/api/v1/namespaces/ns/configmaps?resourceVersion=0")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(up.state.lock().reviews, reviews + 1);
    // A grant is kept.
    let (status, _) = eve
        .get("/api/v1/namespaces/ns/configmaps?resourceVersion=0")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(up.state.lock().reviews, reviews + 1, "the grant was kept");
}

/// An upstream starting again denies every review before its RBAC caches are filled: the
/// proxy takes no denial of an upstream that is not ready (429, so that a client-go
/// informer retries its watch rather than listing everything again, as it does after a 403),
/// and passes on a ready upstream's denial as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_of_an_upstream_not_ready_is_a_429_to_retry() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &[], false);
    until_filled(&alice).await;
    up.state.lock().not_ready = true;
    let r = alice
        .request(
            Method::GET,
            "/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=0",
            "",
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert!(r.text().contains("not ready"), "{}", r.text());
    up.state.lock().not_ready = false;
    // Ready again: alice is granted, and eve's denial is passed on once the upstream is read
    // ready again (within a second); all within 5 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let path = "/api/v1/namespaces/ns/configmaps?resourceVersion=0";
    until_answered(&alice, path, StatusCode::OK, deadline).await;
    let eve = proxy.user("eve", &[], true);
    until_answered(&eve, path, StatusCode::FORBIDDEN, deadline).await;
}

/// Reads `path` as `client` until it answers `want`, by `deadline`; every answer before it a
/// 429 to retry.
async fn until_answered(
    client: &Client,
    path: &str,
    want: StatusCode,
    deadline: tokio::time::Instant,
) {
    let limit = deadline.saturating_duration_since(tokio::time::Instant::now());
    eventually(limit, &format!("{path} answered {want}"), || async {
        let (status, body) = client.get(path).await;
        assert!(
            status == want || status == StatusCode::TOO_MANY_REQUESTS,
            "{status}: {body}"
        );
        status == want
    })
    .await;
}

/// Proxy mode's watches (from the cache, and passed upstream) are response bodies that end on
/// the server's watch stop: they too end only after their connection said GOAWAY and the
/// listener closed, so a client reconnecting at once is refused and retries its watch rather
/// than meeting a broken pipe (`interop/proxy`'s restart test does this with client-go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_end_at_shutdown_after_goaway_and_the_listener_closing() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    up.change("b", Some("1"), false);
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &["dev"], true);
    until_filled(&alice).await;
    let addr = proxy.handle.addr;
    let watches_before = up.watches.load(Ordering::SeqCst);
    let mut conns = Vec::new();
    // From the cache's version, and from before the cache (passed upstream).
    for rv in ["2", "1"] {
        let tls = alice.tls_stream().await.unwrap();
        let (send, conn) = h2::client::handshake(tls).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = Request::get(format!(
            "https://localhost/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion={rv}"
        ))
        .body(())
        .unwrap();
        let (resp, _) = send
            .clone()
            .ready()
            .await
            .unwrap()
            .send_request(req, true)
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), resp)
            .await
            .expect("the watch's head")
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "the watch from {rv}");
        conns.push((send, resp.into_body()));
    }
    assert_eq!(
        up.watches.load(Ordering::SeqCst),
        watches_before + 1,
        "one of the two watches was passed upstream"
    );
    let shutdown = tokio::spawn(proxy.handle.shutdown());
    for (send, mut body) in conns {
        while let Some(d) = tokio::time::timeout(Duration::from_secs(10), body.data())
            .await
            .expect("the watch ends at shutdown")
        {
            let Ok(d) = d else { break };
            let _ = body.flow_control().release_capacity(d.len());
        }
        assert_goaway_and_listener_closed(send, addr).await;
    }
    tokio::time::timeout(Duration::from_secs(30), shutdown)
        .await
        .expect("shutdown ends with the watches")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_resource_keeps_its_watch_until_it_is_seen_to_bookmark() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    let proxy = Proxy::start(up.addr, |o| {
        o.upstream_watch_idle_timeout = Duration::from_secs(1);
    })
    .await
    .unwrap();
    let alice = proxy.user("alice", &[], false);
    until_filled(&alice).await;
    eventually(
        Duration::from_secs(10),
        "the upstream watch opens",
        || async { up.watches.load(Ordering::SeqCst) == 1 },
    )
    .await;
    // Asked to last hours, not client-go's minutes: a quiet resource resumed after etcd's
    // compaction would be relisted for nothing.
    let timeouts = up.state.lock().watch_timeouts.clone();
    assert!(timeouts.iter().all(|t| *t >= 7_200), "{timeouts:?}");
    // No bookmark seen yet: silence three times the idle timeout is no reason to reopen.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(up.watches.load(Ordering::SeqCst), 1);
    assert_eq!(up.lists.load(Ordering::SeqCst), 1);
    // Once the resource bookmarks, silence is a sign of a hung watch: it is opened again
    // from where it was, without a list.
    up.until_watched().await;
    up.bookmark();
    eventually(
        Duration::from_secs(10),
        "the silent watch is reopened",
        || async { up.watches.load(Ordering::SeqCst) >= 2 },
    )
    .await;
    assert_eq!(up.lists.load(Ordering::SeqCst), 1);
    proxy.handle.shutdown().await;
}

/// A cache's history ages out while its resource is quiet, as a store-fed cache's does: the
/// upstream sends nothing (Events are never bookmarked) that would make it. A watch from
/// before what remains is older than the cache: with no place upstream, it is told 410.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_caches_history_ages_out_without_upstream_traffic() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    let proxy = Proxy::start(up.addr, |o| {
        o.watch_cache_history_window = Duration::from_secs(1);
        o.upstream_long_running_per_user = 0;
    })
    .await
    .unwrap();
    let alice = proxy.user("alice", &[], false);
    until_filled(&alice).await;
    up.change("b", Some("1"), false);
    let (_, list) = alice
        .get("/api/v1/namespaces/ns/configmaps?resourceVersion=2")
        .await;
    assert_eq!(names(&list), ["a=1", "b=1"]);
    // Within the window, b's event is history the cache serves.
    let mut watch = alice
        .watch("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=1")
        .await;
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(summary(&ev), ("ADDED".into(), "b".into(), "2".into()));
    // Past it, with nothing from the upstream meanwhile, it is gone.
    eventually(Duration::from_secs(10), "the history pruned", || async {
        alice
            .request(
                Method::GET,
                "/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=1&timeoutSeconds=1",
                "",
                &[],
            )
            .await
            .status
            == StatusCode::GONE
    })
    .await;
    proxy.handle.shutdown().await;
}

/// A proof that the cache is as fresh as the upstream, for a start from the newest state of a
/// whole collection, whose short watch ended without the upstream's bookmark (a busy
/// kube-apiserver sends it late) tries another while the read waits, once the resource is
/// known to bookmark: the read is served from the cache, not passed through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proof_whose_short_watch_brought_no_bookmark_tries_again() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    up.state.lock().silent_short_watches = 1;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &[], false);
    until_filled(&alice).await;
    // The resource is seen to bookmark (the cache moves to 2 by the bookmark alone).
    up.until_watched().await;
    up.change("b", Some("1"), true);
    up.bookmark();
    eventually(Duration::from_secs(10), "the bookmark seen", || async {
        let (_, list) = alice
            .get("/api/v1/namespaces/ns/configmaps?resourceVersion=0")
            .await;
        list["metadata"]["resourceVersion"] == "2"
    })
    .await;
    // A change the cache's watch has not brought yet: only a short watch would.
    up.change("c", Some("1"), true);
    {
        let mut s = up.state.lock();
        let c = s.objects["c"].clone();
        s.log.push((3, "ADDED", c));
    }
    // The upstream offers no streaming list of everything (a 400): served from the cache or
    // failed.
    let got = start_from_the_newest_state(&alice)
        .await
        .unwrap_or_else(|r| panic!("{} {}", r.status, r.text()));
    assert!(
        got.contains(&("ADDED".into(), "c".into(), "3".into())),
        "{got:?}"
    );
    assert_eq!(
        up.state.lock().short_watches,
        2,
        "one silent, then one bookmarked"
    );
    proxy.handle.shutdown().await;
}

/// The start of a watch from the newest state of a whole collection, with a change the
/// cache has not seen, sent once `up` has been asked to prove it: the events it begins with
/// (up to its initial-events-end bookmark), or the status it was refused with.
async fn start_from_the_newest_state(
    client: &Client,
) -> Result<Vec<(String, String, String)>, Resp> {
    let path = "/api/v1/namespaces/ns/configmaps?watch=1&sendInitialEvents=true\
                &resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
    let mut conn = client.connect().await.expect("connect");
    let resp = conn
        .send(Client::build(Method::GET, path, Bytes::new(), &[]))
        .await
        .expect("watch");
    if resp.status() != StatusCode::OK {
        let (parts, body) = resp.into_parts();
        return Err(Resp {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.expect("body").to_bytes(),
        });
    }
    let mut watch = crate::support::client::WatchStream::from_body(resp.into_body());
    let mut got = Vec::new();
    loop {
        let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
        if ev["type"] == "BOOKMARK" {
            return Ok(got);
        }
        got.push(summary(&ev));
    }
}

/// A first step of a proof that the upstream does not answer is abandoned, and its read told
/// to try again (429); the reads after it get steps of their own and are proven, served
/// from the cache. None of them passes through to the upstream that is behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_step_the_upstream_never_answers_leaves_the_next_read_a_proof() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    up.state
        .lock()
        .probe_delays
        .push_back(Duration::from_secs(60));
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &[], true);
    until_filled(&alice).await;
    // The informer's own fill asked for one (and then listed in pages).
    let filled = up.state.lock().streaming_lists;
    let started = std::time::Instant::now();
    let refused = start_from_the_newest_state(&alice)
        .await
        .expect_err("served without a proof");
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        refused.text()
    );
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "refused after {:?}",
        started.elapsed()
    );
    let started = std::time::Instant::now();
    let got = start_from_the_newest_state(&alice)
        .await
        .unwrap_or_else(|r| panic!("{} {}", r.status, r.text()));
    assert_eq!(got, vec![("ADDED".into(), "a".into(), "1".into())]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "proven after {:?}",
        started.elapsed()
    );
    {
        let s = up.state.lock();
        assert_eq!(s.streaming_lists, filled, "a read passed through");
        let probes = s
            .object_proofs
            .iter()
            .filter(|n| *n == "SVC-PROXY-FRESHNESS-PROBE")
            .count();
        assert_eq!(probes, 2, "one first step for each read");
    }
    proxy.handle.shutdown().await;
}

/// A proof the upstream is too busy to give (kube-apiserver's cache not fresh in time answers
/// the first step with an error) answers the read 429 with `Retry-After`, as kube-apiserver
/// does when it is overloaded: the read is not passed through to the upstream that is behind.
/// Once the upstream keeps up, the read tried again is served from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proof_the_upstream_is_too_busy_for_answers_429_and_passes_nothing_through() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    up.state.lock().busy_probes = 1;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &[], false);
    until_filled(&alice).await;
    // The informer's own fill asked for one (and then listed in pages).
    let filled = up.state.lock().streaming_lists;
    let refused = start_from_the_newest_state(&alice)
        .await
        .expect_err("served while the upstream could not prove it");
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        refused.text()
    );
    assert_eq!(refused.headers["retry-after"], "1");
    let status = refused.json();
    assert_eq!(status["reason"], "TooManyRequests", "{status}");
    assert_eq!(status["details"]["retryAfterSeconds"], 1, "{status}");
    assert_eq!(
        up.state.lock().streaming_lists,
        filled,
        "the read passed through"
    );
    let got = start_from_the_newest_state(&alice)
        .await
        .unwrap_or_else(|r| panic!("{} {}", r.status, r.text()));
    assert_eq!(got, vec![("ADDED".into(), "a".into(), "1".into())]);
    assert_eq!(
        up.state.lock().streaming_lists,
        filled,
        "the read passed through"
    );
    let metrics = alice.request(Method::GET, "/metrics", "", &[]).await.text();
    let busy = metrics
        .lines()
        .find(|l| {
            l.starts_with("svc_proxy_freshness_proofs_busy_total{")
                && l.contains("resource=\"configmaps\"")
        })
        .unwrap_or_else(|| panic!("no busy proofs counted:\n{metrics}"));
    assert!(busy.ends_with(" 1"), "{busy}");
    proxy.handle.shutdown().await;
}

/// A proxy in front of `up` holding ConfigMaps a and b (revisions 1 and 2), run until it has
/// kept its resume point (revision 2, bookmarks every second), then shut down: a client of
/// alice's, the options that start it again on its port, and its data directory.
async fn stopped_after_keeping_a_resume_point(
    up: &Upstream,
) -> (Client, svc_gateway::base::flags::Options, tempfile::TempDir) {
    up.change("a", Some("1"), false);
    up.change("b", Some("1"), false);
    let proxy = Proxy::start(up.addr, |o| {
        o.watch_bookmark_interval = Duration::from_secs(1);
    })
    .await
    .unwrap();
    let alice = proxy.user("alice", &[], false);
    let points = proxy.opts.data_dir.join("proxy").join("resume-points");
    eventually(
        Duration::from_secs(20),
        "the resume points written",
        || async {
            std::fs::read_to_string(&points).is_ok_and(|t| t.lines().any(|l| l == "- configmaps 2"))
        },
    )
    .await;
    let (opts, dir) = proxy.stop().await;
    (alice, opts, dir)
}

/// Waits until the proxy `client` talks to has filled its caches (`/readyz` answers 200).
async fn until_filled(client: &Client) {
    eventually(Duration::from_secs(20), "the cache is filled", || async {
        client.get("/readyz").await.0 == StatusCode::OK
    })
    .await;
}

/// A proxy stopped by `Proxy::stop` started again from its options, passing no long-running
/// request upstream (a watch the cache does not serve is refused), once its caches are filled.
async fn started_without_pass_through(
    mut opts: svc_gateway::base::flags::Options,
    client: &Client,
) -> svc_gateway::run::ServerHandle {
    opts.upstream_long_running_per_user = 0;
    let handle = svc_gateway::run::start(opts).await.unwrap();
    until_filled(client).await;
    handle
}

/// A proxy started again with its data directory fills its cache with the upstream's state at
/// the revision it kept there (`proxy/resume-points`), one its clients had passed: their
/// watches resume from its cache, with what happened while it was down, instead of passing
/// through or listing again. A watch from before that point, which cannot pass through (its
/// bound reached), is told its version is too old, so that its client lists again from the
/// cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_started_again_resumes_its_clients_from_its_cache() {
    let up = start_upstream().await;
    let (alice, opts, _dir) = stopped_after_keeping_a_resume_point(&up).await;
    // While it is down.
    up.change("c", Some("1"), false);
    up.change("a", None, false);
    // Started again, passing nothing long-running upstream: what is not served from the
    // cache is refused.
    let handle = started_without_pass_through(opts, &alice).await;
    assert_eq!(up.state.lock().exact_lists, [2], "filled at the point kept");
    let mut watch = alice
        .watch("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=2")
        .await;
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(summary(&ev), ("ADDED".into(), "c".into(), "3".into()));
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(summary(&ev), ("DELETED".into(), "a".into(), "4".into()));
    let (_, list) = alice
        .get("/api/v1/namespaces/ns/configmaps?resourceVersion=0")
        .await;
    assert_eq!(names(&list), ["b=1", "c=1"]);
    // From before the point: no history here, no place upstream.
    let r = alice
        .request(
            Method::GET,
            "/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=1",
            "",
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::GONE, "{}", r.text());
    let status = r.json();
    assert_eq!(status["reason"], "Expired", "{status}");
    assert_eq!(
        status["message"], "too old resource version: 1 (1)",
        "{status}"
    );
    handle.shutdown().await;
}

/// A cache resynced (the upstream's history gone: a restarted kube-apiserver, a compaction)
/// tells its watchers the new revision at once, with a bookmark, and keeps it as its resume
/// point: the points sampled before are behind anything the upstream serves. A proxy killed
/// soon after, long before the next periodic bookmark, still resumes its clients from its
/// cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_is_the_resume_point_and_its_watchers_are_told_it() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    up.change("b", Some("1"), false);
    // Periodic bookmarks only every minute: the one seen below is the resync's.
    let proxy = Proxy::start(up.addr, |o| {
        o.watch_bookmark_interval = Duration::from_secs(60);
    })
    .await
    .unwrap();
    let alice = proxy.user("alice", &[], false);
    until_filled(&alice).await;
    let mut watch = alice
        .watch(
            "/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=2&allowWatchBookmarks=true",
        )
        .await;
    // Unseen changes, then the history is gone: the proxy lists again, at 4.
    up.change("a", Some("2"), true);
    up.change("c", Some("1"), true);
    up.compact_and_drop_watches();
    let mut got = Vec::new();
    for _ in 0..3 {
        let ev = watch.next_within(Duration::from_secs(20)).await.unwrap();
        got.push(summary(&ev));
    }
    assert_eq!(
        got,
        [
            ("MODIFIED".into(), "a".into(), "3".into()),
            ("ADDED".into(), "c".into(), "4".into()),
            ("BOOKMARK".into(), String::new(), "4".into()),
        ]
    );
    let points = proxy.opts.data_dir.join("proxy").join("resume-points");
    eventually(
        Duration::from_secs(20),
        "the resync kept as the resume point",
        || async {
            std::fs::read_to_string(&points).is_ok_and(|t| t.lines().any(|l| l == "- configmaps 4"))
        },
    )
    .await;
    let (opts, _dir) = proxy.stop().await;
    up.change("d", Some("1"), false);
    // Started again, passing nothing long-running upstream: the client's watch from the
    // bookmark it was given is served from the cache, or refused.
    let handle = started_without_pass_through(opts, &alice).await;
    assert_eq!(up.state.lock().exact_lists, [4], "filled at the resync");
    let mut watch = alice
        .watch("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=4")
        .await;
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(summary(&ev), ("ADDED".into(), "d".into(), "5".into()));
    handle.shutdown().await;
}

/// A start from the newest state of one object (a kubelet's ConfigMap informer:
/// `sendInitialEvents=true`, no resourceVersion, the name as the field selector) is served from
/// the cache once one small upstream read of that object shows the cache holds it as the
/// upstream does; later changes come from the cache too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_from_the_newest_state_of_one_object_is_proven_for_it_alone() {
    let up = start_upstream().await;
    up.change("a", Some("1"), false);
    up.change("b", Some("1"), false);
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &[], false);
    until_filled(&alice).await;
    eventually(
        Duration::from_secs(10),
        "the upstream watch opens",
        || async { up.watches.load(Ordering::SeqCst) == 1 },
    )
    .await;
    let mut watch = alice
        .watch(
            "/api/v1/namespaces/ns/configmaps?watch=1&sendInitialEvents=true\
             &allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan\
             &fieldSelector=metadata.name%3Da",
        )
        .await;
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(summary(&ev), ("ADDED".into(), "a".into(), "1".into()));
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(ev["type"], "BOOKMARK", "{ev}");
    assert_eq!(
        ev["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(
        up.state.lock().object_proofs,
        ["a"],
        "a proof of that object alone"
    );
    assert_eq!(
        up.watches.load(Ordering::SeqCst),
        1,
        "only the cache's own watch reached the upstream"
    );
    up.change("b", Some("2"), false);
    up.change("a", Some("2"), false);
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(summary(&ev), ("MODIFIED".into(), "a".into(), "4".into()));
    // A new one (the informer's watch brings it, if the proof is first).
    up.change("c", Some("1"), false);
    let mut watch = alice
        .watch(
            "/api/v1/namespaces/ns/configmaps?watch=1&sendInitialEvents=true\
             &allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan\
             &fieldSelector=metadata.name%3Dc",
        )
        .await;
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(summary(&ev), ("ADDED".into(), "c".into(), "5".into()));
    assert_eq!(up.state.lock().object_proofs, ["a", "c"]);
    assert_eq!(up.watches.load(Ordering::SeqCst), 1);
    let metrics = alice.request(Method::GET, "/metrics", "", &[]).await.text();
    for line in [
        r#"svc_proxy_freshness_proofs_total{group="",version="v1",resource="configmaps"} 2"#,
        r#"svc_proxy_freshness_proofs_failed_total{group="",version="v1",resource="configmaps"} 0"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}: {metrics}");
    }
    proxy.handle.shutdown().await;
}

/// A proxy resumed at a revision the upstream can still list but no longer watch from fills
/// its cache from the newest state instead, ending the watchers it took meanwhile: the
/// differences from the resumed state are not theirs (an object a client already holds would
/// reach it as ADDED). A client then watching from its own version gets what happened after
/// it, as it happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_cache_whose_history_is_gone_starts_from_the_newest_state() {
    let up = start_upstream().await;
    let (alice, opts, _dir) = stopped_after_keeping_a_resume_point(&up).await;
    // While it is down: c is created (a client elsewhere saw it, at 3) and changed; the
    // upstream's watch history no longer reaches the resume point.
    up.change("c", Some("1"), false);
    up.change("c", Some("2"), false);
    up.state.lock().watch_compacted = 3;
    let handle = svc_gateway::run::start(opts).await.unwrap();
    eventually(
        Duration::from_secs(20),
        "filled from the newest state",
        || async {
            alice.get("/readyz").await.0 == StatusCode::OK && up.lists.load(Ordering::SeqCst) >= 3
        },
    )
    .await;
    assert_eq!(up.state.lock().exact_lists, [2], "resumed first");
    let mut watch = alice
        .watch("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=3")
        .await;
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(summary(&ev), ("MODIFIED".into(), "c".into(), "4".into()));
    handle.shutdown().await;
}
