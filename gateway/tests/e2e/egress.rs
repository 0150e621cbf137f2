//! Outbound connections through real sockets: `WebhookClient` against a local HTTPS webhook
//! (its own CA, counting calls and connections), directly and through the egress selector's
//! tunnels (Debian's tinyproxy over TCP, a small CONNECT proxy on a Unix socket); exec
//! credential plugins returning a token or a client certificate, reused until expiry and run
//! again after a 401; and the etcd store reached through tinyproxy.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::server::WebPkiClientVerifier;
use svc_gateway::outbound::client::{ClientError, WebhookClient};
use svc_gateway::outbound::egress::Egress;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixListener};

use crate::support::process::free_port;

const T: Duration = Duration::from_secs(10);
const JSON: &str = "application/json";

/// A CA and what it issued, as PEM.
struct TestPki {
    ca_pem: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> TestPki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    TestPki {
        server: leaf(vec!["127.0.0.1".into(), "hook.test".into()]),
        client: leaf(vec!["webhook-client".into()]),
        ca_pem,
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What the webhook saw.
#[derive(Default)]
struct Seen {
    calls: AtomicUsize,
    connections: AtomicUsize,
    /// Authorization header, HTTP version and path of every call.
    requests: Mutex<Vec<(String, http::Version, String)>>,
    /// The bearer token it accepts (`None`: any or none).
    accept: Mutex<Option<String>>,
}

/// A local HTTPS webhook that answers `{"n": <call number>, "echo": <body>}`, or 401 when a
/// token is required and not presented; with `client_ca`, a client certificate is required.
struct Hook {
    addr: SocketAddr,
    seen: Arc<Seen>,
}

async fn hook(pki: &TestPki, require_client_cert: bool) -> Hook {
    let certs = svc_gateway::outbound::egress::certs_from_pem(pki.server.0.as_bytes()).unwrap();
    let key =
        <rustls::pki_types::PrivateKeyDer as rustls::pki_types::pem::PemObject>::from_pem_slice(
            pki.server.1.as_bytes(),
        )
        .unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if require_client_cert {
        let roots = svc_gateway::outbound::egress::roots_from_pem(pki.ca_pem.as_bytes()).unwrap();
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(certs, key).unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let state = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = state.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                seen.connections.fetch_add(1, Ordering::SeqCst);
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let n = seen.calls.fetch_add(1, Ordering::SeqCst) + 1;
                        let auth = req
                            .headers()
                            .get(http::header::AUTHORIZATION)
                            .map(|v| v.to_str().unwrap_or_default().to_string())
                            .unwrap_or_default();
                        seen.requests.lock().push((
                            auth.clone(),
                            req.version(),
                            req.uri().path().to_string(),
                        ));
                        let wanted = seen.accept.lock().clone();
                        let body = req.into_body().collect().await?.to_bytes();
                        let (status, answer) = match wanted {
                            Some(t) if auth != format!("Bearer {t}") => {
                                (StatusCode::UNAUTHORIZED, serde_json::json!({"n": n}))
                            }
                            _ => (
                                StatusCode::OK,
                                serde_json::json!({"n": n,
                                    "echo": String::from_utf8_lossy(&body)}),
                            ),
                        };
                        let mut resp =
                            http::Response::new(Full::new(Bytes::from(answer.to_string())));
                        *resp.status_mut() = status;
                        Ok::<_, hyper::Error>(resp)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Hook { addr, seen }
}

/// A kubeconfig naming the hook at `/authorize`, trusting `ca.pem` (relative path) and
/// authenticating with `user` (YAML lines under `user:`).
fn kubeconfig(dir: &Path, pki: &TestPki, hook: &Hook, user: &str, extra_cluster: &str) -> PathBuf {
    std::fs::write(dir.join("ca.pem"), &pki.ca_pem).unwrap();
    let path = dir.join("hook.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: hook\n  cluster:\n    \
             server: https://127.0.0.1:{port}/authorize\n    certificate-authority: ca.pem\n\
             {extra_cluster}users:\n- name: u\n  user:\n{user}contexts:\n- name: c\n  context:\n    \
             cluster: hook\n    user: u\ncurrent-context: c\n",
            port = hook.addr.port()
        ),
    )
    .unwrap();
    path
}

async fn post(
    client: &WebhookClient,
    body: &str,
) -> Result<(StatusCode, serde_json::Value), ClientError> {
    let r = client.post(Bytes::from(body.to_string()), JSON, T).await?;
    Ok((r.status, serde_json::from_slice(&r.body).unwrap()))
}

#[tokio::test]
async fn a_kubeconfig_client_posts_directly_over_h2_and_reuses_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let hook = hook(&pki, false).await;
    *hook.seen.accept.lock() = Some("s3cret".into());
    let path = kubeconfig(dir.path(), &pki, &hook, "    token: s3cret\n", "");
    let client = WebhookClient::from_kubeconfig_file(&path, &Egress::direct()).unwrap();
    for i in 1..=3 {
        let (status, answer) = post(&client.clone(), &format!("{{\"i\":{i}}}"))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["n"], i);
        assert_eq!(answer["echo"], format!("{{\"i\":{i}}}"));
    }
    assert_eq!(
        hook.seen.connections.load(Ordering::SeqCst),
        1,
        "one pooled connection"
    );
    for (auth, version, path) in hook.seen.requests.lock().iter() {
        assert_eq!(auth, "Bearer s3cret");
        assert_eq!(*version, http::Version::HTTP_2);
        assert_eq!(path, "/authorize");
    }
    // A token file, read relative to the kubeconfig.
    std::fs::write(dir.path().join("token"), "s3cret\n").unwrap();
    let path = kubeconfig(dir.path(), &pki, &hook, "    tokenFile: token\n", "");
    let client = WebhookClient::from_kubeconfig_file(&path, &Egress::direct()).unwrap();
    assert_eq!(post(&client, "{}").await.unwrap().0, StatusCode::OK);
    // The wrong CA: the handshake fails and the error names the URL.
    let other = self::pki();
    std::fs::write(dir.path().join("ca.pem"), &other.ca_pem).unwrap();
    let client = WebhookClient::from_kubeconfig_file(&path, &Egress::direct()).unwrap();
    let e = post(&client, "{}").await.unwrap_err().to_string();
    assert!(e.contains("/authorize") && e.contains("certificate"), "{e}");
    // from_url with the right CA bundle and no credentials.
    *hook.seen.accept.lock() = None;
    let url = format!("https://127.0.0.1:{}/admit", hook.addr.port());
    let client =
        WebhookClient::from_url(&url, Some(pki.ca_pem.as_bytes()), &Egress::direct()).unwrap();
    assert_eq!(post(&client, "{}").await.unwrap().0, StatusCode::OK);
    assert_eq!(hook.seen.requests.lock().last().unwrap().2, "/admit");
}

