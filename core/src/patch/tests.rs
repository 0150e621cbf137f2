//! Table tests for every patch type (one `check(before, patch, after)` helper each), apply
//! ownership cases, field validation, and property tests.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::fieldset::{FieldSet, Path, to_field_set};
use super::managed::{self, Writer};
use super::{PatchType, apply_patch, merge};
use crate::meta::{ManagedFieldsEntry, Time};
use crate::strict::{self, FieldValidation};

use super::strategy::MergeStrategies;

/// ServiceAccount's merge strategies, as the handlers look them up.
fn sa_strategies() -> MergeStrategies {
    <crate::kinds::ServiceAccount as crate::Resource>::INFO.strategies()
}

fn check_json(before: Value, patch: Value, after: Value) {
    let got = apply_patch(
        sa_strategies(),
        PatchType::Json,
        &before,
        patch.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(got, after, "json patch {patch}");
}

fn check_json_err(before: Value, patch: Value, code: u16) {
    let e = apply_patch(
        sa_strategies(),
        PatchType::Json,
        &before,
        patch.to_string().as_bytes(),
    )
    .unwrap_err();
    assert_eq!(e.code(), code, "json patch {patch}: {e}");
}

#[test]
fn json_patch_table() {
    let doc = json!({"a": {"b": [1, 2]}, "c/d": 1, "e~f": 2});
    check_json(doc.clone(), json!([]), doc.clone());
    check_json(
        doc.clone(),
        json!([{"op": "add", "path": "/a/b/-", "value": 3}]),
        json!({"a": {"b": [1, 2, 3]}, "c/d": 1, "e~f": 2}),
    );
    check_json(
        doc.clone(),
        json!([{"op": "add", "path": "/a/b/0", "value": 0}]),
        json!({"a": {"b": [0, 1, 2]}, "c/d": 1, "e~f": 2}),
    );
    check_json(
        doc.clone(),
        json!([{"op": "remove", "path": "/c~1d"}, {"op": "remove", "path": "/e~0f"}]),
        json!({"a": {"b": [1, 2]}}),
    );
    check_json(
        doc.clone(),
        json!([{"op": "replace", "path": "/a/b/1", "value": "x"}]),
        json!({"a": {"b": [1, "x"]}, "c/d": 1, "e~f": 2}),
    );
    check_json(
        doc.clone(),
        json!([{"op": "move", "from": "/a/b", "path": "/z"}]),
        json!({"a": {}, "z": [1, 2], "c/d": 1, "e~f": 2}),
    );
    check_json(
        doc.clone(),
        json!([{"op": "copy", "from": "/a/b/0", "path": "/a/b/-"}]),
        json!({"a": {"b": [1, 2, 1]}, "c/d": 1, "e~f": 2}),
    );
    check_json(
        doc.clone(),
        json!([{"op": "test", "path": "/a/b", "value": [1, 2]}, {"op": "remove", "path": "/a"}]),
        json!({"c/d": 1, "e~f": 2}),
    );
    check_json(
        doc.clone(),
        json!([{"op": "add", "path": "", "value": 5}]),
        json!(5),
    );
    // A failed test and an operation on a missing path are 422, as Kubernetes answers.
    check_json_err(
        doc.clone(),
        json!([{"op": "test", "path": "/c~1d", "value": 2}]),
        422,
    );
    check_json_err(doc.clone(), json!([{"op": "remove", "path": "/nope"}]), 422);
    check_json_err(
        doc.clone(),
        json!([{"op": "replace", "path": "/a/b/9", "value": 1}]),
        422,
    );
    check_json_err(
        doc.clone(),
        json!([{"op": "add", "path": "/a/b/01", "value": 1}]),
        422,
    );
    check_json_err(
        doc.clone(),
        json!([{"op": "move", "from": "/a", "path": "/a/x"}]),
        422,
    );
    // Malformed patches are 400.
    check_json_err(doc.clone(), json!({"op": "add"}), 400);
    check_json_err(doc.clone(), json!([{"op": "frob", "path": "/a"}]), 400);
    check_json_err(
        doc.clone(),
        json!([{"op": "add", "path": "a", "value": 1}]),
        400,
    );
    check_json_err(doc.clone(), json!([{"op": "add", "path": "/a"}]), 400);
    let many: Vec<Value> = (0..10_001)
        .map(|_| json!({"op": "test", "path": "", "value": null}))
        .collect();
    check_json_err(doc, Value::Array(many), 413);
}

fn check_merge(before: Value, patch: Value, after: Value) {
    let got = apply_patch(
        sa_strategies(),
        PatchType::Merge,
        &before,
        patch.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(got, after, "merge patch {patch}");
}

#[test]
fn merge_patch_table() {
    // RFC 7386 appendix A, in part.
    check_merge(json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"}));
    check_merge(
        json!({"a": "b"}),
        json!({"b": "c"}),
        json!({"a": "b", "b": "c"}),
    );
    check_merge(json!({"a": "b"}), json!({"a": null}), json!({}));
    check_merge(
        json!({"a": [{"b": "c"}]}),
        json!({"a": [1]}),
        json!({"a": [1]}),
    );
    check_merge(
        json!({"e": null, "a": 1}),
        json!({"a": {"bb": {"ccc": null}}}),
        json!({"e": null, "a": {"bb": {}}}),
    );
    check_merge(
        json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "secrets": [{"name": "x"}]}),
        json!({"metadata": {"labels": {"a": null, "c": "3"}}, "secrets": [{"name": "y"}]}),
        json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "secrets": [{"name": "y"}]}),
    );
    let e = apply_patch(sa_strategies(), PatchType::Merge, &json!({}), b"[1]").unwrap_err();
    assert_eq!(e.code(), 400);
    let e = apply_patch(sa_strategies(), PatchType::Merge, &json!({}), b"{").unwrap_err();
    assert_eq!(e.code(), 400);
}

