//! The webhook authorizer against a scripted transport and a hand-moved clock: decisions,
//! the cache's times to live and bound, failure policy, and match conditions.
// Test code: arithmetic on a hand-moved clock is checked by the assertions.
#![allow(clippy::arithmetic_side_effects)]

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::observe::metrics::Metrics;
use crate::security::authz::ResourceAccess;

/// Answers by user: `alice` allowed, `bob` denied with a reason, anyone else no opinion;
/// `down` makes every call fail, `garbage` answers with something that is not a review.
#[derive(Default)]
struct Scripted {
    calls: AtomicUsize,
    down: std::sync::atomic::AtomicBool,
    garbage: std::sync::atomic::AtomicBool,
    last_body: Mutex<Vec<u8>>,
}

impl Transport for Scripted {
    fn review(&self, body: Bytes, _: Duration) -> BoxFuture<'_, Result<Bytes, TransportError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        *self.last_body.lock() = body.to_vec();
        let result = if self.down.load(Ordering::SeqCst) {
            Err(TransportError::Failed("connection refused".into()))
        } else if self.garbage.load(Ordering::SeqCst) {
            Ok(Bytes::from_static(b"<html>oops</html>"))
        } else {
            let (version, spec) = sar::decode_request(&body).unwrap();
            let status = match spec.user.as_str() {
                "alice" => serde_json::json!({"allowed": true}),
                "bob" => {
                    serde_json::json!({"allowed": false, "denied": true, "reason": "bob is banned"})
                }
                _ => serde_json::json!({"allowed": false, "reason": "no rule for you"}),
            };
            Ok(Bytes::from(
                serde_json::to_vec(&serde_json::json!({
                    "apiVersion": version, "kind": "SubjectAccessReview", "status": status
                }))
                .unwrap(),
            ))
        };
        Box::pin(std::future::ready(result))
    }
}

/// A transport that never answers.
struct Silent;
impl Transport for Silent {
    fn review(&self, _: Bytes, _: Duration) -> BoxFuture<'_, Result<Bytes, TransportError>> {
        Box::pin(std::future::pending())
    }
}

#[derive(Default)]
struct FakeClock(Mutex<Option<Instant>>);
impl FakeClock {
    fn advance(&self, d: Duration) {
        let mut t = self.0.lock();
        *t = Some(t.unwrap_or_else(Instant::now) + d);
    }
}
impl Clock for FakeClock {
    fn now(&self) -> Instant {
        *self.0.lock().get_or_insert_with(Instant::now)
    }
}

/// Holds when the namespace is not `skip`; fails to evaluate (no such key) in namespace
/// `broken`.
fn not_skipped() -> Vec<svc_cel::Program> {
    [
        "request.resourceAttributes.namespace != 'broken' || request.noSuchField == 'x'",
        "request.resourceAttributes.namespace != 'skip'",
    ]
    .iter()
    .map(|e| svc_config::authorization::compile_match_condition(e).unwrap())
    .collect()
}

fn settings(policy: FailurePolicy) -> Settings {
    Settings {
        name: "policy".into(),
        authorized_ttl: Duration::from_secs(60),
        unauthorized_ttl: Duration::from_secs(10),
        timeout: Duration::from_secs(1),
        review_version: "v1".into(),
        failure_policy: policy,
    }
}

struct Fixture {
    authz: WebhookAuthorizer,
    transport: Arc<Scripted>,
    clock: Arc<FakeClock>,
    metrics: Metrics,
}

fn fixture(policy: FailurePolicy) -> Fixture {
    let transport = Arc::new(Scripted::default());
    let clock = Arc::new(FakeClock::default());
    let metrics = Metrics::new();
    let authz = WebhookAuthorizer::with_cache(
        settings(policy),
        not_skipped(),
        transport.clone(),
        metrics.authz.clone(),
        DecisionCache::new(16, clock.clone()),
    );
    Fixture {
        authz,
        transport,
        clock,
        metrics,
    }
}

fn user(name: &str) -> UserInfo {
    UserInfo {
        username: name.into(),
        groups: vec!["system:authenticated".into()],
        ..Default::default()
    }
}

