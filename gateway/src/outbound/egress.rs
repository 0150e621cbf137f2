//! `--egress-selector-config-file`: how the server dials out. Each selection
//! (`controlplane` for webhooks, `etcd` for the store, `cluster`) is either a direct TCP
//! dial or an HTTP CONNECT tunnel through a tunnel server reached over TCP (plain, or TLS
//! with our client certificate) or a Unix socket. A selection the file does not name dials
//! directly, as in Kubernetes; OIDC issuer connections never go through here.
//!
//! Bounded: a dial (connect, TLS, CONNECT exchange) has [`DIAL_TIMEOUT`]; the tunnel server's
//! answer header is at most [`MAX_CONNECT_RESPONSE`] bytes; an answer other than 200 is an
//! error naming the tunnel server and its status line.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::base::flags::Options;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use svc_config::ConfigError;
use svc_config::egress::{EgressSelectorConfiguration, PROTOCOL_HTTP_CONNECT, Selection};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;

/// Bound of one dial, tunnel included.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest accepted answer header from a tunnel server.
pub const MAX_CONNECT_RESPONSE: usize = 16 * 1024;

/// A connected byte stream, whatever carried it.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}
pub type Stream = Box<dyn Io>;

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {source}")]
    Config {
        path: PathBuf,
        #[source]
        source: ConfigError,
    },
    #[error("{path}: {field}: {message}")]
    Tls {
        path: PathBuf,
        field: String,
        message: String,
    },
}

/// The dialer of every selection. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Egress {
    controlplane: Dialer,
    etcd: Dialer,
    cluster: Dialer,
}

impl Default for Egress {
    fn default() -> Self {
        Self::direct()
    }
}

impl Egress {
    /// Every connection dialled directly (no file given).
    pub fn direct() -> Self {
        Egress {
            controlplane: Dialer::direct(),
            etcd: Dialer::direct(),
            cluster: Dialer::direct(),
        }
    }

    /// The dialers of `--egress-selector-config-file` (every connection direct without it).
    pub fn from_options(opts: &Options) -> Result<Self, EgressError> {
        match &opts.egress_selector_config_file {
            Some(path) => Self::from_file(path),
            None => Ok(Self::direct()),
        }
    }