#[tokio::test]
async fn bad_files_are_refused_with_the_field_named() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let hook = hook(&pki, false).await;
    let path = kubeconfig(dir.path(), &pki, &hook, "    client-key: k.pem\n", "");
    let e = WebhookClient::from_kubeconfig_file(&path, &Egress::direct())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("users[0].user.client-certificate: Required value"),
        "{e}"
    );
    let path = kubeconfig(
        dir.path(),
        &pki,
        &hook,
        "    token: x\n",
        "    proxy-url: http://p:1\n",
    );
    let e = WebhookClient::from_kubeconfig_file(&path, &Egress::direct())
        .unwrap_err()
        .to_string();
    assert!(e.contains("proxy-url"), "{e}");
    let user = "    exec:\n      apiVersion: client.authentication.svc.io/v1\n      command: p\n      \
                interactiveMode: Always\n";
    let path = kubeconfig(dir.path(), &pki, &hook, user, "");
    let e = WebhookClient::from_kubeconfig_file(&path, &Egress::direct())
        .unwrap_err()
        .to_string();
    assert!(e.contains("interactiveMode Always"), "{e}");
}

/// tinyproxy on a free loopback port, allowing CONNECT to `ports` only, logging requests.
struct Tinyproxy {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Tinyproxy {
    fn start(dir: &Path, ports: &[u16]) -> Self {
        let port = free_port();
        let log = dir.join("tinyproxy.log");
        let conf = dir.join("tinyproxy.conf");
        let allow: String = ports.iter().map(|p| format!("ConnectPort {p}\n")).collect();
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 30\nLogFile \"{}\"\nLogLevel Connect\n\
                 MaxClients 50\nAllow 127.0.0.1\n{allow}",
                log.display()
            ),
        )
        .unwrap();
        let child = Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tinyproxy (Debian package tinyproxy) must be installed");
        let deadline = Instant::now() + T;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "tinyproxy did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Tinyproxy { child, port, log }
    }

    /// Waits until it has logged `n` CONNECT requests.
    fn wait_for(&self, n: usize) {
        let deadline = Instant::now() + T;
        while self.connects().len() < n {
            assert!(
                Instant::now() < deadline,
                "tinyproxy logged {:?}, fewer than {n} CONNECTs",
                self.connects()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The CONNECT requests it logged.
    fn connects(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once("Request (file descriptor ").map(|(_, r)| r))
            .filter_map(|r| r.split_once("): ").map(|(_, r)| r.to_string()))
            .filter(|r| r.starts_with("CONNECT "))
            .collect()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn egress_file(dir: &Path, name: &str, transport: &str) -> Egress {
    let path = dir.join("egress.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: apiserver.svc.io/v1beta1\nkind: EgressSelectorConfiguration\n\
             egressSelections:\n- name: {name}\n  connection:\n    proxyProtocol: HTTPConnect\n    \
             transport:\n{transport}"
        ),
    )
    .unwrap();
    Egress::from_file(&path).unwrap()
}

#[tokio::test]
async fn webhook_traffic_goes_through_tinyproxy_when_the_controlplane_selection_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let hook = hook(&pki, false).await;
    let proxy = Tinyproxy::start(dir.path(), &[hook.addr.port()]);
    let egress = egress_file(
        dir.path(),
        "controlplane",
        &format!("      tcp:\n        url: http://127.0.0.1:{}\n", proxy.port),
    );
    let path = kubeconfig(dir.path(), &pki, &hook, "    token: t\n", "");
    let client = WebhookClient::from_kubeconfig_file(&path, &egress).unwrap();
    for _ in 0..2 {
        assert_eq!(post(&client, "{}").await.unwrap().0, StatusCode::OK);
    }
    assert_eq!(hook.seen.calls.load(Ordering::SeqCst), 2);
    let want = format!("CONNECT 127.0.0.1:{} HTTP/1.1", hook.addr.port());
    proxy.wait_for(1);
    assert_eq!(proxy.connects(), [want], "one tunnel for both calls");
    // A destination tinyproxy does not allow: its 403 comes back, naming the proxy.
    let url = format!("https://127.0.0.1:{}/x", free_port());
    let client = WebhookClient::from_url(&url, Some(pki.ca_pem.as_bytes()), &egress).unwrap();
    let e = post(&client, "{}").await.unwrap_err().to_string();
    assert!(
        e.contains(&format!("http://127.0.0.1:{}", proxy.port)) && e.contains("403"),
        "{e}"
    );
    proxy.wait_for(2);
    // The `master` name is the same selection; `etcd` alone leaves webhooks direct.
    let etcd_only = egress_file(
        dir.path(),
        "etcd",
        &format!("      tcp:\n        url: http://127.0.0.1:{}\n", proxy.port),
    );
    let client = WebhookClient::from_kubeconfig_file(&path, &etcd_only).unwrap();
    assert_eq!(post(&client, "{}").await.unwrap().0, StatusCode::OK);
    assert_eq!(proxy.connects().len(), 2, "{:?}", proxy.connects());
}

/// A CONNECT proxy on a Unix socket: reads the request, dials, answers 200, copies both ways.
fn uds_proxy(path: &Path) -> Arc<AtomicUsize> {
    let listener = UnixListener::bind(path).unwrap();
    let tunnels = Arc::new(AtomicUsize::new(0));
    let count = tunnels.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(serve_connect(conn, count.clone()));
        }
    });
    tunnels
}

