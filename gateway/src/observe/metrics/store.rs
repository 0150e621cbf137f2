//! Storage call metrics with kube-apiserver's names (`etcd_request_duration_seconds`,
//! `etcd_requests_total`, `etcd_request_errors_total`), whatever the backend: a `Store` that
//! times every call of the store it wraps, and with tracing on makes each call made for a
//! traced request a span (the embedded store's group commit or the etcd round trip). Storage
//! itself knows nothing of metrics or traces.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use svc_core::registry;
use svc_storage::{FeedStream, KeyRange, KeyValue, RangeResult, Revision, Store, StoreError};

use super::LATENCY_BUCKETS;
use crate::observe::trace::{self, Tracer};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    operation: &'static str,
    group: &'static str,
    resource: &'static str,
}

/// The storage families, shared by the registry and the wrapper.
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    latency: Family<StoreLabels, Histogram>,
    requests: Family<StoreLabels, Counter>,
    errors: Family<StoreLabels, Counter>,
}

impl StoreMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let latency = Family::<StoreLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(LATENCY_BUCKETS)
        });
        registry.register(
            "etcd_request_duration_seconds",
            "Etcd request latency in seconds for each operation and object type",
            latency.clone(),
        );
        let requests = Family::<StoreLabels, Counter>::default();
        registry.register(
            "etcd_requests",
            "Etcd request counts for each operation and object type",
            requests.clone(),
        );
        let errors = Family::<StoreLabels, Counter>::default();
        registry.register(
            "etcd_request_errors",
            "Etcd failed request counts for each operation and object type",
            errors.clone(),
        );
        StoreMetrics {
            latency,
            requests,
            errors,
        }
    }

    fn record(&self, labels: &StoreLabels, start: Instant, failed: bool) {
        self.latency
            .get_or_create(labels)
            .observe(start.elapsed().as_secs_f64());
        self.requests.get_or_create(labels).inc();
        if failed {
            self.errors.get_or_create(labels).inc();
        }
    }
}

/// The group and resource a key belongs to (`/registry/<plural>/...`); empty for keys of no
/// served type.
fn resource_of(key: &[u8]) -> (&'static str, &'static str) {
    let plural = key
        .strip_prefix(b"/registry/")
        .and_then(|rest| rest.split(|b| *b == b'/').next())
        .unwrap_or_default();
    registry::all()
        .iter()
        .find(|r| r.plural.as_bytes() == plural)
        .map_or(("", ""), |r| (r.group, r.plural))
}

