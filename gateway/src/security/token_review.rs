//! Bearer tokens in proxy mode: each is checked with the upstream's TokenReview
//! (`authentication.k8s.io/v1`, sent under the proxy's own credential), and the answer, a user
//! or a refusal, is kept for [`TTL`] in a bounded cache keyed by the token's SHA-256.
//!
//! Why 1 s: the upstream keeps accepting a revoked token (its ServiceAccount, Pod or Secret
//! deleted) for as long as its own token cache holds it, 10 s after the answer it cached,
//! and a TokenReview is answered from that same cache. The proxy cannot know when the entry
//! its answer came from was made, so an answer kept for 10 s here could outlive the
//! upstream's by almost 10 s. Kept for 1 s, a token stops working through the proxy within
//! 1 s of when it stops working directly. The upstream answers each review from its cache, and
//! concurrent requests with one token share one review ([`TokenReviewer::authenticate`]).
//!
//! A review that fails (the upstream unreachable, an answer that does not parse) is not
//! cached: the request is refused with 401 and the next one asks again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use serde::Deserialize;
use svc_core::user::UserInfo;
use tokio::sync::OnceCell;

use crate::base::deadline::Deadline as _;
use crate::outbound::upstream::Upstream;
use crate::security::tokens::HashCache;

/// How long an answer is kept, allowed or refused.
pub const TTL: Duration = Duration::from_secs(1);
/// Most answers kept; the least recently used makes room.
pub const CAPACITY: usize = 16_384;
/// Where TokenReviews are created.
const PATH: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// Why a token was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// The upstream says the token is no credential (cached).
    #[error("token refused by the upstream: {0}")]
    Refused(String),
    /// The review could not be done (not cached).
    #[error("token review failed: {0}")]
    Failed(String),
}

type Answer = Result<UserInfo, String>;
/// One review in flight, awaited by every request that carries its token meanwhile.
type Pending = Arc<OnceCell<Result<Answer, ReviewError>>>;

/// The token authenticator of proxy mode.
pub struct TokenReviewer {
    upstream: Upstream,
    cache: Mutex<HashCache<(Answer, Instant)>>,
    /// Reviews in flight by token hash; bounded by the requests waiting on them.
    pending: Mutex<HashMap<[u8; 32], Pending>>,
}

impl TokenReviewer {
    pub fn new(upstream: Upstream) -> Self {
        TokenReviewer {
            upstream,
            cache: Mutex::new(HashCache::with_capacity(CAPACITY)),
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// The user a token stands for, from the cache or a fresh review: one review per token
    /// at a time, whose answer every request that waited for it takes.
    pub async fn authenticate(&self, token: &str) -> Result<UserInfo, ReviewError> {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        let now = Instant::now();
        let cached = self.cache.lock().get(&key, |(_, at)| now < at.later(TTL));
        if let Some((answer, _)) = cached {
            return answer.map_err(ReviewError::Refused);
        }
        // The entry goes when its last waiter is done, or gives up (a caller gone).
        let leave = Leave {
            map: &self.pending,
            key,
            pending: Arc::clone(self.pending.lock().entry(key).or_default()),
        };
        let outcome = leave
            .pending
            .get_or_init(|| async {
                let asked = Instant::now();
                let answer = self.review(token).await;
                if let Ok(answer) = &answer {
                    // Aged from when it was asked: the upstream's answer is as old as that.
                    self.cache.lock().insert(key, (answer.clone(), asked));
                }
                answer
            })
            .await
            .clone();
        outcome?.map_err(ReviewError::Refused)
    }

    async fn review(&self, token: &str) -> Result<Answer, ReviewError> {
        let body = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        });
        let body = serde_json::to_vec(&body).map_err(|e| ReviewError::Failed(e.to_string()))?;
        let response = self
            .upstream
            .review(PATH, Bytes::from(body))
            .await
            .map_err(|e| ReviewError::Failed(e.to_string()))?;
        if !response.status.is_success() {
            return Err(ReviewError::Failed(format!(
                "{}{PATH} answered {}",
                self.upstream.url(),
                response.status.as_u16()
            )));
        }
        decode(&response.body).map_err(ReviewError::Failed)
    }
}

/// Removes a review in flight from the map once no request waits for it (the map holds one
/// reference, each waiter one): the map stays as small as the requests waiting.
struct Leave<'a> {
    map: &'a Mutex<HashMap<[u8; 32], Pending>>,
    key: [u8; 32],
    pending: Pending,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let mut map = self.map.lock();
        // Two references left: the map's and this waiter's.
        if map
            .get(&self.key)
            .is_some_and(|p| Arc::ptr_eq(p, &self.pending) && Arc::strong_count(p) <= 2)
        {
            map.remove(&self.key);
        }
    }
}

