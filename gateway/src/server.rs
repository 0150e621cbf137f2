//! Listeners, TLS, the choice of protocol (ALPN, or h2's preface), HTTP/1.1 connections
//! (hyper) and graceful shutdown; h2 connections are served by `h2conn.rs`. Each request is
//! handed to the pipeline (`pipeline.rs`).

use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use svc_config::egress::Selection;
use svc_storage::Store;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::app::App;
use crate::authn::ConnIdentity;
use crate::config::Options;
use crate::conn_limits::{self, Activity, CLOSE_GRACE, ConnectionLimit, CountedBody};
use crate::pipeline::{self, Caller, RequestBody};
use crate::pki::{self, PkiOptions};
use crate::{bootstrap, controllers, h2conn};

/// A running server.
pub struct ServerHandle {
    /// The HTTPS address.
    pub addr: SocketAddr,
    /// The loopback plain-HTTP address, when enabled.
    pub insecure_addr: Option<SocketAddr>,
    pub app: Arc<App>,
    pub admin_kubeconfig: std::path::PathBuf,
    /// The cluster PKI (tests issue client certificates from it).
    pub pki: Arc<pki::Pki>,
    stop_accepting: watch::Sender<bool>,
    stop_watches: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    /// Graceful shutdown: fail `/readyz`, keep serving for `--shutdown-delay-duration`, stop
    /// accepting, end watches, and wait (up to `--shutdown-timeout`) for requests in flight.
    pub async fn shutdown(self) {
        self.app.shutting_down.store(true, Ordering::Release);
        tracing::info!(delay = ?self.app.opts.shutdown_delay_duration, "shutdown started");
        tokio::time::sleep(self.app.opts.shutdown_delay_duration).await;
        let _ = self.stop_watches.send(true);
        let _ = self.stop_accepting.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        if let Some(audit) = &self.app.audit {
            audit.shutdown().await;
        }
        if let Some(tracer) = &self.app.tracer {
            tracer.flush().await;
        }
        tracing::info!("shutdown complete");
    }
}

/// Opens the store (embedded, or etcd with `--storage-backend=etcd`), creates or loads the
/// PKI, binds the listeners and starts serving.
pub async fn start(opts: Options) -> anyhow::Result<ServerHandle> {
    if opts.storage_backend == crate::config::StorageBackend::Etcd {
        // Connections are lazy: an unreachable etcd shows in /readyz and 503s, not here.
        let mut etcd = opts.etcd_config();
        let dialer = opts.egress()?.dialer(Selection::Etcd);
        if !dialer.is_direct() {
            tracing::info!(route = %dialer.describe(), "etcd connections use the egress selector");
            etcd.dialer = Some(svc_storage::etcd::EtcdDialer(Arc::new(
                move |host, port| {
                    let dialer = dialer.clone();
                    Box::pin(async move {
                        let stream = dialer.dial(&host, port).await?;
                        Ok(Box::new(stream) as Box<dyn svc_storage::etcd::EtcdIo>)
                    })
                },
            )));
        }
        let store = svc_storage::etcd::EtcdStore::connect(etcd)
            .await
            .with_context(|| format!("connecting to etcd at {:?}", opts.etcd_servers))?;
        return start_with_store(opts, store).await;
    }
    let store_dir = opts.store_dir();
    // Readable by the owner only: the store holds every Secret in clear.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&store_dir)
        .with_context(|| format!("creating data directory {}", store_dir.display()))?;
    let store =
        svc_storage::embedded::EmbeddedStore::open(&store_dir, opts.embedded_store_config())
            .with_context(|| format!("opening the store in {}", store_dir.display()))?;
    start_with_store(opts, store).await
}

