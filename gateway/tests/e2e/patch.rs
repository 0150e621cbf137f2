//! PATCH end to end through real TLS sockets: the four patch types, conditional patches,
//! server-side apply ownership (conflict, force, sharing, release, create), field validation
//! warnings, dry-run and finalizers removed by a patch.

use crate::support::client::{Client, Resp, TestServer};
use http::{Method, StatusCode};
use serde_json::{Value, json};

const SA: &str = "/api/v1/namespaces/p/serviceaccounts";

async fn setup() -> (TestServer, Client) {
    let srv = TestServer::start().await;
    let c = srv.admin();
    let (s, v) = c
        .post("/api/v1/namespaces", json!({"metadata": {"name": "p"}}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    (srv, c)
}

async fn patch(c: &Client, path: &str, ct: &str, body: &str) -> Resp {
    c.request(Method::PATCH, path, body, &[("content-type", ct)])
        .await
}

async fn create_sa(c: &Client, body: Value) -> Value {
    let (s, v) = c.post(SA, body).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_merge_and_strategic_patches() {
    let (_srv, c) = setup().await;
    create_sa(
        &c,
        json!({"metadata": {"name": "a", "labels": {"x": "1"}},
               "secrets": [{"name": "s1"}], "imagePullSecrets": [{"name": "p1"}]}),
    )
    .await;
    let path = format!("{SA}/a");

    let r = patch(
        &c,
        &path,
        "application/json-patch+json",
        r#"[{"op":"test","path":"/metadata/labels/x","value":"1"},
            {"op":"add","path":"/metadata/labels/y","value":"2"},
            {"op":"add","path":"/secrets/-","value":{"name":"s2"}}]"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["metadata"]["labels"], json!({"x": "1", "y": "2"}));
    assert_eq!(v["secrets"], json!([{"name": "s1"}, {"name": "s2"}]));

    // A failed test is 422 Invalid, as Kubernetes answers; nothing changes.
    let r = patch(
        &c,
        &path,
        "application/json-patch+json",
        r#"[{"op":"test","path":"/metadata/labels/x","value":"9"},
            {"op":"remove","path":"/metadata/labels"}]"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    assert_eq!(r.json()["reason"], "Invalid");
    let (_, now) = c.get(&path).await;
    assert_eq!(now["metadata"]["labels"]["x"], "1");

    let r = patch(
        &c,
        &path,
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"x":null}},"secrets":[{"name":"m"}]}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["metadata"]["labels"], json!({"y": "2"}));
    assert_eq!(v["secrets"], json!([{"name": "m"}]));

    // Strategic: secrets merge on name, imagePullSecrets are atomic.
    let r = patch(
        &c,
        &path,
        "application/strategic-merge-patch+json",
        r#"{"secrets":[{"name":"n"}],"imagePullSecrets":[{"name":"p2"}]}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["secrets"], json!([{"name": "m"}, {"name": "n"}]));
    assert_eq!(v["imagePullSecrets"], json!([{"name": "p2"}]));
    // Every non-apply write is recorded as an Update by its manager.
    let managers: Vec<&str> = v["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["operation"].as_str().unwrap())
        .collect();
    assert!(managers.iter().all(|o| *o == "Update"), "{managers:?}");

    // Bad input: unknown media type 415, malformed patch 400, missing object 404.
    assert_eq!(
        patch(&c, &path, "application/json", "{}").await.status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    assert_eq!(
        patch(&c, &path, "application/merge-patch+json", "[1")
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        patch(
            &c,
            &format!("{SA}/nope"),
            "application/merge-patch+json",
            "{}"
        )
        .await
        .status,
        StatusCode::NOT_FOUND
    );
    let huge = format!(
        "[{}]",
        vec![r#"{"op":"test","path":"/kind","value":"ServiceAccount"}"#; 10_001].join(",")
    );
    assert_eq!(
        patch(&c, &path, "application/json-patch+json", &huge)
            .await
            .status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_patch_and_dry_run() {
    let (_srv, c) = setup().await;
    let sa = create_sa(&c, json!({"metadata": {"name": "a"}})).await;
    let rv = sa["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("{SA}/a");
    let body = format!(r#"{{"metadata":{{"resourceVersion":"{rv}","labels":{{"v":"1"}}}}}}"#);
    let r = patch(&c, &path, "application/merge-patch+json", &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // The same resourceVersion is now stale: 409.
    let r = patch(&c, &path, "application/merge-patch+json", &body).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());

    let before = c.get(&path).await.1;
    let r = patch(
        &c,
        &format!("{path}?dryRun=All"),
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"dry":"yes"}}}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["metadata"]["labels"]["dry"], "yes");
    assert_eq!(c.get(&path).await.1, before);
    let r = patch(
        &c,
        &format!("{SA}/dry?dryRun=All&fieldManager=m"),
        "application/apply-patch+yaml",
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: dry\n",
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(c.get(&format!("{SA}/dry")).await.0, StatusCode::NOT_FOUND);
}

fn managers(v: &Value) -> Vec<(String, String)> {
    v["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["manager"].as_str().unwrap_or_default().to_string(),
                        e["operation"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn apply(c: &Client, query: &str, yaml: &str) -> Resp {
    patch(
        c,
        &format!("{SA}/app?{query}"),
        "application/apply-patch+yaml",
        yaml,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_ownership() {
    let (_srv, c) = setup().await;
    let base = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: app\n";

    // fieldManager is required: 422 of the PatchOptions, as kube-apiserver answers.
    let r = apply(&c, "", base).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        "PatchOptions.meta.svc.io \"\" is invalid: fieldManager: Required value: is required \
         for apply patch"
    );
    assert_eq!(
        r.json()["details"]["causes"][0]["reason"],
        "FieldValueRequired"
    );

    // Apply creates a missing object (201) and records an Apply entry.
    let r = apply(
        &c,
        "fieldManager=alice",
        &format!("{base}  labels:\n    team: a\nautomountServiceAccountToken: true\n"),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let v = r.json();
    assert_eq!(managers(&v), vec![("alice".into(), "Apply".into())]);
    let entry = &v["metadata"]["managedFields"][0];
    assert_eq!(entry["apiVersion"], "v1");
    assert_eq!(entry["fieldsType"], "FieldsV1");
    assert!(entry["time"].is_string());
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:automountServiceAccountToken": {}, "f:metadata": {"f:labels": {"f:team": {}}}})
    );

    // JSON is YAML too. The same value from bob: shared ownership.
    let r = apply(
        &c,
        "fieldManager=bob",
        r#"{"apiVersion":"v1","kind":"ServiceAccount","automountServiceAccountToken":true}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(managers(&r.json()).len(), 2);

    // A different value from carol conflicts with both: 409 naming field and managers.
    let r = apply(
        &c,
        "fieldManager=carol",
        &format!("{base}automountServiceAccountToken: false\n"),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    let st = r.json();
    assert_eq!(st["reason"], "Conflict");
    let causes = st["details"]["causes"].as_array().unwrap().clone();
    assert_eq!(causes.len(), 2);
    assert_eq!(causes[0]["reason"], "FieldManagerConflict");
    assert_eq!(causes[0]["field"], ".automountServiceAccountToken");
    assert_eq!(causes[0]["message"], "conflict with \"alice\"");

    // force=true takes ownership.
    let r = apply(
        &c,
        "fieldManager=carol&force=true",
        &format!("{base}automountServiceAccountToken: false\n"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["automountServiceAccountToken"], false);
    assert_eq!(
        managers(&v),
        vec![
            ("alice".into(), "Apply".into()),
            ("carol".into(), "Apply".into())
        ]
    );

    // alice drops her label: nobody else owns it, so it is removed.
    let r = apply(&c, "fieldManager=alice", base).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert!(v["metadata"]["labels"].is_null(), "{v}");

    // Applying the same manifest again changes nothing (same resourceVersion).
    let rv = v["metadata"]["resourceVersion"].clone();
    let again = apply(
        &c,
        "fieldManager=carol",
        &format!("{base}automountServiceAccountToken: false\n"),
    )
    .await
    .json();
    assert_eq!(again["metadata"]["resourceVersion"], rv);

    // A non-apply write takes the field from the applier (an Update entry).
    let r = patch(
        &c,
        &format!("{SA}/app?fieldManager=editor"),
        "application/merge-patch+json",
        r#"{"automountServiceAccountToken":true}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        managers(&r.json()),
        vec![("editor".into(), "Update".into())]
    );

    // Reset: `[{}]` strips managedFields, `[]` leaves them.
    let r = patch(
        &c,
        &format!("{SA}/app"),
        "application/merge-patch+json",
        r#"{"metadata":{"managedFields":[]}}"#,
    )
    .await;
    assert_eq!(managers(&r.json()).len(), 1);
    let r = patch(
        &c,
        &format!("{SA}/app"),
        "application/merge-patch+json",
        r#"{"metadata":{"managedFields":[{}]}}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(managers(&r.json()).is_empty(), "{}", r.text());

    // An invalid result fails; a wrong kind is refused.
    let r = apply(
        &c,
        "fieldManager=alice",
        &format!("{base}secrets:\n- kind: Secret\n"),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    let r = apply(
        &c,
        "fieldManager=alice",
        "apiVersion: v1\nkind: Namespace\n",
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let r = apply(
        &c,
        "fieldManager=alice",
        "apiVersion: v1\nkind: ServiceAccount\na: 1\na: 2\n",
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_validation_on_patch() {
    let (_srv, c) = setup().await;
    create_sa(&c, json!({"metadata": {"name": "a"}})).await;
    let path = format!("{SA}/a");
    let body = r#"{"spec":{"foo":1}}"#;
    let r = patch(&c, &path, "application/merge-patch+json", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let w: Vec<&str> = r
        .headers
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(w, vec![r#"299 - "unknown field \"spec\"""#]);
    let r = patch(
        &c,
        &format!("{path}?fieldValidation=Strict"),
        "application/merge-patch+json",
        r#"{"secrets":[{"name":"x","bogus":1}]}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        "strict decoding error: unknown field \"secrets[0].bogus\""
    );
    let r = patch(
        &c,
        &format!("{path}?fieldValidation=Ignore"),
        "application/merge-patch+json",
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.headers.get("warning").is_none());
    let r = patch(
        &c,
        &format!("{path}?fieldValidation=Strict"),
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"a":"1","a":"2"}}}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(
        r.text()
            .contains(r#"duplicate field \"metadata.labels.a\""#),
        "{}",
        r.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_last_finalizer_by_patch_deletes() {
    let (_srv, c) = setup().await;
    create_sa(
        &c,
        json!({"metadata": {"name": "f", "finalizers": ["example.com/a", "example.com/b"]}}),
    )
    .await;
    let path = format!("{SA}/f");
    let (s, v) = c.delete(&path).await;
    assert!(s.is_success(), "{v}");
    assert!(v["metadata"]["deletionTimestamp"].is_string());
    let r = patch(
        &c,
        &path,
        "application/strategic-merge-patch+json",
        r#"{"metadata":{"$deleteFromPrimitiveList/finalizers":["example.com/a"]}}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(c.get(&path).await.0, StatusCode::OK);
    let r = patch(
        &c,
        &path,
        "application/json-patch+json",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(c.get(&path).await.0, StatusCode::NOT_FOUND);
}
