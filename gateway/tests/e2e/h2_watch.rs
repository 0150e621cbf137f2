//! Watches on h2 connections, written with the h2 crate's client so each stream's
//! flow-control window is the test's to give: many watches on one connection each receive
//! every event in order; a stream reset by the client or never read ends its watch without
//! holding up the others; ordinary requests share the connection with watches; shutdown ends
//! the watches and the connection.

use std::time::Duration;

use bytes::Bytes;
use h2::RecvStream;
use h2::client::SendRequest;
use http::{Method, Request, StatusCode};
use serde_json::{Value, json};

use crate::support::client::{
    TestServer, assert_goaway_and_listener_closed, create_namespace, eventually,
};

/// Every step must end well within this.
const BOUND: Duration = Duration::from_secs(30);

/// An h2 connection with the admin certificate; `window` is every stream's receive window
/// (the connection's is large, so one stream that is not read cannot hold up the others).
async fn connect(srv: &TestServer, window: u32) -> SendRequest<Bytes> {
    connect_windows(srv, window, 64 << 20).await
}

/// As [`connect`], with the connection's window `conn_window` as well.
async fn connect_windows(srv: &TestServer, window: u32, conn_window: u32) -> SendRequest<Bytes> {
    let tls = srv.admin_tls(b"h2").await;
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .initial_connection_window_size(conn_window)
        .handshake::<_, Bytes>(tls)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

/// Sends a request on the connection; returns the status and the body still to read.
async fn send(
    conn: &SendRequest<Bytes>,
    method: Method,
    path: &str,
    body: Option<Bytes>,
) -> (StatusCode, RecvStream) {
    let mut b = Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"));
    if body.is_some() {
        b = b.header("content-type", "application/json");
    }
    let req = b.body(()).unwrap();
    let mut s = conn.clone().ready().await.unwrap();
    let (resp, mut out) = s.send_request(req, body.is_none()).unwrap();
    if let Some(body) = body {
        let mut body = body;
        while !body.is_empty() {
            out.reserve_capacity(body.len());
            // None or an error: the server answered early (a 413) and closed the stream.
            let Some(Ok(cap)) = std::future::poll_fn(|cx| out.poll_capacity(cx)).await else {
                break;
            };
            let part = body.split_to(cap.min(body.len()));
            if out.send_data(part, false).is_err() {
                break;
            }
        }
        let _ = out.send_data(Bytes::new(), true);
    }
    let resp = tokio::time::timeout(BOUND, resp)
        .await
        .expect("response head")
        .unwrap();
    (resp.status(), resp.into_body())
}

/// Reads a whole body, giving the window back as it goes.
async fn read_all(body: &mut RecvStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(d) = tokio::time::timeout(BOUND, body.data())
        .await
        .expect("body")
    {
        let d = d.unwrap();
        let _ = body.flow_control().release_capacity(d.len());
        out.extend_from_slice(&d);
    }
    out
}

/// A GET on the connection that must answer 200 with JSON: the JSON.
async fn get_json(conn: &SendRequest<Bytes>, path: &str) -> Value {
    let (status, mut body) = send(conn, Method::GET, path, None).await;
    assert_eq!(status, StatusCode::OK, "GET {path}");
    serde_json::from_slice(&read_all(&mut body).await).unwrap()
}

/// Watch events read line by line from one stream.
struct Events {
    body: RecvStream,
    buf: Vec<u8>,
    /// DATA frames read.
    frames: usize,
}

impl Events {
    async fn open(conn: &SendRequest<Bytes>, path: &str) -> Events {
        let (status, body) = send(conn, Method::GET, path, None).await;
        assert_eq!(status, StatusCode::OK, "watch {path}");
        Events {
            body,
            buf: Vec::new(),
            frames: 0,
        }
    }

    /// The next event; None once the stream ends (or is reset).
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).expect("watch event JSON"));
            }
            let d = tokio::time::timeout(BOUND, self.body.data())
                .await
                .expect("timed out waiting for a watch event")?
                .ok()?;
            let _ = self.body.flow_control().release_capacity(d.len());
            self.frames += 1;
            self.buf.extend_from_slice(&d);
        }
    }
}

