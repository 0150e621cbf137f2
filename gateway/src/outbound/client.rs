//! `WebhookClient`: the gateway's outbound HTTPS client for webhooks (authorization,
//! admission, audit). Built from a kubeconfig-format file (`svcConfigFile`: the current
//! context's cluster and user) or from a URL and CA bundle (an admission webhook's
//! `clientConfig`); dials through the `controlplane` egress selection; speaks HTTP/1.1 or h2
//! (ALPN) over rustls with pooled connections; authenticates with a client certificate, a
//! bearer token (inline or a file re-read every minute), basic auth, or an exec credential
//! plugin (`client/exec.rs`: re-run once on a 401, and the request retried once).
//!
//! Bounded: every call has a timeout; a response body over [`MAX_RESPONSE_BODY`] is an error.
//! The exception is [`WebhookClient::request`], the proxy's pass-through (`upstream.rs`):
//! its body streams both ways and its caller bounds it.
//! TLS roots: the CA given, else the system's (see the `rustls-native-certs` note in
//! gateway/Cargo.toml).

pub mod exec;

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use svc_config::egress::Selection;
use svc_config::kubeconfig::{self, AuthInfo, Cluster, Config};
use tokio_rustls::TlsConnector;

use crate::outbound::egress::{self, Dialer, Egress, Stream};

/// Largest response body read from a webhook.
pub const MAX_RESPONSE_BODY: usize = 3 << 20;
/// A token file is read again when its content is older than this (client-go's period).
const TOKEN_FILE_REFRESH: Duration = Duration::from_secs(60);
/// How often an h2 connection with streams open is PINGed.
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a PING may go unanswered before its connection is closed (and its streams end
/// with an error, which the caches' informers resume from).
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// Idle pooled connections are closed after this.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle pooled connections kept per host.
const POOL_MAX_IDLE: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The file or arguments the client is built from are unusable.
    #[error("{0}")]
    Config(String),
    #[error("{url}: {message}")]
    Request { url: String, message: String },
    /// No connection could be made: the request never left.
    #[error("{url}: {message}")]
    Connect { url: String, message: String },
    #[error("{url}: no response within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url}: response body over {MAX_RESPONSE_BODY} bytes")]
    TooLarge { url: String },
    #[error("{0}")]
    Exec(String),
}

/// A webhook's answer.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: http::StatusCode,
    pub body: Bytes,
}

/// What a request body may fail with: the caller's connection, for a streamed one.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of an outbound request: a buffer (webhooks) or a stream passed on as it arrives
/// (the proxy's pass-through, `upstream.rs`).
pub type RequestBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

type Pool = hyper_util::client::legacy::Client<Connector, RequestBody>;

/// A client of one webhook URL. Cheap to clone; clones share connections and credentials.
#[derive(Clone)]
pub struct WebhookClient(Arc<Inner>);

impl std::fmt::Debug for WebhookClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookClient")
            .field("url", &self.0.url.to_string())
            .finish()
    }
}

struct Inner {
    url: http::Uri,
    /// The pool without an exec client certificate.
    pool: Pool,
    /// Connections offering HTTP/1.1 alone, for upgrades (exec, attach, port-forward): an
    /// upgrade has no h2 form the upstream would take. None for webhooks.
    upgrade_pool: Option<Pool>,
    /// Connections without the file's client certificate, both kinds, for requests that
    /// carry someone else's credential ([`WebhookClient::request_with`]). None for webhooks.
    plain_pools: Option<(Pool, Pool)>,
    auth: Auth,
}

enum Auth {
    None,
    Bearer(Arc<str>),
    Basic(Arc<str>),
    TokenFile {
        path: PathBuf,
        cached: parking_lot::Mutex<Option<(Instant, Arc<str>)>>,
    },
    Exec(exec::Source),
}

/// What the TLS side of a connection needs, before any client certificate.
#[derive(Clone)]
struct TlsBase {
    roots: Option<rustls::RootCertStore>,
    server_name: ServerName<'static>,
}

