//! Proxy mode (`--upstream-kubeconfig`) through real sockets, in front of a scripted upstream
//! (plain HTTP on loopback) that records what reaches it: the caller's identity as
//! impersonation headers under the proxy's credential, what is left behind (the caller's
//! credential and identity headers, hop-by-hop fields), tokens reviewed upstream and cached,
//! impersonation allowed or refused as the upstream answers, streamed answers, and an
//! unreachable upstream. `interop/proxy/` runs the same against a real kube-apiserver.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::SinkExt as _;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use svc_gateway::base::flags::Options;
use svc_gateway::outbound::pki::{self, PkiOptions};
use svc_gateway::run::ServerHandle;
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::support::client::{Client, Conn, eventually};

/// The scripted upstream: `/echo` answers with the headers it got, `/readyz` 200, the two
/// reviews as below, `/stream` one line at once and one more when `release` is notified.
struct Upstream {
    addr: SocketAddr,
    token_reviews: AtomicUsize,
    release: Notify,
    /// `/stream` answers whose reader went away before the second line.
    abandoned: AtomicUsize,
    /// The connection (the proxy's address) each TokenReview came on.
    review_peers: parking_lot::Mutex<Vec<SocketAddr>>,
}

/// The address of the connection a request came on, put in its extensions.
#[derive(Clone, Copy)]
pub(crate) struct Peer(pub SocketAddr);

/// The token the upstream accepts, and the user it stands for.
pub(crate) const GOOD_TOKEN: &str = "good-token";
/// The proxy's own credential.
pub(crate) const PROXY_TOKEN: &str = "proxy-secret";
/// The only user the upstream lets impersonate, or read `/metrics`.
const BOSS: &str = "boss";

pub(crate) type Out = UnsyncBoxBody<Bytes, Infallible>;

pub(crate) fn full(code: StatusCode, body: Value) -> Response<Out> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).boxed_unsync());
    *r.status_mut() = code;
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

async fn answer(up: Arc<Upstream>, mut req: Request<Incoming>) -> Response<Out> {
    if req.uri().path() == "/api/v1/namespaces/ns/pods/p/exec" {
        return switch(&mut req);
    }
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let path = parts.uri.path().to_string();
    let peer = parts.extensions.get::<Peer>().map(|p| p.0.to_string());
    match (parts.method.clone(), path.as_str()) {
        (_, "/echo") => {
            let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (k, v) in &parts.headers {
                headers
                    .entry(k.as_str().to_string())
                    .or_default()
                    .push(v.to_str().unwrap().to_string());
            }
            full(
                StatusCode::OK,
                json!({"method": parts.method.as_str(), "query": parts.uri.query(),
                       "headers": headers, "body_len": body.len(), "peer": peer}),
            )
        }
        (_, "/readyz") => full(StatusCode::OK, json!("ok")),
        (Method::POST, "/apis/authentication.k8s.io/v1/tokenreviews") => {
            up.token_reviews.fetch_add(1, Ordering::SeqCst);
            if let Some(p) = parts.extensions.get::<Peer>() {
                up.review_peers.lock().push(p.0);
            }
            let review: Value = serde_json::from_slice(&body).unwrap();
            let status = if review["spec"]["token"] == GOOD_TOKEN {
                json!({"authenticated": true, "user": {
                    "username": "system:serviceaccount:ns:robot", "uid": "u-1",
                    "groups": ["system:serviceaccounts", "system:authenticated"],
                    "extra": {"authentication.kubernetes.io/credential-id": ["JTI=1"]}}})
            } else {
                json!({"authenticated": false, "error": "invalid bearer token"})
            };
            full(
                StatusCode::CREATED,
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "status": status}),
            )
        }
        (Method::POST, "/apis/authorization.k8s.io/v1/subjectaccessreviews") => {
            let review: Value = serde_json::from_slice(&body).unwrap();
            let spec = &review["spec"];
            assert!(
                spec["resourceAttributes"]["verb"] == "impersonate"
                    || spec["nonResourceAttributes"] == json!({"path": "/metrics", "verb": "get"}),
                "{review}"
            );
            let allowed = spec["user"] == BOSS;
            full(
                StatusCode::CREATED,
                json!({"kind": "SubjectAccessReview", "status": {"allowed": allowed}}),
            )
        }
        (_, "/stream") => {
            let (mut tx, rx) =
                futures::channel::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
            tokio::spawn(async move {
                let _ = tx
                    .send(Ok(Frame::data(Bytes::from_static(b"first\n"))))
                    .await;
                let released = up.release.notified();
                tokio::pin!(released);
                loop {
                    tokio::select! {
                        _ = &mut released => break,
                        _ = tokio::time::sleep(Duration::from_millis(20)) => {
                            if tx.is_closed() {
                                up.abandoned.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                        }
                    }
                }
                let _ = tx
                    .send(Ok(Frame::data(Bytes::from_static(b"second\n"))))
                    .await;
            });
            Response::new(StreamBody::new(rx).boxed_unsync())
        }
        _ => full(
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "code": 404}),
        ),
    }
}

