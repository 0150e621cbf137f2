//! The audit annotations of one request: keys and values that the pipeline, admission plugins
//! and handlers add while it is served, and that its audit event records. Shared through the
//! request's extensions; bounded per request.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Annotations set by the pipeline on every audited request.
pub const DECISION_ANNOTATION: &str = "authorization.svc.io/decision";
pub const REASON_ANNOTATION: &str = "authorization.svc.io/reason";
/// Set when `--max-requests-inflight` or `--max-mutating-requests-inflight` refused a request.
pub const RATE_LIMIT_ANNOTATION: &str = "apiserver.svc.io/rejected-by";

/// Annotations kept per request; more are refused (logged), so a plugin cannot grow an event
/// without bound.
pub const MAX_ANNOTATIONS: usize = 64;
/// Annotations of one request, shared with handlers through the request's extensions.
#[derive(Clone, Debug, Default)]
pub struct Annotations(Arc<parking_lot::Mutex<BTreeMap<String, String>>>);

impl Annotations {
    /// Adds `key`; the first value set for a key stays (as Kubernetes keeps it).
    pub fn add(&self, key: &str, value: &str) {
        let mut map = self.0.lock();
        if let Some(old) = map.get(key) {
            if old != value {
                tracing::warn!(key, old, new = value, "audit annotation already set");
            }
            return;
        }
        if map.len() >= MAX_ANNOTATIONS {
            tracing::warn!(key, "too many audit annotations on one request");
            return;
        }
        map.insert(key.to_string(), value.to_string());
    }

    pub fn snapshot(&self) -> BTreeMap<String, String> {
        self.0.lock().clone()
    }
}

/// Annotates the audit event of the request whose extensions these are (nothing when it is
/// not audited).
pub fn annotate(extensions: &http::Extensions, key: &str, value: &str) {
    if let Some(a) = extensions.get::<Annotations>() {
        a.add(key, value);
    }
}
