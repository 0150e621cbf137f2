//! PKI tests: files on disk, reuse and repair across starts, concurrent starts, the
//! kubeconfig, and real TLS handshakes over loopback.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::san::{SanName, sans_of};
use super::*;

/// The server shares one `Pki` across connection tasks.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<Pki>();
};

fn options(dir: &Path, tls_sans: &[&str]) -> PkiOptions {
    PkiOptions {
        tls_sans: tls_sans.iter().map(|s| s.to_string()).collect(),
        admin_kubeconfig_path: dir.join("admin.kubeconfig"),
        server_url: "https://127.0.0.1:6443".into(),
        cluster_signing: None,
    }
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap()
}

fn der_of(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

fn serving_sans(dir: &Path) -> Vec<SanName> {
    let der = der_of(&read(dir, SERVING_CERT_FILE));
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    sans_of(&cert)
}

fn san(s: &str) -> SanName {
    SanName::parse(s).unwrap().unwrap()
}

#[test]
fn first_start_creates_every_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    let pki = ensure_pki(&dir, &options(tmp.path(), &[])).unwrap();

    for (file, mode) in [
        (CA_CERT_FILE, 0o644),
        (CA_KEY_FILE, 0o600),
        (SERVING_CERT_FILE, 0o644),
        (SERVING_KEY_FILE, 0o600),
        (ADMIN_CERT_FILE, 0o644),
        (ADMIN_KEY_FILE, 0o600),
        (SA_KEY_FILE, 0o600),
        (SA_PUB_FILE, 0o644),
    ] {
        let meta = std::fs::metadata(dir.join(file)).unwrap();
        // The umask may only take bits away; private files must never gain any.
        assert_eq!(meta.permissions().mode() & 0o777 & !mode, 0, "{file}");
    }
    let kubeconfig = tmp.path().join("admin.kubeconfig");
    assert_eq!(
        std::fs::metadata(&kubeconfig).unwrap().permissions().mode() & 0o077,
        0
    );
    assert_eq!(pki.ca_pem(), read(&dir, CA_CERT_FILE));

    let ca_der = der_of(pki.ca_pem());
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    assert!(ca.is_ca());
    let cn = ca.subject().iter_common_name().next().unwrap();
    assert_eq!(cn.as_str().unwrap(), "svc-ca");
    let lifetime = ca.validity().not_after.timestamp() - ca.validity().not_before.timestamp();
    assert!(lifetime >= CA_VALIDITY.as_secs() as i64);

    let sans = serving_sans(&dir);
    for wanted in ["127.0.0.1", "::1", "localhost"] {
        assert!(sans.contains(&san(wanted)), "{wanted} in {sans:?}");
    }

    let admin = user_from_client_cert(&der_of(pki.admin_credentials().0)).unwrap();
    assert_eq!(admin.username, "admin");
    assert_eq!(admin.groups, ["system:masters", "system:authenticated"]);

    let sa = KeyPair::from_pem(pki.sa_signing_key_pem()).unwrap();
    assert_eq!(sa.algorithm(), &PKCS_ECDSA_P256_SHA256);
    assert!(read(&dir, SA_KEY_FILE).starts_with("-----BEGIN PRIVATE KEY-----"));
    assert_eq!(read(&dir, SA_PUB_FILE), sa.public_key_pem());
    assert!(
        pki.sa_public_key_pem()
            .starts_with("-----BEGIN PUBLIC KEY-----")
    );
}

