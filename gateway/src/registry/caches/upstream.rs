//! Proxy mode's caches of the upstream (`--upstream-kubeconfig`): the resources upstream
//! discovery offers (`outbound/upstream/discovery.rs`), chosen by `--cache-resources`, each
//! held in a watch cache filled by the fill loop of `reflector.rs` from its own upstream
//! list+watch (`upstream/source.rs`). Discovery is read
//! again every [`REDISCOVER`], and at once when a CustomResourceDefinition changes, so a CRD
//! created, changed or deleted upstream is picked up at run time: a resource that appears
//! gets its informer, one that goes away is dropped with its watchers, and every other
//! resource's cache and watchers go on untouched.

pub mod fresh;
pub mod resume;
pub mod source;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use svc_core::ResourceInfo;
use svc_core::watch::{WakeGate, WatchCache, WatchCacheConfig, unstructured};
use tokio::sync::{Notify, watch};

use crate::outbound::upstream::discovery::{self, Discovered, ResourceFilter};
use crate::outbound::upstream::{CALL_TIMEOUT, Upstream};
use crate::registry::caches::reflector::{self, FillStatus};
use fresh::{ProofCounts, Unproven};
use source::UpstreamSource;

/// How often upstream discovery is read again.
pub const REDISCOVER: Duration = Duration::from_secs(30);
/// The largest discovery document read.
const MAX_DISCOVERY_BYTES: usize = 64 << 20;

/// One cached resource.
pub struct UpstreamCache {
    pub info: &'static ResourceInfo,
    pub cache: WatchCache,
    pub status: Arc<FillStatus>,
    /// Proofs of freshness asked for, and how they ended.
    pub proofs: ProofCounts,
    /// Reads waiting for proof that the cache is as fresh as the upstream.
    pub freshness: fresh::Freshness,
    /// Consistent lists arriving, to tell a storm from a caller's occasional list.
    pub storm: Storm,
    stop: watch::Sender<bool>,
}

impl UpstreamCache {
    /// The cache of `info`, and the stop signal of its fill loop, set when it is dropped.
    pub fn new(info: &'static ResourceInfo, cache: WatchCache) -> (Self, watch::Receiver<bool>) {
        let (stop, rx) = watch::channel(false);
        let cached = UpstreamCache {
            info,
            cache,
            status: Arc::new(FillStatus::default()),
            proofs: ProofCounts::default(),
            freshness: fresh::Freshness::default(),
            storm: Storm::default(),
            stop,
        };
        (cached, rx)
    }

    /// Whether the cache writes its objects in protobuf too (the built-in kinds; a custom
    /// resource's only in JSON).
    pub fn writes_protobuf(&self) -> bool {
        self.cache.codec().protobuf.is_some()
    }
}

impl Drop for UpstreamCache {
    /// A resource no longer cached: its informer stops, and its watchers end with 410 (their
    /// next watch passes through, and the upstream answers it).
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        let next = self.cache.revision().saturating_add(1);
        self.cache.replace(&[], next, std::time::Instant::now());
    }
}

/// Consistent lists of one resource passed through per second before the rest are served
/// from the cache (proven fresh): a caller's occasional `kubectl get` goes upstream and
/// answers at once; informers relisting together share one proof instead.
pub const STORM_LISTS: u32 = 5;

/// How long a storm outlasts its last consistent list.
const STORM_QUIET: Duration = Duration::from_secs(1);

/// Consistent lists of one resource passed through at once: one more, arriving while these
/// are still answered upstream, is a storm's. A storm arrives within milliseconds, sooner
/// than [`STORM_LISTS`] lists are answered, so the rate alone let five through.
pub const STORM_PASSING: usize = 2;

