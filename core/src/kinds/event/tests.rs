//! Event validation (create and update, as Kubernetes' `ValidateEventCreate` and
//! `ValidateEventUpdate` for `events.k8s.io/v1`), field selectors in both spellings, and the
//! Table cells kubectl shows.
// Test code: arithmetic on fixtures is checked by the assertions.
#![allow(clippy::arithmetic_side_effects)]

use serde_json::json;
use time::OffsetDateTime;

use super::*;
use crate::meta::ListMeta;
use crate::object;
use crate::table::{IncludeObject, table};

fn micro(t: &str) -> MicroTime {
    serde_json::from_value(json!(t)).unwrap()
}

fn reference(kind: &str, ns: &str, name: &str) -> ObjectReference {
    ObjectReference {
        kind: kind.into(),
        namespace: ns.into(),
        name: name.into(),
        uid: "u-1".into(),
        api_version: "v1".into(),
        resource_version: "17".into(),
        field_path: "spec.containers{web}".into(),
    }
}

/// A valid new event about pod `web` in namespace `x`.
fn valid() -> Event {
    let mut e = Event {
        metadata: ObjectMeta {
            name: "web.17a".into(),
            namespace: "x".into(),
            ..Default::default()
        },
        event_time: Some(micro("2024-05-06T07:08:09.123456Z")),
        reporting_controller: "svc.io/scheduler".into(),
        reporting_instance: "scheduler-1".into(),
        action: "Binding".into(),
        reason: "Scheduled".into(),
        regarding: reference("Pod", "x", "web"),
        note: "assigned x/web to node-1".into(),
        type_: EVENT_TYPE_NORMAL.into(),
        ..Default::default()
    };
    e.set_type_meta();
    e
}

fn causes(errs: &ErrorList) -> Vec<(String, String)> {
    errs.0
        .iter()
        .map(|c| (c.field.clone(), c.reason.clone()))
        .collect()
}

fn want(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(f, r)| (f.to_string(), r.to_string()))
        .collect()
}

const REQUIRED: &str = "FieldValueRequired";
const INVALID: &str = "FieldValueInvalid";

#[test]
fn creates_are_validated_as_kubernetes_does() {
    type Case = (
        &'static str,
        fn(&mut Event),
        &'static [(&'static str, &'static str)],
    );
    let cases: &[Case] = &[
        ("valid", |_| {}, &[]),
        (
            "no eventTime: only the legacy rules and the missing time",
            |e| e.event_time = None,
            &[("eventTime", REQUIRED)],
        ),
        ("no action", |e| e.action.clear(), &[("action", REQUIRED)]),
        (
            "action of 129 bytes",
            |e| e.action = "a".repeat(129),
            &[("action", INVALID)],
        ),
        ("action of 128 bytes", |e| e.action = "a".repeat(128), &[]),
        ("no reason", |e| e.reason.clear(), &[("reason", REQUIRED)]),
        (
            "reason of 129 bytes",
            |e| e.reason = "r".repeat(129),
            &[("reason", INVALID)],
        ),
        (
            "no reportingInstance",
            |e| e.reporting_instance.clear(),
            &[("reportingInstance", REQUIRED)],
        ),
        (
            "reportingInstance of 129 bytes",
            |e| e.reporting_instance = "i".repeat(129),
            &[("reportingInstance", INVALID)],
        ),
        (
            "no reportingController",
            |e| e.reporting_controller.clear(),
            &[("reportingController", REQUIRED)],
        ),
        (
            "reportingController not a qualified name",
            |e| e.reporting_controller = "my controller!".into(),
            &[("reportingController", INVALID)],
        ),
        ("note of 1024 bytes", |e| e.note = "n".repeat(1024), &[]),
        (
            "note of 1025 bytes",
            |e| e.note = "n".repeat(1025),
            &[("note", INVALID)],
        ),
        (
            "type neither Normal nor Warning",
            |e| e.type_ = "Info".into(),
            &[("type", INVALID)],
        ),
        ("no type", |e| e.type_.clear(), &[("type", INVALID)]),
        ("Warning", |e| e.type_ = EVENT_TYPE_WARNING.into(), &[]),
        (
            "series of one",
            |e| {
                e.series = Some(EventSeries {
                    count: 1,
                    last_observed_time: e.event_time,
                })
            },
            &[("series.count", INVALID)],
        ),
        (
            "series without lastObservedTime",
            |e| {
                e.series = Some(EventSeries {
                    count: 2,
                    last_observed_time: None,
                })
            },
            &[("series.lastObservedTime", REQUIRED)],
        ),
        (
            "a valid series",
            |e| {
                e.series = Some(EventSeries {
                    count: 5,
                    last_observed_time: e.event_time,
                })
            },
            &[],
        ),
        (
            "deprecated fields must be unset",
            |e| {
                e.deprecated_count = 3;
                e.deprecated_source.component = "kubelet".into();
                e.deprecated_first_timestamp = Some(Time::now());
                e.deprecated_last_timestamp = Some(Time::now());
            },
            &[
                ("deprecatedFirstTimestamp", INVALID),
                ("deprecatedLastTimestamp", INVALID),
                ("deprecatedCount", INVALID),
                ("deprecatedSource", INVALID),
            ],
        ),
        (
            "a cluster-scoped object's event outside default and kube-system",
            |e| e.regarding = reference("Node", "", "node-1"),
            &[("regarding.namespace", INVALID)],
        ),
        (
            "a cluster-scoped object's event in default",
            |e| {
                e.regarding = reference("Node", "", "node-1");
                e.metadata.namespace = "default".into();
            },
            &[],
        ),
        (
            "a cluster-scoped object's event in kube-system",
            |e| {
                e.regarding = reference("Node", "", "node-1");
                e.metadata.namespace = "kube-system".into();
            },
            &[],
        ),
        (
            "several problems, each named",
            |e| {
                e.action.clear();
                e.reason.clear();
                e.type_ = "Bad".into();
            },
            &[
                ("action", REQUIRED),
                ("reason", REQUIRED),
                ("type", INVALID),
            ],
        ),
    ];
    for (name, mutate, expected) in cases {
        let mut e = valid();
        mutate(&mut e);
        assert_eq!(causes(&e.validate()), want(expected), "{name}");
    }
}

