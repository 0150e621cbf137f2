//! Listeners, TLS, the choice of protocol (ALPN, or h2's preface), HTTP/1.1 connections
//! (hyper) and graceful shutdown; h2 connections are served by `h2conn.rs`. Each request is
//! handed to the pipeline (`pipeline.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::base::flags::Options;
use crate::observe::metrics::Handshake;
use crate::outbound::pki;
use crate::security::authn::ConnIdentity;
use crate::serve::app::ServerState;
use crate::serve::conn_limits::{self, Activity, CLOSE_GRACE, ConnectionLimit};
use crate::serve::h1conn::{self, Prefixed};
use crate::serve::h2conn;
use crate::serve::held::Held;
use crate::serve::pipeline::{self, Caller, RequestBody};

/// Most header fields in one HTTP/1.1 request (hyper refuses more with 431). Go counts only
/// bytes; this keeps the parser's table bounded while letting any ordinary request through.
const H1_MAX_HEADERS: usize = 1024;

/// The largest HTTP/1.1 request head, from the flag: hyper's read buffer holds the whole
/// head, so it bounds its size, and cannot be under 8 KiB.
fn h1_max_head(opts: &Options) -> usize {
    opts.http_max_header_bytes.max(8192)
}

/// The HTTP/1.1 connection builder with the limits of the flags.
fn h1_builder(opts: &Options) -> http1::Builder {
    let mut builder = http1::Builder::new();
    let max_head = h1_max_head(opts);
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(opts.http_header_read_timeout)
        .max_buf_size(max_head)
        .max_headers(H1_MAX_HEADERS);
    builder
}

/// How connections of a listener are served: HTTP/1.1 by `h1conn.rs` (then hyper), h2 by
/// `h2conn.rs`.
struct Builders {
    h1: http1::Builder,
    h1_limits: h1conn::Limits,
    h2: h2conn::Limits,
}

/// What ends an accept loop and then its connections, in shutdown's order (`run.rs`).
pub struct Stops {
    /// Set first: the loop closes its listener, so that clients are refused (and retry) from
    /// then on instead of being accepted by a server that is closing, and drops
    /// `listener_closed`.
    pub close_listener: watch::Receiver<bool>,
    pub listener_closed: tokio::sync::mpsc::Sender<()>,
    /// Set once every listener is closed: connections close gracefully (h2's GOAWAY).
    pub close_connections: watch::Receiver<bool>,
}

/// A listener's TLS: the acceptor, and what verifies the client certificates it lets in.
#[derive(Clone)]
pub struct Tls {
    pub acceptor: TlsAcceptor,
    pub client_certs: Arc<pki::ClientCerts>,
}

pub async fn accept_loop(
    listener: TcpListener,
    tls: Option<Tls>,
    app: Arc<ServerState>,
    stops: Stops,
) {
    let Stops {
        close_listener: mut stop_listening,
        listener_closed,
        close_connections: stop,
    } = stops;
    let builders = Arc::new(Builders {
        h1: h1_builder(&app.api.opts),
        h1_limits: h1conn::Limits {
            max_head: h1_max_head(&app.api.opts),
            max_headers: H1_MAX_HEADERS,
            header_read_timeout: app.api.opts.http_header_read_timeout,
            idle_timeout: app.api.opts.http_idle_timeout,
        },
        h2: h2conn::Limits {
            max_concurrent_streams: app.api.opts.http2_max_streams_per_connection,
            max_header_list_size: u32::try_from(app.api.opts.http_max_header_bytes)
                .unwrap_or(u32::MAX),
            idle_timeout: app.api.opts.http_idle_timeout,
        },
    });
    let cap = conn_limits::connection_cap(app.api.opts.max_connections);
    let limit = ConnectionLimit::new(cap);
    tracing::debug!(?cap, "connection cap");
    // Every connection task holds a clone; at shutdown, `recv` returns once all have ended.
    let (open_tx, mut open_rx) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        // Room for one more connection first: past the cap, clients wait in the backlog.
        let permit = tokio::select! {
            p = limit.acquire() => p,
            _ = crate::base::lifecycle::until_set(&mut stop_listening) => break,
        };
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = crate::base::lifecycle::until_set(&mut stop_listening) => break,
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let builders = builders.clone();
        let tls = tls.clone();
        let stop = stop.clone();
        let open = open_tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _open = open;
            serve_connection(tcp, peer, tls, app, &builders, stop).await;
        });
    }
    drop(listener);
    drop(listener_closed);
    drop(open_tx);
    let timeout = app.api.opts.shutdown_timeout;
    if tokio::time::timeout(timeout, open_rx.recv()).await.is_err() {
        tracing::warn!(
            ?timeout,
            "requests still in flight at the end of the shutdown timeout"
        );
    }
}