impl WebhookClient {
    /// The current context of a kubeconfig-format file: its cluster's server (path
    /// included), CA, `tls-server-name` and `insecure-skip-tls-verify`; its user's client
    /// certificate, token, `tokenFile`, basic auth or exec plugin. Relative file paths are
    /// taken relative to the file's folder, as client-go does.
    pub fn from_kubeconfig_file(path: &Path, egress: &Egress) -> Result<Self, ClientError> {
        let shown = path.display();
        let bytes = std::fs::read(path)
            .map_err(|e| ClientError::Config(format!("reading {shown}: {e}")))?;
        let cfg: Config = svc_config::load(&bytes).map_err(|mut e| {
            e.subject = shown.to_string();
            ClientError::Config(e.to_string())
        })?;
        let resolved = cfg
            .resolve(None)
            .map_err(|e| ClientError::Config(format!("{shown}: {e}")))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::from_parts(
            resolved.cluster,
            resolved.user,
            dir,
            egress.dialer(Selection::ControlPlane),
        )
        .map_err(|e| ClientError::Config(format!("{shown}: {e}")))
    }

    /// A webhook given by URL and optional PEM CA bundle (an admission webhook's
    /// `clientConfig`), without client credentials.
    pub fn from_url(
        url: &str,
        ca_bundle: Option<&[u8]>,
        egress: &Egress,
    ) -> Result<Self, ClientError> {
        let (uri, base) = server(url, "", |roots| match ca_bundle {
            Some(pem) if !pem.is_empty() => {
                *roots = Some(egress::roots_from_pem(pem).map_err(|e| format!("caBundle: {e}"))?);
                Ok(())
            }
            _ => Ok(()),
        })
        .map_err(ClientError::Config)?;
        let pool = pool(
            &uri,
            &base,
            None,
            egress.dialer(Selection::ControlPlane),
            false,
        )
        .map_err(ClientError::Config)?;
        Ok(WebhookClient(Arc::new(Inner {
            url: uri,
            pool,
            upgrade_pool: None,
            plain_pools: None,
            auth: Auth::None,
        })))
    }

