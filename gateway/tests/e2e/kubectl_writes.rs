//! kubectl's write paths against the real binary: `apply --server-side` (with a conflict and
//! `--force-conflicts`), client-side `apply`, `patch --type=json|merge|strategic`, `label`,
//! `annotate` and `delete`.

use std::path::Path;

use crate::support::kubectl::{kubectl, ok, spawn_ready};
use crate::support::process::free_port;
use serde_json::Value;

fn get(dir: &Path, name: &str) -> Value {
    let out = ok(
        dir,
        &[
            "get",
            "serviceaccount",
            name,
            "-n",
            "w",
            "-o",
            "json",
            "--show-managed-fields",
        ],
        None,
    );
    serde_json::from_str(&out).unwrap()
}

const MANIFEST: &str = "apiVersion: v1
kind: ServiceAccount
metadata:
  name: robot
  namespace: w
  labels:
    app: web
secrets:
- name: s1
automountServiceAccountToken: true
";

#[test]
fn kubectl_write_commands() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let _server = spawn_ready(d, free_port());
    ok(d, &["create", "namespace", "w"], None);

    // Server-side apply creates, then is idempotent.
    let out = ok(
        d,
        &["apply", "--server-side", "--field-manager=ops", "-f", "-"],
        Some(MANIFEST),
    );
    assert!(
        out.contains("serviceaccount/robot serverside-applied"),
        "{out}"
    );
    let sa = get(d, "robot");
    assert_eq!(sa["metadata"]["labels"]["app"], "web");
    assert_eq!(sa["metadata"]["managedFields"][0]["manager"], "ops");
    assert_eq!(sa["metadata"]["managedFields"][0]["operation"], "Apply");
    let rv = sa["metadata"]["resourceVersion"].clone();
    // Past a second boundary, so a managedFields time that moved would show as a new version.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    ok(
        d,
        &["apply", "--server-side", "--field-manager=ops", "-f", "-"],
        Some(MANIFEST),
    );
    assert_eq!(get(d, "robot")["metadata"]["resourceVersion"], rv);

    // Another manager changing an owned field conflicts; --force-conflicts takes it.
    let other = MANIFEST.replace(
        "automountServiceAccountToken: true",
        "automountServiceAccountToken: false",
    );
    let out = kubectl(
        d,
        &[
            "apply",
            "--server-side",
            "--field-manager=intruder",
            "-f",
            "-",
        ],
        Some(&other),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("conflict"), "{err}");
    assert!(err.contains(".automountServiceAccountToken"), "{err}");
    ok(
        d,
        &[
            "apply",
            "--server-side",
            "--field-manager=intruder",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&other),
    );
    assert_eq!(get(d, "robot")["automountServiceAccountToken"], false);

    // patch, each type.
    ok(
        d,
        &[
            "patch",
            "sa",
            "robot",
            "-n",
            "w",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/metadata/labels/tier","value":"1"}]"#,
        ],
        None,
    );
    ok(
        d,
        &[
            "patch",
            "sa",
            "robot",
            "-n",
            "w",
            "--type=merge",
            "-p",
            r#"{"imagePullSecrets":[{"name":"reg"}]}"#,
        ],
        None,
    );
    ok(
        d,
        &[
            "patch",
            "sa",
            "robot",
            "-n",
            "w",
            "--type=strategic",
            "-p",
            r#"{"secrets":[{"name":"s2"}]}"#,
        ],
        None,
    );
    let sa = get(d, "robot");
    assert_eq!(sa["metadata"]["labels"]["tier"], "1");
    assert_eq!(sa["imagePullSecrets"][0]["name"], "reg");
    let secrets: Vec<&str> = sa["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(secrets, vec!["s1", "s2"]);

    // label and annotate (both are patches).
    ok(d, &["label", "sa", "robot", "-n", "w", "env=prod"], None);
    ok(d, &["label", "sa", "robot", "-n", "w", "tier-"], None);
    ok(d, &["annotate", "sa", "robot", "-n", "w", "note=hi"], None);
    let sa = get(d, "robot");
    assert_eq!(sa["metadata"]["labels"]["env"], "prod");
    assert!(sa["metadata"]["labels"].get("tier").is_none());
    assert_eq!(sa["metadata"]["annotations"]["note"], "hi");

    // Client-side apply: create, then a change that drops a secret (strategic patch with
    // $setElementOrder and the last-applied annotation).
    let csa = "apiVersion: v1
kind: ServiceAccount
metadata:
  name: classic
  namespace: w
secrets:
- name: a
- name: b
";
    let out = ok(d, &["apply", "-f", "-"], Some(csa));
    assert!(out.contains("serviceaccount/classic created"), "{out}");
    let out = ok(
        d,
        &["apply", "-f", "-"],
        Some(
            &csa.replace("- name: a\n", "")
                .replace("- name: b\n", "- name: b\n- name: c\n"),
        ),
    );
    assert!(out.contains("serviceaccount/classic configured"), "{out}");
    let sa = get(d, "classic");
    let secrets: Vec<&str> = sa["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(secrets, vec!["b", "c"]);
    assert!(
        sa["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );

    // delete.
    let out = ok(d, &["delete", "sa", "robot", "classic", "-n", "w"], None);
    assert!(out.contains("deleted"), "{out}");
    let out = kubectl(d, &["get", "sa", "robot", "-n", "w"], None);
    assert!(!out.status.success());
}

/// A kind that is only created has no PATCH operation in `/openapi/v3`, so kubectl's default
/// validation reads `/openapi/v2` (protobuf) and checks the object against its definition on
/// the client: a valid TokenReview is created, an unknown field is refused by kubectl itself,
/// naming the definition, before any request is sent.
#[test]
fn kubectl_validates_a_create_only_kind_through_openapi_v2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let _server = spawn_ready(d, free_port());
    let review = r#"{"apiVersion":"authentication.svc.io/v1","kind":"TokenReview","spec":{"token":"not-a-token"}}"#;
    let out = ok(d, &["create", "-f", "-", "-o", "json"], Some(review));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["kind"], "TokenReview");
    assert_ne!(v["status"]["authenticated"], true, "{v}");

    let bad = review.replace(r#""token":"#, r#""bogus":1,"token":"#);
    let out = kubectl(d, &["create", "-f", "-"], Some(&bad));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"unknown field "bogus""#) && err.contains("TokenReview.spec"),
        "{err}"
    );

    // The same document in JSON.
    let doc = ok(d, &["get", "--raw", "/openapi/v2"], None);
    let doc: Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(doc["swagger"], "2.0");
    assert!(
        doc["definitions"]
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.ends_with(".TokenReview"))
    );
}
