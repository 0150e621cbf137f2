//! Fair share under overload through real TLS sockets: with the read-only limit full, one
//! user flooding with slow reads fills its own queue and gets 429 (`queue-full`) past it,
//! while another user's single request takes the next freed seat in turn instead of waiting
//! behind the flood; watches are counted against `--max-watches` on their own, the place a
//! watch holds is given back when its stream ends, and `system:masters` is exempt.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Method, StatusCode};
use svc_core::user::UserInfo;
use svc_gateway::security::authz::{Attributes, Authorizer, Decision, DecisionFuture};

use crate::support::client::{TestServer, create_namespace, eventually};

/// Allows the named users everything on resources.
struct AllowUsers(&'static [&'static str]);

impl Authorizer for AllowUsers {
    fn name(&self) -> &str {
        "allow-users"
    }
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        attrs: &'a Attributes<'a>,
    ) -> DecisionFuture<'a> {
        let d = if attrs.resource.is_some() && self.0.contains(&user.username.as_str()) {
            Decision::Allow
        } else {
            Decision::NoOpinion(String::new())
        };
        Box::pin(std::future::ready(d))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_user_gets_its_share_and_another_user_still_gets_through() {
    let srv = TestServer::start_with(|o| {
        o.max_requests_inflight = 2;
        o.max_queued_requests_per_user = 4;
        o.max_queue_wait = Duration::from_secs(20);
    })
    .await;
    let admin = srv.admin();
    create_namespace(&admin, "fair").await;
    let app = srv.handle().app.clone();
    srv.own()
        .security
        .set_authorizers(vec![Box::new(AllowUsers(&["flood", "patient"]))]);
    let (flood, patient) = (srv.user("flood", &[]), srv.user("patient", &[]));
    let sa = "/api/v1/namespaces/fair/serviceaccounts/default";
    // A read for a revision far in the future holds its seat about 3 s before its 504: two
    // such reads fill the pool, four more fill the flooder's queue, the rest are refused.
    let slow = format!("{sa}?resourceVersion=999999999");
    let flood_done = Arc::new(AtomicUsize::new(0));
    let mut floods = Vec::new();
    for i in 0usize..10 {
        let (flood, slow, done) = (flood.clone(), slow.clone(), flood_done.clone());
        floods.push(tokio::spawn(async move {
            let r = flood.request(Method::GET, &slow, "", &[]).await;
            if r.status != StatusCode::TOO_MANY_REQUESTS {
                done.fetch_add(1, Ordering::SeqCst);
            }
            r
        }));
        // The first two take the seats, the next four queue, in this order.
        let (want_running, want_queued) = (i.min(1) + 1, i.saturating_sub(1).min(4));
        eventually(
            Duration::from_secs(5),
            "the flood request is placed",
            || {
                let app = app.clone();
                async move {
                    app.readonly_inflight.in_flight() == want_running
                        && app.readonly_inflight.queued() == want_queued
                }
            },
        )
        .await;
    }
    // The flooder's queue was full for the last four.
    let mut refused = 0;
    for f in floods.drain(6..) {
        let r = f.await.unwrap();
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
        assert_eq!(r.headers["retry-after"], "1");
        let status = r.json();
        assert_eq!(status["reason"], "TooManyRequests");
        assert!(
            status["message"].as_str().unwrap().contains("queue-full"),
            "{status}"
        );
        refused += 1;
    }
    assert_eq!(refused, 4);

    // The patient user queues behind four of the flooder's requests, yet gets the second seat
    // freed (the first goes to the flooder, whose queue came first): it is answered while
    // every queued flood request (each another ~3 s read) is still running or waiting.
    let r = patient.request(Method::GET, sa, "", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let done = flood_done.load(Ordering::SeqCst);
    assert!(
        done <= 2,
        "{done} flood requests were over before the patient user's: only the two first \
         slow reads may be"
    );
    // The flooder's queued requests all run in the end, one seat each.
    for f in floods {
        let r = f.await.unwrap();
        assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{}", r.text());
    }
    assert_eq!(flood_done.load(Ordering::SeqCst), 6);
    assert_eq!(
        (
            app.readonly_inflight.in_flight(),
            app.readonly_inflight.queued()
        ),
        (0, 0)
    );
    // System:masters is never queued nor counted; the metrics carry Kubernetes' APF names.
    let metrics = admin.request(Method::GET, "/metrics", "", &[]).await;
    assert_eq!(metrics.status, StatusCode::OK);
    let text = metrics.text();
    for line in [
        "apiserver_flowcontrol_rejected_requests_total{priority_level=\"readOnly\",reason=\"queue-full\"} 4",
        "apiserver_flowcontrol_current_inqueue_requests{priority_level=\"readOnly\"} 0",
        "apiserver_flowcontrol_current_executing_requests{priority_level=\"readOnly\"} 0",
        "apiserver_flowcontrol_request_wait_duration_seconds_count{priority_level=\"readOnly\",execute=\"true\"} 5",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_at_most_the_queue_wait() {
    let srv = TestServer::start_with(|o| {
        o.max_requests_inflight = 1;
        o.max_queue_wait = Duration::from_millis(300);
    })
    .await;
    let admin = srv.admin();
    create_namespace(&admin, "wait").await;
    let app = srv.handle().app.clone();
    srv.own()
        .security
        .set_authorizers(vec![Box::new(AllowUsers(&["holder", "waiter"]))]);
    let holder = srv.user("holder", &[]);
    let sa = "/api/v1/namespaces/wait/serviceaccounts/default";
    let slow = format!("{sa}?resourceVersion=999999999");
    let held = tokio::spawn(async move { holder.request(Method::GET, &slow, "", &[]).await });
    eventually(
        Duration::from_secs(5),
        "the slow read holds the seat",
        || {
            let app = app.clone();
            async move { app.readonly_inflight.in_flight() == 1 }
        },
    )
    .await;
    let r = srv
        .user("waiter", &[])
        .request(Method::GET, sa, "", &[])
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert_eq!(r.headers["retry-after"], "1");
    assert!(r.text().contains("time-out"), "{}", r.text());
    // Writes have their own pool, untouched by the full read-only one.
    let (s, st) = srv
        .user("waiter", &[])
        .post(
            "/api/v1/namespaces/wait/serviceaccounts",
            serde_json::json!({"metadata": {"name": "w"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{st}");
    assert_eq!(held.await.unwrap().status, StatusCode::GATEWAY_TIMEOUT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_past_the_watch_limit_get_429_and_places_are_given_back() {
    let srv = TestServer::start_with(|o| {
        o.max_watches = 2;
        // Watches hold no read-only seat: one seat is plenty beside two watches.
        o.max_requests_inflight = 1;
    })
    .await;
    let admin = srv.admin();
    create_namespace(&admin, "w").await;
    let app = srv.handle().app.clone();
    srv.own()
        .security
        .set_authorizers(vec![Box::new(AllowUsers(&["watcher"]))]);
    let watcher = srv.user("watcher", &[]);
    let path = "/api/v1/namespaces/w/serviceaccounts?watch=true";
    let first = watcher.watch(path).await;
    let _second = watcher.watch(path).await;
    assert_eq!(app.watches.in_flight(), 2);
    let r = watcher.request(Method::GET, path, "", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(r.json()["reason"], "TooManyRequests");
    // Reads still have their seat; system:masters watches whatever the count.
    assert_eq!(
        watcher
            .get("/api/v1/namespaces/w/serviceaccounts/default")
            .await
            .0,
        StatusCode::OK
    );
    let mut masters = admin.watch(path).await;
    assert!(masters.next_within(Duration::from_secs(5)).await.is_some());
    assert_eq!(app.watches.in_flight(), 2);
    // A watch that ends gives its place back.
    drop(first);
    eventually(
        Duration::from_secs(10),
        "the closed watch's place is free",
        || {
            let app = app.clone();
            async move { app.watches.in_flight() == 1 }
        },
    )
    .await;
    let mut third = watcher.watch(path).await;
    assert!(third.next_within(Duration::from_secs(5)).await.is_some());
    let metrics = admin.request(Method::GET, "/metrics", "", &[]).await;
    let line = "apiserver_flowcontrol_rejected_requests_total{priority_level=\"watch\",reason=\"concurrency-limit\"} 1";
    assert!(metrics.text().contains(line), "{}", metrics.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_types_watch_cache_caps_its_registered_watchers() {
    let srv = TestServer::start_with(|o| {
        o.watch_cache_max_watchers = 2;
        o.max_watches = 0;
    })
    .await;
    let admin = srv.admin();
    create_namespace(&admin, "cap").await;
    let path = "/api/v1/namespaces/cap/serviceaccounts?watch=true";
    let first = admin.watch(path).await;
    let _second = admin.watch(path).await;
    // The cap is per type and counts every caller, system:masters included.
    let r = admin.request(Method::GET, path, "", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert!(
        r.text().contains("too many watches of serviceaccounts"),
        "{}",
        r.text()
    );
    // Another type has its own cache and its own count.
    let mut other = admin.watch("/api/v1/namespaces?watch=true").await;
    assert!(other.next_within(Duration::from_secs(5)).await.is_some());
    // A watch that ends gives its registration back (the probe ends itself after a second).
    drop(first);
    let probe = "/api/v1/namespaces/cap/serviceaccounts?watch=true&timeoutSeconds=1";
    let admin2 = admin.clone();
    eventually(
        Duration::from_secs(10),
        "a serviceaccounts watch opens again",
        move || {
            let admin = admin2.clone();
            async move { admin.request(Method::GET, probe, "", &[]).await.status == StatusCode::OK }
        },
    )
    .await;
}
