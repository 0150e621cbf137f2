//! SubjectAccessReviews asked of the upstream in proxy mode (`authorization.k8s.io/v1`, sent
//! under the proxy's own credential): may this caller do this? Used for a caller's own
//! impersonation (`impersonation.rs`), cached reads (`http/cached.rs`) and the proxy's own
//! `/metrics`. Grants are kept for [`TTL`] (10 s) in a bounded cache keyed by the whole
//! review, so the upstream's RBAC decides and a grant taken away takes effect within 10 s.
//! A refusal is not kept: a grant may come within milliseconds (the Node authorizer grants a
//! kubelet its pod's ConfigMaps and Secrets as soon as it learns of the pod's binding, which
//! the kubelet may have seen through this proxy first), and a refusal kept would hold a
//! retrying client back for the whole TTL, its backoff growing meanwhile; a refused caller
//! costs the upstream one review a request, as its own authorizer costs it directly. A review
//! that cannot be had (the upstream unreachable, or failing) is a 429 with `Retry-After: 1`,
//! and is not cached; so is a denial while the upstream is not ready (its `/readyz`, read at
//! most once a second): a kube-apiserver starting again denies before its RBAC caches are
//! filled. The same review asked by many callers at once (every node's
//! kube-proxy starting its informers as `system:kube-proxy`) is sent once, its answer shared
//! (`base/flights.rs`).

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lru::LruCache;
use parking_lot::Mutex;
use svc_config::subject_access_review::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use svc_core::ApiError;
use svc_core::user::UserInfo;

use crate::base::deadline::Deadline as _;
use crate::base::flights::Flights;
use crate::outbound::upstream::Upstream;

/// How long an answer of the upstream is kept.
pub const TTL: Duration = Duration::from_secs(10);
/// Most answers kept; the least recently used makes room. The agents of a 3,000-node cluster
/// ask about 15,000 different reviews (each kubelet of its own Node, its pods, their
/// ConfigMaps and Secrets): room for twice that, at a few hundred bytes each.
pub const CAPACITY: usize = 32_768;
const PATH: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
/// How long the upstream's readiness, read after a denial, is taken as it was.
const READY_TTL: Duration = Duration::from_secs(1);

/// Asks the upstream, caching its answers.
pub struct AccessReviewer {
    upstream: Upstream,
    /// Grants: their reason, and when they were given.
    cache: Mutex<LruCache<String, (String, Instant)>>,
    /// Reviews under way, each asked of the upstream once for all who wait on it.
    flights: Flights<String, Result<(bool, String), String>>,
    /// The upstream's readiness as last read, and when.
    ready: Mutex<Option<(Instant, bool)>>,
    ready_flights: Flights<(), bool>,
}

impl AccessReviewer {
    pub fn new(upstream: Upstream) -> Self {
        let capacity = NonZeroUsize::new(CAPACITY).unwrap_or(NonZeroUsize::MIN);
        AccessReviewer {
            upstream,
            cache: Mutex::new(LruCache::new(capacity)),
            flights: Flights::default(),
            ready: Mutex::new(None),
            ready_flights: Flights::default(),
        }
    }

    /// Whether the upstream allows `user` what the attributes name, and its reason; 429 when
    /// the upstream cannot be asked.
    pub async fn review(
        &self,
        user: &UserInfo,
        resource: Option<ResourceAttributes>,
        non_resource: Option<NonResourceAttributes>,
    ) -> Result<(bool, String), ApiError> {
        let spec = SubjectAccessReviewSpec {
            resource_attributes: resource,
            non_resource_attributes: non_resource,
            user: user.username.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            uid: user.uid.clone(),
        };
        let body = serde_json::json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        });
        let key = body.to_string();
        let now = Instant::now();
        let cached = self
            .cache
            .lock()
            .get(&key)
            .filter(|(_, at)| now < at.later(TTL))
            .map(|(reason, _)| (true, reason.clone()));
        if let Some(answer) = cached {
            return Ok(answer);
        }
        // Asked again later: a 429 with `Retry-After`, as kube-apiserver answers while it
        // starts or stops, so that a client-go informer resumes its watch rather than
        // listing everything again (it does after a 503).
        let unavailable = |e: String| ApiError::TooManyRequests {
            message: format!(
                "the upstream API server could not review access: {e}; please try again later"
            ),
            retry_after_seconds: Some(1),
        };
        // The same review asked by many at once is sent once.
        let asked = self.flights.run(key.clone(), || self.ask(key.clone()));
        let answer = asked.await.map_err(unavailable)?;
        if answer.0 {
            self.cache.lock().put(key, (answer.1.clone(), now));
        } else if !self.upstream_ready().await {
            // A kube-apiserver starting again answers reviews before its authorizers have
            // filled their caches, and denies what its RBAC will allow a moment later: a 403
            // passed on would have every client-go informer starting a watch then list
            // everything again, where a 429 has it retry the watch.
            return Err(unavailable(
                "it is not ready, and a denial of a server not ready is not taken".into(),
            ));
        }
        Ok(answer)
    }

    /// Whether the upstream answers `/readyz` with 200, read at most once per [`READY_TTL`].
    async fn upstream_ready(&self) -> bool {
        let now = Instant::now();
        if let Some((at, ready)) = *self.ready.lock()
            && now < at.later(READY_TTL)
        {
            return ready;
        }
        let ready = self
            .ready_flights
            .run((), || async { self.upstream.ready().await.is_ok() })
            .await;
        *self.ready.lock() = Some((Instant::now(), ready));
        ready
    }

    /// Sends the review `key` (its JSON) to the upstream: its answer, or why there is none.
    async fn ask(&self, key: String) -> Result<(bool, String), String> {
        let response = self
            .upstream
            .review(PATH, Bytes::from(key))
            .await
            .map_err(|e| e.to_string())?;
        if !response.status.is_success() {
            return Err(format!("{PATH} answered {}", response.status.as_u16()));
        }
        #[derive(serde::Deserialize)]
        struct Review {
            #[serde(default)]
            status: SubjectAccessReviewStatus,
        }
        let review: Review = serde_json::from_slice(&response.body).map_err(|e| e.to_string())?;
        Ok((review.status.allowed, review.status.reason))
    }
}
