//! Cluster PKI on disk: the CA, the serving certificate, the admin client certificate and
//! its kubeconfig, and the service-account signing key — created on first start, reused
//! (and repaired where that is safe) on later ones. Certificate signing requests are
//! issued from the cluster CA, or from the CA given by `--cluster-signing-cert-file` and
//! `--cluster-signing-key-file` (`request`), which then also verifies client certificates.
//!
//! Everything happens under an exclusive lock on `<cert_dir>/.lock` and every file is
//! written by temp file + rename, so two servers starting at once on one directory end
//! up sharing one CA, and no reader ever sees half a file.

mod der;
mod files;
mod issue;
mod kubeconfig;
mod request;
mod san;
mod tls;

#[cfg(test)]
mod tests;

pub use request::{CertificateRequestInfo, inspect_request};
pub use tls::{CertRole, ClientCerts, SERVER_ALPN};

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls_pki_types::CertificateDer;

use svc_core::user::UserInfo;
use time::OffsetDateTime;

use crate::base::flags::Options;

use issue::{
    CertAuthority, ensure_admin_cert, ensure_sa_key, ensure_serving_cert, issue_client,
    load_or_create_ca, load_signing_ca, parse_cert_pem,
};
use san::SanName;

/// CA certificate (PEM), the trust anchor for clients and for client certificates.
pub const CA_CERT_FILE: &str = "ca.crt";
/// CA private key (PKCS#8 PEM, mode 0600).
pub const CA_KEY_FILE: &str = "ca.key";
/// Serving certificate presented on the TLS listener.
pub const SERVING_CERT_FILE: &str = "apiserver.crt";
/// Serving private key (mode 0600).
pub const SERVING_KEY_FILE: &str = "apiserver.key";
/// Admin client certificate (CN=admin, O=system:masters).
pub const ADMIN_CERT_FILE: &str = "admin.crt";
/// Admin client private key (mode 0600).
pub const ADMIN_KEY_FILE: &str = "admin.key";
/// Service-account token signing key (ECDSA P-256, PKCS#8 PEM, mode 0600).
pub const SA_KEY_FILE: &str = "sa.key";
/// Service-account token verification key (SPKI PEM).
pub const SA_PUB_FILE: &str = "sa.pub";

/// Username of the bootstrap admin identity.
pub const ADMIN_USER: &str = "admin";
/// Group that the authorizer lets do anything.
pub const MASTERS_GROUP: &str = "system:masters";
/// Group every authenticated user belongs to.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

const CA_COMMON_NAME: &str = "svc-ca";
const SERVING_COMMON_NAME: &str = "svc-apiserver";
const CA_VALIDITY: Duration = Duration::from_secs(3650 * 24 * 60 * 60);
const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// Leaves this close to expiry are re-issued at start, so a server restarted now and then
/// never serves an expired certificate.
const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// Backdating tolerates clients whose clocks run a little behind ours.
const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);
/// A peer holding the lock longer than this is stuck; fail rather than hang the start.
const LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// Names every serving certificate carries: loopback, and the in-cluster names clients
/// use for the API service.
const DEFAULT_SANS: &[&str] = &[
    "127.0.0.1",
    "::1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// What [`ensure_pki`] needs besides the directory.
#[derive(Clone, Debug)]
pub struct PkiOptions {
    /// Extra serving-certificate names: an entry that parses as an IP address becomes an
    /// IP SAN, anything else a DNS SAN.
    pub tls_sans: Vec<String>,
    /// Where the admin kubeconfig goes (written when missing or when its credentials change);
    /// an empty path writes none (proxy mode, whose callers hold the upstream's credentials).
    pub admin_kubeconfig_path: PathBuf,
    /// Server URL written into the kubeconfig, e.g. `https://127.0.0.1:6443`.
    pub server_url: String,
    /// The CA that issues certificates for signing requests, when not the cluster CA.
    pub cluster_signing: Option<SigningFiles>,
}

/// A CA certificate and its private key (PEM files; the key PKCS#8, PKCS#1 or SEC1).
#[derive(Clone, Debug)]
pub struct SigningFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl SigningFiles {
    /// The CA files of `--cluster-signing-cert-file` and `--cluster-signing-key-file`, which
    /// come together or not at all.
    pub fn from_options(opts: &Options) -> Result<Option<SigningFiles>, String> {
        match (
            &opts.cluster_signing_cert_file,
            &opts.cluster_signing_key_file,
        ) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(SigningFiles {
                cert_file: cert.clone(),
                key_file: key.clone(),
            })),
            _ => {
                Err("--cluster-signing-cert-file and --cluster-signing-key-file go together".into())
            }
        }
    }
}

