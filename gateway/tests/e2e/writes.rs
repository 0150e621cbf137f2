//! Writes other than PATCH through real TLS sockets: dry-run on every verb (nothing stored,
//! nothing in the watch stream), managedFields on create and update, field validation,
//! DeleteOptions preconditions, deletecollection with selectors, namespace deletion, and the
//! alpha force deletion of a corrupt object.

use std::time::Duration;

use crate::support::client::{Client, TestServer, create_namespace};
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use svc_gateway::base::features::Feature;

const SA: &str = "/api/v1/namespaces/w/serviceaccounts";

async fn setup_with(
    f: impl FnOnce(&mut svc_gateway::base::flags::Options),
) -> (TestServer, Client) {
    let srv = TestServer::start_with(f).await;
    let c = srv.admin();
    // Waits for the namespace's own `default` account, so no test sees it appear midway.
    create_namespace(&c, "w").await;
    (srv, c)
}

async fn setup() -> (TestServer, Client) {
    setup_with(|_| {}).await
}

async fn send(c: &Client, m: Method, path: &str, body: &Value) -> (StatusCode, Value) {
    let r = c
        .request(
            m,
            path,
            &body.to_string(),
            &[("content-type", "application/json")],
        )
        .await;
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_on_every_verb_persists_nothing() {
    let (_srv, c) = setup().await;
    let (_, sa) = c
        .post(SA, json!({"metadata": {"name": "a", "labels": {"v": "1"}}}))
        .await;
    let rv = sa["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watch = c.watch(&format!("{SA}?watch=1&resourceVersion={rv}")).await;

    let (s, v) = send(
        &c,
        Method::POST,
        &format!("{SA}?dryRun=All"),
        &json!({"metadata": {"name": "b"}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["metadata"]["name"], "b");
    assert!(v["metadata"]["uid"].is_string());
    let mut changed = sa.clone();
    changed["metadata"]["labels"]["v"] = json!("2");
    let (s, v) = send(&c, Method::PUT, &format!("{SA}/a?dryRun=All"), &changed).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["metadata"]["labels"]["v"], "2");
    let r = c
        .request(
            Method::PATCH,
            &format!("{SA}/a?dryRun=All"),
            r#"{"metadata":{"labels":{"v":"3"}}}"#,
            &[("content-type", "application/merge-patch+json")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let (s, v) = c.delete(&format!("{SA}/a?dryRun=All")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let r = c
        .request(Method::DELETE, &format!("{SA}?dryRun=All"), "", &[])
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    // Nothing changed in the store...
    assert_eq!(c.get(&format!("{SA}/b")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(c.get(&format!("{SA}/a")).await.1, sa);
    // ...and the first event the watch sees is the next real write.
    let (s, _) = c.post(SA, json!({"metadata": {"name": "real"}})).await;
    assert_eq!(s, StatusCode::CREATED);
    let ev = watch.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["metadata"]["name"], "real");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_update_record_managed_fields_and_validate_fields() {
    let (_srv, c) = setup().await;
    let (s, v) = send(
        &c,
        Method::POST,
        &format!("{SA}?fieldManager=creator"),
        &json!({"metadata": {"name": "a", "labels": {"x": "1"}}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let mf = &v["metadata"]["managedFields"];
    assert_eq!(mf[0]["manager"], "creator");
    assert_eq!(mf[0]["operation"], "Update");
    assert_eq!(
        mf[0]["fieldsV1"],
        json!({"f:metadata": {"f:labels": {".": {}, "f:x": {}}}})
    );
    // PUT by another manager takes the field it changed.
    let mut next = v.clone();
    next["metadata"]["labels"]["x"] = json!("2");
    next["automountServiceAccountToken"] = json!(true);
    let (s, v) = send(
        &c,
        Method::PUT,
        &format!("{SA}/a?fieldManager=editor"),
        &next,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let names: Vec<&str> = v["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["manager"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["creator", "editor"]);
    // The user agent names the manager when fieldManager is absent.
    let r = c
        .request(
            Method::POST,
            SA,
            r#"{"metadata":{"name":"ua","labels":{"a":"b"}}}"#,
            &[
                ("content-type", "application/json"),
                ("user-agent", "robot/1.0 (linux)"),
            ],
        )
        .await;
    assert_eq!(r.json()["metadata"]["managedFields"][0]["manager"], "robot");

    // Field validation on create: Warn (default) → header, Strict → 400.
    let body = r#"{"metadata":{"name":"u"},"spec":{"foo":1}}"#;
    let r = c
        .request(
            Method::POST,
            SA,
            body,
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(
        r.headers.get("warning").unwrap(),
        r#"299 - "unknown field \"spec\"""#
    );
    let r = c
        .request(
            Method::POST,
            &format!("{SA}?fieldValidation=Strict"),
            r#"{"metadata":{"name":"v","name":"v2"}}"#,
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        "strict decoding error: duplicate field \"metadata.name\""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_preconditions_and_deletecollection_selectors() {
    let (_srv, c) = setup().await;
    let (_, a) = c.post(SA, json!({"metadata": {"name": "a"}})).await;
    let uid = a["metadata"]["uid"].as_str().unwrap();
    let rv = a["metadata"]["resourceVersion"].as_str().unwrap();
    for (pre, code) in [
        (json!({"uid": "wrong"}), StatusCode::CONFLICT),
        (json!({"resourceVersion": "1"}), StatusCode::CONFLICT),
        (json!({"uid": uid, "resourceVersion": rv}), StatusCode::OK),
    ] {
        let (s, v) = send(
            &c,
            Method::DELETE,
            &format!("{SA}/a"),
            &json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": pre,
                    "gracePeriodSeconds": 0, "propagationPolicy": "Background"}),
        )
        .await;
        assert_eq!(s, code, "{v}");
    }

    for (name, tier) in [("x1", "web"), ("x2", "web"), ("x3", "db")] {
        c.post(
            SA,
            json!({"metadata": {"name": name, "labels": {"tier": tier}}}),
        )
        .await;
    }
    let r = c
        .request(
            Method::DELETE,
            &format!("{SA}?labelSelector=tier%3Dweb"),
            "",
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["status"], "Success");
    let (_, list) = c.get(SA).await;
    let left: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(
        left.contains(&"x3") && !left.contains(&"x1") && !left.contains(&"x2"),
        "{left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizers_hold_deletion_and_namespaces_empty_before_going() {
    let (_srv, c) = setup().await;
    let (_, f) = c
        .post(
            SA,
            json!({"metadata": {"name": "f", "finalizers": ["example.com/x"]}}),
        )
        .await;
    let (s, v) = c.delete(&format!("{SA}/f")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["metadata"]["deletionTimestamp"].is_string());
    // Still there, terminating; a second delete answers 200, as kube-apiserver does, and
    // changes nothing.
    let (s, _) = c.delete(&format!("{SA}/f")).await;
    assert_eq!(s, StatusCode::OK);
    let (_, cur) = c.get(&format!("{SA}/f")).await;
    assert_eq!(cur["metadata"]["uid"], f["metadata"]["uid"]);
    // A terminating object only loses finalizers.
    let mut more = cur.clone();
    more["metadata"]["finalizers"] = json!(["example.com/x", "example.com/y"]);
    let (s, v) = c.put(&format!("{SA}/f"), more).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(
        v["details"]["causes"][0]["message"],
        "Forbidden: no new finalizers can be added if the object is being deleted, found new \
         finalizers []string{\"example.com/y\"}"
    );
    let mut next = cur.clone();
    next["metadata"]["finalizers"] = json!([]);
    let (s, v) = c.put(&format!("{SA}/f"), next).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(c.get(&format!("{SA}/f")).await.0, StatusCode::NOT_FOUND);

    // Every namespace carries its name as the label kubernetes.io/metadata.name.
    let (_, ns) = c.get("/api/v1/namespaces/w").await;
    assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "w");

    // Namespace deletion: Terminating, no new content, contents deleted, then removed.
    c.post(SA, json!({"metadata": {"name": "inside"}})).await;
    let (s, v) = c.delete("/api/v1/namespaces/w").await;
    assert!(s.is_success(), "{v}");
    // Kubernetes' namespace registry sets no grace period on a terminating namespace.
    assert!(v["metadata"]["deletionGracePeriodSeconds"].is_null(), "{v}");
    let (s, refused) = c.post(SA, json!({"metadata": {"name": "late"}})).await;
    assert!(
        s == StatusCode::FORBIDDEN || s == StatusCode::NOT_FOUND,
        "create in a terminating namespace: {s}"
    );
    if s == StatusCode::FORBIDDEN {
        // As kube-apiserver's: the details name the object refused, and why.
        assert_eq!(
            refused["details"],
            json!({"name": "late", "kind": "serviceaccounts", "causes": [{
                "reason": "NamespaceTerminating",
                "message": "namespace w is being terminated",
                "field": "metadata.namespace"
            }]}),
            "{refused}"
        );
    }
    for _ in 0..200 {
        if c.get("/api/v1/namespaces/w").await.0 == StatusCode::NOT_FOUND {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(c.get("/api/v1/namespaces/w").await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        c.get(&format!("{SA}/inside")).await.0,
        StatusCode::NOT_FOUND
    );
}

async fn plant_corrupt(srv: &TestServer, name: &str) {
    let key = format!("/registry/serviceaccounts/w/{name}");
    srv.own()
        .registry
        .store
        .create(Bytes::from(key), Bytes::from_static(b"\xff not an object"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_objects_are_force_deleted_only_behind_the_gate() {
    let (srv, c) = setup_with(|o| {
        o.feature_gates
            .set(Feature::AllowUnsafeMalformedObjectDeletion, true)
    })
    .await;
    plant_corrupt(&srv, "bad").await;
    let path = format!("{SA}/bad");
    assert_eq!(c.get(&path).await.0, StatusCode::INTERNAL_SERVER_ERROR);
    // A normal delete cannot read it.
    assert_eq!(c.delete(&path).await.0, StatusCode::INTERNAL_SERVER_ERROR);
    let (s, v) = c
        .delete(&format!(
            "{path}?ignoreStoreReadErrorWithClusterBreakingPotential=true&dryRun=All"
        ))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (s, v) = c
        .delete(&format!(
            "{path}?ignoreStoreReadErrorWithClusterBreakingPotential=true"
        ))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "Success");
    assert_eq!(c.get(&path).await.0, StatusCode::NOT_FOUND);

    // Without the gate the option does nothing.
    let (srv, c) = setup().await;
    plant_corrupt(&srv, "bad").await;
    let (s, _) = c
        .delete(&format!(
            "{path}?ignoreStoreReadErrorWithClusterBreakingPotential=true"
        ))
        .await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
}