fn check_strategic(before: Value, patch: Value, after: Value) {
    let got = apply_patch(
        sa_strategies(),
        PatchType::Strategic,
        &before,
        patch.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(got, after, "strategic patch {patch}");
}

#[test]
fn strategic_patch_table() {
    let sa = json!({
        "metadata": {"name": "a", "labels": {"x": "1"}, "finalizers": ["f1", "f2"]},
        "secrets": [{"name": "s1"}, {"name": "s2", "kind": "Secret"}],
        "imagePullSecrets": [{"name": "p1"}]
    });
    // Keyed lists merge on `name`; atomic lists are replaced; sets union.
    check_strategic(
        sa.clone(),
        json!({
            "secrets": [{"name": "s2", "namespace": "n"}, {"name": "s3"}],
            "imagePullSecrets": [{"name": "p2"}],
            "metadata": {"finalizers": ["f3", "f1"], "labels": {"y": "2"}}
        }),
        json!({
            "metadata": {"name": "a", "labels": {"x": "1", "y": "2"}, "finalizers": ["f1", "f2", "f3"]},
            "secrets": [{"name": "s1"}, {"name": "s2", "kind": "Secret", "namespace": "n"}, {"name": "s3"}],
            "imagePullSecrets": [{"name": "p2"}]
        }),
    );
    // `$patch: delete` in a keyed list, `$deleteFromPrimitiveList`, null deletes a key.
    check_strategic(
        sa.clone(),
        json!({
            "secrets": [{"name": "s1", "$patch": "delete"}],
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"], "labels": {"x": null}}
        }),
        json!({
            "metadata": {"name": "a", "labels": {}, "finalizers": ["f2"]},
            "secrets": [{"name": "s2", "kind": "Secret"}],
            "imagePullSecrets": [{"name": "p1"}]
        }),
    );
    // `$patch: replace` on a list and on a map.
    check_strategic(
        sa.clone(),
        json!({"secrets": [{"$patch": "replace"}, {"name": "only"}],
               "metadata": {"labels": {"$patch": "replace", "z": "9"}}}),
        json!({
            "metadata": {"name": "a", "labels": {"z": "9"}, "finalizers": ["f1", "f2"]},
            "secrets": [{"name": "only"}],
            "imagePullSecrets": [{"name": "p1"}]
        }),
    );
    // `$setElementOrder` as kubectl apply sends it.
    check_strategic(
        sa.clone(),
        json!({"$setElementOrder/secrets": [{"name": "s3"}, {"name": "s2"}, {"name": "s1"}],
               "secrets": [{"name": "s3"}]}),
        json!({
            "metadata": {"name": "a", "labels": {"x": "1"}, "finalizers": ["f1", "f2"]},
            "secrets": [{"name": "s3"}, {"name": "s2", "kind": "Secret"}, {"name": "s1"}],
            "imagePullSecrets": [{"name": "p1"}]
        }),
    );
    // `$retainKeys` drops the keys it does not list; `$patch: delete` on a map removes it.
    check_strategic(
        json!({"metadata": {"labels": {"a": "1"}}, "automountServiceAccountToken": true}),
        json!({"$retainKeys": ["metadata"], "metadata": {"labels": {"$patch": "delete"}}}),
        json!({"metadata": {}}),
    );
    // A keyed item without its key, or an unknown directive, is a 400.
    for bad in [
        json!({"secrets": [{"kind": "Secret"}]}),
        json!({"metadata": {"$patch": "explode"}}),
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "f1"}}),
    ] {
        let e = apply_patch(
            sa_strategies(),
            PatchType::Strategic,
            &sa,
            bad.to_string().as_bytes(),
        )
        .unwrap_err();
        assert_eq!(e.code(), 400, "{bad}: {e}");
    }
}

