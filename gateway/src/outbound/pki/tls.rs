//! rustls configurations built from the PKI: the server's (client certificates optional,
//! so a request without one reaches HTTP and gets a 401 there, and verified after the
//! handshake by [`ClientCerts`], as kube-apiserver verifies them) and a client's for tests
//! and tools.
//!
//! Both name the ring provider explicitly: relying on a process-wide default would make
//! behaviour depend on which other crate installed one first.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};
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
    /// and asks for (but does not require) a client certificate, which [`ClientCerts`]
    /// verifies after the handshake against the CA, and the CA that signs certificate
    /// requests when that is another one.
    pub fn server_config(&self) -> Result<(Arc<ServerConfig>, Arc<ClientCerts>), PkiError> {
        let mut cas = vec![self.ca.cert_der.clone()];
        if let Some(signer) = &self.signer {
            cas.push(signer.cert_der.clone());
        }
        let client_certs = ClientCerts::from_certs(cas)?;
        let config = self.serving_config(&client_certs)?;
        Ok((config, Arc::new(client_certs)))
    }

    /// The listener's TLS configuration in proxy mode: serves `apiserver.crt`, offers h2 and
    /// http/1.1, and asks for (but does not require) a client certificate, verified after
    /// the handshake against the CAs of `client_ca_pem` (`--client-ca-file`; never this
    /// PKI's own CA, whose certificates the upstream does not know) or, with `front_proxy`,
    /// a front proxy's CAs and allowed names (`--requestheader-client-ca-file`,
    /// `--requestheader-allowed-names`). Without either no certificate is asked for.
    pub fn proxy_server_config(
        &self,
        client_ca_pem: Option<&[u8]>,
        front_proxy: Option<(&[u8], Vec<String>)>,
    ) -> Result<(Arc<ServerConfig>, Arc<ClientCerts>), PkiError> {
        let client_certs = ClientCerts::new(client_ca_pem, front_proxy)?;
        let config = self.serving_config(&client_certs)?;
        Ok((config, Arc::new(client_certs)))
    }

    fn serving_config(&self, client_certs: &ClientCerts) -> Result<Arc<ServerConfig>, PkiError> {
        let tls = |source| PkiError::Tls {
            what: "server",
            source,
        };
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls)?;
        let builder = if client_certs.asks() {
            builder.with_client_cert_verifier(client_certs.handshake_verifier())
        } else {
            builder.with_no_client_auth()
        };
        let key = parse_private_key("the serving key", &self.serving_key_pem)?;
        let mut config = builder
            .with_single_cert(vec![self.serving_cert_der.clone()], key)
            .map_err(tls)?;
        config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
        // Session tickets, as Go's server (kube-apiserver's) sends them: a client that offers
        // one back resumes without the signature and the certificate exchange of a full
        // handshake. Without them rustls resumes only the last 256 sessions it keeps in
        // memory, which a cluster's thousands of clients push out long before they reconnect.
        // The ticket keys live in memory only, rotated every 6 h (each replica its own); a
        // resumed session keeps the client certificate it was opened with, whose chain is
        // verified again after the handshake as every one is.
        config.ticketer = rustls::crypto::ring::Ticketer::new().map_err(tls)?;
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

/// Client certificates as kube-apiserver takes them (Go's `tls.RequestClientCert`, then its
/// x509 authenticator): any certificate is accepted at the handshake, once the client proves
/// it holds the key, and its chain is verified after it ([`ClientCerts::role`]) against the
/// callers' CAs, or a front proxy's. A chain that verifies against neither authenticates
/// nobody: the connection stays, its requests are judged without the certificate (a 401, or a
/// bearer token's user), and the reason is logged, where a refusal in the handshake would
/// leave the client a dropped connection and nothing in any log. Certificates without
/// extensions (X.509 v1), which Go verifies and rustls' verifier refuses, are verified here
/// against the CA that signed them.
pub struct ClientCerts {
    callers: Option<CaBundle>,
    front_proxy: Option<(CaBundle, Vec<String>)>,
}

/// What a client certificate is to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertRole {
    /// A caller's own certificate (the cluster CA, or `--client-ca-file`).
    Caller,
    /// A front proxy's (`--requestheader-client-ca-file`, an allowed common name).
    FrontProxy,
}

