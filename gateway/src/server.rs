//! Listeners, TLS, HTTP/1.1 and HTTP/2 connections, the request entry point, and graceful
//! shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use svc_core::ApiError;
use svc_storage::Store;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::app::App;
use crate::auth::{self, Attributes, ConnIdentity, ResourceAttributes};
use crate::config::Options;
use crate::features::Feature;
use crate::pki::{self, PkiOptions};
use crate::query::Query;
use crate::respond::{self, Body};
use crate::router::{self, Route};
use crate::{bootstrap, discovery, health, metrics, openapi, rest};

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
        tracing::info!("shutdown complete");
    }
}

/// Opens the store (embedded, or etcd with `--storage-backend=etcd`), creates or loads the
/// PKI, binds the listeners and starts serving.
pub async fn start(opts: Options) -> anyhow::Result<ServerHandle> {
    if opts.storage_backend == crate::config::StorageBackend::Etcd {
        // Connections are lazy: an unreachable etcd shows in /readyz and 503s, not here.
        let store = svc_storage::etcd::EtcdStore::connect(opts.etcd_config())
            .await
            .with_context(|| format!("connecting to etcd at {:?}", opts.etcd_servers))?;
        return start_with_store(opts, store).await;
    }
    let store_dir = opts.store_dir();
    std::fs::create_dir_all(&store_dir)
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
    };
    let cert_dir = opts.cert_dir();
    let pki = tokio::task::spawn_blocking(move || pki::ensure_pki(&cert_dir, &pki_opts))
        .await?
        .context("preparing certificates")?;
    let tls = TlsAcceptor::from(
        pki.server_config()
            .context("building the TLS configuration")?,
    );

    let (stop_watches_tx, stop_watches_rx) = watch::channel(false);
    let (stop_accepting_tx, stop_accepting_rx) = watch::channel(false);
    let app = Arc::new(App::new(opts.clone(), store, stop_watches_rx));

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
    bootstrap::start(&app);
    tracing::info!(%addr, ?insecure_addr, kubeconfig = %kubeconfig.display(), "serving");
    Ok(ServerHandle {
        addr,
        insecure_addr,
        app,
        admin_kubeconfig: kubeconfig,
        pki: Arc::new(pki),
        stop_accepting: stop_accepting_tx,
        stop_watches: stop_watches_tx,
        tasks,
    })
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
                    });
                    serve_conn(builder, watcher, TokioIo::new(stream), app, ident).await;
                }
                None => {
                    let ident = Arc::new(ConnIdentity {
                        cert_user: None,
                        insecure: true,
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
        async move { Ok::<_, std::convert::Infallible>(handle(app, ident, req).await) }
    });
    let conn = builder.serve_connection(io, svc);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// The Kubernetes verb of a request.
fn verb_of(method: &Method, route: &Route, watch: bool) -> &'static str {
    match (method, route) {
        (&Method::GET | &Method::HEAD, Route::Resource(r)) => {
            if watch {
                "watch"
            } else if r.name.is_some() {
                "get"
            } else {
                "list"
            }
        }
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, Route::Resource(r)) if r.name.is_none() => "deletecollection",
        (&Method::DELETE, _) => "delete",
        _ => "get",
    }
}

/// Every request enters here: route, authenticate, authorize, dispatch, account.
pub async fn handle(
    app: Arc<App>,
    ident: Arc<ConnIdentity>,
    req: Request<Incoming>,
) -> Response<Body> {
    let start = Instant::now();
    let path = req.uri().path().to_string();
    let query = Query::parse(req.uri().query());
    let route = router::route(&path);
    let gzip_header = req.headers().get(http::header::ACCEPT_ENCODING).cloned();
    let watch = query.bool("watch").unwrap_or(false);
    let verb = verb_of(req.method(), &route, watch);
    let info = metrics::RequestInfo::new(req.method(), &route, &query, req.headers(), watch);
    let inflight = app.metrics.start(&info);

    let resp = match authenticate_and_authorize(&app, &ident, &req, &route, verb, &path) {
        Err(e) => respond::error(&e),
        Ok(user) => {
            if verb == "watch" {
                dispatch(&app, req, route, query, user).await
            } else {
                match tokio::time::timeout(
                    app.opts.request_timeout,
                    dispatch(&app, req, route, query, user),
                )
                .await
                {
                    Ok(r) => r,
                    Err(_) => respond::error(&ApiError::Timeout {
                        message: "request did not complete within the allowed duration".into(),
                        retry_after_seconds: None,
                    }),
                }
            }
        }
    };
    let resp = if (verb == "get" || verb == "list")
        && accepts_gzip(&gzip_header)
        && app
            .opts
            .feature_gates
            .enabled(Feature::APIResponseCompression)
    {
        gzip(resp, app.opts.response_compression_min_bytes).await
    } else {
        resp
    };
    let code = resp.status().as_u16();
    drop(inflight);
    app.metrics.observe(&info, code, start.elapsed());
    tracing::debug!(verb, %path, code, elapsed_ms = start.elapsed().as_secs_f64() * 1e3, "request");
    resp
}

fn authenticate_and_authorize(
    app: &App,
    ident: &ConnIdentity,
    req: &Request<Incoming>,
    route: &Route,
    verb: &str,
    path: &str,
) -> Result<pki::UserInfo, ApiError> {
    let user = auth::authenticate(ident, req.headers(), app.opts.anonymous_auth)?;
    let resource = match route {
        Route::Resource(r) => Some(ResourceAttributes {
            group: r.info.group,
            resource: r.info.plural,
            subresource: r.subresource.as_deref(),
            namespace: &r.namespace,
            name: r.name.as_deref(),
        }),
        _ => None,
    };
    auth::authorize(
        &user,
        &Attributes {
            verb,
            resource,
            path,
        },
    )?;
    Ok(user)
}

