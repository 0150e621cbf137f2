//! Hostile clients through real sockets: slow and oversized request heads, silent TLS
//! handshakes, idle connections, h2 rapid reset and CONTINUATION floods written frame by frame,
//! streams and connections past their caps, and client-controlled numbers (negative, huge,
//! overflowing) in query parameters, headers and bodies. Each case checks the documented
//! answer and that the server still serves everyone else.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use rustls::pki_types::ServerName;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::support::client::{Client, TestServer, create_namespace};
use crate::support::h2raw::{
    ACK, CANCEL, CONTINUATION, DATA, END_HEADERS, END_STREAM, Frame, GOAWAY, HEADERS, PREFACE,
    REFUSED_STREAM, RST_STREAM, SETTINGS, frame,
};

/// Every case must end well within this.
const BOUND: Duration = Duration::from_secs(10);

async fn assert_still_serving(srv: &TestServer) {
    for h2 in [false, true] {
        let (cert, key) = srv.handle().pki.admin_credentials();
        let c = srv.client_with(Some((cert.into(), key.into())), h2);
        let (status, body) = c.get("/api/v1/namespaces").await;
        assert_eq!(status, StatusCode::OK, "h2={h2}: {body}");
    }
}

/// A TLS stream to the server with the admin certificate, offering `alpn`.
async fn tls(srv: &TestServer, alpn: &[u8]) -> TlsStream<TcpStream> {
    srv.admin_tls(alpn).await
}