fn get_in(namespace: &str) -> Attributes<'_> {
    Attributes {
        verb: "get",
        resource: Some(ResourceAccess {
            group: "",
            version: "v1",
            resource: "serviceaccounts",
            subresource: None,
            namespace,
            name: Some("builder"),
        }),
        path: "",
    }
}

impl Fixture {
    async fn ask(&self, who: &str, namespace: &str) -> Decision {
        self.authz.authorize(&user(who), &get_in(namespace)).await
    }
    fn calls(&self) -> usize {
        self.transport.calls.load(Ordering::SeqCst)
    }
    fn scrape(&self) -> String {
        self.metrics.encode()
    }
}

#[tokio::test]
async fn answers_become_decisions() {
    let f = fixture(FailurePolicy::NoOpinion);
    assert_eq!(f.ask("alice", "demo").await, Decision::Allow);
    assert_eq!(
        f.ask("bob", "demo").await,
        Decision::Deny("bob is banned".into())
    );
    assert_eq!(
        f.ask("carol", "demo").await,
        Decision::NoOpinion("no rule for you".into())
    );
    // What was sent: a v1 review naming user, groups and the resource.
    let sent: Value = serde_json::from_slice(&f.transport.last_body.lock()).unwrap();
    assert_eq!(sent["apiVersion"], "authorization.svc.io/v1");
    assert_eq!(sent["spec"]["user"], "carol");
    assert_eq!(sent["spec"]["groups"][0], "system:authenticated");
    assert_eq!(
        sent["spec"]["resourceAttributes"]["resource"],
        "serviceaccounts"
    );
    assert_eq!(sent["spec"]["resourceAttributes"]["version"], "v1");
    let scrape = f.scrape();
    assert!(
        scrape.contains(
            "apiserver_authorization_webhook_evaluations_total{name=\"policy\",result=\"success\"} 3"
        ),
        "{scrape}"
    );
}

#[tokio::test]
async fn answers_are_cached_for_their_time_to_live() {
    let f = fixture(FailurePolicy::NoOpinion);
    assert_eq!(f.ask("alice", "demo").await, Decision::Allow);
    assert_eq!(f.ask("alice", "demo").await, Decision::Allow);
    assert_eq!(
        f.calls(),
        1,
        "the second identical request is answered from the cache"
    );
    // A different spec is a different key.
    f.ask("alice", "other").await;
    assert_eq!(f.calls(), 2);
    // Denials live for unauthorizedTTL (10s), approvals for authorizedTTL (60s).
    f.ask("bob", "demo").await;
    assert_eq!(f.calls(), 3);
    f.clock.advance(Duration::from_secs(9));
    f.ask("bob", "demo").await;
    f.ask("alice", "demo").await;
    assert_eq!(f.calls(), 3);
    f.clock.advance(Duration::from_secs(2));
    assert_eq!(
        f.ask("bob", "demo").await,
        Decision::Deny("bob is banned".into())
    );
    assert_eq!(f.calls(), 4, "the denial expired after 10s");
    f.ask("alice", "demo").await;
    assert_eq!(f.calls(), 4);
    f.clock.advance(Duration::from_secs(50));
    f.ask("alice", "demo").await;
    assert_eq!(f.calls(), 5, "the approval expired after 60s");
}

#[test]
fn the_cache_is_bounded_and_evicts_the_least_recently_used() {
    let clock = Arc::new(FakeClock::default());
    let cache = DecisionCache::new(3, clock.clone());
    let ttl = Duration::from_secs(60);
    for k in ["a", "b", "c"] {
        cache.insert(k.into(), Decision::Allow, ttl);
    }
    assert!(cache.get("a").is_some()); // b is now the least recently used
    cache.insert("d".into(), Decision::Allow, ttl);
    assert_eq!(cache.len(), 3);
    assert!(cache.get("b").is_none());
    for k in ["a", "c", "d"] {
        assert!(cache.get(k).is_some(), "{k}");
    }
    // Replacing a key does not grow the cache; a zero time to live stores nothing.
    cache.insert("a".into(), Decision::Deny("x".into()), ttl);
    assert_eq!(cache.get("a"), Some(Decision::Deny("x".into())));
    assert_eq!(cache.len(), 3);
    cache.insert("e".into(), Decision::Allow, Duration::ZERO);
    assert!(cache.get("e").is_none());
    // Expired entries are dropped when read.
    clock.advance(ttl);
    assert!(cache.get("a").is_none());
    assert_eq!(cache.len(), 2);
    for i in 0..100 {
        cache.insert(format!("k{i}"), Decision::Allow, ttl);
    }
    assert_eq!(cache.len(), 3);
}

