//! The same fill-loop tests run against both real sources, as kube-apiserver runs its cacher
//! through etcd3's storage tests: the store's feed (an embedded store), and the upstream's
//! list+watch (`UpstreamSource` against a scripted upstream over HTTP). Each source is driven
//! through a [`Harness`] that changes what it serves.
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
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use parking_lot::Mutex;
use svc_core::watch::{
    FrameFormat, Selector, WatchCache, WatchCacheConfig, WatchRequest, WatchStart,
};
use svc_storage::{Revision, Store as _};
use svc_storage::embedded::{EmbeddedConfig, EmbeddedStore};
use tokio::sync::{mpsc, watch};

use super::{FillStatus, Source, run};
use crate::outbound::upstream::Upstream;
use crate::outbound::upstream::discovery::core_kind;
use crate::registry::caches::upstream::source::UpstreamSource;
use crate::registry::caches::{StoreSource, codecs};

/// A source whose data the test changes.
trait Harness {
    type S: Source;
    fn source(&self) -> Self::S;
    /// The cache the loop fills (of the kind the source serves).
    fn cache(&self) -> WatchCache;
    /// Creates or changes the object `name`; its revision.
    async fn put(&self, name: &str) -> Revision;
    /// Deletes the object `name`; the revision of the delete.
    async fn delete(&self, name: &str) -> Revision;
}

// ---- The store.

struct Store {
    store: Arc<EmbeddedStore>,
    _dir: tempfile::TempDir,
    revisions: Mutex<BTreeMap<String, Revision>>,
}

fn sa_key(name: &str) -> Bytes {
    Bytes::from(format!("/registry/serviceaccounts/default/{name}"))
}

fn sa(name: &str, generation: Revision) -> Bytes {
    Bytes::from(format!(
        r#"{{"apiVersion":"v1","kind":"ServiceAccount","metadata":{{"name":"{name}","namespace":"default","labels":{{"g":"{generation}"}}}}}}"#
    ))
}