#[test]
fn field_sets_encode_as_fields_v1() {
    let v = json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "a", "labels": {"app": "web"}, "finalizers": ["x"]},
        "secrets": [{"name": "s1"}],
        "imagePullSecrets": [{"name": "p"}],
        "automountServiceAccountToken": false
    });
    let set = to_field_set(sa_strategies(), &v);
    let fields = set.to_fields_v1();
    assert_eq!(
        fields,
        json!({
            "f:automountServiceAccountToken": {},
            "f:imagePullSecrets": {},
            "f:metadata": {"f:finalizers": {"v:\"x\"": {}}, "f:labels": {"f:app": {}}},
            "f:secrets": {"k:{\"name\":\"s1\"}": {".": {}, "f:name": {}}}
        })
    );
    assert_eq!(FieldSet::from_fields_v1(&fields).unwrap(), set);
    assert!(FieldSet::from_fields_v1(&json!({"x:y": {}})).is_err());
    assert!(FieldSet::from_fields_v1(&json!([])).is_err());
    let p = set
        .0
        .iter()
        .find(|p| p.0.len() == 3 && p.0[0] == super::fieldset::PathElement::Field("secrets".into()))
        .map(Path::to_string)
        .unwrap();
    assert_eq!(p, ".secrets[name=\"s1\"].name");
}

fn t0() -> Time {
    serde_json::from_value(json!("2024-01-01T00:00:00Z")).unwrap()
}

fn writer(manager: &str) -> Writer<'_> {
    Writer {
        kind: sa_strategies(),
        api_version: "v1",
        manager,
        now: t0(),
    }
}

fn entries(obj: &Value) -> Vec<ManagedFieldsEntry> {
    serde_json::from_value(obj["metadata"]["managedFields"].clone()).unwrap_or_default()
}

fn stub() -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "a", "namespace": "n"}})
}

fn apply(live: &Value, mgr: &str, config: Value, force: bool) -> Result<Value, crate::ApiError> {
    managed::apply(&writer(mgr), live, &config, &entries(live), force)
}

fn cfg(extra: Value) -> Value {
    merge::apply(&stub(), &extra)
}

#[test]
fn reapplying_later_keeps_the_object_byte_for_byte() {
    let manifest =
        cfg(json!({"metadata": {"labels": {"a": "1"}}, "automountServiceAccountToken": true}));
    let first = apply(&stub(), "alice", manifest.clone(), false).unwrap();
    let later: Time = serde_json::from_value(json!("2024-01-01T00:05:00Z")).unwrap();
    let w = Writer {
        now: later,
        ..writer("alice")
    };
    let again = managed::apply(&w, &first, &manifest, &entries(&first), false).unwrap();
    assert_eq!(
        again, first,
        "a no-op apply must not even move managedFields' time"
    );
    // A real change does take the new time.
    let changed =
        cfg(json!({"metadata": {"labels": {"a": "2"}}, "automountServiceAccountToken": true}));
    let third = managed::apply(&w, &first, &changed, &entries(&first), false).unwrap();
    assert_eq!(entries(&third)[0].time, Some(later));
}

