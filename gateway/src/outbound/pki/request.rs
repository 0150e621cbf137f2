//! Certificate signing requests: reading what one asks for, and issuing its certificate from
//! a CA the way Kubernetes' CSR signer does (`authority.PermissiveSigningPolicy`): the
//! request's subject, public key and subject alternative names are kept exactly, the key
//! usages come from the API object's `usages`, every other requested extension is dropped,
//! the certificate is never a CA, and it is backdated five minutes and never outlives the CA.

use std::net::IpAddr;
use std::time::Duration;

use rand::Rng as _;
use rcgen::{
    CertificateParams, CustomExtension, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose,
    SerialNumber,
};
use time::OffsetDateTime;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::{FromDer as _, X509CertificationRequest};

use super::issue::{CertAuthority, generate_key, validity_window};
use super::{PkiError, der};

#[cfg(test)]
mod tests;

/// id-ce-subjectAltName (2.5.29.17) and id-ce-basicConstraints (2.5.29.19).
const OID_SUBJECT_ALT_NAME: &[u64] = &[2, 5, 29, 17];
const OID_BASIC_CONSTRAINTS: &[u64] = &[2, 5, 29, 19];
/// `BasicConstraints ::= SEQUENCE { cA BOOLEAN DEFAULT FALSE, ... }` with cA false: empty.
const NOT_A_CA: &[u8] = &[0x30, 0x00];

/// What a request asks to be certified: the names per-signer rules look at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertificateRequestInfo {
    pub common_name: String,
    /// Every O attribute of the subject, in order.
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub email_addresses: Vec<String>,
    pub uris: Vec<String>,
}

fn invalid(reason: impl Into<String>) -> PkiError {
    PkiError::InvalidRequest {
        reason: reason.into(),
    }
}

/// Parses a DER PKCS#10 request and checks its signature.
fn parse(der: &[u8]) -> Result<X509CertificationRequest<'_>, PkiError> {
    let (_, csr) = X509CertificationRequest::from_der(der)
        .map_err(|e| invalid(format!("malformed certificate request: {e}")))?;
    csr.verify_signature()
        .map_err(|e| invalid(format!("the request's signature does not verify: {e}")))?;
    Ok(csr)
}

/// The subject and alternative names of the DER request `der` (signature checked).
pub fn inspect_request(der: &[u8]) -> Result<CertificateRequestInfo, PkiError> {
    let csr = parse(der)?;
    let subject = &csr.certification_request_info.subject;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        a.as_str().map(str::to_owned).unwrap_or_default()
    };
    let mut info = CertificateRequestInfo {
        common_name: subject
            .iter_common_name()
            .next()
            .map(text)
            .unwrap_or_default(),
        organizations: subject.iter_organization().map(text).collect(),
        ..Default::default()
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        let ParsedExtension::SubjectAlternativeName(san) = ext else {
            continue;
        };
        for name in &san.general_names {
            match name {
                GeneralName::DNSName(d) => info.dns_names.push((*d).to_owned()),
                GeneralName::RFC822Name(e) => info.email_addresses.push((*e).to_owned()),
                GeneralName::URI(u) => info.uris.push((*u).to_owned()),
                GeneralName::IPAddress(raw) => match raw.len() {
                    4 => info
                        .ip_addresses
                        .push(IpAddr::from(<[u8; 4]>::try_from(*raw).unwrap_or_default())),
                    16 => info
                        .ip_addresses
                        .push(IpAddr::from(<[u8; 16]>::try_from(*raw).unwrap_or_default())),
                    n => return Err(invalid(format!("an IP address SAN of {n} bytes"))),
                },
                _ => {}
            }
        }
    }
    Ok(info)
}