/// A bundle of CAs, each client certificate verified against it alone.
struct CaBundle {
    webpki: Arc<dyn ClientCertVerifier>,
    /// Each CA's subject and public key (DER), for certificates without extensions.
    roots: Vec<(Vec<u8>, Vec<u8>)>,
    /// Each CA's subject, sent to clients as the CAs the server trusts.
    subjects: Vec<DistinguishedName>,
}

impl CaBundle {
    fn new(certs: Vec<CertificateDer<'static>>, what: &str) -> Result<Self, PkiError> {
        let tls = |source| PkiError::Tls {
            what: "server",
            source,
        };
        let mut store = RootCertStore::empty();
        let mut roots = Vec::new();
        let mut subjects = Vec::new();
        for cert in certs {
            let (_, parsed) =
                x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| PkiError::Pem {
                    what: format!("{what}: {e}"),
                    source: rustls_pki_types::pem::Error::NoItemsFound,
                })?;
            roots.push((
                parsed.subject().as_raw().to_vec(),
                parsed.public_key().raw.to_vec(),
            ));
            subjects.push(DistinguishedName::from(parsed.subject().as_raw().to_vec()));
            store.add(cert).map_err(tls)?;
        }
        let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider())
            .build()
            .map_err(|source| PkiError::Verifier { source })?;
        Ok(CaBundle {
            webpki,
            roots,
            subjects,
        })
    }

    fn from_pem(pem: &[u8], what: &str) -> Result<Self, PkiError> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| PkiError::Pem {
                what: what.into(),
                source,
            })?;
        Self::new(certs, what)
    }

    /// Whether the chain verifies against one of the CAs, for client authentication now.
    fn verify(&self, chain: &[CertificateDer<'_>]) -> Result<(), String> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err("no certificate".into());
        };
        let now = rustls_pki_types::UnixTime::now();
        let err = match self.webpki.verify_client_cert(leaf, intermediates, now) {
            Ok(_) => return Ok(()),
            Err(e) => e.to_string(),
        };
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| format!("the certificate does not parse: {e}"))?;
        if cert.version() != x509_parser::x509::X509Version::V1 {
            return Err(err);
        }
        // X.509 v1: no extensions, so no constraints to check but the signature and the
        // validity; only a certificate a CA of the bundle signed itself.
        if !cert.validity().is_valid() {
            return Err("the certificate has expired or is not yet valid".into());
        }
        let issuer = cert.issuer().as_raw();
        let signed = self.roots.iter().any(|(subject, key)| {
            subject.as_slice() == issuer
                && <x509_parser::x509::SubjectPublicKeyInfo<'_> as x509_parser::prelude::FromDer<
                    '_,
                    x509_parser::error::X509Error,
                >>::from_der(key)
                .is_ok_and(|(_, spki)| cert.verify_signature(Some(&spki)).is_ok())
        });
        if signed {
            Ok(())
        } else {
            Err("the certificate (X.509 v1) was not signed by a trusted CA".into())
        }
    }
}

impl ClientCerts {
    /// Callers' certificates verified against `callers` (PEM bundles, or certificates), a
    /// front proxy's against `front_proxy` with its allowed common names (none: any).
    pub fn new(
        callers: Option<&[u8]>,
        front_proxy: Option<(&[u8], Vec<String>)>,
    ) -> Result<Self, PkiError> {
        Ok(ClientCerts {
            callers: callers
                .map(|pem| CaBundle::from_pem(pem, "the client CA bundle"))
                .transpose()?,
            front_proxy: front_proxy
                .map(|(pem, names)| {
                    CaBundle::from_pem(pem, "the request-header CA bundle").map(|b| (b, names))
                })
                .transpose()?,
        })
    }

    fn from_certs(certs: Vec<CertificateDer<'static>>) -> Result<Self, PkiError> {
        Ok(ClientCerts {
            callers: Some(CaBundle::new(certs, "the cluster CA")?),
            front_proxy: None,
        })
    }

    /// Whether any certificate is asked for.
    fn asks(&self) -> bool {
        self.callers.is_some() || self.front_proxy.is_some()
    }