/// Reads until the peer closes (EOF or error); false if it is still open after `limit`.
async fn closed_within<R: AsyncReadExt + Unpin>(r: &mut R, limit: Duration) -> bool {
    let mut buf = vec![0u8; 16 * 1024];
    tokio::time::timeout(limit, async {
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

// ---------------------------------------------------------------------------------------
// Raw h2: frames written and read by hand, so a test can do what no well-behaved client does.

/// An HPACK block for `GET <path>` (static-table indexes; literals without indexing).
fn get_block(path: &str) -> Vec<u8> {
    assert!(path.len() < 127);
    let mut b = vec![0x82, 0x87]; // :method GET, :scheme https
    b.push(0x04); // :path, literal value
    b.push(path.len() as u8);
    b.extend_from_slice(path.as_bytes());
    b.push(0x01); // :authority, literal value
    b.push(9);
    b.extend_from_slice(b"localhost");
    b
}

struct RawH2 {
    io: TlsStream<TcpStream>,
    buf: Vec<u8>,
    /// The server's SETTINGS (identifier, value).
    settings: Vec<(u16, u32)>,
}

impl RawH2 {
    async fn connect(srv: &TestServer) -> RawH2 {
        let mut io = tls(srv, b"h2").await;
        assert_eq!(io.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()));
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        io.write_all(&hello).await.unwrap();
        let mut c = RawH2 {
            io,
            buf: Vec::new(),
            settings: Vec::new(),
        };
        loop {
            let f = c.read().await.expect("server SETTINGS");
            if f.kind == SETTINGS && f.flags & ACK == 0 {
                c.settings = f
                    .payload
                    .chunks(6)
                    .map(|s| {
                        (
                            u16::from_be_bytes([s[0], s[1]]),
                            u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
                        )
                    })
                    .collect();
                c.io.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
                return c;
            }
        }
    }

    /// The next frame, or None once the server has closed the connection; panics if neither
    /// comes within `BOUND`.
    async fn read(&mut self) -> Option<Frame> {
        tokio::time::timeout(BOUND, async {
            loop {
                if self.buf.len() >= 9 {
                    let len = (usize::from(self.buf[0]) << 16)
                        | (usize::from(self.buf[1]) << 8)
                        | usize::from(self.buf[2]);
                    if self.buf.len() >= 9 + len {
                        let head: Vec<u8> = self.buf.drain(..9).collect();
                        let payload = self.buf.drain(..len).collect();
                        return Some(Frame {
                            kind: head[3],
                            flags: head[4],
                            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]])
                                & 0x7fff_ffff,
                            payload,
                        });
                    }
                }
                let mut chunk = [0u8; 16 * 1024];
                match self.io.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await
        .expect("a frame or the end of the connection in time")
    }

    /// Reads until a GOAWAY (its error code) or the end of the connection (None).
    async fn until_goaway(&mut self) -> Option<u32> {
        while let Some(f) = self.read().await {
            if f.kind == GOAWAY {
                return Some(u32::from_be_bytes([
                    f.payload[4],
                    f.payload[5],
                    f.payload[6],
                    f.payload[7],
                ]));
            }
        }
        None
    }
}

fn error_code(f: &Frame) -> u32 {
    u32::from_be_bytes([f.payload[0], f.payload[1], f.payload[2], f.payload[3]])
}

// ---------------------------------------------------------------------------------------
// Connections

#[tokio::test]
async fn slow_request_headers_are_cut_off() {
    let srv =
        TestServer::start_with(|o| o.http_header_read_timeout = Duration::from_millis(500)).await;
    let io = tls(&srv, b"http/1.1").await;
    let (mut r, mut w) = tokio::io::split(io);
    // A slowloris: the head never ends, one header line at a time.
    let drip = tokio::spawn(async move {
        w.write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\n")
            .await?;
        for i in 0..200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            w.write_all(format!("X-Drip-{i}: x\r\n").as_bytes()).await?;
        }
        Ok::<_, std::io::Error>(())
    });
    assert!(
        closed_within(&mut r, BOUND).await,
        "a connection sending its head for 20 s is closed after the header read timeout"
    );
    drip.abort();
    // The timeout is for heads only: a watch quiet for longer keeps its connection.
    let admin = srv.admin();
    let rv = admin.get("/api/v1/namespaces").await.1["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut w = admin
        .watch(&format!("/api/v1/namespaces?watch=1&resourceVersion={rv}"))
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    create_namespace(&admin, "after-slowloris").await;
    let ev = w.next_within(BOUND).await.expect("the watch is still open");
    assert_eq!(ev["object"]["metadata"]["name"], "after-slowloris");
    assert_still_serving(&srv).await;
}

#[tokio::test]
async fn a_silent_tls_handshake_is_cut_off() {
    let srv =
        TestServer::start_with(|o| o.tls_handshake_timeout = Duration::from_millis(300)).await;
    let mut tcp = TcpStream::connect(srv.handle().addr).await.unwrap();
    assert!(closed_within(&mut tcp, BOUND).await);
    // Half a handshake (a ClientHello's first bytes) is cut off too.
    let mut tcp = TcpStream::connect(srv.handle().addr).await.unwrap();
    tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    assert!(closed_within(&mut tcp, BOUND).await);
    assert_still_serving(&srv).await;
    // Each is counted by how it ended.
    let metrics = srv
        .admin()
        .request(Method::GET, "/metrics", "", &[])
        .await
        .text();
    let count = |result: &str| {
        let name = format!("svc_tls_handshakes_total{{result=\"{result}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name.as_str()))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    assert_eq!(count("timed_out"), 2.0);
    assert!(count("done") >= 1.0, "the admin's own connection");
    assert_eq!(count("failed"), 0.0);
}

#[tokio::test]
async fn idle_connections_are_closed_but_quiet_watches_are_not() {
    let srv = TestServer::start_with(|o| o.http_idle_timeout = Duration::from_millis(500)).await;
    for h2 in [false, true] {
        let (cert, key) = srv.handle().pki.admin_credentials();
        let c = srv.client_with(Some((cert.into(), key.into())), h2);
        let mut conn = c.connect().await.unwrap();
        let resp = conn
            .send(Client::build(Method::GET, "/readyz", Bytes::new(), &[]))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
        let closed = || match &conn {
            crate::support::client::Conn::H1(s) => s.is_closed(),
            crate::support::client::Conn::H2(s) => s.is_closed(),
        };
        let deadline = tokio::time::Instant::now() + BOUND;
        while !closed() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "h2={h2}: an idle connection stays open"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // A connection that never sends a request (not even h2's preface) is idle as well.
    for alpn in [b"http/1.1".as_slice(), b"h2".as_slice()] {
        let mut io = tls(&srv, alpn).await;
        assert!(closed_within(&mut io, BOUND).await, "{alpn:?}");
    }
    // Nor does one that stops halfway through h2's preface (no ALPN said which protocol).
    let mut io = tls(&srv, b"http/1.1").await;
    io.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    assert!(closed_within(&mut io, BOUND).await, "half a preface");
    // A watch that carries nothing for several idle timeouts keeps its connection.
    let admin = srv.admin();
    for h2 in [false, true] {
        let (cert, key) = srv.handle().pki.admin_credentials();
        let c = srv.client_with(Some((cert.into(), key.into())), h2);
        let rv = admin.get("/api/v1/namespaces").await.1["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let mut w = c
            .watch(&format!("/api/v1/namespaces?watch=1&resourceVersion={rv}"))
            .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let name = format!("quiet-{h2}");
        create_namespace(&admin, &name).await;
        let ev = w.next_within(BOUND).await.expect("the watch is still open");
        assert_eq!(ev["object"]["metadata"]["name"], name.as_str());
    }
}

#[tokio::test]
async fn oversized_request_heads_get_431_over_both_protocols() {
    let srv = TestServer::start_with(|o| o.http_max_header_bytes = 16 * 1024).await;
    let big = "x".repeat(32 * 1024);
    let fits = "x".repeat(4 * 1024);
    for h2 in [false, true] {
        let (cert, key) = srv.handle().pki.admin_credentials();
        let c = srv.client_with(Some((cert.into(), key.into())), h2);
        let r = c
            .request(Method::GET, "/readyz", "", &[("x-fits", &fits)])
            .await;
        assert_eq!(r.status, StatusCode::OK, "h2={h2}");
        let too_big = Client::build(Method::GET, "/readyz", Bytes::new(), &[("x-big", &big)]);
        // Many small headers adding up past the limit, too.
        let many: Vec<(String, String)> = (0..400)
            .map(|i| (format!("x-h{i}"), "y".repeat(60)))
            .collect();
        let headers: Vec<(&str, &str)> =
            many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let too_many = Client::build(Method::GET, "/readyz", Bytes::new(), &headers);
        for req in [too_big, too_many] {
            let mut conn = c.connect().await.unwrap();
            let resp = conn.send(req).await.unwrap();
            assert_eq!(
                resp.status(),
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "h2={h2}"
            );
        }
    }
    assert_still_serving(&srv).await;
}

#[tokio::test]
async fn h2_rapid_reset_gets_goaway_and_others_are_served() {
    let srv = TestServer::start().await;
    let mut c = RawH2::connect(&srv).await;
    let block = get_block("/api/v1/namespaces");
    let mut burst = Vec::new();
    for i in 0..2000u32 {
        let id = 2 * i + 1;
        burst.extend(frame(HEADERS, END_STREAM | END_HEADERS, id, &block));
        burst.extend(frame(RST_STREAM, 0, id, &CANCEL.to_be_bytes()));
    }
    // The server may close before the whole burst is written.
    let _ = c.io.write_all(&burst).await;
    let code = c.until_goaway().await;
    assert_eq!(code, Some(0xb), "GOAWAY with ENHANCE_YOUR_CALM");
    assert_still_serving(&srv).await;
}

#[tokio::test]
async fn h2_continuation_floods_are_cut_off() {
    let srv = TestServer::start_with(|o| o.http_max_header_bytes = 64 * 1024).await;
    // HEADERS without END_HEADERS, then CONTINUATION after CONTINUATION: empty ones (the
    // header list never grows, so only a count stops them), and ones that each carry one more
    // small header field (the list grows past its limit).
    let mut field = vec![0x00, 2, b'x', b'a', 10];
    field.extend_from_slice(&[b'v'; 10]);
    for payload in [Vec::new(), field] {
        let mut c = RawH2::connect(&srv).await;
        let _ =
            c.io.write_all(&frame(HEADERS, END_STREAM, 1, &get_block("/readyz")))
                .await;
        let batch = frame(CONTINUATION, 0, 1, &payload).repeat(1024);
        // 500 batches: half a million frames, far past any limit.
        let writer = async {
            for _ in 0..500 {
                if c.io.write_all(&batch).await.is_err() {
                    return true;
                }
            }
            false
        };
        let cut = tokio::time::timeout(BOUND, writer).await.unwrap_or(false);
        // The server says why with GOAWAY and closes (`read` panics if it does neither).
        let code = c.until_goaway().await;
        assert!(
            cut && code.is_some(),
            "CONTINUATION of {} bytes: flood cut off ({cut}) with GOAWAY ({code:?})",
            payload.len()
        );
    }
    assert_still_serving(&srv).await;
}

#[tokio::test]
async fn h2_streams_past_the_limit_are_refused() {
    let srv = TestServer::start_with(|o| o.http2_max_streams_per_connection = 4).await;
    let mut c = RawH2::connect(&srv).await;
    assert!(
        c.settings.contains(&(0x3, 4)),
        "SETTINGS_MAX_CONCURRENT_STREAMS=4 advertised: {:?}",
        c.settings
    );
    let block = get_block("/api/v1/namespaces?watch=1");
    for i in 0..4u32 {
        c.io.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, 2 * i + 1, &block))
            .await
            .unwrap();
    }
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < 4 {
        let f = c.read().await.expect("watch responses");
        assert_ne!(f.kind, RST_STREAM, "stream {} reset", f.stream);
        if f.kind == HEADERS || f.kind == DATA {
            answered.insert(f.stream);
        }
    }
    // A fifth stream while four watches are open is refused; the others go on.
    c.io.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, 9, &block))
        .await
        .unwrap();
    loop {
        let f = c.read().await.expect("an answer to the fifth stream");
        if f.stream == 9 {
            assert_eq!(f.kind, RST_STREAM, "the fifth stream is not served");
            assert_eq!(error_code(&f), REFUSED_STREAM);
            break;
        }
    }
    // The connection is still usable: a new namespace reaches the four watches.
    create_namespace(&srv.admin(), "after-refusal").await;
    let mut got = std::collections::BTreeSet::new();
    while got.len() < 4 {
        let f = c.read().await.expect("events on the open watches");
        if f.kind == DATA && String::from_utf8_lossy(&f.payload).contains("after-refusal") {
            got.insert(f.stream);
        }
    }
}

#[tokio::test]
async fn connections_past_the_cap_wait_until_one_closes() {
    let srv = TestServer::start_with(|o| o.max_connections = 3).await;
    let (cert, key) = srv.handle().pki.admin_credentials();
    let cfg: Arc<rustls::ClientConfig> = srv
        .handle()
        .pki
        .client_config_for(Some((cert, key)), &[b"http/1.1"])
        .unwrap();
    let open = || async {
        let tcp = TcpStream::connect(srv.handle().addr).await.unwrap();
        TlsConnector::from(cfg.clone())
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    };
    // The readiness probes' connections may still be closing: wait for three places.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            tokio::time::timeout(BOUND, open())
                .await
                .expect("room for three connections")
                .unwrap(),
        );
    }
    let addr = srv.handle().addr;
    let fourth = tokio::spawn(open_owned(addr, cfg.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !fourth.is_finished(),
        "a fourth connection is not accepted while three are open"
    );
    drop(held.pop());
    let mut fourth = tokio::time::timeout(BOUND, fourth)
        .await
        .expect("accepted once one closed")
        .unwrap()
        .unwrap();
    fourth
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(BOUND, fourth.read_to_end(&mut answer))
        .await
        .unwrap()
        .ok();
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    drop(held);
    drop(fourth);
    assert_still_serving(&srv).await;
}

async fn open_owned(
    addr: std::net::SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(cfg)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

// ---------------------------------------------------------------------------------------
// Client-controlled numbers

/// A continue token as the server writes them (base64url JSON), with numbers of our choosing.
fn continue_token(rv: i64, issued: i64) -> String {
    use base64::Engine;
    let t = json!({"v": "meta.svc.io/v1", "rv": rv, "start": "a", "t": issued});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(t.to_string())
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

struct Case {
    method: Method,
    path: String,
    body: String,
    headers: Vec<(&'static str, String)>,
    code: u16,
    /// In the `Status` message (empty: a success, or no `Status` to check).
    says: &'static str,
}

fn case(method: Method, path: impl Into<String>, code: u16, says: &'static str) -> Case {
    Case {
        method,
        path: path.into(),
        body: String::new(),
        headers: Vec::new(),
        code,
        says,
    }
}

fn with_body(mut c: Case, body: serde_json::Value) -> Case {
    c.body = body.to_string();
    c.headers.push(("content-type", "application/json".into()));
    c
}

/// A JSON Patch adding a finalizer at `at` of a Secret with none: 422, as Kubernetes answers
/// a patch that does not apply.
fn patch(path: String, at: &str) -> Case {
    Case {
        method: Method::PATCH,
        path,
        body: json!([
            {"op": "add", "path": "/metadata/finalizers", "value": []},
            {"op": "add", "path": at, "value": "x.io/y"}
        ])
        .to_string(),
        headers: vec![("content-type", "application/json-patch+json".into())],
        code: 422,
        says: "",
    }
}

#[tokio::test]
async fn hostile_numbers_get_a_status_or_their_documented_clamp() {
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "nums").await;
    for name in ["g1", "g2", "g3"] {
        let (s, b) = admin
            .post(
                "/api/v1/namespaces/nums/secrets",
                json!({"metadata": {"name": name}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    let ns = "/api/v1/namespaces";
    let secret = "/api/v1/namespaces/nums/secrets";
    let token = "/api/v1/namespaces/nums/serviceaccounts/default/token";
    let csr = "/apis/certificates.svc.io/v1/certificatesigningrequests";
    let tr = |secs: serde_json::Value| {
        json!({"apiVersion": "authentication.svc.io/v1", "kind": "TokenRequest",
               "spec": {"expirationSeconds": secs}})
    };
    let max = i64::MAX;
    let now = unix_now();
    let cases = vec![
        // limit: zero and negative mean "no limit", as in Kubernetes; the largest int64 is
        // just a large page; past int64 is not a number.
        case(Method::GET, format!("{ns}?limit=-1"), 200, ""),
        case(Method::GET, format!("{ns}?limit=0"), 200, ""),
        case(Method::GET, format!("{ns}?limit={max}"), 200, ""),
        case(Method::GET, format!("{ns}?limit=9223372036854775808"), 400, "limit"),
        case(Method::GET, format!("{ns}?limit=1e3"), 400, "limit"),
        // timeoutSeconds: negative refused; huge watch timeouts are capped at a year.
        case(Method::GET, format!("{ns}?timeoutSeconds=-1"), 400, "timeoutSeconds"),
        case(Method::GET, format!("{ns}?watch=1&timeoutSeconds=-1"), 400, "timeoutSeconds"),
        case(Method::GET, format!("{ns}?timeoutSeconds=1e99"), 400, "timeoutSeconds"),
        case(Method::GET, format!("{ns}?watch=1&timeoutSeconds={max}"), 200, ""),
        // resourceVersion: not a revision; a revision from the far future (504 after a wait,
        // as Kubernetes' "Too large resource version").
        case(Method::GET, format!("{ns}?resourceVersion=-1"), 400, "resource version"),
        case(Method::GET, format!("{ns}?resourceVersion=99999999999999999999"), 400, "resource version"),
        case(Method::GET, format!("{ns}?resourceVersion={max}"), 504, "Too large resource version"),
        case(Method::GET, format!("{ns}?watch=1&resourceVersion=-1"), 400, "resource version"),
        case(Method::GET, format!("{ns}?watch=1&resourceVersion={max}"), 504, "Too large resource version"),
        case(Method::GET, format!("{ns}?resourceVersion=1&resourceVersionMatch=Exact&limit={max}"), 200, ""),
        // continue tokens: garbage, a revision out of range, issued in the future or at the
        // beginning of time.
        case(Method::GET, format!("{ns}?continue=%21%21"), 400, "continue"),
        case(Method::GET, format!("{ns}?limit=1&continue={}", continue_token(-1, now)), 400, "continue"),
        case(Method::GET, format!("{ns}?limit=1&continue={}", continue_token(max, now)), 400, "continue"),
        case(Method::GET, format!("{ns}?limit=1&continue={}", continue_token(1, max)), 400, "continue"),
        case(Method::GET, format!("{ns}?limit=1&continue={}", continue_token(1, now + 3600)), 400, "continue"),
        case(Method::GET, format!("{ns}?limit=1&continue={}", continue_token(1, i64::MIN)), 410, "too old"),
        // gracePeriodSeconds, in the query and in DeleteOptions.
        case(Method::DELETE, format!("{secret}/g1?gracePeriodSeconds=-1"), 422, "gracePeriodSeconds"),
        case(Method::DELETE, format!("{secret}/g1?gracePeriodSeconds=99999999999999999999"), 400, "gracePeriodSeconds"),
        with_body(
            case(Method::DELETE, format!("{secret}/g1"), 422, "gracePeriodSeconds"),
            json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": -5}),
        ),
        with_body(
            case(Method::DELETE, format!("{secret}/g1"), 400, ""),
            json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 1e300}),
        ),
        case(Method::DELETE, format!("{secret}/g2?gracePeriodSeconds={max}"), 200, ""),
        // expirationSeconds of a TokenRequest (int64) and of a CertificateSigningRequest
        // (int32).
        with_body(case(Method::POST, token, 422, "expirationSeconds"), tr(json!(-1))),
        with_body(case(Method::POST, token, 422, "expirationSeconds"), tr(json!(max))),
        with_body(case(Method::POST, token, 422, "expirationSeconds"), tr(json!(4294967297u64))),
        with_body(case(Method::POST, token, 400, ""), tr(json!(18446744073709551615u64))),
        with_body(case(Method::POST, token, 400, ""), tr(json!(1.5e300))),
        with_body(
            case(Method::POST, csr, 400, ""),
            json!({"apiVersion": "certificates.svc.io/v1", "kind": "CertificateSigningRequest",
                   "metadata": {"name": "big"},
                   "spec": {"request": "", "signerName": "svc.io/kube-apiserver-client",
                            "usages": ["client auth"], "expirationSeconds": 2147483648u64}}),
        ),
        with_body(
            case(Method::POST, csr, 422, "expirationSeconds"),
            json!({"apiVersion": "certificates.svc.io/v1", "kind": "CertificateSigningRequest",
                   "metadata": {"name": "neg"},
                   "spec": {"request": "", "signerName": "svc.io/kube-apiserver-client",
                            "usages": ["client auth"], "expirationSeconds": -1}}),
        ),
        // resourceVersion and other numbers in an object's metadata.
        with_body(
            case(Method::PUT, format!("{secret}/g3"), 400, "resource version"),
            json!({"metadata": {"name": "g3", "resourceVersion": "99999999999999999999"}}),
        ),
        with_body(
            case(Method::PUT, format!("{secret}/g3"), 400, "resource version"),
            json!({"metadata": {"name": "g3", "resourceVersion": "-7"}}),
        ),
        with_body(
            case(Method::PUT, format!("{secret}/g3"), 409, ""),
            json!({"metadata": {"name": "g3", "resourceVersion": max.to_string()}}),
        ),
        with_body(
            case(Method::POST, secret, 400, ""),
            json!({"metadata": {"name": "gen", "generation": 1e300}}),
        ),
        with_body(
            case(Method::POST, secret, 201, ""),
            json!({"metadata": {"name": "gen2", "generation": max, "deletionGracePeriodSeconds": -1}}),
        ),
        // Array indexes in JSON Patch paths: past the array, past every integer, negative.
        patch(format!("{secret}/g3"), "/metadata/finalizers/5"),
        patch(format!("{secret}/g3"), "/metadata/finalizers/99999999999999999999999"),
        patch(format!("{secret}/g3"), "/metadata/finalizers/-1"),
        // Quality values that are not numbers in [0, 1].
        Case {
            headers: vec![(
                "accept",
                "application/yaml;q=nan, application/json;q=1e99, application/vnd.svc.protobuf;q=-1, \
                 application/cbor;q=inf, text/plain;q=NaN, */*;q=0.5"
                    .into(),
            )],
            ..case(Method::GET, ns, 200, "")
        },
    ];
    let mut failures = Vec::new();
    for c in &cases {
        let headers: Vec<(&str, &str)> = c.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut conn = admin.connect().await.unwrap();
        let resp = tokio::time::timeout(
            BOUND,
            conn.send(Client::build(
                c.method.clone(),
                &c.path,
                c.body.clone(),
                &headers,
            )),
        )
        .await
        .unwrap_or_else(|_| panic!("{} {}: no answer", c.method, c.path))
        .unwrap();
        let status = resp.status().as_u16();
        let watching = c.path.contains("watch=1") && status == 200;
        // A watch's body never ends: its status line is the answer.
        let body = if watching {
            Bytes::new()
        } else {
            resp.into_body().collect().await.unwrap().to_bytes()
        };
        let text = String::from_utf8_lossy(&body).into_owned();
        let mut ok = status == c.code;
        if ok && status >= 400 {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            ok = v["kind"] == "Status" && v["message"].as_str().unwrap_or("").contains(c.says);
        }
        if !ok {
            failures.push(format!("{} {} -> {status} {text}", c.method, c.path));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");

    // Content-Length past every limit and past every integer, over raw HTTP/1.1.
    for (len, code) in [
        ("1000000000000000", "HTTP/1.1 413"),
        ("99999999999999999999999", "HTTP/1.1 400"),
        ("-1", "HTTP/1.1 400"),
    ] {
        let mut io = tls(&srv, b"http/1.1").await;
        let head = format!(
            "POST {secret} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\n\r\n{{}}"
        );
        io.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(BOUND, io.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap_or(0);
        let answer = String::from_utf8_lossy(&buf[..n]);
        assert!(answer.starts_with(code), "Content-Length {len}: {answer}");
    }
    assert_still_serving(&srv).await;
}
