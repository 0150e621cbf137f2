//! A webhook authorizer (`type: Webhook`): the request becomes a SubjectAccessReview, sent
//! in `subjectAccessReviewVersion` when every match condition holds; the answer is cached
//! for `authorizedTTL` (allowed) or `unauthorizedTTL` (anything else) in a bounded LRU keyed
//! by the full review spec; on a failed call, a malformed answer or a match condition that
//! fails to evaluate, `failurePolicy` decides (no opinion, or deny).
//!
//! It speaks through a [`Transport`]: the HTTPS client built from `svcConfigFile`
//! ([`WebhookClient`]), or a scripted one in tests. Match conditions are CEL programs
//! compiled at load, run under the default cost budget.

use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lru::LruCache;
use parking_lot::Mutex;
use serde_json::Value;
use svc_cel::Activation;
use svc_config::subject_access_review::{
    self as sar, NonResourceAttributes, ResourceAttributes, SubjectAccessReviewSpec,
};
use svc_core::user::UserInfo;

use super::{Attributes, Authorizer, Decision, DecisionFuture};
use crate::base::deadline::Deadline;
use crate::observe::metrics::authz::{AuthzMetrics, WebhookResult};
use crate::outbound::client::{ClientError, WebhookClient};

/// Entries kept per webhook, as Kubernetes' webhook authorizer keeps them.
pub const CACHE_CAPACITY: usize = 8192;
/// The `type` label of this authorizer's metrics.
pub const TYPE: &str = "Webhook";

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a call to the webhook failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Connection, TLS, an HTTP status other than 2xx, a body too large, ...
    #[error("{0}")]
    Failed(String),
}

/// Sends a SubjectAccessReview body to the webhook and returns the response body.
pub trait Transport: Send + Sync {
    fn review(
        &self,
        body: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Bytes, TransportError>>;
}

impl Transport for WebhookClient {
    fn review(
        &self,
        body: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Bytes, TransportError>> {
        Box::pin(async move {
            let r = self
                .post(body, "application/json", timeout)
                .await
                .map_err(|e| match e {
                    ClientError::Timeout { timeout, .. } => TransportError::Timeout(timeout),
                    other => TransportError::Failed(other.to_string()),
                })?;
            if !r.status.is_success() {
                return Err(TransportError::Failed(format!(
                    "{}: HTTP {}",
                    self.url(),
                    r.status
                )));
            }
            Ok(r.body)
        })
    }
}

/// What to do when the webhook cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    NoOpinion,
    Deny,
}

/// The time source of the cache (a fake one in tests).
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

/// The real clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// The settings of one webhook authorizer.
pub struct Settings {
    pub name: String,
    pub authorized_ttl: Duration,
    pub unauthorized_ttl: Duration,
    pub timeout: Duration,
    /// `v1` or `v1beta1`.
    pub review_version: String,
    pub failure_policy: FailurePolicy,
}

pub struct WebhookAuthorizer {
    settings: Settings,
    conditions: Vec<svc_cel::Program>,
    transport: Arc<dyn Transport>,
    cache: DecisionCache,
    metrics: AuthzMetrics,
}

impl WebhookAuthorizer {
    pub fn new(
        settings: Settings,
        conditions: Vec<svc_cel::Program>,
        transport: Arc<dyn Transport>,
        metrics: AuthzMetrics,
    ) -> Self {
        Self::with_cache(
            settings,
            conditions,
            transport,
            metrics,
            DecisionCache::new(CACHE_CAPACITY, Arc::new(SystemClock)),
        )
    }

    pub fn with_cache(
        settings: Settings,
        conditions: Vec<svc_cel::Program>,
        transport: Arc<dyn Transport>,
        metrics: AuthzMetrics,
        cache: DecisionCache,
    ) -> Self {
        WebhookAuthorizer {
            settings,
            conditions,
            transport,
            cache,
            metrics,
        }
    }

    fn on_failure(&self) -> Decision {
        match self.settings.failure_policy {
            FailurePolicy::NoOpinion => Decision::NoOpinion(String::new()),
            FailurePolicy::Deny => Decision::Deny(String::new()),
        }
    }

    /// All conditions hold (`Some(true)`), one does not (`Some(false)`), or one failed to
    /// evaluate (`None`).
    fn conditions_hold(&self, spec: &SubjectAccessReviewSpec) -> Option<bool> {
        if self.conditions.is_empty() {
            return Some(true);
        }
        let request: Value = serde_json::to_value(spec).ok()?;
        let vars = Activation::new().bind("request", request);
        for c in &self.conditions {
            match c.eval_bool(&vars, svc_cel::DEFAULT_BUDGET) {
                Ok(true) => {}
                Ok(false) => return Some(false),
                Err(e) => {
                    tracing::warn!(authorizer = %self.settings.name, error = %e,
                        "authorization match condition failed to evaluate");
                    return None;
                }
            }
        }
        Some(true)
    }