/// Serves one accepted connection: the TLS handshake (bounded by `--tls-handshake-timeout`)
/// and the client certificate's identity, then h2 when ALPN chose it, else HTTP/1.1 or
/// prior-knowledge h2 by the first bytes; the loopback plain listener skips TLS.
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<Tls>,
    app: Arc<ServerState>,
    builders: &Builders,
    stop: watch::Receiver<bool>,
) {
    let Some(tls) = tls else {
        let ident = Arc::new(ConnIdentity {
            cert_user: None,
            insecure: true,
            peer: Some(peer),
            front_proxy: false,
        });
        Box::pin(serve_either(builders, stop, tcp, app, ident)).await;
        return;
    };
    // Boxed, and the stream after it too: the connection's task is otherwise as large as the
    // handshake's state, and each protocol's boxed future holds the stream inline, for as
    // long as the connection lives (an idle HTTP/1.1 watch over TLS carried rustls'
    // connection three times over: in the task, in `serve_either` and in `h1conn`).
    let handshake = tokio::time::timeout(
        app.api.opts.tls_handshake_timeout,
        Box::pin(tls.acceptor.accept(tcp)),
    );
    let mut stop_handshake = stop.clone();
    let stream = tokio::select! {
        r = handshake => match r {
            Ok(Ok(s)) => {
                let kind = s.get_ref().1.handshake_kind();
                app.api.metrics.tls_handshake(match kind {
                    Some(rustls::HandshakeKind::Resumed) => Handshake::Resumed,
                    _ => Handshake::Done,
                });
                s
            }
            Ok(Err(e)) => {
                app.api.metrics.tls_handshake(Handshake::Failed);
                // Any client certificate gets through the handshake (its chain is judged
                // below), so what fails here is the TLS itself, or a client that cannot
                // prove it holds its certificate's key.
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                app.api.metrics.tls_handshake(Handshake::TimedOut);
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        },
        // One begun as shutdown began may still finish, and send its request.
        _ = crate::base::lifecycle::grace_after(&mut stop_handshake, CLOSE_GRACE) => return,
    };
    let stream = Box::new(stream);
    let session = stream.get_ref().1;
    // The chain is verified here, after the handshake, as kube-apiserver verifies it: one
    // that does not verify authenticates nobody, and says why in the log.
    let role = session
        .peer_certificates()
        .filter(|chain| !chain.is_empty())
        .and_then(|chain| match tls.client_certs.role(chain) {
            Ok(role) => Some(role),
            Err(why) => {
                tracing::info!(%peer, reason = %why, "client certificate not verified");
                None
            }
        });
    let cert_user = match role {
        Some(pki::CertRole::Caller) => {
            match session.peer_certificates().and_then(|c| c.first()) {
                None => None,
                // As kube-apiserver's chain does, a certificate it cannot read a user from
                // leaves the request to the next authenticator (a token, or anonymous).
                Some(cert) => pki::client_cert_identity(cert.as_ref()).unwrap_or_else(|why| {
                    tracing::info!(%peer, reason = %why, "client certificate not used");
                    None
                }),
            }
        }
        Some(pki::CertRole::FrontProxy) | None => None,
    };
    // ALPN's h2 skips looking at the first bytes; without it (or with http/1.1) clients
    // speaking h2 with prior knowledge are still served.
    let h2 = session.alpn_protocol() == Some(b"h2".as_slice());
    let ident = Arc::new(ConnIdentity {
        cert_user,
        insecure: false,
        peer: Some(peer),
        front_proxy: role == Some(pki::CertRole::FrontProxy),
    });
    // Each protocol's future boxed on its own: the connection's task is otherwise as large
    // as its largest state (the handshake's, h2's, HTTP/1.1's), whichever the connection
    // speaks, for as long as it lives.
    if h2 {
        Box::pin(h2conn::serve(stream, app, ident, builders.h2.clone(), stop)).await;
    } else {
        Box::pin(serve_either(builders, stop, stream, app, ident)).await;
    }
}

/// The first bytes of every h2 connection (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection whose protocol ALPN did not settle: h2 if it starts with h2's preface (prior
/// knowledge), else HTTP/1.1. A connection that sends neither within the idle timeout is
/// dropped.
async fn serve_either<I>(
    builders: &Builders,
    mut stop: watch::Receiver<bool>,
    mut io: I,
    app: Arc<ServerState>,
    ident: Arc<ConnIdentity>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut seen = Vec::with_capacity(H2_PREFACE.len());
    let read = async {
        let mut buf = [0u8; 24];
        while seen.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(&seen) {
            let want = H2_PREFACE.len().saturating_sub(seen.len());
            let Some(room) = buf.get_mut(..want) else {
                return false;
            };
            match io.read(room).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => seen.extend_from_slice(room.get(..n).unwrap_or_default()),
            }
        }
        true
    };
    let read = tokio::time::timeout(app.api.opts.http_idle_timeout, read);
    let complete = tokio::select! {
        r = read => matches!(r, Ok(true)),
        // A connection opened as shutdown began may still send its first request.
        _ = crate::base::lifecycle::grace_after(&mut stop, CLOSE_GRACE) => false,
    };
    if !complete {
        return;
    }
    if seen == H2_PREFACE {
        let io = Prefixed {
            head: Bytes::from(seen),
            io,
        };
        Box::pin(h2conn::serve(io, app, ident, builders.h2.clone(), stop)).await;
        return;
    }
    // GETs without a body are served outside hyper while they last (`h1conn.rs`).
    let rest = Box::pin(h1conn::serve(
        io,
        seen,
        &builders.h1_limits,
        stop.clone(),
        app.clone(),
        ident.clone(),
    ))
    .await;
    if let Some(rest) = rest {
        Box::pin(serve_h1(&builders.h1, stop, TokioIo::new(rest), app, ident)).await;
    }
}

