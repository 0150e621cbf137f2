//! rustls configurations built from the PKI: the server's (client certificates optional,
//! so a request without one reaches HTTP and gets a 401 there) and a client's for tests
//! and tools.
//!
//! Both name the ring provider explicitly: relying on a process-wide default would make
//! behaviour depend on which other crate installed one first.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::{Pki, PkiError};

/// ALPN protocols the server offers, most preferred first.
pub const SERVER_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Pki {
    /// The listener's TLS configuration: serves `apiserver.crt`, offers h2 and http/1.1,
    /// and asks for (but does not require) a client certificate chaining to the CA, or to
    /// the CA that signs certificate requests when that is another one.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, PkiError> {
        let provider = provider();
        let mut roots = self.ca_roots("server")?;
        if let Some(signer) = &self.signer {
            roots
                .add(signer.cert_der.clone())
                .map_err(|source| PkiError::Tls {
                    what: "server",
                    source,
                })?;
        }
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .allow_unauthenticated()
            .build()
            .map_err(|source| PkiError::Verifier { source })?;
        let key = parse_private_key("the serving key", &self.serving_key_pem)?;
        let tls = |source| PkiError::Tls {
            what: "server",
            source,
        };
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(tls)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![self.serving_cert_der.clone()], key)
            .map_err(tls)?;
        config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// The listener's TLS configuration in proxy mode: serves `apiserver.crt`, offers h2 and
    /// http/1.1, and asks for (but does not require) a client certificate chaining to one of
    /// the CAs of `client_ca_pem` (`--client-ca-file`); never to this PKI's own CA, whose
    /// certificates the upstream does not know. Without a bundle no certificate is asked for.
    pub fn proxy_server_config(
        &self,
        client_ca_pem: Option<&[u8]>,
    ) -> Result<Arc<ServerConfig>, PkiError> {
        self.proxy_server_config_with(client_ca_pem, None)
    }

    /// As [`Pki::proxy_server_config`], also accepting the certificates of a front proxy's
    /// CA (`--requestheader-client-ca-file`): which of the two signed a certificate is
    /// decided after the handshake ([`ClientCertRoles`]).
    pub fn proxy_server_config_with(
        &self,
        client_ca_pem: Option<&[u8]>,
        front_proxy_ca_pem: Option<&[u8]>,
    ) -> Result<Arc<ServerConfig>, PkiError> {
        let joined: Vec<u8>;
        let client_ca_pem = match (client_ca_pem, front_proxy_ca_pem) {
            (Some(a), Some(b)) => {
                joined = [a, b"\n", b].concat();
                Some(joined.as_slice())
            }
            (a, b) => a.or(b),
        };
        let provider = provider();
        let tls = |source| PkiError::Tls {
            what: "server",
            source,
        };
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(tls)?;
        let builder = match client_ca_pem {
            None => builder.with_no_client_auth(),
            Some(pem) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|source| PkiError::Pem {
                        what: "the client CA bundle".into(),
                        source,
                    })?;
                    roots.add(cert).map_err(tls)?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .allow_unauthenticated()
                        .build()
                        .map_err(|source| PkiError::Verifier { source })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let key = parse_private_key("the serving key", &self.serving_key_pem)?;
        let mut config = builder
            .with_single_cert(vec![self.serving_cert_der.clone()], key)
            .map_err(tls)?;
        config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// A client configuration that trusts only this CA, presenting `client_cert`
    /// (certificate PEM, key PEM) when given and offering `alpn` in order.
    pub fn client_config_for(
        &self,
        client_cert: Option<(&str, &str)>,
        alpn: &[&[u8]],
    ) -> Result<Arc<ClientConfig>, PkiError> {
        let tls = |source| PkiError::Tls {
            what: "client",
            source,
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls)?
            .with_root_certificates(self.ca_roots("client")?);
        let mut config = match client_cert {
            None => builder.with_no_client_auth(),
            Some((cert_pem, key_pem)) => {
                let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|source| PkiError::Pem {
                        what: "the client certificate".into(),
                        source,
                    })?;
                let key = parse_private_key("the client key", key_pem)?;
                builder.with_client_auth_cert(chain, key).map_err(tls)?
            }
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    fn ca_roots(&self, what: &'static str) -> Result<RootCertStore, PkiError> {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.ca.cert_der.clone())
            .map_err(|source| PkiError::Tls { what, source })?;
        Ok(roots)
    }
}

fn parse_private_key(what: &str, pem: &str) -> Result<PrivateKeyDer<'static>, PkiError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|source| PkiError::Pem {
        what: what.to_owned(),
        source,
    })
}

/// Which CA signed a client certificate, for a proxy that accepts two (its callers' and a
/// front proxy's): each is verified against one CA alone, as kube-apiserver's x509 and
/// request-header authenticators each verify against their own.
pub struct ClientCertRoles {
    client: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    front_proxy: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    allowed_names: Vec<String>,
}

/// What a client certificate is to a proxy.
#[derive(Debug, PartialEq, Eq)]
pub enum CertRole {
    /// A caller's own certificate (`--client-ca-file`).
    Caller,
    /// A front proxy's (`--requestheader-client-ca-file`, an allowed common name).
    FrontProxy,
    /// Neither.
    Unknown,
}

fn verifier(
    pem: &[u8],
    what: &str,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, PkiError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|source| PkiError::Pem {
            what: what.into(),
            source,
        })?;
        roots.add(cert).map_err(|source| PkiError::Tls {
            what: "server",
            source,
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|source| PkiError::Verifier { source })
}

impl ClientCertRoles {
    pub fn new(
        client_ca_pem: Option<&[u8]>,
        front_proxy_ca_pem: &[u8],
        allowed_names: Vec<String>,
    ) -> Result<Self, PkiError> {
        Ok(ClientCertRoles {
            client: client_ca_pem
                .map(|pem| verifier(pem, "the client CA bundle"))
                .transpose()?,
            front_proxy: verifier(front_proxy_ca_pem, "the request-header CA bundle")?,
            allowed_names,
        })
    }

    /// The role of a certificate chain the handshake accepted.
    pub fn role(&self, chain: &[CertificateDer<'_>]) -> CertRole {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return CertRole::Unknown;
        };
        let now = rustls_pki_types::UnixTime::now();
        let front = self
            .front_proxy
            .verify_client_cert(leaf, intermediates, now)
            .is_ok();
        if front {
            let name = x509_parser::parse_x509_certificate(leaf.as_ref())
                .ok()
                .and_then(|(_, c)| {
                    c.subject()
                        .iter_common_name()
                        .next()
                        .and_then(|n| n.as_str().ok().map(str::to_string))
                });
            let allowed = self.allowed_names.is_empty()
                || name.is_some_and(|n| self.allowed_names.contains(&n));
            if allowed {
                return CertRole::FrontProxy;
            }
        }
        match &self.client {
            Some(v) if v.verify_client_cert(leaf, intermediates, now).is_ok() => CertRole::Caller,
            _ => CertRole::Unknown,
        }
    }
}