    /// Reads and checks an EgressSelectorConfiguration file, and the TLS files it names.
    pub fn from_file(path: &Path) -> Result<Self, EgressError> {
        let bytes = std::fs::read(path).map_err(|source| EgressError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let cfg: EgressSelectorConfiguration = svc_config::load(&bytes).map_err(|mut source| {
            source.subject = path.display().to_string();
            EgressError::Config {
                path: path.to_path_buf(),
                source,
            }
        })?;
        let unsupported = cfg.unsupported_by_server();
        if !unsupported.is_empty() {
            return Err(EgressError::Config {
                path: path.to_path_buf(),
                source: ConfigError::new(
                    format!(
                        "{} (GRPC tunnels are not implemented; use HTTPConnect or Direct)",
                        path.display()
                    ),
                    unsupported,
                ),
            });
        }
        Self::from_config(&cfg, path)
    }

    /// The dialers of a checked configuration (`file` names it in errors).
    pub fn from_config(
        cfg: &EgressSelectorConfiguration,
        file: &Path,
    ) -> Result<Self, EgressError> {
        let mut egress = Self::direct();
        for (i, selection) in cfg.egress_selections.iter().enumerate() {
            let Some(which) = Selection::from_name(&selection.name) else {
                continue;
            };
            let at = format!("egressSelections[{i}].connection");
            let dialer = if selection.connection.proxy_protocol == PROTOCOL_HTTP_CONNECT {
                let transport = selection.connection.transport.clone().unwrap_or_default();
                let proxy = match (&transport.tcp, &transport.uds) {
                    (_, Some(uds)) => Proxy::Uds(PathBuf::from(&uds.uds_name)),
                    (Some(tcp), None) => tcp_proxy(tcp, file, &format!("{at}.transport.tcp"))?,
                    (None, None) => continue,
                };
                Dialer(Arc::new(Route::Connect(proxy)))
            } else {
                Dialer::direct()
            };
            match which {
                Selection::ControlPlane => egress.controlplane = dialer,
                Selection::Etcd => egress.etcd = dialer,
                Selection::Cluster => egress.cluster = dialer,
            }
        }
        Ok(egress)
    }

    /// The dialer of one selection.
    pub fn dialer(&self, which: Selection) -> Dialer {
        match which {
            Selection::ControlPlane => self.controlplane.clone(),
            Selection::Etcd => self.etcd.clone(),
            Selection::Cluster => self.cluster.clone(),
        }
    }
}

fn tcp_proxy(
    tcp: &svc_config::egress::TcpTransport,
    file: &Path,
    at: &str,
) -> Result<Proxy, EgressError> {
    let bad = |field: &str, message: String| EgressError::Tls {
        path: file.to_path_buf(),
        field: format!("{at}.{field}"),
        message,
    };
    let uri: http::Uri = tcp
        .url
        .parse()
        .map_err(|e| bad("url", format!("{:?}: {e}", tcp.url)))?;
    let https = uri.scheme_str() == Some("https");
    let host = uri
        .host()
        .ok_or_else(|| bad("url", format!("{:?} has no host", tcp.url)))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tls = if https {
        let cfg = tcp.tls_config.clone().unwrap_or_default();
        let read = |field: &str, p: &str| {
            std::fs::read(p).map_err(|e| bad(&format!("tlsConfig.{field}"), format!("{p}: {e}")))
        };
        let roots = if cfg.ca_bundle.is_empty() {
            system_roots().map_err(|e| bad("tlsConfig.caBundle", e))?
        } else {
            roots_from_pem(&read("caBundle", &cfg.ca_bundle)?)
                .map_err(|e| bad("tlsConfig.caBundle", e))?
        };
        let certs = certs_from_pem(&read("clientCert", &cfg.client_cert)?)
            .map_err(|e| bad("tlsConfig.clientCert", e))?;
        let key = PrivateKeyDer::from_pem_slice(&read("clientKey", &cfg.client_key)?)
            .map_err(|e| bad("tlsConfig.clientKey", e.to_string()))?;
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("url", e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| bad("tlsConfig.clientKey", e.to_string()))?;
        let name =
            ServerName::try_from(host.clone()).map_err(|e| bad("url", format!("{host:?}: {e}")))?;
        Some((TlsConnector::from(Arc::new(client)), name))
    } else {
        None
    };
    Ok(Proxy::Tcp {
        url: tcp.url.clone(),
        host,
        port,
        tls,
    })
}

/// The ring provider, named explicitly as everywhere in the gateway.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The system's trust store, read once.
pub fn system_roots() -> Result<rustls::RootCertStore, String> {
    static ROOTS: OnceLock<Result<rustls::RootCertStore, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
                return Err(format!(
                    "no CA given and no system root certificates found ({})",
                    why.join("; ")
                ));
            }
            Ok(roots)
        })
        .clone()
}

/// Every certificate of a PEM bundle (at least one).
pub fn certs_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no PEM certificate found".to_string());
    }
    Ok(certs)
}

/// A root store of every certificate of a PEM bundle.
pub fn roots_from_pem(pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs_from_pem(pem)? {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    Ok(roots)
}

/// How one selection reaches a destination. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Dialer(Arc<Route>);

#[derive(Debug)]
enum Route {
    Direct,
    Connect(Proxy),
}

enum Proxy {
    Tcp {
        url: String,
        host: String,
        port: u16,
        tls: Option<(TlsConnector, ServerName<'static>)>,
    },
    Uds(PathBuf),
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Proxy {
    fn describe(&self) -> String {
        match self {
            Proxy::Tcp { url, .. } => url.clone(),
            Proxy::Uds(p) => format!("unix://{}", p.display()),
        }
    }
}

impl Dialer {
    pub fn direct() -> Self {
        Dialer(Arc::new(Route::Direct))
    }

    pub fn is_direct(&self) -> bool {
        matches!(*self.0, Route::Direct)
    }

    /// `direct` or `HTTPConnect via <tunnel server>`, for logs and errors.
    pub fn describe(&self) -> String {
        match &*self.0 {
            Route::Direct => "direct".to_string(),
            Route::Connect(p) => format!("HTTPConnect via {}", p.describe()),
        }
    }

    /// A stream to `host:port`, tunnelled when the selection says so; bounded by
    /// [`DIAL_TIMEOUT`].
    pub async fn dial(&self, host: &str, port: u16) -> io::Result<Stream> {
        match tokio::time::timeout(DIAL_TIMEOUT, self.dial_unbounded(host, port)).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "dialling {} ({}): no connection within {DIAL_TIMEOUT:?}",
                    host_port(host, port),
                    self.describe()
                ),
            )),
        }
    }

    async fn dial_unbounded(&self, host: &str, port: u16) -> io::Result<Stream> {
        let proxy = match &*self.0 {
            Route::Direct => {
                let s = TcpStream::connect((host, port)).await?;
                s.set_nodelay(true)?;
                return Ok(Box::new(s));
            }
            Route::Connect(p) => p,
        };
        let context = |e: io::Error| {
            io::Error::new(e.kind(), format!("tunnel server {}: {e}", proxy.describe()))
        };
        let carrier: Stream = match proxy {
            Proxy::Uds(path) => Box::new(UnixStream::connect(path).await.map_err(context)?),
            Proxy::Tcp {
                host: phost,
                port: pport,
                tls,
                ..
            } => {
                let tcp = TcpStream::connect((phost.as_str(), *pport))
                    .await
                    .map_err(context)?;
                tcp.set_nodelay(true)?;
                match tls {
                    None => Box::new(tcp),
                    Some((connector, name)) => Box::new(
                        connector
                            .connect(name.clone(), tcp)
                            .await
                            .map_err(context)?,
                    ),
                }
            }
        };
        connect_through(carrier, host, port, &proxy.describe()).await
    }
}