/// Serves one HTTP/1.1 connection until it ends: closed gracefully at shutdown or once it has
/// carried no request for `--http-idle-timeout`.
async fn serve_h1<I>(
    builder: &http1::Builder,
    mut stop: watch::Receiver<bool>,
    io: I,
    app: Arc<ServerState>,
    ident: Arc<ConnIdentity>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let activity = Activity::new();
    let idle_timeout = app.api.opts.http_idle_timeout;
    let svc = service_fn({
        let activity = activity.clone();
        move |req| {
            let app = app.clone();
            let ident = ident.clone();
            let busy = activity.begin();
            // Boxed: hyper keeps its service future inline in the connection for the
            // connection's whole life, so an unboxed pipeline future would cost every
            // connection (every HTTP/1.1 watch) its ~8 KiB even after it has answered.
            Box::pin(async move {
                let req = req.map(RequestBody::Stream);
                let resp = pipeline::handle(app, Caller::Connection(ident), req).await;
                Ok::<_, std::convert::Infallible>(resp.map(|b| Held::new(b, busy)))
            })
        }
    });
    // Upgrades (exec, attach, port-forward) are taken by proxy mode, which joins the
    // connection to the upstream's; standalone mode never answers 101.
    let conn = builder.serve_connection(io, svc).with_upgrades();
    tokio::pin!(conn);
    let mut closing = false;
    let result = loop {
        tokio::select! {
            r = conn.as_mut() => break r,
            _ = crate::base::lifecycle::until_set(&mut stop), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = activity.idle_for(idle_timeout), if !closing => {
                tracing::debug!("closing an idle connection");
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            // One with nothing in flight after asking is dropped.
            _ = activity.idle_for(CLOSE_GRACE), if closing => {
                tracing::debug!("dropping a connection that did not close when asked");
                break Ok(());
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}