pub async fn start_with_store(
    opts: Options,
    store: Arc<dyn Store>,
) -> anyhow::Result<ServerHandle> {
    // A bad admission configuration stops the start before anything listens.
    let admission = crate::admission::Chain::from_options(&opts).map_err(anyhow::Error::msg)?;
    let listener = TcpListener::bind((opts.bind_address, opts.secure_port))
        .await
        .with_context(|| format!("binding {}:{}", opts.bind_address, opts.secure_port))?;
    let addr = listener.local_addr()?;
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        addr.ip().to_string()
    };
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let kubeconfig = opts.data_dir.join("admin.kubeconfig");
    let pki_opts = PkiOptions {
        tls_sans: opts.tls_sans.clone(),
        admin_kubeconfig_path: kubeconfig.clone(),
        server_url: format!("https://{host}:{}", addr.port()),
        cluster_signing: opts.cluster_signing().map_err(anyhow::Error::msg)?,
    };
    let cert_dir = opts.cert_dir();
    let pki = tokio::task::spawn_blocking(move || pki::ensure_pki(&cert_dir, &pki_opts))
        .await?
        .context("preparing certificates")?;
    let tls = TlsAcceptor::from(
        pki.server_config()
            .context("building the TLS configuration")?,
    );
    let pki = Arc::new(pki);

    let (stop_watches_tx, stop_watches_rx) = watch::channel(false);
    let (stop_accepting_tx, stop_accepting_rx) = watch::channel(false);
    let tokens =
        crate::tokens::Tokens::new(&opts, pki.sa_signing_key_pem(), pki.sa_public_key_pem())
            .map_err(|e| anyhow::anyhow!("service-account tokens: {e}"))?;
    let tracing = match &opts.tracing_config_file {
        None => None,
        Some(path) => Some(crate::trace::config::read(path).map_err(anyhow::Error::msg)?),
    };
    let mut app = App::new(
        opts.clone(),
        store,
        stop_watches_rx.clone(),
        tokens,
        tracing.as_ref(),
    )
    .context("starting traces")?;
    app.egress = opts.egress()?;
    let webhook_metrics =
        crate::admission::webhook::call::WebhookMetrics::register(&mut app.metrics);
    let webhooks =
        crate::admission::webhook::Webhooks::new(&app.caches, app.egress.clone(), webhook_metrics);
    app.admission = admission.with_webhooks(Arc::new(webhooks));
    let webhook = match &opts.audit.audit_webhook_config_file {
        None => None,
        Some(path) => Some(std::sync::Arc::new(
            crate::client::WebhookClient::from_kubeconfig_file(path, &app.egress)
                .map_err(|e| anyhow::anyhow!("--audit-webhook-config-file: {e}"))?,
        )
            as std::sync::Arc<dyn crate::audit::webhook::Target>),
    };
    app.audit = crate::audit::Auditor::from_options(&opts.audit, &app.metrics.audit, webhook)
        .map_err(anyhow::Error::msg)?;
    let app = Arc::new(app);
    let reload_task = start_authentication_config(&app, stop_watches_rx)?;
    let authorization_reload =
        crate::authz::load::start(&app, crate::authz::load::connect_with(app.egress.clone()))
            .map_err(|e| anyhow::anyhow!("--authorization-config: {e}"))?;

    let mut tasks = vec![tokio::spawn(accept_loop(
        listener,
        Some(tls),
        app.clone(),
        stop_accepting_rx.clone(),
    ))];
    let mut insecure_addr = None;
    if opts.insecure_port != 0 {
        let l = TcpListener::bind(("127.0.0.1", opts.insecure_port)).await?;
        insecure_addr = Some(l.local_addr()?);
        tasks.push(tokio::spawn(accept_loop(
            l,
            None,
            app.clone(),
            stop_accepting_rx,
        )));
    }
    tasks.extend(reload_task);
    tasks.extend(authorization_reload);
    bootstrap::start(&app);
    controllers::start(&app, &pki);
    tracing::info!(%addr, ?insecure_addr, kubeconfig = %kubeconfig.display(), "serving");
    Ok(ServerHandle {
        addr,
        insecure_addr,
        app,
        admin_kubeconfig: kubeconfig,
        pki,
        stop_accepting: stop_accepting_tx,
        stop_watches: stop_watches_tx,
        tasks,
    })
}

