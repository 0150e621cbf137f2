//! The outbound client against a server written frame by frame: what a busy upstream does
//! that a well-behaved test server never does.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{WebhookClient, buffered};
use crate::outbound::egress::Egress;

const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// HPACK: `:status 200` from the static table.
const STATUS_200: u8 = 0x88;

/// Requests given up on before the late answers come: more than h2's default limit of
/// resets for a peer's frames (1,024) over a connection's life.
const GIVEN_UP: usize = 1_100;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A TLS acceptor offering h2 alone, with a certificate for `localhost`, and that
/// certificate's PEM for the client to trust.
fn tls_server() -> (tokio_rustls::TlsAcceptor, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let mut config =
        rustls::ServerConfig::builder_with_provider(crate::outbound::egress::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    (
        tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        cert.pem(),
    )
}

/// A client of `https://localhost:{port}` that trusts `pem`.
fn client_of(port: u16, pem: &str) -> WebhookClient {
    WebhookClient::from_url(
        &format!("https://localhost:{port}"),
        Some(pem.as_bytes()),
        &Egress::direct(),
    )
    .unwrap()
}

/// `GET path` with no body.
fn get(path: &str) -> http::Request<super::RequestBody> {
    http::Request::get(path)
        .body(buffered(bytes::Bytes::new()))
        .unwrap()
}

/// What the server saw.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    /// The debug data of each GOAWAY the client sent.
    goaways: parking_lot::Mutex<Vec<String>>,
}

/// A TLS h2 server that answers the first request, then nothing until `GIVEN_UP` streams
/// have been reset by the client, then, once h2 has forgotten them (it keeps a reset stream for a second), answers
/// every one of them (as an upstream that was slow does, its answers crossing the resets),
/// and from then on answers each request at once.
async fn late_server(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    seen: Arc<Seen>,
    answered: Arc<Notify>,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        seen.connections.fetch_add(1, Ordering::SeqCst);
        let (acceptor, seen, answered) = (acceptor.clone(), seen.clone(), answered.clone());
        tokio::spawn(async move {
            let Ok(mut io) = acceptor.accept(tcp).await else {
                return;
            };
            let mut preface = [0u8; 24];
            if io.read_exact(&mut preface).await.is_err() {
                return;
            }
            if io.write_all(&frame(SETTINGS, 0, 0, &[])).await.is_err() {
                return;
            }
            let mut reset = Vec::new();
            let mut late_sent = false;
            loop {
                let mut head = [0u8; 9];
                if io.read_exact(&mut head).await.is_err() {
                    return;
                }
                let len =
                    usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
                let (kind, flags) = (head[3], head[4]);
                let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                let mut payload = vec![0u8; len];
                if io.read_exact(&mut payload).await.is_err() {
                    return;
                }
                let reply = match kind {
                    SETTINGS if flags & ACK == 0 => frame(SETTINGS, ACK, 0, &[]),
                    PING if flags & ACK == 0 => frame(PING, ACK, 0, &payload),
                    GOAWAY => {
                        let debug = payload.get(8..).unwrap_or_default();
                        seen.goaways
                            .lock()
                            .push(String::from_utf8_lossy(debug).into_owned());
                        Vec::new()
                    }
                    // The first request, sent alone, opens the connection the others share.
                    HEADERS if late_sent || stream == 1 => {
                        frame(HEADERS, END_STREAM | END_HEADERS, stream, &[STATUS_200])
                    }
                    RST_STREAM if !late_sent => {
                        reset.push(stream);
                        if reset.len() < GIVEN_UP {
                            Vec::new()
                        } else {
                            tokio::time::sleep(Duration::from_millis(1_500)).await;
                            late_sent = true;
                            let late: Vec<u8> = reset
                                .iter()
                                .flat_map(|s| {
                                    frame(HEADERS, END_STREAM | END_HEADERS, *s, &[STATUS_200])
                                })
                                .collect();
                            late
                        }
                    }
                    _ => Vec::new(),
                };
                if !reply.is_empty() && io.write_all(&reply).await.is_err() {
                    return;
                }
                if late_sent && kind == RST_STREAM {
                    answered.notify_one();
                }
            }
        });
    }
}

