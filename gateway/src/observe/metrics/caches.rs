//! The watch caches' metrics, read from their stats on each scrape. kube-apiserver's names
//! where it has them (`apiserver_storage_objects`, `apiserver_resource_objects`,
//! `apiserver_watch_cache_events_received_total`, `apiserver_watch_cache_resource_version`,
//! `apiserver_watch_cache_initializations_total`); the rest describe this cache's own
//! structures (history ring, snapshots, encodings, dispatch).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use svc_core::watch::{FrameFormat, MetaGroup, WatchCache, WatchCacheStats};

/// The collector of `caches`' families.
pub fn collector(caches: Vec<WatchCache>) -> Box<dyn Collector> {
    Box::new(CacheCollector { caches })
}

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

/// A family with one sample per cache, labelled by group and resource: name, help, type and
/// the sample read from a cache's stats.
type PerCache = (
    &'static str,
    &'static str,
    MetricType,
    fn(&WatchCacheStats) -> u64,
);

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn revision(s: &WatchCacheStats) -> u64 {
    u64::try_from(s.revision).unwrap_or_default()
}

/// The families labelled by group and resource, in the order they are written.
const PER_CACHE: &[PerCache] = &[
    (
        "apiserver_resource_objects",
        "Number of stored objects at the time of last check split by kind (from the watch \
         cache)",
        MetricType::Gauge,
        |s| count(s.objects),
    ),
    (
        "apiserver_watch_cache_events_received",
        "Counter of events received in watch cache broken by resource type",
        MetricType::Counter,
        |s| s.events_received,
    ),
    (
        "apiserver_watch_cache_resource_version",
        "Current resource version of watch cache broken by resource type",
        MetricType::Gauge,
        revision,
    ),
    (
        "apiserver_watch_cache_initializations",
        "Counter of watch cache initializations (first fill and every relist) broken by \
         resource type",
        MetricType::Counter,
        |s| s.initializations,
    ),
    (
        "apiserver_watch_cache_history_events",
        "Events in the watch cache's history ring",
        MetricType::Gauge,
        |s| count(s.history_events),
    ),
    (
        "apiserver_watch_cache_history_bytes",
        "Bytes held by the watch cache's history ring (objects and encoded frames)",
        MetricType::Gauge,
        |s| count(s.history_bytes),
    ),
    (
        "apiserver_watch_cache_snapshots",
        "List snapshots kept for Exact lists and continue tokens",
        MetricType::Gauge,
        |s| count(s.snapshots),
    ),
    (
        "apiserver_watch_cache_snapshot_bytes",
        "Bytes of old objects kept alive only by list snapshots (an estimate)",
        MetricType::Gauge,
        |s| count(s.snapshot_bytes),
    ),
    (
        "apiserver_watch_cache_watchers",
        "Watchers registered with the watch cache",
        MetricType::Gauge,
        |s| count(s.watchers),
    ),
    (
        "apiserver_watch_cache_dispatch_visits",
        "Watchers visited by dispatch, in total",
        MetricType::Counter,
        |s| s.dispatch_visits,
    ),
];

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

/// A sample as its family's type: a gauge (saturating at `i64::MAX`) or a counter.
fn sample(kind: MetricType, v: u64) -> Box<dyn EncodeMetric> {
    match kind {
        MetricType::Counter => Box::new(ConstCounter::new(v)),
        _ => Box::new(ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))),
    }
}

impl Collector for CacheCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats: Vec<(&WatchCache, WatchCacheStats)> =
            self.caches.iter().map(|c| (c, c.stats())).collect();
        let by = |c: &WatchCache| {
            let i = c.codec().info;
            CacheLabels {
                group: i.group,
                resource: i.plural,
            }
        };
        family(
            &mut encoder,
            "apiserver_storage_objects",
            "Number of stored objects at the time of last check split by kind (from the watch \
             cache)",
            MetricType::Gauge,
            stats.iter().map(|(c, s)| {
                let resource = c.codec().info.plural;
                (
                    StorageObjectLabels { resource },
                    sample(MetricType::Gauge, count(s.objects)),
                )
            }),
        )?;
        for (name, help, kind, read) in PER_CACHE {
            let samples = stats.iter().map(|(c, s)| (by(c), sample(*kind, read(s))));
            family(&mut encoder, name, help, *kind, samples)?;
        }
        self.encode_encodings(&mut encoder)
    }
}

impl CacheCollector {
    fn encode_encodings(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let formats = [
            (FrameFormat::Json, "json"),
            (FrameFormat::Protobuf, "protobuf"),
            (FrameFormat::CborSeq, "cbor"),
            (
                FrameFormat::PartialMetadata(MetaGroup::K8s),
                "partial-metadata",
            ),
            (
                FrameFormat::PartialMetadata(MetaGroup::Svc),
                "partial-metadata-svc",
            ),
        ];
        family(
            encoder,
            "apiserver_watch_cache_encodings",
            "Watch frames encoded (once per event and format, not per watcher), by resource and \
             format",
            MetricType::Counter,
            self.caches.iter().flat_map(|c| {
                let i = c.codec().info;
                formats.map(|(f, format)| {
                    let labels = EncodingLabels {
                        group: i.group,
                        resource: i.plural,
                        format,
                    };
                    (labels, ConstCounter::new(c.encodings(f)))
                })
            }),
        )
    }
}