/// An exec that switches to the protocol asked for, checks who asked, and then answers every
/// byte in upper case until the caller closes.
fn switch(req: &mut Request<Incoming>) -> Response<Out> {
    let h = |n: &str| {
        req.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    if h("impersonate-user") != "alice" || h("authorization") != format!("Bearer {PROXY_TOKEN}") {
        return full(
            StatusCode::FORBIDDEN,
            json!({"kind": "Status", "code": 403}),
        );
    }
    let protocol = h("upgrade");
    let on = hyper::upgrade::on(&mut *req);
    tokio::spawn(async move {
        let mut io = TokioIo::new(on.await.unwrap());
        let mut buf = [0u8; 1024];
        loop {
            let n = tokio::io::AsyncReadExt::read(&mut io, &mut buf)
                .await
                .unwrap_or(0);
            if n == 0 {
                return;
            }
            let upper = buf[..n].to_ascii_uppercase();
            if tokio::io::AsyncWriteExt::write_all(&mut io, &upper)
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let mut r = Response::new(Full::new(Bytes::new()).boxed_unsync());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    r.headers_mut()
        .insert("connection", "Upgrade".parse().unwrap());
    r.headers_mut().insert("upgrade", protocol.parse().unwrap());
    r.headers_mut().insert(
        "x-stream-protocol-version",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    r
}

async fn start_upstream() -> Arc<Upstream> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = Arc::new(Upstream {
        addr: listener.local_addr().unwrap(),
        token_reviews: AtomicUsize::new(0),
        release: Notify::new(),
        abandoned: AtomicUsize::new(0),
        review_peers: parking_lot::Mutex::new(Vec::new()),
    });
    serve_scripted(listener, up.clone(), answer);
    up
}

/// Serves a scripted upstream on `listener` over HTTP/1.1 (upgrades included): each request
/// is answered by `answer` with the upstream's state.
pub(crate) fn serve_scripted<S, F, Fut>(listener: TcpListener, state: Arc<S>, answer: F)
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, Request<Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Out>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let Ok((tcp, peer)) = listener.accept().await else {
                return;
            };
            let state = state.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(Peer(peer));
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(answer(state, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
}

/// A CA of its own in `dir`, for callers' (or front proxies') certificates.
pub(crate) fn new_ca(dir: &std::path::Path, name: &str) -> pki::Pki {
    pki::ensure_pki(
        &dir.join(name),
        &PkiOptions {
            tls_sans: vec![],
            admin_kubeconfig_path: dir.join(format!("{name}.kubeconfig")),
            server_url: "https://127.0.0.1:1".into(),
            cluster_signing: None,
        },
    )
    .unwrap()
}

/// The cluster's CA (the callers' certificates) and a proxy in front of `upstream`.
pub(crate) struct Proxy {
    pub(crate) handle: ServerHandle,
    /// What it was started with (a restart reuses them, on the same port).
    pub(crate) opts: Options,
    cluster: pki::Pki,
    _dir: tempfile::TempDir,
}

impl Proxy {
    pub(crate) async fn start(
        upstream: SocketAddr,
        change: impl FnOnce(&mut Options),
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().unwrap();
        let cluster = new_ca(dir.path(), "cluster");
        let ca = dir.path().join("client-ca.crt");
        std::fs::write(&ca, cluster.ca_pem()).unwrap();
        let kubeconfig = dir.path().join("upstream.kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: up\n  cluster:\n    server: \
                 http://{upstream}\nusers:\n- name: proxy\n  user:\n    token: {PROXY_TOKEN}\n\
                 contexts:\n- name: c\n  context: {{cluster: up, user: proxy}}\ncurrent-context: c\n"
            ),
        )
        .unwrap();
        let mut opts = Options::for_tests(dir.path().join("proxy"));
        opts.upstream_kubeconfig = Some(kubeconfig);
        opts.client_ca_file = Some(ca);
        change(&mut opts);
        let handle = svc_gateway::run::start(opts.clone()).await?;
        Ok(Proxy {
            handle,
            opts,
            cluster,
            _dir: dir,
        })
    }

    /// A client with a certificate of the cluster's CA, trusting the proxy's serving CA.
    /// Shuts the proxy down and hands back what starts it again (`svc_gateway::run::start`)
    /// on its port, with its data directory, which lasts as long as the returned `TempDir`.
    pub(crate) async fn stop(self) -> (Options, tempfile::TempDir) {
        let Proxy {
            handle,
            mut opts,
            _dir: dir,
            ..
        } = self;
        opts.secure_port = handle.addr.port();
        handle.shutdown().await;
        (opts, dir)
    }

    pub(crate) fn user(&self, name: &str, groups: &[&str], h2: bool) -> Client {
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        let (cert, key) = self
            .cluster
            .issue_client_cert(name, &groups, Duration::from_secs(3600))
            .unwrap();
        self.client(Some((cert.as_str(), key.as_str())), h2)
    }

    fn client(&self, creds: Option<(&str, &str)>, h2: bool) -> Client {
        let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
        Client {
            addr: self.handle.addr,
            tls: self.handle.pki.client_config_for(creds, alpn).unwrap(),
            h2,
        }
    }
}

/// A connection of `client`'s, and the answer to a `/stream?watch=true` sent on it (a
/// long-running request the upstream keeps open).
async fn open_stream(client: &Client) -> (Conn, Response<Incoming>) {
    let mut conn = client.connect().await.unwrap();
    let resp = conn
        .send(Client::build(
            Method::GET,
            "/stream?watch=true",
            Bytes::new(),
            &[],
        ))
        .await
        .unwrap();
    (conn, resp)
}

/// `/echo` through the proxy with the token the upstream accepts: what reached the upstream.
async fn echo_with_good_token(c: &Client) -> Value {
    let bearer = format!("Bearer {GOOD_TOKEN}");
    let r = c
        .request(
            Method::GET,
            "/echo",
            "",
            &[("authorization", bearer.as_str())],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    r.json()
}

fn header<'a>(echo: &'a Value, name: &str) -> Vec<&'a str> {
    echo["headers"][name]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_reach_the_upstream_as_themselves_and_nothing_else() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    for h2 in [false, true] {
        let alice = proxy.user("alice", &["dev"], h2);
        let r = alice
            .request(
                Method::POST,
                "/echo?x=1",
                &"y".repeat(100_000),
                &[
                    ("authorization", "Bearer stolen"),
                    ("x-remote-user", "admin"),
                    ("x-remote-group", "system:masters"),
                    ("x-private", "1"),
                    ("content-type", "application/json"),
                ],
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let echo = r.json();
        assert_eq!(echo["method"], "POST");
        assert_eq!(echo["query"], "x=1");
        assert_eq!(echo["body_len"], 100_000);
        assert_eq!(header(&echo, "impersonate-user"), ["alice"]);
        assert_eq!(
            header(&echo, "impersonate-group"),
            ["dev", "system:authenticated"]
        );
        assert_eq!(
            header(&echo, "authorization"),
            [format!("Bearer {PROXY_TOKEN}").as_str()]
        );
        assert_eq!(header(&echo, "x-forwarded-for"), ["127.0.0.1"]);
        let headers = echo["headers"].as_object().unwrap();
        for gone in ["x-remote-user", "x-remote-group", "impersonate-uid"] {
            assert!(
                !headers.contains_key(gone),
                "{gone} reached the upstream: {echo}"
            );
        }
        assert_eq!(header(&echo, "content-type"), ["application/json"]);
    }
    // Hop-by-hop fields stay behind (HTTP/1.1 only: h2 has none).
    let alice = proxy.user("alice", &[], false);
    let r = alice
        .request(
            Method::GET,
            "/echo",
            "",
            &[
                ("connection", "x-private"),
                ("x-private", "1"),
                ("keep-alive", "5"),
            ],
        )
        .await;
    let echo = r.json();
    let headers = echo["headers"].as_object().unwrap();
    for gone in ["x-private", "keep-alive", "connection"] {
        assert!(
            !headers.contains_key(gone),
            "{gone} reached the upstream: {echo}"
        );
    }
    // No credential: probes only.
    let anonymous = proxy.client(None, false);
    assert_eq!(anonymous.get("/echo").await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(anonymous.get("/healthz").await.0, StatusCode::OK);
    let (s, body) = anonymous.get("/readyz?verbose").await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.as_str().unwrap().contains("[+]upstream ok"), "{body}");
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_impersonation_is_the_upstreams_to_allow() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &[], false);
    let r = alice
        .request(
            Method::GET,
            "/echo",
            "",
            &[
                ("impersonate-user", "bob"),
                ("impersonate-group", "system:masters"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        "users \"bob\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in API \
         group \"\" at the cluster scope"
    );
    let boss = proxy.user(BOSS, &[], true);
    let r = boss
        .request(
            Method::GET,
            "/echo",
            "",
            &[
                ("impersonate-user", "bob"),
                ("impersonate-group", "g"),
                ("impersonate-extra-scopes.example.com%2fteam", "blue"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let echo = r.json();
    assert_eq!(header(&echo, "impersonate-user"), ["bob"]);
    assert_eq!(
        header(&echo, "impersonate-group"),
        ["g", "system:authenticated"]
    );
    assert_eq!(
        header(&echo, "impersonate-extra-scopes.example.com%2fteam"),
        ["blue"]
    );
    // A group without a user is refused, as kube-apiserver refuses it.
    let r = boss
        .request(Method::GET, "/echo", "", &[("impersonate-group", "g")])
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_own_metrics_are_for_whom_the_upstream_lets_read_them() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &[], false);
    assert_eq!(alice.get("/echo").await.0, StatusCode::OK);
    let r = alice.request(Method::GET, "/metrics", "", &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.json()["message"],
        "forbidden: User \"alice\" cannot get path \"/metrics\""
    );
    let boss = proxy.user(BOSS, &[], false);
    let r = boss.request(Method::GET, "/metrics", "", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let text = r.text();
    assert!(
        text.lines()
            .any(|l| l.starts_with("apiserver_request_total{") && l.contains("code=\"200\"")),
        "{text}"
    );
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_reviewed_upstream_and_the_answers_kept() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let c = proxy.client(None, false);
    for _ in 0..3 {
        let echo = echo_with_good_token(&c).await;
        assert_eq!(
            header(&echo, "impersonate-user"),
            ["system:serviceaccount:ns:robot"]
        );
        assert_eq!(header(&echo, "impersonate-uid"), ["u-1"]);
        assert_eq!(
            header(
                &echo,
                "impersonate-extra-authentication.kubernetes.io%2fcredential-id"
            ),
            ["JTI=1"]
        );
    }
    assert_eq!(up.token_reviews.load(Ordering::SeqCst), 1);
    for _ in 0..3 {
        let r = c
            .request(
                Method::GET,
                "/echo",
                "",
                &[("authorization", "Bearer nope")],
            )
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(r.json()["kind"], "Status");
    }
    assert_eq!(up.token_reviews.load(Ordering::SeqCst), 2);
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_stream_through_as_they_come() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    for h2 in [false, true] {
        let alice = proxy.user("alice", &[], h2);
        let (_conn, resp) = open_stream(&alice).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body();
        let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("the first line arrives before the upstream's answer ends")
            .unwrap()
            .unwrap();
        assert_eq!(first.into_data().unwrap(), "first\n");
        up.release.notify_one();
        let rest = body.collect().await.unwrap().to_bytes();
        assert_eq!(rest, "second\n");
    }
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_caller_leaves_is_ended_upstream_at_once() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    for (i, h2) in [false, true].into_iter().enumerate() {
        let alice = proxy.user("alice", &[], h2);
        let (conn, resp) = open_stream(&alice).await;
        let mut body = resp.into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "first\n");
        // The caller stops reading (over h2 the stream is reset; the connection stays).
        drop(body);
        if !h2 {
            drop(conn);
        }
        eventually(
            Duration::from_secs(5),
            "the upstream's answer is abandoned",
            || async { up.abandoned.load(Ordering::SeqCst) == i + 1 },
        )
        .await;
    }
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_a_429_to_retry_and_not_ready() {
    // A port nothing listens on.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let proxy = Proxy::start(closed, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &[], false);
    // A request that never left is for the client to retry, as kube-apiserver's 429 while it
    // shuts down: a watch refused so is resumed by client-go, where a 503 makes it relist.
    for path in ["/api/v1/pods", "/api/v1/pods?watch=1&resourceVersion=5"] {
        let r = alice.request(Method::GET, path, "", &[]).await;
        assert_eq!(
            r.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{path}: {}",
            r.text()
        );
        assert_eq!(
            r.headers.get("retry-after").and_then(|v| v.to_str().ok()),
            Some("1"),
            "{path}"
        );
        let status = r.json();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["code"], 429);
        let message = status["message"].as_str().unwrap();
        assert!(
            message.contains("could not be reached") && message.contains(&closed.to_string()),
            "{message}"
        );
    }
    eventually(
        Duration::from_secs(15),
        "/readyz fails its upstream check",
        || async {
            let (s, body) = alice.get("/readyz?verbose").await;
            s == StatusCode::INTERNAL_SERVER_ERROR
                && body
                    .as_str()
                    .unwrap_or_default()
                    .contains("[-]upstream failed")
        },
    )
    .await;
    assert_eq!(alice.get("/livez").await.0, StatusCode::OK);
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_flags_are_refused_in_proxy_mode() {
    let up = start_upstream().await;
    let err = Proxy::start(up.addr, |o| o.insecure_port = 18080)
        .await
        .err()
        .expect("an insecure port is refused")
        .to_string();
    assert!(
        err.contains("cannot be combined with --insecure-port"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_switches_protocols_through_the_proxy() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let alice = proxy.user("alice", &[], false);
    for protocol in ["websocket", "SPDY/3.1"] {
        let mut tls = alice.tls_stream().await.unwrap();
        let head = format!(
            "GET /api/v1/namespaces/ns/pods/p/exec?command=sh&stdin=true HTTP/1.1\r\n\
             Host: localhost\r\nConnection: Upgrade\r\nUpgrade: {protocol}\r\n\
             X-Stream-Protocol-Version: v5.channel.k8s.io\r\n\r\n"
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        // The head of the answer, up to its blank line.
        let mut got = Vec::new();
        while !got.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(
                tls.read(&mut b).await.unwrap(),
                1,
                "{}",
                String::from_utf8_lossy(&got)
            );
            got.push(b[0]);
        }
        let head = String::from_utf8(got).unwrap().to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 101"), "{protocol}: {head}");
        assert!(
            head.contains(&format!("upgrade: {}", protocol.to_ascii_lowercase())),
            "{head}"
        );
        assert!(
            head.contains("x-stream-protocol-version: v5.channel.k8s.io"),
            "{head}"
        );
        // Bytes flow both ways through the joined connections.
        for msg in ["hello", "again"] {
            tls.write_all(msg.as_bytes()).await.unwrap();
            let mut buf = vec![0u8; msg.len()];
            tokio::time::timeout(Duration::from_secs(10), tls.read_exact(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(buf, msg.to_ascii_uppercase().as_bytes());
        }
    }
    // Without a credential there is no upgrade.
    let anonymous = proxy.client(None, false);
    let r = anonymous
        .request(
            Method::GET,
            "/api/v1/namespaces/ns/pods/p/exec",
            "",
            &[("connection", "Upgrade"), ("upgrade", "websocket")],
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_caller_tokens_a_token_caller_reaches_the_upstream_with_its_own_token() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |o| o.upstream_caller_tokens = true)
        .await
        .unwrap();
    let bearer = format!("Bearer {GOOD_TOKEN}");
    for h2 in [false, true] {
        let r = proxy
            .client(None, h2)
            .request(
                Method::GET,
                "/echo",
                "",
                &[
                    ("authorization", bearer.as_str()),
                    ("impersonate-user", "bob"),
                    ("impersonate-group", "dev"),
                    ("x-remote-user", "admin"),
                ],
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let echo = r.json();
        // The caller's token, not the proxy's; its own impersonation is the upstream's to
        // judge; front-proxy headers still never pass.
        assert_eq!(header(&echo, "authorization"), [bearer.as_str()]);
        assert_eq!(header(&echo, "impersonate-user"), ["bob"]);
        assert_eq!(header(&echo, "impersonate-group"), ["dev"]);
        assert!(header(&echo, "x-remote-user").is_empty());
    }
    // A bad token is refused by the proxy before anything goes upstream.
    let r = proxy
        .client(None, false)
        .request(
            Method::GET,
            "/echo",
            "",
            &[("authorization", "Bearer wrong")],
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // A certificate caller is impersonated under the proxy's credential, as without the flag.
    let r = proxy
        .user("alice", &[], false)
        .request(Method::GET, "/echo", "", &[])
        .await;
    let echo = r.json();
    assert_eq!(
        header(&echo, "authorization"),
        [format!("Bearer {PROXY_TOKEN}").as_str()]
    );
    assert_eq!(header(&echo, "impersonate-user"), ["alice"]);
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_proxy_names_its_caller_in_request_headers() {
    let up = start_upstream().await;
    // The front proxy's CA, apart from the cluster's.
    let front_dir = tempfile::tempdir().unwrap();
    let front = new_ca(front_dir.path(), "front");
    let front_ca = front_dir.path().join("front-ca.crt");
    std::fs::write(&front_ca, front.ca_pem()).unwrap();
    let proxy = Proxy::start(up.addr, |o| {
        o.requestheader_client_ca_file = Some(front_ca.clone());
        o.requestheader_allowed_names = vec!["front-proxy-client".into()];
    })
    .await
    .unwrap();
    let as_front = |name: &str, h2: bool| {
        let (cert, key) = front
            .issue_client_cert(name, &[], Duration::from_secs(3600))
            .unwrap();
        proxy.client(Some((cert.as_str(), key.as_str())), h2)
    };
    let named = [
        ("x-remote-user", "carol"),
        ("x-remote-group", "g1"),
        ("x-remote-group", "g2"),
        ("x-remote-uid", "u-9"),
        ("x-remote-extra-scopes", "read"),
        ("x-remote-extra-acme.com%2Fproject", "p1"),
    ];
    for h2 in [false, true] {
        let r = as_front("front-proxy-client", h2)
            .request(Method::GET, "/echo", "", &named)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let echo = r.json();
        assert_eq!(header(&echo, "impersonate-user"), ["carol"]);
        assert_eq!(
            header(&echo, "impersonate-group"),
            ["g1", "g2", "system:authenticated"]
        );
        assert_eq!(header(&echo, "impersonate-uid"), ["u-9"]);
        assert_eq!(header(&echo, "impersonate-extra-scopes"), ["read"]);
        assert_eq!(
            header(&echo, "impersonate-extra-acme.com%2fproject"),
            ["p1"]
        );
        // The front proxy's own headers never reach the upstream.
        assert!(header(&echo, "x-remote-user").is_empty());
    }
    // A front proxy that names nobody has no caller.
    let r = as_front("front-proxy-client", false)
        .request(Method::GET, "/echo", "", &[])
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // A certificate of the front proxy's CA with a name not allowed is nobody.
    let r = as_front("someone-else", false)
        .request(Method::GET, "/echo", "", &named)
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
    // A caller's own certificate: the headers are ignored, the certificate decides.
    let r = proxy
        .user("alice", &[], false)
        .request(Method::GET, "/echo", "", &named)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(header(&r.json(), "impersonate-user"), ["alice"]);
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_the_upstream_would_read_otherwise_is_refused_on_every_path() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    // Go's HTTP/1.1 server trims blanks from header values: sent as it is, a group
    // " system:masters" would be system:masters upstream.
    let upgrade = [("connection", "Upgrade"), ("upgrade", "websocket")];
    for (user, group) in [
        ("bob", " system:masters"),
        ("bob", "system:masters "),
        (" bob", "dev"),
        ("bob\t", "dev"),
    ] {
        for h2 in [false, true] {
            let caller = proxy.user(user, &[group], h2);
            for (path, headers) in [
                ("/echo", &[][..]),
                ("/api/v1/namespaces/ns/secrets", &[][..]),
                ("/api/v1/namespaces/ns/secrets", &upgrade[..]),
                ("/api/v1/namespaces/ns/pods/p/exec", &upgrade[..]),
                ("/stream?watch=true", &[][..]),
            ] {
                if h2 && !headers.is_empty() {
                    continue;
                }
                let r = caller.request(Method::GET, path, "", headers).await;
                assert_eq!(
                    r.status,
                    StatusCode::FORBIDDEN,
                    "{user:?} {group:?} {path} h2={h2}: {}",
                    r.text()
                );
                assert_eq!(r.json()["kind"], "Status");
            }
        }
    }
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_headers_are_read_as_kube_apiserver_reads_them() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let boss = proxy.user(BOSS, &[], false);
    // Two users asked for: the first is the one (Go's Header.Get).
    let r = boss
        .request(
            Method::GET,
            "/echo",
            "",
            &[("impersonate-user", "bob"), ("impersonate-user", "carol")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(header(&r.json(), "impersonate-user"), ["bob"]);
    // A well-formed service account gets its groups; a malformed one is a plain user.
    let r = boss
        .request(
            Method::GET,
            "/echo",
            "",
            &[("impersonate-user", "system:serviceaccount:ns:robot")],
        )
        .await;
    assert_eq!(
        header(&r.json(), "impersonate-group"),
        [
            "system:serviceaccounts",
            "system:serviceaccounts:ns",
            "system:authenticated"
        ]
    );
    let r = boss
        .request(
            Method::GET,
            "/echo",
            "",
            &[("impersonate-user", "system:serviceaccount:ns:NOT_VALID")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        header(&r.json(), "impersonate-group"),
        ["system:authenticated"]
    );
    // A certificate's user passes with the credential it was read from.
    let r = boss.request(Method::GET, "/echo", "", &[]).await;
    let id = header(
        &r.json(),
        "impersonate-extra-authentication.kubernetes.io%2fcredential-id",
    )
    .concat();
    assert!(id.starts_with("X509SHA256=") && id.len() == 11 + 64, "{id}");
    proxy.handle.shutdown().await;
}

/// Which bound on what is passed upstream a test fills.
#[derive(Clone, Copy)]
enum Passed {
    /// `/stream?watch=true`, held open by the upstream.
    LongRunning,
    /// `POST /stream`, whose answer the upstream holds open.
    Short,
}

impl Passed {
    async fn open(self, client: &Client) -> (Conn, Response<Incoming>) {
        match self {
            Passed::LongRunning => open_stream(client).await,
            Passed::Short => held_write(client).await,
        }
    }
    fn flag(self) -> &'static str {
        match self {
            Passed::LongRunning => "--upstream-long-running-per-user",
            Passed::Short => "--upstream-requests-per-user",
        }
    }
    fn metric(self) -> &'static str {
        match self {
            Passed::LongRunning => "svc_proxy_upstream_long_running",
            Passed::Short => "svc_proxy_upstream_short",
        }
    }
}

/// Fills a bound of 2 per user and 3 in all: alice's two requests and carol's one are held
/// open upstream (each answered 200, its first line read); alice's third and dave's first
/// are answered 429 naming the flag, and the metrics count them. Alice's and carol's are
/// given back, and the proxy's admin client.
async fn fill_a_bound(
    proxy: &Proxy,
    kind: Passed,
) -> (Vec<(Conn, Incoming)>, (Conn, Incoming), Client) {
    let alice = proxy.user("alice", &[], true);
    let mut held = Vec::new();
    for _ in 0..2 {
        let (conn, resp) = tokio::time::timeout(Duration::from_secs(10), kind.open(&alice))
            .await
            .expect("a request waited for a seat of the proxy's");
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body();
        body.frame().await.unwrap().unwrap();
        held.push((conn, body));
    }
    // Past alice's own bound: 429, while other users go on (and her short requests, past
    // the long-running bound).
    let (_conn, resp) = kind.open(&alice).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let status: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status["reason"], "TooManyRequests", "{status}");
    assert!(
        status["message"].as_str().unwrap().contains(kind.flag()),
        "{status}"
    );
    if let Passed::LongRunning = kind {
        assert_eq!(alice.get("/echo").await.0, StatusCode::OK);
    }
    let carol = proxy.user("carol", &[], false);
    let (carol_conn, resp) = kind.open(&carol).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut carol_body = resp.into_body();
    carol_body.frame().await.unwrap().unwrap();
    // Past the bound of all users together.
    let dave = proxy.user("dave", &[], false);
    let (_conn, resp) = kind.open(&dave).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let boss = proxy.user(BOSS, &[], false);
    let metrics = boss.request(Method::GET, "/metrics", "", &[]).await.text();
    let m = kind.metric();
    for line in [
        format!("{m}_requests 3"),
        format!("{m}_refused_total{{scope=\"user\"}} 1"),
        format!("{m}_refused_total{{scope=\"total\"}} 1"),
        format!("{m}_limit{{scope=\"user\"}} 2"),
        format!("{m}_limit{{scope=\"total\"}} 3"),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}: {metrics}");
    }
    (held, (carol_conn, carol_body), boss)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_running_requests_are_bounded_per_user_and_in_all() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |o| {
        o.upstream_long_running_per_user = 2;
        o.upstream_long_running_max = 3;
    })
    .await
    .unwrap();
    let (mut held, (carol_conn, carol_body), boss) =
        fill_a_bound(&proxy, Passed::LongRunning).await;
    let alice = proxy.user("alice", &[], true);
    // A place comes back when its stream ends.
    drop(held.pop());
    drop(carol_body);
    drop(carol_conn);
    eventually(Duration::from_secs(5), "the places come back", || async {
        let text = boss.request(Method::GET, "/metrics", "", &[]).await.text();
        text.lines()
            .any(|l| l == "svc_proxy_upstream_long_running_requests 1")
    })
    .await;
    let (_conn, resp) = open_stream(&alice).await;
    assert_eq!(resp.status(), StatusCode::OK);
    proxy.handle.shutdown().await;
}

/// Short requests passed upstream are spread over `--upstream-connections` connections in
/// turn (kube-apiserver allows 100 streams on one), and the proxy's own calls to the upstream
/// (here a TokenReview) come on a connection apart from them, never queued behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_requests_are_spread_over_connections_apart_from_the_proxys_own_calls() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |o| o.upstream_connections = 3)
        .await
        .unwrap();
    let c = proxy.client(None, false);
    let mut peers = BTreeMap::<String, usize>::new();
    for _ in 0..6 {
        let echo = echo_with_good_token(&c).await;
        let peer = echo["peer"].as_str().unwrap().to_string();
        *peers.entry(peer).or_default() += 1;
    }
    assert_eq!(peers.len(), 3, "{peers:?}");
    assert!(peers.values().all(|n| *n == 2), "{peers:?}");
    let reviews = up.review_peers.lock().clone();
    assert!(!reviews.is_empty());
    for r in reviews {
        assert!(
            !peers.contains_key(&r.to_string()),
            "a TokenReview came on {r}, a connection of the pass-through: {peers:?}"
        );
    }
    proxy.handle.shutdown().await;
}

/// A write passed upstream (a short request, `POST /stream`, whose answer the upstream holds
/// open) on a connection of `client`'s, its answer's head and first line read.
async fn held_write(client: &Client) -> (Conn, Response<Incoming>) {
    let mut conn = client.connect().await.unwrap();
    let resp = conn
        .send(Client::build(Method::POST, "/stream", "{}", &[]))
        .await
        .unwrap();
    (conn, resp)
}

/// Short requests passed upstream take no seat of the proxy's own in-flight pools (the
/// upstream's limits and priorities judge them): with one mutating seat, a user has two
/// writes upstream at once. They are bounded on their own, per user and in all, with 429s
/// that name the flag, and their places come back when their answers end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_requests_passed_upstream_take_no_seat_and_are_bounded_on_their_own() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |o| {
        o.max_mutating_requests_inflight = 1;
        o.upstream_requests_per_user = 2;
        o.upstream_requests_max = 3;
    })
    .await
    .unwrap();
    // Alice's two writes run at once with one mutating seat.
    let (mut held, (carol_conn, mut carol_body), boss) = fill_a_bound(&proxy, Passed::Short).await;
    let metrics = boss.request(Method::GET, "/metrics", "", &[]).await.text();
    assert!(
        metrics
            .lines()
            .any(|l| l == "svc_proxy_upstream_long_running_requests 0"),
        "{metrics}"
    );
    // The places come back when the answers end.
    up.release.notify_waiters();
    for (_conn, mut body) in held.drain(..) {
        while body.frame().await.is_some() {}
    }
    while carol_body.frame().await.is_some() {}
    drop(carol_conn);
    eventually(Duration::from_secs(5), "the places come back", || async {
        let text = boss.request(Method::GET, "/metrics", "", &[]).await.text();
        text.lines()
            .any(|l| l == "svc_proxy_upstream_short_requests 0")
    })
    .await;
    proxy.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_another_ca_is_no_credential_and_no_dropped_connection() {
    let up = start_upstream().await;
    let proxy = Proxy::start(up.addr, |_| {}).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let other = new_ca(dir.path(), "other");
    let (cert, key) = other
        .issue_client_cert(
            "mallory",
            &["system:masters".into()],
            Duration::from_secs(600),
        )
        .unwrap();
    for h2 in [false, true] {
        // As kube-apiserver answers: the connection is served, the certificate names
        // nobody, and a bearer token still authenticates.
        let mallory = proxy.client(Some((cert.as_str(), key.as_str())), h2);
        let r = mallory.request(Method::GET, "/echo", "", &[]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
        assert_eq!(r.json()["kind"], "Status");
        assert_eq!(
            header(&echo_with_good_token(&mallory).await, "impersonate-user"),
            ["system:serviceaccount:ns:robot"]
        );
    }
    proxy.handle.shutdown().await;
}
