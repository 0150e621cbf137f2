//! Listeners, TLS, HTTP/1.1 and HTTP/2 connections, and graceful shutdown; each request is
//! handed to the pipeline (`pipeline.rs`).

use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use svc_core::config::egress::Selection;
use svc_storage::Store;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::app::App;
use crate::authn::ConnIdentity;
use crate::config::Options;
use crate::pipeline::{self, Caller, RequestBody};
use crate::pki::{self, PkiOptions};
use crate::{bootstrap, controllers};

const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Arc<App>,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .max_buf_size(64 * 1024);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(app.opts.http2_max_streams_per_connection)
        .keep_alive_interval(Duration::from_secs(30))
        .max_header_list_size(64 * 1024);
    let builder = Arc::new(builder);
    loop {
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
        let builder = builder.clone();
        let tls = tls.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            match tls {
                Some(tls) => {
                    let stream =
                        match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "TLS handshake timed out");
                                return;
                            }
                        };
                    let cert_user = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| pki::user_from_client_cert(c.as_ref()));
                    let ident = Arc::new(ConnIdentity {
                        cert_user,
                        insecure: false,
                        peer: Some(peer),
                    });
                    serve_conn(builder, watcher, TokioIo::new(stream), app, ident).await;
                }
                None => {
                    let ident = Arc::new(ConnIdentity {
                        cert_user: None,
                        insecure: true,
                        peer: Some(peer),
                    });
                    serve_conn(builder, watcher, TokioIo::new(tcp), app, ident).await;
                }
            }
        });
    }
    drop(listener);
    let timeout = app.opts.shutdown_timeout;
    if tokio::time::timeout(timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?timeout,
            "requests still in flight at the end of the shutdown timeout"
        );
    }
}

async fn serve_conn<I>(
    builder: Arc<auto::Builder<TokioExecutor>>,
    watcher: hyper_util::server::graceful::Watcher,
    io: I,
    app: Arc<App>,
    ident: Arc<ConnIdentity>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let app = app.clone();
        let ident = ident.clone();
        async move {
            let req = req.map(RequestBody::Stream);
            Ok::<_, std::convert::Infallible>(
                pipeline::handle(app, Caller::Connection(ident), req).await,
            )
        }
    });
    let conn = builder.serve_connection(io, svc);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}
