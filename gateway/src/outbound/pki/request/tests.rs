//! Issuing certificates for signing requests: what is kept from the request, what comes
//! from the API object, what is refused, and a signing CA from files in the forms openssl
//! writes, checked by openssl itself.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rcgen::{CertificateParams, DnType, KeyPair, SanType};
use x509_parser::prelude::{FromDer as _, X509Certificate, X509CertificationRequest};

use super::super::*;
use super::inspect_request;

/// `openssl req -new -subj "/O=dev/O=qa/CN=jane"` (P-256): two O attributes, which rcgen
/// cannot write.
const JANE: &str = "-----BEGIN CERTIFICATE REQUEST-----
MIHkMIGMAgEAMCoxDDAKBgNVBAoMA2RldjELMAkGA1UECgwCcWExDTALBgNVBAMM
BGphbmUwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAARxPpT7Z9wSpnULBIoQsPCM
M73NEv9HAYZRBHKceX0Bf11VwT+OQcTeyuhc/d3lXm1yurVcZZmeAu7WXzQcGMWF
oAAwCgYIKoZIzj0EAwIDRwAwRAIgJ+u68srrxJYQ2xOv2JPEJ0eJwC+/iCSiXUIp
DaAryAUCIEDgpIihH8r7FwbgT9/CUyc1nUEjTcKF6xq8TyQRPs2e
-----END CERTIFICATE REQUEST-----
";

fn request_der(pem: &str) -> Vec<u8> {
    svc_core::kinds::certificate_signing_request::parse_request(pem.as_bytes()).unwrap()
}

fn pki(dir: &Path, signing: Option<SigningFiles>) -> Pki {
    let opts = PkiOptions {
        tls_sans: vec![],
        admin_kubeconfig_path: dir.join("admin.kubeconfig"),
        server_url: "https://127.0.0.1:6443".into(),
        cluster_signing: signing,
    };
    ensure_pki(&dir.join("pki"), &opts).unwrap()
}

fn usages(u: &[&str]) -> Vec<String> {
    u.iter().map(|s| s.to_string()).collect()
}

fn cert_der(pem: &str) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject as _;
    rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

#[test]
fn issued_certificates_keep_the_request_and_take_the_usages() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = pki(tmp.path(), None);
    let der = request_der(JANE);
    let pem = pki
        .sign_request(
            &der,
            &usages(&["client auth", "digital signature", "key encipherment"]),
            Duration::from_secs(3600),
        )
        .unwrap();
    let issued = cert_der(&pem);
    let (_, cert) = X509Certificate::from_der(&issued).unwrap();
    let (_, csr) = X509CertificationRequest::from_der(&der).unwrap();
    let ca_der = cert_der(pki.ca_pem());
    let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();

    assert_eq!(
        cert.subject().as_raw(),
        csr.certification_request_info.subject.as_raw()
    );
    assert_eq!(
        cert.public_key().raw,
        csr.certification_request_info.subject_pki.raw
    );
    assert_eq!(cert.issuer().as_raw(), ca.subject().as_raw());
    cert.verify_signature(Some(ca.public_key())).unwrap();
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && ku.key_encipherment() && !ku.key_cert_sign());
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && !eku.server_auth);
    let bc = cert.basic_constraints().unwrap().unwrap();
    assert!(bc.critical && !bc.value.ca);
    // No key identifier of the key rcgen built the certificate around.
    assert!(
        cert.iter_extensions()
            .all(|e| e.oid.to_id_string() != "2.5.29.14")
    );
    let (not_before, not_after) = (
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
    );
    assert_eq!(
        not_after - not_before,
        3600 + 300,
        "an hour, backdated five minutes"
    );

    // The certificate's user is the request's: CN, and every O as a group.
    let user = user_from_client_cert(&issued).unwrap();
    assert_eq!(user.username, "jane");
    assert_eq!(user.groups, ["dev", "qa", "system:authenticated"]);
}