    fn from_parts(
        cluster: &Cluster,
        user: Option<&AuthInfo>,
        dir: &Path,
        dialer: Dialer,
    ) -> Result<Self, String> {
        if !cluster.proxy_url.is_empty() {
            return Err(
                "cluster proxy-url is not supported: route webhooks through a tunnel server with \
                 --egress-selector-config-file"
                    .to_string(),
            );
        }
        let (uri, base) = server(&cluster.server, &cluster.tls_server_name, |roots| {
            if cluster.insecure_skip_tls_verify {
                return Ok(());
            }
            let pem = if !cluster.certificate_authority_data.is_empty() {
                kubeconfig::decode_data(&cluster.certificate_authority_data)
            } else if !cluster.certificate_authority.is_empty() {
                read(dir, &cluster.certificate_authority, "certificate-authority")?
            } else {
                *roots = Some(egress::system_roots()?);
                return Ok(());
            };
            *roots = Some(
                egress::roots_from_pem(&pem).map_err(|e| format!("certificate-authority: {e}"))?,
            );
            Ok(())
        })?;
        let default = AuthInfo::default();
        let user = user.unwrap_or(&default);
        if user.auth_provider.is_some() {
            return Err("user auth-provider is not supported; use exec".to_string());
        }
        if !user.impersonate.is_empty() || !user.impersonate_groups.is_empty() {
            return Err("user impersonation (as, as-groups) is not supported".to_string());
        }
        let cert_pem = if !user.client_certificate_data.is_empty() {
            Some(kubeconfig::decode_data(&user.client_certificate_data))
        } else if !user.client_certificate.is_empty() {
            Some(read(dir, &user.client_certificate, "client-certificate")?)
        } else {
            None
        };
        let identity = match cert_pem {
            None => None,
            Some(cert) => {
                let key = if !user.client_key_data.is_empty() {
                    kubeconfig::decode_data(&user.client_key_data)
                } else {
                    read(dir, &user.client_key, "client-key")?
                };
                Some(identity(&cert, &key)?)
            }
        };
        let upgrade_identity = identity
            .as_ref()
            .map(|(certs, key)| (certs.clone(), key.clone_key()));
        let upgrade_pool = pool(&uri, &base, upgrade_identity, dialer.clone(), true)?;
        let plain_pools = (
            pool(&uri, &base, None, dialer.clone(), false)?,
            pool(&uri, &base, None, dialer.clone(), true)?,
        );
        let base_pool = pool(&uri, &base, identity, dialer.clone(), false)?;
        let auth = if let Some(e) = &user.exec {
            if e.interactive_mode == "Always" {
                return Err(
                    "user exec interactiveMode Always: the server has no terminal for the plugin"
                        .to_string(),
                );
            }
            let cfg = exec::ExecConfig::new(e, cluster, dir);
            let (uri2, base2, dialer2) = (uri.clone(), base.clone(), dialer.clone());
            Auth::Exec(exec::Source::new(
                cfg,
                Box::new(move |certs, key| {
                    pool(&uri2, &base2, Some((certs, key)), dialer2.clone(), false)
                }),
            ))
        } else if !user.token.is_empty() {
            Auth::Bearer(Arc::from(format!("Bearer {}", user.token)))
        } else if !user.token_file.is_empty() {
            Auth::TokenFile {
                path: resolve(dir, &user.token_file),
                cached: parking_lot::Mutex::new(None),
            }
        } else if !user.username.is_empty() || !user.password.is_empty() {
            use base64::Engine as _;
            let pair = format!("{}:{}", user.username, user.password);
            Auth::Basic(Arc::from(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )))
        } else {
            Auth::None
        };
        Ok(WebhookClient(Arc::new(Inner {
            url: uri,
            pool: base_pool,
            upgrade_pool: Some(upgrade_pool),
            plain_pools: Some(plain_pools),
            auth,
        })))
    }

    /// The URL every call is sent to.
    pub fn url(&self) -> String {
        self.0.url.to_string()
    }

    /// Sends `request` to the server of the kubeconfig: its scheme and authority, its path as
    /// a prefix of the request's path and query, its credential in `Authorization` (an exec
    /// plugin's credential as it stands; no retry, as a streamed body cannot be sent twice).
    /// The response's body streams; nothing bounds the time here, the caller does.
    pub async fn request(
        &self,
        request: http::Request<RequestBody>,
    ) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
        self.send_on(request, false).await
    }

    /// As [`WebhookClient::request`], on a connection that speaks HTTP/1.1 alone, so that
    /// the server can switch protocols (`Upgrade`: exec, attach, port-forward). An exec
    /// plugin's client certificate is not presented on these connections; its token is.
    pub async fn request_upgrade(
        &self,
        request: http::Request<RequestBody>,
    ) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
        self.send_on(request, true).await
    }

    /// Sends `request` with `authorization` as its credential instead of the file's, on a
    /// connection that presents no client certificate (so the server authenticates the
    /// credential given): proxy mode's caller tokens. `upgrade` as in
    /// [`WebhookClient::request_upgrade`].
    pub async fn request_with(
        &self,
        mut request: http::Request<RequestBody>,
        authorization: http::HeaderValue,
        upgrade: bool,
    ) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
        let inner = &self.0;
        let url = self.url();
        let (plain, plain_h1) = inner.plain_pools.as_ref().ok_or_else(|| {
            ClientError::Config("this client cannot send another credential".into())
        })?;
        let pool = if upgrade { plain_h1 } else { plain };
        let target =
            join_url(&inner.url, request.uri()).map_err(|message| ClientError::Request {
                url: url.clone(),
                message,
            })?;
        *request.uri_mut() = target;
        *request.version_mut() = http::Version::HTTP_11;
        request
            .headers_mut()
            .insert(http::header::AUTHORIZATION, authorization);
        pool.request(request)
            .await
            .map_err(|e| request_failed(url, &e))
    }

    async fn send_on(
        &self,
        mut request: http::Request<RequestBody>,
        upgrade: bool,
    ) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
        let inner = &self.0;
        let url = self.url();
        let fail = |message: String| ClientError::Request {
            url: url.clone(),
            message,
        };
        let (pool, authorization) = match &inner.auth {
            Auth::Exec(source) => {
                let cred = source.get().await?;
                let pool = cred.pool.clone().unwrap_or_else(|| inner.pool.clone());
                let header = cred
                    .token
                    .as_ref()
                    .map(|t| Arc::<str>::from(format!("Bearer {t}")));
                (pool, header)
            }
            Auth::Bearer(h) | Auth::Basic(h) => (inner.pool.clone(), Some(h.clone())),
            Auth::TokenFile { path, cached } => {
                (inner.pool.clone(), Some(token_file(path, cached)?))
            }
            Auth::None => (inner.pool.clone(), None),
        };
        let pool = match (&inner.upgrade_pool, upgrade) {
            (Some(p), true) => p.clone(),
            _ => pool,
        };
        let target = join_url(&inner.url, request.uri()).map_err(fail)?;
        *request.uri_mut() = target;
        // The pool picks the protocol (h2 where ALPN agreed it); an h2 caller's version
        // would be refused on an HTTP/1.1 connection.
        *request.version_mut() = http::Version::HTTP_11;
        if let Some(a) = authorization {
            let value = http::HeaderValue::from_str(&a)
                .map_err(|_| ClientError::Config("the credential is not a valid header".into()))?;
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, value);
        }
        pool.request(request)
            .await
            .map_err(|e| request_failed(url, &e))
    }

    /// POSTs `body` and reads the answer (at most [`MAX_RESPONSE_BODY`]), all within
    /// `timeout`. With an exec plugin, a 401 runs the plugin again and the call is sent once
    /// more.
    pub async fn post(
        &self,
        body: Bytes,
        content_type: &str,
        timeout: Duration,
    ) -> Result<Response, ClientError> {
        let url = self.url();
        match tokio::time::timeout(timeout, self.post_unbounded(body, content_type)).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout { url, timeout }),
        }
    }

    async fn post_unbounded(
        &self,
        body: Bytes,
        content_type: &str,
    ) -> Result<Response, ClientError> {
        let inner = &self.0;
        let Auth::Exec(source) = &inner.auth else {
            let header = match &inner.auth {
                Auth::Bearer(h) | Auth::Basic(h) => Some(h.clone()),
                Auth::TokenFile { path, cached } => Some(token_file(path, cached)?),
                _ => None,
            };
            return self.send(&inner.pool, header, body, content_type).await;
        };
        let mut retried = false;
        loop {
            let cred = source.get().await?;
            let pool = cred.pool.as_ref().unwrap_or(&inner.pool);
            let header = cred
                .token
                .as_ref()
                .map(|t| Arc::from(format!("Bearer {t}")));
            let response = self.send(pool, header, body.clone(), content_type).await?;
            if response.status != http::StatusCode::UNAUTHORIZED || retried {
                return Ok(response);
            }
            source.invalidate(cred.generation);
            retried = true;
        }
    }

    async fn send(
        &self,
        pool: &Pool,
        authorization: Option<Arc<str>>,
        body: Bytes,
        content_type: &str,
    ) -> Result<Response, ClientError> {
        let url = self.url();
        let fail = |message: String| ClientError::Request {
            url: url.clone(),
            message,
        };
        let mut request = http::Request::post(self.0.url.clone())
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::ACCEPT, "application/json, */*");
        if let Some(a) = authorization {
            request = request.header(http::header::AUTHORIZATION, &*a);
        }
        let mut request = request
            .body(buffered(body))
            .map_err(|e| fail(e.to_string()))?;
        crate::observe::trace::inject_current(request.headers_mut());
        let response = pool
            .request(request)
            .await
            .map_err(|e| fail(error_chain(&e)))?;
        read_response(&url, response).await
    }
}

