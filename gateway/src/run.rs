//! Starting and stopping a whole server, on one path for both modes with the mode as its
//! parameter ([`Source`]): open the store (or, with `--upstream-kubeconfig`, read the
//! upstream's kubeconfig and the client CAs, `run/proxy.rs`), bind the listeners, create or
//! load the PKI, build the server state, start the mode's own tasks (standalone: the
//! reloadable configuration files and the built-in controllers; proxy: its caches), then
//! accept. The last floor: it may use every layer before it.

pub mod proxy;

use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use svc_config::egress::Selection;
use svc_storage::Store;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::base::flags::Options;
use crate::controllers::{bootstrap, csr};
use crate::http::api::Standalone;
use crate::outbound::egress::Egress;
use crate::outbound::pki::{self, PkiOptions};
use crate::serve::app::{Mode, Parts, ServerState, StoreParts};
use crate::serve::conn_limits;
use crate::serve::server::{Stops, Tls, accept_loop};

/// A running server.
pub struct ServerHandle {
    /// The HTTPS address.
    pub addr: SocketAddr,
    /// The loopback plain-HTTP address, when enabled.
    pub insecure_addr: Option<SocketAddr>,
    pub app: Arc<ServerState>,
    /// The admin kubeconfig written in the data directory (empty in proxy mode).
    pub admin_kubeconfig: std::path::PathBuf,
    /// The cluster PKI (tests issue client certificates from it).
    pub pki: Arc<pki::Pki>,
    signals: Signals,
    tasks: Vec<JoinHandle<()>>,
}

/// How long shutdown waits for h2 connections to send their GOAWAY before it ends the
/// watches anyway.
const FAREWELL_WAIT: Duration = Duration::from_secs(1);

/// A server's stop signals, set in shutdown's order by [`ServerHandle::shutdown`].
pub(crate) struct Signals {
    close_listeners: watch::Sender<bool>,
    /// Each accept loop holds a clone until its listener is closed.
    listener_open: mpsc::Sender<()>,
    listeners_closed: mpsc::Receiver<()>,
    close_connections: watch::Sender<bool>,
    stop_watches: watch::Sender<bool>,
}

impl Signals {
    pub(crate) fn new() -> Self {
        let (listener_open, listeners_closed) = mpsc::channel(1);
        Signals {
            close_listeners: watch::Sender::new(false),
            listener_open,
            listeners_closed,
            close_connections: watch::Sender::new(false),
            stop_watches: watch::Sender::new(false),
        }
    }

    /// What long-running work (watches, controllers, reloads) ends on.
    pub(crate) fn watches(&self) -> watch::Receiver<bool> {
        self.stop_watches.subscribe()
    }

    /// What one accept loop and its connections end on.
    pub(crate) fn accept_loop(&self) -> Stops {
        Stops {
            close_listener: self.close_listeners.subscribe(),
            listener_closed: self.listener_open.clone(),
            close_connections: self.close_connections.subscribe(),
        }
    }
}

impl ServerHandle {
    /// Graceful shutdown: fail `/readyz` and keep serving for `--shutdown-delay-duration`;
    /// close the listeners; close the connections (h2's GOAWAY); then end the watches, and
    /// wait (up to `--shutdown-timeout`) for requests in flight.
    ///
    /// The order is kube-apiserver's, and for the same reason: a client whose watch ends
    /// reconnects at once. With its connection already saying GOAWAY it does not open the next
    /// watch there, and with the listeners closed its new connection is refused (it retries
    /// the watch from the version it holds) rather than accepted by a server about to drop it
    /// (client-go reports that as a broken pipe, and its reflector lists again).
    pub async fn shutdown(self) {
        self.app.api.shutting_down.store(true, Ordering::Release);
        tracing::info!(delay = ?self.app.api.opts.shutdown_delay_duration, "shutdown started");
        tokio::time::sleep(self.app.api.opts.shutdown_delay_duration).await;
        let Signals {
            close_listeners,
            listener_open,
            mut listeners_closed,
            close_connections,
            stop_watches,
        } = self.signals;
        self.app.api.closing.store(true, Ordering::Release);
        let _ = close_listeners.send(true);
        drop(listener_open);
        let _ = listeners_closed.recv().await;
        let _ = close_connections.send(true);
        if tokio::time::timeout(FAREWELL_WAIT, self.app.farewells.all_said())
            .await
            .is_err()
        {
            tracing::warn!(
                wait = ?FAREWELL_WAIT,
                "ending watches before every h2 connection has sent its GOAWAY"
            );
        }
        let _ = stop_watches.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        if let Some(audit) = self
            .app
            .standalone()
            .and_then(|own| own.security.audit.as_ref())
        {
            audit.shutdown().await;
        }
        if let Some(tracer) = &self.app.api.tracer {
            tracer.flush().await;
        }
        tracing::info!("shutdown complete");
    }
}

