//! The watch caches and what fills them. Standalone mode holds one cache per served type
//! ([`Caches`]), each filled from the store's change feed ([`StoreSource`]); proxy mode holds
//! one per resource the upstream offers (`upstream.rs`), each filled from the upstream's
//! list+watch. Both run the one fill loop of `reflector.rs`, and every list and watch is
//! served from these.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use prometheus_client::collector::Collector;
use svc_core::ResourceInfo;
use svc_core::registry::{self, Kind, KindVisitor};
use svc_core::watch::{KindCodec, WakeGate, WatchCache, WatchCacheConfig};
use svc_storage::{FeedItem, FeedStream, KeyRange, Revision, Store, StoreError};
use tokio::sync::watch;

use crate::base::threads::Threads;

pub mod freshness;
pub mod reflector;
pub mod upstream;

use reflector::{Feed, FillStatus, Gap, Listed, Source};

/// Watch tasks woken at once by a wake gate of either mode's caches; the rest of a fan-out round is woken
/// a slice at a time by the pacer task, so a write's handler or an ingest task woken
/// meanwhile waits behind at most this many watch tasks (BENCHMARKS.md, "HTTP/1.1 fan-out
/// cost and write isolation").
pub(crate) const WAKE_SLICE: usize = 64;

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
            let source = StoreSource {
                store: store.clone(),
                range: cache.key_range(None),
            };
            let status = Arc::new(FillStatus::default());
            on.spawn(reflector::run(
                source,
                cache.clone(),
                status,
                None,
                stop.clone(),
            ));
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

/// One type's part of the store: its key range, listed and watched.
pub struct StoreSource {
    store: Arc<dyn Store>,
    range: KeyRange,
}

impl Source for StoreSource {
    type Feed = FeedStream;
    /// A store that failed is retried soon: its watchers wait on it.
    const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(2));

    async fn list(&mut self) -> Result<Listed, String> {
        let listed = self
            .store
            .range(self.range.clone(), None, 0)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Listed {
            kvs: listed.kvs,
            revision: listed.revision,
            resumed: false,
        })
    }

    async fn follow(&mut self, from: Revision) -> Result<FeedStream, Gap> {
        Ok(self.store.watch(self.range.clone(), from))
    }
}

impl Feed for FeedStream {
    async fn next(&mut self) -> Result<FeedItem, Gap> {
        match StreamExt::next(self).await {
            Some(Ok(item)) => Ok(item),
            Some(Err(StoreError::Compacted { .. })) => Err(Gap::Expired),
            Some(Err(StoreError::Closed)) | None => Err(Gap::Shut),
            Some(Err(e)) => Err(Gap::Failed(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::time::Instant;
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

    /// The store as a source: everything, then the changes after a revision; a feed from
    /// before the store's compaction is a gap (the fill loop lists again and resyncs), and a
    /// closed store ends the loop.
    #[tokio::test]
    async fn the_store_as_a_source_lists_follows_and_reports_its_gaps() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedConfig::default()).unwrap();
        let key = |n: &str| Bytes::from(format!("/registry/serviceaccounts/default/{n}"));
        let sa = |n: &str| {
            Bytes::from(format!(
                r#"{{"apiVersion":"v1","kind":"ServiceAccount","metadata":{{"name":"{n}","namespace":"default"}}}}"#
            ))
        };
        let a = store.create(key("a"), sa("a")).await.unwrap();
        let mut source = StoreSource {
            store: store.clone(),
            range: KeyRange::prefix(Bytes::from_static(b"/registry/serviceaccounts/")),
        };
        let listed = source.list().await.unwrap();
        assert_eq!((listed.kvs.len(), listed.revision), (1, a.mod_revision));
        assert!(!listed.resumed);
        let b = store.create(key("b"), sa("b")).await.unwrap();
        let mut feed = source.follow(listed.revision).await.unwrap();
        match tokio::time::timeout(Duration::from_secs(5), Feed::next(&mut feed))
            .await
            .unwrap()
        {
            Ok(FeedItem::Events(events)) => {
                assert_eq!(events.len(), 1);
                assert_eq!(events[0].kv.mod_revision, b.mod_revision);
            }
            other => panic!("the write after the list, not {other:?}"),
        }
        // History before b compacted away: a feed from before it is a gap.
        store.compact(b.mod_revision).await.unwrap();
        let mut old = source.follow(a.mod_revision - 1).await.unwrap();
        assert!(matches!(
            tokio::time::timeout(Duration::from_secs(5), Feed::next(&mut old))
                .await
                .unwrap(),
            Err(Gap::Expired)
        ));
    }
}
