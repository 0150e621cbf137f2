//! One watch cache per served type, each filled by an ingest task from the store's change
//! feed; every list and watch is served from these.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use svc_core::ResourceInfo;
use svc_core::registry::{self, Kind, KindVisitor};
use svc_core::watch::{
    FrameFormat, KindCodec, WakeGate, WatchCache, WatchCacheConfig, WatchCacheStats,
};
use svc_storage::Store;
use tokio::sync::watch;

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
        for cache in &self.caches {
            tokio::spawn(ingest(store.clone(), cache.clone(), stop.clone()));
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
        Box::new(CacheCollector {
            caches: self.caches.clone(),
        })
    }
}

/// Encodes the watch caches' state as metric families on each scrape. kube-apiserver's names
/// where it has them (`apiserver_storage_objects`, `apiserver_resource_objects`,
/// `apiserver_watch_cache_events_received_total`, `apiserver_watch_cache_resource_version`,
/// `apiserver_watch_cache_initializations_total`); the rest describe this cache's own
/// structures (history ring, snapshots, encodings, dispatch).
struct CacheCollector {
    caches: Vec<WatchCache>,
}

impl std::fmt::Debug for CacheCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheCollector")
            .field("caches", &self.caches.len())
            .finish()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    group: &'static str,
    resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StorageObjectLabels {
    resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EncodingLabels {
    group: &'static str,
    resource: &'static str,
    format: &'static str,
}

/// One family: its descriptor, then one sample per label set.
fn family<L: EncodeLabelSet, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (L, M)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, metric) in samples {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for CacheCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats: Vec<(&ResourceInfo, WatchCacheStats, WatchCache)> = self
            .caches
            .iter()
            .map(|c| (c.codec().info, c.stats(), c.clone()))
            .collect();
        let by = |i: &ResourceInfo| CacheLabels {
            group: i.group,
            resource: i.plural,
        };
        let gauge = |v: i64| ConstGauge::new(v);
        let counter = |v: u64| ConstCounter::new(v);
        let e = &mut encoder;
        family(
            e,
            "apiserver_storage_objects",
            "Number of stored objects at the time of last check split by kind (from the watch \
             cache)",
            MetricType::Gauge,
            stats.iter().map(|(i, s, _)| {
                (
                    StorageObjectLabels { resource: i.plural },
                    gauge(s.objects as i64),
                )
            }),
        )?;
        family(
            e,
            "apiserver_resource_objects",
            "Number of stored objects at the time of last check split by kind (from the watch \
             cache)",
            MetricType::Gauge,
            stats
                .iter()
                .map(|(i, s, _)| (by(i), gauge(s.objects as i64))),
        )?;
        family(
            e,
            "apiserver_watch_cache_events_received",
            "Counter of events received in watch cache broken by resource type",
            MetricType::Counter,
            stats
                .iter()
                .map(|(i, s, _)| (by(i), counter(s.events_received))),
        )?;
        family(
            e,
            "apiserver_watch_cache_resource_version",
            "Current resource version of watch cache broken by resource type",
            MetricType::Gauge,
            stats.iter().map(|(i, s, _)| (by(i), gauge(s.revision))),
        )?;
        family(
            e,
            "apiserver_watch_cache_initializations",
            "Counter of watch cache initializations (first fill and every relist) broken by \
             resource type",
            MetricType::Counter,
            stats
                .iter()
                .map(|(i, s, _)| (by(i), counter(s.initializations))),
        )?;
        family(
            e,
            "apiserver_watch_cache_encodings",
            "Watch frames encoded (once per event and format, not per watcher), by resource and \
             format",
            MetricType::Counter,
            stats.iter().flat_map(|(i, _, c)| {
                [
                    (FrameFormat::Json, "json"),
                    (FrameFormat::Protobuf, "protobuf"),
                    (FrameFormat::CborSeq, "cbor"),
                ]
                .map(|(f, name)| {
                    (
                        EncodingLabels {
                            group: i.group,
                            resource: i.plural,
                            format: name,
                        },
                        counter(c.encodings(f)),
                    )
                })
            }),
        )?;
        family(
            e,
            "apiserver_watch_cache_history_events",
            "Events in the watch cache's history ring",
            MetricType::Gauge,
            stats
                .iter()
                .map(|(i, s, _)| (by(i), gauge(s.history_events as i64))),
        )?;
        family(
            e,
            "apiserver_watch_cache_history_bytes",
            "Bytes held by the watch cache's history ring (objects and encoded frames)",
            MetricType::Gauge,
            stats
                .iter()
                .map(|(i, s, _)| (by(i), gauge(s.history_bytes as i64))),
        )?;
        family(
            e,
            "apiserver_watch_cache_snapshots",
            "List snapshots kept for Exact lists and continue tokens",
            MetricType::Gauge,
            stats
                .iter()
                .map(|(i, s, _)| (by(i), gauge(s.snapshots as i64))),
        )?;
        family(
            e,
            "apiserver_watch_cache_snapshot_bytes",
            "Bytes of old objects kept alive only by list snapshots (an estimate)",
            MetricType::Gauge,
            stats
                .iter()
                .map(|(i, s, _)| (by(i), gauge(s.snapshot_bytes as i64))),
        )?;
        family(
            e,
            "apiserver_watch_cache_watchers",
            "Watchers registered with the watch cache",
            MetricType::Gauge,
            stats
                .iter()
                .map(|(i, s, _)| (by(i), gauge(s.watchers as i64))),
        )?;
        family(
            e,
            "apiserver_watch_cache_dispatch_visits",
            "Watchers visited by dispatch, in total",
            MetricType::Counter,
            stats
                .iter()
                .map(|(i, s, _)| (by(i), counter(s.dispatch_visits))),
        )
    }
}

/// Wakes the watchers the gate deferred, one slice at a time, yielding to the runtime after
/// each slice so that tasks woken meanwhile (write handlers, ingest) run before the next.
async fn pace(gate: Arc<WakeGate>, mut stop: watch::Receiver<bool>) {
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