#[test]
fn apply_creates_and_records_ownership() {
    let obj = apply(
        &stub(),
        "alice",
        cfg(json!({"metadata": {"labels": {"a": "1"}}, "automountServiceAccountToken": true})),
        false,
    )
    .unwrap();
    assert_eq!(obj["metadata"]["labels"], json!({"a": "1"}));
    let e = entries(&obj);
    assert_eq!(e.len(), 1);
    assert_eq!(
        (
            e[0].manager.as_str(),
            e[0].operation.as_str(),
            e[0].api_version.as_str()
        ),
        ("alice", "Apply", "v1")
    );
    assert_eq!(e[0].fields_type, "FieldsV1");
    assert_eq!(
        e[0].fields_v1,
        Some(
            json!({"f:automountServiceAccountToken": {}, "f:metadata": {"f:labels": {"f:a": {}}}})
        )
    );
}

#[test]
fn apply_conflicts_force_and_sharing() {
    let obj = apply(
        &stub(),
        "alice",
        cfg(json!({"automountServiceAccountToken": true})),
        false,
    )
    .unwrap();
    // Same value: shared ownership, no conflict.
    let shared = apply(
        &obj,
        "bob",
        cfg(json!({"automountServiceAccountToken": true})),
        false,
    )
    .unwrap();
    assert_eq!(entries(&shared).len(), 2);
    // A different value conflicts with both owners, naming field and manager.
    let e = apply(
        &shared,
        "carol",
        cfg(json!({"automountServiceAccountToken": false})),
        false,
    )
    .unwrap_err();
    assert_eq!(e.code(), 409);
    let st = e.to_status();
    assert_eq!(st.reason, "Conflict");
    let causes = st.details.unwrap().causes;
    assert_eq!(causes.len(), 2);
    assert_eq!(causes[0].reason, "FieldManagerConflict");
    assert_eq!(causes[0].field, ".automountServiceAccountToken");
    assert_eq!(causes[0].message, "conflict with \"alice\"");
    assert!(
        st.message.starts_with("Apply failed with 2 conflicts"),
        "{}",
        st.message
    );
    // force takes ownership from both.
    let forced = apply(
        &shared,
        "carol",
        cfg(json!({"automountServiceAccountToken": false})),
        true,
    )
    .unwrap();
    assert_eq!(forced["automountServiceAccountToken"], json!(false));
    let e = entries(&forced);
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].manager, "carol");
}

#[test]
fn apply_removes_dropped_fields_unless_owned_elsewhere() {
    let obj = apply(
        &stub(),
        "alice",
        cfg(json!({"metadata": {"labels": {"a": "1", "b": "2"}},
                   "secrets": [{"name": "s1"}, {"name": "s2"}]})),
        false,
    )
    .unwrap();
    let obj = apply(
        &obj,
        "bob",
        cfg(json!({"metadata": {"labels": {"b": "2"}}})),
        false,
    )
    .unwrap();
    // alice drops label b (bob still owns it), label a and secret s2 (nobody else owns them).
    let obj = apply(
        &obj,
        "alice",
        cfg(json!({"secrets": [{"name": "s1"}]})),
        false,
    )
    .unwrap();
    assert_eq!(obj["metadata"]["labels"], json!({"b": "2"}));
    assert_eq!(obj["secrets"], json!([{"name": "s1"}]));
    // The sharer bob gives up b by applying without it: now nobody owns it, so it goes.
    let obj = apply(
        &obj,
        "bob",
        cfg(json!({"automountServiceAccountToken": true})),
        false,
    )
    .unwrap();
    assert_eq!(obj["metadata"]["labels"], json!({}));
}

#[test]
fn update_records_and_resets_managed_fields() {
    let old = apply(
        &stub(),
        "alice",
        cfg(json!({"metadata": {"labels": {"a": "1"}}})),
        false,
    )
    .unwrap();
    let mut new = old.clone();
    new["metadata"]["labels"]["a"] = json!("2");
    new["metadata"]["annotations"] = json!({"n": "x"});
    let w = writer("kubectl-edit");
    let e = managed::update(&w, Some(&old), &new, &entries(&old), &[]).unwrap();
    // The updater took label a from alice (whose entry is now empty and dropped).
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(
        (e[0].manager.as_str(), e[0].operation.as_str()),
        ("kubectl-edit", "Update")
    );
    assert_eq!(
        e[0].fields_v1,
        Some(
            json!({"f:metadata": {"f:annotations": {".": {}, "f:n": {}}, "f:labels": {"f:a": {}}}})
        )
    );
    // `[]` keeps the entries; `[{}]` resets them before recording this write.
    let kept = managed::update(&w, Some(&old), &old, &entries(&old), &[]).unwrap();
    assert_eq!(kept, entries(&old));
    let reset = managed::update(
        &w,
        Some(&old),
        &old,
        &entries(&old),
        &[ManagedFieldsEntry::default()],
    )
    .unwrap();
    assert!(reset.is_empty());
    // Create: everything the object sets belongs to the creator.
    let created = managed::update(
        &w,
        None,
        &cfg(json!({"secrets": [{"name": "s"}]})),
        &[],
        &[],
    )
    .unwrap();
    assert_eq!(
        created[0].fields_v1,
        Some(json!({"f:secrets": {".": {}, "k:{\"name\":\"s\"}": {".": {}, "f:name": {}}}}))
    );
}

