//! Unit tests of the webhook plugins' pure parts: the request sent, the answer checked, the
//! warnings bounded, denials worded, patches applied and dry runs refused.

use base64::Engine;
use serde_json::json;
use svc_config::admission_review::ResponseStatus;
use svc_core::kinds::admission_registration::ValidatingWebhook;
use svc_core::kinds::{Event, Namespace};
use svc_core::user::UserInfo;

use super::call::{
    MAX_WARNING_CHARS, MAX_WARNINGS_PER_RESPONSE, bounded_warnings, check_answer, denial,
};
use super::*;

fn attrs<'a>(op: Operation, user: &'a UserInfo, dry_run: bool) -> Attributes<'a> {
    Attributes {
        operation: op,
        info: Event::INFO,
        subresource: None,
        namespace: "team-a",
        name: "",
        user,
        dry_run,
        audit: None,
    }
}

fn answer(response: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.svc.io/v1", "kind": "AdmissionReview", "response": response}))
    .unwrap()
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn answers_are_checked_against_the_request() {
    let ok = check_answer(&answer(json!({"uid": "u1", "allowed": true})), "u1", false).unwrap();
    assert_eq!(ok.allowed, Some(true));
    let patch = b64(r#"[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]"#);
    for (body, uid, mutating, wanted) in [
        (
            answer(json!({"uid": "other", "allowed": true})),
            "u1",
            false,
            "response.uid",
        ),
        (
            answer(json!({"allowed": true})),
            "u1",
            false,
            "response.uid: Required",
        ),
        (
            answer(json!({"uid": "u1"})),
            "u1",
            false,
            "response.allowed",
        ),
        (
            answer(
                json!({"uid": "u1", "allowed": true, "patchType": "MergePatch", "patch": patch}),
            ),
            "u1",
            true,
            "response.patchType: Unsupported value: \"MergePatch\"",
        ),
        (
            answer(json!({"uid": "u1", "allowed": true, "patchType": "JSONPatch", "patch": patch})),
            "u1",
            false,
            "a validating webhook may not patch",
        ),
        (
            answer(json!({"uid": "u1", "allowed": true, "patchType": "JSONPatch", "patch": "!!"})),
            "u1",
            true,
            "response.patch",
        ),
        (
            b"{}".to_vec(),
            "u1",
            false,
            "apiVersion admission.svc.io/v1",
        ),
        (b"not json".to_vec(), "u1", false, "not an AdmissionReview"),
        (
            serde_json::to_vec(
                &json!({"apiVersion": "admission.svc.io/v1", "kind": "AdmissionReview"}),
            )
            .unwrap(),
            "u1",
            false,
            "no response",
        ),
    ] {
        let err = check_answer(&body, uid, mutating).unwrap_err();
        assert!(err.contains(wanted), "{err} lacks {wanted}");
    }
    let fine = check_answer(
        &answer(json!({"uid": "u1", "allowed": true, "patchType": "JSONPatch", "patch": patch})),
        "u1",
        true,
    );
    assert!(fine.is_ok(), "{fine:?}");
}

#[test]
fn warnings_are_cut_and_counted() {
    let long = "x".repeat(MAX_WARNING_CHARS + 50);
    let short = "y".repeat(120);
    let out = bounded_warnings(&[long.clone(), short.clone(), " ".into(), "é".repeat(300)]);
    assert_eq!(out.len(), 3);
    assert_eq!(out[0], "x".repeat(MAX_WARNING_CHARS));
    assert_eq!(out[1], short);
    assert_eq!(out[2].chars().count(), MAX_WARNING_CHARS);
    let many: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
    let out = bounded_warnings(&many);
    assert_eq!(out.len(), MAX_WARNINGS_PER_RESPONSE);
    assert_eq!(out[0], "w0");
}

#[test]
fn denials_are_worded_as_kubernetes_words_them() {
    let status = |code: Option<i32>, message: &str, reason: &str| ResponseStatus {
        code,
        message: message.into(),
        reason: reason.into(),
        ..Default::default()
    };
    let e = denial(
        "deny.example.com",
        Some(&status(Some(403), "no labels", "")),
    );
    assert_eq!(e.code(), 403);
    assert_eq!(
        e.to_string(),
        "admission webhook \"deny.example.com\" denied the request: no labels"
    );
    let e = denial("d.example.com", Some(&status(None, "", "Because")));
    assert_eq!(e.code(), 400);
    assert_eq!(
        e.to_string(),
        "admission webhook \"d.example.com\" denied the request: Because"
    );
    let e = denial("d.example.com", None);
    assert_eq!(
        e.to_string(),
        "admission webhook \"d.example.com\" denied the request without explanation"
    );
    assert_eq!(denial("d", Some(&status(Some(200), "m", ""))).code(), 400);
    assert_eq!(denial("d", Some(&status(Some(422), "m", ""))).code(), 422);
    assert_eq!(denial("d", Some(&status(Some(429), "m", ""))).code(), 429);
}

#[test]
fn the_request_carries_every_field() {
    let user = UserInfo {
        username: "alice".into(),
        groups: vec!["devs".into()],
        ..Default::default()
    };
    let obj = json!({"apiVersion": "events.svc.io/v1", "kind": "Event", "metadata": {"generateName": "e-"}});
    let old = json!({"apiVersion": "events.svc.io/v1", "kind": "Event", "metadata": {"name": "e"}});
    let r = admission_request(
        &attrs(Operation::Create, &user, true),
        Some(&obj),
        Some(&old),
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(
        v["kind"],
        json!({"group": "events.svc.io", "version": "v1", "kind": "Event"})
    );
    assert_eq!(
        v["resource"],
        json!({"group": "events.svc.io", "version": "v1", "resource": "events"})
    );
    assert_eq!(v["requestKind"], v["kind"]);
    assert_eq!(v["requestResource"], v["resource"]);
    assert_eq!(v["namespace"], "team-a");
    assert!(
        v.get("name").is_none(),
        "a generateName create has no name yet"
    );
    assert_eq!(v["operation"], "CREATE");
    assert_eq!(v["userInfo"]["username"], "alice");
    assert_eq!(v["object"], obj);
    assert!(v.get("oldObject").is_none(), "creates carry no old object");
    assert_eq!(v["dryRun"], true);
    assert_eq!(
        v["options"],
        json!({"apiVersion": "meta.svc.io/v1", "kind": "CreateOptions", "dryRun": ["All"]})
    );
    assert_eq!(r.uid.len(), 36);

    let r = admission_request(
        &attrs(Operation::Update, &user, false),
        Some(&obj),
        Some(&old),
    );
    assert_eq!(r.old_object.as_ref(), Some(&old));
    assert_eq!(r.options.as_ref().unwrap()["kind"], "UpdateOptions");
    let r = admission_request(&attrs(Operation::Delete, &user, false), None, Some(&old));
    assert_eq!((r.object, r.old_object.as_ref()), (None, Some(&old)));
    assert_eq!(r.kind.unwrap().kind, "Event");
    assert_eq!(r.options.unwrap()["kind"], "DeleteOptions");
}

#[test]
fn dry_runs_never_reach_webhooks_with_side_effects() {
    let user = UserInfo::default();
    let hook = |side: Option<&str>| ValidatingWebhook {
        name: "s.example.com".into(),
        side_effects: side.map(str::to_string),
        ..Default::default()
    };
    for side in [Some("Some"), Some("Unknown"), None] {
        let e = refuse_dry_run(&hook(side), &attrs(Operation::Create, &user, true)).unwrap_err();
        assert_eq!(e.code(), 400);
        assert_eq!(
            e.to_string(),
            "admission webhook \"s.example.com\" does not support dry run"
        );
        assert!(refuse_dry_run(&hook(side), &attrs(Operation::Create, &user, false)).is_ok());
    }
    for side in ["None", "NoneOnDryRun"] {
        assert!(refuse_dry_run(&hook(Some(side)), &attrs(Operation::Create, &user, true)).is_ok());
    }
}

#[test]
fn patches_apply_or_fail_the_request() {
    let mut obj = json!({"metadata": {"name": "a"}});
    let resp = |patch: &str| AdmissionResponse {
        uid: "u".into(),
        allowed: Some(true),
        patch: Some(b64(patch)),
        patch_type: Some("JSONPatch".into()),
        ..Default::default()
    };
    let add = resp(r#"[{"op":"add","path":"/metadata/labels","value":{"team":"a"}}]"#);
    assert!(apply_patch("m", &add, &mut obj).unwrap());
    assert_eq!(obj["metadata"]["labels"]["team"], "a");
    // The same patch again changes nothing.
    let same = resp(r#"[{"op":"add","path":"/metadata/labels/team","value":"a"}]"#);
    assert!(!apply_patch("m", &same, &mut obj).unwrap());
    let bad = resp(r#"[{"op":"remove","path":"/spec/nothing"}]"#);
    assert_eq!(apply_patch("m", &bad, &mut obj).unwrap_err().code(), 500);
}

#[test]
fn webhook_configurations_are_exempt() {
    let user = UserInfo::default();
    let mut a = attrs(Operation::Create, &user, false);
    assert!(!exempt(&a));
    a.info = MutatingWebhookConfiguration::INFO;
    assert!(exempt(&a));
    a.info = ValidatingWebhookConfiguration::INFO;
    assert!(exempt(&a));
    a.info = Namespace::INFO;
    assert!(!exempt(&a));
}

#[test]
fn match_conditions_skip_call_or_fail() {
    let user = UserInfo::default();
    let obj = json!({"apiVersion": "events.svc.io/v1", "kind": "Event",
        "metadata": {"name": "e", "labels": {"team": "a"}}});
    let request = admission_request(&attrs(Operation::Create, &user, false), Some(&obj), None);
    let compiled = |exprs: &[&str]| -> Result<Vec<(String, Program)>, String> {
        Ok(exprs
            .iter()
            .enumerate()
            .map(|(i, e)| (format!("c{i}"), reg::compile_match_condition(e).unwrap()))
            .collect())
    };
    let hold = |exprs: &[&str]| conditions_hold(&compiled(exprs), &request);
    assert_eq!(hold(&[]), Ok(true));
    assert_eq!(hold(&["object.metadata.labels.team == 'a'"]), Ok(true));
    assert_eq!(
        hold(&[
            "request.operation == 'CREATE'",
            "request.namespace == 'team-a'"
        ]),
        Ok(true)
    );
    assert_eq!(hold(&["request.userInfo.username == 'bob'"]), Ok(false));
    assert_eq!(
        hold(&["oldObject == null", "!has(request.object)"]),
        Ok(true)
    );
    // An error fails unless another condition is false.
    let err = hold(&["object.spec.missing == 1"]).unwrap_err();
    assert!(err.starts_with("match condition \"c0\": "), "{err}");
    assert_eq!(hold(&["object.spec.missing == 1", "false"]), Ok(false));
    let not_bool = hold(&["object.metadata.name"]).unwrap_err();
    assert!(not_bool.contains("bool"), "{not_bool}");
    assert_eq!(
        conditions_hold(&Err("does not compile".into()), &request),
        Err("does not compile".to_string())
    );
}