/// A CONNECT proxy over TLS that requires a client certificate from `pki`'s CA.
async fn tls_proxy(pki: &TestPki) -> (u16, Arc<AtomicUsize>) {
    let certs = svc_gateway::outbound::egress::certs_from_pem(pki.server.0.as_bytes()).unwrap();
    let key =
        <rustls::pki_types::PrivateKeyDer as rustls::pki_types::pem::PemObject>::from_pem_slice(
            pki.server.1.as_bytes(),
        )
        .unwrap();
    let roots = svc_gateway::outbound::egress::roots_from_pem(pki.ca_pem.as_bytes()).unwrap();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let tunnels = Arc::new(AtomicUsize::new(0));
    let count = tunnels.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, count) = (acceptor.clone(), count.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    serve_connect(tls, count).await;
                }
            });
        }
    });
    (port, tunnels)
}

async fn serve_connect(
    conn: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    count: Arc<AtomicUsize>,
) {
    let mut conn = BufReader::new(conn);
    let mut line = String::new();
    if conn.read_line(&mut line).await.is_err() {
        return;
    }
    let Some(target) = line.split_whitespace().nth(1).map(str::to_string) else {
        return;
    };
    loop {
        let mut header = String::new();
        match conn.read_line(&mut header).await {
            Ok(0) | Err(_) => return,
            Ok(_) if header == "\r\n" => break,
            Ok(_) => {}
        }
    }
    let Ok(mut upstream) = TcpStream::connect(&target).await else {
        let _ = conn
            .get_mut()
            .write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            .await;
        return;
    };
    count.fetch_add(1, Ordering::SeqCst);
    if conn
        .get_mut()
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
}