/// Counts consistent lists per one-second window and those passed through and not yet
/// answered, and whether a storm is on. A storm (many clients at once) starts with the list
/// past [`STORM_PASSING`] in flight, and holds, window after window, until a second passes
/// without a consistent list: its later seconds pass none upstream. (Counted afresh each
/// second, a storm spread over three seconds by the clients' own pace had five lists a
/// second passed through, 15 lists of 1,000 objects that cost the upstream more than the
/// proofs of the other 1,985.) Lists one at a time past [`STORM_LISTS`] in a window (a
/// client polling) are the cache's for the rest of that window only: the upstream still
/// answers [`STORM_LISTS`] of them a second, and with them a revoked credential as soon as
/// the upstream refuses it.
#[derive(Default)]
pub struct Storm {
    window: parking_lot::Mutex<StormWindow>,
    passing: Arc<std::sync::atomic::AtomicUsize>,
}

#[derive(Default)]
struct StormWindow {
    start: Option<std::time::Instant>,
    count: u32,
    storming: bool,
    last: Option<std::time::Instant>,
}

/// A consistent list passed through, counted in flight until dropped (with its response).
#[derive(Debug)]
pub struct Passing(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Passing {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Storm {
    /// Counts a consistent list: `None` while a storm is on (this one is the cache's), else
    /// the pass-through's place in flight.
    pub fn arrived(&self) -> Option<Passing> {
        self.arrived_at(std::time::Instant::now())
    }

    fn arrived_at(&self, now: std::time::Instant) -> Option<Passing> {
        let mut w = self.window.lock();
        match w.start {
            Some(start) if now.saturating_duration_since(start) < Duration::from_secs(1) => {
                w.count = w.count.saturating_add(1);
            }
            _ => {
                let recent = w
                    .last
                    .is_some_and(|l| now.saturating_duration_since(l) < STORM_QUIET);
                w.storming = w.storming && recent;
                w.start = Some(now);
                w.count = 1;
            }
        }
        w.last = Some(now);
        if self.passing.load(Ordering::Relaxed) >= STORM_PASSING {
            w.storming = true;
        }
        if w.storming || w.count > STORM_LISTS {
            return None;
        }
        self.passing.fetch_add(1, Ordering::Relaxed);
        Some(Passing(self.passing.clone()))
    }
}

/// Every cached resource, by (group, resource).
pub struct UpstreamCaches {
    upstream: Upstream,
    filter: ResourceFilter,
    config: WatchCacheConfig,
    /// `--upstream-watch-idle-timeout`.
    idle: Duration,
    gate: Arc<WakeGate>,
    resources: RwLock<HashMap<(String, String), Arc<UpstreamCache>>>,
    /// Set once discovery has been tried (read or failed).
    discovered: std::sync::atomic::AtomicBool,
    /// Woken by the CRD informer: read discovery now.
    rediscover: Arc<Notify>,
    /// Where the caches were, kept for the next run (`upstream/resume.rs`).
    resume: Option<resume::ResumePoints>,
}

impl UpstreamCaches {
    /// `resume`: the points a previous run kept, and where to keep this run's (none: every
    /// cache starts from the newest state).
    pub fn new(
        upstream: Upstream,
        filter: ResourceFilter,
        config: WatchCacheConfig,
        idle: Duration,
        resume: Option<resume::ResumePoints>,
    ) -> Self {
        UpstreamCaches {
            resume,
            upstream,
            filter,
            idle,
            config: WatchCacheConfig {
                // Exact lists and continue tokens have no store to fall back on here.
                list_snapshots: true,
                ..config
            },
            gate: WakeGate::paced(super::WAKE_SLICE),
            resources: RwLock::new(HashMap::new()),
            discovered: std::sync::atomic::AtomicBool::new(false),
            rediscover: Arc::new(Notify::new()),
        }
    }

    /// The wake gate of every cache of the upstream, for the pacer task.
    pub fn gate(&self) -> &Arc<WakeGate> {
        &self.gate
    }

    /// The cached resource at (group, version, resource), if it is cached in that version.
    pub fn get(&self, group: &str, version: &str, resource: &str) -> Option<Arc<UpstreamCache>> {
        self.resources
            .read()
            .get(&(group.to_string(), resource.to_string()))
            .filter(|m| m.info.version == version)
            .cloned()
    }

    /// Waits until `m`'s cache is proven as fresh as the upstream is now (`upstream/fresh.rs`).
    pub async fn prove_fresh(&self, m: &UpstreamCache) -> Result<(), Unproven> {
        let bookmarks = m.status.bookmarks.load(Ordering::Relaxed);
        let proven = m
            .freshness
            .prove(&self.upstream, m.info, &m.cache, bookmarks)
            .await;
        m.proofs.count(&proven);
        proven
    }

    /// Waits until `m`'s cache holds the object `namespace`/`name` as the upstream's newest
    /// state has it (`upstream/fresh.rs` `prove_object`): the proof for a read of one object.
    pub async fn prove_object_fresh(
        &self,
        m: &UpstreamCache,
        namespace: &str,
        name: &str,
    ) -> Result<(), Unproven> {
        let proven = fresh::prove_object(&self.upstream, m.info, &m.cache, namespace, name).await;
        m.proofs.count(&proven);
        proven
    }

    /// The newest upstream revision any cache has reached: a revision the upstream surely
    /// has (each cache follows its own upstream watch, so one may be ahead of another).
    pub fn max_revision(&self) -> i64 {
        self.resources
            .read()
            .values()
            .map(|m| m.cache.revision())
            .max()
            .unwrap_or(0)
    }

    /// Whether discovery has been tried and every cache it chose has been filled once.
    pub fn synced(&self) -> Result<(), String> {
        if !self.discovered.load(Ordering::Acquire) {
            return Err("upstream discovery not tried yet".into());
        }
        let waiting: Vec<String> = self
            .resources
            .read()
            .values()
            .filter(|m| !m.status.synced.load(Ordering::Acquire))
            .map(|m| name_of(m.info))
            .collect();
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(format!("caches not filled yet: {}", waiting.join(", ")))
        }
    }

    /// Reads discovery and reconciles the informers until `stop` is set.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            match self.discover().await {
                Ok(found) => self.reconcile(found, &stop),
                Err(e) => tracing::warn!(error = %e, "reading upstream discovery failed"),
            }
            // Ready once tried: without discovery nothing is cached and everything passes
            // through, which the upstream check of `/readyz` covers.
            self.discovered.store(true, Ordering::Release);
            tokio::select! {
                _ = tokio::time::sleep(REDISCOVER) => {}
                _ = self.rediscover.notified() => {
                    // A CRD changed: give the upstream a moment to serve (or drop) it.
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                _ = crate::base::lifecycle::until_set(&mut stop) => {
                    self.resources.write().clear();
                    return;
                }
            }
        }
    }

    /// Keeps the caches' resume points (`upstream/resume.rs`) every [`resume::EVERY`] until
    /// `stop` is set; nothing without them.
    pub async fn keep_resume_points(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let Some(points) = &self.resume else {
            return;
        };
        let mut tick = tokio::time::interval(resume::EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = crate::base::lifecycle::until_set(&mut stop) => return,
            }
            let now = self
                .resources
                .read()
                .iter()
                .filter(|(_, m)| m.status.synced.load(Ordering::Acquire))
                .map(|(key, m)| {
                    let floor = m.status.filled_at.load(Ordering::Acquire);
                    (key.clone(), (m.cache.revision(), floor))
                })
                .collect();
            points.tick(std::time::Instant::now(), now);
        }
    }

    async fn discover(&self) -> Result<Vec<Discovered>, String> {
        let mut found = Vec::new();
        for path in ["/api", "/apis"] {
            let (status, body) = self
                .upstream
                .get(path, discovery::ACCEPT, MAX_DISCOVERY_BYTES, CALL_TIMEOUT)
                .await?;
            if !status.is_success() {
                return Err(format!("{path} answered {}", status.as_u16()));
            }
            found.extend(discovery::parse(&body)?);
        }
        Ok(found
            .into_iter()
            .filter(|d| self.filter.chooses(d))
            .collect())
    }

    fn reconcile(&self, found: Vec<Discovered>, stop: &watch::Receiver<bool>) {
        let mut resources = self.resources.write();
        let wanted: HashMap<(String, String), &'static ResourceInfo> = found
            .iter()
            .map(|d| ((d.group.clone(), d.resource.clone()), discovery::kind_of(d)))
            .collect();
        resources.retain(|key, m| {
            let keep = wanted
                .get(key)
                .is_some_and(|info| std::ptr::eq(*info, m.info));
            if !keep {
                tracing::info!(resource = %name_of(m.info), "no longer cached");
            }
            keep
        });
        for (key, info) in wanted {
            if resources.contains_key(&key) {
                continue;
            }
            let cache = WatchCache::with_gate(
                unstructured::codec(info),
                self.config.clone(),
                self.gate.clone(),
            );
            let (cached, rx) = UpstreamCache::new(info, cache);
            let is_crd =
                info.group == "apiextensions.k8s.io" && info.plural == "customresourcedefinitions";
            let source = UpstreamSource {
                upstream: self.upstream.clone(),
                info,
                status: cached.status.clone(),
                idle: self.idle,
                resume_from: self.resume.as_ref().and_then(|r| r.take(&key)),
                streaming: true,
            };
            let task = reflector::run(
                source,
                cached.cache.clone(),
                cached.status.clone(),
                is_crd.then(|| self.rediscover.clone()),
                merge_stop(rx, stop.clone()),
            );
            tokio::spawn(task);
            tracing::info!(resource = %name_of(info), version = info.version, "caching");
            resources.insert(key, Arc::new(cached));
        }
    }

    /// The caches' metrics, read at each scrape, one series per cached resource.
    pub fn collector(self: &Arc<Self>) -> Box<dyn Collector> {
        Box::new(UpstreamCollector(Arc::clone(self)))
    }
}