/// A response read whole: at most [`MAX_RESPONSE_BODY`] bytes of body.
pub async fn read_response(
    url: &str,
    response: http::Response<hyper::body::Incoming>,
) -> Result<Response, ClientError> {
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_RESPONSE_BODY)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ClientError::TooLarge {
                    url: url.to_string(),
                }
            } else {
                ClientError::Request {
                    url: url.to_string(),
                    message: e.to_string(),
                }
            }
        })?
        .to_bytes();
    Ok(Response { status, body })
}

/// A buffered request body.
pub fn buffered(body: Bytes) -> RequestBody {
    Full::new(body)
        .map_err(|never: std::convert::Infallible| match never {})
        .boxed_unsync()
}

/// A failed request as a [`ClientError`]: [`ClientError::Connect`] when no connection could
/// be made, so the request never left.
fn request_failed(url: String, e: &hyper_util::client::legacy::Error) -> ClientError {
    let message = error_chain(e);
    if e.is_connect() {
        ClientError::Connect { url, message }
    } else {
        ClientError::Request { url, message }
    }
}

/// An error with its sources, `a: b: c`, as Go prints wrapped errors.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

/// The server URL `base` with `request`'s path and query after its own path
/// (`https://h/prefix` + `/api/v1/pods?watch=1`).
fn join_url(base: &http::Uri, request: &http::Uri) -> Result<http::Uri, String> {
    let prefix = base.path().trim_end_matches('/');
    let tail = request
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(
        format!("{prefix}{tail}")
            .parse()
            .map_err(|e| format!("request path {tail:?}: {e}"))?,
    );
    http::Uri::from_parts(parts).map_err(|e| e.to_string())
}

