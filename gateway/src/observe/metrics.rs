//! Prometheus metrics at `/metrics`, encoded by `prometheus-client` as OpenMetrics text, with
//! kube-apiserver's names, labels and buckets so its dashboards work: requests and their
//! latency, requests in flight, open watches and the events sent to them, storage calls
//! (`store`), and declarative validation mismatches. The watch caches add theirs at scrape
//! time through a collector (`caches.rs`). README.md's "Metrics" section lists every family.

pub mod authz;
pub mod caches;
pub mod flow;
pub mod store;
pub mod striped;

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use svc_core::ResourceInfo;

use striped::{SizeHistogram, StripedCounter};

use crate::base::query::Query;
use crate::base::router::Route;
use crate::base::verb::Verb;

/// The one exposition format served: what `prometheus-client` writes. Prometheus asks for it
/// first, and Python's `prometheus_client.openmetrics.parser` reads it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `component` label of request metrics, as kube-apiserver sets it.
const COMPONENT: &str = "apiserver";

/// kube-apiserver's buckets for `apiserver_request_duration_seconds` and
/// `etcd_request_duration_seconds` (chosen there for the API call latency SLOs).
pub const LATENCY_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

/// kube-apiserver's buckets for `apiserver_watch_events_sizes`: 1 KiB, 2 KiB, ... 128 KiB.
pub const WATCH_EVENT_SIZE_BUCKETS: [f64; 8] = [
    1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    verb: &'static str,
    dry_run: String,
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    subresource: String,
    scope: &'static str,
    component: &'static str,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    verb: &'static str,
    dry_run: String,
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    subresource: String,
    scope: &'static str,
    component: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InflightLabels {
    request_kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LongRunningLabels {
    verb: &'static str,
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    subresource: &'static str,
    scope: &'static str,
    component: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
}

/// A cached read of proxy mode: which resource, which verb.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheReadLabels {
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    group: &'static str,
    version: &'static str,
    resource: &'static str,
}

/// What the request metrics need to know about one request, worked out as it enters.
#[derive(Clone, Debug)]
pub struct RequestInfo {
    labels: LatencyLabels,
    /// `readOnly` or `mutating`; None for long-running requests (watches), which
    /// kube-apiserver leaves out of the in-flight count too.
    request_kind: Option<&'static str>,
}

impl RequestInfo {
    /// Labels the way kube-apiserver does (`CleanVerb`, `CleanScope`, `cleanDryRun`): verbs
    /// are upper case, GET of a collection is LIST, `watch=true` is WATCH, an apply patch is
    /// APPLY; scope is `resource` for a named object or a create, else `namespace` or
    /// `cluster`; requests outside the resource API have empty group, version and resource.
    pub fn new(
        verb: Verb,
        method: &Method,
        route: &Route,
        query: &Query,
        headers: &HeaderMap,
    ) -> Self {
        let resource = match route {
            Route::Resource(r) => Some(r),
            _ => None,
        };
        let scope = match resource {
            Some(r) if r.name.is_some() || method == Method::POST => "resource",
            Some(r) if !r.namespace.is_empty() => "namespace",
            Some(_) => "cluster",
            None => "",
        };
        let is_apply = || {
            headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(';').next())
                .is_some_and(|ct| ct.trim().starts_with("application/apply-patch+"))
        };
        let known = matches!(
            *method,
            Method::GET
                | Method::HEAD
                | Method::POST
                | Method::PUT
                | Method::PATCH
                | Method::DELETE
        );
        let request_kind = match verb {
            Verb::Watch => None,
            v if v.is_mutating() => Some("mutating"),
            _ => Some("readOnly"),
        };
        let verb = if known {
            verb.metric_label(verb == Verb::Patch && is_apply())
        } else {
            "other"
        };
        RequestInfo {
            labels: LatencyLabels {
                verb,
                dry_run: dry_run_label(query),
                group: resource.map_or("", |r| r.info.group),
                version: resource.map_or("", |r| r.info.version),
                resource: resource.map_or("", |r| r.info.plural),
                subresource: resource
                    .and_then(|r| r.subresource.clone())
                    .unwrap_or_default(),
                scope,
                component: COMPONENT,
            },
            request_kind,
        }
    }
}

/// kube-apiserver's `dry_run` label: the distinct values, sorted and comma-joined; `invalid`
/// when one is not `All`; empty without the parameter.
fn dry_run_label(query: &Query) -> String {
    let mut values = query.get_all("dryRun");
    if values.iter().any(|v| *v != "All") {
        return "invalid".into();
    }
    values.sort_unstable();
    values.dedup();
    values.join(",")
}

