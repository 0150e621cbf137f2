//! Fan-out through real sockets: 1,000 watchers of one event cost exactly one encoding, and
//! one stalled watcher among 1,000 live ones is ended with 410 without holding anyone up or
//! growing the server's memory.

use std::time::Duration;

use crate::support::client::{Client, TestServer, WatchStream, create_namespace, eventually};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

const WATCHERS: usize = 1000;
const CONNECTIONS: usize = 4;

fn metric(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l.contains(labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name}{labels} missing"))
}

async fn metrics(c: &Client) -> String {
    c.request(Method::GET, "/metrics", "", &[]).await.text()
}

/// Opens `n` watches of `path` as h2 streams over `CONNECTIONS` connections; each stream is
/// read by a task that collects `want` events (or fewer if the stream ends) within `limit`.
async fn open_watchers(
    srv: &TestServer,
    path: &str,
    n: usize,
    want: usize,
    limit: Duration,
) -> Vec<JoinHandle<Vec<Value>>> {
    let (cert, key) = srv.handle().pki.admin_credentials();
    let h2 = srv.client_with(Some((cert.into(), key.into())), true);
    let mut tasks = Vec::new();
    for i in 0..n {
        if i % (n / CONNECTIONS) == 0 {
            // A fresh connection for each share of the streams.
            tasks.push(None);
        }
        tasks.push(Some(i));
    }
    let mut conn = None;
    let mut handles = Vec::new();
    for t in tasks {
        let Some(_) = t else {
            conn = Some(h2.connect().await.unwrap());
            continue;
        };
        let c = conn.as_mut().unwrap();
        let resp = c
            .send(Client::build(Method::GET, path, bytes::Bytes::new(), &[]))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut stream = WatchStream::from_body(resp.into_body());
        handles.push(tokio::spawn(async move {
            let mut events = Vec::new();
            let _ = tokio::time::timeout(limit, async {
                while events.len() < want {
                    let Some(ev) = stream.next().await else {
                        break;
                    };
                    events.push(ev);
                }
            })
            .await;
            events
        }));
    }
    // Keep the connections alive as long as the streams: the last one is held by its streams'
    // bodies; earlier ones too (hyper keeps a connection while any stream is open).
    drop(conn);
    handles
}

