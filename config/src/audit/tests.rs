//! Tests of the audit policy: validation with field paths, and rule matching.

use std::collections::BTreeMap;

use super::*;
use crate::load;
use svc_core::meta::MicroTime;

fn policy(yaml: &str) -> Evaluator {
    let p: Policy = load(format!("apiVersion: audit.svc.io/v1\nkind: Policy\n{yaml}").as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    Evaluator::new(&p)
}

fn user(name: &str, groups: &[&str]) -> UserInfo {
    UserInfo {
        username: name.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        ..Default::default()
    }
}

/// A resource request: `group/resource[/sub]` in `ns`, named `name`.
fn res<'a>(
    u: &'a UserInfo,
    verb: &'a str,
    gr: &'a str,
    ns: &'a str,
    name: &'a str,
) -> RequestAttributes<'a> {
    let (group, rest) = gr.split_once(':').unwrap_or(("", gr));
    let (resource, subresource) = rest.split_once('/').unwrap_or((rest, ""));
    RequestAttributes {
        user: Some(u),
        verb,
        resource: Some(AuditedResource {
            group,
            resource,
            subresource,
            namespace: ns,
            name,
        }),
        path: "",
    }
}

fn non_res<'a>(u: &'a UserInfo, verb: &'a str, path: &'a str) -> RequestAttributes<'a> {
    RequestAttributes {
        user: Some(u),
        verb,
        resource: None,
        path,
    }
}

const RULES: &str = r#"
omitStages: [RequestReceived]
omitManagedFields: true
rules:
- level: None
  users: ["system:kube-proxy"]
- level: RequestResponse
  userGroups: ["auditors"]
  verbs: ["create"]
  omitManagedFields: false
- level: Request
  resources:
  - group: ""
    resources: ["secrets"]
    resourceNames: ["top"]
  - group: certificates.svc.io
    resources: ["*/status"]
  omitStages: [ResponseStarted]
- level: Metadata
  resources:
  - group: ""
    resources: ["serviceaccounts/*"]
  - group: events.svc.io
- level: Metadata
  namespaces: ["audited"]
- level: Request
  nonResourceURLs: ["/healthz*", "/version"]
- level: Metadata
  verbs: ["delete"]
"#;

#[test]
fn the_first_matching_rule_applies_and_no_match_is_none() {
    let p = policy(RULES);
    let jane = user("jane", &["dev"]);
    let proxy = user("system:kube-proxy", &["auditors"]);
    let auditor = user("amy", &["auditors", "dev"]);
    let level = |a: RequestAttributes<'_>| p.evaluate(&a).level;
    use Level::*;
    for (what, attrs, want) in [
        // users: first rule wins though the second would match too.
        ("user", res(&proxy, "create", "secrets", "d", "x"), None),
        (
            "group + verb",
            res(&auditor, "create", "secrets", "d", "x"),
            RequestResponse,
        ),
        (
            "group, other verb",
            res(&auditor, "get", "pods", "d", "x"),
            None,
        ),
        (
            "resourceName",
            res(&jane, "get", "secrets", "d", "top"),
            Request,
        ),
        (
            "other name",
            res(&jane, "get", "secrets", "d", "other"),
            None,
        ),
        (
            "list has no name",
            res(&jane, "list", "secrets", "d", ""),
            None,
        ),
        (
            "*/status",
            res(
                &jane,
                "update",
                "certificates.svc.io:certificatesigningrequests/status",
                "",
                "c",
            ),
            Request,
        ),
        (
            "*/status wrong group",
            res(&jane, "update", "pods/status", "d", "c"),
            None,
        ),
        (
            "*/status not the main resource",
            res(
                &jane,
                "update",
                "certificates.svc.io:certificatesigningrequests",
                "",
                "c",
            ),
            None,
        ),
        (
            "res/*",
            res(&jane, "create", "serviceaccounts/token", "d", "sa"),
            Metadata,
        ),
        (
            "res/* matches the resource too",
            res(&jane, "get", "serviceaccounts", "d", "sa"),
            Metadata,
        ),
        (
            "res/* not another resource",
            res(&jane, "get", "secrets", "d", "sa"),
            None,
        ),
        (
            "empty resources: whole group",
            res(&jane, "list", "events.svc.io:events", "d", ""),
            Metadata,
        ),
        (
            "core group is not events",
            res(&jane, "list", "events", "d", ""),
            None,
        ),
        (
            "namespace",
            res(&jane, "get", "pods", "audited", "p"),
            Metadata,
        ),
        (
            "namespace not for non-resource",
            non_res(&jane, "get", "/audited"),
            None,
        ),
        (
            "url wildcard",
            non_res(&jane, "get", "/healthz/etcd"),
            Request,
        ),
        ("url exact", non_res(&jane, "get", "/version"), Request),
        ("url exact only", non_res(&jane, "get", "/version/x"), None),
        (
            "urls not for resources",
            res(&jane, "get", "version", "", "x"),
            None,
        ),
        (
            "verb catch-all",
            res(&jane, "delete", "pods", "d", "p"),
            Metadata,
        ),
        (
            "verb catch-all non-resource",
            non_res(&jane, "delete", "/x"),
            Metadata,
        ),
        (
            "unauthenticated, group rule",
            RequestAttributes {
                user: Option::None,
                ..res(&jane, "create", "pods", "d", "")
            },
            None,
        ),
    ] {
        assert_eq!(level(attrs), want, "{what}");
    }
}

