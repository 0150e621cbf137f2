//! Property tests of PEM, certificate signing request and certificate parsing, which read
//! what clients put in a CertificateSigningRequest: arbitrary bytes and changed valid requests
//! and certificates never panic; a change inside the signed part of a request is refused.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use base64::Engine as _;
use proptest::prelude::*;
use svc_core::Resource;
use svc_core::kinds::CertificateSigningRequest;
use svc_core::kinds::certificate_signing_request::{decode_pem, parse_request};

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(256)
    }
}

/// A P-256 request for CN=jane, O=dev (made with `openssl req -new`).
const CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----
MIHWMH8CAQAwHTENMAsGA1UEAwwEamFuZTEMMAoGA1UECgwDZGV2MFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAEXV8GWyDGsZofosBkDR9HYmLUrohyWUOiXVumbn1e
Nr1YrOGZizjo0T2YEuiIKToqeznzWpCkMUWOKXEYYgHAgaAAMAoGCCqGSM49BAMC
A0cAMEQCIC+iKQ2qKsM0fVHio04EaeRK0pwOosOCuIb12MMcZG/iAiBosN0kL38J
CRRNA+QY24mNPGggp2QaCp+jHhby1GufNw==
-----END CERTIFICATE REQUEST-----
";

/// A self-signed P-256 certificate (`openssl req -x509`).
const CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBbzCCARWgAwIBAgIUI9tAPWgafAWBynduLQKv6wPPdTEwCgYIKoZIzj0EAwIw
DTELMAkGA1UEAwwCY2EwHhcNMjYxMTIzMTgyMzA3WhcNMzYxMTIwMTgyMzA3WjAN
MQswCQYDVQQDDAJjYTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABF1fBlsgxrGa
H6LAZA0fR2Ji1K6IcllDol1bpm59Xja9WKzhmYs46NE9mBLoiCk6Kns581qQpDFF
jilxGGIBwIGjUzBRMB0GA1UdDgQWBBSzloGsUfiO4JyX/oQg989eUlwVdTAfBgNV
HSMEGDAWgBSzloGsUfiO4JyX/oQg989eUlwVdTAPBgNVHRMBAf8EBTADAQH/MAoG
CCqGSM49BAMCA0gAMEUCICkhEDKnerskmAzAHAXdzqapSly9JeD9LvScyIUTjJAd
AiEAv+4PhictYAQdypaO1DqFpfhJs/4WtJRZB5khWREohTw=
-----END CERTIFICATE-----
";

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn der_of(p: &str) -> Vec<u8> {
    decode_pem(p.as_bytes()).unwrap().0.der
}

/// Every parser a CertificateSigningRequest's bytes reach: none may panic, and reading
/// block after block always moves forward.
fn parse_everything(bytes: &[u8]) {
    let _ = parse_request(bytes);
    let mut rest = bytes;
    while let Some((_, after)) = decode_pem(rest) {
        assert!(after.len() < rest.len(), "decode_pem did not move forward");
        rest = after;
    }
    let mut csr = CertificateSigningRequest::default();
    csr.metadata.name = "x".into();
    csr.spec.signer_name = "svc.io/kube-apiserver-client".into();
    csr.spec.usages = vec!["client auth".into()];
    csr.spec.request = bytes.to_vec();
    csr.status.certificate = bytes.to_vec();
    let _ = csr.validate();
}

/// Text around and inside PEM armour.
fn pem_noise() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..400),
        prop::collection::vec(
            prop::sample::select(vec![
                "-----BEGIN ",
                "-----END ",
                "-----",
                "CERTIFICATE",
                "CERTIFICATE REQUEST",
                "\n",
                "\r\n",
                " ",
                "Proc-Type: 4,ENCRYPTED",
                ":",
                "MIIB",
                "AAAA",
                "=",
                "==",
                "\u{0}",
                "é",
            ]),
            0..30,
        )
        .prop_map(|parts| parts.concat().into_bytes()),
        (
            prop::collection::vec(any::<u8>(), 0..200),
            prop::sample::select(vec!["CERTIFICATE", "CERTIFICATE REQUEST"])
        )
            .prop_map(|(der, label)| pem(label, &der).into_bytes()),
    ]
}

fn edits() -> impl Strategy<Value = Vec<(prop::sample::Index, u8)>> {
    prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic_pem_request_or_certificate_parsing(bytes in pem_noise()) {
        parse_everything(&bytes);
    }

    #[test]
    fn changed_pem_text_never_panics(
        which in prop::sample::select(vec![CSR, CERT]),
        edits in edits(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut text = which.as_bytes().to_vec();
        for (i, b) in &edits {
            let at = i.index(text.len());
            text[at] = *b;
        }
        parse_everything(&text);
        parse_everything(&which.as_bytes()[..cut.index(which.len() + 1)]);
    }

    #[test]
    fn changed_der_never_panics_and_changed_signed_bytes_are_refused(
        edits in edits(),
        cut in any::<prop::sample::Index>(),
    ) {
        let der = der_of(CSR);
        let mut changed = der.clone();
        for (i, b) in &edits {
            let at = i.index(changed.len());
            changed[at] = *b;
        }
        let text = pem("CERTIFICATE REQUEST", &changed);
        parse_everything(text.as_bytes());
        // The signed part (certificationRequestInfo) starts after the outer header (3 bytes:
        // 30 81 d6) and is 2 + 0x7f bytes long.
        let signed = 3..3 + 2 + 0x7f;
        if changed[signed.clone()] != der[signed] {
            let r = parse_request(text.as_bytes());
            prop_assert!(r.is_err(), "a request whose signed bytes changed was accepted");
        }
        let short = pem("CERTIFICATE REQUEST", &der[..cut.index(der.len())]);
        prop_assert!(parse_request(short.as_bytes()).is_err());

        let cert = der_of(CERT);
        let mut changed = cert.clone();
        for (i, b) in &edits {
            let at = i.index(changed.len());
            changed[at] = *b;
        }
        parse_everything(pem("CERTIFICATE", &changed).as_bytes());
        parse_everything(pem("CERTIFICATE", &cert[..cut.index(cert.len())]).as_bytes());
    }
}

#[test]
fn the_valid_request_and_certificate_are_accepted() {
    assert_eq!(parse_request(CSR.as_bytes()).unwrap(), der_of(CSR));
    let mut csr = CertificateSigningRequest::default();
    csr.spec.request = CSR.as_bytes().to_vec();
    csr.status.certificate = CERT.as_bytes().to_vec();
    let errs = csr.validate();
    assert!(
        !errs
            .0
            .iter()
            .any(|c| c.field.starts_with("status.certificate")
                || c.field.starts_with("spec.request")),
        "{errs:?}"
    );
}