#[test]
fn later_starts_reuse_files_and_rewrite_a_missing_kubeconfig() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let opts = options(dir, &[]);
    ensure_pki(dir, &opts).unwrap();
    let before: Vec<String> = [
        CA_CERT_FILE,
        SERVING_CERT_FILE,
        ADMIN_CERT_FILE,
        SA_KEY_FILE,
    ]
    .iter()
    .map(|f| read(dir, f))
    .collect();

    std::fs::remove_file(&opts.admin_kubeconfig_path).unwrap();
    let pki = ensure_pki(dir, &opts).unwrap();
    let after: Vec<String> = [
        CA_CERT_FILE,
        SERVING_CERT_FILE,
        ADMIN_CERT_FILE,
        SA_KEY_FILE,
    ]
    .iter()
    .map(|f| read(dir, f))
    .collect();
    assert_eq!(before, after);
    assert_eq!(pki.ca_pem(), before[0]);
    assert!(opts.admin_kubeconfig_path.exists());
}

#[test]
fn a_new_tls_san_reissues_only_the_serving_cert() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ensure_pki(dir, &options(dir, &[])).unwrap();
    let ca = read(dir, CA_CERT_FILE);
    let serving = read(dir, SERVING_CERT_FILE);
    let admin = read(dir, ADMIN_CERT_FILE);

    let pki = ensure_pki(dir, &options(dir, &["10.1.2.3", "API.Example.com", " "])).unwrap();
    let reissued = read(dir, SERVING_CERT_FILE);
    assert_ne!(reissued, serving);
    assert_eq!(pki.serving_cert_pem(), reissued);
    assert_eq!(read(dir, CA_CERT_FILE), ca);
    assert_eq!(read(dir, ADMIN_CERT_FILE), admin);
    let sans = serving_sans(dir);
    for wanted in [
        "10.1.2.3",
        "api.example.com",
        "127.0.0.1",
        "::1",
        "localhost",
    ] {
        assert!(sans.contains(&san(wanted)), "{wanted} in {sans:?}");
    }

    // Names already covered, or dropped from the flags, need no new certificate.
    ensure_pki(dir, &options(dir, &["api.example.com"])).unwrap();
    ensure_pki(dir, &options(dir, &[])).unwrap();
    assert_eq!(read(dir, SERVING_CERT_FILE), reissued);
}

#[test]
fn damaged_leaves_are_reissued_but_a_ca_without_key_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let opts = options(dir, &[]);
    ensure_pki(dir, &opts).unwrap();
    let ca = read(dir, CA_CERT_FILE);

    std::fs::write(dir.join(SERVING_CERT_FILE), "garbage").unwrap();
    std::fs::remove_file(dir.join(ADMIN_KEY_FILE)).unwrap();
    let pki = ensure_pki(dir, &opts).unwrap();
    assert_eq!(pki.ca_pem(), ca);
    assert!(read(dir, SERVING_CERT_FILE).starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(pki.server_config().is_ok());
    // A re-issued admin certificate makes the old kubeconfig stale, so it is rewritten.
    let kubeconfig = std::fs::read_to_string(&opts.admin_kubeconfig_path).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    assert!(kubeconfig.contains(&b64.encode(pki.admin_credentials().0)));

    std::fs::remove_file(dir.join(CA_KEY_FILE)).unwrap();
    let err = ensure_pki(dir, &opts).unwrap_err();
    assert!(matches!(err, PkiError::MissingCaKey { .. }), "{err}");

    // Removing the CA certificate too starts over; leaves from the old CA (same subject
    // name, other key) must not survive, or clients trusting the new CA would fail.
    let serving = read(dir, SERVING_CERT_FILE);
    let admin = read(dir, ADMIN_CERT_FILE);
    std::fs::remove_file(dir.join(CA_CERT_FILE)).unwrap();
    let pki = ensure_pki(dir, &opts).unwrap();
    assert_ne!(pki.ca_pem(), ca);
    assert_ne!(read(dir, SERVING_CERT_FILE), serving);
    assert_ne!(read(dir, ADMIN_CERT_FILE), admin);
    let kubeconfig = std::fs::read_to_string(&opts.admin_kubeconfig_path).unwrap();
    assert!(kubeconfig.contains(&b64.encode(pki.ca_pem())));
}