/// An upstream that answers requests the proxy has given up on (its answers crossing the
/// resets) does not cost the connection: h2's default would have ended it, with every
/// stream on it, after 1,024 such answers over its life.
#[tokio::test]
async fn late_answers_to_given_up_requests_keep_the_connection() {
    let (acceptor, pem) = tls_server();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let answered = Arc::new(Notify::new());
    let server = tokio::spawn(late_server(
        listener,
        acceptor,
        seen.clone(),
        answered.clone(),
    ));

    let client = client_of(port, &pem);
    let first = client.request(get("/first")).await.unwrap();
    assert_eq!(first.status(), http::StatusCode::OK);
    // Each request is given up on (its future dropped: h2 resets the stream).
    let given_up = (0..GIVEN_UP).map(|i| {
        let client = client.clone();
        let request = get(&format!("/slow/{i}"));
        async move {
            let answer =
                tokio::time::timeout(Duration::from_millis(300), client.request(request)).await;
            assert!(
                answer.is_err(),
                "request {i} was answered before it was given up"
            );
        }
    });
    futures::future::join_all(given_up).await;
    tokio::time::timeout(Duration::from_secs(30), answered.notified())
        .await
        .expect("the server answered the given-up requests");
    // The late answers read by the client before the next request goes out.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let answer = tokio::time::timeout(Duration::from_secs(5), client.request(get("/after")))
        .await
        .expect("answered in time")
        .expect("answered");
    assert_eq!(answer.status(), http::StatusCode::OK);
    let goaways = seen.goaways.lock().clone();
    assert!(
        goaways.is_empty(),
        "the client ended the connection: {goaways:?}"
    );
    assert_eq!(
        seen.connections.load(Ordering::SeqCst),
        1,
        "the request after the late answers went on a new connection"
    );
    server.abort();
}

/// A TLS h2 server (the `h2` crate's) that counts its connections and, with `end_first`, ends
/// the first one after its first request, as a server restarting or closing an idle
/// connection does.
async fn counting_server(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    connections: Arc<AtomicUsize>,
    end_first: bool,
) {
    while let Ok((tcp, _)) = listener.accept().await {
        let n = connections.fetch_add(1, Ordering::SeqCst);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(io) = acceptor.accept(tcp).await else {
                return;
            };
            let Ok(mut conn) = h2::server::handshake(io).await else {
                return;
            };
            while let Some(Ok((_, mut respond))) = conn.accept().await {
                let _ = respond.send_response(http::Response::new(()), true);
                if end_first && n == 0 {
                    conn.graceful_shutdown();
                }
            }
        });
    }
}

/// A counting server on a port of its own (see [`counting_server`]), a client of it, and the
/// server's count of connections.
async fn counted(end_first: bool) -> (WebhookClient, Arc<AtomicUsize>, JoinHandle<()>) {
    let (acceptor, pem) = tls_server();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let server = tokio::spawn(counting_server(
        listener,
        acceptor,
        connections.clone(),
        end_first,
    ));
    (client_of(port, &pem), connections, server)
}

/// `n` requests at once, each answered 200.
async fn burst(client: &WebhookClient, n: usize) {
    let all = (0..n).map(|_| {
        let client = client.clone();
        async move { client.request(get("/")).await.map(|r| r.status()) }
    });
    for answer in futures::future::join_all(all).await {
        assert_eq!(answer.expect("answered"), http::StatusCode::OK);
    }
}

/// A burst of requests at a moment with no connection open shares one new h2 connection,
/// instead of dialling one connection per request.
#[tokio::test]
async fn a_burst_after_a_connection_ended_shares_one_new_connection() {
    let (client, connections, server) = counted(true).await;
    let first = client.request(get("/")).await.unwrap();
    assert_eq!(first.status(), http::StatusCode::OK);
    // The server's GOAWAY read: the pool holds no open connection now.
    tokio::time::sleep(Duration::from_millis(300)).await;

    burst(&client, 100).await;
    let n = connections.load(Ordering::SeqCst);
    assert!(
        n <= 3,
        "{n} connections for 1 request and a burst of 100 after it"
    );
    server.abort();
}

/// The first burst of a new client, before any connection is open, shares one connection too.
#[tokio::test]
async fn a_first_burst_shares_one_connection() {
    let (client, connections, server) = counted(false).await;
    burst(&client, 100).await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "one connection for the burst"
    );
    server.abort();
}