#[test]
fn omit_stages_union_and_managed_fields_override() {
    let p = policy(RULES);
    let jane = user("jane", &[]);
    let auditor = user("amy", &["auditors"]);
    let c = p.evaluate(&res(&jane, "get", "secrets", "d", "top"));
    assert!(c.omit_stages.contains(Stage::RequestReceived));
    assert!(c.omit_stages.contains(Stage::ResponseStarted));
    assert!(!c.omit_stages.contains(Stage::ResponseComplete));
    assert!(c.omit_managed_fields, "the global value");
    let c = p.evaluate(&res(&auditor, "create", "pods", "d", ""));
    assert!(!c.omit_managed_fields, "the rule's override");
    assert!(c.omit_stages.contains(Stage::RequestReceived));
    assert!(!c.omit_stages.contains(Stage::ResponseStarted));
    let none = p.evaluate(&non_res(&jane, "get", "/metrics"));
    assert_eq!(none.level, Level::None);
    assert!(none.omit_stages.contains(Stage::RequestReceived));
}

#[test]
fn an_empty_rule_matches_everything() {
    let p = policy("rules:\n- level: Metadata\n");
    let jane = user("jane", &[]);
    assert_eq!(
        p.evaluate(&non_res(&jane, "get", "/x")).level,
        Level::Metadata
    );
    assert_eq!(
        p.evaluate(&res(&jane, "watch", "pods", "", "")).level,
        Level::Metadata
    );
    assert_eq!(
        policy("rules: []\n")
            .evaluate(&non_res(&jane, "get", "/"))
            .level,
        Level::None
    );
}

fn errors(yaml: &str) -> Vec<String> {
    match load::<Policy>(format!("apiVersion: audit.svc.io/v1\nkind: Policy\n{yaml}").as_bytes()) {
        Ok(_) => Vec::new(),
        Err(e) => e.lines(),
    }
}