/// The sum of the `/metrics` samples whose line `line` picks, and how many it picked.
async fn metric(srv: &TestServer, line: impl Fn(&str) -> bool) -> (f64, usize) {
    let text = srv
        .admin()
        .request(Method::GET, "/metrics", "", &[])
        .await
        .text();
    text.lines()
        .filter(|l| line(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold((0.0, 0), |(sum, n), v| (sum + v, n + 1))
}

/// The `apiserver_registered_watchers` gauge for ServiceAccounts.
async fn sa_watchers(srv: &TestServer) -> f64 {
    metric(srv, |l| {
        l.starts_with("apiserver_registered_watchers{") && l.contains("ServiceAccount")
    })
    .await
    .0
}

async fn list_rv(srv: &TestServer, path: &str) -> String {
    let (status, list) = srv.admin().get(path).await;
    list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_else(|| panic!("{status}: {list}"))
        .to_string()
}

/// Creates namespace `ns`; the resourceVersion of its ServiceAccounts' list, to watch from.
async fn new_namespace(srv: &TestServer, ns: &str) -> String {
    create_namespace(&srv.admin(), ns).await;
    list_rv(srv, &format!("/api/v1/namespaces/{ns}/serviceaccounts")).await
}

async fn create_sa(srv: &TestServer, ns: &str, name: &str) {
    let (s, v) = srv
        .admin()
        .post(
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"metadata": {"name": name, "labels": {"t": "h2"}}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

/// `n` watches of namespace `ns`'s ServiceAccounts (labelled `t=h2`) on one new h2
/// connection, from the namespace's creation on; with the watcher count before them.
async fn watches_on_one_connection(
    srv: &TestServer,
    ns: &str,
    n: usize,
) -> (f64, SendRequest<Bytes>, Vec<Events>) {
    create_namespace(&srv.admin(), ns).await;
    let rv = list_rv(srv, &format!("/api/v1/namespaces/{ns}/serviceaccounts")).await;
    let before = sa_watchers(srv).await;
    let conn = connect(srv, 1 << 20).await;
    let path = format!(
        "/api/v1/namespaces/{ns}/serviceaccounts?watch=1&labelSelector=t%3Dh2&resourceVersion={rv}"
    );
    let mut watches = Vec::new();
    for _ in 0..n {
        watches.push(Events::open(&conn, &path).await);
    }
    assert_eq!(sa_watchers(srv).await - before, n as f64);
    (before, conn, watches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_watches_on_one_connection_each_get_every_event_in_order() {
    const WATCHES: usize = 200;
    const EVENTS: usize = 10;
    let srv = TestServer::start_with(|o| o.http2_max_streams_per_connection = 500).await;
    let (before, _conn, mut watches) = watches_on_one_connection(&srv, "many", WATCHES).await;
    for i in 0..EVENTS {
        create_sa(&srv, "many", &format!("c{i}")).await;
    }
    for (n, w) in watches.iter_mut().enumerate() {
        for i in 0..EVENTS {
            let ev = w.next().await.expect("the watch is open");
            assert_eq!(ev["type"], "ADDED", "watch {n}");
            assert_eq!(
                ev["object"]["metadata"]["name"],
                format!("c{i}").as_str(),
                "watch {n}: events in order"
            );
        }
    }
    drop(watches);
    eventually(BOUND, "the watches end with their streams", || async {
        sa_watchers(&srv).await == before
    })
    .await;
}

/// The `svc_http2_writes_total` counter.
async fn h2_writes(srv: &TestServer) -> f64 {
    let (writes, n) = metric(srv, |l| l.starts_with("svc_http2_writes_total ")).await;
    assert_eq!(n, 1, "one svc_http2_writes_total sample");
    writes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_reaches_every_watch_of_a_connection_in_a_few_writes() {
    // One DATA frame per stream, framed by the connection's wire (`h2wire.rs`) in one round
    // of its task and passed to the socket together: h2 alone writes each frame over 256
    // bytes on its own (100 writes). About 50 KiB of frames: a write or two (the round
    // passes what it gathered on at 64 KiB), and a few more if the events reach the streams
    // over more than one wake-up.
    const WATCHES: usize = 100;
    let srv = TestServer::start_with(|o| o.http2_max_streams_per_connection = 500).await;
    let (_, _conn, mut watches) = watches_on_one_connection(&srv, "gathered", WATCHES).await;
    let writes = h2_writes(&srv).await;
    create_sa(&srv, "gathered", "one").await;
    for (n, w) in watches.iter_mut().enumerate() {
        let ev = w.next().await.expect("the watch is open");
        assert_eq!(ev["object"]["metadata"]["name"], "one", "watch {n}");
    }
    let writes = h2_writes(&srv).await - writes;
    assert!(
        (1.0..=6.0).contains(&writes),
        "{writes} writes carried one event to {WATCHES} streams of one connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_by_the_client_ends_its_watch() {
    let srv = TestServer::start().await;
    let rv = new_namespace(&srv, "reset").await;
    let before = sa_watchers(&srv).await;
    let conn = connect(&srv, 1 << 20).await;
    let path = format!(
        "/api/v1/namespaces/reset/serviceaccounts?watch=1&labelSelector=t%3Dh2&resourceVersion={rv}"
    );
    let mut kept = Events::open(&conn, &path).await;
    let mut reset = Events::open(&conn, &path).await;
    assert_eq!(sa_watchers(&srv).await - before, 2.0);
    create_sa(&srv, "reset", "first").await;
    assert_eq!(
        reset.next().await.unwrap()["object"]["metadata"]["name"],
        "first"
    );
    // Dropping the body of an open stream resets it (RST_STREAM CANCEL).
    drop(reset);
    eventually(BOUND, "the reset stream's watch ends", || async {
        sa_watchers(&srv).await - before == 1.0
    })
    .await;
    // The other stream of the connection goes on.
    create_sa(&srv, "reset", "second").await;
    assert_eq!(
        kept.next().await.unwrap()["object"]["metadata"]["name"],
        "first"
    );
    assert_eq!(
        kept.next().await.unwrap()["object"]["metadata"]["name"],
        "second"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_is_not_read_holds_up_no_other_and_is_ended() {
    let srv = TestServer::start_with(|o| {
        o.watch_cache_history_max_bytes = 1 << 20;
        o.watch_cache_watcher_queue_limit = 64;
    })
    .await;
    let admin = srv.admin();
    for ns in ["live", "bulk"] {
        create_namespace(&admin, ns).await;
    }
    let rv = list_rv(&srv, "/api/v1/serviceaccounts").await;
    let before = sa_watchers(&srv).await;
    // Every stream's window is 16 KiB: one that is not read fills it with its first event.
    let conn = connect(&srv, 16 * 1024).await;
    // The stalled stream watches everything; the live ones only small objects in "live".
    let mut stalled = Events::open(
        &conn,
        &format!(
            "/api/v1/serviceaccounts?watch=1&labelSelector=t%3Dh2&resourceVersion={rv}&timeoutSeconds=20"
        ),
    )
    .await;
    let path = format!(
        "/api/v1/namespaces/live/serviceaccounts?watch=1&labelSelector=t%3Dh2&resourceVersion={rv}"
    );
    let mut live = Vec::new();
    for _ in 0..3 {
        live.push(Events::open(&conn, &path).await);
    }
    // 8 MB of large objects in "bulk": far more than the stalled stream's window and the
    // 1 MiB history; small ones in "live" in between.
    const EVENTS: usize = 40;
    let big = "x".repeat(200_000);
    let readers: Vec<_> = live
        .into_iter()
        .map(|mut w| tokio::spawn(async move { (names(&mut w, EVENTS).await, w) }))
        .collect();
    for i in 0..EVENTS {
        let (s, v) = admin
            .post(
                "/api/v1/namespaces/bulk/serviceaccounts",
                json!({"metadata": {"name": format!("b{i}"), "labels": {"t": "h2"}, "annotations": {"blob": big}}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        create_sa(&srv, "live", &format!("l{i}")).await;
    }
    let want: Vec<String> = (0..EVENTS).map(|i| format!("l{i}")).collect();
    let mut kept = Vec::new();
    for r in readers {
        let (names, w) = r.await.unwrap();
        assert_eq!(names, want, "every live stream got every event in order");
        kept.push(w);
    }
    // The stalled stream fell off the history: read now (well before its 20 s deadline, when
    // it would have been reset) it ends with a 410 ERROR, never with all the events.
    let mut seen = Vec::new();
    let mut error = None;
    while let Some(ev) = stalled.next().await {
        if ev["type"] == "ERROR" {
            error = Some(ev);
            break;
        }
        seen.push(
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert!(
        seen.len() < EVENTS,
        "the stalled stream could not have had every event"
    );
    let error = error.expect("the stalled stream gets an ERROR");
    assert_eq!(error["object"]["code"], 410, "{error}");
    assert!(
        stalled.next().await.is_none(),
        "the stream ends after its ERROR"
    );
    eventually(BOUND, "the stalled watch is unregistered", || async {
        sa_watchers(&srv).await - before == 3.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_requests_share_a_connection_with_watches() {
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "mixed").await;
    let rv = list_rv(&srv, "/api/v1/namespaces/mixed/serviceaccounts").await;
    // The client's default 64 KiB window: large responses need several window updates.
    let conn = connect(&srv, 65_535).await;
    let path = format!(
        "/api/v1/namespaces/mixed/serviceaccounts?watch=1&labelSelector=t%3Dh2&resourceVersion={rv}"
    );
    let mut w1 = Events::open(&conn, &path).await;
    let mut w2 = Events::open(&conn, &path).await;
    // Creates with bodies of several client windows, and small ones.
    let big = "y".repeat(200_000);
    for i in 0..6 {
        let data = if i % 2 == 0 { big.as_str() } else { "small" };
        let body = json!({"metadata": {"name": format!("m{i}"), "labels": {"t": "h2"}, "annotations": {"d": data}}});
        let (status, mut resp) = send(
            &conn,
            Method::POST,
            "/api/v1/namespaces/mixed/serviceaccounts",
            Some(Bytes::from(body.to_string())),
        )
        .await;
        let out = read_all(&mut resp).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&out)
        );
        let created: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            created["metadata"]["annotations"]["d"]
                .as_str()
                .unwrap()
                .len(),
            data.len()
        );
    }
    // A list of about 1 MB, on the same connection.
    let list = get_json(&conn, "/api/v1/namespaces/mixed/serviceaccounts").await;
    let items = list["items"].as_array().unwrap();
    assert_eq!(
        items
            .iter()
            .filter(|o| o["metadata"]["labels"]["t"] == "h2")
            .count(),
        6
    );
    // A body over the limit (and over the server's 1 MiB stream window) is refused with 413, and the connection goes on.
    let huge = Bytes::from(vec![b'z'; 4 << 20]);
    let (status, mut resp) = send(
        &conn,
        Method::POST,
        "/api/v1/namespaces/mixed/serviceaccounts",
        Some(huge),
    )
    .await;
    read_all(&mut resp).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    for w in [&mut w1, &mut w2] {
        for i in 0..6 {
            let ev = w.next().await.expect("the watch is open");
            assert_eq!(ev["object"]["metadata"]["name"], format!("m{i}").as_str());
        }
    }
    let (status, mut resp) = send(&conn, Method::GET, "/readyz", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read_all(&mut resp).await, b"ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_h2_watches_and_their_connection() {
    let mut srv = TestServer::start().await;
    let rv = new_namespace(&srv, "bye").await;
    let conn = connect(&srv, 1 << 20).await;
    let path = format!(
        "/api/v1/namespaces/bye/serviceaccounts?watch=1&labelSelector=t%3Dh2&resourceVersion={rv}"
    );
    let mut watches = Vec::new();
    for _ in 0..5 {
        watches.push(Events::open(&conn, &path).await);
    }
    let handle = srv.handle.take().unwrap();
    let shutdown = tokio::spawn(handle.shutdown());
    for w in &mut watches {
        assert!(w.next().await.is_none(), "the watch ends at shutdown");
    }
    tokio::time::timeout(BOUND, shutdown)
        .await
        .expect("shutdown ends with the watches")
        .unwrap();
    // The connection is gone: a new request on it fails.
    let failed = match conn.clone().ready().await {
        Err(_) => true,
        Ok(mut s) => match s.send_request(
            Request::get("https://localhost/readyz").body(()).unwrap(),
            true,
        ) {
            Err(_) => true,
            Ok((resp, _)) => tokio::time::timeout(BOUND, resp)
                .await
                .expect("answer")
                .is_err(),
        },
    };
    assert!(failed, "the connection is closed after shutdown");
}

/// What a client whose watch ends at shutdown meets when it reconnects at once, as client-go's
/// reflector does: its connection has already said GOAWAY (so the next watch is not sent into
/// a connection about to close, where Go's client meets a broken pipe and the reflector lists
/// again), and the listener is already closed (a new connection is refused, which client-go
/// retries, rather than accepted and dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_at_shutdown_after_goaway_and_the_listener_closing() {
    let mut srv = TestServer::start().await;
    let rv = new_namespace(&srv, "order").await;
    let addr = srv.handle().addr;
    let path = format!("/api/v1/namespaces/order/serviceaccounts?watch=1&resourceVersion={rv}");
    // Watches on several connections, so that each ordering is checked more than once.
    let mut conns = Vec::new();
    for _ in 0..4 {
        let conn = connect(&srv, 1 << 20).await;
        let w = Events::open(&conn, &path).await;
        conns.push((conn, w));
    }
    let handle = srv.handle.take().unwrap();
    let shutdown = tokio::spawn(handle.shutdown());
    for (conn, w) in &mut conns {
        assert!(w.next().await.is_none(), "the watch ends at shutdown");
        assert_goaway_and_listener_closed(conn.clone(), addr).await;
    }
    tokio::time::timeout(BOUND, shutdown)
        .await
        .expect("shutdown ends with the watches")
        .unwrap();
}

/// A client socket whose reading the test can stop and start again: stopped, the client
/// reads nothing, so what the server writes piles up in the kernel's buffers, then in the
/// server's.
struct Pausable<I> {
    io: I,
    pause: Pause,
}

#[derive(Clone, Default)]
struct Pause(std::sync::Arc<parking_lot::Mutex<(bool, Option<std::task::Waker>)>>);

impl Pause {
    fn set(&self, paused: bool) {
        let mut p = self.0.lock();
        p.0 = paused;
        if !paused && let Some(w) = p.1.take() {
            w.wake();
        }
    }
}

impl<I: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Pausable<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        {
            let mut p = self.pause.0.lock();
            if p.0 {
                p.1 = Some(cx.waker().clone());
                return std::task::Poll::Pending;
            }
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Pausable<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The `svc_http2_watch_held_bytes` gauge.
async fn held_bytes(srv: &TestServer) -> f64 {
    let (held, n) = metric(srv, |l| l.starts_with("svc_http2_watch_held_bytes ")).await;
    assert_eq!(n, 1, "one svc_http2_watch_held_bytes sample");
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_costs_its_connection_budget_not_every_streams_buffers() {
    // The budget of one connection's watches (h2ledger::WATCH_BUDGET), and the largest batch
    // one drain may add past it (one 50 KB event).
    const BUDGET: f64 = 256.0 * 1024.0;
    const EVENT: f64 = 64.0 * 1024.0;
    const STREAMS: usize = 16;
    const EVENTS: usize = 120;
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "held").await;
    let rv = list_rv(&srv, "/api/v1/namespaces/held/serviceaccounts").await;
    // Windows as large as Go's client gives (4 MiB a stream): flow control alone would let
    // the server queue up to h2's 400 KiB send buffer for every stream.
    let tls = srv.admin_tls(b"h2").await;
    let pause = Pause::default();
    let io = Pausable {
        io: tls,
        pause: pause.clone(),
    };
    let (conn, driver) = h2::client::Builder::new()
        .initial_window_size(4 << 20)
        .initial_connection_window_size(1 << 30)
        .handshake::<_, Bytes>(io)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = driver.await;
    });
    let path = format!("/api/v1/namespaces/held/serviceaccounts?watch=1&resourceVersion={rv}");
    let mut watches = Vec::new();
    for _ in 0..STREAMS {
        watches.push(Events::open(&conn, &path).await);
    }
    pause.set(true);
    // 16 streams × 120 events × 50 KB: 96 MB for the watches, far more than the kernel's
    // socket buffers take.
    let blob = "x".repeat(50_000);
    let mut peak: f64 = 0.0;
    for i in 0..EVENTS {
        let (s, v) = admin
            .post(
                "/api/v1/namespaces/held/serviceaccounts",
                json!({"metadata": {"name": format!("s{i}"), "annotations": {"blob": blob}}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        if i % 10 == 9 {
            peak = peak.max(held_bytes(&srv).await);
        }
    }
    // The socket's buffers fill, then the connection's budget, and no more.
    eventually(
        BOUND,
        "the stalled connection holds about its budget",
        || async { held_bytes(&srv).await >= BUDGET / 2.0 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    peak = peak.max(held_bytes(&srv).await);
    assert!(
        peak <= BUDGET + EVENT,
        "held {peak} bytes, past the budget {BUDGET} and one event"
    );
    // Reading again, every stream goes on in order: every event, or those it got before it
    // fell out of the history and its 410.
    pause.set(false);
    let want: Vec<String> = (0..EVENTS).map(|i| format!("s{i}")).collect();
    for mut w in watches {
        let mut names = Vec::new();
        while names.len() < EVENTS {
            let ev = w.next().await.expect("the watch goes on");
            if ev["type"] == "ERROR" {
                assert_eq!(ev["object"]["code"], 410, "{ev}");
                break;
            }
            assert_eq!(ev["type"], "ADDED", "{ev}");
            names.push(
                ev["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
        assert_eq!(names[..], want[..names.len()], "in order, from the start");
    }
    drop(conn);
    eventually(
        BOUND,
        "a closed connection gives its bytes back",
        || async { held_bytes(&srv).await == 0.0 },
    )
    .await;
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_list_over_h2_runs_on_the_nicer_threads_and_a_watch_beside_it_goes_on() {
    // 19: apart from every other test server of this process (default 10 steps nicer).
    let srv = TestServer::start_with(|o| o.list_niceness = 19).await;
    create_sa(&srv, "default", "lane").await;
    let conn = connect(&srv, 1 << 20).await;
    let list = get_json(&conn, "/api/v1/namespaces/default/serviceaccounts").await;
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap();
    let (status, mut watch) = send(
        &conn,
        Method::GET,
        &format!("/api/v1/namespaces/default/serviceaccounts?watch=1&resourceVersion={rv}"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (before, threads) = crate::support::threads::settled_bulk_threads(19).await;
    assert!(
        threads >= 1,
        "the server starts its list threads at niceness 19"
    );
    for _ in 0..20 {
        let list = get_json(&conn, "/api/v1/namespaces/default/serviceaccounts").await;
        assert_eq!(list["kind"], "ServiceAccountList");
        assert!(
            list["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|o| o["metadata"]["name"] == "lane")
        );
    }
    let (after, _) = crate::support::threads::bulk_threads(19);
    assert!(
        after > before,
        "the lists ran on the niceness-19 threads ({before} ns before, {after} ns after)"
    );
    // The watch on the same connection still gets its events.
    create_sa(&srv, "default", "lane-2").await;
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("lane-2") {
        let chunk = tokio::time::timeout(BOUND, watch.data())
            .await
            .expect("the watch gets its event in time")
            .expect("the watch goes on")
            .unwrap();
        let _ = watch.flow_control().release_capacity(chunk.len());
        seen.extend_from_slice(&chunk);
    }
}

/// A whole list's body is shared by the lists at its revision while a response still holds
/// it (here: a client that does not read, its stream's window full). A list asked for after
/// a write is never given it: it holds the new object, and the held list, read at last, does
/// not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_list_body_is_shared_at_its_revision_and_never_served_for_a_later_one() {
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "shared").await;
    let path = "/api/v1/namespaces/shared/serviceaccounts";
    let blob = "x".repeat(20_000);
    for i in 0..8 {
        let (s, v) = admin
            .post(
                path,
                json!({"metadata": {"name": format!("big-{i}"), "annotations": {"blob": blob}}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    // 160 KB of list over a 64 KiB window, not read: the server holds the rest.
    let slow = connect(&srv, 65_535).await;
    let (s, mut held) = send(&slow, Method::GET, path, None).await;
    assert_eq!(s, StatusCode::OK);
    let fast = connect(&srv, 16 << 20).await;
    let (_, mut first) = send(&fast, Method::GET, path, None).await;
    let first = read_all(&mut first).await;
    let (s, v) = admin
        .post(path, json!({"metadata": {"name": "after"}}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (_, mut later) = send(&fast, Method::GET, path, None).await;
    let later: Value = serde_json::from_slice(&read_all(&mut later).await).unwrap();
    let names = |l: &Value| -> Vec<String> {
        l["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(
        names(&later).contains(&"after".to_string()),
        "{:?}",
        names(&later)
    );
    let held = read_all(&mut held).await;
    assert_eq!(held, first, "two lists at one revision, one body");
    let held: Value = serde_json::from_slice(&held).unwrap();
    assert!(!names(&held).contains(&"after".to_string()));
    assert_eq!(
        names(&held)
            .iter()
            .filter(|n| n.starts_with("big-"))
            .count(),
        8
    );
}

/// `apiserver_watch_cache_watchers` of service accounts: registrations with the cache, which
/// the watches of one watch on a connection share once caught up.
async fn sa_registrations(srv: &TestServer) -> f64 {
    metric(srv, |l| {
        l.starts_with("apiserver_watch_cache_watchers{") && l.contains("serviceaccounts")
    })
    .await
    .0
}

/// Creates ServiceAccounts `e0`..`e{n-1}` in `ns`, labelled `t=h2`, each with an annotation
/// of `size` bytes.
async fn create_blobs(srv: &TestServer, ns: &str, n: usize, size: usize) {
    let blob = "x".repeat(size);
    for i in 0..n {
        let (s, v) = srv
            .admin()
            .post(
                &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
                json!({"metadata": {"name": format!("e{i}"), "labels": {"t": "h2"}, "annotations": {"blob": blob}}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
}

/// Opens `n` streams on `conn` of one watch, of the ServiceAccounts labelled `t=h2` in `ns`
/// from `rv`, and waits until they share one registration (`regs` were there before).
async fn open_shared(
    srv: &TestServer,
    conn: &SendRequest<Bytes>,
    ns: &str,
    rv: &str,
    n: usize,
    regs: f64,
) -> Vec<Events> {
    let path = format!(
        "/api/v1/namespaces/{ns}/serviceaccounts?watch=1&labelSelector=t%3Dh2&resourceVersion={rv}"
    );
    let mut streams = Vec::new();
    for _ in 0..n {
        streams.push(Events::open(conn, &path).await);
    }
    eventually(
        BOUND,
        &format!("the {n} share one registration"),
        || async { sa_registrations(srv).await - regs == 1.0 },
    )
    .await;
    streams
}

/// Reads the names of `n` events from each of `streams`, all at once (a connection's window
/// is its streams' together), each on a task that gives back the names and the stream.
fn read_each(
    streams: Vec<Events>,
    n: usize,
) -> Vec<tokio::task::JoinHandle<(Vec<String>, Events)>> {
    streams
        .into_iter()
        .map(|mut w| tokio::spawn(async move { (names(&mut w, n).await, w) }))
        .collect()
}

/// The names in `n` events of `w`, which must all be ADDED.
async fn names(w: &mut Events, n: usize) -> Vec<String> {
    let mut names = Vec::new();
    while names.len() < n {
        let ev = w.next().await.expect("the watch is open");
        assert_eq!(ev["type"], "ADDED", "{ev}");
        names.push(
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_of_one_watch_on_a_connection_share_one_registration() {
    const WATCHES: usize = 50;
    const EVENTS: usize = 10;
    let srv = TestServer::start_with(|o| o.http2_max_streams_per_connection = 500).await;
    let regs = sa_registrations(&srv).await;
    let (before, conn, mut watches) = watches_on_one_connection(&srv, "shared", WATCHES).await;
    // Every stream is counted as a watch, and once caught up they are served from one
    // registration with the cache.
    eventually(BOUND, "the watches share one registration", || async {
        sa_registrations(&srv).await - regs == 1.0
    })
    .await;
    // Another selector on the same connection is another watch: a registration of its own.
    let rv = list_rv(&srv, "/api/v1/namespaces/shared/serviceaccounts").await;
    let mut other = Events::open(
        &conn,
        &format!(
            "/api/v1/namespaces/shared/serviceaccounts?watch=1&labelSelector=t%3Dother&resourceVersion={rv}"
        ),
    )
    .await;
    eventually(BOUND, "the other watch registers alone", || async {
        sa_registrations(&srv).await - regs == 2.0
    })
    .await;
    for i in 0..EVENTS {
        create_sa(&srv, "shared", &format!("c{i}")).await;
    }
    let want: Vec<String> = (0..EVENTS).map(|i| format!("c{i}")).collect();
    for (n, w) in watches.iter_mut().enumerate() {
        assert_eq!(
            names(w, EVENTS).await,
            want,
            "watch {n}: every event, in order"
        );
    }
    // A stream the client resets leaves the others served.
    drop(watches.pop());
    create_sa(&srv, "shared", "after").await;
    for (n, w) in watches.iter_mut().enumerate() {
        assert_eq!(names(w, 1).await, ["after"], "watch {n}");
    }
    // The other watch saw none of them.
    let (s, v) = srv
        .admin()
        .post(
            "/api/v1/namespaces/shared/serviceaccounts",
            json!({"metadata": {"name": "o", "labels": {"t": "other"}}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(names(&mut other, 1).await, ["o"]);
    drop(watches);
    drop(other);
    eventually(BOUND, "the watches and the registrations end", || async {
        sa_watchers(&srv).await == before && sa_registrations(&srv).await == regs
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_a_shared_watch_that_is_not_read_leaves_it_and_holds_up_no_other() {
    const EVENTS: usize = 40;
    let srv = TestServer::start_with(|o| {
        o.watch_cache_history_max_bytes = 4 << 20;
        o.watch_cache_watcher_queue_limit = 64;
    })
    .await;
    let regs = sa_registrations(&srv).await;
    let rv = new_namespace(&srv, "lag").await;
    // Every stream's window is 16 KiB: one that is not read fills it with its first event.
    let conn = connect(&srv, 16 * 1024).await;
    let mut live = open_shared(&srv, &conn, "lag", &rv, 4, regs).await;
    let mut stalled = live.remove(0);
    let readers = read_each(live, EVENTS);
    // 40 events of 20 KB: 800 KB, far past the stalled stream's window and what a stream
    // may have behind in its group (64 KiB), well within the 4 MiB history.
    create_blobs(&srv, "lag", EVENTS, 20_000).await;
    let want: Vec<String> = (0..EVENTS).map(|i| format!("e{i}")).collect();
    let mut kept = Vec::new();
    for r in readers {
        let (got, w) = r.await.unwrap();
        assert_eq!(got, want, "every read stream got every event in order");
        kept.push(w);
    }
    // The stalled stream left the group, with a registration of its own at its place.
    assert_eq!(sa_registrations(&srv).await - regs, 2.0);
    // Read now, it gets every event in order, and once caught up it joins again.
    assert_eq!(
        names(&mut stalled, EVENTS).await,
        want,
        "the stalled stream"
    );
    eventually(
        BOUND,
        "the caught-up stream joins its group again",
        || async { sa_registrations(&srv).await - regs == 1.0 },
    )
    .await;
    create_sa(&srv, "lag", "last").await;
    assert_eq!(names(&mut stalled, 1).await, ["last"]);
    for w in &mut kept {
        assert_eq!(names(w, 1).await, ["last"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_watch_whose_connection_is_not_read_waits_in_the_ring_as_one() {
    const EVENTS: usize = 100;
    let srv = TestServer::start_with(|o| o.watch_cache_history_max_bytes = 4 << 20).await;
    let regs = sa_registrations(&srv).await;
    let rv = new_namespace(&srv, "shut").await;
    // Each stream may take 1 MiB, the connection 64 KiB: the connection's window is what
    // stops them, all four alike, once the client does not read.
    let conn = connect_windows(&srv, 1 << 20, 65_535).await;
    let streams = open_shared(&srv, &conn, "shut", &rv, 4, regs).await;
    // 100 events of 2 KB to each of four streams: 800 KB, twelve times the connection's
    // window, far past what a stream may have behind in its group (64 KiB).
    create_blobs(&srv, "shut", EVENTS, 2_000).await;
    // Nobody is behind on its own account: the group waits for the window with the events
    // in the ring, and keeps its one registration (no stream left with one of its own).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sa_registrations(&srv).await - regs, 1.0);
    // Read now, every stream gets every event in order, several to a DATA frame.
    let readers = read_each(streams, EVENTS);
    let want: Vec<String> = (0..EVENTS).map(|i| format!("e{i}")).collect();
    let mut streams = Vec::new();
    for (n, r) in readers.into_iter().enumerate() {
        let (got, w) = r.await.unwrap();
        assert_eq!(got, want, "stream {n}");
        assert!(
            w.frames * 2 <= EVENTS,
            "stream {n}: {EVENTS} events in {} DATA frames",
            w.frames
        );
        streams.push(w);
    }
    assert_eq!(sa_registrations(&srv).await - regs, 1.0);
    create_sa(&srv, "shut", "last").await;
    for w in &mut streams {
        assert_eq!(names(w, 1).await, ["last"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_larger_than_a_default_window_reach_every_stream_of_a_shared_watch() {
    const EVENTS: usize = 12;
    let srv = TestServer::start_with(|o| o.watch_cache_history_max_bytes = 4 << 20).await;
    let regs = sa_registrations(&srv).await;
    let rv = new_namespace(&srv, "big").await;
    // h2's default windows, 65,535 bytes for each stream and for the connection: three
    // streams of events of 50 KB never fit the connection's window together, and a client
    // sends its WINDOW_UPDATE only once it has read a part of it.
    let conn = connect_windows(&srv, 65_535, 65_535).await;
    let streams = open_shared(&srv, &conn, "big", &rv, 3, regs).await;
    let readers = read_each(streams, EVENTS);
    create_blobs(&srv, "big", EVENTS, 50_000).await;
    let want: Vec<String> = (0..EVENTS).map(|i| format!("e{i}")).collect();
    for (n, r) in readers.into_iter().enumerate() {
        assert_eq!(r.await.unwrap().0, want, "stream {n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_of_a_shared_watch_end_at_their_own_deadlines_with_their_last_bookmark() {
    let srv = TestServer::start().await;
    let regs = sa_registrations(&srv).await;
    let rv = new_namespace(&srv, "due").await;
    let conn = connect(&srv, 1 << 20).await;
    // One watch, three deadlines: timeoutSeconds is the stream's, not the watch's.
    let mut streams = Vec::new();
    for timeout in [1, 3, 30] {
        let path = format!(
            "/api/v1/namespaces/due/serviceaccounts?watch=1&labelSelector=t%3Dh2&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds={timeout}"
        );
        streams.push(Events::open(&conn, &path).await);
    }
    eventually(BOUND, "the three share one registration", || async {
        sa_registrations(&srv).await - regs == 1.0
    })
    .await;
    create_sa(&srv, "due", "first").await;
    let mut last_rv = 0u64;
    for w in &mut streams {
        let ev = w.next().await.expect("open");
        assert_eq!(ev["object"]["metadata"]["name"], "first");
        last_rv = ev["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    }
    let started = tokio::time::Instant::now();
    // Each of the first two ends at its deadline, its last event a bookmark at least as far
    // as what it got; the third goes on.
    let mut third = streams.pop().unwrap();
    for (n, mut w) in streams.into_iter().enumerate() {
        let mut last = None;
        while let Some(ev) = w.next().await {
            last = Some(ev);
        }
        let last = last.unwrap_or_else(|| panic!("stream {n} ended without a bookmark"));
        assert_eq!(last["type"], "BOOKMARK", "stream {n}: {last}");
        let at: u64 = last["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            at >= last_rv,
            "stream {n}: bookmark at {at}, before {last_rv}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the short deadlines were kept"
    );
    create_sa(&srv, "due", "second").await;
    assert_eq!(names(&mut third, 1).await, ["second"]);
}