/// Every metric the gateway records itself. Cheap to share: each family is reference-counted.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram>,
    inflight: Family<InflightLabels, Gauge>,
    longrunning: Family<LongRunningLabels, Gauge>,
    registered_watchers: Family<KindLabels, Gauge>,
    watch_events: Family<ResourceLabels, StripedCounter>,
    watch_event_sizes: Family<ResourceLabels, SizeHistogram>,
    /// Lists and watches proxy mode served from its caches.
    proxy_cache_reads: Family<CacheReadLabels, Counter>,
    /// Storage call latency and counts, recorded by [`store::InstrumentedStore`].
    pub store: store::StoreMetrics,
    /// Authorization decisions, webhook calls and configuration reloads.
    pub authz: authz::AuthzMetrics,
    validation_mismatches: Counter,
    /// `svc_tls_handshakes_total`, by how each ended ([`Handshake`]).
    tls_handshakes: [Counter; 4],
    /// `apiserver_audit_*`.
    pub audit: AuditMetrics,
}

/// How a TLS handshake ended.
#[derive(Clone, Copy, Debug)]
pub enum Handshake {
    Done = 0,
    Failed = 1,
    TimedOut = 2,
    /// Done by resuming a session (a ticket the client offered back).
    Resumed = 3,
}

impl Handshake {
    fn label(self) -> &'static str {
        match self {
            Handshake::Done => "done",
            Handshake::Failed => "failed",
            Handshake::TimedOut => "timed_out",
            Handshake::Resumed => "resumed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandshakeLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    plugin: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LevelLabels {
    level: &'static str,
}

/// The audit families, with kube-apiserver's names.
#[derive(Clone, Debug)]
pub struct AuditMetrics {
    /// `apiserver_audit_event_total`: events generated and sent to the backends.
    pub events: Counter,
    errors: Family<PluginLabels, Counter>,
    /// `apiserver_audit_level_total`, one counter per level (one per request).
    levels: [Counter; 4],
}

impl AuditMetrics {
    fn register(registry: &mut Registry) -> Self {
        let events = Counter::default();
        registry.register(
            "apiserver_audit_event",
            "Counter of audit events generated and sent to the audit backend.",
            events.clone(),
        );
        let errors = Family::<PluginLabels, Counter>::default();
        registry.register(
            "apiserver_audit_error",
            "Counter of audit events that failed to be audited properly. Plugin identifies \
             the plugin affected by the error.",
            errors.clone(),
        );
        let level_family = Family::<LevelLabels, Counter>::default();
        registry.register(
            "apiserver_audit_level",
            "Counter of policy levels for audit events (1 per request).",
            level_family.clone(),
        );
        let levels = svc_config::audit::Level::ALL
            .map(|level| level_family.get_or_create_owned(&LevelLabels { level }));
        AuditMetrics {
            events,
            errors,
            levels,
        }
    }

    /// `apiserver_audit_error_total{plugin}`.
    pub fn errors(&self, plugin: &'static str) -> Counter {
        self.errors.get_or_create_owned(&PluginLabels { plugin })
    }