/// The labels of a cached resource's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    group: &'static str,
    version: &'static str,
    resource: &'static str,
}

/// One family of the caches' metrics: name (a counter's without `_total`), help, and its
/// value for a resource.
type Series<T> = (&'static str, &'static str, fn(&UpstreamCache) -> T);

const GAUGES: [Series<f64>; 5] = [
    (
        "svc_proxy_cache_objects",
        "Objects held in the proxy's cache of a resource.",
        |m| m.cache.stats().objects as f64,
    ),
    (
        "svc_proxy_cache_watchers",
        "Watchers served from the proxy's cache of a resource.",
        |m| m.cache.stats().watchers as f64,
    ),
    (
        "svc_proxy_cache_lag_seconds",
        "Seconds since the upstream last sent an event, bookmark or list of a resource.",
        |m| m.status.silence(),
    ),
    (
        "svc_proxy_cache_resource_version",
        "The upstream resourceVersion the proxy's cache of a resource has reached.",
        |m| m.cache.revision() as f64,
    ),
    (
        "svc_proxy_upstream_watches",
        "Upstream watches open for a resource (0 or 1).",
        |m| u8::from(m.status.watching.load(Ordering::Relaxed)).into(),
    ),
];

const COUNTERS: [Series<u64>; 4] = [
    (
        "svc_proxy_freshness_proofs",
        "Proofs that a resource's cache is as fresh as the upstream, for reads from its newest state.",
        |m| m.proofs.asked.load(Ordering::Relaxed),
    ),
    (
        "svc_proxy_freshness_proofs_failed",
        "Proofs of freshness the upstream could not give: their reads passed through to it.",
        |m| m.proofs.refused.load(Ordering::Relaxed),
    ),
    (
        "svc_proxy_freshness_proofs_busy",
        "Proofs of freshness the upstream was too busy to give in time: their reads were answered 429 to try again.",
        |m| m.proofs.busy.load(Ordering::Relaxed),
    ),
    (
        "svc_proxy_upstream_lists",
        "Full upstream lists read for a resource (the first fill and each relist).",
        |m| m.status.lists.load(Ordering::Relaxed),
    ),
];