/// Everything that can go wrong creating, loading or using the PKI.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("gave up after {waited:?} waiting for the PKI lock {}", path.display())]
    LockTimeout { path: PathBuf, waited: Duration },
    #[error(
        "{} exists but its key {} is missing: restore the key, or remove the certificate to create a new CA (every issued credential then changes)",
        cert.display(),
        key.display()
    )]
    MissingCaKey { cert: PathBuf, key: PathBuf },
    #[error("{what} holds no usable certificate: {reason}")]
    InvalidCertificate { what: String, reason: String },
    #[error("{what} holds no usable private key")]
    InvalidKey {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("{what} holds an unsupported key: {reason}")]
    UnsupportedKey { what: String, reason: &'static str },
    #[error("private key {} does not belong to certificate {}", key.display(), cert.display())]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("invalid PEM in {what}")]
    Pem {
        what: String,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("invalid subject alternative name {value:?}: {reason}")]
    InvalidSan { value: String, reason: &'static str },
    #[error("invalid certificate request: {reason}")]
    InvalidRequest { reason: String },
    #[error("cannot generate {what}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("cannot re-encode {what}: {reason}")]
    Encode {
        what: &'static str,
        reason: &'static str,
    },
    #[error("cannot build the TLS {what} configuration")]
    Tls {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    #[error("cannot build the client-certificate verifier")]
    Verifier {
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
}

/// The subject attribute kube-apiserver reads a user's uid from (1.34 and later, gate
/// `AllowParsingUserUIDFromCertAuth`, on by default).
const UID_OID: &str = "1.3.6.1.4.1.57683.2";
/// The user extra that names the credential a request was authenticated with.
pub const CREDENTIAL_ID_KEY: &str = "authentication.kubernetes.io/credential-id";

/// Identity of a client certificate whose chain the TLS layer has already verified, read as
/// kube-apiserver's `CommonNameUserConversion` reads it: the subject's last CN is the
/// username, each O a group in order (the Kubernetes convention), the one uid attribute
/// (OID 1.3.6.1.4.1.57683.2) the uid, and the extra `authentication.kubernetes.io/credential-id`
/// is `X509SHA256=` and the hex SHA-256 of the certificate; `system:authenticated` is added.
/// `Ok(None)` when the certificate has no CN (no user, as kube-apiserver's chain goes on to
/// the next authenticator); an error for a certificate that does not parse, an attribute that
/// is not text, or a uid that is empty or given more than once. It is the reading of a
/// certificate's subject, which the PKI needs for its own certificates (`issue.rs` checks the
/// admin certificate names `system:masters`); `security::authn` calls it for the connection's
/// client certificate.
pub fn client_cert_identity(cert_der: &[u8]) -> Result<Option<UserInfo>, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|e| format!("the client certificate does not parse: {e}"))?;
    let subject = cert.subject();
    let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>, what: &str| {
        attribute_text(a).ok_or_else(|| format!("the client certificate's {what} is not text"))
    };
    let Some(username) = common_name(subject)?.filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    let mut groups = subject
        .iter_organization()
        .map(|o| text(o, "organization"))
        .collect::<Result<Vec<_>, _>>()?;
    let uids = subject
        .iter_attributes()
        .filter(|a| a.attr_type().to_id_string() == UID_OID)
        .map(|a| text(a, "uid"))
        .collect::<Result<Vec<_>, _>>()?;
    let uid = match uids.as_slice() {
        [] => String::new(),
        [uid] if !uid.is_empty() => uid.clone(),
        [_] => return Err("the client certificate's uid is empty".into()),
        _ => return Err(format!("the client certificate has {} uids", uids.len())),
    };
    if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        groups.push(AUTHENTICATED_GROUP.to_owned());
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, cert_der);
    let id: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    Ok(Some(UserInfo {
        username,
        uid,
        groups,
        extra: [(
            CREDENTIAL_ID_KEY.to_owned(),
            vec![format!("X509SHA256={id}")],
        )]
        .into_iter()
        .collect(),
    }))
}