    /// The role of a certificate chain the handshake accepted: a front proxy's when it
    /// verifies against the front proxy's CAs alone and names an allowed common name (the
    /// last CN, as Go reads it), else a caller's when it verifies against the callers' CAs;
    /// why not, when neither.
    pub fn role(&self, chain: &[CertificateDer<'_>]) -> Result<CertRole, String> {
        let mut why = Vec::new();
        if let Some((bundle, allowed)) = &self.front_proxy {
            match bundle.verify(chain) {
                Ok(()) => {
                    let name = chain.first().and_then(|leaf| {
                        let (_, c) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
                        super::common_name(c.subject()).ok().flatten()
                    });
                    if allowed.is_empty() || name.as_ref().is_some_and(|n| allowed.contains(n)) {
                        return Ok(CertRole::FrontProxy);
                    }
                    why.push(format!(
                        "a front proxy's certificate whose common name {name:?} is not allowed \
                         (--requestheader-allowed-names)"
                    ));
                }
                Err(e) => why.push(format!("not a front proxy's: {e}")),
            }
        }
        match &self.callers {
            Some(bundle) => match bundle.verify(chain) {
                Ok(()) => return Ok(CertRole::Caller),
                Err(e) => why.push(e),
            },
            None => why.push("no client CA is configured".into()),
        }
        Err(why.join("; "))
    }

    /// The handshake's verifier: any certificate, its key proven.
    fn handshake_verifier(&self) -> Arc<dyn ClientCertVerifier> {
        let mut hints: Vec<DistinguishedName> = Vec::new();
        for bundle in self
            .callers
            .iter()
            .chain(self.front_proxy.iter().map(|(b, _)| b))
        {
            hints.extend(bundle.subjects.iter().cloned());
        }
        Arc::new(AnyClientCert {
            algorithms: provider().signature_verification_algorithms,
            hints,
        })
    }
}

/// Accepts any client certificate, checking only the client's signature over the handshake
/// with the certificate's key; the chain is [`ClientCerts::role`]'s to judge.
#[derive(Debug)]
struct AnyClientCert {
    algorithms: WebPkiSupportedAlgorithms,
    hints: Vec<DistinguishedName>,
}

impl ClientCertVerifier for AnyClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_signed(&self.algorithms, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // TLS 1.3 has no PKCS#1 v1.5 signatures in the handshake.
        if matches!(
            dss.scheme,
            SignatureScheme::RSA_PKCS1_SHA256
                | SignatureScheme::RSA_PKCS1_SHA384
                | SignatureScheme::RSA_PKCS1_SHA512
                | SignatureScheme::RSA_PKCS1_SHA1
        ) {
            return Err(rustls::Error::PeerMisbehaved(
                rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
            ));
        }
        verify_signed(&self.algorithms, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The client's signature over the handshake, checked with the public key of its
/// certificate (read by x509-parser, which reads X.509 v1 too): one of the provider's
/// algorithms for the scheme whose key type is the certificate's.
fn verify_signed(
    algorithms: &WebPkiSupportedAlgorithms,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let bad = || rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature);
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
    let spki = parsed.public_key();
    let key_alg = algorithm_contents(spki.raw).ok_or_else(bad)?;
    let key = spki.subject_public_key.data.as_ref();
    let (_, candidates) = algorithms
        .mapping
        .iter()
        .find(|(scheme, _)| *scheme == dss.scheme)
        .ok_or(rustls::Error::PeerMisbehaved(
            rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
        ))?;
    let verified = candidates.iter().any(|alg| {
        alg.public_key_alg_id().as_ref() == key_alg
            && alg.verify_signature(key, message, dss.signature()).is_ok()
    });
    if verified {
        Ok(HandshakeSignatureValid::assertion())
    } else {
        Err(bad())
    }
}

/// The contents of a SubjectPublicKeyInfo's AlgorithmIdentifier (the SEQUENCE's body, as
/// rustls' algorithm ids are written): `SEQUENCE { SEQUENCE { alg... }, BIT STRING }`.
fn algorithm_contents(spki: &[u8]) -> Option<&[u8]> {
    let (tag, body, _) = der_element(spki)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, alg, _) = der_element(body)?;
    (tag == 0x30).then_some(alg)
}

/// One DER element: its tag, its contents and what follows it.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let (bytes, rest) = rest.split_at_checked(n)?;
        let len = bytes.iter().try_fold(0usize, |acc, b| {
            acc.checked_mul(256)?.checked_add(usize::from(*b))
        })?;
        (len, rest)
    };
    let (body, after) = rest.split_at_checked(len)?;
    Some((tag, body, after))
}