#[tokio::test]
async fn failure_policy_decides_when_the_webhook_cannot() {
    for (policy, expected) in [
        (FailurePolicy::NoOpinion, Decision::NoOpinion(String::new())),
        (FailurePolicy::Deny, Decision::Deny(String::new())),
    ] {
        let f = fixture(policy);
        f.transport.down.store(true, Ordering::SeqCst);
        assert_eq!(
            f.ask("alice", "demo").await,
            expected,
            "{policy:?} on error"
        );
        f.transport.down.store(false, Ordering::SeqCst);
        f.transport.garbage.store(true, Ordering::SeqCst);
        assert_eq!(
            f.ask("alice", "demo").await,
            expected,
            "{policy:?} on garbage"
        );
        assert_eq!(
            f.ask("alice", "broken").await,
            expected,
            "{policy:?} on a match condition error"
        );
        // Failures are not cached: the webhook is asked again once it is back.
        f.transport.garbage.store(false, Ordering::SeqCst);
        assert_eq!(f.ask("alice", "demo").await, Decision::Allow);
        assert_eq!(f.calls(), 3);
        let scrape = f.scrape();
        assert!(
            scrape.contains(
                "apiserver_authorization_webhook_evaluations_total{name=\"policy\",result=\"error\"} 2"
            ),
            "{scrape}"
        );
        assert!(scrape.contains(
            "apiserver_authorization_match_condition_evaluation_errors_total{type=\"Webhook\",name=\"policy\"} 1"
        ), "{scrape}");
        let fail_open = scrape.contains(
            "apiserver_authorization_webhook_evaluations_fail_open_total{name=\"policy\",result=\"error\"} 2",
        );
        assert_eq!(fail_open, policy == FailurePolicy::NoOpinion, "{scrape}");
    }
}

#[tokio::test]
async fn a_webhook_that_does_not_answer_times_out() {
    let metrics = Metrics::new();
    let authz = WebhookAuthorizer::new(
        Settings {
            timeout: Duration::from_millis(50),
            ..settings(FailurePolicy::Deny)
        },
        Vec::new(),
        Arc::new(Silent),
        metrics.authz.clone(),
    );
    assert_eq!(
        authz.authorize(&user("alice"), &get_in("demo")).await,
        Decision::Deny(String::new())
    );
    let scrape = metrics.encode();
    assert!(
        scrape.contains(
            "apiserver_authorization_webhook_evaluations_total{name=\"policy\",result=\"timeout\"} 1"
        ),
        "{scrape}"
    );
}

#[tokio::test]
async fn match_conditions_that_do_not_hold_skip_the_webhook() {
    let f = fixture(FailurePolicy::Deny);
    assert_eq!(
        f.ask("bob", "skip").await,
        Decision::NoOpinion(String::new())
    );
    assert_eq!(f.calls(), 0);
    assert!(f.scrape().contains(
        "apiserver_authorization_match_condition_exclusions_total{type=\"Webhook\",name=\"policy\"} 1"
    ));
}

#[test]
fn non_resource_requests_are_reviewed_by_path() {
    let attrs = Attributes {
        verb: "get",
        resource: None,
        path: "/metrics",
    };
    let spec = review_spec(&user("alice"), &attrs);
    assert!(spec.resource_attributes.is_none());
    let nr = spec.non_resource_attributes.unwrap();
    assert_eq!((nr.path.as_str(), nr.verb.as_str()), ("/metrics", "get"));
}