    pub fn level(&self, level: svc_config::audit::Level) -> &Counter {
        use svc_config::audit::Level;
        let [none, metadata, request, request_response] = &self.levels;
        match level {
            Level::None => none,
            Level::Metadata => metadata,
            Level::Request => request,
            Level::RequestResponse => request_response,
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Standalone mode's metrics: the requests', the watches', the store's, authorization's,
    /// validation's, audit's and the TLS handshakes'.
    pub fn new() -> Self {
        Self::build(false)
    }

    /// Proxy mode's: those of requests, watches (with the reads its caches served) and TLS
    /// handshakes. A proxy has no store, authorizer, validation or audit: their families are
    /// kept out of its registry, so its `/metrics` lists only what it runs.
    pub fn for_proxy() -> Self {
        Self::build(true)
    }

    fn build(proxy: bool) -> Self {
        let mut registry = Registry::default();
        // Where the families of the other mode go: nowhere that is scraped.
        let mut unlisted = Registry::default();
        // Counters get their `_total` suffix from the encoder.
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, dry run value, group, \
             version, resource, scope, component, and HTTP response code",
            requests.clone(),
        );
        let latency = Family::<LatencyLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(LATENCY_BUCKETS)
        });
        registry.register(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb, dry run value, group, \
             version, resource, subresource, scope and component (watches: until the response \
             headers)",
            latency.clone(),
        );
        let inflight = Family::<InflightLabels, Gauge>::default();
        for kind in ["readOnly", "mutating"] {
            inflight.get_or_create_owned(&InflightLabels { request_kind: kind });
        }
        registry.register(
            "apiserver_current_inflight_requests",
            "Requests being served now per request kind (long-running requests excluded)",
            inflight.clone(),
        );
        let longrunning = Family::<LongRunningLabels, Gauge>::default();
        registry.register(
            "apiserver_longrunning_requests",
            "Gauge of all active long-running apiserver requests broken out by verb, group, \
             version, resource, scope and component",
            longrunning.clone(),
        );
        let registered_watchers = Family::<KindLabels, Gauge>::default();
        registry.register(
            "apiserver_registered_watchers",
            "Number of currently registered watchers for a given resource",
            registered_watchers.clone(),
        );
        let watch_events = Family::<ResourceLabels, StripedCounter>::default();
        registry.register(
            "apiserver_watch_events",
            "Number of events sent in watch clients",
            watch_events.clone(),
        );
        let watch_event_sizes =
            Family::<ResourceLabels, SizeHistogram>::new_with_constructor(|| {
                SizeHistogram::new(&WATCH_EVENT_SIZE_BUCKETS)
            });
        registry.register(
            "apiserver_watch_events_sizes",
            "Watch event size distribution in bytes",
            watch_event_sizes.clone(),
        );
        let (proxy_only, standalone_only) = if proxy {
            (&mut registry, &mut unlisted)
        } else {
            (&mut unlisted, &mut registry)
        };
        let proxy_cache_reads = Family::<CacheReadLabels, Counter>::default();
        proxy_only.register(
            "svc_proxy_cache_reads",
            "Lists and watches a proxy served from its cache of the upstream",
            proxy_cache_reads.clone(),
        );
        let store = store::StoreMetrics::register(standalone_only);
        let authz = authz::AuthzMetrics::register(standalone_only);
        let audit = AuditMetrics::register(standalone_only);
        let validation_mismatches = Counter::default();
        standalone_only.register(
            "declarative_validation_mismatch",
            "Number of times declarative validation results differed from handwritten \
             validation results",
            validation_mismatches.clone(),
        );
        let handshakes = Family::<HandshakeLabels, Counter>::default();
        let tls_handshakes = [
            Handshake::Done,
            Handshake::Failed,
            Handshake::TimedOut,
            Handshake::Resumed,
        ]
        .map(|h| handshakes.get_or_create_owned(&HandshakeLabels { result: h.label() }));
        registry.register(
            "svc_tls_handshakes",
            "TLS handshakes of accepted connections, by result: done (in full), resumed (a \
             session ticket offered back), failed (bad TLS, or a client that could not prove \
             its key) or timed_out (--tls-handshake-timeout)",
            handshakes,
        );
        Metrics {
            tls_handshakes,
            audit,
            registry,
            requests,
            latency,
            inflight,
            longrunning,
            registered_watchers,
            watch_events,
            watch_event_sizes,
            proxy_cache_reads,
            store,
            authz,
            validation_mismatches,
        }
    }

    /// Adds metrics computed at scrape time (the watch caches').
    /// Registers a metric another module owns (traces' dropped spans).
    pub fn register(
        &mut self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        self.registry.register(name, help, metric);
    }

    pub fn register_collector(&mut self, collector: Box<dyn Collector>) {
        self.registry.register_collector(collector);
    }

    /// The registry, for modules that register their own families while the server is built.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Counts a request in flight until the guard is dropped (none for watches).
    pub fn start(&self, info: &RequestInfo) -> Inflight {
        Inflight(info.request_kind.map(|kind| {
            let g = self
                .inflight
                .get_or_create_owned(&InflightLabels { request_kind: kind });
            g.inc();
            g
        }))
    }

    /// Records a served request.
    pub fn observe(&self, info: &RequestInfo, code: u16, elapsed: Duration) {
        let l = &info.labels;
        self.requests
            .get_or_create(&RequestLabels {
                verb: l.verb,
                dry_run: l.dry_run.clone(),
                group: l.group,
                version: l.version,
                resource: l.resource,
                subresource: l.subresource.clone(),
                scope: l.scope,
                component: l.component,
                code,
            })
            .inc();
        self.latency.get_or_create(l).observe(elapsed.as_secs_f64());
    }

    /// Counts an open watch of `info`'s type until the guard is dropped.
    pub fn watch_opened(&self, info: &'static ResourceInfo, namespaced: bool) -> OpenWatch {
        let watchers = self.registered_watchers.get_or_create_owned(&KindLabels {
            group: info.group,
            version: info.version,
            kind: info.kind,
        });
        let longrunning = self.longrunning.get_or_create_owned(&LongRunningLabels {
            verb: "WATCH",
            group: info.group,
            version: info.version,
            resource: info.plural,
            subresource: "",
            scope: if namespaced { "namespace" } else { "cluster" },
            component: COMPONENT,
        });
        watchers.inc();
        longrunning.inc();
        OpenWatch {
            watchers,
            longrunning,
        }
    }

