//! Creating, loading and checking the CA and the leaf certificates and keys it signs.

use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::ParsedExtension;

use super::san::{SanName, sans_of};
use super::*;

/// The CA as loaded: its certificate, and an issuer that signs with its key.
pub(super) struct CertAuthority {
    pub(super) cert_pem: String,
    pub(super) cert_der: CertificateDer<'static>,
    /// The CA subject exactly as encoded in ca.crt: issued certificates copy it byte for
    /// byte into their issuer field, which is how verifiers match a chain.
    pub(super) subject_der: Vec<u8>,
    /// The CA's subject key identifier, which issued certificates carry as their
    /// authority key identifier.
    pub(super) key_id: Option<Vec<u8>>,
    pub(super) issuer: Issuer<'static, KeyPair>,
    /// Certificates it issues never outlive it.
    pub(super) not_after: OffsetDateTime,
}

/// Returns the CA and whether it was created now.
pub(super) fn load_or_create_ca(
    dir: &Path,
    now: OffsetDateTime,
) -> Result<(CertAuthority, bool), PkiError> {
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    let cert_pem = files::read_optional(&cert_path)?;
    let key_pem = files::read_optional(&key_path)?;
    match (cert_pem, key_pem) {
        (Some(cert_pem), Some(key_pem)) => {
            let key = parse_key_pem(&key_path, &key_pem)?;
            Ok((load_ca(&cert_path, &key_path, cert_pem, key, now)?, false))
        }
        // Never mint a new CA over a certificate clients may already trust.
        (Some(_), None) => Err(PkiError::MissingCaKey {
            cert: cert_path,
            key: key_path,
        }),
        // A key without a certificate is the trace of a first start that died between the
        // two writes: nothing can have been signed by it that a client could verify.
        (None, _) => {
            let key = generate_key("the CA key")?;
            let mut params = CertificateParams::default();
            params.distinguished_name = common_name(CA_COMMON_NAME);
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            (params.not_before, params.not_after) = validity_window(now, CA_VALIDITY)?;
            let cert = params
                .self_signed(&key)
                .map_err(|source| PkiError::Generate {
                    what: "the CA certificate",
                    source,
                })?;
            // Key first: a crash between the writes leaves the recoverable state above.
            files::write_atomic(&key_path, key.serialize_pem().as_bytes(), files::PRIVATE)?;
            files::write_atomic(&cert_path, cert.pem().as_bytes(), files::PUBLIC)?;
            tracing::info!(dir = %dir.display(), "created a new cluster CA");
            Ok((load_ca(&cert_path, &key_path, cert.pem(), key, now)?, true))
        }
    }
}

fn load_ca(
    cert_path: &Path,
    key_path: &Path,
    cert_pem: String,
    key: KeyPair,
    now: OffsetDateTime,
) -> Result<CertAuthority, PkiError> {
    let what = cert_path.display().to_string();
    let cert_der = parse_cert_pem(&what, &cert_pem)?;
    let x509 = parse_x509(&what, &cert_der)?;
    if !x509.is_ca() {
        return Err(invalid_cert(
            &what,
            "it is not a CA (basicConstraints CA:TRUE)",
        ));
    }
    if x509.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(PkiError::KeyMismatch {
            cert: cert_path.to_owned(),
            key: key_path.to_owned(),
        });
    }
    let not_after = x509.validity().not_after.to_datetime();
    if not_after.unix_timestamp()
        < now
            .unix_timestamp()
            .saturating_add(RENEW_BEFORE.as_secs() as i64)
    {
        // Rotating a CA invalidates every credential handed out; that is the operator's
        // call, not something to do silently at start.
        tracing::warn!(path = %what, %not_after, "a CA expires soon or has expired");
    }
    // The issuer's own name never reaches the output (der::rewrite_names sets the raw
    // subject instead), so only its key identifier matters here.
    let mut params = CertificateParams::default();
    let key_id = subject_key_id(&x509);
    if let Some(ski) = &key_id {
        params.key_identifier_method = KeyIdMethod::PreSpecified(ski.clone());
    }
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let subject_der = x509.subject().as_raw().to_vec();
    Ok(CertAuthority {
        cert_pem,
        cert_der,
        subject_der,
        key_id,
        issuer: Issuer::new(params, key),
        not_after,
    })
}