async fn dispatch(
    app: &Arc<App>,
    req: Request<Incoming>,
    route: Route,
    query: Query,
    user: pki::UserInfo,
) -> Response<Body> {
    let is_get = req.method() == Method::GET || req.method() == Method::HEAD;
    match route {
        Route::Resource(r) => {
            let (parts, body) = req.into_parts();
            let body = if matches!(
                parts.method,
                Method::POST | Method::PUT | Method::PATCH | Method::DELETE
            ) {
                match read_body(body, app.opts.max_request_body_bytes).await {
                    Ok(b) => b,
                    Err(e) => return respond::error(&e),
                }
            } else {
                Bytes::new()
            };
            rest::serve(
                app,
                rest::Call {
                    parts,
                    body,
                    route: r,
                    query,
                    user,
                    format: crate::negotiate::Format::Json,
                },
            )
            .await
        }
        _ if !is_get => respond::error(&ApiError::MethodNotAllowed(format!(
            "the server does not allow this method on the requested resource: {}",
            req.method()
        ))),
        Route::Health { endpoint, check } => {
            health::serve(app, endpoint, check.as_deref(), &query).await
        }
        Route::Metrics => {
            respond::bytes_response(StatusCode::OK, metrics::CONTENT_TYPE, app.metrics.encode())
        }
        Route::NotFound => respond::error(&ApiError::PathNotFound(req.uri().path().to_string())),
        Route::OpenApiV3Index => openapi::serve_index(),
        Route::OpenApiV3 { group, version } => openapi::serve_group_version(&group, &version),
        other => discovery::serve(&other, query.pretty()),
    }
}

fn accepts_gzip(header: &Option<http::HeaderValue>) -> bool {
    let Some(v) = header.as_ref().and_then(|h| h.to_str().ok()) else {
        return false;
    };
    v.split(',').any(|part| {
        let mut it = part.split(';').map(str::trim);
        let coding = it.next().unwrap_or_default();
        let refused = it.any(|p| p.replace(' ', "") == "q=0" || p.replace(' ', "") == "q=0.0");
        (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
    })
}

/// Compresses a complete response body with gzip (level 1: fastest, most of the gain on
/// JSON). Streams (watches) are left alone, and so are bodies under `min_bytes`
/// (`--response-compression-min-bytes`; 0, the default, compresses every body as the spec
/// says).
async fn gzip(resp: Response<Body>, min_bytes: usize) -> Response<Body> {
    use hyper::body::Body as _;
    if resp.headers().contains_key(http::header::CONTENT_ENCODING) {
        return resp;
    }
    let Some(len) = resp.body().size_hint().exact() else {
        return resp;
    };
    if len < min_bytes as u64 {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(collected) = body.collect().await else {
        return respond::error(&ApiError::internal("reading a response body to compress"));
    };
    let plain = collected.to_bytes();
    let compress = move || {
        use std::io::Write as _;
        let mut enc = flate2::write::GzEncoder::new(
            Vec::with_capacity(plain.len() / 4),
            flate2::Compression::fast(),
        );
        enc.write_all(&plain).and_then(|()| enc.finish())
    };
    // Large bodies are compressed off the async threads.
    let out = if len > 1 << 20 {
        tokio::task::spawn_blocking(compress)
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    } else {
        compress()
    };
    match out {
        Ok(gz) => {
            parts.headers.insert(
                http::header::CONTENT_ENCODING,
                http::HeaderValue::from_static("gzip"),
            );
            parts.headers.remove(http::header::CONTENT_LENGTH);
            parts.headers.append(
                http::header::VARY,
                http::HeaderValue::from_static("Accept-Encoding"),
            );
            Response::from_parts(parts, respond::full(gz))
        }
        Err(e) => respond::error(&ApiError::internal(format!(
            "compressing the response: {e}"
        ))),
    }
}

/// How much of an oversized body is read and discarded before the 413 goes out, so a client
/// still writing it can read the answer instead of seeing a reset (Go's server does the same).
const OVERSIZE_DISCARD: usize = 256 * 1024;
const OVERSIZE_DISCARD_TIME: Duration = Duration::from_secs(1);

/// Reads a request body, refusing more than `max` bytes with 413 without buffering them.
async fn read_body(mut body: Incoming, max: usize) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::RequestEntityTooLarge(format!(
            "the request body exceeds the limit of {max} bytes"
        ))
    };
    let declared = hyper::body::Body::size_hint(&body).lower();
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    let discard_until = tokio::time::Instant::now() + OVERSIZE_DISCARD_TIME;
    loop {
        let oversize = seen > max || declared > max as u64;
        if oversize
            && (seen > max + OVERSIZE_DISCARD || tokio::time::Instant::now() > discard_until)
        {
            return Err(too_large());
        }
        let next = if oversize {
            match tokio::time::timeout_at(discard_until, body.frame()).await {
                Ok(f) => f,
                Err(_) => return Err(too_large()),
            }
        } else {
            body.frame().await
        };
        match next {
            None if oversize => return Err(too_large()),
            None => return Ok(buf.freeze()),
            Some(Err(e)) if oversize => {
                tracing::debug!(error = %e, "oversized body ended early");
                return Err(too_large());
            }
            Some(Err(e)) => {
                return Err(ApiError::bad_request(format!(
                    "reading the request body: {e}"
                )));
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    seen += data.len();
                    if seen <= max && declared <= max as u64 {
                        buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}
