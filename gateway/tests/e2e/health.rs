//! Health endpoints and graceful shutdown through a real socket: output format, `verbose`,
//! `exclude`, per-check paths, readiness failing during shutdown, a connection opened as
//! shutdown began, metrics.

use std::time::Duration;

use crate::support::client::{TestServer, eventually};
use http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_output_follows_the_spec() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    for ep in ["/healthz", "/livez", "/readyz"] {
        let (s, body) = c.get(ep).await;
        assert_eq!((s, body.as_str()), (StatusCode::OK, Some("ok")), "{ep}");
    }
    let (s, body) = c.get("/healthz?verbose").await;
    assert_eq!(s, StatusCode::OK);
    let text = body.as_str().unwrap();
    for line in [
        "[+]ping ok",
        "[+]log ok",
        "[+]etcd ok",
        "[+]poststarthook/start-system-namespaces-controller ok",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert_eq!(text.lines().last(), Some("healthz check passed"));
    let (_, ready) = c.get("/readyz?verbose").await;
    assert!(ready.as_str().unwrap().contains("[+]shutdown ok"));
    assert!(ready.as_str().unwrap().ends_with("readyz check passed\n"));

    let (s, body) = c.get("/livez?verbose&exclude=etcd").await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        body.as_str().unwrap().contains("[+]etcd excluded: ok"),
        "{body}"
    );
    let (_, body) = c.get("/livez?verbose&exclude=nosuch").await;
    assert!(
        body.as_str()
            .unwrap()
            .contains("cannot be excluded: no matches for \"nosuch\"")
    );

    let (s, body) = c.get("/livez/ping").await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, Some("ok")));
    let (s, _) = c
        .get("/readyz/poststarthook/start-namespace-controller")
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = c.get("/readyz/nosuch").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_during_shutdown_delay_then_server_stops() {
    let mut srv =
        TestServer::start_with(|o| o.shutdown_delay_duration = Duration::from_secs(5)).await;
    let c = srv.admin();
    // A watch open when shutdown starts is ended, not left hanging.
    let mut w = c
        .watch("/api/v1/namespaces?watch=1&resourceVersion=0")
        .await;
    while tokio::time::timeout(Duration::from_millis(300), w.next())
        .await
        .is_ok()
    {}
    let handle = srv.handle.take().unwrap();
    let shutdown = tokio::spawn(handle.shutdown());
    // During the delay: still serving, but not ready.
    eventually(Duration::from_secs(4), "/readyz fails", || async {
        c.get("/readyz").await.0 == StatusCode::INTERNAL_SERVER_ERROR
    })
    .await;
    let (s, body) = c.get("/readyz?verbose").await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    let text = body.as_str().unwrap();
    assert!(
        text.contains("[-]shutdown failed: reason withheld"),
        "{text}"
    );
    assert!(text.ends_with("readyz check failed\n"));
    assert_eq!(c.get("/livez").await.0, StatusCode::OK);
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("shutdown hung")
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while w.next().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "watch survived shutdown");
    assert!(c.connect().await.is_err(), "still accepting after shutdown");
}

/// Connections accepted before the listener closed, whose requests come after: each is
/// answered (with `Connection: close`), not dropped, as Go's server gives a new connection
/// time to send its first request; a watch asked for then is a 429 (it would end at once),
/// which client-go retries from its version elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_opened_before_shutdown_still_gets_its_answer() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let mut srv = TestServer::start().await;
    let addr = srv.handle().addr;
    let mut get = srv.admin_tls(b"http/1.1").await;
    let mut watch = srv.admin_tls(b"http/1.1").await;
    let handle = srv.handle.take().unwrap();
    let shutdown = tokio::spawn(handle.shutdown());
    eventually(Duration::from_secs(10), "the listener closes", || async {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    let mut answers = Vec::new();
    for (tls, path) in [
        (&mut get, "/version"),
        (&mut watch, "/api/v1/namespaces?watch=1"),
    ] {
        tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer))
            .await
            .expect("the answer, then the end of the connection")
            .expect("an answer, not a reset");
        let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
        answers.push(answer);
    }
    assert!(answers[0].starts_with("http/1.1 200"), "{}", answers[0]);
    assert!(answers[0].contains("gitversion"), "{}", answers[0]);
    assert!(answers[1].starts_with("http/1.1 429"), "{}", answers[1]);
    assert!(
        answers[1].contains("\r\nretry-after: 1\r\n"),
        "{}",
        answers[1]
    );
    assert!(answers[1].contains("shutting down"), "{}", answers[1]);
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("shutdown hung")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_and_watches() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    c.get("/api/v1/namespaces").await;
    let _w = c.watch("/api/v1/namespaces?watch=1").await;
    let open_watch =
        "apiserver_registered_watchers{group=\"\",version=\"v1\",kind=\"Namespace\"} 1";
    eventually(
        Duration::from_secs(5),
        "the open watch is counted",
        || async {
            let text = c
                .request(http::Method::GET, "/metrics", "", &[])
                .await
                .text();
            text.lines().any(|l| l.starts_with(open_watch))
        },
    )
    .await;
    let r = c.request(http::Method::GET, "/metrics", "", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = r.text();
    assert!(
        text.lines()
            .any(|l| l.starts_with("apiserver_request_total{")
                && l.contains("verb=\"LIST\"")
                && l.contains("resource=\"namespaces\"")
                && l.contains("code=\"200\"")),
        "{text}"
    );
    assert!(text.contains("apiserver_request_duration_seconds_bucket"));
    assert!(text.lines().any(|l| l.starts_with(open_watch)), "{text}");
}
