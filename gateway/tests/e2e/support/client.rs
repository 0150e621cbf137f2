//! Test support: an in-process server on loopback and a small HTTPS client (HTTP/1.1 or h2)
//! that speaks to it through real TLS sockets.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde_json::Value;
use svc_gateway::base::flags::Options;
use svc_gateway::run::ServerHandle;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

pub struct TestServer {
    pub handle: Option<ServerHandle>,
    /// The data directory; removed when the server is dropped.
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(f: impl FnOnce(&mut Options)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = Options::for_tests(dir.path().to_path_buf());
        f(&mut opts);
        let handle = svc_gateway::run::start(opts).await.unwrap();
        let s = TestServer {
            handle: Some(handle),
            _dir: dir,
        };
        s.wait_ready().await;
        s
    }

    pub fn handle(&self) -> &ServerHandle {
        self.handle.as_ref().unwrap()
    }

    /// What the standalone server serves with beside the `Api`: its registry and security.
    pub fn own(&self) -> &svc_gateway::http::api::Standalone {
        self.handle().app.standalone().unwrap()
    }

    /// A client with the admin certificate (group system:masters).
    pub fn admin(&self) -> Client {
        let (cert, key) = self.handle().pki.admin_credentials();
        self.client_with(Some((cert.to_string(), key.to_string())), false)
    }

    /// A raw TLS stream with the admin certificate, offering `alpn` (for tests that write
    /// the protocol byte by byte).
    pub async fn admin_tls(&self, alpn: &[u8]) -> tokio_rustls::client::TlsStream<TcpStream> {
        let (cert, key) = self.handle().pki.admin_credentials();
        let cfg = self
            .handle()
            .pki
            .client_config_for(Some((cert, key)), &[alpn])
            .unwrap();
        let tcp = TcpStream::connect(self.handle().addr).await.unwrap();
        TlsConnector::from(cfg)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap()
    }

    /// A client presenting no certificate.
    pub fn anonymous(&self) -> Client {
        self.client_with(None, false)
    }

    /// A client for another user, with a certificate issued by the cluster CA.
    pub fn user(&self, name: &str, groups: &[&str]) -> Client {
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        let (cert, key) = self
            .handle()
            .pki
            .issue_client_cert(name, &groups, Duration::from_secs(3600))
            .unwrap();
        self.client_with(Some((cert, key)), false)
    }

    pub fn client_with(&self, creds: Option<(String, String)>, h2: bool) -> Client {
        let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
        let tls = self
            .handle()
            .pki
            .client_config_for(creds.as_ref().map(|(c, k)| (c.as_str(), k.as_str())), alpn)
            .unwrap();
        Client {
            addr: self.handle().addr,
            tls,
            h2,
        }
    }

    async fn wait_ready(&self) {
        let c = self.admin();
        eventually(
            Duration::from_secs(5),
            "the server becomes ready",
            || async { c.get("/readyz").await.0 == StatusCode::OK },
        )
        .await;
        // The built-in namespaces' `default` accounts are written by a controller just
        // after start: wait for them, so no test sees them appear midway.
        for ns in svc_gateway::controllers::bootstrap::SYSTEM_NAMESPACES {
            let path = format!("/api/v1/namespaces/{ns}/serviceaccounts/default");
            eventually(
                Duration::from_secs(10),
                "the built-in namespaces' default service accounts exist",
                || async { c.get(&path).await.0 == StatusCode::OK },
            )
            .await;
        }
    }
}

/// Polls `check` until it holds, panicking with `what` after `limit`: a wait on a condition
/// instead of a sleep that guesses how long the server takes.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Clone)]
pub struct Client {
    pub addr: std::net::SocketAddr,
    pub tls: Arc<rustls::ClientConfig>,
    pub h2: bool,
}

