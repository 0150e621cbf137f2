//! HTTP/1.1 byte by byte through a TLS socket: pipelined GETs, a write in the middle of a
//! connection (from there on hyper's), chunked watch bodies, a client leaving mid-watch, and
//! `connection: close`, read with a small response parser of the test's own.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::support::client::{TestServer, create_namespace};
#[cfg(target_os = "linux")]
use crate::support::threads::{bulk_threads, settled_bulk_threads};

/// Every step must end well within this.
const BOUND: Duration = Duration::from_secs(10);

async fn tls(srv: &TestServer) -> TlsStream<TcpStream> {
    srv.admin_tls(b"http/1.1").await
}

/// Responses read off a connection, one after the other.
struct Reader<R> {
    r: R,
    buf: Vec<u8>,
}

struct Head {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Head {
    fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl<R: AsyncRead + Unpin> Reader<R> {
    async fn fill(&mut self) {
        let mut more = [0u8; 8192];
        let n = tokio::time::timeout(BOUND, self.r.read(&mut more))
            .await
            .expect("the server answers in time")
            .expect("the connection stays up");
        assert!(n > 0, "the server closed the connection mid-response");
        self.buf.extend_from_slice(&more[..n]);
    }

    async fn line(&mut self) -> String {
        loop {
            if let Some(at) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..at + 2).take(at).collect();
                return String::from_utf8(line).unwrap();
            }
            self.fill().await;
        }
    }

    async fn exact(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            self.fill().await;
        }
        self.buf.drain(..n).collect()
    }

    async fn head(&mut self) -> Head {
        let status = self.line().await;
        assert!(status.starts_with("HTTP/1.1 "), "{status}");
        let status = status[9..12].parse().unwrap();
        let mut headers = Vec::new();
        loop {
            let l = self.line().await;
            if l.is_empty() {
                return Head { status, headers };
            }
            let (k, v) = l.split_once(':').unwrap();
            headers.push((k.to_string(), v.trim().to_string()));
        }
    }

    /// One chunk of a chunked body (empty: the last).
    async fn chunk(&mut self) -> Vec<u8> {
        let size = usize::from_str_radix(self.line().await.trim(), 16).unwrap();
        let data = self.exact(size).await;
        assert_eq!(self.exact(2).await, b"\r\n");
        if size == 0 {
            assert!(data.is_empty());
        }
        data
    }

    async fn body(&mut self, head: &Head) -> Vec<u8> {
        if let Some(len) = head.get("content-length") {
            assert!(head.get("transfer-encoding").is_none());
            return self.exact(len.parse().unwrap()).await;
        }
        assert_eq!(head.get("transfer-encoding"), Some("chunked"));
        let mut body = Vec::new();
        loop {
            let c = self.chunk().await;
            if c.is_empty() {
                return body;
            }
            body.extend_from_slice(&c);
        }
    }

    async fn response(&mut self) -> (Head, Value) {
        let head = self.head().await;
        let body = self.body(&head).await;
        (head, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// True once the server has closed the connection (nothing more buffered or sent).
    async fn closed(&mut self) -> bool {
        let mut more = [0u8; 64];
        matches!(
            tokio::time::timeout(BOUND, self.r.read(&mut more)).await,
            Ok(Ok(0) | Err(_))
        )
    }
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\r\n")
}

#[tokio::test]
async fn pipelined_gets_a_write_and_gets_after_it_are_answered_in_order_on_one_connection() {
    let srv = TestServer::start().await;
    let (r, mut w) = tokio::io::split(tls(&srv).await);
    let mut rd = Reader { r, buf: Vec::new() };
    let ns = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"pipelined"}}"#;
    // All in one write: two GETs, a POST (a body: hyper serves the rest), two GETs.
    let mut all = get("/api/v1/namespaces/default");
    all += &get("/readyz");
    all += &format!(
        "POST /api/v1/namespaces HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{ns}",
        ns.len()
    );
    all += &get("/api/v1/namespaces/pipelined");
    all += &get("/api/v1/namespaces/no-such-namespace");
    w.write_all(all.as_bytes()).await.unwrap();

    let (h, v) = rd.response().await;
    assert_eq!(h.status, 200);
    assert_eq!(v["metadata"]["name"], "default");
    assert!(h.get("date").is_some());
    let h = rd.head().await;
    assert_eq!(h.status, 200);
    assert_eq!(rd.body(&h).await, b"ok");
    let (h, v) = rd.response().await;
    assert_eq!(h.status, 201, "{v}");
    let (h, v) = rd.response().await;
    assert_eq!(h.status, 200);
    assert_eq!(v["metadata"]["name"], "pipelined");
    let (h, v) = rd.response().await;
    assert_eq!(h.status, 404);
    assert_eq!(v["kind"], "Status");
    assert_eq!(v["reason"], "NotFound");

    // A GET on a fresh connection that asks to close gets its answer, then the close.
    let (r, mut w) = tokio::io::split(tls(&srv).await);
    let mut rd = Reader { r, buf: Vec::new() };
    w.write_all(
        b"GET /api/v1/namespaces/default HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let (h, v) = rd.response().await;
    assert_eq!(h.status, 200);
    assert_eq!(v["metadata"]["name"], "default");
    assert_eq!(h.get("connection"), Some("close"));
    assert!(
        rd.closed().await,
        "the connection closes after the response"
    );
}