/// Starts a server in the mode its flags name: over its store (embedded, or etcd with
/// `--storage-backend=etcd`), or in front of the upstream of `--upstream-kubeconfig`.
pub async fn start(opts: Options) -> anyhow::Result<ServerHandle> {
    opts.check_mode().map_err(anyhow::Error::msg)?;
    let source = if opts.upstream_kubeconfig.is_some() {
        Source::Upstream(proxy::Upstreams::from_options(&opts)?)
    } else {
        Source::store(&opts, open_store(&opts).await?)?
    };
    start_with(opts, source).await
}

/// Starts a server over `store`.
pub async fn start_with_store(
    opts: Options,
    store: Arc<dyn Store>,
) -> anyhow::Result<ServerHandle> {
    let source = Source::store(&opts, store)?;
    start_with(opts, source).await
}

/// What a server serves from: the mode, as the one parameter of its start.
enum Source {
    /// Standalone: its own store, and the admission plugins of the flags (a proxy has none:
    /// the upstream admits).
    Store {
        store: Arc<dyn Store>,
        admission: crate::registry::admission::Chain,
    },
    /// Proxy mode: the upstream API server, with the client CAs its callers are verified by.
    Upstream(proxy::Upstreams),
}

impl Source {
    /// Standalone mode over `store`. A bad admission configuration stops the start here,
    /// before anything listens.
    fn store(opts: &Options, store: Arc<dyn Store>) -> anyhow::Result<Self> {
        let admission =
            crate::registry::admission::Chain::from_options(opts).map_err(anyhow::Error::msg)?;
        Ok(Source::Store { store, admission })
    }
}