/// The key usage bits and extended key usages of the API's usage names (Kubernetes'
/// `keyUsagesFromStrings`); extended usages in Go's `x509.ExtKeyUsage` order.
fn usages_to_x509(
    usages: &[String],
) -> Result<(Vec<KeyUsagePurpose>, Vec<ExtendedKeyUsagePurpose>), PkiError> {
    use ExtendedKeyUsagePurpose as E;
    use KeyUsagePurpose as K;
    let mut bits = Vec::new();
    // (Go's enum position, purpose)
    let mut extended: Vec<(u8, E)> = Vec::new();
    let mut unknown = Vec::new();
    for u in usages {
        let bit = match u.as_str() {
            "signing" | "digital signature" => Some(K::DigitalSignature),
            "content commitment" => Some(K::ContentCommitment),
            "key encipherment" => Some(K::KeyEncipherment),
            "key agreement" => Some(K::KeyAgreement),
            "data encipherment" => Some(K::DataEncipherment),
            "cert sign" => Some(K::KeyCertSign),
            "crl sign" => Some(K::CrlSign),
            "encipher only" => Some(K::EncipherOnly),
            "decipher only" => Some(K::DecipherOnly),
            _ => None,
        };
        let ext = match u.as_str() {
            "any" => Some((0, E::Any)),
            "server auth" => Some((1, E::ServerAuth)),
            "client auth" => Some((2, E::ClientAuth)),
            "code signing" => Some((3, E::CodeSigning)),
            "email protection" | "s/mime" => Some((4, E::EmailProtection)),
            "ipsec end system" => Some((5, E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 5]))),
            "ipsec tunnel" => Some((6, E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 6]))),
            "ipsec user" => Some((7, E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 7]))),
            "timestamping" => Some((8, E::TimeStamping)),
            "ocsp signing" => Some((9, E::OcspSigning)),
            "microsoft sgc" => Some((10, E::Other(vec![1, 3, 6, 1, 4, 1, 311, 10, 3, 3]))),
            "netscape sgc" => Some((11, E::Other(vec![2, 16, 840, 1, 113_730, 4, 1]))),
            _ => None,
        };
        match (bit, ext) {
            (Some(b), _) if !bits.contains(&b) => bits.push(b),
            (Some(_), _) => {}
            (None, Some(e)) if !extended.iter().any(|(i, _)| *i == e.0) => extended.push(e),
            (None, Some(_)) => {}
            (None, None) => unknown.push(u.as_str()),
        }
    }
    if !unknown.is_empty() {
        return Err(invalid(format!("unrecognized usage values: {unknown:?}")));
    }
    extended.sort_by_key(|(i, _)| *i);
    Ok((bits, extended.into_iter().map(|(_, e)| e).collect()))
}

/// Issues the certificate `der` requests, signed by `ca`, valid from five minutes before
/// `now` for `validity` (cut at the CA's own expiry). Returns it as PEM.
pub(super) fn sign_request(
    ca: &CertAuthority,
    der: &[u8],
    usages: &[String],
    now: OffsetDateTime,
    validity: Duration,
) -> Result<String, PkiError> {
    let csr = parse(der)?;
    let info = &csr.certification_request_info;
    let (key_usages, extended_key_usages) = usages_to_x509(usages)?;
    let mut params = CertificateParams::default();
    let mut serial: [u8; 16] = rand::rng().random();
    serial[0] &= 0x7f;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    // Not a CA, written as Go writes it (critical, empty). rcgen's `ExplicitNoCa` would also
    // add a subject key identifier, of the placeholder key: leaves need none.
    params.is_ca = IsCa::NoCa;
    let mut basic = CustomExtension::from_oid_content(OID_BASIC_CONSTRAINTS, NOT_A_CA.to_vec());
    basic.set_criticality(true);
    params.custom_extensions.push(basic);
    params.key_usages = key_usages;
    params.extended_key_usages = extended_key_usages;
    (params.not_before, params.not_after) = validity_window(now, validity)?;
    if params.not_after > ca.not_after {
        params.not_after = ca.not_after;
    }
    // The subject alternative names go through byte for byte, as requested.
    for attr in info.iter_attributes() {
        let ParsedCriAttribute::ExtensionRequest(req) = attr.parsed_attribute() else {
            continue;
        };
        for ext in &req.extensions {
            let oid: Option<Vec<u64>> = ext.oid.iter().map(Iterator::collect);
            if oid.as_deref() == Some(OID_SUBJECT_ALT_NAME) {
                let mut san =
                    CustomExtension::from_oid_content(OID_SUBJECT_ALT_NAME, ext.value.to_vec());
                san.set_criticality(ext.critical);
                params.custom_extensions.push(san);
            }
        }
    }
    params.use_authority_key_identifier_extension = true;
    // rcgen needs a key to build the certificate around; the request's own public key and
    // subject replace the placeholder's below, before the CA signs.
    let placeholder = generate_key("a placeholder key")?;
    let cert = params
        .signed_by(&placeholder, &ca.issuer)
        .map_err(|source| PkiError::Generate {
            what: "a requested certificate",
            source,
        })?;
    let issued = der::rewrite_names(
        cert.der(),
        &ca.subject_der,
        Some(info.subject.as_raw()),
        Some(info.subject_pki.raw),
        ca.issuer.key(),
    )?;
    Ok(der::pem_encode("CERTIFICATE", &issued))
}