    /// The event count and sizes of watches of `info`'s type.
    /// Counts a list or watch proxy mode served from its cache.
    pub fn proxy_cache_read(&self, info: &'static ResourceInfo, verb: &'static str) {
        self.proxy_cache_reads
            .get_or_create(&CacheReadLabels {
                group: info.group,
                version: info.version,
                resource: info.plural,
                verb,
            })
            .inc();
    }

    pub fn watch_events(&self, info: &'static ResourceInfo) -> WatchEvents {
        let labels = ResourceLabels {
            group: info.group,
            version: info.version,
            resource: info.plural,
        };
        WatchEvents {
            count: self.watch_events.get_or_create_owned(&labels),
            sizes: self.watch_event_sizes.get_or_create_owned(&labels),
        }
    }

    /// One TLS handshake ended so.
    pub fn tls_handshake(&self, result: Handshake) {
        if let Some(c) = self.tls_handshakes.get(result as usize) {
            c.inc();
        }
    }

    /// `declarative_validation_mismatch_total`.
    pub fn validation_mismatches(&self) -> Counter {
        self.validation_mismatches.clone()
    }

    /// The exposition, in [`CONTENT_TYPE`].
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics");
            out.clear();
        }
        out
    }
}

/// A request counted in `apiserver_current_inflight_requests` while this lives.
pub struct Inflight(Option<Gauge>);

impl Drop for Inflight {
    fn drop(&mut self) {
        if let Some(g) = &self.0 {
            g.dec();
        }
    }
}

/// A watch counted in `apiserver_registered_watchers` and `apiserver_longrunning_requests`
/// while this lives.
pub struct OpenWatch {
    watchers: Gauge,
    longrunning: Gauge,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.watchers.dec();
        self.longrunning.dec();
    }
}

/// `apiserver_watch_events_total` and `apiserver_watch_events_sizes` of one type.
#[derive(Clone, Debug)]
pub struct WatchEvents {
    count: StripedCounter,
    sizes: SizeHistogram,
}

impl WatchEvents {
    /// Records frames written to one watcher: a handful of atomic adds per batch.
    pub fn record(&self, frames: &[Bytes]) {
        self.count.inc_by(frames.len() as u64);
        self.sizes.observe_all(frames.iter().map(Bytes::len));
    }

    /// Records the same frames written to `times` watchers.
    pub fn record_times(&self, frames: &[Bytes], times: usize) {
        if times == 0 {
            return;
        }
        self.count
            .inc_by((frames.len() as u64).saturating_mul(times as u64));
        self.sizes.observe_all(
            frames
                .iter()
                .flat_map(|f| std::iter::repeat_n(f.len(), times)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::router;

    fn info(method: Method, path: &str, ct: Option<&str>) -> LatencyLabels {
        let (path, q) = path.split_once('?').unwrap_or((path, ""));
        let query = Query::parse(Some(q));
        let mut headers = HeaderMap::new();
        if let Some(ct) = ct {
            headers.insert(http::header::CONTENT_TYPE, ct.parse().unwrap());
        }
        let watch = query.bool("watch").unwrap_or(false);
        let route = router::route(path);
        let verb = Verb::of(&method, &route, watch);
        RequestInfo::new(verb, &method, &route, &query, &headers).labels
    }

    #[test]
    fn labels_follow_kube_apiserver() {
        let sa = "/api/v1/namespaces/a/serviceaccounts";
        let l = info(Method::GET, sa, None);
        assert_eq!(
            (l.verb, l.scope, l.resource, l.version),
            ("LIST", "namespace", "serviceaccounts", "v1")
        );
        let l = info(Method::GET, &format!("{sa}/x"), None);
        assert_eq!((l.verb, l.scope), ("GET", "resource"));
        let l = info(Method::GET, "/api/v1/serviceaccounts?watch=true", None);
        assert_eq!((l.verb, l.scope), ("WATCH", "cluster"));
        let l = info(Method::POST, &format!("{sa}?dryRun=All"), None);
        assert_eq!(
            (l.verb, l.scope, l.dry_run.as_str()),
            ("POST", "resource", "All")
        );
        let l = info(Method::POST, &format!("{sa}?dryRun=Some"), None);
        assert_eq!(l.dry_run, "invalid");
        let l = info(
            Method::PATCH,
            &format!("{sa}/x"),
            Some("application/apply-patch+yaml"),
        );
        assert_eq!(l.verb, "APPLY");
        let l = info(
            Method::PATCH,
            &format!("{sa}/x"),
            Some("application/merge-patch+json"),
        );
        assert_eq!(l.verb, "PATCH");
        let l = info(Method::DELETE, sa, None);
        assert_eq!((l.verb, l.scope), ("DELETE", "namespace"));
        let l = info(Method::GET, "/healthz", None);
        assert_eq!((l.verb, l.scope, l.resource, l.group), ("GET", "", "", ""));
    }
}