#[tokio::test]
async fn webhook_traffic_goes_through_a_tls_tunnel_server_with_our_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let hook = hook(&pki, false).await;
    let (port, tunnels) = tls_proxy(&pki).await;
    for (name, pem) in [
        ("proxy-ca.pem", &pki.ca_pem),
        ("proxy-client.pem", &pki.client.0),
        ("proxy-client.key", &pki.client.1),
    ] {
        std::fs::write(dir.path().join(name), pem).unwrap();
    }
    let d = dir.path().display();
    let egress = egress_file(
        dir.path(),
        "controlplane",
        &format!(
            "      tcp:\n        url: https://127.0.0.1:{port}\n        tlsConfig:\n          \
             caBundle: {d}/proxy-ca.pem\n          clientCert: {d}/proxy-client.pem\n          \
             clientKey: {d}/proxy-client.key\n"
        ),
    );
    let url = format!("https://127.0.0.1:{}/admit", hook.addr.port());
    let client = WebhookClient::from_url(&url, Some(pki.ca_pem.as_bytes()), &egress).unwrap();
    assert_eq!(post(&client, "{}").await.unwrap().0, StatusCode::OK);
    assert_eq!(tunnels.load(Ordering::SeqCst), 1);
    // The tunnel server's certificate checked against another CA: refused, nothing sent.
    let other = self::pki();
    std::fs::write(dir.path().join("proxy-ca.pem"), &other.ca_pem).unwrap();
    let egress = Egress::from_file(&dir.path().join("egress.yaml")).unwrap();
    let client = WebhookClient::from_url(&url, Some(pki.ca_pem.as_bytes()), &egress).unwrap();
    let e = post(&client, "{}").await.unwrap_err().to_string();
    assert!(e.contains(&format!("https://127.0.0.1:{port}")), "{e}");
    assert_eq!(hook.seen.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn answers_are_bounded_in_size_and_time() {
    let pki = pki();
    let hook = hook(&pki, false).await;
    let url = format!("https://127.0.0.1:{}/admit", hook.addr.port());
    let client =
        WebhookClient::from_url(&url, Some(pki.ca_pem.as_bytes()), &Egress::direct()).unwrap();
    // The hook echoes the body: an answer over 3 MiB.
    let big = "x".repeat(svc_gateway::outbound::client::MAX_RESPONSE_BODY + 1);
    let e = client.post(Bytes::from(big), JSON, T).await.unwrap_err();
    assert!(matches!(e, ClientError::TooLarge { .. }), "{e}");
    // A server that accepts and never answers: the call ends at its timeout.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}/x",
        silent.local_addr().unwrap().port()
    );
    let _keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let client =
        WebhookClient::from_url(&url, Some(pki.ca_pem.as_bytes()), &Egress::direct()).unwrap();
    let started = Instant::now();
    let e = client
        .post(Bytes::from_static(b"{}"), JSON, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
    assert!(started.elapsed() < T, "{:?}", started.elapsed());
}

#[tokio::test]
async fn webhook_traffic_goes_through_a_unix_socket_tunnel() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let hook = hook(&pki, false).await;
    let socket = dir.path().join("tunnel.sock");
    let tunnels = uds_proxy(&socket);
    let egress = egress_file(
        dir.path(),
        "master",
        &format!("      uds:\n        udsName: {}\n", socket.display()),
    );
    let url = format!("https://127.0.0.1:{}/admit", hook.addr.port());
    let client = WebhookClient::from_url(&url, Some(pki.ca_pem.as_bytes()), &egress).unwrap();
    for _ in 0..3 {
        assert_eq!(post(&client, "{}").await.unwrap().0, StatusCode::OK);
    }
    assert_eq!(tunnels.load(Ordering::SeqCst), 1, "one tunnel, reused");
    assert_eq!(hook.seen.calls.load(Ordering::SeqCst), 3);
}

