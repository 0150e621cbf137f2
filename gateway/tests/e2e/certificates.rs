//! CertificateSigningRequests through real TLS sockets: the requester recorded, approval and
//! issuance by the built-in controllers, the issued certificate authenticating, the Table,
//! and each validation rule named field by field; the helpers the other files share. The
//! signers' rules, validity bounds and a signing CA from files are in `certificates/
//! signers.rs`, kubectl and the Python client in `clients.rs`, two gateways on one etcd in
//! `etcd.rs`.

mod clients;
mod etcd;
mod signers;

use std::time::Duration;

use base64::Engine as _;
use http::{Method, StatusCode};
use rcgen::{CertificateParams, DnType, KeyPair, SanType};
use serde_json::{Value, json};
use x509_parser::prelude::{FromDer as _, X509Certificate};

use crate::support::client::{Client, TestServer, eventually};

pub const BASE: &str = "/apis/certificates.svc.io/v1/certificatesigningrequests";
pub const CLIENT_USAGES: &[&str] = &["digital signature", "key encipherment", "client auth"];
/// How long the controllers may take to act.
const WITHIN: Duration = Duration::from_secs(15);

/// A key and a PEM request for `cn` (and one O, and SANs, when given).
pub fn request(cn: &str, org: Option<&str>, sans: &[&str]) -> (KeyPair, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, cn);
    if let Some(o) = org {
        params.distinguished_name.push(DnType::OrganizationName, o);
    }
    params.subject_alt_names = sans
        .iter()
        .map(|s| SanType::DnsName((*s).try_into().unwrap()))
        .collect();
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    (key, pem)
}

