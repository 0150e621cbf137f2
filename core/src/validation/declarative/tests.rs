//! The evaluator check by check, the comparison, the three modes, and the shipped rules of
//! Namespace and ServiceAccount agreeing with the hand-written validation.

use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::json;

use super::*;
use crate::kinds::{Namespace, ServiceAccount};
use crate::object::{decode_json, prepare_create, prepare_update};

fn keys(errs: &ErrorList) -> Vec<(&str, &str)> {
    errs.0
        .iter()
        .map(|c| (c.field.as_str(), c.reason.as_str()))
        .collect()
}

fn check(rules: &[Rule], obj: Value, old: Option<Value>, want: &[(&str, &str)]) {
    let errs = evaluate(rules, &obj, old.as_ref());
    assert_eq!(keys(&errs), want, "{obj}");
}

#[test]
fn each_check_produces_its_error_type_at_the_concrete_path() {
    let required = [Rule::new("metadata.name", Check::Required("need one"))];
    check(&required, json!({"metadata": {"name": "a"}}), None, &[]);
    for missing in [
        json!({}),
        json!({"metadata": {}}),
        json!({"metadata": {"name": ""}}),
    ] {
        check(
            &required,
            missing,
            None,
            &[("metadata.name", "FieldValueRequired")],
        );
    }
    let errs = evaluate(&required, &json!({}), None);
    assert_eq!(errs.0[0].message, "Required value: need one");

    let max = [Rule::new("metadata.name", Check::MaxLength(5))];
    check(&max, json!({"metadata": {"name": "abcde"}}), None, &[]);
    check(
        &max,
        json!({"metadata": {"name": "abcdef"}}),
        None,
        &[("metadata.name", "FieldValueTooLong")],
    );
    // Other checks leave empty values to `Required`.
    check(&max, json!({}), None, &[]);

    let label = [Rule::new(
        "metadata.name",
        Check::Format(Format::Dns1123Label),
    )];
    check(&label, json!({"metadata": {"name": "ok-1"}}), None, &[]);
    let errs = evaluate(&label, &json!({"metadata": {"name": "Not.OK"}}), None);
    assert_eq!(keys(&errs), [("metadata.name", "FieldValueInvalid")]);
    assert!(errs.0[0].message.contains("RFC 1123 label"), "{errs:?}");
    let sub = [Rule::new("m", Check::Format(Format::Dns1123Subdomain))];
    check(&sub, json!({"m": "a.b"}), None, &[]);
    check(&sub, json!({"m": 7}), None, &[("m", "FieldValueInvalid")]);

    let phase = [Rule::new(
        "status.phase",
        Check::Enum(&["Active", "Terminating"]),
    )];
    check(&phase, json!({"status": {"phase": "Active"}}), None, &[]);
    check(
        &phase,
        json!({"status": {"phase": "Gone"}}),
        None,
        &[("status.phase", "FieldValueNotSupported")],
    );

    let immutable = [Rule::new("metadata.name", Check::Immutable)];
    let old = json!({"metadata": {"name": "a"}});
    check(&immutable, json!({"metadata": {"name": "b"}}), None, &[]);
    check(
        &immutable,
        json!({"metadata": {"name": "a"}}),
        Some(old.clone()),
        &[],
    );
    check(
        &immutable,
        json!({"metadata": {"name": "b"}}),
        Some(old.clone()),
        &[("metadata.name", "FieldValueInvalid")],
    );
    check(
        &immutable,
        json!({"metadata": {}}),
        Some(old),
        &[("metadata.name", "FieldValueInvalid")],
    );
}

#[test]
fn list_items_are_checked_one_by_one() {
    let rules = [Rule::new("secrets[*].name", Check::Required(""))];
    check(&rules, json!({}), None, &[]);
    check(&rules, json!({"secrets": []}), None, &[]);
    check(
        &rules,
        json!({"secrets": [{"name": "a"}, {}, {"name": ""}]}),
        None,
        &[
            ("secrets[1].name", "FieldValueRequired"),
            ("secrets[2].name", "FieldValueRequired"),
        ],
    );
    let immutable = [Rule::new("items[*].v", Check::Immutable)];
    check(
        &immutable,
        json!({"items": [{"v": 1}, {"v": 2}]}),
        Some(json!({"items": [{"v": 1}, {"v": 3}]})),
        &[("items[1].v", "FieldValueInvalid")],
    );
    assert_eq!(pattern_of("secrets[12].name"), "secrets[*].name");
    assert_eq!(pattern_of("metadata.labels[app]"), "metadata.labels[app]");
    assert_eq!(pattern_of("a[1].b[2]"), "a[*].b[*]");
}