fn set_exec(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A plugin that counts its runs in `runs`, keeps its input in `input.json`, and prints
/// token `t<n>` expiring in `life` seconds.
fn token_plugin(dir: &Path, life: i64) -> PathBuf {
    let p = dir.join("token-plugin.sh");
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\nd={d}\necho run >> $d/runs\nprintf '%s' \"$SVC_EXEC_INFO\" > $d/input.json\n\
             n=$(wc -l < $d/runs)\n\
             exp=$(date -u -d \"@$(( $(date +%s) + {life} ))\" +%Y-%m-%dT%H:%M:%SZ)\n\
             printf '{{\"apiVersion\":\"client.authentication.svc.io/v1\",\"kind\":\"ExecCredential\",\
             \"status\":{{\"token\":\"t%s\",\"expirationTimestamp\":\"%s\"}}}}' $n $exp\n",
            d = dir.display()
        ),
    )
    .unwrap();
    set_exec(&p);
    p
}

fn runs(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("runs"))
        .unwrap_or_default()
        .lines()
        .count()
}

const EXEC_USER: &str = "    exec:\n      apiVersion: client.authentication.svc.io/v1\n      \
                         command: ./token-plugin.sh\n      provideClusterInfo: true\n";

#[tokio::test]
async fn an_exec_token_is_reused_until_refused_then_the_plugin_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let hook = hook(&pki, false).await;
    token_plugin(dir.path(), 3600);
    let path = kubeconfig(
        dir.path(),
        &pki,
        &hook,
        EXEC_USER,
        "    extensions:\n    - name: client.authentication.svc.io/exec\n      \
         extension: {audience: hook}\n",
    );
    let client = WebhookClient::from_kubeconfig_file(&path, &Egress::direct()).unwrap();
    *hook.seen.accept.lock() = Some("t1".into());
    for _ in 0..3 {
        assert_eq!(post(&client.clone(), "{}").await.unwrap().0, StatusCode::OK);
    }
    assert_eq!(runs(dir.path()), 1, "the token is reused");
    let input: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("input.json")).unwrap()).unwrap();
    assert_eq!(input["kind"], "ExecCredential");
    assert_eq!(input["spec"]["interactive"], false);
    assert_eq!(
        input["spec"]["cluster"]["server"],
        format!("https://127.0.0.1:{}/authorize", hook.addr.port())
    );
    assert_eq!(input["spec"]["cluster"]["config"]["audience"], "hook");
    // The webhook now wants the next token: one 401, one plugin run, one retry.
    *hook.seen.accept.lock() = Some("t2".into());
    let before = hook.seen.calls.load(Ordering::SeqCst);
    assert_eq!(post(&client, "{}").await.unwrap().0, StatusCode::OK);
    assert_eq!(runs(dir.path()), 2);
    assert_eq!(hook.seen.calls.load(Ordering::SeqCst), before + 2);
    // A token refused twice: the 401 is the answer (one re-run, one retry, no loop).
    *hook.seen.accept.lock() = Some("never".into());
    assert_eq!(
        post(&client, "{}").await.unwrap().0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(runs(dir.path()), 3);
    let auths: Vec<String> = hook
        .seen
        .requests
        .lock()
        .iter()
        .map(|r| r.0.clone())
        .collect();
    assert_eq!(
        auths,
        [
            "Bearer t1",
            "Bearer t1",
            "Bearer t1",
            "Bearer t1",
            "Bearer t2",
            "Bearer t2",
            "Bearer t3"
        ]
    );
}

