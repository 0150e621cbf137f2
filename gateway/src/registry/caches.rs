//! One watch cache per served type, each filled by an ingest task from the store's change
//! feed; every list and watch is served from these.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use prometheus_client::collector::Collector;
use svc_core::ResourceInfo;
use svc_core::registry::{self, Kind, KindVisitor};
use svc_core::watch::{KindCodec, WakeGate, WatchCache, WatchCacheConfig};
use svc_storage::Store;
use tokio::sync::watch;

use crate::base::threads::Threads;

pub mod freshness;

/// How often an idle cache drops history and snapshots that aged out.
const PRUNE_INTERVAL: Duration = Duration::from_secs(1);
/// Back-off before relisting after the feed failed.
const RELIST_BACKOFF: Duration = Duration::from_millis(500);
/// Watch tasks woken at once by the caches' wake gate; the rest of a fan-out round is woken
/// a slice at a time by the pacer task, so a write's handler or an ingest task woken
/// meanwhile waits behind at most this many watch tasks (BENCHMARKS.md, "HTTP/1.1 fan-out
/// cost and write isolation").
const WAKE_SLICE: usize = 64;

/// The codec of every stored kind, from the registry.
fn codecs() -> Vec<KindCodec> {
    struct CodecOf;
    impl KindVisitor for CodecOf {
        type Output = KindCodec;
        fn visit<T: Kind>(self) -> KindCodec {
            KindCodec::with_protobuf::<T>()
        }
    }
    registry::all()
        .iter()
        .filter(|info| info.stored)
        .filter_map(|info| registry::visit(info, CodecOf))
        .collect()
}

pub struct Caches {
    caches: Vec<WatchCache>,
    /// Shared by every cache: one fan-out backlog, paced by one task.
    gate: Arc<WakeGate>,
    /// The thread the ingest tasks run on, once started: one of its own for every cache's
    /// ingest task. What a cache keeps (decoded objects, history events, their encoded
    /// frames) is allocated there, apart from the request threads' short-lived buffers: the
    /// C allocator keeps one arena per thread, and long-lived blocks left scattered among a
    /// load's freed buffers keep their pages resident after the load. Ingest also stops
    /// waiting in the request threads' queues behind the watchers it feeds.
    ingest: OnceLock<Threads>,
}

impl Caches {
    pub fn new(config: &WatchCacheConfig) -> Self {
        let gate = WakeGate::paced(WAKE_SLICE);
        Caches {
            caches: codecs()
                .into_iter()
                .map(|c| WatchCache::with_gate(c, config.clone(), gate.clone()))
                .collect(),
            gate,
            ingest: OnceLock::new(),
        }
    }

    /// The cache of a served type.
    // `new` builds a cache for every registered type, and `info` is one of them.
    #[allow(clippy::expect_used)]
    pub fn get(&self, info: &ResourceInfo) -> &WatchCache {
        self.caches
            .iter()
            .find(|c| std::ptr::eq(c.codec().info, info))
            .expect("every registered type has a watch cache")
    }

    pub fn all_ready(&self) -> bool {
        self.caches.iter().all(WatchCache::is_ready)
    }

    /// Starts one ingest task per cache; `synced` is set once every cache has its first list.
    pub fn start(
        &self,
        store: Arc<dyn Store>,
        stop: watch::Receiver<bool>,
        synced: Arc<AtomicBool>,
    ) {
        let thread = match Threads::new("svc-ingest", 1, || {}) {
            Ok(t) => Some(self.ingest.get_or_init(|| t)),
            Err(e) => {
                tracing::warn!(error = %e, "watch caches' ingest runs on the request threads");
                None
            }
        };
        let here = tokio::runtime::Handle::current();
        let on = thread.map_or(&here, Threads::handle);
        for cache in &self.caches {
            on.spawn(ingest(store.clone(), cache.clone(), stop.clone()));
        }
        tokio::spawn(pace(self.gate.clone(), stop.clone()));
        let caches: Vec<WatchCache> = self.caches.clone();
        tokio::spawn(async move {
            while !caches.iter().all(WatchCache::is_ready) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            synced.store(true, Ordering::Release);
        });
    }

