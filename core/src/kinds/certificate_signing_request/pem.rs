//! PEM blocks read the way Go's `encoding/pem.Decode` reads them (text around blocks is
//! skipped, a malformed block is passed over, headers are `Key: Value` lines), and the two
//! X.509 checks the kind needs: a signed PKCS#10 request, and a chain of certificates.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use x509_parser::prelude::{FromDer as _, X509Certificate, X509CertificationRequest};

const BEGIN: &[u8] = b"-----BEGIN ";
const END: &[u8] = b"\n-----END ";
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
    let (mut end, rest) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (i, &data[i + 1..]),
        None => (data.len(), &data[data.len()..]),
    };
    if end > 0 && data[end - 1] == b'\r' && end < data.len() {
        end -= 1;
    }
    let mut l = &data[..end];
    while let [head @ .., b' ' | b'\t'] = l {
        l = head;
    }
    (l, rest)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The first well-formed PEM block in `data` and the bytes after it; `None` when there is
/// none (Go's `pem.Decode`).
pub fn decode_pem(data: &[u8]) -> Option<(PemBlock, &[u8])> {
    let mut rest = data;
    loop {
        if rest.starts_with(BEGIN) {
            rest = &rest[BEGIN.len()..];
        } else {
            let at = find(rest, b"\n-----BEGIN ")?;
            rest = &rest[at + 1 + BEGIN.len()..];
        }
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
        let (end_at, trailer_at) = if !has_headers && rest.starts_with(&END[1..]) {
            (0, END.len() - 1)
        } else {
            match find(rest, END) {
                Some(i) => (i, i + END.len()),
                None => continue,
            }
        };
        let trailer = &rest[trailer_at..];
        let trailer_len = label.len() + DASHES.len();
        if trailer.len() < trailer_len
            || !trailer[..trailer_len].starts_with(label)
            || !trailer[..trailer_len].ends_with(DASHES)
            || !line(&trailer[trailer_len..]).0.is_empty()
        {
            continue;
        }
        let body: Vec<u8> = rest[..end_at]
            .iter()
            .copied()
            .filter(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
            .collect();
        let Ok(der) = STD.decode(&body) else {
            continue;
        };
        let (_, after) = line(&rest[trailer_at + trailer_len..]);
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
pub(super) fn validate_certificate(pem: &[u8]) -> Result<(), String> {
    let mut rest = pem;
    let mut blocks = 0;
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
        blocks += 1;
        let mut der = &block.der[..];
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
