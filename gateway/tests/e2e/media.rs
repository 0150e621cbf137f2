//! Media types through a real socket: YAML and CBOR bodies, Table, Accept fallback, 406 and
//! 415, gzip on and off, CBOR watch sequences, and feature-gate parsing at start.

use std::io::Read;
use std::time::Duration;

use crate::support::client::{Client, TestServer, eventually};
use http::{Method, StatusCode};
use serde_json::{Value, json};
use svc_gateway::base::features::Feature;

const SA: &str = "/api/v1/namespaces/default/serviceaccounts";

fn cbor_value(bytes: &[u8]) -> Value {
    assert_eq!(
        &bytes[..3],
        &[0xd9, 0xd9, 0xf7],
        "CBOR bodies are self-described"
    );
    let v: ciborium::Value =
        ciborium::from_reader(&bytes[3..]).expect("a generic CBOR decoder reads it");
    v.deserialized().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaml_and_table() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    let yaml = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: from-yaml\n  labels:\n    team: a\nautomountServiceAccountToken: false\n";
    let r = c
        .request(
            Method::POST,
            SA,
            yaml,
            &[
                ("content-type", "application/yaml"),
                ("accept", "application/yaml"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(r.headers["content-type"], "application/yaml");
    assert!(r.text().contains("name: from-yaml"), "{}", r.text());
    // Duplicate keys are refused.
    let dup = c
        .request(
            Method::POST,
            SA,
            "metadata:\n  name: a\n  name: b\n",
            &[("content-type", "application/yaml")],
        )
        .await;
    assert_eq!(dup.status, StatusCode::BAD_REQUEST);
    // A YAML list.
    let r = c
        .request(Method::GET, SA, "", &[("accept", "application/yaml")])
        .await;
    assert!(
        r.text().contains("kind: ServiceAccountList"),
        "{}",
        r.text()
    );

    // Table for get and list, with the default columns.
    let table = "application/json;as=Table;g=meta.svc.io;v=v1";
    let r = c
        .request(
            Method::GET,
            &format!("{SA}/from-yaml"),
            "",
            &[("accept", table)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let t = r.json();
    assert_eq!(
        (t["kind"].as_str(), t["apiVersion"].as_str()),
        (Some("Table"), Some("meta.svc.io/v1"))
    );
    let cols: Vec<(&str, &str)> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["type"].as_str().unwrap()))
        .collect();
    assert_eq!(cols, [("Name", "string"), ("Created At", "date")]);
    assert_eq!(t["rows"][0]["cells"][0], "from-yaml");
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let r = c
        .request(
            Method::GET,
            &format!("{SA}?includeObject=Object"),
            "",
            &[("accept", table)],
        )
        .await;
    let t = r.json();
    assert_eq!(t["rows"][0]["object"]["kind"], "ServiceAccount");
    assert!(t["metadata"]["resourceVersion"].is_string());
    let r = c
        .request(
            Method::GET,
            &format!("{SA}?includeObject=None"),
            "",
            &[("accept", table)],
        )
        .await;
    assert!(r.json()["rows"][0].get("object").is_none());
    // The fallback form works, and kubectl's own Table request falls back to plain JSON.
    let r = c
        .request(
            Method::GET,
            SA,
            "",
            &[("accept", &format!("{table}, application/json"))],
        )
        .await;
    assert_eq!(r.json()["kind"], "Table");
    let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let r = c.request(Method::GET, SA, "", &[("accept", kubectl)]).await;
    assert_eq!(r.json()["kind"], "ServiceAccountList");
    // Nothing acceptable: 406; an unknown body type: 415.
    let r = c
        .request(
            Method::GET,
            SA,
            "",
            &[("accept", "text/html, application/xml;q=0.9")],
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE);
    assert_eq!(r.json()["kind"], "Status");
    let r = c
        .request(
            Method::POST,
            SA,
            "<sa/>",
            &[("content-type", "application/xml")],
        )
        .await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cbor_behind_its_gate() {
    let off = TestServer::start().await;
    let c = off.admin();
    let r = c
        .request(Method::GET, SA, "", &[("accept", "application/cbor")])
        .await;
    assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE);
    let r = c
        .send(Client::build(
            Method::POST,
            SA,
            vec![0xd9, 0xd9, 0xf7, 0xa0],
            &[("content-type", "application/cbor")],
        ))
        .await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let apply_cbor = |name: &str, labels: serde_json::Value| {
        let mut body = vec![0xd9, 0xd9, 0xf7];
        ciborium::into_writer(
            &json!({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": name, "labels": labels}}),
            &mut body,
        )
        .unwrap();
        Client::build(
            Method::PATCH,
            &format!("{SA}/{name}?fieldManager=cbor-applier"),
            body,
            &[("content-type", "application/apply-patch+cbor")],
        )
    };
    let r = c.send(apply_cbor("applied", json!({}))).await;
    assert_eq!(
        r.status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "apply-patch+cbor is CBOR: refused without the gate. {}",
        r.text()
    );

    let srv =
        TestServer::start_with(|o| o.feature_gates.set(Feature::CBORServingAndStorage, true)).await;
    let c = srv.admin();
    let rv = c.get(SA).await.1["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut w = c.connect().await.unwrap();
    let watch = w
        .send(Client::build(
            Method::GET,
            &format!("{SA}?watch=1&resourceVersion={rv}"),
            bytes::Bytes::new(),
            &[("accept", "application/cbor-seq")],
        ))
        .await
        .unwrap();
    assert_eq!(watch.headers()["content-type"], "application/cbor-seq");

    let mut body = vec![0xd9, 0xd9, 0xf7];
    ciborium::into_writer(
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "from-cbor"}}),
        &mut body,
    )
    .unwrap();
    let r = c
        .send(Client::build(
            Method::POST,
            SA,
            body,
            &[
                ("content-type", "application/cbor"),
                ("accept", "application/cbor"),
            ],
        ))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(r.headers["content-type"], "application/cbor");
    let created = cbor_value(&r.body);
    assert_eq!(created["metadata"]["name"], "from-cbor");
    let r = c
        .request(Method::GET, SA, "", &[("accept", "application/cbor")])
        .await;
    assert_eq!(cbor_value(&r.body)["kind"], "ServiceAccountList");
    // Two items in one body are refused.
    let mut two = vec![0xd9, 0xd9, 0xf7];
    ciborium::into_writer(&json!({"metadata": {"name": "x"}}), &mut two).unwrap();
    ciborium::into_writer(&json!({"metadata": {"name": "y"}}), &mut two).unwrap();
    let r = c
        .send(Client::build(
            Method::POST,
            SA,
            two,
            &[("content-type", "application/cbor")],
        ))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    // Server-side apply with a CBOR configuration: creates, then changes what it owns.
    let r = c.send(apply_cbor("applied", json!({"a": "1"}))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let r = c.send(apply_cbor("applied", json!({"a": "2"}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let applied = c.get(&format!("{SA}/applied")).await.1;
    assert_eq!(applied["metadata"]["labels"]["a"], "2");
    assert_eq!(
        applied["metadata"]["managedFields"][0]["manager"],
        "cbor-applier"
    );
    assert_eq!(
        applied["metadata"]["managedFields"][0]["operation"],
        "Apply"
    );

    // The watch sees the create as one CBOR sequence item.
    use http_body_util::BodyExt;
    let mut stream = watch.into_body();
    let frame = tokio::time::timeout(std::time::Duration::from_secs(10), stream.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let item = cbor_value(&frame.into_data().unwrap());
    assert_eq!(item["type"], "ADDED");
    assert_eq!(item["object"]["metadata"]["name"], "from-cbor");
}

fn gunzip(body: &[u8]) -> String {
    let mut plain = String::new();
    flate2::read::GzDecoder::new(body)
        .read_to_string(&mut plain)
        .unwrap();
    plain
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_for_every_get_and_list_when_asked() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    // The namespace's own `default` account is created beside ours: wait for it so the
    // count below is fixed.
    eventually(
        Duration::from_secs(10),
        "the default service account exists",
        || async { c.get(&format!("{SA}/default")).await.0 == StatusCode::OK },
    )
    .await;
    for i in 0..40 {
        let (s, _) = c.post(SA, json!({"metadata": {"name": format!("sa-{i}"), "annotations": {"note": "x".repeat(1000)}}})).await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let r = c
        .request(Method::GET, SA, "", &[("accept-encoding", "gzip")])
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-encoding"], "gzip");
    let plain = gunzip(&r.body);
    let list: Value = serde_json::from_str(&plain).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 41);
    assert!(
        r.body.len() * 5 < plain.len(),
        "gzip saved too little: {} of {}",
        r.body.len(),
        plain.len()
    );
    // A small get (well under 16 KiB) is compressed too: the spec sets no threshold.
    let r = c
        .request(
            Method::GET,
            &format!("{SA}/sa-1"),
            "",
            &[("accept-encoding", "gzip")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-encoding"], "gzip");
    let plain = gunzip(&r.body);
    assert!(plain.len() < 16 * 1024, "{} bytes", plain.len());
    let sa: Value = serde_json::from_str(&plain).unwrap();
    assert_eq!(sa["metadata"]["name"], "sa-1");
    // So is a small list (one namespace holding nothing).
    let r = c
        .request(
            Method::GET,
            "/api/v1/namespaces/kube-public/serviceaccounts",
            "",
            &[("accept-encoding", "gzip")],
        )
        .await;
    assert_eq!(r.headers["content-encoding"], "gzip");
    assert_eq!(
        serde_json::from_str::<Value>(&gunzip(&r.body)).unwrap()["kind"],
        "ServiceAccountList"
    );
    // Clients that do not ask, and q=0, get plain bodies.
    let r = c.request(Method::GET, SA, "", &[]).await;
    assert!(r.headers.get("content-encoding").is_none());
    let r = c
        .request(Method::GET, SA, "", &[("accept-encoding", "gzip;q=0")])
        .await;
    assert!(r.headers.get("content-encoding").is_none());
    // Watches are never compressed.
    let mut conn = c.connect().await.unwrap();
    let w = conn
        .send(Client::build(
            Method::GET,
            &format!("{SA}?watch=1"),
            bytes::Bytes::new(),
            &[("accept-encoding", "gzip")],
        ))
        .await
        .unwrap();
    assert!(w.headers().get("content-encoding").is_none());

    // With the gate off, nothing is compressed.
    let off =
        TestServer::start_with(|o| o.feature_gates.set(Feature::APIResponseCompression, false))
            .await;
    let c = off.admin();
    eventually(
        Duration::from_secs(10),
        "the default service account exists",
        || async { c.get(&format!("{SA}/default")).await.0 == StatusCode::OK },
    )
    .await;
    for i in 0..40 {
        c.post(SA, json!({"metadata": {"name": format!("sa-{i}"), "annotations": {"note": "x".repeat(1000)}}})).await;
    }
    let r = c
        .request(Method::GET, SA, "", &[("accept-encoding", "gzip")])
        .await;
    assert!(r.headers.get("content-encoding").is_none());
    assert_eq!(r.json()["items"].as_array().unwrap().len(), 41);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compression_floor_leaves_small_bodies_plain() {
    let srv = TestServer::start_with(|o| o.response_compression_min_bytes = 16 * 1024).await;
    let c = srv.admin();
    for i in 0..40 {
        let (s, _) = c.post(SA, json!({"metadata": {"name": format!("sa-{i}"), "annotations": {"note": "x".repeat(1000)}}})).await;
        assert_eq!(s, StatusCode::CREATED);
    }
    // The list (~45 KiB) is over the floor: compressed.
    let r = c
        .request(Method::GET, SA, "", &[("accept-encoding", "gzip")])
        .await;
    assert_eq!(r.headers["content-encoding"], "gzip");
    assert!(gunzip(&r.body).len() >= 16 * 1024);
    // One object (~1.3 KiB) is under it: plain.
    let r = c
        .request(
            Method::GET,
            &format!("{SA}/sa-1"),
            "",
            &[("accept-encoding", "gzip")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.headers.get("content-encoding").is_none());
    assert_eq!(r.json()["metadata"]["name"], "sa-1");
}

#[test]
fn unknown_feature_gates_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_svc-gateway"))
        .args([
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--secure-port",
            "0",
        ])
        .args([
            "--feature-gates",
            "APIResponseCompression=false,NoSuchGate=true",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unrecognized feature gate: NoSuchGate"),
        "{err}"
    );
}