fn resolve(dir: &Path, p: &str) -> PathBuf {
    let path = Path::new(p);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        dir.join(path)
    }
}

fn read(dir: &Path, p: &str, field: &str) -> Result<Vec<u8>, String> {
    let path = resolve(dir, p);
    std::fs::read(&path).map_err(|e| format!("{field} {}: {e}", path.display()))
}

fn token_file(
    path: &Path,
    cached: &parking_lot::Mutex<Option<(Instant, Arc<str>)>>,
) -> Result<Arc<str>, ClientError> {
    if let Some((at, header)) = &*cached.lock()
        && at.elapsed() < TOKEN_FILE_REFRESH
    {
        return Ok(header.clone());
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| ClientError::Config(format!("reading tokenFile {}: {e}", path.display())))?;
    let header: Arc<str> = Arc::from(format!("Bearer {}", text.trim()));
    *cached.lock() = Some((Instant::now(), header.clone()));
    Ok(header)
}

/// Parses the server URL and fills the roots (`set_roots` leaves them `None` for
/// "verify nothing").
fn server(
    url: &str,
    tls_server_name: &str,
    set_roots: impl FnOnce(&mut Option<rustls::RootCertStore>) -> Result<(), String>,
) -> Result<(http::Uri, TlsBase), String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("server {url:?}: {e}"))?;
    match uri.scheme_str() {
        Some("https") | Some("http") => {}
        _ => {
            return Err(format!(
                "server {url:?}: must be an https:// or http:// URL"
            ));
        }
    }
    let host = uri
        .host()
        .ok_or_else(|| format!("server {url:?} has no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = if tls_server_name.is_empty() {
        host
    } else {
        tls_server_name
    };
    let server_name =
        ServerName::try_from(name.to_string()).map_err(|e| format!("server name {name:?}: {e}"))?;
    let mut roots = None;
    if uri.scheme_str() == Some("https") {
        set_roots(&mut roots)?;
    }
    Ok((uri, TlsBase { roots, server_name }))
}

fn identity(
    cert: &[u8],
    key: &[u8],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let certs = egress::certs_from_pem(cert).map_err(|e| format!("client certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("client key: {e}"))?;
    Ok((certs, key))
}

/// A pool of connections to the server, presenting `identity` if given.
fn pool(
    uri: &http::Uri,
    base: &TlsBase,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    dialer: Dialer,
    http1_only: bool,
) -> Result<Pool, String> {
    let tls = if uri.scheme_str() == Some("https") {
        let builder = rustls::ClientConfig::builder_with_provider(egress::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &base.roots {
            Some(roots) => builder.with_root_certificates(roots.clone()),
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(egress::provider()))),
        };
        let mut config = match identity {
            Some((certs, key)) => builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| format!("client certificate and key: {e}"))?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = if http1_only {
            vec![b"http/1.1".to_vec()]
        } else {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        };
        Some((
            TlsConnector::from(Arc::new(config)),
            base.server_name.clone(),
        ))
    } else {
        None
    };
    let connector = Connector {
        dialer,
        tls: tls.map(Arc::new),
        dials: (!http1_only).then(Arc::default),
    };
    Ok(
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE)
            // A connection that carries only quiet streams (a watch of Events, which
            // kube-apiserver never bookmarks) is known dead by its PINGs, not its silence.
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(H2_PING_INTERVAL)
            .http2_keep_alive_timeout(H2_PING_TIMEOUT)
            // A request given up on (a review past its timeout, a caller gone) is reset, and
            // the server's answer may still be on its way: h2 forgets a reset stream after a
            // second, then resets again on each late frame, and counts those resets over the
            // connection's whole life. At its default limit (1,024, meant to stop a hostile
            // peer) it ends the connection with every stream on it; a busy upstream reaches
            // that within minutes, and each of the proxy's connections to it carries
            // hundreds of requests. The servers dialled here are the operator's own.
            .http2_max_local_error_reset_streams(None)
            .build(connector),
    )
}