/// The `apiserver_registered_watchers` gauge for Namespaces.
async fn namespace_watchers(srv: &TestServer) -> f64 {
    let text = srv
        .admin()
        .request(http::Method::GET, "/metrics", "", &[])
        .await
        .text();
    text.lines()
        .filter(|l| l.starts_with("apiserver_registered_watchers{") && l.contains("Namespace"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_watch_is_a_chunked_stream_of_events_and_ends_when_its_client_leaves() {
    let srv = TestServer::start().await;
    let admin = srv.admin();
    let rv = admin.get("/api/v1/namespaces").await.1["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let before = namespace_watchers(&srv).await;
    let (r, mut w) = tokio::io::split(tls(&srv).await);
    let mut rd = Reader { r, buf: Vec::new() };
    w.write_all(get(&format!("/api/v1/namespaces?watch=1&resourceVersion={rv}")).as_bytes())
        .await
        .unwrap();
    let h = rd.head().await;
    assert_eq!(h.status, 200);
    assert_eq!(h.get("transfer-encoding"), Some("chunked"));
    assert!(h.get("content-length").is_none());
    assert!(
        h.get("content-type")
            .unwrap()
            .starts_with("application/json")
    );
    assert_eq!(namespace_watchers(&srv).await, before + 1.0);
    for name in ["chunked-1", "chunked-2"] {
        create_namespace(&admin, name).await;
        let mut seen = String::new();
        while !seen.contains(name) {
            let c = rd.chunk().await;
            assert!(!c.is_empty(), "the watch does not end");
            seen += std::str::from_utf8(&c).unwrap();
        }
        let events: Vec<Value> = seen
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let last = events.last().unwrap();
        assert_eq!(last["type"], "ADDED");
        assert_eq!(last["object"]["metadata"]["name"], name);
    }
    // The client goes away without a word: the watch is ended and unregistered.
    drop(rd);
    drop(w);
    let deadline = tokio::time::Instant::now() + BOUND;
    while namespace_watchers(&srv).await != before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch of a client that left is still registered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn lists_run_on_the_nicer_threads_and_the_connection_comes_back_for_the_rest() {
    // 19: apart from every other test server of this process (default 10 steps nicer).
    let srv = TestServer::start_with(|o| o.list_niceness = 19).await;
    let (before, threads) = settled_bulk_threads(19).await;
    assert!(
        threads >= 1,
        "the server starts its list threads at niceness 19"
    );
    let (r, mut w) = tokio::io::split(tls(&srv).await);
    let mut rd = Reader { r, buf: Vec::new() };
    let ns = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"lanes"}}"#;
    // Lists (bulk threads), a get and a readyz (request threads), lists again, a POST (hyper
    // from there on), and a list that hyper serves.
    let mut all = String::new();
    for _ in 0..20 {
        all += &get("/api/v1/namespaces");
    }
    all += &get("/api/v1/namespaces/default");
    all += &get("/readyz");
    all += &get("/api/v1/namespaces?limit=1");
    all += &format!(
        "POST /api/v1/namespaces HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{ns}",
        ns.len()
    );
    all += &get("/api/v1/namespaces");
    w.write_all(all.as_bytes()).await.unwrap();
    for _ in 0..20 {
        let (h, v) = rd.response().await;
        assert_eq!(h.status, 200);
        assert_eq!(v["kind"], "NamespaceList");
        assert!(!v["items"].as_array().unwrap().is_empty());
    }
    let (h, v) = rd.response().await;
    assert_eq!(
        (h.status, &v["metadata"]["name"]),
        (200, &Value::from("default"))
    );
    let h = rd.head().await;
    assert_eq!(h.status, 200);
    assert_eq!(rd.body(&h).await, b"ok");
    let (h, v) = rd.response().await;
    assert_eq!(h.status, 200);
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    let (h, v) = rd.response().await;
    assert_eq!(h.status, 201, "{v}");
    let (h, v) = rd.response().await;
    assert_eq!(h.status, 200);
    let names: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert!(names.contains(&"lanes"), "{names:?}");
    let (after, _) = bulk_threads(19);
    assert!(
        after > before,
        "the lists ran on the niceness-19 threads ({before} ns before, {after} ns after)"
    );
}