/// Opens the store of the flags: etcd, or the embedded store in the data directory.
async fn open_store(opts: &Options) -> anyhow::Result<Arc<dyn Store>> {
    if opts.storage_backend == crate::base::flags::StorageBackend::Etcd {
        // Connections are lazy: an unreachable etcd shows in /readyz and 503s, not here.
        let mut etcd = opts.etcd_config();
        let dialer = Egress::from_options(opts)?.dialer(Selection::Etcd);
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
        return Ok(store);
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
    Ok(store)
}

/// The one start path: the admission configuration checked, the listeners bound, the PKI of
/// the data directory, the server state, the mode's own tasks (standalone: configuration
/// reloads and the built-in controllers; proxy: its caches), then the accept loops.
async fn start_with(opts: Options, source: Source) -> anyhow::Result<ServerHandle> {
    let listener = conn_limits::listen(SocketAddr::new(opts.bind_address, opts.secure_port))
        .with_context(|| format!("binding {}:{}", opts.bind_address, opts.secure_port))?;
    let addr = listener.local_addr()?;
    // A proxy writes no admin kubeconfig: its callers hold the upstream's credentials.
    let (pki, tls, admin_kubeconfig) = match &source {
        Source::Store { .. } => {
            let kubeconfig = opts.data_dir.join("admin.kubeconfig");
            let (pki, tls) = prepare_pki(&opts, addr, &kubeconfig).await?;
            (pki, tls, kubeconfig)
        }
        Source::Upstream(upstreams) => {
            let (pki, tls) = proxy::prepare_pki(&opts, addr, upstreams).await?;
            (pki, tls, std::path::PathBuf::new())
        }
    };

    let signals = Signals::new();
    let tracing = match &opts.tracing_config_file {
        None => None,
        Some(path) => Some(crate::observe::trace::file::read(path).map_err(anyhow::Error::msg)?),
    };
    let parts = Parts {
        stop_watches: signals.watches(),
        tracing,
        egress: match &source {
            Source::Upstream(upstreams) => upstreams.egress().clone(),
            Source::Store { .. } => Egress::from_options(&opts)?,
        },
        collectors: Vec::new(),
    };
    let (app, mut tasks) = match source {
        Source::Store { store, admission } => {
            let tokens = crate::security::tokens::Tokens::new(
                &opts,
                pki.sa_signing_key_pem(),
                pki.sa_public_key_pem(),
            )
            .map_err(|e| anyhow::anyhow!("service-account tokens: {e}"))?;
            let own = StoreParts {
                store,
                tokens,
                admission,
            };
            let (app, own) = ServerState::over_store(opts.clone(), parts, own)?;
            let app = Arc::new(app);
            let mut tasks = Vec::new();
            tasks.extend(start_authentication_config(&own, signals.watches())?);
            tasks.extend(
                crate::security::authorization_config::start(
                    &own.security,
                    &opts,
                    &app.api.metrics.authz,
                    signals.watches(),
                    crate::security::authorization_config::connect_with(app.egress.clone()),
                )
                .map_err(|e| anyhow::anyhow!("--authorization-config: {e}"))?,
            );
            bootstrap::start(&app, &own.registry);
            csr::start(&app, &own.registry, &own.security, &pki);
            (app, tasks)
        }
        Source::Upstream(upstreams) => proxy::state(&opts, upstreams, parts, &signals)?,
    };
    tasks.push(tokio::spawn(accept_loop(
        listener,
        Some(tls),
        app.clone(),
        signals.accept_loop(),
    )));
    let mut insecure_addr = None;
    if opts.insecure_port != 0 {
        let l = conn_limits::listen(SocketAddr::from(([127, 0, 0, 1], opts.insecure_port)))?;
        insecure_addr = Some(l.local_addr()?);
        tasks.push(tokio::spawn(accept_loop(
            l,
            None,
            app.clone(),
            signals.accept_loop(),
        )));
    }
    match &app.mode {
        Mode::Upstream(proxy) => {
            tracing::info!(%addr, upstream = %proxy.upstream.url(), "serving as a proxy")
        }
        Mode::Store(_) => tracing::info!(
            %addr,
            ?insecure_addr,
            kubeconfig = %admin_kubeconfig.display(),
            "serving"
        ),
    }
    Ok(ServerHandle {
        addr,
        insecure_addr,
        app,
        admin_kubeconfig,
        pki,
        signals,
        tasks,
    })
}

/// Creates or loads the PKI of the data directory (the admin kubeconfig names the server at
/// `addr`, 127.0.0.1 when it listens on every address), and the TLS acceptor it serves with.
async fn prepare_pki(
    opts: &Options,
    addr: SocketAddr,
    kubeconfig: &std::path::Path,
) -> anyhow::Result<(Arc<pki::Pki>, Tls)> {
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
    let pki_opts = PkiOptions {
        tls_sans: opts.tls_sans.clone(),
        admin_kubeconfig_path: kubeconfig.to_path_buf(),
        server_url: format!("https://{host}:{}", addr.port()),
        cluster_signing: pki::SigningFiles::from_options(opts).map_err(anyhow::Error::msg)?,
    };
    let cert_dir = opts.cert_dir();
    let pki = tokio::task::spawn_blocking(move || pki::ensure_pki(&cert_dir, &pki_opts))
        .await?
        .context("preparing certificates")?;
    let (config, client_certs) = pki
        .server_config()
        .context("building the TLS configuration")?;
    let tls = Tls {
        acceptor: TlsAcceptor::from(config),
        client_certs,
    };
    Ok((Arc::new(pki), tls))
}

/// Loads `--authentication-config` (a bad file stops the start with all its errors) and
/// re-reads it when it changes.
fn start_authentication_config(
    own: &Arc<Standalone>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Option<JoinHandle<()>>> {
    let Some(path) = own.api.opts.authentication_config.clone() else {
        return Ok(None);
    };
    let load = |own: &Standalone, bytes: &[u8]| {
        let ctx = crate::security::jwt::LoadContext {
            service_account_issuers: std::slice::from_ref(&own.api.opts.service_account_issuer),
            anonymous_flag_set: own.api.opts.anonymous_auth.is_some(),
        };
        crate::security::jwt::Authentication::load(bytes, &ctx, &own.security.jwt)
    };
    let bytes = crate::base::reload::read_file(&path)
        .map_err(|e| anyhow::anyhow!("--authentication-config: {e}"))?;
    let loaded = load(own, &bytes)
        .map_err(|e| anyhow::anyhow!("--authentication-config {}: {e}", path.display()))?;
    own.security.set_authentication(loaded);
    let weak = Arc::downgrade(own);
    Ok(Some(crate::base::reload::spawn(
        "authentication",
        path,
        own.api.opts.config_reload_interval,
        own.security.authentication_reloads.clone(),
        stop,
        move |bytes| {
            let own = weak.upgrade().ok_or("the server is gone")?;
            let loaded = load(&own, bytes).map_err(|e| e.to_string())?;
            own.security.set_authentication(loaded);
            Ok(())
        },
    )))
}