impl Store {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedConfig::default()).unwrap();
        Store {
            store,
            _dir: dir,
            revisions: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Harness for Store {
    type S = StoreSource;

    fn source(&self) -> StoreSource {
        StoreSource {
            store: self.store.clone(),
            range: self.cache().key_range(None),
        }
    }

    fn cache(&self) -> WatchCache {
        let info = svc_core::registry::all()
            .iter()
            .find(|i| i.plural == "serviceaccounts")
            .unwrap();
        let codec = codecs()
            .into_iter()
            .find(|c| std::ptr::eq(c.info, *info))
            .unwrap();
        WatchCache::new(codec, WatchCacheConfig::default())
    }

    async fn put(&self, name: &str) -> Revision {
        let current = self.revisions.lock().get(name).copied();
        let kv = match current {
            None => self.store.create(sa_key(name), sa(name, 0)).await,
            Some(rev) => self.store.update(sa_key(name), sa(name, rev), rev).await,
        }
        .unwrap();
        self.revisions
            .lock()
            .insert(name.to_string(), kv.mod_revision);
        kv.mod_revision
    }

    async fn delete(&self, name: &str) -> Revision {
        self.revisions.lock().remove(name);
        self.store.delete(sa_key(name), None).await.unwrap().1
    }
}

// ---- A scripted upstream: pods in namespace `ns`, over plain HTTP.

#[derive(Default)]
struct Served {
    revision: Revision,
    objects: BTreeMap<String, Revision>,
    /// Every event, as its watch line, with its revision.
    history: Vec<(Revision, Bytes)>,
    /// Watches from before this revision are answered 410.
    oldest: Revision,
    watchers: Vec<mpsc::UnboundedSender<Bytes>>,
    /// Requests seen, as `list`, `watch@R`, `streaming`.
    requests: Vec<String>,
    /// Changes are not sent to the open watches.
    deaf: bool,
}

struct Scripted {
    served: Arc<Mutex<Served>>,
    upstream: Upstream,
    _dir: tempfile::TempDir,
}

fn pod(name: &str, rev: Revision) -> String {
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

impl Scripted {
    async fn new() -> Self {
        let served = Arc::new(Mutex::new(Served::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = served.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let state = state.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                        std::future::ready(Ok::<_, Infallible>(answer(&state, req.uri())))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
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
        Scripted {
            served,
            upstream,
            _dir: dir,
        }
    }

    fn change(&self, name: &str, ty: &str) -> Revision {
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
    fn compact(&self) {
        let mut s = self.served.lock();
        s.oldest = s.revision;
        s.watchers.clear();
    }

    fn requests(&self) -> Vec<String> {
        self.served.lock().requests.clone()
    }
}

impl Harness for Scripted {
    type S = UpstreamSource;

    fn source(&self) -> UpstreamSource {
        UpstreamSource {
            upstream: self.upstream.clone(),
            info: core_kind("pods", "Pod", true),
            status: Arc::new(FillStatus::default()),
            idle: Duration::from_secs(150),
            resume_from: None,
            streaming: true,
        }
    }

    fn cache(&self) -> WatchCache {
        WatchCache::new(
            svc_core::watch::unstructured::codec(core_kind("pods", "Pod", true)),
            WatchCacheConfig::default(),
        )
    }

    async fn put(&self, name: &str) -> Revision {
        let existed = self.served.lock().objects.contains_key(name);
        self.change(name, if existed { "MODIFIED" } else { "ADDED" })
    }

    async fn delete(&self, name: &str) -> Revision {
        self.change(name, "DELETED")
    }
}

// ---- The tests, the same for both.

async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The `TYPE name` of each JSON frame a watcher has now.
fn drained(w: &mut svc_core::watch::Watcher) -> Vec<String> {
    let d = w.drain(1 << 20, Instant::now());
    d.frames
        .iter()
        .map(|f| {
            let v: serde_json::Value = serde_json::from_slice(f).unwrap();
            format!(
                "{} {}",
                v["type"].as_str().unwrap_or_default(),
                v["object"]["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// Listed, then followed: what was there is in the cache at the list's revision, and what
/// changes after reaches a watcher in order, deletes included, at the source's revisions.
async fn fills_and_follows<H: Harness>(h: H) {
    h.put("a").await;
    let listed_at = h.put("b").await;
    let cache = h.cache();
    let (stop, rx) = watch::channel(false);
    let status = Arc::new(FillStatus::default());
    let task = tokio::spawn(run(h.source(), cache.clone(), status.clone(), None, rx));
    until("the first fill", || cache.revision() >= listed_at).await;
    assert_eq!(cache.stats().objects, 2);
    let mut w = cache
        .watch(
            WatchRequest {
                namespace: None,
                selector: Selector::default(),
                start: WatchStart::After(listed_at),
                bookmarks: false,
                format: FrameFormat::Json,
            },
            Instant::now(),
        )
        .unwrap();
    h.put("c").await;
    h.put("b").await;
    let last = h.delete("a").await;
    until("the changes followed", || cache.revision() >= last).await;
    assert_eq!(drained(&mut w), ["ADDED c", "MODIFIED b", "DELETED a"]);
    assert_eq!(cache.stats().objects, 2);
    assert_eq!(status.lists.load(std::sync::atomic::Ordering::Relaxed), 1);
    let _ = stop.send(true);
    task.await.unwrap();
}

#[tokio::test]
async fn the_store_fills_and_follows() {
    fills_and_follows(Store::new()).await;
}

#[tokio::test]
async fn the_upstream_fills_and_follows() {
    let h = Scripted::new().await;
    let served = h.served.clone();
    fills_and_follows(h).await;
    // In pages, as the upstream refused the streaming list, then one watch from the list.
    let requests = served.lock().requests.clone();
    assert_eq!(requests[..3], ["streaming", "list", "watch@2"]);
}

/// The upstream's history compacted under an open watch: the next watch is refused 410,
/// the source lists again, and the loop resyncs the cache, its watcher kept.
#[tokio::test]
async fn the_upstream_after_a_gap_is_listed_again_and_resynced() {
    let h = Scripted::new().await;
    h.put("a").await;
    let cache = h.cache();
    let (stop, rx) = watch::channel(false);
    let status = Arc::new(FillStatus::default());
    let task = tokio::spawn(run(h.source(), cache.clone(), status.clone(), None, rx));
    until("the first fill", || cache.revision() >= 1).await;
    let mut w = cache
        .watch(
            WatchRequest {
                namespace: None,
                selector: Selector::default(),
                start: WatchStart::After(1),
                bookmarks: false,
                format: FrameFormat::Json,
            },
            Instant::now(),
        )
        .unwrap();
    // Changes no open watch carries, then the history before them gone.
    h.served.lock().deaf = true;
    h.put("b").await;
    h.delete("a").await;
    h.compact();
    until("the relist", || {
        status.lists.load(std::sync::atomic::Ordering::Relaxed) == 2
    })
    .await;
    until("the resync", || cache.revision() >= 3).await;
    assert_eq!(drained(&mut w), ["ADDED b", "DELETED a"]);
    assert!(!w.is_finished(), "the watcher goes on");
    assert!(
        h.requests().iter().any(|r| r == "watch@1"),
        "{:?}",
        h.requests()
    );
    let _ = stop.send(true);
    task.await.unwrap();
}