#[test]
fn validation_names_each_field() {
    for (yaml, want) in [
        ("rules:\n- level: Metadata\n", vec![]),
        ("rules:\n- {}\n", vec!["rules[0].level: Required value"]),
        (
            "rules:\n- level: Everything\n",
            vec![
                r#"rules[0].level: Unsupported value: "Everything": supported values: "None", "Metadata", "Request", "RequestResponse""#,
            ],
        ),
        (
            "omitStages: [Started]\nrules: []\n",
            vec![
                r#"omitStages[0]: Unsupported value: "Started": supported values: "RequestReceived", "ResponseStarted", "ResponseComplete", "Panic""#,
            ],
        ),
        (
            "rules:\n- level: None\n  omitStages: [Panic, Done]\n",
            vec![
                r#"rules[0].omitStages[1]: Unsupported value: "Done": supported values: "RequestReceived", "ResponseStarted", "ResponseComplete", "Panic""#,
            ],
        ),
        (
            "rules:\n- level: None\n  nonResourceURLs: [healthz, \"/a*b\", \"*\", \"/ok*\"]\n",
            vec![
                r#"rules[0].nonResourceURLs[0]: Invalid value: "healthz": non-resource URL rules must begin with a '/' character"#,
                r#"rules[0].nonResourceURLs[1]: Invalid value: "/a*b": non-resource URL wildcards '*' must be the final character of the rule"#,
            ],
        ),
        (
            "rules:\n- level: None\n  resources:\n  - resourceNames: [a]\n",
            vec![
                r#"rules[0].resources[0].resourceNames: Invalid value: "[\"a\"]": using resourceNames requires at least one resource"#,
            ],
        ),
        (
            "rules:\n- level: None\n  resources:\n  - group: Not_A_Group\n",
            vec!["rules[0].resources[0].group: Invalid value: \"Not_A_Group\""],
        ),
        (
            "rules:\n- level: None\n  resources:\n  - resources: [\"*\", pods]\n",
            vec!["rules[0].resources[0].resources: Invalid value"],
        ),
        (
            "rules:\n- level: None\n  resources:\n  - resources: [\"pods/*\", pods]\n",
            vec!["rules[0].resources[0].resources: Invalid value"],
        ),
        (
            "rules:\n- level: None\n  resources:\n  - resources: [\"*/status\", pods/status]\n",
            vec!["rules[0].resources[0].resources: Invalid value"],
        ),
        (
            "rules:\n- level: None\n  resources:\n  - resources: [\"*/status\", \"pods/*\"]\n",
            vec!["rules[0].resources[0].resources: Invalid value"],
        ),
        (
            "rules:\n- level: None\n  resources:\n  - resources: [\"*/status\", secrets, secrets/log, nodes/proxy]\n  - group: apps\n    resources: [\"*\"]\n",
            vec![],
        ),
        (
            "rules:\n- level: None\n- level: Metadata\n  namespaces: [a]\n  nonResourceURLs: [/x]\n",
            vec![
                r#"rules[1].nonResourceURLs: Invalid value: "[\"/x\"]": rules cannot apply to both regular resources and non-resource URLs"#,
            ],
        ),
        (
            "rules:\n- level: None\n  colour: red\n",
            vec![r#"rules[0].colour: unknown field "colour""#],
        ),
    ] {
        let got = errors(yaml);
        assert_eq!(got.len(), want.len(), "{yaml}: {got:?}");
        for (g, w) in got.iter().zip(&want) {
            assert!(g.starts_with(w), "{yaml}: got {g:?}, want {w:?}");
        }
    }
}

#[test]
fn events_serialize_with_kubernetes_field_names() {
    let ev = Event {
        kind: "Event".into(),
        api_version: API_VERSION.into(),
        level: Level::Request,
        audit_id: "id".into(),
        stage: Stage::ResponseComplete,
        request_uri: "/api/v1/namespaces".into(),
        verb: "create".into(),
        user: user("jane", &["g"]),
        impersonated_user: None,
        source_ips: vec!["127.0.0.1".into()],
        user_agent: "ua".into(),
        object_ref: Some(ObjectReference {
            resource: "namespaces".into(),
            name: "n".into(),
            api_version: "v1".into(),
            ..Default::default()
        }),
        response_status: Some(ResponseStatus {
            code: 201,
            ..Default::default()
        }),
        request_object: Some(RawJson::new(br#" {"a": 1} "#).unwrap()),
        response_object: None,
        request_received_timestamp: MicroTime::now(),
        stage_timestamp: MicroTime::now(),
        annotations: BTreeMap::from([("k".into(), "v".into())]),
    };
    let v: Value = serde_json::from_slice(&ev.to_json()).unwrap();
    for key in [
        "auditID",
        "requestURI",
        "sourceIPs",
        "userAgent",
        "objectRef",
        "responseStatus",
        "requestObject",
        "requestReceivedTimestamp",
        "stageTimestamp",
        "annotations",
    ] {
        assert!(v.get(key).is_some(), "{key}");
    }
    assert!(v.get("responseObject").is_none());
    assert_eq!(v["requestObject"]["a"], 1);
    assert_eq!(
        v["responseStatus"],
        serde_json::json!({"metadata": {}, "code": 201})
    );
    assert_eq!(v["objectRef"]["apiVersion"], "v1");
    let back: Event = serde_json::from_value(v).unwrap();
    assert_eq!(back.stage, Stage::ResponseComplete);
    assert_eq!(back.request_object.as_ref().unwrap().as_str(), r#"{"a":1}"#);
    assert!(RawJson::new(b"{").is_none());
    // Through serde (validate-config) the objects are there too.
    let through_serde = serde_json::to_value(&back).unwrap();
    assert_eq!(through_serde["requestObject"]["a"], 1);
    assert_eq!(through_serde["auditID"], "id");
    let list: Value =
        serde_json::from_slice(&EventList::new(vec![ev.clone(), ev]).to_json()).unwrap();
    assert_eq!(list["kind"], "EventList");
    assert_eq!(list["items"][1]["requestObject"]["a"], 1);
}

#[test]
fn managed_fields_are_dropped_from_objects_and_list_items() {
    let obj = br#"{"metadata":{"name":"a","managedFields":[{"manager":"m"}]}}"#;
    let out: Value = serde_json::from_slice(&without_managed_fields(obj).unwrap()).unwrap();
    assert_eq!(out, serde_json::json!({"metadata": {"name": "a"}}));
    let list = br#"{"items":[{"metadata":{"managedFields":[]}}],"metadata":{}}"#;
    let out: Value = serde_json::from_slice(&without_managed_fields(list).unwrap()).unwrap();
    assert_eq!(out["items"][0]["metadata"], serde_json::json!({}));
    assert!(without_managed_fields(br#"{"metadata":{}}"#).is_none());
}

#[test]
fn the_readme_example_policy_is_valid() {
    let readme = include_str!("../../../README.md");
    let section = &readme[readme.find("## Audit").expect("an Audit section")..];
    let start = section.find("```yaml\n").unwrap() + "```yaml\n".len();
    let yaml = &section[start..start + section[start..].find("```").unwrap()];
    let p: Policy = load(yaml.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let e = Evaluator::new(&p);
    let jane = user("jane", &[]);
    assert_eq!(
        e.evaluate(&non_res(&jane, "get", "/readyz")).level,
        Level::None
    );
    assert_eq!(
        e.evaluate(&res(&jane, "create", "secrets", "d", "")).level,
        Level::Metadata
    );
    assert_eq!(
        e.evaluate(&res(
            &jane,
            "update",
            "certificates.svc.io:certificatesigningrequests/approval",
            "",
            "c"
        ))
        .level,
        Level::RequestResponse
    );
    assert_eq!(
        e.evaluate(&res(&jane, "patch", "namespaces", "", "n"))
            .level,
        Level::Request
    );
    assert_eq!(
        e.evaluate(&res(&jane, "get", "namespaces", "", "n")).level,
        Level::Metadata
    );
}

#[test]
fn an_event_is_a_config_kind_with_its_required_fields() {
    let doc = br#"{"apiVersion":"audit.svc.io/v1","kind":"Event","level":"Metadata",
        "auditID":"","stage":"ResponseComplete","requestURI":"/api","verb":"get",
        "user":{"username":"jane"},"requestObject":{"b":[1,2]},
        "requestReceivedTimestamp":"2026-11-23T17:00:00.000000Z",
        "stageTimestamp":"2026-11-23T17:00:00.000001Z"}"#;
    let err = load::<Event>(doc).unwrap_err();
    assert_eq!(err.lines(), ["auditID: Required value"]);
    let ok = String::from_utf8_lossy(doc).replace(r#""auditID":"""#, r#""auditID":"x""#);
    let ev = load::<Event>(ok.as_bytes()).unwrap();
    assert_eq!(ev.request_object.unwrap().as_str(), r#"{"b":[1,2]}"#);
    let err = load::<Event>(br#"{"apiVersion":"audit.svc.io/v1","kind":"Event","level":"Loud"}"#)
        .unwrap_err();
    assert_eq!(err.errors.0[0].field, "level");
}