#[test]
fn bad_input_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let err = ensure_pki(dir, &options(dir, &["bad name!"])).unwrap_err();
    assert!(matches!(err, PkiError::InvalidSan { .. }), "{err}");

    let pki = ensure_pki(dir, &options(dir, &[])).unwrap();
    assert!(
        pki.issue_client_cert("", &[], Duration::from_secs(60))
            .is_err()
    );
    assert!(pki.issue_client_cert("u", &[], Duration::ZERO).is_err());
    assert!(pki.issue_client_cert("u", &[], Duration::MAX).is_err());
    assert!(pki.client_config_for(Some(("nope", "nope")), &[]).is_err());

    assert_eq!(user_from_client_cert(b"not a certificate"), None);
    assert_eq!(user_from_client_cert(&[]), None);
}

#[test]
fn concurrent_first_starts_share_one_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let opts = options(&dir, &[]);
    let results: Vec<Result<Pki, PkiError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| ensure_pki(&dir, &opts)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let cas: Vec<String> = results
        .into_iter()
        .map(|r| r.unwrap().ca_pem().to_owned())
        .collect();
    assert!(cas.iter().all(|ca| *ca == cas[0]));
    assert_eq!(cas[0], read(&dir, CA_CERT_FILE));
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn kubeconfig_has_the_kubectl_structure() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let opts = options(dir, &[]);
    let pki = ensure_pki(dir, &opts).unwrap();
    let text = std::fs::read_to_string(&opts.admin_kubeconfig_path).unwrap();
    let parsed: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    check_kubeconfig(&pki, &parsed);

    // kubectl is the real judge; it is not on every machine, so only use it when present.
    let Ok(output) = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&opts.admin_kubeconfig_path)
        .args(["config", "view", "--raw", "-o", "json"])
        .output()
    else {
        eprintln!("kubectl not found; checked the kubeconfig structurally only");
        return;
    };
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let viewed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    check_kubeconfig(&pki, &viewed);
}

fn check_kubeconfig(pki: &Pki, config: &serde_json::Value) {
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let (cert, key) = pki.admin_credentials();
    assert_eq!(config["apiVersion"], "v1");
    assert_eq!(config["kind"], "Config");
    assert_eq!(config["current-context"], "admin@svc");
    let cluster = &config["clusters"][0];
    assert_eq!(cluster["name"], "svc");
    assert_eq!(cluster["cluster"]["server"], "https://127.0.0.1:6443");
    assert_eq!(
        cluster["cluster"]["certificate-authority-data"],
        b64(pki.ca_pem())
    );
    let user = &config["users"][0];
    assert_eq!(user["name"], "admin");
    assert_eq!(user["user"]["client-certificate-data"], b64(cert));
    assert_eq!(user["user"]["client-key-data"], b64(key));
    let context = &config["contexts"][0];
    assert_eq!(context["name"], "admin@svc");
    assert_eq!(context["context"]["cluster"], "svc");
    assert_eq!(context["context"]["user"], "admin");
}

#[test]
fn client_certs_carry_every_group() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = ensure_pki(tmp.path(), &options(tmp.path(), &[])).unwrap();
    let groups = [
        "dev".to_owned(),
        "ops".to_owned(),
        "system:nodes".to_owned(),
    ];
    let (cert, key) = pki
        .issue_client_cert("system:node:n1", &groups, Duration::from_secs(3600))
        .unwrap();
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
    let user = user_from_client_cert(&der_of(&cert)).unwrap();
    assert_eq!(
        user,
        UserInfo {
            username: "system:node:n1".into(),
            uid: String::new(),
            groups: vec![
                "dev".into(),
                "ops".into(),
                "system:nodes".into(),
                "system:authenticated".into()
            ],
            extra: [(
                CREDENTIAL_ID_KEY.to_string(),
                vec![format!("X509SHA256={}", sha256_hex(&der_of(&cert)))]
            )]
            .into_iter()
            .collect(),
        }
    );
    let json = serde_json::to_value(&user).unwrap();
    assert_eq!(json["username"], "system:node:n1");
    assert_eq!(json["groups"][3], "system:authenticated");
    let back: UserInfo = serde_json::from_value(json).unwrap();
    assert_eq!(back, user);
}

