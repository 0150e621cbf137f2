//! PEM blocks read the way Go's `encoding/pem.Decode` reads them (text around blocks is
//! skipped, a malformed block is passed over, headers are `Key: Value` lines), and the two
//! X.509 checks CertificateSigningRequest needs: a signed PKCS#10 request, and a chain of
//! certificates. Configuration reads its CA bundles with the same reader.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use x509_parser::prelude::{FromDer as _, X509Certificate, X509CertificationRequest};

const BEGIN: &[u8] = b"-----BEGIN ";
const END: &[u8] = b"\n-----END ";
/// `END` without its newline: how a block without headers may end right after its label.
const END_AT_START: &[u8] = b"-----END ";
const DASHES: &[u8] = b"-----";

/// Go's `base64.StdEncoding`: padding required, stray bits in the last symbol tolerated.
const STD: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::RequireCanonical)
        .with_decode_allow_trailing_bits(true),
);

/// One PEM block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PemBlock {
    /// The type after `BEGIN` (`CERTIFICATE REQUEST`).
    pub label: String,
    /// Whether the block carried RFC 1421 headers (`Proc-Type: ...`).
    pub has_headers: bool,
    pub der: Vec<u8>,
}

/// The first line of `data` without its line ending or trailing blanks, and what follows.
fn line(data: &[u8]) -> (&[u8], &[u8]) {
    let mut parts = data.splitn(2, |&b| b == b'\n');
    let mut l = parts.next().unwrap_or_default();
    let rest = parts.next();
    if rest.is_some() {
        l = l.strip_suffix(b"\r").unwrap_or(l);
    }
    while let [head @ .., b' ' | b'\t'] = l {
        l = head;
    }
    (l, rest.unwrap_or_default())
}

/// `haystack` around the first `needle` (not empty): what is before it and what follows it.
fn split_around<'a>(haystack: &'a [u8], needle: &[u8]) -> Option<(&'a [u8], &'a [u8])> {
    let at = haystack.windows(needle.len()).position(|w| w == needle)?;
    let (before, from) = haystack.split_at_checked(at)?;
    Some((before, from.strip_prefix(needle)?))
}

/// The first well-formed PEM block in `data` and the bytes after it; `None` when there is
/// none (Go's `pem.Decode`).
pub fn decode_pem(data: &[u8]) -> Option<(PemBlock, &[u8])> {
    let mut rest = data;
    loop {
        rest = match rest.strip_prefix(BEGIN) {
            Some(after) => after,
            None => split_around(rest, b"\n-----BEGIN ")?.1,
        };
        let (type_line, after_type) = line(rest);
        rest = after_type;
        let Some(label) = type_line.strip_suffix(DASHES) else {
            continue;
        };
        let mut has_headers = false;
        loop {
            if rest.is_empty() {
                return None;
            }
            let (l, next) = line(rest);
            if !l.contains(&b':') {
                break;
            }
            has_headers = true;
            rest = next;
        }
        // Without headers the END line may follow at once, with no newline before it.
        let (body, trailer) = match rest.strip_prefix(END_AT_START) {
            Some(trailer) if !has_headers => (&[][..], trailer),
            _ => match split_around(rest, END) {
                Some(split) => split,
                None => continue,
            },
        };
        let Some(after_trailer) = trailer
            .strip_prefix(label)
            .and_then(|t| t.strip_prefix(DASHES))
        else {
            continue;
        };
        let (trailer_rest, after) = line(after_trailer);
        if !trailer_rest.is_empty() {
            continue;
        }
        let body: Vec<u8> = body
            .iter()
            .copied()
            .filter(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
            .collect();
        let Ok(der) = STD.decode(&body) else {
            continue;
        };
        let block = PemBlock {
            label: String::from_utf8_lossy(label).into_owned(),
            has_headers,
            der,
        };
        return Some((block, after));
    }
}

/// The DER of the PKCS#10 request in the first PEM block of `pem`, after checking that it
/// parses and that its signature verifies with its own key (Kubernetes' `ParseCSR` and
/// `CheckSignature`).
pub fn parse_request(pem: &[u8]) -> Result<Vec<u8>, String> {
    let block = match decode_pem(pem) {
        Some((b, _)) if b.label == "CERTIFICATE REQUEST" => b,
        _ => return Err("PEM block type must be CERTIFICATE REQUEST".into()),
    };
    let (rest, csr) = X509CertificationRequest::from_der(&block.der)
        .map_err(|e| format!("x509: malformed certificate request: {e}"))?;
    if !rest.is_empty() {
        return Err("x509: trailing data after the certificate request".into());
    }
    csr.verify_signature()
        .map_err(|e| format!("x509: the request's signature does not verify: {e}"))?;
    Ok(block.der)
}

/// Kubernetes' `validateCertificate`: one or more `CERTIFICATE` blocks without headers, each
/// holding DER certificates; text around the blocks is not looked at.
pub(crate) fn validate_certificate(pem: &[u8]) -> Result<(), String> {
    let mut rest = pem;
    let mut blocks = 0usize;
    while let Some((block, after)) = decode_pem(rest) {
        if block.label != "CERTIFICATE" {
            return Err(format!(
                "only CERTIFICATE PEM blocks are allowed, found {:?}",
                block.label
            ));
        }
        if block.has_headers {
            return Err("no PEM block headers are permitted".into());
        }
        blocks = blocks.saturating_add(1);
        let mut der = block.der.as_slice();
        if der.is_empty() {
            return Err("found CERTIFICATE PEM block containing 0 certificates".into());
        }
        while !der.is_empty() {
            let (more, _) = X509Certificate::from_der(der)
                .map_err(|e| format!("x509: malformed certificate: {e}"))?;
            der = more;
        }
        rest = after;
    }
    if blocks == 0 {
        return Err("must contain at least one CERTIFICATE PEM block".into());
    }
    Ok(())
}