/// The CA that signs certificate requests when it is not the cluster CA
/// (`--cluster-signing-cert-file`, `--cluster-signing-key-file`): both files must exist.
pub(super) fn load_signing_ca(
    cert_path: &Path,
    key_path: &Path,
    now: OffsetDateTime,
) -> Result<CertAuthority, PkiError> {
    let missing = |path: &Path| PkiError::Io {
        action: "read",
        path: path.to_owned(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    };
    let cert_pem = files::read_optional(cert_path)?.ok_or_else(|| missing(cert_path))?;
    let key_pem = files::read_optional(key_path)?.ok_or_else(|| missing(key_path))?;
    let key = parse_key_pem(key_path, &key_pem)?;
    load_ca(cert_path, key_path, cert_pem, key, now)
}

pub(super) fn ensure_serving_cert(
    dir: &Path,
    ca: &CertAuthority,
    requested: &[SanName],
    now: OffsetDateTime,
) -> Result<(String, String), PkiError> {
    let mut wanted: Vec<SanName> = DEFAULT_SANS
        .iter()
        .filter_map(|s| SanName::parse(s).ok().flatten())
        .collect();
    wanted.extend(requested.iter().cloned());
    let existing = read_leaf(dir, SERVING_CERT_FILE, SERVING_KEY_FILE, ca, now)?;
    if let Some(leaf) = &existing {
        let missing = wanted.iter().find(|san| !leaf.sans.contains(san));
        match (&leaf.problem, missing) {
            (None, None) => return Ok((leaf.cert_pem.clone(), leaf.key_pem.clone())),
            (Some(problem), _) => tracing::info!(%problem, "re-issuing the serving certificate"),
            (None, Some(san)) => tracing::info!(?san, "re-issuing the serving certificate"),
        }
        // Keep names the old certificate had: servers started with different --tls-san
        // lists on one directory then converge instead of re-issuing on every start.
        wanted.extend(leaf.sans.iter().cloned());
    }
    wanted.sort();
    wanted.dedup();

    let mut params = CertificateParams::default();
    params.distinguished_name = common_name(SERVING_COMMON_NAME);
    params.subject_alt_names = wanted
        .iter()
        .map(SanName::to_rcgen)
        .collect::<Result<_, _>>()?;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    (params.not_before, params.not_after) = validity_window(now, LEAF_VALIDITY)?;
    let (cert_pem, key_pem) = sign_leaf(ca, params, None, "the serving certificate")?;
    write_leaf(
        dir,
        SERVING_CERT_FILE,
        SERVING_KEY_FILE,
        &cert_pem,
        &key_pem,
    )?;
    Ok((cert_pem, key_pem))
}

/// Returns (cert PEM, key PEM, whether it was issued now).
pub(super) fn ensure_admin_cert(
    dir: &Path,
    ca: &CertAuthority,
    now: OffsetDateTime,
) -> Result<(String, String, bool), PkiError> {
    let groups = [MASTERS_GROUP.to_owned()];
    if let Some(leaf) = read_leaf(dir, ADMIN_CERT_FILE, ADMIN_KEY_FILE, ca, now)? {
        let user = user_from_client_cert(&leaf.cert_der);
        let is_admin = user.is_some_and(|u| {
            u.username == ADMIN_USER && u.groups.iter().any(|g| g == MASTERS_GROUP)
        });
        match (&leaf.problem, is_admin) {
            (None, true) => return Ok((leaf.cert_pem, leaf.key_pem, false)),
            (Some(problem), _) => tracing::info!(%problem, "re-issuing the admin certificate"),
            (None, false) => tracing::info!("re-issuing the admin certificate: wrong identity"),
        }
    }
    let (cert_pem, key_pem) = issue_client(ca, ADMIN_USER, &groups, now, LEAF_VALIDITY)?;
    write_leaf(dir, ADMIN_CERT_FILE, ADMIN_KEY_FILE, &cert_pem, &key_pem)?;
    Ok((cert_pem, key_pem, true))
}

pub(super) fn ensure_sa_key(dir: &Path) -> Result<(String, String), PkiError> {
    let key_path = dir.join(SA_KEY_FILE);
    let pub_path = dir.join(SA_PUB_FILE);
    let key = match files::read_optional(&key_path)? {
        Some(pem) => {
            let key = parse_key_pem(&key_path, &pem)?;
            // Tokens are ES256; a key of another kind would only fail later, at issuance.
            if key.algorithm() != &PKCS_ECDSA_P256_SHA256 {
                return Err(PkiError::UnsupportedKey {
                    what: key_path.display().to_string(),
                    reason: "service-account tokens need an ECDSA P-256 key",
                });
            }
            key
        }
        None => {
            let key = generate_key("the service-account key")?;
            files::write_atomic(&key_path, key.serialize_pem().as_bytes(), files::PRIVATE)?;
            key
        }
    };
    let pub_pem = key.public_key_pem();
    if files::read_optional(&pub_path)?.as_deref() != Some(pub_pem.as_str()) {
        files::write_atomic(&pub_path, pub_pem.as_bytes(), files::PUBLIC)?;
    }
    Ok((key.serialize_pem(), pub_pem))
}

/// An existing leaf certificate and key, and what (if anything) makes them unusable.
struct ExistingLeaf {
    cert_pem: String,
    key_pem: String,
    cert_der: Vec<u8>,
    sans: Vec<SanName>,
    problem: Option<String>,
}

/// `None` when either file is absent. Damaged or stale files are reported through
/// `problem` rather than as errors: the CA can always issue replacements.
fn read_leaf(
    dir: &Path,
    cert_file: &str,
    key_file: &str,
    ca: &CertAuthority,
    now: OffsetDateTime,
) -> Result<Option<ExistingLeaf>, PkiError> {
    let (Some(cert_pem), Some(key_pem)) = (
        files::read_optional(&dir.join(cert_file))?,
        files::read_optional(&dir.join(key_file))?,
    ) else {
        return Ok(None);
    };
    let mut leaf = ExistingLeaf {
        cert_pem,
        key_pem,
        cert_der: Vec::new(),
        sans: Vec::new(),
        problem: None,
    };
    let der = match CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()) {
        Ok(der) => der,
        Err(e) => {
            leaf.problem = Some(format!("{cert_file}: {e}"));
            return Ok(Some(leaf));
        }
    };
    leaf.cert_der = der.to_vec();
    let Ok((_, x509)) = x509_parser::parse_x509_certificate(&der) else {
        leaf.problem = Some(format!("{cert_file} does not parse"));
        return Ok(Some(leaf));
    };
    leaf.sans = sans_of(&x509);
    leaf.problem = leaf_problem(&x509, &leaf.key_pem, ca, now).map(|p| format!("{cert_file}: {p}"));
    Ok(Some(leaf))
}