    /// The caches' metrics, read from their stats at scrape time.
    pub fn collector(&self) -> Box<dyn Collector> {
        crate::observe::metrics::caches::collector(self.caches.clone())
    }
}

/// Wakes the watchers the gate deferred, one slice at a time, yielding to the runtime after
/// each slice so that tasks woken meanwhile (write handlers, ingest) run before the next.
pub async fn pace(gate: Arc<WakeGate>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = gate.pace() => {}
            _ = crate::base::lifecycle::until_set(&mut stop) => return,
        }
        while gate.release() > 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// Fills one cache: list, then follow the feed from the list's revision; on any feed error
/// (compacted history, store trouble) list again, which also ends lagging watchers cleanly.
async fn ingest(store: Arc<dyn Store>, cache: WatchCache, mut stop: watch::Receiver<bool>) {
    let kind = cache.codec().info.plural;
    let range = cache.key_range(None);
    loop {
        let listed = tokio::select! {
            r = store.range(range.clone(), None, 0) => r,
            _ = crate::base::lifecycle::until_set(&mut stop) => return,
        };
        let listed = match listed {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(kind, error = %e, "watch cache: listing failed; retrying");
                tokio::time::sleep(RELIST_BACKOFF).await;
                continue;
            }
        };
        let report = cache.replace(&listed.kvs, listed.revision, Instant::now());
        if report.error_count > 0 {
            tracing::error!(kind, errors = report.error_count, first = ?report.errors.first(), "watch cache: undecodable objects left out");
        }
        tracing::debug!(
            kind,
            revision = listed.revision,
            objects = listed.kvs.len(),
            "watch cache synced"
        );
        let mut feed = store.watch(range.clone(), listed.revision);
        let mut prune = tokio::time::interval(PRUNE_INTERVAL);
        loop {
            tokio::select! {
                item = feed.next() => match item {
                    Some(Ok(item)) => {
                        let report = cache.apply(item, Instant::now());
                        if report.error_count > 0 {
                            tracing::error!(kind, errors = report.error_count, first = ?report.errors.first(), "watch cache: undecodable objects left out");
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(kind, error = %e, "watch cache: feed failed; relisting");
                        break;
                    }
                    None => return,
                },
                _ = prune.tick() => {
                    cache.prune(Instant::now());
                }
                _ = crate::base::lifecycle::until_set(&mut stop) => return,
            }
        }
        tokio::time::sleep(RELIST_BACKOFF).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use svc_storage::embedded::{EmbeddedConfig, EmbeddedStore};

    /// The ingest tasks run on their thread of their own: the caches follow the store while
    /// every thread of the runtime that started them is busy (here its only one, blocked).
    #[tokio::test]
    async fn the_caches_keep_up_while_the_request_threads_are_busy() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedConfig::default()).unwrap();
        let caches = Caches::new(&WatchCacheConfig::default());
        let (_stop_tx, stop) = watch::channel(false);
        let synced = Arc::new(AtomicBool::new(false));
        caches.start(store.clone(), stop, synced.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !synced.load(Ordering::Acquire) {
            assert!(Instant::now() < deadline, "the caches never filled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let info = registry::all()
            .iter()
            .find(|i| i.plural == "serviceaccounts")
            .unwrap();
        let cache = caches.get(info);
        let written = store
            .create(
                Bytes::from_static(b"/registry/serviceaccounts/default/a"),
                Bytes::from_static(
                    br#"{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"a","namespace":"default"}}"#,
                ),
            )
            .await
            .unwrap();
        // Blocks this runtime's one thread: nothing spawned on it runs until the loop ends.
        while cache.revision() < written.mod_revision {
            assert!(
                Instant::now() < deadline,
                "the write never reached the cache while the runtime's thread was busy"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