struct UpstreamCollector(Arc<UpstreamCaches>);

impl std::fmt::Debug for UpstreamCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpstreamCollector")
    }
}

impl Collector for UpstreamCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let rows: Vec<Arc<UpstreamCache>> = {
            let resources = self.0.resources.read();
            let mut rows: Vec<Arc<UpstreamCache>> = resources.values().cloned().collect();
            rows.sort_by_key(|m| (m.info.group, m.info.plural));
            rows
        };
        let labels = |m: &UpstreamCache| ResourceLabels {
            group: m.info.group,
            version: m.info.version,
            resource: m.info.plural,
        };
        for (name, help, value) in GAUGES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for m in &rows {
                ConstGauge::new(value(m)).encode(family.encode_family(&labels(m))?)?;
            }
        }
        for (name, help, value) in COUNTERS {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for m in &rows {
                ConstCounter::new(value(m)).encode(family.encode_family(&labels(m))?)?;
            }
        }
        Ok(())
    }
}

fn name_of(info: &ResourceInfo) -> String {
    if info.group.is_empty() {
        info.plural.to_string()
    } else {
        format!("{}.{}", info.plural, info.group)
    }
}

/// A stop signal set when either `a` (the resource was dropped) or `b` (the server stops) is.
fn merge_stop(mut a: watch::Receiver<bool>, mut b: watch::Receiver<bool>) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = crate::base::lifecycle::until_set(&mut a) => {}
            _ = crate::base::lifecycle::until_set(&mut b) => {}
            _ = tx.closed() => return,
        }
        let _ = tx.send(true);
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_one_at_a_time_past_the_rate_are_the_caches_for_the_rest_of_that_second() {
        let storm = Storm::default();
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Each answered before the next arrives: only the rate counts.
        let first: Vec<bool> = (0..=STORM_LISTS)
            .map(|i| storm.arrived_at(at(u64::from(i) * 80)).is_none())
            .collect();
        assert!(first[..STORM_LISTS as usize].iter().all(|s| !s));
        assert!(
            first[STORM_LISTS as usize],
            "the list past the limit is the cache's"
        );
        assert!(storm.arrived_at(at(900)).is_none());
        // The next second passes its first lists upstream again.
        assert!(storm.arrived_at(at(1_100)).is_some());
        // A window of few lists, never a storm.
        let quiet = Storm::default();
        assert!((0..STORM_LISTS).all(|i| quiet.arrived_at(at(u64::from(i) * 150)).is_some()));
        assert!(quiet.arrived_at(at(1_000)).is_some());
    }

    #[test]
    fn a_list_arriving_while_two_are_answered_upstream_is_a_storms() {
        let storm = Storm::default();
        let t0 = std::time::Instant::now();
        let a = storm.arrived_at(t0).expect("passed");
        let b = storm.arrived_at(t0).expect("passed");
        assert!(storm.arrived_at(t0).is_none(), "a third at once");
        // The storm holds after they are answered, window after window while lists keep
        // coming, until a quiet second.
        drop((a, b));
        assert!(storm.arrived_at(t0 + Duration::from_millis(500)).is_none());
        assert!(
            storm
                .arrived_at(t0 + Duration::from_millis(1_100))
                .is_none()
        );
        assert!(
            storm
                .arrived_at(t0 + Duration::from_millis(1_900))
                .is_none()
        );
        assert!(
            storm
                .arrived_at(t0 + Duration::from_millis(3_000))
                .is_some()
        );
        // Two at once, answered, and two more: no storm.
        let calm = Storm::default();
        for i in 0..2u64 {
            let now = t0 + Duration::from_millis(300 * i);
            let pair = (calm.arrived_at(now), calm.arrived_at(now));
            assert!(pair.0.is_some() && pair.1.is_some());
        }
    }
}