/// `insecure-skip-tls-verify: true`: any certificate is accepted, signatures still checked.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Dials through the egress selection, then TLS with ALPN; tells the pool whether h2 was
/// agreed.
#[derive(Clone)]
struct Connector {
    dialer: Dialer,
    tls: Option<Arc<(TlsConnector, ServerName<'static>)>>,
    /// The pool's dials, taken one at a time while its server may speak h2 (None for pools
    /// of HTTP/1.1 alone, which need a connection per request).
    dials: Option<Arc<Dials>>,
}

/// How long a dial that lost its reason to exist (an h2 connection was made while it waited)
/// waits before it fails: its request has taken that connection from the pool by then, and
/// this dial, moved to the background by hyper, ends unseen.
const SHARED_WAIT: Duration = Duration::from_secs(5);

/// The dials of one pool. hyper dials a connection for every request that finds none idle
/// when the protocol is not fixed in advance (ALPN decides it): a burst at a moment with no
/// connection (at the start, or after one ended) would open one TLS connection per request,
/// where one h2 connection carries them all (a proxy's upstream was seen holding 218 such
/// connections it had not yet spoken h2 on, while its reviews timed out). So while the
/// server speaks h2, or is not known yet, one dial goes at a time; a request that waited
/// for the gate while another dial made an h2 connection takes that connection from the
/// pool (hyper hands a new h2 connection to every request waiting for one), and its own dial
/// is not made.
#[derive(Default)]
struct Dials {
    gate: tokio::sync::Mutex<()>,
    /// h2 connections made so far.
    h2_made: AtomicU64,
    /// The last connection negotiated HTTP/1.1: dials go at once, as many as asked.
    http1: AtomicBool,
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = Conn;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Conn>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let dials = this
                .dials
                .as_ref()
                .filter(|d| !d.http1.load(Ordering::Relaxed));
            let _gate = match dials {
                None => None,
                Some(d) => {
                    let made = d.h2_made.load(Ordering::Acquire);
                    let gate = d.gate.lock().await;
                    if d.h2_made.load(Ordering::Acquire) != made {
                        drop(gate);
                        tokio::time::sleep(SHARED_WAIT).await;
                        return Err(io::Error::other(
                            "not dialled: an h2 connection was made meanwhile",
                        ));
                    }
                    Some(gate)
                }
            };
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let https = uri.scheme_str() == Some("https");
            let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
            let stream = this.dialer.dial(&host, port).await?;
            let Some(tls) = &this.tls else {
                // Plain HTTP: HTTP/1.1 (no ALPN to offer h2 by).
                if let Some(d) = &this.dials {
                    d.http1.store(true, Ordering::Relaxed);
                }
                return Ok(Conn {
                    io: TokioIo::new(stream),
                    h2: false,
                });
            };
            let (connector, name) = &**tls;
            let stream = connector.connect(name.clone(), stream).await?;
            let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
            if let Some(d) = &this.dials {
                d.http1.store(!h2, Ordering::Relaxed);
                if h2 {
                    d.h2_made.fetch_add(1, Ordering::Release);
                }
            }
            Ok(Conn {
                io: TokioIo::new(Box::new(stream) as Stream),
                h2,
            })
        })
    }
}

struct Conn {
    io: TokioIo<Stream>,
    h2: bool,
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        let c = Connected::new();
        if self.h2 { c.negotiated_h2() } else { c }
    }
}

impl Read for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