#[test]
fn create_rejections_are_422_with_causes() {
    let mut e = valid();
    e.note = "n".repeat(2000);
    e.metadata.name = "Not_A_Name".into();
    let err = object::prepare_create(
        &mut e,
        &crate::ambient::System,
        &crate::validation::declarative::Validator::default(),
    )
    .unwrap_err();
    assert_eq!(err.code(), 422);
    let fields: Vec<String> = err
        .to_status()
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    assert_eq!(fields, ["metadata.name", "note"]);
    let mut ok = valid();
    object::prepare_create(
        &mut ok,
        &crate::ambient::System,
        &crate::validation::declarative::Validator::default(),
    )
    .unwrap();
    assert!(!ok.metadata.uid.is_empty());
}

#[test]
fn updates_may_change_only_the_series_and_metadata() {
    type Case = (
        &'static str,
        fn(&mut Event),
        &'static [(&'static str, &'static str)],
    );
    let cases: &[Case] = &[
        ("unchanged", |_| {}, &[]),
        (
            "labels",
            |e| {
                e.metadata.labels.insert("seen".into(), "yes".into());
            },
            &[],
        ),
        (
            "a series starts",
            |e| {
                e.series = Some(EventSeries {
                    count: 2,
                    last_observed_time: Some(MicroTime::now()),
                })
            },
            &[],
        ),
        (
            "an invalid series",
            |e| {
                e.series = Some(EventSeries {
                    count: 0,
                    last_observed_time: None,
                })
            },
            &[
                ("series.count", INVALID),
                ("series.lastObservedTime", REQUIRED),
            ],
        ),
        ("note", |e| e.note = "other".into(), &[("note", INVALID)]),
        (
            "regarding",
            |e| e.regarding.name = "other".into(),
            &[("regarding", INVALID)],
        ),
        (
            "related",
            |e| e.related = Some(reference("Node", "", "n")),
            &[("related", INVALID)],
        ),
        (
            "reason",
            |e| e.reason = "Other".into(),
            &[("reason", INVALID)],
        ),
        (
            "type",
            |e| e.type_ = EVENT_TYPE_WARNING.into(),
            &[("type", INVALID)],
        ),
        (
            "eventTime",
            |e| e.event_time = Some(MicroTime::now()),
            &[("eventTime", INVALID)],
        ),
        (
            "action",
            |e| e.action = "Other".into(),
            &[("action", INVALID)],
        ),
        (
            "reportingController",
            |e| e.reporting_controller = "other".into(),
            &[("reportingController", INVALID)],
        ),
        (
            "reportingInstance",
            |e| e.reporting_instance = "other".into(),
            &[("reportingInstance", INVALID)],
        ),
        (
            "deprecatedCount",
            |e| e.deprecated_count = 4,
            &[("deprecatedCount", INVALID)],
        ),
    ];
    let old = valid();
    for (name, mutate, expected) in cases {
        let mut e = valid();
        mutate(&mut e);
        assert_eq!(causes(&e.validate_update(&old)), want(expected), "{name}");
    }
    // Through the generic update path: 422 naming the field.
    let mut stored = valid();
    object::prepare_create(
        &mut stored,
        &crate::ambient::System,
        &crate::validation::declarative::Validator::default(),
    )
    .unwrap();
    let mut next = stored.clone();
    next.note = "rewritten".into();
    let err = object::prepare_update(
        &mut next,
        &stored,
        &crate::validation::declarative::Validator::default(),
    )
    .unwrap_err();
    assert_eq!(err.code(), 422);
    assert_eq!(err.to_status().details.unwrap().causes[0].field, "note");
}