#[tokio::test]
async fn an_exec_token_is_refreshed_when_it_expires() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let hook = hook(&pki, false).await;
    token_plugin(dir.path(), 2);
    let path = kubeconfig(dir.path(), &pki, &hook, EXEC_USER, "");
    let client = WebhookClient::from_kubeconfig_file(&path, &Egress::direct()).unwrap();
    post(&client, "{}").await.unwrap();
    post(&client, "{}").await.unwrap();
    assert_eq!(runs(dir.path()), 1);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    post(&client, "{}").await.unwrap();
    assert_eq!(runs(dir.path()), 2);
    let last = hook.seen.requests.lock().last().unwrap().0.clone();
    assert_eq!(last, "Bearer t2");
}

#[tokio::test]
async fn an_exec_client_certificate_is_presented_to_a_webhook_that_requires_one() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let hook = hook(&pki, true).await;
    let output = serde_json::json!({
        "apiVersion": "client.authentication.svc.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"clientCertificateData": pki.client.0, "clientKeyData": pki.client.1},
    });
    std::fs::write(dir.path().join("cred.json"), output.to_string()).unwrap();
    let plugin = dir.path().join("cert-plugin.sh");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\necho run >> {d}/runs\ncat {d}/cred.json\n",
            d = dir.path().display()
        ),
    )
    .unwrap();
    set_exec(&plugin);
    // Without a certificate the handshake is refused.
    let path = kubeconfig(dir.path(), &pki, &hook, "    token: x\n", "");
    let client = WebhookClient::from_kubeconfig_file(&path, &Egress::direct()).unwrap();
    assert!(post(&client, "{}").await.is_err());
    assert_eq!(hook.seen.calls.load(Ordering::SeqCst), 0);
    let user = format!(
        "    exec:\n      apiVersion: client.authentication.svc.io/v1beta1\n      command: {}\n",
        plugin.display()
    );
    let path = kubeconfig(dir.path(), &pki, &hook, &user, "");
    let client = WebhookClient::from_kubeconfig_file(&path, &Egress::direct()).unwrap();
    for _ in 0..2 {
        assert_eq!(post(&client, "{}").await.unwrap().0, StatusCode::OK);
    }
    assert_eq!(hook.seen.calls.load(Ordering::SeqCst), 2);
    assert_eq!(runs(dir.path()), 1, "no expiry: the certificate is kept");
    assert_eq!(hook.seen.requests.lock()[0].0, "", "no bearer token");
}

