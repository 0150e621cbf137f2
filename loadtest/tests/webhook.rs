//! `svc-loadtest webhook-server` as a child process over TLS (a self-signed certificate for
//! 127.0.0.1, trusted by the client): an AdmissionReview is allowed with its uid echoed, a
//! SubjectAccessReview is allowed, anything else is 400, and `/stats` counts the answers.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use rustls::pki_types::ServerName;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_svc-loadtest");

/// The child is killed when the test ends, however it ends.
struct Server {
    child: Child,
    port: u16,
    tls: Arc<rustls::ClientConfig>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &std::path::Path) -> Server {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let mut child = Command::new(BIN)
        .args([
            "webhook-server",
            "--listen",
            "127.0.0.1:0",
            "--exit-with-stdin",
        ])
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ck.cert.der().clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    Server {
        child,
        port,
        tls: Arc::new(tls),
    }
}

/// One HTTP/1.1 request over TLS; the status and the JSON body.
fn call(s: &Server, method: &str, path: &str, body: &str) -> (u16, Value) {
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(s.tls.clone(), name).unwrap();
    let sock = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    write!(
        tls,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = Vec::new();
    // A close without close_notify is an error in rustls; what was read still counts.
    let _ = tls.read_to_end(&mut resp);
    let resp = String::from_utf8(resp).unwrap();
    let status = resp
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{resp}"));
    let (start, end) = (resp.find('{').unwrap(), resp.rfind('}').unwrap());
    (status, serde_json::from_str(&resp[start..=end]).unwrap())
}

#[test]
fn webhook_server_allows_reviews_and_refuses_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());

    let review = json!({
        "apiVersion": "admission.svc.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "7d2c0f3e-1b1a-4d5e-9c52-0a9f1f0c1e11", "operation": "CREATE",
                    "object": {"kind": "Event"}},
    });
    let (status, v) = call(&s, "POST", "/admit", &review.to_string());
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(v["apiVersion"], "admission.svc.io/v1");
    assert_eq!(v["response"]["uid"], "7d2c0f3e-1b1a-4d5e-9c52-0a9f1f0c1e11");
    assert_eq!(v["response"]["allowed"], true);

    let sar = json!({
        "apiVersion": "authorization.svc.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": "u", "resourceAttributes": {"verb": "get", "resource": "pods"}},
    });
    let (status, v) = call(&s, "POST", "/authorize", &sar.to_string());
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["kind"], "SubjectAccessReview");
    assert_eq!(v["status"]["allowed"], true);

    let (status, v) = call(&s, "POST", "/admit", r#"{"kind":"AdmissionReview"}"#);
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("uid"), "{v}");
    let (status, _) = call(&s, "POST", "/admit", "{");
    assert_eq!(status, 400);

    let (status, v) = call(&s, "GET", "/stats", "");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["admissionReviews"], 1);
    assert_eq!(v["subjectAccessReviews"], 1);
}
