//! Minimal DER surgery on certificates rcgen produced, then re-signed with the CA key.
//!
//! Two reasons it exists: rcgen 0.14 keeps one value per attribute type in a name
//! (rustls/rcgen#81), but Kubernetes puts each group in its own O attribute; and verifiers
//! match a certificate's issuer to its CA's subject byte for byte, which copying the CA's
//! raw subject guarantees whatever encoding the CA certificate uses. A certificate issued for
//! a signing request takes the request's subject and public key the same way. Private keys
//! in PKCS#1 or SEC1 form are re-wrapped as PKCS#8, the one form the crypto provider loads.

use base64::Engine as _;
use rcgen::{KeyPair, SigningKey as _};
use rustls_pki_types::PrivateKeyDer;

use super::PkiError;

const TAG_BIT_STRING: u8 = 0x03;
const TAG_INTEGER: u8 = 0x02;
const TAG_UTF8_STRING: u8 = 0x0c;
const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
/// `[0] EXPLICIT Version` at the start of a TBSCertificate.
const TAG_VERSION: u8 = 0xa0;

/// id-at-commonName (2.5.4.3) and id-at-organizationName (2.5.4.10), DER encoded.
const OID_COMMON_NAME: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x03];
const OID_ORGANIZATION: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x0a];

/// Encodes `O=<org>, ..., CN=<cn>` as an X.501 Name, one attribute per RDN, in the order Go's
/// crypto/x509 writes them.
pub(super) fn encode_name(common_name: &str, organizations: &[String]) -> Vec<u8> {
    let mut rdns = Vec::new();
    for org in organizations {
        rdns.extend(attribute(OID_ORGANIZATION, org));
    }
    rdns.extend(attribute(OID_COMMON_NAME, common_name));
    tlv(TAG_SEQUENCE, &rdns)
}

fn attribute(oid: &[u8], value: &str) -> Vec<u8> {
    let mut type_and_value = oid.to_vec();
    type_and_value.extend(tlv(TAG_UTF8_STRING, value.as_bytes()));
    tlv(TAG_SET, &tlv(TAG_SEQUENCE, &type_and_value))
}

/// Replaces the issuer (and, when given, the subject and the subjectPublicKeyInfo) of
/// `cert_der` and signs the new TBSCertificate with `signer`, keeping everything else as
/// rcgen wrote it. A certificate for a signing request gets the request's own subject and
/// key this way, whatever their encoding or algorithm.
pub(super) fn rewrite_names(
    cert_der: &[u8],
    issuer: &[u8],
    subject: Option<&[u8]>,
    spki: Option<&[u8]>,
    signer: &KeyPair,
) -> Result<Vec<u8>, PkiError> {
    let malformed = |reason| PkiError::Encode {
        what: "an issued certificate",
        reason,
    };
    let (cert, _) = split_tlv(cert_der, TAG_SEQUENCE).map_err(malformed)?;
    let (tbs, rest) = split_tlv(cert.content, TAG_SEQUENCE).map_err(malformed)?;
    let (signature_algorithm, _) = split_tlv(rest, TAG_SEQUENCE).map_err(malformed)?;

    // TBSCertificate ::= SEQUENCE { [0] version, serialNumber, signature, issuer, validity,
    //                               subject, subjectPublicKeyInfo, extensions... }
    let mut input = tbs.content;
    let mut new_tbs = Vec::with_capacity(tbs.content.len().saturating_add(64));
    if input.first() == Some(&TAG_VERSION) {
        let (version, rest) = split_tlv(input, TAG_VERSION).map_err(malformed)?;
        new_tbs.extend_from_slice(version.raw);
        input = rest;
    }
    let (serial, rest) = split_tlv(input, TAG_INTEGER).map_err(malformed)?;
    let (signature, rest) = split_tlv(rest, TAG_SEQUENCE).map_err(malformed)?;
    let (_old_issuer, rest) = split_tlv(rest, TAG_SEQUENCE).map_err(malformed)?;
    let (validity, rest) = split_tlv(rest, TAG_SEQUENCE).map_err(malformed)?;
    let (old_subject, rest) = split_tlv(rest, TAG_SEQUENCE).map_err(malformed)?;
    let (old_spki, rest) = split_tlv(rest, TAG_SEQUENCE).map_err(malformed)?;
    new_tbs.extend_from_slice(serial.raw);
    new_tbs.extend_from_slice(signature.raw);
    new_tbs.extend_from_slice(issuer);
    new_tbs.extend_from_slice(validity.raw);
    new_tbs.extend_from_slice(subject.unwrap_or(old_subject.raw));
    new_tbs.extend_from_slice(spki.unwrap_or(old_spki.raw));
    new_tbs.extend_from_slice(rest);
    let new_tbs = tlv(TAG_SEQUENCE, &new_tbs);

    let signature = signer.sign(&new_tbs).map_err(|source| PkiError::Generate {
        what: "a certificate signature",
        source,
    })?;
    let mut bits = Vec::with_capacity(signature.len().saturating_add(1));
    bits.push(0); // no unused bits in the last byte
    bits.extend(signature);

    let mut body = new_tbs;
    body.extend_from_slice(signature_algorithm.raw);
    body.extend(tlv(TAG_BIT_STRING, &bits));
    Ok(tlv(TAG_SEQUENCE, &body))
}

