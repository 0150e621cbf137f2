//! The same fill-loop tests run against both real sources, as kube-apiserver runs its cacher
//! through etcd3's storage tests: the store's feed (an embedded store), and the upstream's
//! list+watch (`UpstreamSource` against a scripted upstream over HTTP). Each source is driven
//! through a [`Harness`] that changes what it serves; the scripted upstream is
//! `outbound/upstream/scripted.rs`.
// Test code: a panic on a broken expectation is the point.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use svc_core::watch::{WatchCache, WatchCacheConfig};
use svc_storage::embedded::{EmbeddedConfig, EmbeddedStore};
use svc_storage::{Revision, Store as _};
use tokio::sync::watch;

use super::tests::{drained, until, watcher};
use super::{FillStatus, Source, run};
use crate::outbound::upstream::discovery::core_kind;
use crate::outbound::upstream::scripted::Scripted;
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
    let mut w = watcher(&cache, listed_at);
    h.put("c").await;
    h.put("b").await;
    let last = h.delete("a").await;
    until("the changes followed", || cache.revision() >= last).await;
    // The store's revisions are its own: the events by type and name.
    let (got, over) = drained(&mut w);
    let got: Vec<&str> = got.iter().filter_map(|e| e.split('@').next()).collect();
    assert_eq!(got, ["ADDED c", "MODIFIED b", "DELETED a"]);
    assert!(!over);
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
    let mut w = watcher(&cache, 1);
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
    let (got, over) = drained(&mut w);
    assert_eq!(got, ["ADDED b@2", "DELETED a@3"]);
    assert!(!over, "the watcher goes on");
    assert!(
        h.requests().iter().any(|r| r == "watch@1"),
        "{:?}",
        h.requests()
    );
    let _ = stop.send(true);
    task.await.unwrap();
}