fn errors(list: &[(&str, &str)]) -> ErrorList {
    let mut e = ErrorList::default();
    for (field, reason) in list {
        e.push(field, reason, String::new());
    }
    e
}

fn owned(list: &[(&str, &str)]) -> Keys {
    list.iter()
        .map(|(f, r)| (f.to_string(), r.to_string()))
        .collect()
}

#[test]
fn comparison_looks_at_covered_errors_by_field_and_type() {
    let rules = [
        Rule::new("metadata.name", Check::Required("")),
        Rule::new("metadata.name", Check::Format(Format::Dns1123Label)),
        Rule::new("secrets[*].name", Check::Required("")),
    ];
    let same = errors(&[
        ("metadata.name", "FieldValueInvalid"),
        ("secrets[0].name", "FieldValueRequired"),
    ]);
    assert_eq!(compare(&rules, &same, &same), (vec![], vec![]));
    // Errors no rule speaks for are not compared: a label, or a type the path has no rule of.
    let hand = errors(&[
        ("metadata.labels[x]", "FieldValueInvalid"),
        ("metadata.name", "FieldValueForbidden"),
        ("secrets[0].name", "FieldValueRequired"),
    ]);
    let decl = errors(&[("secrets[0].name", "FieldValueRequired")]);
    assert_eq!(compare(&rules, &hand, &decl), (vec![], vec![]));
    // Differences either way, counted as multisets.
    let hand = errors(&[
        ("metadata.name", "FieldValueInvalid"),
        ("metadata.name", "FieldValueInvalid"),
    ]);
    let decl = errors(&[
        ("metadata.name", "FieldValueInvalid"),
        ("secrets[3].name", "FieldValueRequired"),
    ]);
    assert_eq!(
        compare(&rules, &hand, &decl),
        (
            owned(&[("metadata.name", "FieldValueInvalid")]),
            owned(&[("secrets[3].name", "FieldValueRequired")])
        )
    );
}

/// A validator whose mismatches land in the returned list.
fn recording(mode: Mode) -> (Validator, Arc<Mutex<Vec<Mismatch>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    (
        Validator::new(mode, move |m| sink.lock().push(m.clone())),
        seen,
    )
}

fn sa(body: Value) -> ServiceAccount {
    decode_json(body.to_string().as_bytes()).unwrap()
}

