//! The proxy's own calls against a slow upstream: reviews take turns, and the readiness
//! check is never queued behind them.
// Test code: a panic on a broken expectation is the point.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use tokio::sync::watch;

use super::{REVIEW_TURN_WAIT, REVIEWS_IN_FLIGHT, Upstream};

/// What the upstream saw: reviews held now, and the most held at once.
#[derive(Default)]
struct Seen {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// An upstream over plain HTTP that answers `/readyz` at once and holds every review until
/// `release` turns true; an `Upstream` that reaches it.
async fn holding_upstream(
    seen: Arc<Seen>,
    release: watch::Receiver<bool>,
) -> (Upstream, tempfile::TempDir) {
    super::scripted::serve(move |req| {
        let (seen, mut release) = (seen.clone(), release.clone());
        async move {
            if req.uri().path() != "/readyz" {
                let now = seen.now.fetch_add(1, Ordering::SeqCst) + 1;
                seen.most.fetch_max(now, Ordering::SeqCst);
                let _ = release.wait_for(|r| *r).await;
                seen.now.fetch_sub(1, Ordering::SeqCst);
            }
            http::Response::new(Full::new(Bytes::from("{}")))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_take_turns_and_readiness_passes_them() {
    let seen = Arc::new(Seen::default());
    let (release, held) = watch::channel(false);
    let (upstream, _dir) = holding_upstream(seen.clone(), held).await;
    let asked = REVIEWS_IN_FLIGHT + 40;
    let reviews: Vec<_> = (0..asked)
        .map(|i| {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let body = Bytes::from(format!("{{\"review\":{i}}}"));
                upstream
                    .review("/apis/authorization.k8s.io/v1/subjectaccessreviews", body)
                    .await
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.now.load(Ordering::SeqCst) < REVIEWS_IN_FLIGHT {
        assert!(
            Instant::now() < deadline,
            "only {} reviews arrived",
            seen.now.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The turns all taken, the readiness check still goes through at once.
    let started = Instant::now();
    upstream.ready().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // The reviews past the turns wait here, then give up with a reason; those with a turn
    // are still held.
    tokio::time::sleep(REVIEW_TURN_WAIT + Duration::from_secs(1)).await;
    let (done, held): (Vec<_>, Vec<_>) = reviews.into_iter().partition(|r| r.is_finished());
    assert_eq!(done.len(), asked - REVIEWS_IN_FLIGHT);
    for r in done {
        let e = r.await.unwrap().unwrap_err().to_string();
        assert!(e.contains("reviews were under way"), "{e}");
    }
    assert_eq!(seen.most.load(Ordering::SeqCst), REVIEWS_IN_FLIGHT);
    // Released, those are answered.
    release.send(true).unwrap();
    for r in held {
        let answer = r.await.unwrap().unwrap();
        assert_eq!(answer.status, http::StatusCode::OK);
        assert_eq!(answer.body, Bytes::from("{}"));
    }
}