/// A subject's common name as Go's `pkix.Name` holds it: the last CN (an error when one is
/// not text).
pub(crate) fn common_name(
    subject: &x509_parser::x509::X509Name<'_>,
) -> Result<Option<String>, String> {
    let mut name = None;
    for cn in subject.iter_common_name() {
        name = Some(attribute_text(cn).ok_or("the client certificate's common name is not text")?);
    }
    Ok(name)
}

/// An attribute's value as Go's `crypto/x509` reads it into a string: the string types
/// as they are (T61String only where it is UTF-8), BMPString from UTF-16 with a trailing
/// NUL dropped. `None` for any other type.
fn attribute_text(a: &x509_parser::x509::AttributeTypeAndValue<'_>) -> Option<String> {
    use x509_parser::asn1_rs::Tag;
    let value = a.attr_value();
    let data = value.as_bytes();
    match value.tag() {
        Tag::NumericString
        | Tag::PrintableString
        | Tag::Utf8String
        | Tag::Ia5String
        | Tag::T61String => std::str::from_utf8(data).ok().map(str::to_owned),
        Tag::BmpString => {
            let data = data.strip_suffix(&[0, 0]).unwrap_or(data);
            if data.len() % 2 != 0 {
                return None;
            }
            let units = data
                .chunks_exact(2)
                .map(|c| Some(u16::from_be_bytes([*c.first()?, *c.get(1)?])))
                .collect::<Option<Vec<u16>>>()?;
            String::from_utf16(&units).ok()
        }
        _ => None,
    }
}

/// The user of a client certificate ([`client_cert_identity`]); `None` when it names none
/// or cannot be read.
pub fn user_from_client_cert(cert_der: &[u8]) -> Option<UserInfo> {
    client_cert_identity(cert_der).ok().flatten()
}

/// The loaded PKI of one data directory. Private keys stay out of `Debug`.
pub struct Pki {
    cert_dir: PathBuf,
    admin_kubeconfig_path: PathBuf,
    ca: CertAuthority,
    /// The CA of `--cluster-signing-*-file`, when given.
    signer: Option<CertAuthority>,
    serving_cert_der: CertificateDer<'static>,
    serving_cert_pem: String,
    serving_key_pem: String,
    admin_cert_pem: String,
    admin_key_pem: String,
    sa_key_pem: String,
    sa_pub_pem: String,
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki")
            .field("cert_dir", &self.cert_dir)
            .field("admin_kubeconfig_path", &self.admin_kubeconfig_path)
            .finish_non_exhaustive()
    }
}

impl Pki {
    /// CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// Serving certificate, PEM.
    pub fn serving_cert_pem(&self) -> &str {
        &self.serving_cert_pem
    }

    /// Admin client certificate and key, PEM.
    pub fn admin_credentials(&self) -> (&str, &str) {
        (&self.admin_cert_pem, &self.admin_key_pem)
    }

    /// Service-account token signing key (ECDSA P-256, PKCS#8 PEM).
    pub fn sa_signing_key_pem(&self) -> &str {
        &self.sa_key_pem
    }

    /// Service-account token verification key (SPKI PEM).
    pub fn sa_public_key_pem(&self) -> &str {
        &self.sa_pub_pem
    }

    pub fn cert_dir(&self) -> &Path {
        &self.cert_dir
    }

    pub fn admin_kubeconfig_path(&self) -> &Path {
        &self.admin_kubeconfig_path
    }