/// What the server saw of a successful handshake.
struct ServerView {
    peer: Option<Vec<CertificateDer<'static>>>,
    alpn: Option<Vec<u8>>,
}

/// What each side saw of one handshake plus a two-byte exchange.
struct Handshake {
    server: std::io::Result<ServerView>,
    /// ALPN protocol the client saw, or its error.
    client: std::io::Result<Option<Vec<u8>>>,
}

async fn handshake(
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    server_name: &str,
) -> Handshake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = TlsAcceptor::from(server);
    let server_side = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await?;
        let mut tls = acceptor.accept(tcp).await?;
        let (_, conn) = tls.get_ref();
        let peer = conn.peer_certificates().map(<[_]>::to_vec);
        let alpn = conn.alpn_protocol().map(<[u8]>::to_vec);
        tls.write_all(b"ok").await?;
        tls.shutdown().await?;
        Ok(ServerView { peer, alpn })
    });
    let name = ServerName::try_from(server_name.to_owned()).unwrap();
    let client = async {
        let tcp = TcpStream::connect(addr).await?;
        let mut tls = TlsConnector::from(client).connect(name, tcp).await?;
        // With TLS 1.3 the server judges the client certificate after the client thinks
        // the handshake is done; reading surfaces a rejection.
        let mut buf = [0u8; 2];
        tls.read_exact(&mut buf).await?;
        Ok(tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
    };
    let outcome = tokio::time::timeout(Duration::from_secs(20), async {
        let client = client.await;
        let server = server_side.await.unwrap();
        Handshake { server, client }
    });
    outcome.await.unwrap()
}

#[tokio::test]
async fn tls_identifies_the_admin_and_negotiates_h2() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = ensure_pki(tmp.path(), &options(tmp.path(), &[])).unwrap();
    let client = pki
        .client_config_for(Some(pki.admin_credentials()), &[b"h2", b"http/1.1"])
        .unwrap();
    let result = handshake(pki.server_config().unwrap().0, client, "localhost").await;
    let ServerView { peer, alpn } = result.server.unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(result.client.unwrap().as_deref(), Some(&b"h2"[..]));
    let peer = peer.expect("the admin certificate reaches the server");
    let user = user_from_client_cert(&peer[0]).unwrap();
    assert_eq!(user.username, "admin");
    assert_eq!(user.groups, ["system:masters", "system:authenticated"]);
}

#[tokio::test]
async fn tls_without_a_client_cert_still_connects() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = ensure_pki(tmp.path(), &options(tmp.path(), &[])).unwrap();
    let client = pki.client_config_for(None, &[b"http/1.1"]).unwrap();
    let result = handshake(pki.server_config().unwrap().0, client, "127.0.0.1").await;
    let ServerView { peer, alpn } = result.server.unwrap();
    assert!(peer.is_none());
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert!(result.client.is_ok());
}

#[tokio::test]
async fn tls_accepts_issued_multi_group_certs() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = ensure_pki(tmp.path(), &options(tmp.path(), &["::1"])).unwrap();
    let groups = ["a".to_owned(), "b".to_owned()];
    let (cert, key) = pki
        .issue_client_cert("jane", &groups, Duration::from_secs(600))
        .unwrap();
    let client = pki.client_config_for(Some((&cert, &key)), &[]).unwrap();
    let result = handshake(pki.server_config().unwrap().0, client, "localhost").await;
    let ServerView { peer, alpn } = result.server.unwrap();
    assert_eq!(alpn, None);
    let user = user_from_client_cert(&peer.unwrap()[0]).unwrap();
    assert_eq!(user.groups, ["a", "b", "system:authenticated"]);
}

