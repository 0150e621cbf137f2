//! The signers' rules through the server: agents' client certificates approved and issued
//! without anyone deciding, requests the rules refuse marked Failed, custom signers and the
//! plain client signer left alone, serving certificates keeping their names, validity as
//! asked up to `--cluster-signing-duration`, and a signing CA from files whose certificates
//! authenticate.

use std::time::Duration;

use http::StatusCode;
use x509_parser::prelude::{FromDer as _, X509Certificate};

use super::{
    BASE, CLIENT_USAGES, body, certificate, condition, create, decide, der_of, request, wait_until,
};
use crate::support::client::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signers_keep_to_their_rules() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    let agent_usages = CLIENT_USAGES;
    // An agent's client certificate, requested by an administrator (who may ask for any
    // node): approved and issued without anyone deciding.
    let (_, node) = request("system:node:n1", Some("system:nodes"), &[]);
    create(
        &c,
        body(
            "node-n1",
            &node,
            "svc.io/apiserver-client-agent",
            agent_usages,
            None,
        ),
    )
    .await;
    let v = wait_until(&c, "node-n1", "auto-approved and issued", |v| {
        certificate(v).is_some()
    })
    .await;
    assert_eq!(condition(&v, "Approved").unwrap()["reason"], "AutoApproved");

    // Not an agent's shape: not approved automatically; approved by hand, it fails.
    let (_, not_node) = request("system:node:n2", Some("dev"), &[]);
    create(
        &c,
        body(
            "not-node",
            &not_node,
            "svc.io/apiserver-client-agent",
            agent_usages,
            None,
        ),
    )
    .await;
    // A client certificate with a server usage: fails once approved.
    let (_, server_usage) = request("bob", None, &[]);
    create(
        &c,
        body(
            "server-usage",
            &server_usage,
            "svc.io/apiserver-client",
            &["client auth", "server auth"],
            None,
        ),
    )
    .await;
    // A custom signer's request: left alone, approved or not.
    let (_, custom) = request("carol", None, &[]);
    create(
        &c,
        body(
            "custom",
            &custom,
            "example.com/custom",
            &["client auth"],
            None,
        ),
    )
    .await;
    // Never approved automatically: the plain client signer.
    let (_, pending) = request("dave", None, &[]);
    create(
        &c,
        body(
            "pending",
            &pending,
            "svc.io/apiserver-client",
            CLIENT_USAGES,
            None,
        ),
    )
    .await;
    // A serving certificate with its names.
    let (_, serving) = request("system:node:n1", Some("system:nodes"), &["n1.example"]);
    create(
        &c,
        body(
            "serving",
            &serving,
            "svc.io/agent-serving",
            &["digital signature", "server auth"],
            None,
        ),
    )
    .await;

    for name in ["not-node", "server-usage", "custom", "serving"] {
        let (s, v) = decide(&c, name, "Approved").await;
        assert_eq!(s, StatusCode::OK, "{name}: {v}");
    }
    for (name, message) in [
        ("not-node", "subject organization is not system:nodes"),
        (
            "server-usage",
            "invalid usage for client certificate: server auth",
        ),
    ] {
        let v = wait_until(&c, name, "failed", |v| condition(v, "Failed").is_some()).await;
        let failed = condition(&v, "Failed").unwrap();
        assert_eq!(failed["reason"], "SignerValidationFailure");
        assert_eq!(failed["message"], message);
        assert!(certificate(&v).is_none());
    }
    let v = wait_until(&c, "serving", "issued", |v| certificate(v).is_some()).await;
    let der = der_of(&certificate(&v).unwrap());
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    assert_eq!(
        format!("{:?}", san.general_names),
        r#"[DNSName("n1.example")]"#
    );

    // One more agent request, named to come last: once it is approved and issued, both
    // controllers have made a pass that started after everything above and went through
    // the requests in name order.
    let (_, last) = request("system:node:n9", Some("system:nodes"), &[]);
    create(
        &c,
        body(
            "zz-node",
            &last,
            "svc.io/apiserver-client-agent",
            agent_usages,
            None,
        ),
    )
    .await;
    wait_until(&c, "zz-node", "auto-approved and issued", |v| {
        certificate(v).is_some()
    })
    .await;
    // The signer left the custom request alone, the approver the pending one.
    let (_, custom) = c.get(&format!("{BASE}/custom")).await;
    assert!(
        certificate(&custom).is_none() && condition(&custom, "Failed").is_none(),
        "{custom}"
    );
    let (_, pending) = c.get(&format!("{BASE}/pending")).await;
    assert!(pending["status"].get("conditions").is_none(), "{pending}");

    // The signer's field selector.
    let (s, list) = c
        .get(&format!(
            "{BASE}?fieldSelector=spec.signerName%3Dexample.com%2Fcustom"
        ))
        .await;
    assert_eq!(s, StatusCode::OK);
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["custom"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validity_is_what_was_asked_up_to_the_signing_duration() {
    let srv =
        TestServer::start_with(|o| o.cluster_signing_duration = Duration::from_secs(7200)).await;
    let c = srv.admin();
    for (name, asked, want) in [
        ("short", Some(3600), 3600),
        ("long", Some(86_400), 7200),
        ("unset", None, 7200),
    ] {
        let (_, pem) = request(name, None, &[]);
        create(
            &c,
            body(name, &pem, "svc.io/apiserver-client", CLIENT_USAGES, asked),
        )
        .await;
        decide(&c, name, "Approved").await;
        let v = wait_until(&c, name, "issued", |v| certificate(v).is_some()).await;
        let der = der_of(&certificate(&v).unwrap());
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let lifetime =
            cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        assert_eq!(lifetime, want + 300, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signing_ca_from_files_issues_certificates_that_authenticate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .current_dir(d)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&["genrsa", "-traditional", "-out", "signer.key", "2048"]);
    openssl(&[
        "req",
        "-x509",
        "-key",
        "signer.key",
        "-subj",
        "/CN=csr-signer",
        "-days",
        "30",
        "-out",
        "signer.crt",
    ]);
    let (cert_file, key_file) = (d.join("signer.crt"), d.join("signer.key"));
    let srv = TestServer::start_with(move |o| {
        o.cluster_signing_cert_file = Some(cert_file);
        o.cluster_signing_key_file = Some(key_file);
    })
    .await;
    let c = srv.admin();
    let (key, pem) = request("erin", Some("ops"), &[]);
    create(
        &c,
        body("erin", &pem, "svc.io/apiserver-client", CLIENT_USAGES, None),
    )
    .await;
    decide(&c, "erin", "Approved").await;
    let v = wait_until(&c, "erin", "issued", |v| certificate(v).is_some()).await;
    let cert_pem = certificate(&v).unwrap();
    let der = der_of(&cert_pem);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let issuer = cert
        .issuer()
        .iter_common_name()
        .next()
        .unwrap()
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(issuer, "csr-signer");
    // Not the cluster CA, yet the server takes it as a client certificate.
    let erin = srv.client_with(Some((cert_pem, key.serialize_pem())), false);
    let (s, v) = erin.get("/api/v1/namespaces").await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("User \"erin\""),
        "{v}"
    );
}
