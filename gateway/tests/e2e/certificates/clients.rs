//! Real clients against the real binary: a new user's key and request made with openssl,
//! sent with kubectl, approved and denied with the request `kubectl certificate` makes, the
//! issued certificate used in a kubeconfig of its own; and the official Python client
//! creating, listing, approving and reading a request in our group.
//!
//! `kubectl certificate approve|deny` itself refuses objects outside `certificates.k8s.io`
//! (it checks the group client-side, then talks to `/apis/certificates.k8s.io`), so the test
//! sends what it would send, the object as read with one condition appended, PUT to
//! `/approval`, with `kubectl replace --raw`.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::support::kubectl::{kubectl, ok, spawn_ready};
use crate::support::process::free_port;

fn openssl(dir: &Path, args: &[&str]) {
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
}

/// `<name>.key` and `<name>.csr` in `dir`, as a user would make them.
fn openssl_request(dir: &Path, name: &str, subject: &str) {
    let key = format!("{name}.key");
    openssl(
        dir,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            &key,
        ],
    );
    let csr = format!("{name}.csr");
    openssl(
        dir,
        &["req", "-new", "-key", &key, "-subj", subject, "-out", &csr],
    );
}

fn manifest(dir: &Path, name: &str) -> String {
    let pem = std::fs::read(dir.join(format!("{name}.csr"))).unwrap();
    format!(
        "apiVersion: certificates.svc.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  \
         name: {name}\nspec:\n  request: {}\n  signerName: svc.io/apiserver-client\n  \
         expirationSeconds: 86400\n  usages:\n  - digital signature\n  - key encipherment\n  \
         - client auth\n",
        base64::engine::general_purpose::STANDARD.encode(pem)
    )
}

/// What `kubectl certificate approve|deny` sends: the request as read, the condition
/// appended (with `lastUpdateTime` now, as kubectl sets it), PUT to `/approval`.
fn decide(d: &Path, name: &str, ty: &str, reason: &str, message: &str) -> Output {
    let mut csr: Value =
        serde_json::from_str(&ok(d, &["get", "csr", name, "-o", "json"], None)).unwrap();
    let condition = json!({"type": ty, "status": "True", "reason": reason, "message": message,
        "lastUpdateTime": svc_core::meta::Time::now(), "lastTransitionTime": null});
    match csr["status"]["conditions"].as_array_mut() {
        Some(list) => list.push(condition),
        None => csr["status"] = json!({"conditions": [condition]}),
    }
    let path = format!("/apis/certificates.svc.io/v1/certificatesigningrequests/{name}/approval");
    kubectl(
        d,
        &["replace", "--raw", &path, "-f", "-"],
        Some(&csr.to_string()),
    )
}