#[test]
fn modes_decide_which_result_answers_and_every_mismatch_is_reported() {
    // A rule the hand-written validation does not have: the two disagree on long names.
    let stricter = Rule::new("metadata.name", Check::MaxLength(5));
    let long = sa(json!({"metadata": {"name": "longname", "namespace": "n"}}));
    let short = sa(json!({"metadata": {"name": "short", "namespace": "n"}}));

    let (compare_mode, seen) = recording(Mode::Compare);
    let compare_mode = compare_mode.with_rule("ServiceAccount", stricter);
    assert!(
        compare_mode
            .validate(&short, None, ErrorList::default())
            .is_empty()
    );
    assert!(seen.lock().is_empty(), "agreement is not a mismatch");
    assert!(
        compare_mode
            .validate(&long, None, ErrorList::default())
            .is_empty()
    );
    let m = seen.lock().pop().expect("the disagreement was reported");
    assert_eq!(
        (m.kind, m.operation, m.name.as_str()),
        ("ServiceAccount", "create", "longname")
    );
    assert_eq!(m.handwritten_only, vec![]);
    assert_eq!(
        m.declarative_only,
        owned(&[("metadata.name", "FieldValueTooLong")])
    );
    // Rules for another kind do not apply.
    let ns: Namespace = decode_json(br#"{"metadata":{"name":"longname"}}"#).unwrap();
    assert!(
        compare_mode
            .validate(&ns, None, ErrorList::default())
            .is_empty()
    );
    assert!(seen.lock().is_empty());

    let (takeover, seen) = recording(Mode::Takeover);
    let takeover = takeover.with_rule("ServiceAccount", stricter);
    // Uncovered hand-written errors stay; covered ones are replaced by the declarative set.
    let hand = errors(&[("metadata.labels[x]", "FieldValueInvalid")]);
    let out = takeover.validate(&long, None, hand);
    assert_eq!(
        keys(&out),
        [
            ("metadata.name", "FieldValueTooLong"),
            ("metadata.labels[x]", "FieldValueInvalid")
        ]
    );
    assert_eq!(seen.lock().len(), 1, "takeover reports mismatches too");

    let (off, seen) = recording(Mode::HandwrittenOnly);
    let off = off.with_rule("ServiceAccount", stricter);
    assert!(off.validate(&long, None, ErrorList::default()).is_empty());
    assert!(seen.lock().is_empty(), "hand-written only compares nothing");
}

/// Runs create (and update when `old` is given) in `mode`; the causes answered and the
/// mismatches seen.
fn run_sa(mode: Mode, body: Value, old: Option<Value>) -> (Vec<(String, String)>, usize) {
    let (v, seen) = recording(mode);
    let mut obj = sa(body);
    let result = match old {
        None => prepare_create(&mut obj, &crate::ambient::System, &v),
        Some(old) => {
            let mut old = sa(old);
            prepare_create(&mut old, &crate::ambient::System, &Validator::default()).unwrap();
            prepare_update(&mut obj, &old, &v)
        }
    };
    let causes = match result {
        Ok(()) => vec![],
        Err(crate::ApiError::Invalid { causes, .. }) => {
            let mut k: Vec<_> = causes.into_iter().map(|c| (c.field, c.reason)).collect();
            k.sort();
            k
        }
        Err(e) => panic!("{e}"),
    };
    let n = seen.lock().len();
    (causes, n)
}

#[test]
fn shipped_rules_agree_with_the_handwritten_validation() {
    let long_label = "a".repeat(64);
    let long_sub = "a".repeat(254);
    let creates = [
        json!({"metadata": {"name": "ok", "namespace": "n"}}),
        json!({"metadata": {"name": "a.b-c", "namespace": "n"}}),
        json!({"metadata": {"name": "Bad_Name", "namespace": "n"}}),
        json!({"metadata": {"name": long_sub, "namespace": "n"}}),
        json!({"metadata": {"namespace": "n"}}),
        json!({"metadata": {"name": "x"}}),
        json!({"metadata": {"name": "x", "namespace": "Bad.NS"}}),
        json!({"metadata": {"name": "x", "namespace": long_label}}),
        json!({"metadata": {"name": "x", "namespace": "n"}, "secrets": [{"name": "s"}, {"kind": "Secret"}]}),
        json!({"metadata": {"name": "x", "namespace": "n"}, "imagePullSecrets": [{}, {"name": ""}]}),
        json!({"metadata": {"name": "x", "namespace": "n", "labels": {"bad key": "v"}}}),
        json!({"metadata": {"name": "-", "namespace": "-", "labels": {"k": "-"}}, "secrets": [{}]}),
    ];
    for body in creates {
        let (hand, n) = run_sa(Mode::Compare, body.clone(), None);
        assert_eq!(n, 0, "mismatch on {body}");
        let (take, n) = run_sa(Mode::Takeover, body.clone(), None);
        assert_eq!(n, 0);
        assert_eq!(take, hand, "takeover answers differently for {body}");
    }
    let old = json!({"metadata": {"name": "x", "namespace": "n"}});
    let updates = [
        json!({"metadata": {"name": "x", "namespace": "n", "labels": {"a": "b"}}}),
        json!({"metadata": {"name": "y", "namespace": "n"}}),
        json!({"metadata": {"name": "x", "namespace": "m"}}),
        json!({"metadata": {"name": "Y_", "namespace": "n"}, "secrets": [{}]}),
    ];
    for body in updates {
        let (hand, n) = run_sa(Mode::Compare, body.clone(), Some(old.clone()));
        assert_eq!(n, 0, "mismatch on update to {body}");
        let (take, _) = run_sa(Mode::Takeover, body.clone(), Some(old.clone()));
        assert_eq!(
            take, hand,
            "takeover answers differently for update to {body}"
        );
    }

    for name in ["ok", "Bad", "", &long_label, "a.b"] {
        let (v, seen) = recording(Mode::Compare);
        let mut ns: Namespace =
            decode_json(json!({"metadata": {"name": name}}).to_string().as_bytes()).unwrap();
        let created = prepare_create(&mut ns, &crate::ambient::System, &v);
        assert_eq!(created.is_ok(), name == "ok", "{name:?}");
        assert!(seen.lock().is_empty(), "mismatch on namespace {name:?}");
    }
}