fn leaf_problem(
    x509: &X509Certificate<'_>,
    key_pem: &str,
    ca: &CertAuthority,
    now: OffsetDateTime,
) -> Option<&'static str> {
    let Ok(key) = KeyPair::from_pem(key_pem) else {
        return Some("its key does not parse");
    };
    if x509.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Some("its key does not match");
    }
    // Issuer name plus authority key id is how we tell "signed by this CA" apart from "left
    // over from an earlier CA" without a signature check: the directory is trusted input,
    // we only need to notice that the CA was replaced.
    if x509.issuer().as_raw() != ca.subject_der.as_slice() {
        return Some("it was issued by another CA");
    }
    if let (Some(ca_id), Some(aki)) = (&ca.key_id, authority_key_id(x509))
        && *ca_id != aki
    {
        return Some("it was issued by another CA key");
    }
    let not_after = x509.validity().not_after.timestamp();
    if not_after
        < now
            .unix_timestamp()
            .saturating_add(RENEW_BEFORE.as_secs() as i64)
    {
        return Some("it expires within 30 days");
    }
    None
}

pub(super) fn issue_client(
    ca: &CertAuthority,
    cn: &str,
    groups: &[String],
    now: OffsetDateTime,
    validity: Duration,
) -> Result<(String, String), PkiError> {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    (params.not_before, params.not_after) = validity_window(now, validity)?;
    let subject = der::encode_name(cn, groups);
    sign_leaf(ca, params, Some(&subject), "a client certificate")
}