#[tokio::test]
async fn a_cert_from_another_ca_gets_through_the_handshake_and_authenticates_nobody() {
    let tmp = tempfile::tempdir().unwrap();
    let ours = tmp.path().join("ours");
    let theirs = tmp.path().join("theirs");
    let pki = ensure_pki(&ours, &options(&ours, &[])).unwrap();
    let other = ensure_pki(&theirs, &options(&theirs, &[])).unwrap();
    let (cert, key) = other
        .issue_client_cert(
            "mallory",
            &["system:masters".into()],
            Duration::from_secs(600),
        )
        .unwrap();
    // Trusts our CA for the server, but presents a certificate from theirs: as
    // kube-apiserver does, the handshake goes through and the certificate names nobody.
    let client = pki.client_config_for(Some((&cert, &key)), &[]).unwrap();
    let (config, client_certs) = pki.server_config().unwrap();
    let result = handshake(config, client, "localhost").await;
    let peer = result.server.unwrap().peer.unwrap();
    // Both CAs have one name: the signature is what tells them apart.
    let why = client_certs.role(&peer).unwrap_err();
    assert!(why.contains("invalid peer certificate"), "{why}");
    // Our own certificates are callers'.
    let admin = CertificateDer::from_pem_slice(pki.admin_credentials().0.as_bytes()).unwrap();
    assert_eq!(client_certs.role(&[admin]), Ok(CertRole::Caller));
}

#[tokio::test]
async fn a_cert_without_extensions_is_verified_as_go_verifies_it() {
    let ca = include_str!("testdata/v1-ca.crt");
    let cert = include_str!("testdata/v1-client.crt");
    let key = include_str!("testdata/v1-client.key");
    let tmp = tempfile::tempdir().unwrap();
    let pki = ensure_pki(tmp.path(), &options(tmp.path(), &[])).unwrap();
    let (config, client_certs) = pki.proxy_server_config(Some(ca.as_bytes()), None).unwrap();
    // rustls' client refuses to present an X.509 v1 certificate itself; Go's, curl's and
    // OpenSSL's present it.
    let client = client_presenting(&pki, cert, key);
    let result = handshake(config, client, "localhost").await;
    let peer = result.server.unwrap().peer.unwrap();
    assert_eq!(client_certs.role(&peer), Ok(CertRole::Caller));
    let user = user_from_client_cert(&peer[0]).unwrap();
    assert_eq!(user.username, "v1user");
    assert_eq!(user.groups, ["dev", "system:authenticated"]);
    // Verified against the CA that signed it, and no other.
    let (_, ours) = pki
        .proxy_server_config(Some(pki.ca_pem().as_bytes()), None)
        .unwrap();
    let why = ours.role(&peer).unwrap_err();
    assert!(why.contains("not signed by a trusted CA"), "{why}");
    // A front proxy's CA alone: the certificate is a front proxy's, if its name is allowed.
    let (_, front) = pki
        .proxy_server_config(None, Some((ca.as_bytes(), vec!["v1user".into()])))
        .unwrap();
    assert_eq!(front.role(&peer), Ok(CertRole::FrontProxy));
    let (_, front) = pki
        .proxy_server_config(None, Some((ca.as_bytes(), vec!["someone".into()])))
        .unwrap();
    assert!(front.role(&peer).unwrap_err().contains("is not allowed"));
}

#[tokio::test]
async fn a_client_that_cannot_sign_with_its_certificates_key_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = ensure_pki(tmp.path(), &options(tmp.path(), &[])).unwrap();
    // The admin's certificate, presented with another key.
    let (cert, _) = pki.admin_credentials();
    let (_, other_key) = pki
        .issue_client_cert("x", &[], Duration::from_secs(600))
        .unwrap();
    let client = pki.client_config_for(Some((cert, &other_key)), &[]);
    if let Ok(client) = client {
        let result = handshake(pki.server_config().unwrap().0, client, "localhost").await;
        assert!(result.server.is_err());
    }
}

