//! Property tests of label and field selectors, which arrive in every list and watch query:
//! arbitrary strings never panic the parsers; generated valid selectors, written with any
//! spacing, parse to the same selector and match exactly the labels (or fields) their model
//! says.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use svc_core::selector::{FieldSelector, FieldTerm, LabelSelector};

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(256)
    }
}

/// A requirement as a model: what it says, independent of the parser.
#[derive(Clone, Debug)]
enum Req {
    Eq(String, String, &'static str),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
    Gt(String, i64),
    Lt(String, i64),
}

impl Req {
    fn key(&self) -> &str {
        match self {
            Req::Eq(k, ..)
            | Req::Ne(k, _)
            | Req::In(k, _)
            | Req::NotIn(k, _)
            | Req::Exists(k)
            | Req::Absent(k)
            | Req::Gt(k, _)
            | Req::Lt(k, _) => k,
        }
    }

    fn holds(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(self.key());
        match self {
            Req::Eq(_, x, _) => v == Some(x),
            Req::Ne(_, x) => v != Some(x),
            Req::In(_, xs) => v.is_some_and(|v| xs.contains(v)),
            Req::NotIn(_, xs) => v.is_none_or(|v| !xs.contains(v)),
            Req::Exists(_) => v.is_some(),
            Req::Absent(_) => v.is_none(),
            Req::Gt(_, n) => v
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Req::Lt(_, n) => v
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        }
    }

    /// The requirement as text, with `sp` as the spacing around operators and set items.
    fn render(&self, sp: &str) -> String {
        match self {
            Req::Eq(k, v, op) => format!("{k}{sp}{op}{sp}{v}"),
            Req::Ne(k, v) => format!("{k}{sp}!={sp}{v}"),
            Req::In(k, vs) => format!("{k} in{sp}({sp}{}{sp})", vs.join(&format!("{sp},{sp}"))),
            Req::NotIn(k, vs) => {
                format!("{k} notin{sp}({sp}{}{sp})", vs.join(&format!("{sp},{sp}")))
            }
            Req::Exists(k) => k.clone(),
            Req::Absent(k) => format!("!{sp}{k}"),
            Req::Gt(k, n) => format!("{k}{sp}>{sp}{n}"),
            Req::Lt(k, n) => format!("{k}{sp}<{sp}{n}"),
        }
    }
}

/// Label keys from a small pool (so generated labels hit them), with and without prefixes.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("app".to_string()),
        Just("tier".to_string()),
        Just("svc.io/role".to_string()),
        Just("a.b-c.example.com/x_y.z".to_string()),
        "[a-z]([a-z0-9_.-]{0,10}[a-z0-9])?",
    ]
}

/// Label values: small integers (compared by `>`/`<`), a pool, and any valid value.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        (0i64..20).prop_map(|n| n.to_string()),
        Just("web".to_string()),
        Just(String::new()),
        "[A-Za-z0-9]([A-Za-z0-9_.-]{0,12}[A-Za-z0-9])?",
    ]
}

fn req() -> impl Strategy<Value = Req> {
    let values =
        || prop::collection::vec(value().prop_filter("non-empty", |v| !v.is_empty()), 1..4);
    prop_oneof![
        (key(), value(), prop::sample::select(vec!["=", "=="]))
            .prop_map(|(k, v, o)| Req::Eq(k, v, o)),
        (key(), value()).prop_map(|(k, v)| Req::Ne(k, v)),
        (key(), values()).prop_map(|(k, v)| Req::In(k, v)),
        (key(), values()).prop_map(|(k, v)| Req::NotIn(k, v)),
        key().prop_map(Req::Exists),
        key().prop_map(Req::Absent),
        (key(), -20i64..20).prop_map(|(k, n)| Req::Gt(k, n)),
        (key(), -20i64..20).prop_map(|(k, n)| Req::Lt(k, n)),
    ]
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(key(), value(), 0..5)
}