async fn current_rv(c: &Client, path: &str) -> String {
    let (_, l) = c.get(path).await;
    l["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_to_a_thousand_watchers_is_encoded_once() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    create_namespace(&c, "enc").await;
    let base = "/api/v1/namespaces/enc/serviceaccounts";
    let rv = current_rv(&c, base).await;
    let watchers = open_watchers(
        &srv,
        &format!("{base}?watch=1&resourceVersion={rv}"),
        WATCHERS,
        1,
        Duration::from_secs(30),
    )
    .await;
    let before = metric(
        &metrics(&c).await,
        "apiserver_watch_cache_encodings_total",
        "resource=\"serviceaccounts\",format=\"json\"",
    );
    // Every stream is an open watch; once caught up, the streams of one connection are
    // served from one registration with the cache (`h2conn/share.rs`).
    let open = metric(
        &metrics(&c).await,
        "apiserver_registered_watchers",
        "kind=\"ServiceAccount\"",
    );
    assert_eq!(open as usize, WATCHERS);
    eventually(
        Duration::from_secs(30),
        "each connection's watches share one registration",
        || async {
            let registered = metric(
                &metrics(&c).await,
                "apiserver_watch_cache_watchers",
                "resource=\"serviceaccounts\"",
            );
            registered as usize == CONNECTIONS
        },
    )
    .await;

    let (s, _) = c.post(base, json!({"metadata": {"name": "one"}})).await;
    assert_eq!(s, StatusCode::CREATED);
    for w in watchers {
        let events = w.await.unwrap();
        assert_eq!(events.len(), 1, "a watcher missed the event");
        assert_eq!(events[0]["type"], "ADDED");
        assert_eq!(events[0]["object"]["metadata"]["name"], "one");
    }
    let after = metric(
        &metrics(&c).await,
        "apiserver_watch_cache_encodings_total",
        "resource=\"serviceaccounts\",format=\"json\"",
    );
    assert_eq!(
        after - before,
        1.0,
        "{WATCHERS} watchers of one event must cost exactly one JSON encoding"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watcher_is_ended_and_holds_nobody_up() {
    const HISTORY_BYTES: usize = 1 << 20;
    let srv = TestServer::start_with(|o| {
        o.watch_cache_history_max_bytes = HISTORY_BYTES;
        o.watch_cache_watcher_queue_limit = 64;
    })
    .await;
    let c = srv.admin();
    for ns in ["live", "bulk"] {
        create_namespace(&c, ns).await;
    }
    let rv = current_rv(&c, "/api/v1/serviceaccounts").await;

    // The stalled client: watches everything, reads the headers, then nothing more.
    let mut stalled_conn = c.connect().await.unwrap();
    let stalled = stalled_conn
        .send(Client::build(
            Method::GET,
            &format!("/api/v1/serviceaccounts?watch=1&resourceVersion={rv}"),
            bytes::Bytes::new(),
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(stalled.status(), StatusCode::OK);

    const LIVE_EVENTS: usize = 40;
    const BULK: usize = 80;
    let live = open_watchers(
        &srv,
        &format!("/api/v1/namespaces/live/serviceaccounts?watch=1&resourceVersion={rv}"),
        WATCHERS,
        LIVE_EVENTS,
        Duration::from_secs(120),
    )
    .await;

    // Large objects in "bulk" (16 MB in all: far more than socket buffers hold) push the
    // stalled watcher off the 1 MiB history; small ones in "live" go to the live watchers.
    let big = "x".repeat(200_000);
    for i in 0..BULK {
        let (s, v) = c
            .post(
                "/api/v1/namespaces/bulk/serviceaccounts",
                json!({"metadata": {"name": format!("b{i}"), "annotations": {"blob": big}}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        if i % 2 == 0 {
            let (s, _) = c
                .post(
                    "/api/v1/namespaces/live/serviceaccounts",
                    json!({"metadata": {"name": format!("l{}", i / 2)}}),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED);
        }
    }

    // Every live watcher got every live event, in order, and none was ended.
    for w in live {
        let events = w.await.unwrap();
        let names: Vec<&str> = events
            .iter()
            .map(|e| e["object"]["metadata"]["name"].as_str().unwrap_or("?"))
            .collect();
        let want: Vec<String> = (0..LIVE_EVENTS).map(|i| format!("l{i}")).collect();
        assert_eq!(names, want, "a live watcher lost or reordered events");
        assert!(events.iter().all(|e| e["type"] == "ADDED"));
    }

    // The server's history stayed within its byte bound (plus the one event being added).
    let m = metrics(&c).await;
    let history = metric(
        &m,
        "apiserver_watch_cache_history_bytes",
        "resource=\"serviceaccounts\"",
    );
    assert!(
        history <= (HISTORY_BYTES + 400_000) as f64,
        "history grew to {history} bytes"
    );

    // The stalled client reads again: it gets what was in flight, then a 410 ERROR, then the end.
    let mut body = stalled.into_body();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(d) = frame.into_data() {
                buf.extend_from_slice(&d);
            }
        }
    })
    .await
    .expect("the stalled watch was never ended");
    let events: Vec<Value> = buf
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    eprintln!(
        "stalled watcher: {} events before the end (of {} written)",
        events.len(),
        BULK + LIVE_EVENTS
    );
    let last = events.last().expect("no events at all");
    assert_eq!(last["type"], "ERROR", "last event: {}", last["type"]);
    assert_eq!(last["object"]["code"], 410);
    assert!(
        events.len() < BULK + LIVE_EVENTS,
        "the stalled watcher received everything; it never stalled"
    );
}