#[tokio::test]
async fn a_failing_plugin_is_an_error_naming_it_and_nothing_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let hook = hook(&pki, false).await;
    let p = dir.path().join("token-plugin.sh");
    std::fs::write(&p, "#!/bin/sh\necho 'cannot reach the vault' >&2\nexit 2\n").unwrap();
    set_exec(&p);
    let path = kubeconfig(dir.path(), &pki, &hook, EXEC_USER, "");
    let client = WebhookClient::from_kubeconfig_file(&path, &Egress::direct()).unwrap();
    let e = post(&client, "{}").await.unwrap_err().to_string();
    assert!(
        e.contains("token-plugin.sh") && e.contains("cannot reach the vault"),
        "{e}"
    );
    assert_eq!(hook.seen.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_store_is_reached_through_tinyproxy_when_the_etcd_selection_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = svc_storage::etcd::testing::EtcdCluster::start(dir.path(), 1).await;
    let etcd_port = cluster.members[0].client_port;
    let proxy = Tinyproxy::start(dir.path(), &[etcd_port]);
    let egress = dir.path().join("egress.yaml");
    std::fs::write(
        &egress,
        format!(
            "apiVersion: apiserver.svc.io/v1\nkind: EgressSelectorConfiguration\n\
             egressSelections:\n- name: etcd\n  connection:\n    proxyProtocol: HTTPConnect\n    \
             transport:\n      tcp:\n        url: http://127.0.0.1:{}\n",
            proxy.port
        ),
    )
    .unwrap();
    let endpoints = cluster.endpoints();
    let srv = crate::support::client::TestServer::start_with(move |o| {
        o.storage_backend = svc_gateway::base::flags::StorageBackend::Etcd;
        o.etcd_servers = endpoints;
        o.egress_selector_config_file = Some(egress);
    })
    .await;
    let admin = srv.admin();
    let (s, body) = admin
        .post(
            "/api/v1/namespaces",
            serde_json::json!({"metadata": {"name": "tunnelled"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let (s, got) = admin.get("/api/v1/namespaces/tunnelled").await;
    assert_eq!(s, StatusCode::OK, "{got}");
    assert_eq!(got["metadata"]["uid"], body["metadata"]["uid"]);
    proxy.wait_for(1);
    let want = format!("CONNECT 127.0.0.1:{etcd_port} HTTP/1.1");
    assert!(
        proxy.connects().iter().all(|c| *c == want),
        "{:?}",
        proxy.connects()
    );
}

#[tokio::test]
async fn the_admin_kubeconfig_the_server_writes_is_a_usable_client_file() {
    let srv = crate::support::client::TestServer::start().await;
    let written = std::fs::read_to_string(srv.handle().pki.admin_kubeconfig_path()).unwrap();
    let server = format!("https://127.0.0.1:{}", srv.handle().addr.port());
    assert!(
        written.contains(&format!("server: \"{server}\"")),
        "{written}"
    );
    // The same file, its server URL given the path of the TokenReview collection.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin.kubeconfig");
    std::fs::write(
        &path,
        written.replace(
            &format!("server: \"{server}\""),
            &format!("server: \"{server}/apis/authentication.svc.io/v1/tokenreviews\""),
        ),
    )
    .unwrap();
    let client = WebhookClient::from_kubeconfig_file(&path, &Egress::direct()).unwrap();
    let review = serde_json::json!({"apiVersion": "authentication.svc.io/v1",
        "kind": "TokenReview", "spec": {"token": "not-a-token"}});
    let (status, answer) = post(&client, &review.to_string()).await.unwrap();
    // Created by the admin's client certificate (anonymous would be 401 or 403).
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert_eq!(answer["kind"], "TokenReview", "{answer}");
    assert!(answer["status"]["authenticated"] != true, "{answer}");
    assert!(answer["status"]["error"].is_string(), "{answer}");
}
