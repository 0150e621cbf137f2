//! Property tests of the four patch types and server-side apply, whose documents come from
//! clients: arbitrary patch documents (and arbitrary bytes) against arbitrary objects of every
//! kind never panic, and a merge patch computed between two objects turns the first into the
//! second.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use svc_core::meta::{ManagedFieldsEntry, Time};
use svc_core::patch::managed::{self, Writer};
use svc_core::patch::strategy::MergeStrategies;
use svc_core::patch::{PatchType, apply_patch, merge};

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(256)
    }
}

/// The merge strategies of a kind by name; a kind nobody serves declares none.
fn strat(kind: &str) -> MergeStrategies {
    svc_core::registry::by_kind(kind)
        .map(|i| i.strategies())
        .unwrap_or_default()
}

const KINDS: &[&str] = &[
    "ServiceAccount",
    "Secret",
    "Namespace",
    "Event",
    "CertificateSigningRequest",
    "NoSuchKind",
];

/// Keys that mean something to some kind or to a patch, and a few that mean nothing.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "metadata", "name", "namespace", "labels", "annotations", "finalizers",
            "ownerReferences", "uid", "managedFields", "secrets", "imagePullSecrets", "spec",
            "status", "conditions", "type", "data", "usages", "kind", "apiVersion",
            "$patch", "$retainKeys", "$setElementOrder/secrets", "$setElementOrder/finalizers",
            "$deleteFromPrimitiveList/finalizers", "$setElementOrder/conditions",
            "f:metadata", "f:labels", "k:{\"name\":\"a\"}", "v:\"x\"", ".", "i:0",
        ]).prop_map(String::from),
        1 => "[a-z$/:{}\"]{0,6}",
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        // Floats with short decimal forms: serde_json reads long ones to within one ulp only.
        (any::<i32>(), 0u32..4).prop_map(|(m, e)| Value::from(f64::from(m) / f64::from(1 << e))),
        prop::sample::select(vec![
            "a", "x", "replace", "delete", "merge", "", "Approved", "name"
        ])
        .prop_map(Value::from),
        ".{0,8}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// An object shaped like a stored one, with arbitrary content underneath.
fn object() -> impl Strategy<Value = Value> {
    (
        value(),
        value(),
        prop::collection::vec((key(), value()), 0..4),
    )
        .prop_map(|(meta, spec, extra)| {
            let mut o = Map::new();
            o.insert("metadata".into(), meta);
            o.insert("spec".into(), spec);
            o.extend(extra);
            Value::Object(o)
        })
}

fn pointer() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            "/",
            "/metadata",
            "/metadata/labels",
            "/metadata/labels/a",
            "/secrets/0",
            "/secrets/-",
            "/secrets/1/name",
            "/a~1b",
            "/a~0b",
            "/~2",
            "/~",
            "/0",
            "/-1",
            "/18446744073709551616",
            "metadata",
            "/spec/usages/00",
        ])
        .prop_map(String::from),
        prop::collection::vec(key(), 0..4)
            .prop_map(|ks| ks.iter().map(|k| format!("/{k}")).collect()),
    ]
}

fn json_patch() -> impl Strategy<Value = Value> {
    let op = (
        prop::sample::select(vec![
            "add", "remove", "replace", "move", "copy", "test", "nope",
        ]),
        pointer(),
        prop::option::of(pointer()),
        prop::option::of(value()),
    )
        .prop_map(|(op, path, from, value)| {
            let mut o = json!({"op": op, "path": path});
            if let Some(f) = from {
                o["from"] = f.into();
            }
            if let Some(v) = value {
                o["value"] = v;
            }
            o
        });
    prop_oneof![
        4 => prop::collection::vec(op, 0..6).prop_map(Value::Array),
        1 => value(),
    ]
}

/// A value with no `null` inside an object: what a merge patch can produce (RFC 7386).
fn null_free(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), null_free(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(null_free).collect()),
        other => other.clone(),
    }
}

fn entries() -> impl Strategy<Value = Vec<ManagedFieldsEntry>> {
    prop::collection::vec(
        (
            prop::sample::select(vec!["kubectl", "other", ""]),
            prop::sample::select(vec!["Apply", "Update", "Bogus"]),
            prop::sample::select(vec!["FieldsV1", "", "FieldsV2"]),
            prop::option::of(value()),
            prop::sample::select(vec!["", "status"]),
        )
            .prop_map(|(manager, operation, fields_type, fields_v1, sub)| {
                ManagedFieldsEntry {
                    manager: manager.into(),
                    operation: operation.into(),
                    api_version: "v1".into(),
                    fields_type: fields_type.into(),
                    fields_v1,
                    subresource: sub.into(),
                    ..Default::default()
                }
            }),
        0..3,
    )
}