/// Loads `--authentication-config` (a bad file stops the start with all its errors) and
/// re-reads it when it changes.
fn start_authentication_config(
    app: &Arc<App>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Option<JoinHandle<()>>> {
    let Some(path) = app.opts.authentication_config.clone() else {
        return Ok(None);
    };
    let load = |app: &App, bytes: &[u8]| {
        let ctx = crate::jwt::LoadContext {
            service_account_issuers: std::slice::from_ref(&app.opts.service_account_issuer),
            anonymous_flag_set: app.opts.anonymous_auth.is_some(),
        };
        crate::jwt::Authentication::load(bytes, &ctx, &app.jwt)
    };
    let bytes = crate::reload::read_file(&path)
        .map_err(|e| anyhow::anyhow!("--authentication-config: {e}"))?;
    let loaded = load(app, &bytes)
        .map_err(|e| anyhow::anyhow!("--authentication-config {}: {e}", path.display()))?;
    app.set_authentication(loaded);
    let weak = Arc::downgrade(app);
    Ok(Some(crate::reload::spawn(
        "authentication",
        path,
        app.opts.config_reload_interval,
        app.authentication_reloads.clone(),
        stop,
        move |bytes| {
            let app = weak.upgrade().ok_or("the server is gone")?;
            let loaded = load(&app, bytes).map_err(|e| e.to_string())?;
            app.set_authentication(loaded);
            Ok(())
        },
    )))
}

/// Most header fields in one HTTP/1.1 request (hyper refuses more with 431). Go counts only
/// bytes; this keeps the parser's table bounded while letting any ordinary request through.
const H1_MAX_HEADERS: usize = 1024;

/// The HTTP/1.1 connection builder with the limits of the flags.
fn h1_builder(opts: &Options) -> http1::Builder {
    let mut builder = http1::Builder::new();
    // hyper's read buffer holds the whole request head, so it bounds its size (at least 8 KiB).
    let max_head = opts.http_max_header_bytes.max(8192);
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(opts.http_header_read_timeout)
        .max_buf_size(max_head)
        .max_headers(H1_MAX_HEADERS);
    builder
}

/// How connections of a listener are served: HTTP/1.1 by hyper, h2 by `h2conn.rs`.
struct Builders {
    h1: http1::Builder,
    h2: h2conn::Limits,
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Arc<App>,
    mut stop: watch::Receiver<bool>,
) {
    let builders = Arc::new(Builders {
        h1: h1_builder(&app.opts),
        h2: h2conn::Limits {
            max_concurrent_streams: app.opts.http2_max_streams_per_connection,
            max_header_list_size: u32::try_from(app.opts.http_max_header_bytes).unwrap_or(u32::MAX),
            idle_timeout: app.opts.http_idle_timeout,
        },
    });
    let cap = conn_limits::connection_cap(app.opts.max_connections);
    let limit = ConnectionLimit::new(cap);
    tracing::debug!(?cap, "connection cap");
    // Every connection task holds a clone; at shutdown, `recv` returns once all have ended.
    let (open_tx, mut open_rx) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        // Room for one more connection first: past the cap, clients wait in the backlog.
        let permit = tokio::select! {
            p = limit.acquire() => p,
            _ = crate::lifecycle::until_set(&mut stop) => break,
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
            _ = crate::lifecycle::until_set(&mut stop) => break,
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
            match tls {
                Some(tls) => {
                    let handshake =
                        tokio::time::timeout(app.opts.tls_handshake_timeout, tls.accept(tcp));
                    let mut stop_handshake = stop.clone();
                    let stream = tokio::select! {
                        r = handshake => match r {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "TLS handshake timed out");
                                return;
                            }
                        },
                        _ = crate::lifecycle::until_set(&mut stop_handshake) => return,
                    };
                    let session = stream.get_ref().1;
                    let cert_user = session
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| pki::user_from_client_cert(c.as_ref()));
                    // ALPN's h2 skips looking at the first bytes; without it (or with
                    // http/1.1) clients speaking h2 with prior knowledge are still served.
                    let h2 = session.alpn_protocol() == Some(b"h2".as_slice());
                    let ident = Arc::new(ConnIdentity {
                        cert_user,
                        insecure: false,
                        peer: Some(peer),
                    });
                    if h2 {
                        h2conn::serve(stream, app, ident, builders.h2.clone(), stop).await;
                    } else {
                        serve_either(&builders, stop, stream, app, ident).await;
                    }
                }
                None => {
                    let ident = Arc::new(ConnIdentity {
                        cert_user: None,
                        insecure: true,
                        peer: Some(peer),
                    });
                    serve_either(&builders, stop, tcp, app, ident).await;
                }
            }
        });
    }
    drop(listener);
    drop(open_tx);
    let timeout = app.opts.shutdown_timeout;
    if tokio::time::timeout(timeout, open_rx.recv()).await.is_err() {
        tracing::warn!(
            ?timeout,
            "requests still in flight at the end of the shutdown timeout"
        );
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
    app: Arc<App>,
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
    let read = tokio::time::timeout(app.opts.http_idle_timeout, read);
    let complete = tokio::select! {
        r = read => matches!(r, Ok(true)),
        _ = crate::lifecycle::until_set(&mut stop) => false,
    };
    if !complete {
        return;
    }
    let io = Prefixed {
        head: Bytes::from(seen),
        io,
    };
    if io.head.as_ref() == H2_PREFACE {
        h2conn::serve(io, app, ident, builders.h2.clone(), stop).await;
    } else {
        serve_h1(&builders.h1, stop, TokioIo::new(io), app, ident).await;
    }
}

/// A connection with the bytes already read from it put back in front.
struct Prefixed<I> {
    head: Bytes,
    io: I,
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.head.is_empty() {
            let n = self.head.len().min(buf.remaining());
            let part = self.head.split_to(n);
            buf.put_slice(&part);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Serves one HTTP/1.1 connection until it ends: closed gracefully at shutdown or once it has
/// carried no request for `--http-idle-timeout`.
async fn serve_h1<I>(
    builder: &http1::Builder,
    mut stop: watch::Receiver<bool>,
    io: I,
    app: Arc<App>,
    ident: Arc<ConnIdentity>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let activity = Activity::new();
    let idle_timeout = app.opts.http_idle_timeout;
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
                Ok::<_, std::convert::Infallible>(resp.map(|b| CountedBody::new(b, busy)))
            })
        }
    });
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    let mut closing = false;
    let result = loop {
        tokio::select! {
            r = conn.as_mut() => break r,
            _ = crate::lifecycle::until_set(&mut stop), if !closing => {
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