/// Text near the selector grammar: its characters in any order, and any string at all.
fn selector_noise() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z0-9=!<>(),/. \\\\\t-]{0,40}",
        "(notin|in|!|=|==|!=|\\(|\\)|,|<|>| |a|b/c|-1|9223372036854775808|é|\\\\)*",
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_text_never_panics_the_label_selector_parser(s in selector_noise()) {
        if let Ok(sel) = LabelSelector::parse(&s) {
            let _ = sel.matches(&BTreeMap::new());
        }
    }

    #[test]
    fn arbitrary_text_never_panics_the_field_selector_parser(s in selector_noise()) {
        if let Ok(sel) = FieldSelector::parse(&s, |_| true) {
            let _ = sel.matches(|_| None);
            let _ = sel.exact("metadata.name");
        }
        let _ = FieldSelector::parse(&s, |f| f == "metadata.name");
    }

    #[test]
    fn valid_label_selectors_parse_with_any_spacing_and_match_as_their_model_says(
        reqs in prop::collection::vec(req(), 0..5),
        spacing in prop::sample::select(vec!["", " ", "  ", "\t"]),
        sets in prop::collection::vec(labels(), 1..8),
    ) {
        let tight: Vec<String> = reqs.iter().map(|r| r.render("")).collect();
        let loose: Vec<String> = reqs.iter().map(|r| r.render(spacing)).collect();
        let tight = tight.join(",");
        let loose = format!("{spacing}{}{spacing}", loose.join(&format!("{spacing},{spacing}")));
        let a = LabelSelector::parse(&tight);
        prop_assert!(a.is_ok(), "{:?} does not parse: {:?}", tight, a);
        let a = a.unwrap();
        let b = LabelSelector::parse(&loose);
        prop_assert_eq!(Ok(&a), b.as_ref(), "{:?} and {:?} differ", tight, loose);
        prop_assert_eq!(a.is_empty(), reqs.is_empty());
        for l in &sets {
            let want = reqs.iter().all(|r| r.holds(l));
            prop_assert_eq!(a.matches(l), want, "{:?} against {:?}", tight, l);
        }
    }

    #[test]
    fn invalid_label_values_are_refused(
        k in key(),
        v in "[A-Za-z0-9]{0,3}[^A-Za-z0-9_.\\-,()=!<> \t\n\r\u{b}\u{c}][A-Za-z0-9]{0,3}",
    ) {
        prop_assert!(LabelSelector::parse(&format!("{k}={v}")).is_err(), "{k}={v}");
    }

    #[test]
    fn escaped_field_selectors_parse_to_their_terms(
        terms in prop::collection::vec(
            (
                prop::sample::select(vec!["metadata.name", "metadata.namespace", "spec.signerName", "type"]),
                "[^ \t\n\r\u{b}\u{c}]{0,12}",
                prop::sample::select(vec!["=", "==", "!="]),
            ),
            0..4,
        ),
        spacing in prop::sample::select(vec!["", " "]),
    ) {
        let escape = |v: &str| v.replace('\\', "\\\\").replace(',', "\\,").replace('=', "\\=");
        let text: Vec<String> = terms
            .iter()
            .map(|(f, v, op)| format!("{f}{op}{}", escape(v)))
            .collect();
        let text = text.join(&format!(",{spacing}"));
        let sel = FieldSelector::parse(&text, |_| true);
        let want: Vec<FieldTerm> = terms
            .iter()
            .map(|(f, v, op)| FieldTerm {
                field: f.to_string(),
                value: v.to_string(),
                negated: *op == "!=",
            })
            .collect();
        prop_assert_eq!(sel.map(|s| s.terms), Ok(want), "{:?}", text);
        prop_assert!(FieldSelector::parse(&text, |f| f == "other").is_ok() == terms.is_empty());
    }
}

/// Spaces around field selector terms are tolerated, but a value of other white space is a
/// value (it was trimmed away, so `metadata.name=\u{a0}` matched the empty name).
#[test]
fn field_selector_values_keep_non_ascii_white_space() {
    let sel = FieldSelector::parse("metadata.name=\u{a0}", |_| true).unwrap();
    assert_eq!(sel.exact("metadata.name"), Some("\u{a0}"));
    let sel =
        FieldSelector::parse(" metadata.name = a , type=\u{2003}x\u{2003} ", |_| true).unwrap();
    assert_eq!(sel.exact("metadata.name"), Some("a"));
    assert_eq!(sel.exact("type"), Some("\u{2003}x\u{2003}"));
}
