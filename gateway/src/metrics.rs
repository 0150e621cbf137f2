//! Prometheus metrics served at `/metrics`: requests by verb, resource and code with latency
//! histograms, and open watches.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    pub resource: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub verb: String,
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<LatencyLabels, Histogram>,
    pub watches: Family<ResourceLabels, Gauge<i64, std::sync::atomic::AtomicI64>>,
    pub watch_events: Family<ResourceLabels, Counter<u64, AtomicU64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("apiserver");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "request",
            "Requests by verb, resource and HTTP response code",
            requests.clone(),
        );
        let latency = Family::<LatencyLabels, Histogram>::new_with_constructor(|| {
            // 1 ms .. ~65 s
            Histogram::new(exponential_buckets(0.001, 2.0, 17))
        });
        registry.register(
            "request_duration_seconds",
            "Response latency by verb and resource (watches: time to first byte)",
            latency.clone(),
        );
        let watches = Family::default();
        registry.register(
            "registered_watchers",
            "Open watch streams by resource",
            watches.clone(),
        );
        let watch_events = Family::default();
        registry.register(
            "watch_events_sent",
            "Watch events sent to clients, by resource",
            watch_events.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            watches,
            watch_events,
        }
    }

    pub fn observe(&self, verb: &str, resource: &str, code: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.into(),
                resource: resource.into(),
                code: code.to_string(),
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                verb: verb.into(),
                resource: resource.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    pub fn watch_gauge(&self, resource: &str) -> Gauge<i64, std::sync::atomic::AtomicI64> {
        self.watches
            .get_or_create(&ResourceLabels {
                resource: resource.into(),
            })
            .clone()
    }

    pub fn watch_event_counter(&self, resource: &str) -> Counter<u64, AtomicU64> {
        self.watch_events
            .get_or_create(&ResourceLabels {
                resource: resource.into(),
            })
            .clone()
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