fn approve(d: &Path, name: &str) {
    let out = decide(
        d,
        name,
        "Approved",
        "KubectlApprove",
        "This CSR was approved by kubectl certificate approve.",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits for the issued certificate of `name` and returns it (PEM).
fn wait_for_certificate(d: &Path, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let b64 = ok(
            d,
            &["get", "csr", name, "-o", "jsonpath={.status.certificate}"],
            None,
        );
        if !b64.trim().is_empty() {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .unwrap();
            return String::from_utf8(pem).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{name} was never issued");
}

/// kubectl with another kubeconfig than the admin's.
fn kubectl_with(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("kubectl runs")
}

#[test]
fn kubectl_requests_approves_denies_and_uses_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = free_port();
    let mut server = spawn_ready(d, port);

    openssl_request(d, "jane", "/CN=jane/O=dev/O=qa");
    let created = ok(d, &["create", "-f", "-"], Some(&manifest(d, "jane")));
    assert!(
        created.contains("certificatesigningrequest.certificates.svc.io/jane created"),
        "{created}"
    );
    let requester = ok(
        d,
        &["get", "csr", "jane", "-o", "jsonpath={.spec.username}"],
        None,
    );
    assert_eq!(requester, "admin");

    // kubectl's own subcommand stops at the group, before any request.
    let refused = kubectl(d, &["certificate", "approve", "jane"], None);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("can only handle CertificateSigningRequest.certificates.k8s.io objects"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    approve(d, "jane");
    let cert = wait_for_certificate(d, "jane");
    std::fs::write(d.join("jane.crt"), &cert).unwrap();

    // A kubeconfig of jane's own: the server knows her, and its authorizer refuses her.
    let jane = d.join("jane.kubeconfig");
    let server_url = format!("https://127.0.0.1:{port}");
    let ca = d.join("pki").join("ca.crt");
    for args in [
        vec![
            "config",
            "set-cluster",
            "svc",
            "--server",
            &server_url,
            "--certificate-authority",
            ca.to_str().unwrap(),
            "--embed-certs=true",
        ],
        vec![
            "config",
            "set-credentials",
            "jane",
            "--client-certificate",
            d.join("jane.crt").to_str().unwrap(),
            "--client-key",
            d.join("jane.key").to_str().unwrap(),
            "--embed-certs=true",
        ],
        vec![
            "config",
            "set-context",
            "jane",
            "--cluster",
            "svc",
            "--user",
            "jane",
        ],
        vec!["config", "use-context", "jane"],
    ] {
        let out = kubectl_with(&jane, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let denied = kubectl_with(&jane, &["get", "namespaces"]);
    assert!(!denied.status.success());
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(
        stderr.contains("Forbidden")
            && stderr.contains("User \"jane\" cannot list resource \"namespaces\""),
        "{stderr}"
    );

    // Denied: never issued, and no longer approvable.
    openssl_request(d, "bob", "/CN=bob");
    ok(d, &["create", "-f", "-"], Some(&manifest(d, "bob")));
    let out = decide(
        d,
        "bob",
        "Denied",
        "KubectlDeny",
        "This CSR was denied by kubectl certificate deny.",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let types = ok(
        d,
        &[
            "get",
            "csr",
            "bob",
            "-o",
            "jsonpath={.status.conditions[*].type}",
        ],
        None,
    );
    assert_eq!(types, "Denied");
    let out = decide(d, "bob", "Approved", "KubectlApprove", "approve after deny");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("mutually exclusive"), "{stderr}");
    // A request approved after the denial, issued: the signer has passed over bob.
    openssl_request(d, "carl", "/CN=carl");
    ok(d, &["create", "-f", "-"], Some(&manifest(d, "carl")));
    approve(d, "carl");
    wait_for_certificate(d, "carl");
    let bob_cert = ok(
        d,
        &["get", "csr", "bob", "-o", "jsonpath={.status.certificate}"],
        None,
    );
    assert_eq!(bob_cert, "");

    // Listing, by name and by signer.
    let names = ok(
        d,
        &[
            "get",
            "csr",
            "--field-selector",
            "spec.signerName=svc.io/apiserver-client",
            "-o",
            "name",
        ],
        None,
    );
    for n in ["jane", "bob", "carl"] {
        assert!(
            names.contains(&format!(
                "certificatesigningrequest.certificates.svc.io/{n}"
            )),
            "{names}"
        );
    }
    let table = ok(d, &["get", "csr"], None);
    assert!(table.contains("NAME") && table.contains("carl"), "{table}");
    server.kill();
}

#[test]
fn python_client_creates_and_approves_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = free_port();
    let mut server = spawn_ready(d, port);
    openssl_request(d, "py", "/CN=py-user/O=py");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/clients/python_csr_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(d.join("admin.kubeconfig"))
        .arg(d.join("py.csr"))
        .arg("from-python")
        .output()
        .expect("python3");
    server.kill();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python client failed (the test command installs the `kubernetes` package):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for check in [
        "create ok",
        "invalid ok",
        "list ok",
        "approve ok",
        "issued ok",
        "delete ok",
    ] {
        assert!(stdout.contains(check), "missing {check:?}:\n{stdout}");
    }
}
