//! Events (`events.svc.io/v1`) end to end: create, get, list and watch in one namespace and
//! across all, field selectors in both spellings Kubernetes offers, validation errors (422
//! with causes), updates that may touch only the series, deletecollection, the Table kubectl
//! reads, expiry after `--event-ttl` seen by a watch, and kubectl and the Python client.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::client::{Client, TestServer, WatchStream, summary};
use crate::support::kubectl::{ok, spawn_ready};
use crate::support::process::free_port;

const ALL: &str = "/apis/events.svc.io/v1/events";

fn events(ns: &str) -> String {
    format!("/apis/events.svc.io/v1/namespaces/{ns}/events")
}

fn event(ns: &str, name: &str, kind: &str, object: &str, reason: &str, ty: &str) -> Value {
    json!({
        "apiVersion": "events.svc.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "eventTime": "2024-05-06T07:08:09.123456Z",
        "reportingController": "svc.io/scheduler",
        "reportingInstance": "scheduler-1",
        "action": "Binding",
        "reason": reason,
        "regarding": {"kind": kind, "namespace": ns, "name": object, "apiVersion": "v1"},
        "note": format!("{reason} {object}"),
        "type": ty,
    })
}

async fn namespace(c: &Client, name: &str) {
    let (s, v) = c
        .post("/api/v1/namespaces", json!({"metadata": {"name": name}}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

/// The names of a list's items, in order.
fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|i| {
            i["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

async fn list(c: &Client, path: &str) -> Value {
    let (s, v) = c.get(path).await;
    assert_eq!(s, StatusCode::OK, "{path}: {v}");
    v
}

fn causes(v: &Value) -> Vec<String> {
    let mut fields: Vec<String> = v["details"]["causes"]
        .as_array()
        .unwrap_or_else(|| panic!("no causes: {v}"))
        .iter()
        .map(|c| c["field"].as_str().unwrap_or_default().to_string())
        .collect();
    fields.sort();
    fields
}

/// The next (type, name) of a watch that is not a bookmark.
async fn next_change(w: &mut WatchStream) -> (String, String) {
    let ev = w
        .next_within(Duration::from_secs(10))
        .await
        .expect("watch ended");
    let (ty, name, _) = summary(&ev);
    (ty, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_created_listed_watched_and_selected() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    namespace(&c, "a").await;
    namespace(&c, "b").await;
    let rv = list(&c, ALL).await["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut everything = c
        .watch(&format!("{ALL}?watch=1&resourceVersion={rv}"))
        .await;
    let mut warnings = c
        .watch(&format!(
            "{ALL}?watch=1&resourceVersion={rv}&fieldSelector=type%3DWarning"
        ))
        .await;

    let (s, e1) = c
        .post(
            &events("a"),
            event("a", "web.1", "Pod", "web", "Scheduled", "Normal"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{e1}");
    assert_eq!(e1["apiVersion"], "events.svc.io/v1");
    assert_eq!(e1["eventTime"], "2024-05-06T07:08:09.123456Z");
    assert!(e1["metadata"]["uid"].is_string() && e1["metadata"]["resourceVersion"].is_string());
    let mut backoff = event("a", "db.1", "Pod", "db", "BackOff", "Warning");
    backoff["reportingController"] = json!("svc.io/kubelet");
    let (s, v) = c.post(&events("a"), backoff).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = c
        .post(
            &events("b"),
            event("b", "job.1", "Job", "nightly", "Completed", "Normal"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    for want in ["web.1", "db.1", "job.1"] {
        assert_eq!(
            next_change(&mut everything).await,
            ("ADDED".into(), want.into())
        );
    }
    assert_eq!(
        next_change(&mut warnings).await,
        ("ADDED".into(), "db.1".into())
    );

    let (s, got) = c.get(&format!("{}/web.1", events("a"))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(got["regarding"]["name"], "web");
    let in_a = list(&c, &events("a")).await;
    assert_eq!(in_a["kind"], "EventList");
    assert_eq!(names(&in_a), ["db.1", "web.1"]);
    assert_eq!(names(&list(&c, ALL).await), ["db.1", "web.1", "job.1"]);

    // Field selectors, in events.k8s.io's spelling and in core v1's.
    for (selector, want) in [
        ("type=Warning", vec!["db.1"]),
        ("regarding.name=web", vec!["web.1"]),
        ("involvedObject.name=web", vec!["web.1"]),
        ("regarding.kind=Job", vec!["job.1"]),
        ("involvedObject.namespace=b", vec!["job.1"]),
        ("reportingController=svc.io/kubelet", vec!["db.1"]),
        ("reportingComponent=svc.io/kubelet", vec!["db.1"]),
        ("source=svc.io/kubelet", vec!["db.1"]),
        ("reason!=Scheduled,type=Normal", vec!["job.1"]),
        ("metadata.namespace=a,reason=Scheduled", vec!["web.1"]),
    ] {
        let path = format!("{ALL}?fieldSelector={}", selector.replace('=', "%3D"));
        assert_eq!(names(&list(&c, &path).await), want, "{selector}");
    }
    let (s, v) = c.get(&format!("{ALL}?fieldSelector=note%3Dx")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");

    // Updates: the series may change (a watch sees it), the rest is immutable.
    let mut repeated = got.clone();
    repeated["series"] = json!({"count": 2, "lastObservedTime": "2024-05-06T07:09:00.000001Z"});
    let (s, v) = c.put(&format!("{}/web.1", events("a")), repeated).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["series"]["count"], 2);
    assert_eq!(
        next_change(&mut everything).await,
        ("MODIFIED".into(), "web.1".into())
    );
    let mut rewritten = v.clone();
    rewritten["note"] = json!("something else");
    rewritten["type"] = json!("Warning");
    let (s, v) = c.put(&format!("{}/web.1", events("a")), rewritten).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["reason"], "Invalid");
    assert_eq!(causes(&v), ["note", "type"]);
    // A PUT of a missing event creates it, as Kubernetes allows for events.
    let (s, v) = c
        .put(
            &format!("{}/late.1", events("b")),
            event("b", "late.1", "Job", "nightly", "Started", "Normal"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    // Validation on create: each problem named.
    let mut bad = event("a", "bad.1", "Pod", "web", "", "Info");
    bad["action"] = json!("");
    bad["note"] = json!("n".repeat(1025));
    bad["series"] = json!({"count": 1, "lastObservedTime": "2024-05-06T07:09:00Z"});
    let (s, v) = c.post(&events("a"), bad).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["details"]["kind"], "Event");
    assert_eq!(
        causes(&v),
        ["action", "note", "reason", "series.count", "type"]
    );
    let mut long = event("a", "long.1", "Pod", "web", "Scheduled", "Normal");
    long["reportingInstance"] = json!("i".repeat(129));
    long["eventTime"] = Value::Null;
    let (s, v) = c.post(&events("a"), long).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(causes(&v), ["eventTime"]);

    // deletecollection with a selector takes only what matches; delete one.
    let r = c
        .request(
            Method::DELETE,
            &format!("{}?fieldSelector=type%3DWarning", events("a")),
            "",
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(names(&list(&c, &events("a")).await), ["web.1"]);
    let (s, v) = c.delete(&format!("{}/job.1", events("b"))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.push(next_change(&mut everything).await);
    }
    assert_eq!(
        seen,
        [
            ("ADDED".into(), "late.1".into()),
            ("DELETED".into(), "db.1".into()),
            ("DELETED".into(), "job.1".into()),
        ]
    );

    // The Table: kubectl's columns, the name last.
    let r = c
        .request(
            Method::GET,
            &events("a"),
            "",
            &[("accept", "application/json;as=Table;v=v1;g=meta.svc.io")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let t = r.json();
    let columns: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns[..4], ["Last Seen", "Type", "Reason", "Object"]);
    assert_eq!(columns.last(), Some(&"Name"));
    let cells = &t["rows"][0]["cells"];
    assert_eq!(
        (&cells[1], &cells[2], &cells[3], &cells[9]),
        (
            &json!("Normal"),
            &json!("Scheduled"),
            &json!("pod/web"),
            &json!("web.1")
        )
    );
    assert_eq!(cells[8], 2, "the series' count");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_expire_after_the_event_ttl() {
    let ttl = Duration::from_secs(2);
    let srv = TestServer::start_with(|o| o.event_ttl = ttl).await;
    let c = srv.admin();
    namespace(&c, "t").await;
    let rv = list(&c, &events("t")).await["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut w = c
        .watch(&format!("{}?watch=1&resourceVersion={rv}", events("t")))
        .await;
    // A service account in the same namespace does not expire.
    let (s, v) = c
        .post(
            "/api/v1/namespaces/t/serviceaccounts",
            json!({"metadata": {"name": "stays"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let asked = Instant::now();
    let (s, v) = c
        .post(
            &events("t"),
            event("t", "brief.1", "Pod", "web", "Scheduled", "Normal"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(
        next_change(&mut w).await,
        ("ADDED".into(), "brief.1".into())
    );
    let deleted = w
        .next_within(Duration::from_secs(20))
        .await
        .expect("watch ended");
    assert_eq!(deleted["type"], "DELETED", "{deleted}");
    assert_eq!(deleted["object"]["metadata"]["name"], "brief.1");
    assert_eq!(deleted["object"]["reason"], "Scheduled");
    assert!(
        asked.elapsed() >= ttl,
        "gone after {:?}, before --event-ttl",
        asked.elapsed()
    );
    let (s, _) = c.get(&format!("{}/brief.1", events("t"))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(names(&list(&c, &events("t")).await).is_empty());
    let (s, _) = c.get("/api/v1/namespaces/t/serviceaccounts/stays").await;
    assert_eq!(s, StatusCode::OK);
}

const KUBECTL_EVENTS: &str = "apiVersion: events.svc.io/v1
kind: Event
metadata:
  name: web.1
  namespace: apps
eventTime: 2024-05-06T07:08:09.123456Z
reportingController: svc.io/scheduler
reportingInstance: scheduler-1
action: Binding
reason: Scheduled
regarding: {kind: Pod, namespace: apps, name: web}
note: assigned apps/web to node-1
type: Normal
---
apiVersion: events.svc.io/v1
kind: Event
metadata:
  name: db.1
  namespace: data
eventTime: 2024-05-06T07:08:10.000001Z
reportingController: svc.io/kubelet
reportingInstance: node-1
action: Pulling
reason: BackOff
regarding: {kind: Pod, namespace: data, name: db}
note: back-off pulling image
type: Warning
";

/// The rows of kubectl's table output, split on runs of two or more spaces (none of the cells
/// checked holds two spaces in a row).
fn table_rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        })
        .collect()
}

#[test]
fn kubectl_gets_events() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let _server = spawn_ready(d, free_port());
    ok(d, &["create", "namespace", "apps"], None);
    ok(d, &["create", "namespace", "data"], None);
    let out = ok(d, &["create", "-f", "-"], Some(KUBECTL_EVENTS));
    assert!(out.contains("event.events.svc.io/web.1 created"), "{out}");

    // kubectl asks for a meta.k8s.io Table, which this server does not serve (its Table is
    // meta.svc.io, which carries the event columns checked above): kubectl falls back to
    // the plain list and prints names and ages itself.
    let all = table_rows(&ok(d, &["get", "events", "-A"], None));
    assert_eq!(all[0], ["NAMESPACE", "NAME", "AGE"]);
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(all[1][..2], ["apps", "web.1"]);
    assert_eq!(all[2][..2], ["data", "db.1"]);
    let in_apps = table_rows(&ok(d, &["get", "ev", "-n", "apps"], None));
    assert_eq!(in_apps[0], ["NAME", "AGE"]);
    assert_eq!(in_apps.len(), 2, "{in_apps:?}");
    assert_eq!(in_apps[1][0], "web.1");
    let columns =
        "TYPE:.type,REASON:.reason,KIND:.regarding.kind,OBJECT:.regarding.name,TIME:.eventTime";
    let custom = table_rows(&ok(
        d,
        &[
            "get",
            "events",
            "-n",
            "data",
            "-o",
            &format!("custom-columns={columns}"),
        ],
        None,
    ));
    assert_eq!(
        custom,
        [
            vec!["TYPE", "REASON", "KIND", "OBJECT", "TIME"],
            vec![
                "Warning",
                "BackOff",
                "Pod",
                "db",
                "2024-05-06T07:08:10.000001Z"
            ],
        ]
    );
    let selected = ok(
        d,
        &[
            "get",
            "events",
            "-A",
            "--field-selector",
            "type=Warning",
            "-o",
            "name",
        ],
        None,
    );
    assert_eq!(selected.trim(), "event.events.svc.io/db.1");
}

#[test]
fn python_client_lists_events() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = spawn_ready(dir.path(), free_port());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/clients/python_events.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(dir.path().join("admin.kubeconfig"))
        .arg("py-events")
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    server.kill();
    assert!(
        out.status.success(),
        "python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for check in [
        "create ok",
        "list ok",
        "list all ok",
        "selector ok",
        "invalid ok",
    ] {
        assert!(stdout.contains(check), "missing {check:?}:\n{stdout}");
    }
}