/// The span of a store call: the operation, named as the metrics name it.
fn span_name(operation: &'static str) -> &'static str {
    match operation {
        "create" => "store create",
        "update" => "store update",
        "delete" => "store delete",
        "get" => "store get",
        "list" => "store list",
        "getCurrentResourceVersion" => "store getCurrentResourceVersion",
        "getCompactedRevision" => "store getCompactedRevision",
        "compact" => "store compact",
        _ => "store",
    }
}

/// Whether a result counts as a failed request. A missing key, an existing one on create and a
/// revision mismatch are answers, not failures (etcd reports them as such too).
fn failed<T>(r: &Result<T, StoreError>) -> bool {
    matches!(
        r,
        Err(e) if !matches!(
            e,
            StoreError::NotFound | StoreError::AlreadyExists { .. } | StoreError::Conflict { .. }
        )
    )
}

/// Times every call of the store it wraps. Operations are named as kube-apiserver's etcd3
/// store names them: `get`, `list`, `create`, `update`, `delete`,
/// `getCurrentResourceVersion`, plus `getCompactedRevision` and `compact`.
pub struct InstrumentedStore {
    inner: Arc<dyn Store>,
    metrics: StoreMetrics,
    tracer: Option<Tracer>,
}

impl InstrumentedStore {
    pub fn wrap(
        inner: Arc<dyn Store>,
        metrics: StoreMetrics,
        tracer: Option<Tracer>,
    ) -> Arc<dyn Store> {
        Arc::new(InstrumentedStore {
            inner,
            metrics,
            tracer,
        })
    }

    /// Times `fut` as `operation` on `key` and, inside a traced request, makes it a span.
    async fn call<T>(
        &self,
        operation: &'static str,
        key: &[u8],
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let (labels, start) = (Self::labels(operation, key), Instant::now());
        let r = trace::in_span(
            self.tracer.as_ref(),
            span_name(operation),
            || {
                vec![
                    opentelemetry::KeyValue::new("operation", operation),
                    opentelemetry::KeyValue::new("resource", labels.resource),
                    opentelemetry::KeyValue::new("key", String::from_utf8_lossy(key).into_owned()),
                ]
            },
            fut,
            |r| {
                failed(r)
                    .then(|| r.as_ref().err().map(ToString::to_string))
                    .flatten()
            },
        )
        .await;
        self.done(labels, start, r)
    }

    fn labels(operation: &'static str, key: &[u8]) -> StoreLabels {
        let (group, resource) = resource_of(key);
        StoreLabels {
            operation,
            group,
            resource,
        }
    }

    fn done<T>(
        &self,
        labels: StoreLabels,
        start: Instant,
        r: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.metrics.record(&labels, start, failed(&r));
        r
    }
}

#[async_trait]
impl Store for InstrumentedStore {
    async fn create(&self, key: Bytes, value: Bytes) -> Result<KeyValue, StoreError> {
        let k = key.clone();
        self.call("create", &k, self.inner.create(key, value)).await
    }

    async fn update(
        &self,
        key: Bytes,
        value: Bytes,
        expected: Revision,
    ) -> Result<KeyValue, StoreError> {
        let k = key.clone();
        self.call("update", &k, self.inner.update(key, value, expected))
            .await
    }

    /// Timed as `create` (kube-apiserver names a create with a TTL the same).
    async fn create_with_ttl(
        &self,
        key: Bytes,
        value: Bytes,
        ttl: Duration,
    ) -> Result<KeyValue, StoreError> {
        let k = key.clone();
        self.call("create", &k, self.inner.create_with_ttl(key, value, ttl))
            .await
    }

    /// Timed as `update`.
    async fn update_with_ttl(
        &self,
        key: Bytes,
        value: Bytes,
        expected: Revision,
        ttl: Duration,
    ) -> Result<KeyValue, StoreError> {
        let k = key.clone();
        self.call(
            "update",
            &k,
            self.inner.update_with_ttl(key, value, expected, ttl),
        )
        .await
    }

    async fn delete(
        &self,
        key: Bytes,
        expected: Option<Revision>,
    ) -> Result<(KeyValue, Revision), StoreError> {
        let k = key.clone();
        self.call("delete", &k, self.inner.delete(key, expected))
            .await
    }

    async fn get(
        &self,
        key: Bytes,
        at: Option<Revision>,
    ) -> Result<(Option<KeyValue>, Revision), StoreError> {
        let k = key.clone();
        self.call("get", &k, self.inner.get(key, at)).await
    }

    async fn range(
        &self,
        range: KeyRange,
        at: Option<Revision>,
        limit: usize,
    ) -> Result<RangeResult, StoreError> {
        let k = range.start.clone();
        self.call("list", &k, self.inner.range(range, at, limit))
            .await
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        self.call(
            "getCurrentResourceVersion",
            b"",
            self.inner.current_revision(),
        )
        .await
    }

    async fn compacted_revision(&self) -> Result<Revision, StoreError> {
        self.call("getCompactedRevision", b"", self.inner.compacted_revision())
            .await
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        self.call("compact", b"", self.inner.compact(revision))
            .await
    }

    /// Feeds are long-lived streams, not requests: passed through untimed.
    fn watch(&self, range: KeyRange, after: Revision) -> FeedStream {
        self.inner.watch(range, after)
    }

    async fn health(&self) -> Result<(), StoreError> {
        self.inner.health().await
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.inner.ready().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_resource() {
        assert_eq!(
            resource_of(b"/registry/serviceaccounts/ns/a"),
            ("", "serviceaccounts")
        );
        assert_eq!(resource_of(b"/registry/namespaces/"), ("", "namespaces"));
        assert_eq!(resource_of(b"/registry/namespacesx/a"), ("", ""));
        assert_eq!(resource_of(b"/other"), ("", ""));
        assert!(!failed::<()>(&Err(StoreError::NotFound)));
        assert!(failed::<()>(&Err(StoreError::Closed)));
    }
}