fn writer<'a>(kind: &'a str, manager: &'a str) -> Writer<'a> {
    Writer {
        kind: strat(kind),
        api_version: "v1",
        manager,
        now: Time::now(),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_patches_never_panic(
        kind in prop::sample::select(KINDS),
        original in object(),
        doc in value(),
        ops in json_patch(),
        noise in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let doc_bytes = serde_json::to_vec(&doc).unwrap();
        let ops_bytes = serde_json::to_vec(&ops).unwrap();
        for patch in [&doc_bytes, &ops_bytes, &noise] {
            for t in [PatchType::Json, PatchType::Merge, PatchType::Strategic, PatchType::Apply] {
                let _ = apply_patch(strat(kind), t, &original, patch);
            }
        }
    }

    #[test]
    fn arbitrary_applies_never_panic(
        kind in prop::sample::select(KINDS),
        live in object(),
        config_ in prop_oneof![object(), value()],
        entries in entries(),
        force in any::<bool>(),
        manager in prop::sample::select(vec!["kubectl", "other"]),
    ) {
        let w = writer(kind, manager);
        if let Ok(applied) = managed::apply(&w, &live, &config_, &entries, force) {
            // Applying the same configuration again, as its owner, succeeds.
            let again = managed::apply(&w, &applied, &config_, &[], true);
            prop_assert!(again.is_ok(), "re-apply failed: {:?}", again);
        }
        let _ = managed::update(&w, Some(&live), &config_, &entries, &entries);
        let _ = managed::update(&w, None, &config_, &[], &entries);
    }

    #[test]
    fn a_computed_merge_patch_turns_the_original_into_the_target(
        from in object(),
        to in object(),
    ) {
        let to = null_free(&to);
        let patch = merge::create(&from, &to);
        prop_assert_eq!(&merge::apply(&from, &patch), &to);
        // The same through the request path: the patch as a body of its content type.
        let body = serde_json::to_vec(&patch).unwrap();
        let ct = PatchType::from_content_type("application/merge-patch+json; charset=utf-8");
        prop_assert_eq!(ct, Some(PatchType::Merge));
        let out = apply_patch(strat("ServiceAccount"), PatchType::Merge, &from, &body).unwrap();
        prop_assert_eq!(&out, &to);
    }

    #[test]
    fn a_merge_patch_applied_twice_changes_nothing_more(original in object(), patch in object()) {
        let once = merge::apply(&original, &patch);
        prop_assert_eq!(&merge::apply(&once, &patch), &once);
    }
}

/// `copy` operations that copy the document into itself double it each time: their total is
/// bounded (Kubernetes' 3 MiB), so the patch is refused with 422 long before memory runs out.
#[test]
fn self_doubling_copies_are_refused_not_an_exhausted_memory() {
    let doc = json!({"metadata": {"name": "a", "labels": {"x": "0123456789"}}, "spec": {}});
    let ops: Vec<Value> = (0..64)
        .map(|i| json!({"op": "copy", "from": "", "path": format!("/spec/c{i}")}))
        .collect();
    let err = apply_patch(
        strat("ServiceAccount"),
        PatchType::Json,
        &doc,
        &serde_json::to_vec(&ops).unwrap(),
    )
    .unwrap_err();
    assert_eq!(err.code(), 422, "{err}");
    assert!(
        err.to_string()
            .contains("the accumulated size increase of copy is"),
        "{err}"
    );
    // Copies within the bound still apply: eight doublings.
    let few: Vec<Value> = (0..8)
        .map(|i| json!({"op": "copy", "from": "", "path": format!("/spec/c{i}")}))
        .collect();
    let out = apply_patch(
        strat("ServiceAccount"),
        PatchType::Json,
        &doc,
        &serde_json::to_vec(&few).unwrap(),
    )
    .unwrap();
    fn names(v: &Value) -> usize {
        match v {
            Value::Object(m) => {
                usize::from(m.contains_key("name")) + m.values().map(names).sum::<usize>()
            }
            _ => 0,
        }
    }
    assert_eq!(names(&out), 1 << 8);
}

/// `move`s that wrap a subtree in a new level each (and `add`s at long paths) nest the
/// document deeper than any request body may; the patch is refused with 422 before the
/// document is deep enough to overflow the stack of the code that reads, encodes or drops it.
#[test]
fn patches_that_nest_deeper_than_a_body_may_are_refused() {
    let doc = json!({"metadata": {"name": "a"}, "spec": {}});
    // Each round: spec becomes {"a": spec}.
    let mut ops = Vec::new();
    for _ in 0..3_000 {
        ops.push(json!({"op": "add", "path": "/t", "value": {}}));
        ops.push(json!({"op": "move", "from": "/spec", "path": "/t/a"}));
        ops.push(json!({"op": "move", "from": "/t", "path": "/spec"}));
    }
    let err = apply_patch(
        strat("ServiceAccount"),
        PatchType::Json,
        &doc,
        &serde_json::to_vec(&ops).unwrap(),
    )
    .unwrap_err();
    assert_eq!(err.code(), 422, "{err}");
    assert!(err.to_string().contains("deeper than 128 levels"), "{err}");

    // An add of a nested value at a long path.
    let mut nested = json!({});
    for _ in 0..100 {
        nested = json!({"a": nested});
    }
    let path = format!("/spec{}", "/a".repeat(50));
    let mut spec = json!({});
    for _ in 0..50 {
        spec = json!({"a": spec});
    }
    let deep_doc = json!({"metadata": {"name": "a"}, "spec": spec});
    let add = json!([{"op": "add", "path": path, "value": nested}]);
    let err = apply_patch(
        strat("ServiceAccount"),
        PatchType::Json,
        &deep_doc,
        &serde_json::to_vec(&add).unwrap(),
    )
    .unwrap_err();
    assert_eq!(err.code(), 422, "{err}");
    // Within the bound it applies: 20 rounds nest spec 20 levels.
    let out = apply_patch(
        strat("ServiceAccount"),
        PatchType::Json,
        &doc,
        &serde_json::to_vec(&ops[..60]).unwrap(),
    )
    .unwrap();
    let mut at = &out["spec"];
    let mut levels = 0;
    while let Some(inner) = at.get("a") {
        levels += 1;
        at = inner;
    }
    assert_eq!(levels, 20);
}
