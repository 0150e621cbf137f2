//! One watch cache per served type, each filled by an ingest task from the store's change
//! feed; every list and watch is served from these.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use svc_core::ResourceInfo;
use svc_core::registry::{self, Kind, KindVisitor};
use svc_core::watch::{FrameFormat, KindCodec, WatchCache, WatchCacheConfig};
use svc_storage::Store;
use tokio::sync::watch;

pub mod freshness;

/// How often an idle cache drops history and snapshots that aged out.
const PRUNE_INTERVAL: Duration = Duration::from_secs(1);
/// Back-off before relisting after the feed failed.
const RELIST_BACKOFF: Duration = Duration::from_millis(500);

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
}

impl Caches {
    pub fn new(config: &WatchCacheConfig) -> Self {
        Caches {
            caches: codecs()
                .into_iter()
                .map(|c| WatchCache::new(c, config.clone()))
                .collect(),
        }
    }

    /// The cache of a served type.
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
        for cache in &self.caches {
            tokio::spawn(ingest(store.clone(), cache.clone(), stop.clone()));
        }
        let caches: Vec<WatchCache> = self.caches.clone();
        tokio::spawn(async move {
            while !caches.iter().all(WatchCache::is_ready) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            synced.store(true, Ordering::Release);
        });
    }

    /// Prometheus text for the caches: encodings per format (one per event and format, not
    /// per watcher), history size, watchers, dispatch work.
    pub fn encode_metrics(&self) -> String {
        let mut out = String::new();
        let mut families: Vec<(&str, &str, &str, Vec<String>)> = vec![
            (
                "apiserver_watch_cache_encodings_total",
                "counter",
                "Watch frames encoded, by resource and format",
                vec![],
            ),
            (
                "apiserver_watch_cache_revision",
                "gauge",
                "Newest revision applied by the cache",
                vec![],
            ),
            (
                "apiserver_watch_cache_history_events",
                "gauge",
                "Events in the history ring",
                vec![],
            ),
            (
                "apiserver_watch_cache_history_bytes",
                "gauge",
                "Bytes held by the history ring",
                vec![],
            ),
            (
                "apiserver_watch_cache_objects",
                "gauge",
                "Objects in the current state",
                vec![],
            ),
            (
                "apiserver_watch_cache_watchers",
                "gauge",
                "Watchers registered with the cache",
                vec![],
            ),
            (
                "apiserver_watch_cache_dispatch_visits_total",
                "counter",
                "Watchers visited by dispatch",
                vec![],
            ),
        ];
        for cache in &self.caches {
            let r = cache.codec().info.plural;
            let s = cache.stats();
            for (fmt, name) in [
                (FrameFormat::Json, "json"),
                (FrameFormat::Protobuf, "protobuf"),
            ] {
                families[0].3.push(format!(
                    "{{resource=\"{r}\",format=\"{name}\"}} {}",
                    cache.encodings(fmt)
                ));
            }
            families[1]
                .3
                .push(format!("{{resource=\"{r}\"}} {}", s.revision));
            families[2]
                .3
                .push(format!("{{resource=\"{r}\"}} {}", s.history_events));
            families[3]
                .3
                .push(format!("{{resource=\"{r}\"}} {}", s.history_bytes));
            families[4]
                .3
                .push(format!("{{resource=\"{r}\"}} {}", s.objects));
            families[5]
                .3
                .push(format!("{{resource=\"{r}\"}} {}", s.watchers));
            families[6]
                .3
                .push(format!("{{resource=\"{r}\"}} {}", s.dispatch_visits));
        }
        for (name, kind, help, samples) in families {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} {kind}");
            for s in samples {
                let _ = writeln!(out, "{name}{s}");
            }
        }
        out
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
            _ = crate::lifecycle::until_set(&mut stop) => return,
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
                _ = crate::lifecycle::until_set(&mut stop) => return,
            }
        }
        tokio::time::sleep(RELIST_BACKOFF).await;
    }
}
