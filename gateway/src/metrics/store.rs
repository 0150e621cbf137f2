//! Storage call metrics with kube-apiserver's names (`etcd_request_duration_seconds`,
//! `etcd_requests_total`, `etcd_request_errors_total`), whatever the backend: a `Store` that
//! times every call of the store it wraps. Storage itself knows nothing of metrics.

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
}

impl InstrumentedStore {
    pub fn wrap(inner: Arc<dyn Store>, metrics: StoreMetrics) -> Arc<dyn Store> {
        Arc::new(InstrumentedStore { inner, metrics })
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
        let (labels, start) = (Self::labels("create", &key), Instant::now());
        let r = self.inner.create(key, value).await;
        self.done(labels, start, r)
    }

    async fn update(
        &self,
        key: Bytes,
        value: Bytes,
        expected: Revision,
    ) -> Result<KeyValue, StoreError> {
        let (labels, start) = (Self::labels("update", &key), Instant::now());
        let r = self.inner.update(key, value, expected).await;
        self.done(labels, start, r)
    }

    /// Timed as `create` (kube-apiserver names a create with a TTL the same).
    async fn create_with_ttl(
        &self,
        key: Bytes,
        value: Bytes,
        ttl: Duration,
    ) -> Result<KeyValue, StoreError> {
        let (labels, start) = (Self::labels("create", &key), Instant::now());
        let r = self.inner.create_with_ttl(key, value, ttl).await;
        self.done(labels, start, r)
    }

    /// Timed as `update`.
    async fn update_with_ttl(
        &self,
        key: Bytes,
        value: Bytes,
        expected: Revision,
        ttl: Duration,
    ) -> Result<KeyValue, StoreError> {
        let (labels, start) = (Self::labels("update", &key), Instant::now());
        let r = self.inner.update_with_ttl(key, value, expected, ttl).await;
        self.done(labels, start, r)
    }

    async fn delete(
        &self,
        key: Bytes,
        expected: Option<Revision>,
    ) -> Result<(KeyValue, Revision), StoreError> {
        let (labels, start) = (Self::labels("delete", &key), Instant::now());
        let r = self.inner.delete(key, expected).await;
        self.done(labels, start, r)
    }

    async fn get(
        &self,
        key: Bytes,
        at: Option<Revision>,
    ) -> Result<(Option<KeyValue>, Revision), StoreError> {
        let (labels, start) = (Self::labels("get", &key), Instant::now());
        let r = self.inner.get(key, at).await;
        self.done(labels, start, r)
    }

    async fn range(
        &self,
        range: KeyRange,
        at: Option<Revision>,
        limit: usize,
    ) -> Result<RangeResult, StoreError> {
        let (labels, start) = (Self::labels("list", &range.start), Instant::now());
        let r = self.inner.range(range, at, limit).await;
        self.done(labels, start, r)
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        let (labels, start) = (
            Self::labels("getCurrentResourceVersion", b""),
            Instant::now(),
        );
        let r = self.inner.current_revision().await;
        self.done(labels, start, r)
    }

    async fn compacted_revision(&self) -> Result<Revision, StoreError> {
        let (labels, start) = (Self::labels("getCompactedRevision", b""), Instant::now());
        let r = self.inner.compacted_revision().await;
        self.done(labels, start, r)
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let (labels, start) = (Self::labels("compact", b""), Instant::now());
        let r = self.inner.compact(revision).await;
        self.done(labels, start, r)
    }

    /// Feeds are long-lived streams, not requests: passed through untimed.
    fn watch(&self, range: KeyRange, after: Revision) -> FeedStream {
        self.inner.watch(range, after)
    }

    async fn health(&self) -> Result<(), StoreError> {
        self.inner.health().await
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