fn sha256_hex(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A self-signed certificate with `subject` as its subject, DER.
fn cert_with_subject(subject: rcgen::DistinguishedName) -> Vec<u8> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = subject;
    params.self_signed(&key).unwrap().der().to_vec()
}

#[test]
fn client_certs_are_read_as_kube_apiserver_reads_them() {
    use rcgen::{DnType, DnValue};
    let cn = DnType::CustomDnType(vec![2, 5, 4, 3]);
    let uid = DnType::CustomDnType(vec![1, 3, 6, 1, 4, 1, 57683, 2]);
    // Two common names: the last is the user.
    let mut two = rcgen::DistinguishedName::new();
    two.push(DnType::CommonName, "bob");
    two.push(DnType::OrganizationName, "dev");
    two.push(cn.clone(), "carol");
    let der = cert_with_subject(two);
    let user = client_cert_identity(&der).unwrap().unwrap();
    assert_eq!(user.username, "carol");
    assert_eq!(user.groups, ["dev", "system:authenticated"]);
    assert_eq!(user.uid, "");
    assert_eq!(
        user.extra[CREDENTIAL_ID_KEY],
        [format!("X509SHA256={}", sha256_hex(&der))]
    );
    // The uid attribute, and a common name in UTF-16.
    let mut with_uid = rcgen::DistinguishedName::new();
    with_uid.push(
        DnType::CommonName,
        DnValue::BmpString(rcgen::string::BmpString::try_from("jöe").unwrap()),
    );
    with_uid.push(uid.clone(), DnValue::Utf8String("uid-1".into()));
    let user = client_cert_identity(&cert_with_subject(with_uid))
        .unwrap()
        .unwrap();
    assert_eq!(
        (user.username.as_str(), user.uid.as_str()),
        ("jöe", "uid-1")
    );
    // An empty uid authenticates nobody; no common name is no user.
    let mut empty_uid = rcgen::DistinguishedName::new();
    empty_uid.push(DnType::CommonName, "joe");
    empty_uid.push(uid, DnValue::Utf8String(String::new()));
    assert!(client_cert_identity(&cert_with_subject(empty_uid)).is_err());
    let mut no_cn = rcgen::DistinguishedName::new();
    no_cn.push(DnType::OrganizationName, "system:masters");
    assert_eq!(
        client_cert_identity(&cert_with_subject(no_cn)).unwrap(),
        None
    );
    // Blanks stay as they are: refusing such a name is the proxy's to do.
    let mut blank = rcgen::DistinguishedName::new();
    blank.push(DnType::CommonName, "bob");
    blank.push(DnType::OrganizationName, " system:masters");
    let user = client_cert_identity(&cert_with_subject(blank))
        .unwrap()
        .unwrap();
    assert_eq!(user.groups[0], " system:masters");
    assert!(client_cert_identity(b"not a certificate").is_err());
}

/// A client configuration that trusts `pki`'s CA and presents `cert_pem` with `key_pem`
/// whatever the certificate is (rustls' own `with_client_auth_cert` reads it with webpki,
/// which refuses X.509 v1).
fn client_presenting(pki: &Pki, cert_pem: &str, key_pem: &str) -> Arc<rustls::ClientConfig> {
    #[derive(Debug)]
    struct Always(Arc<rustls::sign::CertifiedKey>);
    impl rustls::client::ResolvesClientCert for Always {
        fn resolve(
            &self,
            _: &[&[u8]],
            _: &[rustls::SignatureScheme],
        ) -> Option<Arc<rustls::sign::CertifiedKey>> {
            Some(self.0.clone())
        }
        fn has_certs(&self) -> bool {
            true
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    let signing = provider.key_provider.load_private_key(key).unwrap();
    let certified = Arc::new(rustls::sign::CertifiedKey::new(chain, signing));
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca_pem().as_bytes()).unwrap())
        .unwrap();
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_cert_resolver(Arc::new(Always(certified))),
    )
}