    async fn decide(&self, user: &UserInfo, attrs: &Attributes<'_>) -> Decision {
        let name = self.settings.name.as_str();
        let spec = review_spec(user, attrs);
        match self.conditions_hold(&spec) {
            Some(true) => {}
            Some(false) => {
                self.metrics.match_condition_exclusion(TYPE, name);
                return Decision::NoOpinion(String::new());
            }
            None => {
                self.metrics.match_condition_error(TYPE, name);
                return self.on_failure();
            }
        }
        let key = serde_json::to_string(&spec).unwrap_or_default();
        if let Some(d) = self.cache.get(&key) {
            return d;
        }
        let body = Bytes::from(sar::encode_request(&spec, &self.settings.review_version));
        let start = Instant::now();
        let sent = tokio::time::timeout(
            self.settings.timeout,
            self.transport.review(body, self.settings.timeout),
        )
        .await;
        let elapsed = start.elapsed();
        let failure = match sent {
            Err(_) | Ok(Err(TransportError::Timeout(_))) => {
                Some((WebhookResult::Timeout, "no answer in time".to_string()))
            }
            Ok(Err(e)) => Some((WebhookResult::Error, e.to_string())),
            Ok(Ok(resp)) => match sar::decode_response(&resp, &self.settings.review_version) {
                Ok(status) => {
                    self.metrics.webhook(name, WebhookResult::Success, elapsed);
                    let (decision, ttl) = if status.allowed {
                        (Decision::Allow, self.settings.authorized_ttl)
                    } else if status.denied {
                        (
                            Decision::Deny(status.reason),
                            self.settings.unauthorized_ttl,
                        )
                    } else {
                        (
                            Decision::NoOpinion(status.reason),
                            self.settings.unauthorized_ttl,
                        )
                    };
                    self.cache.insert(key, decision.clone(), ttl);
                    return decision;
                }
                Err(e) => Some((WebhookResult::Error, e.to_string())),
            },
        };
        let (result, error) = failure.unwrap_or((WebhookResult::Error, String::new()));
        self.metrics.webhook(name, result, elapsed);
        tracing::warn!(authorizer = name, %error, policy = ?self.settings.failure_policy,
            "authorization webhook failed");
        if self.settings.failure_policy == FailurePolicy::NoOpinion {
            self.metrics.fail_open(name, result);
        }
        self.on_failure()
    }
}

impl Authorizer for WebhookAuthorizer {
    fn name(&self) -> &str {
        &self.settings.name
    }

    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        attrs: &'a Attributes<'a>,
    ) -> DecisionFuture<'a> {
        Box::pin(self.decide(user, attrs))
    }
}

/// The review spec of a request (v1 field names).
pub fn review_spec(user: &UserInfo, attrs: &Attributes<'_>) -> SubjectAccessReviewSpec {
    let (resource_attributes, non_resource_attributes) = match &attrs.resource {
        Some(r) => (
            Some(ResourceAttributes {
                namespace: r.namespace.to_string(),
                verb: attrs.verb.to_string(),
                group: r.group.to_string(),
                version: r.version.to_string(),
                resource: r.resource.to_string(),
                subresource: r.subresource.unwrap_or_default().to_string(),
                name: r.name.unwrap_or_default().to_string(),
                ..Default::default()
            }),
            None,
        ),
        None => (
            None,
            Some(NonResourceAttributes {
                path: attrs.path.to_string(),
                verb: attrs.verb.to_string(),
            }),
        ),
    };
    SubjectAccessReviewSpec {
        resource_attributes,
        non_resource_attributes,
        user: user.username.clone(),
        groups: user.groups.clone(),
        extra: user.extra.clone(),
        uid: user.uid.clone(),
    }
}

/// A bounded map from review spec to decision: entries expire after their time to live, and
/// when full the least recently used entry makes room.
pub struct DecisionCache {
    entries: Mutex<LruCache<String, (Decision, Instant)>>,
    clock: Arc<dyn Clock>,
}

impl DecisionCache {
    pub fn new(capacity: usize, clock: Arc<dyn Clock>) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        DecisionCache {
            entries: Mutex::new(LruCache::new(capacity)),
            clock,
        }
    }

    pub fn get(&self, key: &str) -> Option<Decision> {
        let now = self.clock.now();
        let mut entries = self.entries.lock();
        let (decision, expires) = entries.get(key)?;
        if *expires <= now {
            entries.pop(key);
            return None;
        }
        Some(decision.clone())
    }

    /// Keeps `decision` for `ttl` (a zero `ttl` keeps nothing).
    pub fn insert(&self, key: String, decision: Decision, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let expires = self.clock.now().later(ttl);
        self.entries.lock().put(key, (decision, expires));
    }

    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