    /// Issues a client certificate for user `cn` in `groups` (one O each), valid from a
    /// few minutes ago for `validity`. Returns (certificate PEM, PKCS#8 key PEM).
    pub fn issue_client_cert(
        &self,
        cn: &str,
        groups: &[String],
        validity: Duration,
    ) -> Result<(String, String), PkiError> {
        if cn.is_empty() {
            return Err(PkiError::InvalidRequest {
                reason: "the common name (username) is empty".into(),
            });
        }
        if validity.is_zero() {
            return Err(PkiError::InvalidRequest {
                reason: "the validity is zero".into(),
            });
        }
        issue_client(&self.ca, cn, groups, OffsetDateTime::now_utc(), validity)
    }

    /// The CA that issues certificates for signing requests.
    fn signing_ca(&self) -> &CertAuthority {
        self.signer.as_ref().unwrap_or(&self.ca)
    }

    /// The certificate (PEM) of the CA that issues certificates for signing requests.
    pub fn signing_ca_pem(&self) -> &str {
        &self.signing_ca().cert_pem
    }

    /// Issues the certificate the DER PKCS#10 request `der` asks for, with the key usages of
    /// `usages` (API names: `client auth`, ...), valid for `validity` but never past the
    /// signing CA. Returns the certificate as PEM.
    pub fn sign_request(
        &self,
        der: &[u8],
        usages: &[String],
        validity: Duration,
    ) -> Result<String, PkiError> {
        if validity.is_zero() {
            return Err(PkiError::InvalidRequest {
                reason: "the validity is zero".into(),
            });
        }
        request::sign_request(
            self.signing_ca(),
            der,
            usages,
            OffsetDateTime::now_utc(),
            validity,
        )
    }
}

/// Loads the PKI in `cert_dir`, creating or repairing whatever is missing; see the module
/// docs for the files. Blocks while another process or thread holds the directory's lock.
pub fn ensure_pki(cert_dir: &Path, opts: &PkiOptions) -> Result<Pki, PkiError> {
    let requested_sans = opts
        .tls_sans
        .iter()
        .map(|raw| SanName::parse(raw))
        .filter_map(Result::transpose)
        .collect::<Result<Vec<_>, _>>()?;
    files::create_private_dir(cert_dir)?;
    let _lock = files::DirLock::acquire(cert_dir, LOCK_TIMEOUT)?;
    let now = OffsetDateTime::now_utc();

    let (ca, ca_created) = load_or_create_ca(cert_dir, now)?;
    let signer = opts
        .cluster_signing
        .as_ref()
        .map(|f| load_signing_ca(&f.cert_file, &f.key_file, now))
        .transpose()?;
    let (serving_cert_pem, serving_key_pem) =
        ensure_serving_cert(cert_dir, &ca, &requested_sans, now)?;
    let serving_cert_der = parse_cert_pem(SERVING_CERT_FILE, &serving_cert_pem)?;
    let (admin_cert_pem, admin_key_pem, admin_issued) = ensure_admin_cert(cert_dir, &ca, now)?;
    let (sa_key_pem, sa_pub_pem) = ensure_sa_key(cert_dir)?;

    // A kubeconfig that exists but embeds credentials we just replaced would lock the
    // operator out, so those cases rewrite it too.
    let kubeconfig_path = &opts.admin_kubeconfig_path;
    if !kubeconfig_path.as_os_str().is_empty()
        && (ca_created || admin_issued || !files::exists(kubeconfig_path)?)
    {
        let yaml = kubeconfig::render(
            &opts.server_url,
            &ca.cert_pem,
            &admin_cert_pem,
            &admin_key_pem,
        );
        files::write_atomic(kubeconfig_path, yaml.as_bytes(), files::PRIVATE)?;
        tracing::info!(path = %kubeconfig_path.display(), "wrote admin kubeconfig");
    }

    Ok(Pki {
        cert_dir: cert_dir.to_owned(),
        admin_kubeconfig_path: kubeconfig_path.clone(),
        ca,
        signer,
        serving_cert_der,
        serving_cert_pem,
        serving_key_pem,
        admin_cert_pem,
        admin_key_pem,
        sa_key_pem,
        sa_pub_pem,
    })
}