/// Signs `params` with a fresh P-256 key, then fixes the names up (see `der`).
fn sign_leaf(
    ca: &CertAuthority,
    mut params: CertificateParams,
    subject_der: Option<&[u8]>,
    what: &'static str,
) -> Result<(String, String), PkiError> {
    let key = generate_key(what)?;
    params.use_authority_key_identifier_extension = true;
    let cert = params
        .signed_by(&key, &ca.issuer)
        .map_err(|source| PkiError::Generate { what, source })?;
    let der = der::rewrite_names(
        cert.der(),
        &ca.subject_der,
        subject_der,
        None,
        ca.issuer.key(),
    )?;
    Ok((der::pem_encode("CERTIFICATE", &der), key.serialize_pem()))
}

fn write_leaf(
    dir: &Path,
    cert_file: &str,
    key_file: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<(), PkiError> {
    // Between these two writes the pair mismatches; read_leaf notices and re-issues, so a
    // crash here heals on the next start.
    files::write_atomic(&dir.join(key_file), key_pem.as_bytes(), files::PRIVATE)?;
    files::write_atomic(&dir.join(cert_file), cert_pem.as_bytes(), files::PUBLIC)
}

fn subject_key_id(x509: &X509Certificate<'_>) -> Option<Vec<u8>> {
    x509.extensions()
        .iter()
        .find_map(|ext| match ext.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
            _ => None,
        })
}

fn authority_key_id(x509: &X509Certificate<'_>) -> Option<Vec<u8>> {
    x509.extensions()
        .iter()
        .find_map(|ext| match ext.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|id| id.0.to_vec())
            }
            _ => None,
        })
}

fn common_name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

pub(super) fn validity_window(
    now: OffsetDateTime,
    validity: Duration,
) -> Result<(OffsetDateTime, OffsetDateTime), PkiError> {
    let too_long = || PkiError::InvalidRequest {
        reason: format!("validity {validity:?} runs past the representable dates"),
    };
    let validity = time::Duration::try_from(validity).map_err(|_| too_long())?;
    let skew = time::Duration::try_from(CLOCK_SKEW).map_err(|_| too_long())?;
    let not_before = now.checked_sub(skew).ok_or_else(too_long)?;
    let not_after = now.checked_add(validity).ok_or_else(too_long)?;
    // X.509 times stop at year 9999.
    if not_after.year() > 9999 {
        return Err(too_long());
    }
    Ok((not_before, not_after))
}

pub(super) fn generate_key(what: &'static str) -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map_err(|source| PkiError::Generate { what, source })
}

/// A private key in PKCS#8, or in the PKCS#1 (`RSA PRIVATE KEY`) and SEC1 (`EC PRIVATE
/// KEY`) forms openssl and kubeadm write, which are re-wrapped as PKCS#8 for the signer.
fn parse_key_pem(path: &Path, pem: &str) -> Result<KeyPair, PkiError> {
    let what = path.display().to_string();
    let key = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|source| PkiError::Pem {
        what: what.clone(),
        source,
    })?;
    let pkcs8 = der::to_pkcs8(&key).map_err(|reason| PkiError::UnsupportedKey {
        what: what.clone(),
        reason,
    })?;
    KeyPair::try_from(&PrivateKeyDer::Pkcs8(pkcs8.into()))
        .map_err(|source| PkiError::InvalidKey { what, source })
}

pub(super) fn parse_cert_pem(what: &str, pem: &str) -> Result<CertificateDer<'static>, PkiError> {
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|source| PkiError::Pem {
        what: what.to_owned(),
        source,
    })
}

fn parse_x509<'a>(what: &str, der: &'a [u8]) -> Result<X509Certificate<'a>, PkiError> {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, cert)| cert)
        .map_err(|e| invalid_cert(what, &e.to_string()))
}

fn invalid_cert(what: &str, reason: &str) -> PkiError {
    PkiError::InvalidCertificate {
        what: what.to_owned(),
        reason: reason.to_owned(),
    }
}