#[test]
fn apply_rejects_managed_fields_in_config() {
    let e = apply(
        &stub(),
        "a",
        cfg(json!({"metadata": {"managedFields": [{}]}})),
        false,
    )
    .unwrap_err();
    assert_eq!(e.code(), 400);
}

#[test]
fn field_validation_finds_unknown_and_duplicate_fields() {
    let (v, dups) =
        strict::parse_json(br#"{"metadata":{"name":"a","name":"b"},"spec":{"foo":1}}"#).unwrap();
    assert_eq!(dups, vec!["duplicate field \"metadata.name\""]);
    assert_eq!(v["metadata"]["name"], "b");
    let (sa, unknown) = strict::decode_value::<crate::kinds::ServiceAccount>(v).unwrap();
    assert_eq!(sa.metadata.name, "b");
    assert_eq!(unknown, vec!["unknown field \"spec\""]);
    let (_, unknown) = strict::decode_value::<crate::kinds::ServiceAccount>(
        json!({"secrets": [{"name": "x", "bogus": 1}]}),
    )
    .unwrap();
    assert_eq!(unknown, vec!["unknown field \"secrets[0].bogus\""]);
    let strict = FieldValidation::Strict.check(unknown.clone()).unwrap_err();
    assert_eq!(strict.code(), 400);
    assert_eq!(
        strict.to_string(),
        "strict decoding error: unknown field \"secrets[0].bogus\""
    );
    assert_eq!(
        FieldValidation::Warn.check(unknown.clone()).unwrap(),
        unknown
    );
    assert!(FieldValidation::Ignore.check(unknown).unwrap().is_empty());
    assert!(FieldValidation::parse(Some("Loose")).is_err());
}

fn small_object() -> impl Strategy<Value = Value> {
    let key = prop::sample::select(vec!["a", "b", "c"]);
    let scalar = prop_oneof![
        any::<bool>().prop_map(Value::from),
        (0i64..5).prop_map(Value::from),
        "[xy]{0,2}".prop_map(Value::from),
    ];
    let leaf = prop::collection::btree_map(key.clone(), scalar, 0..3)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()));
    prop::collection::btree_map(
        key,
        prop_oneof![leaf.clone(), leaf.prop_map(|v| json!([v]))],
        0..3,
    )
    .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}

fn service_account() -> impl Strategy<Value = Value> {
    let name = prop::sample::select(vec!["s1", "s2", "s3"]);
    (
        prop::collection::btree_map("[a-c]", "[a-c]{1,2}", 0..3),
        prop::collection::btree_set(name, 0..3),
        prop::option::of(any::<bool>()),
        prop::collection::btree_set("[f-h]", 0..3),
    )
        .prop_map(|(labels, secrets, automount, finalizers)| {
            let mut v = cfg(json!({
                "metadata": {"labels": labels, "finalizers": finalizers},
                "secrets": secrets.into_iter().map(|s| json!({"name": s})).collect::<Vec<_>>(),
            }));
            if let Some(b) = automount {
                v["automountServiceAccountToken"] = json!(b);
            }
            v
        })
}

proptest! {
    #[test]
    fn merge_patch_between_two_objects_turns_one_into_the_other(
        a in small_object(), b in small_object()
    ) {
        let p = merge::create(&a, &b);
        prop_assert_eq!(merge::apply(&a, &p), b);
    }

    #[test]
    fn applying_the_same_manifest_twice_is_a_no_op(first in service_account(), cfg2 in service_account()) {
        let once = apply(&stub(), "m", first.clone(), false).unwrap();
        let twice = apply(&once, "m", first, false).unwrap();
        prop_assert_eq!(&once, &twice);
        let other = apply(&once, "m", cfg2.clone(), false).unwrap();
        let again = apply(&other, "m", cfg2, false).unwrap();
        prop_assert_eq!(other, again);
    }
}