/// Reads a TokenReview answer: the user when authenticated, else the reason given.
fn decode(body: &[u8]) -> Result<Answer, String> {
    #[derive(Deserialize)]
    struct Review {
        #[serde(default)]
        status: Status,
    }
    #[derive(Default, Deserialize)]
    struct Status {
        #[serde(default)]
        authenticated: bool,
        #[serde(default)]
        user: Option<UserInfo>,
        #[serde(default)]
        error: String,
    }
    let review: Review =
        serde_json::from_slice(body).map_err(|e| format!("the TokenReview answer: {e}"))?;
    let status = review.status;
    match (status.authenticated, status.user) {
        (true, Some(user)) if !user.username.is_empty() => Ok(Ok(user)),
        (true, _) => Err("an authenticated TokenReview without a username".into()),
        (false, _) if status.error.is_empty() => Ok(Err("not authenticated".into())),
        (false, _) => Ok(Err(status.error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A TokenReview upstream that answers each review `delay` after it came: accepted as
    /// user `u` while `accept` holds, else refused; `reviews` counts them.
    #[derive(Default)]
    struct Reviews {
        accept: AtomicBool,
        reviews: AtomicUsize,
    }

    async fn review_upstream(
        reviews: Arc<Reviews>,
        delay: Duration,
    ) -> (Upstream, tempfile::TempDir) {
        crate::outbound::upstream::scripted::serve(move |_req| {
            let reviews = reviews.clone();
            async move {
                reviews.reviews.fetch_add(1, Ordering::SeqCst);
                // The answer is the upstream's state when the review came.
                let body = if reviews.accept.load(Ordering::SeqCst) {
                    r#"{"status":{"authenticated":true,"user":{"username":"u"}}}"#
                } else {
                    r#"{"status":{"authenticated":false,"error":"revoked"}}"#
                };
                tokio::time::sleep(delay).await;
                http::Response::new(http_body_util::Full::new(Bytes::from(body)))
            }
        })
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_is_kept_ttl_from_when_it_was_asked_and_shared_while_asked() {
        let delay = Duration::from_millis(400);
        let upstream = Arc::new(Reviews::default());
        upstream.accept.store(true, Ordering::SeqCst);
        let (up, _dir) = review_upstream(upstream.clone(), delay).await;
        let reviewer = Arc::new(TokenReviewer::new(up));

        // Ten requests with one token at once: one review, whose answer each takes.
        let asked = Instant::now();
        let waiting: Vec<_> = (0..10)
            .map(|_| {
                let reviewer = reviewer.clone();
                tokio::spawn(async move { reviewer.authenticate("tok").await })
            })
            .collect();
        for w in waiting {
            assert_eq!(w.await.unwrap().unwrap().username, "u");
        }
        assert_eq!(upstream.reviews.load(Ordering::SeqCst), 1);
        assert!(reviewer.pending.lock().is_empty());

        // Revoked upstream: the answer kept is still given, without asking.
        upstream.accept.store(false, Ordering::SeqCst);
        assert_eq!(reviewer.authenticate("tok").await.unwrap().username, "u");
        assert_eq!(upstream.reviews.load(Ordering::SeqCst), 1);

        // TTL after the ask, though less than TTL after the answer came, it is asked again:
        // the answer is as old as the question.
        tokio::time::sleep_until((asked + TTL + Duration::from_millis(50)).into()).await;
        let again = Instant::now();
        assert!(
            again < asked + delay + TTL,
            "the test ran too slowly to tell"
        );
        assert_eq!(
            reviewer.authenticate("tok").await,
            Err(ReviewError::Refused("revoked".into()))
        );
        assert_eq!(upstream.reviews.load(Ordering::SeqCst), 2);
        // A refusal is kept too, and another token has its own entry.
        assert!(reviewer.authenticate("tok").await.is_err());
        assert_eq!(upstream.reviews.load(Ordering::SeqCst), 2);
        assert!(reviewer.authenticate("other").await.is_err());
        assert_eq!(upstream.reviews.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn answers_are_read_as_kubernetes_writes_them() {
        let ok = br#"{"kind":"TokenReview","status":{"authenticated":true,"user":{"username":"system:serviceaccount:a:b","uid":"u1","groups":["system:serviceaccounts","system:authenticated"],"extra":{"authentication.kubernetes.io/pod-name":["p"]}}}}"#;
        let user = decode(ok).unwrap().unwrap();
        assert_eq!(user.username, "system:serviceaccount:a:b");
        assert_eq!(user.uid, "u1");
        assert_eq!(user.groups.len(), 2);
        assert_eq!(user.extra["authentication.kubernetes.io/pod-name"], ["p"]);
        let refused = br#"{"status":{"authenticated":false,"error":"token expired"}}"#;
        assert_eq!(decode(refused).unwrap(), Err("token expired".to_string()));
        assert_eq!(
            decode(br#"{"status":{}}"#).unwrap(),
            Err("not authenticated".to_string())
        );
        assert!(decode(br#"{"status":{"authenticated":true}}"#).is_err());
        assert!(decode(b"not json").is_err());
    }
}