#[test]
fn field_selectors_in_both_spellings() {
    let mut e = valid();
    e.related = Some(reference("Node", "", "node-1"));
    for (fields, value) in [
        (["regarding.kind", "involvedObject.kind"], "Pod"),
        (["regarding.namespace", "involvedObject.namespace"], "x"),
        (["regarding.name", "involvedObject.name"], "web"),
        (["regarding.uid", "involvedObject.uid"], "u-1"),
        (["regarding.apiVersion", "involvedObject.apiVersion"], "v1"),
        (
            [
                "regarding.resourceVersion",
                "involvedObject.resourceVersion",
            ],
            "17",
        ),
        (
            ["regarding.fieldPath", "involvedObject.fieldPath"],
            "spec.containers{web}",
        ),
        (
            ["reportingController", "reportingComponent"],
            "svc.io/scheduler",
        ),
        (["reason", "reason"], "Scheduled"),
        (["type", "type"], "Normal"),
        // No legacy source: the reporting controller stands in.
        (["source", "source"], "svc.io/scheduler"),
        (["metadata.name", "metadata.name"], "web.17a"),
        (["metadata.namespace", "metadata.namespace"], "x"),
    ] {
        for f in fields {
            assert!(Event::INFO.supports_field(f), "{f}");
            assert_eq!(
                crate::resource::field_value(&e, f).as_deref(),
                Some(value),
                "{f}"
            );
        }
    }
    e.deprecated_source.component = "kubelet".into();
    assert_eq!(e.field_value("source").as_deref(), Some("kubelet"));
    for unsupported in [
        "note",
        "related.name",
        "involvedObject.other",
        "series.count",
    ] {
        assert!(!Event::INFO.supports_field(unsupported), "{unsupported}");
        assert_eq!(e.field_value(unsupported), None, "{unsupported}");
    }
}

/// An RFC 3339 time `secs` seconds ago.
fn ago(secs: i64) -> String {
    let t = OffsetDateTime::now_utc() - time::Duration::seconds(secs);
    MicroTime::new(t).to_rfc3339()
}

fn rows(objects: Vec<Value>) -> Value {
    table(
        Event::INFO,
        &ListMeta::default(),
        objects,
        IncludeObject::None,
        OffsetDateTime::now_utc(),
    )
}

#[test]
fn table_columns_read_like_kubectl() {
    let mut new = serde_json::to_value(valid()).unwrap();
    new["eventTime"] = json!(ago(90));
    new["note"] = json!("  assigned x/web to node-1\n");
    let mut repeated = new.clone();
    repeated["metadata"]["name"] = json!("web.17b");
    repeated["series"] = json!({"count": 7, "lastObservedTime": ago(30)});
    // A legacy event as a core v1 writer left it: no eventTime, deprecated fields set.
    let legacy = json!({
        "metadata": {"name": "node-1.1", "namespace": "default"},
        "eventTime": null,
        "reason": "NodeReady",
        "type": "Normal",
        "regarding": {"kind": "Node", "name": "node-1"},
        "deprecatedSource": {"component": "kubelet", "host": "node-1"},
        "deprecatedFirstTimestamp": ago(5 * 3600 + 30 * 60),
        "deprecatedLastTimestamp": ago(20 * 60),
        "deprecatedCount": 4,
    });
    let t = rows(vec![new, repeated, legacy]);
    let names: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "Last Seen",
            "Type",
            "Reason",
            "Object",
            "Subobject",
            "Source",
            "Message",
            "First Seen",
            "Count",
            "Name"
        ]
    );
    let shown: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["priority"] == 0)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(shown, ["Last Seen", "Type", "Reason", "Object", "Message"]);
    assert_eq!(t["columnDefinitions"][9]["format"], "name");

    // Ages are computed now; allow the clock a second or two of progress.
    let seconds = |v: &Value| {
        v.as_str()
            .unwrap()
            .trim_end_matches('s')
            .parse::<i64>()
            .unwrap()
    };
    let new_row = &t["rows"][0]["cells"];
    assert!((90..=92).contains(&seconds(&new_row[0])), "{new_row}");
    assert_eq!(new_row[1], "Normal");
    assert_eq!(new_row[2], "Scheduled");
    assert_eq!(new_row[3], "pod/web");
    assert_eq!(new_row[4], "spec.containers{web}");
    assert_eq!(new_row[5], "svc.io/scheduler, scheduler-1");
    assert_eq!(new_row[6], "assigned x/web to node-1");
    assert_eq!(new_row[7], new_row[0]);
    assert_eq!(new_row[8], 1);
    assert_eq!(new_row[9], "web.17a");

    let repeated_row = &t["rows"][1]["cells"];
    assert!(
        (30..=32).contains(&seconds(&repeated_row[0])),
        "{repeated_row}"
    );
    assert_eq!(repeated_row[8], 7);
    assert_eq!(repeated_row[9], "web.17b");

    let legacy_row = &t["rows"][2]["cells"];
    assert_eq!(legacy_row[0], "20m");
    assert_eq!(legacy_row[3], "node/node-1");
    assert_eq!(legacy_row[5], "kubelet, node-1");
    assert_eq!(legacy_row[7], "5h30m");
    assert_eq!(legacy_row[8], 4);
}