#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A sender on one connection, HTTP/1.1 or h2.
pub enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Conn {
    pub async fn send(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> hyper::Result<http::Response<hyper::body::Incoming>> {
        match self {
            Conn::H1(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
            Conn::H2(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
        }
    }
}

impl Client {
    /// A new TLS connection of this client's (its configuration, and so its session cache,
    /// shared with its other connections), before any protocol is spoken on it.
    pub async fn tls_stream(&self) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        TlsConnector::from(self.tls.clone())
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    }

    pub async fn connect(&self) -> std::io::Result<Conn> {
        let tls = self.tls_stream().await?;
        let io = TokioIo::new(tls);
        if self.h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Ok(Conn::H2(send))
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Ok(Conn::H1(send))
        }
    }

    pub fn build(
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
        headers: &[(&str, &str)],
    ) -> Request<Full<Bytes>> {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Full::new(body.into())).unwrap()
    }

    pub async fn send(&self, req: Request<Full<Bytes>>) -> Resp {
        let mut conn = self.connect().await.expect("connect");
        let resp = conn.send(req).await.expect("request");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Resp {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Resp {
        self.send(Self::build(method, path, body.to_string(), headers))
            .await
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let r = self.request(Method::GET, path, "", &[]).await;
        let v = serde_json::from_slice(&r.body).unwrap_or(Value::String(r.text()));
        (r.status, v)
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r = self
            .request(
                Method::POST,
                path,
                &body.to_string(),
                &[("content-type", "application/json")],
            )
            .await;
        (r.status, r.json())
    }

    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r = self
            .request(
                Method::PUT,
                path,
                &body.to_string(),
                &[("content-type", "application/json")],
            )
            .await;
        (r.status, r.json())
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        let r = self.request(Method::DELETE, path, "", &[]).await;
        (r.status, r.json())
    }

    /// Opens a watch and returns a stream of decoded events (one JSON document per line).
    pub async fn watch(&self, path: &str) -> WatchStream {
        let mut conn = self.connect().await.expect("connect");
        let resp = conn
            .send(Self::build(Method::GET, path, Bytes::new(), &[]))
            .await
            .expect("watch");
        assert_eq!(resp.status(), StatusCode::OK, "watch {path}");
        WatchStream {
            body: resp.into_body(),
            buf: Vec::new(),
            _conn: Some(conn),
        }
    }
}

/// A watch response read as newline-delimited JSON events.
pub struct WatchStream {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
    /// The connection, when the stream owns it (h2 streams share one they do not own).
    _conn: Option<Conn>,
}

impl WatchStream {
    /// Reads the body of a watch response sent on a connection the caller keeps.
    pub fn from_body(body: hyper::body::Incoming) -> Self {
        WatchStream {
            body,
            buf: Vec::new(),
            _conn: None,
        }
    }

    /// The next event, or None when the server ends the stream.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).expect("watch event JSON"));
            }
            let frame = self.body.frame().await?.ok()?;
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }

    /// The next event within `d`, panicking on timeout.
    pub async fn next_within(&mut self, d: Duration) -> Option<Value> {
        tokio::time::timeout(d, self.next())
            .await
            .expect("timed out waiting for a watch event")
    }
}

/// Drains a stream of events into (type, name, resourceVersion) triples.
pub fn summary(ev: &Value) -> (String, String, String) {
    (
        ev["type"].as_str().unwrap_or_default().to_string(),
        ev["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        ev["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// Creates namespace `name` and waits until the service-account controller has given it
/// its `default` account, as a real cluster's tests wait before they use a namespace: the
/// account's ADDED event then comes before anything the test writes there.
pub async fn create_namespace(c: &Client, name: &str) {
    let (s, body) = c
        .post(
            "/api/v1/namespaces",
            serde_json::json!({"metadata": {"name": name}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let path = format!("/api/v1/namespaces/{name}/serviceaccounts/default");
    eventually(
        Duration::from_secs(10),
        "the default service account exists",
        || async { c.get(&path).await.0 == StatusCode::OK },
    )
    .await;
}

/// Asserts what a client whose watch just ended at shutdown meets when it goes on at once:
/// its h2 connection has already said GOAWAY (a new stream is refused by the client itself),
/// and `addr`'s listener is already closed (a new connection is refused).
pub async fn assert_goaway_and_listener_closed(
    conn: h2::client::SendRequest<Bytes>,
    addr: std::net::SocketAddr,
) {
    let err = match conn.ready().await {
        Err(e) => e,
        Ok(mut s) => match s.send_request(
            http::Request::get("https://localhost/readyz")
                .body(())
                .unwrap(),
            true,
        ) {
            Err(e) => e,
            Ok(_) => panic!("a new stream was sent on a connection whose watch had ended"),
        },
    };
    assert!(
        err.is_go_away() && err.is_remote(),
        "the connection said GOAWAY before the watch ended: {err:?}"
    );
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed before the watches end"
    );
}
