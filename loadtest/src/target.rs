//! Targets and connections: a Kubernetes-compatible server (plain HTTP or TLS from a
//! kubeconfig, HTTP/1.1 or h2), etcd's JSON gateway, and the loopback-only guard. A
//! kubeconfig user with `exec` gets its credential from the plugin (`exec.rs`): a token every
//! request carries, or a client certificate new connections present; a 401 refreshes it once
//! and retries the request once.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;

use crate::exec;

/// An HTTP endpoint: where to connect and how (TLS or not).
#[derive(Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// The URL as given, for reports.
    pub url: String,
    /// TLS configurations for HTTP/1.1 and h2 (ALPN differs), and the name to verify.
    pub tls: Option<Tls>,
    /// A bearer token every request carries (a kubeconfig user's `token`).
    pub bearer: Option<Arc<str>>,
    /// An exec credential plugin (a kubeconfig user's `exec`), shared by every connection.
    pub exec: Option<Arc<exec::Source>>,
}

#[derive(Clone)]
pub struct Tls {
    pub h1: Arc<rustls::ClientConfig>,
    pub h2: Arc<rustls::ClientConfig>,
    pub name: ServerName<'static>,
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// One client connection, HTTP/1.1 or h2, with the bearer token its requests carry (a
/// kubeconfig user with `token`) or the exec plugin its credentials come from.
pub struct Conn {
    sender: Sender,
    bearer: Option<Arc<str>>,
    exec: Option<ExecConn>,
}

/// What a connection needs to follow an exec credential: the endpoint (to reconnect with a
/// new client certificate) and the credential generation its TLS session presented.
#[derive(Clone)]
struct ExecConn {
    ep: Endpoint,
    h2: bool,
    tls_generation: u64,
}

impl Conn {
    /// Another handle on an h2 connection (streams share it); HTTP/1.1 cannot be shared.
    pub fn share(&self) -> Option<Conn> {
        match &self.sender {
            Sender::H1(_) => None,
            Sender::H2(s) => Some(Conn {
                sender: Sender::H2(s.clone()),
                bearer: self.bearer.clone(),
                exec: self.exec.clone(),
            }),
        }
    }

    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>> {
        let Some(x) = self
            .exec
            .clone()
            .filter(|_| !req.headers().contains_key(http::header::AUTHORIZATION))
        else {
            let bearer = self.bearer.clone();
            return self.send_as(req, bearer.as_deref()).await;
        };
        let Some(source) = x.ep.exec.as_ref() else {
            return self.send_as(req, None).await;
        };
        let cred = source.get().await?;
        let again = copy_request(&req);
        let resp = self.send_as(req, cred.token.as_deref()).await?;
        if resp.status() != StatusCode::UNAUTHORIZED {
            return Ok(resp);
        }
        // Refused: the plugin runs again (once for all connections refused the same
        // credential) and the request is retried once.
        let _ = resp.into_body().collect().await;
        source.invalidate(cred.generation);
        let cred = source.get().await?;
        if cred.tls.is_some() && cred.generation != x.tls_generation {
            let tls = cred.tls.clone();
            self.sender = x.ep.open(tls.as_ref(), x.h2).await?;
            if let Some(e) = &mut self.exec {
                e.tls_generation = cred.generation;
            }
        }
        self.send_as(again, cred.token.as_deref()).await
    }