/// `host:port`, with IPv6 literals bracketed.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Asks the tunnel server on `carrier` for a tunnel to `host:port`; the returned stream is
/// the tunnel (bytes the server sent after its answer are kept).
async fn connect_through(
    carrier: Stream,
    host: &str,
    port: u16,
    proxy: &str,
) -> io::Result<Stream> {
    let target = host_port(host, port);
    exchange(carrier, &target, proxy).await.map_err(|e| {
        if e.to_string().contains(proxy) {
            e
        } else {
            io::Error::new(
                e.kind(),
                format!("tunnel server {proxy}, CONNECT {target}: {e}"),
            )
        }
    })
}

async fn exchange(carrier: Stream, target: &str, proxy: &str) -> io::Result<Stream> {
    let mut stream = BufReader::new(carrier);
    stream
        .get_mut()
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    stream.get_mut().flush().await?;
    let mut header = Vec::new();
    loop {
        let before = header.len();
        let n = (&mut stream)
            .take((MAX_CONNECT_RESPONSE + 1).saturating_sub(before) as u64)
            .read_until(b'\n', &mut header)
            .await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "tunnel server {proxy} closed the connection before answering CONNECT {target}"
                ),
            ));
        }
        if header.len() > MAX_CONNECT_RESPONSE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("tunnel server {proxy}: answer header over {MAX_CONNECT_RESPONSE} bytes"),
            ));
        }
        if header.ends_with(b"\r\n\r\n") || header.ends_with(b"\n\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&header);
    let status_line = text.lines().next().unwrap_or_default().trim();
    let code = status_line.split_whitespace().nth(1);
    if !status_line.starts_with("HTTP/1.") || code != Some("200") {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("tunnel server {proxy} refused CONNECT {target}: {status_line:?}"),
        ));
    }
    Ok(Box::new(stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A one-shot tunnel server that answers `answer` and, after a 200, echoes.
    async fn fake_proxy(answer: &'static [u8]) -> (u16, tokio::task::JoinHandle<String>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 1024];
            let mut got = Vec::new();
            while !got.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer).await.unwrap();
            // Echo what follows.
            let n = s.read(&mut buf).await.unwrap_or(0);
            let _ = s.write_all(&buf[..n]).await;
            String::from_utf8(got).unwrap()
        });
        (port, task)
    }

    fn via(port: u16) -> Dialer {
        Dialer(Arc::new(Route::Connect(Proxy::Tcp {
            url: format!("http://127.0.0.1:{port}"),
            host: "127.0.0.1".into(),
            port,
            tls: None,
        })))
    }

    #[tokio::test]
    async fn a_tunnel_carries_bytes_after_the_answer() {
        let (port, task) =
            fake_proxy(b"HTTP/1.1 200 Connection established\r\nX: y\r\n\r\nhi").await;
        let mut s = via(port).dial("example.test", 443).await.unwrap();
        let mut early = [0u8; 2];
        s.read_exact(&mut early).await.unwrap();
        assert_eq!(&early, b"hi", "bytes after the header belong to the tunnel");
        s.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");
        let request = task.await.unwrap();
        assert!(
            request.starts_with("CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n"),
            "{request}"
        );
    }

    #[tokio::test]
    async fn a_refusal_names_the_tunnel_server_and_its_status_line() {
        let (port, _task) = fake_proxy(b"HTTP/1.1 403 Access violation\r\n\r\n").await;
        let e = via(port).dial("::1", 8443).await.err().unwrap();
        let text = e.to_string();
        assert!(
            text.contains(&format!("http://127.0.0.1:{port}"))
                && text.contains("HTTP/1.1 403 Access violation")
                && text.contains("[::1]:8443"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn an_endless_answer_header_is_cut_off() {
        static BIG: OnceLock<Vec<u8>> = OnceLock::new();
        let big = BIG.get_or_init(|| {
            let mut v = b"HTTP/1.1 200 OK\r\n".to_vec();
            for _ in 0..2000 {
                v.extend_from_slice(b"X-Filler: 0123456789\r\n");
            }
            v
        });
        let (port, _task) = fake_proxy(big).await;
        let e = via(port).dial("h", 1).await.err().unwrap();
        assert!(e.to_string().contains("answer header over"), "{e}");
    }

    #[tokio::test]
    async fn a_closed_connection_is_an_error_not_a_hang() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            while !got.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            drop(s);
        });
        let e = via(port).dial("h", 1).await.err().unwrap();
        assert!(e.to_string().contains("closed the connection"), "{e}");
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn files_are_checked_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let head = "apiVersion: apiserver.svc.io/v1beta1\nkind: EgressSelectorConfiguration\n";
        let grpc = write(
            dir.path(),
            "grpc.yaml",
            &format!(
                "{head}egressSelections:\n- name: etcd\n  connection:\n    proxyProtocol: GRPC\n    \
                 transport:\n      uds:\n        udsName: /run/t.sock\n"
            ),
        );
        let e = Egress::from_file(&grpc).unwrap_err().to_string();
        assert!(
            e.contains("GRPC tunnels are not implemented")
                && e.contains("egressSelections[0].connection.proxyProtocol"),
            "{e}"
        );
        let missing = write(
            dir.path(),
            "missing.yaml",
            &format!(
                "{head}egressSelections:\n- name: controlplane\n  connection:\n    proxyProtocol: \
                 HTTPConnect\n    transport:\n      tcp:\n        url: https://127.0.0.1:1\n        \
                 tlsConfig:\n          clientCert: /nonexistent/c.pem\n          clientKey: /k.pem\n"
            ),
        );
        let e = Egress::from_file(&missing).unwrap_err().to_string();
        assert!(
            e.contains("egressSelections[0].connection.transport.tcp.tlsConfig.")
                && e.contains("/nonexistent/c.pem"),
            "{e}"
        );
        let invalid = write(
            dir.path(),
            "invalid.yaml",
            &format!(
                "{head}egressSelections:\n- name: controlplane\n  connection:\n    proxyProtocol: \
                 HTTPConnect\n    transport:\n      tcp:\n        url: https://127.0.0.1:1\n        \
                 tlsConfig:\n          clientKey: /k.pem\n"
            ),
        );
        let e = Egress::from_file(&invalid).unwrap_err().to_string();
        assert!(
            e.contains(
                "egressSelections[0].connection.transport.tcp.tlsConfig.clientCert: Required value"
            ),
            "{e}"
        );
        let ok = write(
            dir.path(),
            "ok.yaml",
            &format!(
                "{head}egressSelections:\n- name: master\n  connection:\n    proxyProtocol: \
                 HTTPConnect\n    transport:\n      uds:\n        udsName: /run/t.sock\n\
                 - name: etcd\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      \
                 tcp:\n        url: http://127.0.0.1:3128\n"
            ),
        );
        let egress = Egress::from_file(&ok).unwrap();
        assert_eq!(
            egress.dialer(Selection::ControlPlane).describe(),
            "HTTPConnect via unix:///run/t.sock"
        );
        assert_eq!(
            egress.dialer(Selection::Etcd).describe(),
            "HTTPConnect via http://127.0.0.1:3128"
        );
        assert_eq!(egress.dialer(Selection::Cluster).describe(), "direct");
    }
}