/// rsaEncryption (1.2.840.113549.1.1.1) and id-ecPublicKey (1.2.840.10045.2.1), DER encoded.
const OID_RSA_ENCRYPTION: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
];
const OID_EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const TAG_NULL: u8 = 0x05;
const TAG_OCTET_STRING: u8 = 0x04;
/// `[0] EXPLICIT ECParameters` inside a SEC1 ECPrivateKey.
const TAG_EC_PARAMETERS: u8 = 0xa0;

/// A private key as PKCS#8 (`PrivateKeyInfo`), the one form the crypto provider loads:
/// PKCS#8 as is, PKCS#1 RSA and SEC1 EC keys wrapped with their algorithm (RFC 5208).
pub(super) fn to_pkcs8(key: &PrivateKeyDer<'_>) -> Result<Vec<u8>, &'static str> {
    let algorithm = match key {
        PrivateKeyDer::Pkcs8(k) => return Ok(k.secret_pkcs8_der().to_vec()),
        PrivateKeyDer::Pkcs1(_) => {
            let mut alg = OID_RSA_ENCRYPTION.to_vec();
            alg.extend(tlv(TAG_NULL, &[]));
            alg
        }
        PrivateKeyDer::Sec1(k) => {
            // ECPrivateKey ::= SEQUENCE { version, privateKey, [0] parameters, [1] publicKey }
            let (seq, _) = split_tlv(k.secret_sec1_der(), TAG_SEQUENCE)?;
            let (_, rest) = split_tlv(seq.content, TAG_INTEGER)?;
            let (_, rest) = split_tlv(rest, TAG_OCTET_STRING)?;
            let (params, _) =
                split_tlv(rest, TAG_EC_PARAMETERS).map_err(|_| "an EC key without its curve")?;
            let mut alg = OID_EC_PUBLIC_KEY.to_vec();
            alg.extend_from_slice(params.content);
            alg
        }
        _ => return Err("an unknown private key format"),
    };
    let mut info = tlv(TAG_INTEGER, &[0]);
    info.extend(tlv(TAG_SEQUENCE, &algorithm));
    info.extend(tlv(TAG_OCTET_STRING, key.secret_der()));
    Ok(tlv(TAG_SEQUENCE, &info))
}

/// PEM with 64-column lines, as openssl and Go write it.
pub(super) fn pem_encode(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    // base64 output is ASCII, so splitting bytes never splits a character.
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

pub(super) fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len().saturating_add(6));
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        let significant = bytes.get(skip..).unwrap_or_default();
        out.push(0x80 | significant.len() as u8);
        out.extend_from_slice(significant);
    }
    out.extend_from_slice(content);
    out
}

struct Tlv<'a> {
    /// Header and content.
    raw: &'a [u8],
    content: &'a [u8],
}

/// Splits one definite-length element with tag `expected` off the front of `input`.
fn split_tlv(input: &[u8], expected: u8) -> Result<(Tlv<'_>, &[u8]), &'static str> {
    let (&tag, after_tag) = input.split_first().ok_or("truncated element")?;
    if tag != expected {
        return Err("unexpected element");
    }
    let (&first, after_len) = after_tag.split_first().ok_or("truncated length")?;
    let (len, header_len) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return Err("unsupported length encoding");
        }
        let len_bytes = after_len.get(..count).ok_or("truncated length")?;
        let len = len_bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, 2 + count)
    };
    let end = header_len.checked_add(len).ok_or("length overflow")?;
    let raw = input.get(..end).ok_or("truncated content")?;
    let content = raw.get(header_len..).ok_or("truncated content")?;
    let rest = input.get(end..).ok_or("truncated content")?;
    Ok((Tlv { raw, content }, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer as _;

    #[test]
    fn lengths_round_trip_through_split() {
        for len in [0usize, 1, 127, 128, 255, 256, 70_000] {
            let content = vec![7u8; len];
            let encoded = tlv(TAG_SEQUENCE, &content);
            let (parsed, rest) = split_tlv(&encoded, TAG_SEQUENCE).unwrap();
            assert_eq!(parsed.content, content.as_slice());
            assert_eq!(parsed.raw, encoded.as_slice());
            assert!(rest.is_empty());
        }
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        for bad in [
            &[][..],
            &[0x30],
            &[0x30, 0x05, 0x01],
            &[0x30, 0x80],
            &[0x30, 0x85, 1, 1, 1, 1, 1],
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
            &[0x31, 0x00],
        ] {
            assert!(split_tlv(bad, TAG_SEQUENCE).is_err(), "{bad:?}");
        }
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        assert!(rewrite_names(&[0x30, 0x03, 0x02, 0x01, 0x00], &[], None, None, &key).is_err());
    }

    #[test]
    fn name_parses_with_every_group() {
        let name = encode_name("jane", &["a".into(), "b:c".into(), "ü".into()]);
        let (_, parsed) = x509_parser::x509::X509Name::from_der(&name).unwrap();
        let orgs: Vec<_> = parsed
            .iter_organization()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert_eq!(orgs, ["a", "b:c", "ü"]);
        let cn = parsed.iter_common_name().next().unwrap().as_str().unwrap();
        assert_eq!(cn, "jane");
    }
}