    async fn send_as(
        &mut self,
        mut req: Request<Full<Bytes>>,
        token: Option<&str>,
    ) -> Result<Response<Incoming>> {
        if let Some(token) = token
            && !req.headers().contains_key(http::header::AUTHORIZATION)
        {
            let mut v = http::HeaderValue::from_str(&format!("Bearer {token}"))?;
            v.set_sensitive(true);
            req.headers_mut().insert(http::header::AUTHORIZATION, v);
        }
        Ok(match &mut self.sender {
            Sender::H1(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
        })
    }

    /// Sends a request and reads the whole body.
    pub async fn call(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: &str,
    ) -> Result<(StatusCode, Bytes)> {
        let resp = self.send(request(method, path, body, content_type)).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// A copy of a request to send again (extensions are not kept; requests here have none).
fn copy_request(req: &Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let mut r = Request::new(req.body().clone());
    *r.method_mut() = req.method().clone();
    *r.uri_mut() = req.uri().clone();
    *r.version_mut() = req.version();
    *r.headers_mut() = req.headers().clone();
    r
}

pub fn request(
    method: Method,
    path: &str,
    body: Bytes,
    content_type: &str,
) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    if !body.is_empty() {
        b = b.header("content-type", content_type);
    }
    // Only a malformed path can fail here; callers build paths from validated parts.
    b.body(Full::new(body))
        .unwrap_or_else(|_| Request::new(Full::new(Bytes::new())))
}

impl Endpoint {
    /// Parses `http://host:port` (or https with TLS set later) and applies the loopback rule.
    pub async fn from_url(url: &str, allow_remote: bool) -> Result<Self> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| anyhow!("{url}: expected http://HOST:PORT"))?;
        let hostport = rest.split('/').next().unwrap_or_default();
        let default_port = if scheme == "https" { 443 } else { 80 };
        let (host, port) = split_host_port(hostport, default_port)?;
        let addr = resolve(&host, port, allow_remote).await?;
        Ok(Endpoint {
            addr,
            url: url.to_string(),
            tls: None,
            bearer: None,
            exec: None,
        })
    }

    pub async fn connect(&self, h2: bool) -> Result<Conn> {
        let Some(source) = &self.exec else {
            return Ok(Conn {
                sender: self.open(self.tls.as_ref(), h2).await?,
                bearer: self.bearer.clone(),
                exec: None,
            });
        };
        let cred = source.get().await?;
        let tls = cred.tls.clone().or_else(|| self.tls.clone());
        Ok(Conn {
            sender: self.open(tls.as_ref(), h2).await?,
            bearer: None,
            exec: Some(ExecConn {
                ep: self.clone(),
                h2,
                tls_generation: cred.generation,
            }),
        })
    }

    /// Opens a connection with `tls` (the endpoint's, or one with an exec client certificate).
    async fn open(&self, tls: Option<&Tls>, h2: bool) -> Result<Sender> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("connecting to {}", self.addr))?;
        // Many small writes per request: Nagle would add 40 ms to each.
        tcp.set_nodelay(true)?;
        match tls {
            None => handshake(TokioIo::new(tcp), h2).await,
            Some(t) => {
                let cfg = if h2 { t.h2.clone() } else { t.h1.clone() };
                let tls = tokio_rustls::TlsConnector::from(cfg)
                    .connect(t.name.clone(), tcp)
                    .await?;
                handshake(TokioIo::new(tls), h2).await
            }
        }
    }
}

/// The most an HTTP/1.1 connection's read buffer grows to. hyper's own bound (about 400 KiB)
/// is reached by every watch connection whose reader falls behind: at 10,000 watchers that
/// was 3.4 GB of fresh pages (100,000 page faults a second) in the load generator's first
/// heavy run, which set its reader further behind, until the sockets' receive queues passed
/// the kernel's TCP memory pressure level and it dropped segments (`kernel_tcp` in a run's
/// report). Go's client, as client-go uses it, reads a connection through 4 KiB.
const H1_READ_BUFFER_MAX: usize = 64 << 10;

async fn handshake<T>(io: TokioIo<T>, h2: bool) -> Result<Sender>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if h2 {
        let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            // Larger windows: a watch stream is a long one-way flow.
            .initial_stream_window_size(1 << 20)
            .initial_connection_window_size(16 << 20)
            .handshake(io)
            .await?;
        tokio::spawn(conn);
        Ok(Sender::H2(send))
    } else {
        let (send, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(H1_READ_BUFFER_MAX)
            .handshake(io)
            .await?;
        tokio::spawn(conn);
        Ok(Sender::H1(send))
    }
}

fn split_host_port(hostport: &str, default_port: u16) -> Result<(String, u16)> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (h, p) = rest
            .split_once(']')
            .ok_or_else(|| anyhow!("bad address {hostport}"))?;
        let port = match p.strip_prefix(':') {
            Some(p) => p.parse()?,
            None => default_port,
        };
        return Ok((h.to_string(), port));
    }
    match hostport.rsplit_once(':') {
        Some((h, p)) => Ok((h.to_string(), p.parse().context("port")?)),
        None => Ok((hostport.to_string(), default_port)),
    }
}