#[test]
fn alternative_names_go_through_and_bad_input_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = pki(tmp.path(), None);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "system:node:n1");
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params.subject_alt_names = vec![
        SanType::DnsName("n1.example".try_into().unwrap()),
        SanType::IpAddress("10.0.0.7".parse().unwrap()),
    ];
    let der = params.serialize_request(&key).unwrap().der().to_vec();
    let info = inspect_request(&der).unwrap();
    assert_eq!(info.common_name, "system:node:n1");
    assert_eq!(info.organizations, ["system:nodes"]);
    assert_eq!(info.dns_names, ["n1.example"]);
    assert_eq!(
        info.ip_addresses,
        ["10.0.0.7".parse::<std::net::IpAddr>().unwrap()]
    );

    let pem = pki
        .sign_request(
            &der,
            &usages(&["digital signature", "server auth"]),
            Duration::from_secs(86_400),
        )
        .unwrap();
    let issued = cert_der(&pem);
    let (_, cert) = X509Certificate::from_der(&issued).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    assert_eq!(san.general_names.len(), 2);
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && !eku.client_auth);

    let e = pki
        .sign_request(&der, &usages(&["telepathy"]), Duration::from_secs(600))
        .unwrap_err();
    assert!(e.to_string().contains("unrecognized usage"), "{e}");
    let mut tampered = der.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    assert!(
        pki.sign_request(
            &tampered,
            &usages(&["client auth"]),
            Duration::from_secs(600)
        )
        .is_err()
    );
    assert!(inspect_request(b"not der").is_err());
    assert!(
        pki.sign_request(&der, &usages(&["client auth"]), Duration::ZERO)
            .is_err()
    );
}

/// Runs openssl with `args` in `dir`, asserting it succeeds.
fn openssl(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl is installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_signing_ca_from_files_in_pkcs1_and_sec1_form_issues() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // RSA in PKCS#1 (`BEGIN RSA PRIVATE KEY`, as kubeadm writes it) and EC in SEC1.
    openssl(d, &["genrsa", "-traditional", "-out", "rsa.key", "2048"]);
    openssl(
        d,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "ec.key",
        ],
    );
    for (key, cn) in [("rsa.key", "rsa-signer"), ("ec.key", "ec-signer")] {
        let crt = format!("{cn}.crt");
        let subj = format!("/CN={cn}");
        openssl(
            d,
            &[
                "req", "-x509", "-key", key, "-subj", &subj, "-days", "2", "-out", &crt,
            ],
        );
        let head = std::fs::read_to_string(d.join(key)).unwrap();
        assert!(
            head.starts_with("-----BEGIN RSA PRIVATE KEY")
                || head.starts_with("-----BEGIN EC PRIVATE KEY")
        );

        let pki = pki(
            &d.join(cn),
            Some(SigningFiles {
                cert_file: d.join(&crt),
                key_file: d.join(key),
            }),
        );
        assert_eq!(
            pki.signing_ca_pem(),
            std::fs::read_to_string(d.join(&crt)).unwrap()
        );
        let pem = pki
            .sign_request(
                &request_der(JANE),
                &usages(&["client auth"]),
                Duration::from_secs(8760 * 3600),
            )
            .unwrap();
        std::fs::write(d.join("issued.crt"), &pem).unwrap();
        let verified = openssl(d, &["verify", "-CAfile", &crt, "issued.crt"]);
        assert!(verified.contains("issued.crt: OK"), "{verified}");
        // Never past the CA's own end (two days), whatever was asked.
        let (issued, signer) = (cert_der(&pem), cert_der(pki.signing_ca_pem()));
        let (_, cert) = X509Certificate::from_der(&issued).unwrap();
        let (_, ca) = X509Certificate::from_der(&signer).unwrap();
        assert_eq!(cert.validity().not_after, ca.validity().not_after);
        // The cluster CA still signs everything else.
        assert_ne!(pki.ca_pem(), pki.signing_ca_pem());
    }

    // Missing files are an error at start, not later.
    let missing = ensure_pki(
        &d.join("other").join("pki"),
        &PkiOptions {
            tls_sans: vec![],
            admin_kubeconfig_path: d.join("other").join("admin.kubeconfig"),
            server_url: "https://127.0.0.1:6443".into(),
            cluster_signing: Some(SigningFiles {
                cert_file: d.join("nope.crt"),
                key_file: d.join("rsa.key"),
            }),
        },
    );
    assert!(missing.is_err());
}