pub fn body(name: &str, pem: &str, signer: &str, usages: &[&str], expiry: Option<i32>) -> Value {
    let mut spec = json!({
        "request": base64::engine::general_purpose::STANDARD.encode(pem),
        "signerName": signer,
        "usages": usages,
    });
    if let Some(e) = expiry {
        spec["expirationSeconds"] = json!(e);
    }
    json!({"apiVersion": "certificates.svc.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name}, "spec": spec})
}

pub async fn create(c: &Client, body: Value) -> Value {
    let (s, v) = c.post(BASE, body).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v
}

/// Appends a `ty` condition through `/approval`, as `kubectl certificate approve|deny` does:
/// the object as read, one condition more.
pub async fn decide(c: &Client, name: &str, ty: &str) -> (StatusCode, Value) {
    let (s, mut csr) = c.get(&format!("{BASE}/{name}")).await;
    assert_eq!(s, StatusCode::OK, "{csr}");
    let condition = json!({"type": ty, "status": "True", "reason": format!("Test{ty}"),
        "message": format!("{ty} by the test"), "lastUpdateTime": null});
    match csr["status"]["conditions"].as_array_mut() {
        Some(list) => list.push(condition),
        None => csr["status"] = json!({"conditions": [condition]}),
    }
    c.put(&format!("{BASE}/{name}/approval"), csr).await
}

/// Waits until the request `name` satisfies `done` (the states these tests wait for only
/// ever move forward), and returns it.
pub async fn wait_until(
    c: &Client,
    name: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let path = format!("{BASE}/{name}");
    eventually(WITHIN, &format!("{name}: {what}"), || async {
        done(&c.get(&path).await.1)
    })
    .await;
    let (_, v) = c.get(&path).await;
    assert!(done(&v), "{name}: {what}: {v}");
    v
}

/// The issued certificate of `csr`, as PEM.
pub fn certificate(csr: &Value) -> Option<String> {
    let b64 = csr["status"]["certificate"].as_str()?;
    let pem = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(pem).ok()
}

pub fn condition<'a>(csr: &'a Value, ty: &str) -> Option<&'a Value> {
    csr["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
}

/// The fields of a 422's causes.
fn cause_fields(v: &Value) -> Vec<String> {
    v["details"]["causes"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| c["field"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

pub fn der_of(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject as _;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_request_is_issued_and_its_certificate_authenticates() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    let (key, pem) = request("alice", Some("dev"), &[]);
    let created = create(
        &c,
        body(
            "alice",
            &pem,
            "svc.io/apiserver-client",
            CLIENT_USAGES,
            Some(3600),
        ),
    )
    .await;
    // The requester is recorded from the authenticated user, whatever the body said.
    assert_eq!(created["spec"]["username"], "admin");
    assert_eq!(
        created["spec"]["groups"],
        json!(["system:masters", "system:authenticated"])
    );
    assert!(created["status"].get("conditions").is_none());
    // Both subresources read the object.
    for sub in ["approval", "status"] {
        let (s, v) = c.get(&format!("{BASE}/alice/{sub}")).await;
        assert_eq!(
            (s, v["metadata"]["name"].as_str()),
            (StatusCode::OK, Some("alice"))
        );
    }

    let (s, v) = decide(&c, "alice", "Approved").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let approved = condition(&v, "Approved").unwrap();
    assert!(approved["lastTransitionTime"].is_string() && approved["lastUpdateTime"].is_string());
    let issued = wait_until(&c, "alice", "the certificate is issued", |v| {
        certificate(v).is_some()
    })
    .await;
    let cert_pem = certificate(&issued).unwrap();
    let der = der_of(&cert_pem);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let lifetime = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    assert_eq!(
        lifetime,
        3600 + 300,
        "expirationSeconds, backdated five minutes"
    );

    // The certificate authenticates as CN alice in O dev: the authorizer then refuses her.
    let alice = srv.client_with(Some((cert_pem, key.serialize_pem())), false);
    let (s, v) = alice.get("/api/v1/namespaces").await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("User \"alice\" cannot list"),
        "{v}"
    );
    let (s, _) = alice.get("/apis").await;
    assert_eq!(s, StatusCode::OK, "an authenticated user reads discovery");

    // kubectl's columns, from the Table.
    let r = c
        .request(
            Method::GET,
            BASE,
            "",
            &[("accept", "application/json;as=Table;g=meta.svc.io;v=v1")],
        )
        .await;
    let t = r.json();
    let names: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "Name",
            "Age",
            "SignerName",
            "Requestor",
            "RequestedDuration",
            "Condition"
        ]
    );
    let cells = &t["rows"][0]["cells"];
    assert_eq!(cells[0], "alice");
    assert!(cells[1].as_str().unwrap().ends_with('s'), "{cells}");
    assert_eq!(
        cells.as_array().unwrap()[2..],
        [
            json!("svc.io/apiserver-client"),
            json!("admin"),
            json!("60m"),
            json!("Approved,Issued")
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_failures_name_each_field() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    let (_, pem) = request("v", None, &[]);
    let signer = "svc.io/apiserver-client";

    // Create: each bad field is named.
    let mut not_pem = body("x", "not a request", signer, CLIENT_USAGES, None);
    not_pem["spec"]["request"] = json!(base64::engine::general_purpose::STANDARD.encode("hello"));
    for (b, want) in [
        (not_pem, vec!["spec.request"]),
        (
            body("x", &pem, signer, CLIENT_USAGES, Some(599)),
            vec!["spec.expirationSeconds"],
        ),
        (
            body("x", &pem, signer, &["client auth", "mind reading"], None),
            vec!["spec.usages[1]"],
        ),
        (
            body("x", &pem, "not-a-signer", &[], None),
            vec!["spec.usages", "spec.signerName"],
        ),
    ] {
        let (s, v) = c.post(BASE, b).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
        assert_eq!(v["reason"], "Invalid");
        assert_eq!(cause_fields(&v), want, "{v}");
    }

    let stored = create(&c, body("v", &pem, signer, CLIENT_USAGES, Some(600))).await;
    // The spec is fixed: PUT and PATCH that change it are refused field by field.
    let mut changed = stored.clone();
    changed["spec"]["signerName"] = json!("example.com/other");
    changed["spec"]["usages"] = json!(["client auth"]);
    let (s, v) = c.put(&format!("{BASE}/v"), changed).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(cause_fields(&v), ["spec.signerName", "spec.usages"]);
    let r = c
        .request(
            Method::PATCH,
            &format!("{BASE}/v"),
            r#"{"spec":{"expirationSeconds":7200}}"#,
            &[("content-type", "application/merge-patch+json")],
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    assert_eq!(cause_fields(&r.json()), ["spec.expirationSeconds"]);
    // Labels are not the spec.
    let r = c
        .request(
            Method::PATCH,
            &format!("{BASE}/v"),
            r#"{"metadata":{"labels":{"team":"a"}}}"#,
            &[("content-type", "application/merge-patch+json")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    // A certificate before approval.
    let (admin_cert, _) = srv.handle().pki.admin_credentials();
    let (_, mut current) = c.get(&format!("{BASE}/v")).await;
    current["status"]["certificate"] =
        json!(base64::engine::general_purpose::STANDARD.encode(admin_cert));
    let (s, v) = c.put(&format!("{BASE}/v/status"), current).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(cause_fields(&v), ["status.certificate"]);

    // Approved (and issued): it can no longer be removed, nor joined by Denied, nor the
    // certificate replaced.
    let (s, v) = decide(&c, "v", "Approved").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let issued = wait_until(&c, "v", "issued", |v| certificate(v).is_some()).await;
    let mut removed = issued.clone();
    removed["status"]["conditions"] = json!([]);
    let (s, v) = c.put(&format!("{BASE}/v/approval"), removed).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(cause_fields(&v), ["status.conditions"]);
    assert!(
        v["message"].as_str().unwrap().contains("may not remove"),
        "{v}"
    );
    let r = c
        .request(
            Method::PATCH,
            &format!("{BASE}/v/approval"),
            r#"[{"op":"add","path":"/status/conditions/-","value":{"type":"Denied","status":"True"}}]"#,
            &[("content-type", "application/json-patch+json")],
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    assert_eq!(cause_fields(&r.json()), ["status.conditions[1].type"]);
    let mut replaced = issued.clone();
    replaced["status"]["certificate"] =
        json!(base64::engine::general_purpose::STANDARD.encode(admin_cert));
    let (s, v) = c.put(&format!("{BASE}/v/status"), replaced).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("may not modify existing"),
        "{v}"
    );

    // Denied: no certificate, and approving it is refused.
    let (_, pem) = request("d", None, &[]);
    create(&c, body("d", &pem, signer, CLIENT_USAGES, None)).await;
    let (s, v) = decide(&c, "d", "Denied").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = decide(&c, "d", "Approved").await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("mutually exclusive"),
        "{v}"
    );
    // Another request issued after the denial shows the signer has passed over it.
    let (_, pem) = request("later", None, &[]);
    create(&c, body("later", &pem, signer, CLIENT_USAGES, None)).await;
    decide(&c, "later", "Approved").await;
    wait_until(&c, "later", "issued", |v| certificate(v).is_some()).await;
    let (_, d) = c.get(&format!("{BASE}/d")).await;
    assert!(certificate(&d).is_none(), "{d}");
}