/// Resolves a host; refuses anything but loopback unless `--allow-remote` was given, so a
/// load run can never send traffic somewhere by accident.
pub async fn resolve(host: &str, port: u16, allow_remote: bool) -> Result<SocketAddr> {
    let ip: Option<IpAddr> = if host == "localhost" {
        Some(IpAddr::from([127, 0, 0, 1]))
    } else {
        host.parse().ok()
    };
    let addr = match ip {
        Some(ip) => SocketAddr::new(ip, port),
        None => {
            if !allow_remote {
                bail!("{host}: only loopback addresses are allowed (pass --allow-remote)");
            }
            tokio::net::lookup_host((host, port))
                .await?
                .next()
                .ok_or_else(|| anyhow!("{host}: no address"))?
        }
    };
    if !addr.ip().is_loopback() && !allow_remote {
        bail!("{addr}: not a loopback address; pass --allow-remote to load a remote server");
    }
    Ok(addr)
}

/// Reads a kubeconfig (current context) into an endpoint: TLS with the cluster's CA, and the
/// user's client certificate, bearer `token` or `exec` plugin (run once here, so that a
/// broken plugin fails the run before it starts).
pub async fn from_kubeconfig(path: &Path, allow_remote: bool) -> Result<Endpoint> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let kc: Value = serde_saphyr::from_str(&text).context("parsing kubeconfig")?;
    let current = kc["current-context"].as_str().unwrap_or_default();
    let named = |list: &str, name: &str| -> Option<Value> {
        let items = kc[list].as_array()?;
        items
            .iter()
            .find(|c| name.is_empty() || c["name"].as_str() == Some(name))
            .cloned()
    };
    let ctx = named("contexts", current).ok_or_else(|| anyhow!("no context {current}"))?;
    let cluster_name = ctx["context"]["cluster"].as_str().unwrap_or_default();
    let user_name = ctx["context"]["user"].as_str().unwrap_or_default();
    let cluster = named("clusters", cluster_name).ok_or_else(|| anyhow!("no cluster"))?;
    let user = named("users", user_name).ok_or_else(|| anyhow!("no user"))?;
    let server = cluster["cluster"]["server"]
        .as_str()
        .ok_or_else(|| anyhow!("cluster has no server"))?;
    let mut ep = Endpoint::from_url(server, allow_remote).await?;
    let u = &user["user"];
    let exec_cfg = match &u["exec"] {
        Value::Null => None,
        e => Some(exec::ExecConfig::from_kubeconfig(
            e,
            &cluster,
            path.parent(),
        )?),
    };
    if !server.starts_with("https://") {
        if let Some(cfg) = exec_cfg {
            let source = exec::Source::new(
                cfg,
                Box::new(|_, _| bail!("a client certificate needs an https:// server")),
            );
            source.get().await?;
            ep.exec = Some(Arc::new(source));
        }
        return Ok(ep);
    }
    let b64 = |v: &Value| -> Result<Vec<u8>> {
        let s = v.as_str().ok_or_else(|| anyhow!("missing base64 data"))?;
        Ok(base64::engine::general_purpose::STANDARD.decode(s.trim())?)
    };
    let ca = b64(&cluster["cluster"]["certificate-authority-data"])?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca) {
        roots.add(c?)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots);
    let cfg = if u["client-certificate-data"].is_string() {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(&b64(&u["client-certificate-data"])?)
                .collect::<std::result::Result<_, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(&b64(&u["client-key-data"])?)?;
        builder.clone().with_client_auth_cert(certs, key)?
    } else {
        builder.clone().with_no_client_auth()
    };
    ep.bearer = u["token"].as_str().map(Arc::from);
    let host = server
        .trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap_or_default();
    let (host, _) = split_host_port(host, 443)?;
    let name = ServerName::try_from(host)?;
    ep.tls = Some(tls_pair(cfg, name.clone()));
    if let Some(xc) = exec_cfg {
        let make_tls: exec::MakeTls = Box::new(move |certs, key| {
            let cfg = builder.clone().with_client_auth_cert(certs, key)?;
            Ok(tls_pair(cfg, name.clone()))
        });
        let source = exec::Source::new(xc, make_tls);
        source.get().await?;
        ep.exec = Some(Arc::new(source));
    }
    Ok(ep)
}

/// The HTTP/1.1 and h2 configurations (ALPN differs) of one client configuration.
fn tls_pair(mut cfg: rustls::ClientConfig, name: ServerName<'static>) -> Tls {
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let h1 = Arc::new(cfg.clone());
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Tls {
        h1,
        h2: Arc::new(cfg),
        name,
    }
}
