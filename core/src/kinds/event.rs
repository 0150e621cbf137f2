//! `Event` (`events.svc.io/v1`, namespaced): a report of something that happened, shaped and
//! validated as Kubernetes' `events.k8s.io/v1` Event. Events expire: every write gives them the
//! server's time to live (`--event-ttl`), after which the store removes them.

use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::codec::convert::{
    micro_time_from_wire, micro_time_to_wire, object_meta_from_wire, object_meta_to_wire,
    time_from_wire, time_to_wire,
};
use crate::codec::{ProtoKind, decode_error};
use crate::kinds::ObjectReference;
use crate::meta::{MicroTime, ObjectMeta, Time};
use crate::resource::{Column, Resource, ResourceInfo, STANDARD_VERBS, Scope};
use crate::status::ApiError;
use crate::validation::{self, ErrorList, NameRule};

pub const EVENT_TYPE_NORMAL: &str = "Normal";
pub const EVENT_TYPE_WARNING: &str = "Warning";

// Kubernetes' limits (`pkg/apis/core/validation/events.go`), counted in bytes as Go's `len`.
const ACTION_MAX: usize = 128;
const REASON_MAX: usize = 128;
const REPORTING_INSTANCE_MAX: usize = 128;
const NOTE_MAX: usize = 1024;

/// Where a legacy event about a cluster-scoped object may live (Kubernetes'
/// `NamespaceDefault` and `NamespaceSystem`).
const NAMESPACES_FOR_CLUSTER_OBJECTS: &[&str] = &["default", "kube-system"];

/// Repeated occurrences of an event, as last reported.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventSeries {
    /// Occurrences up to the last heartbeat; at least 2.
    #[serde(default)]
    pub count: i32,
    /// Required; Go writes an unset one as `null`, and so do we.
    #[serde(default)]
    pub last_observed_time: Option<MicroTime>,
}

/// The legacy `source` of core events.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventSource {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub component: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
}

/// Field order and presence follow Go's JSON of `events.k8s.io/v1` Event: struct-valued
/// fields (`regarding`, `deprecatedSource`) and times (`eventTime`, `deprecated*Timestamp`)
/// are always written, `null` when unset; optional pointers (`series`, `related`) and empty
/// strings are left out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// When the event was first observed; required.
    #[serde(default)]
    pub event_time: Option<MicroTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<EventSeries>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reporting_controller: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reporting_instance: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub action: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default)]
    pub regarding: ObjectReference,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub related: Option<ObjectReference>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub type_: String,
    #[serde(default)]
    pub deprecated_source: EventSource,
    #[serde(default)]
    pub deprecated_first_timestamp: Option<Time>,
    #[serde(default)]
    pub deprecated_last_timestamp: Option<Time>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deprecated_count: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// The field selectors Kubernetes offers on events in both spellings: `events.k8s.io`'s
/// (`regarding.*`, `reportingController`) and core v1's (`involvedObject.*`,
/// `reportingComponent`), plus `reason`, `type` and `source`.
const FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "type",
    "reportingController",
    "reportingComponent",
    "source",
];

static INFO: ResourceInfo = ResourceInfo {
    group: "events.svc.io",
    version: "v1",
    kind: "Event",
    list_kind: "EventList",
    plural: "events",
    singular: "event",
    short_names: &["ev"],
    scope: Scope::Namespaced,
    verbs: STANDARD_VERBS,
    name_rule: NameRule::Dns1123Subdomain,
    extra_fields: FIELDS,
    // Kubernetes' event strategy allows it: recorders PUT series updates blindly.
    allow_create_on_update: true,
    delete_returns_object: false,
    merge_strategies: &[],
    columns: COLUMNS,
    schema,
    subresources: &[],
    stored: true,
    expires: true,
};

fn schema() -> Value {
    let string = json!({"type": "string"});
    let micro_time = json!({"type": "string", "format": "date-time"});
    let reference = json!({"type": "object", "properties": {
        "kind": string, "namespace": string, "name": string, "uid": string,
        "apiVersion": string, "resourceVersion": string, "fieldPath": string}});
    json!({
        "eventTime": micro_time,
        "series": {"type": "object", "required": ["count", "lastObservedTime"], "properties": {
            "count": {"type": "integer", "format": "int32"},
            "lastObservedTime": micro_time}},
        "reportingController": string,
        "reportingInstance": string,
        "action": string,
        "reason": string,
        "regarding": reference,
        "related": reference,
        "note": string,
        "type": string,
        "deprecatedSource": {"type": "object", "properties": {
            "component": string, "host": string}},
        "deprecatedFirstTimestamp": {"type": "string", "format": "date-time"},
        "deprecatedLastTimestamp": {"type": "string", "format": "date-time"},
        "deprecatedCount": {"type": "integer", "format": "int32"},
    })
}

/// Kubernetes' event columns (`printers.go`, the wide set the server always sends; kubectl
/// hides priority 1 unless `-o wide`). The name comes last.
const COLUMNS: &[Column] = &[
    Column {
        name: "Last Seen",
        ty: "string",
        format: "",
        priority: 0,
        description: "The time at which the most recent occurrence of this event was recorded.",
        cell: cells::last_seen,
    },
    Column {
        name: "Type",
        ty: "string",
        format: "",
        priority: 0,
        description: "Type of this event (Normal, Warning), new types could be added in the \
                      future.",
        cell: cells::type_,
    },
    Column {
        name: "Reason",
        ty: "string",
        format: "",
        priority: 0,
        description: "Why the action was taken.",
        cell: cells::reason,
    },
    Column {
        name: "Object",
        ty: "string",
        format: "",
        priority: 0,
        description: "The object this Event is about.",
        cell: cells::object,
    },
    Column {
        name: "Subobject",
        ty: "string",
        format: "",
        priority: 1,
        description: "The part of the object the event is about (fieldPath).",
        cell: cells::subobject,
    },
    Column {
        name: "Source",
        ty: "string",
        format: "",
        priority: 1,
        description: "The component reporting this event.",
        cell: cells::source,
    },
    Column {
        name: "Message",
        ty: "string",
        format: "",
        priority: 0,
        description: "A human-readable description of the status of this operation.",
        cell: cells::message,
    },
    Column {
        name: "First Seen",
        ty: "string",
        format: "",
        priority: 1,
        description: "The time at which the event was first recorded.",
        cell: cells::first_seen,
    },
    Column {
        name: "Count",
        ty: "string",
        format: "",
        priority: 1,
        description: "The number of times this event has occurred.",
        cell: cells::count,
    },
    Column {
        name: "Name",
        ty: "string",
        format: "name",
        priority: 1,
        description: "Name must be unique within a namespace.",
        cell: cells::name,
    },
];

/// Table cells read from an event's JSON form, as Kubernetes' `printEvent` computes them.
mod cells {
    use serde_json::Value;
    use time::OffsetDateTime;

    use crate::table::age;

    fn text<'a>(v: &'a Value, path: &[&str]) -> &'a str {
        path.iter()
            .try_fold(v, |v, key| v.get(key))
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// The text at `path`, else the text at `fallback`.
    fn either<'a>(v: &'a Value, path: &[&str], fallback: &[&str]) -> &'a str {
        match text(v, path) {
            "" => text(v, fallback),
            s => s,
        }
    }

    fn ago(timestamp: &str, now: OffsetDateTime) -> Value {
        Value::from(age(Some(timestamp), now))
    }

    /// `deprecatedFirstTimestamp`, else `eventTime` (empty when neither is set).
    fn first_timestamp(v: &Value) -> &str {
        either(v, &["deprecatedFirstTimestamp"], &["eventTime"])
    }

    pub(super) fn first_seen(v: &Value, now: OffsetDateTime) -> Value {
        ago(first_timestamp(v), now)
    }

    pub(super) fn last_seen(v: &Value, now: OffsetDateTime) -> Value {
        if v.get("series").is_some_and(Value::is_object) {
            return ago(text(v, &["series", "lastObservedTime"]), now);
        }
        match text(v, &["deprecatedLastTimestamp"]) {
            "" => ago(first_timestamp(v), now),
            last => ago(last, now),
        }
    }

    pub(super) fn type_(v: &Value, _now: OffsetDateTime) -> Value {
        Value::from(text(v, &["type"]))
    }

    pub(super) fn reason(v: &Value, _now: OffsetDateTime) -> Value {
        Value::from(text(v, &["reason"]))
    }

    /// `kind/name` in lower case (just the kind without a name).
    pub(super) fn object(v: &Value, _now: OffsetDateTime) -> Value {
        let kind = text(v, &["regarding", "kind"]).to_lowercase();
        match text(v, &["regarding", "name"]) {
            "" => Value::from(kind),
            name => Value::from(format!("{kind}/{name}")),
        }
    }

    pub(super) fn subobject(v: &Value, _now: OffsetDateTime) -> Value {
        Value::from(text(v, &["regarding", "fieldPath"]))
    }

    /// `component, host` of the legacy source, each falling back to the reporting
    /// controller and instance.
    pub(super) fn source(v: &Value, _now: OffsetDateTime) -> Value {
        let component = either(
            v,
            &["deprecatedSource", "component"],
            &["reportingController"],
        );
        match either(v, &["deprecatedSource", "host"], &["reportingInstance"]) {
            "" => Value::from(component),
            host => Value::from(format!("{component}, {host}")),
        }
    }

    pub(super) fn message(v: &Value, _now: OffsetDateTime) -> Value {
        Value::from(text(v, &["note"]).trim())
    }

    /// The series' count, else `deprecatedCount`, else 1 (a singleton event).
    pub(super) fn count(v: &Value, _now: OffsetDateTime) -> Value {
        let number = |path: &[&str]| {
            path.iter()
                .try_fold(v, |v, key| v.get(key))
                .and_then(Value::as_i64)
        };
        if v.get("series").is_some_and(Value::is_object) {
            return Value::from(number(&["series", "count"]).unwrap_or(0));
        }
        Value::from(
            number(&["deprecatedCount"])
                .filter(|n| *n != 0)
                .unwrap_or(1),
        )
    }

    pub(super) fn name(v: &Value, _now: OffsetDateTime) -> Value {
        Value::from(text(v, &["metadata", "name"]))
    }
}

/// `Invalid value: "": <detail>`, the form Kubernetes' event validation uses (it does not
/// echo values that may be long).
fn invalid_blank(errs: &mut ErrorList, field: &str, detail: &str) {
    errs.invalid(field, "", detail);
}

fn check_length(errs: &mut ErrorList, field: &str, value: &str, max: usize) {
    if value.len() > max {
        invalid_blank(errs, field, &format!("can have at most {max} characters"));
    }
}

impl Event {
    /// Kubernetes' `legacyValidateEvent`: what every event, old or new, must satisfy.
    fn validate_legacy(&self) -> ErrorList {
        let mut errs = ErrorList::default();
        let ns = self.metadata.namespace.as_str();
        let regarding_ns = self.regarding.namespace.as_str();
        let mismatch = |errs: &mut ErrorList| {
            errs.invalid(
                "regarding.namespace",
                regarding_ns,
                "does not match event.namespace",
            );
        };
        if self.event_time.is_none() {
            // An old-style event: its namespace is the object's (or `default`).
            let fits = if regarding_ns.is_empty() {
                ns.is_empty() || ns == "default"
            } else {
                ns == regarding_ns
            };
            if !fits {
                mismatch(&mut errs);
            }
            return errs;
        }
        if regarding_ns.is_empty() && !NAMESPACES_FOR_CLUSTER_OBJECTS.contains(&ns) {
            mismatch(&mut errs);
        }
        if self.reporting_controller.is_empty() {
            errs.required("reportingController", "");
        } else if let Err(e) = validation::qualified_name(&self.reporting_controller) {
            errs.invalid("reportingController", &self.reporting_controller, &e);
        }
        if self.reporting_instance.is_empty() {
            errs.required("reportingInstance", "");
        }
        check_length(
            &mut errs,
            "reportingInstance",
            &self.reporting_instance,
            REPORTING_INSTANCE_MAX,
        );
        if self.action.is_empty() {
            errs.required("action", "");
        }
        check_length(&mut errs, "action", &self.action, ACTION_MAX);
        if self.reason.is_empty() {
            errs.required("reason", "");
        }
        check_length(&mut errs, "reason", &self.reason, REASON_MAX);
        check_length(&mut errs, "note", &self.note, NOTE_MAX);
        errs
    }

    /// Kubernetes' `validateV1EventSeries`.
    fn validate_series(&self) -> ErrorList {
        let mut errs = ErrorList::default();
        if let Some(series) = &self.series {
            if series.count < 2 {
                invalid_blank(&mut errs, "series.count", "should be at least 2");
            }
            if series.last_observed_time.is_none() {
                errs.required("series.lastObservedTime", "");
            }
        }
        errs
    }
}

/// Adds `field is immutable` for `field` when `new` and `old` differ.
fn immutable<T: PartialEq + Serialize>(errs: &mut ErrorList, field: &str, new: &T, old: &T) {
    if new != old {
        let shown = serde_json::to_string(new).unwrap_or_default();
        errs.invalid(field, shown.trim_matches('"'), "field is immutable");
    }
}

impl Resource for Event {
    const INFO: &'static ResourceInfo = &INFO;

    crate::resource::object_accessors!();

    /// Kubernetes' `ValidateEventCreate` for `events.k8s.io/v1` (the strict rules; the only
    /// version served here). Errors name the fields as this API spells them (`note`,
    /// `deprecatedCount`), where Kubernetes reports its internal names (`message`, `count`).
    fn validate(&self) -> ErrorList {
        let mut errs = self.validate_legacy();
        errs.extend(self.validate_series());
        if self.event_time.is_none() {
            errs.required("eventTime", "");
        }
        if self.type_ != EVENT_TYPE_NORMAL && self.type_ != EVENT_TYPE_WARNING {
            invalid_blank(
                &mut errs,
                "type",
                &format!("has invalid value: {}", self.type_),
            );
        }
        if self.deprecated_first_timestamp.is_some() {
            invalid_blank(&mut errs, "deprecatedFirstTimestamp", "needs to be unset");
        }
        if self.deprecated_last_timestamp.is_some() {
            invalid_blank(&mut errs, "deprecatedLastTimestamp", "needs to be unset");
        }
        if self.deprecated_count != 0 {
            invalid_blank(&mut errs, "deprecatedCount", "needs to be unset");
        }
        if self.deprecated_source != EventSource::default() {
            invalid_blank(&mut errs, "deprecatedSource", "needs to be unset");
        }
        errs
    }

    /// Kubernetes' `ValidateEventUpdate`: only `series` (and metadata) may change; a changed
    /// series is validated again. The object as a whole then passes `validate` too.
    fn validate_update(&self, old: &Self) -> ErrorList {
        let mut errs = self.validate_legacy();
        if self.series != old.series {
            errs.extend(self.validate_series());
        }
        immutable(&mut errs, "regarding", &self.regarding, &old.regarding);
        immutable(&mut errs, "reason", &self.reason, &old.reason);
        immutable(&mut errs, "note", &self.note, &old.note);
        immutable(
            &mut errs,
            "deprecatedSource",
            &self.deprecated_source,
            &old.deprecated_source,
        );
        immutable(
            &mut errs,
            "deprecatedFirstTimestamp",
            &self.deprecated_first_timestamp,
            &old.deprecated_first_timestamp,
        );
        immutable(
            &mut errs,
            "deprecatedLastTimestamp",
            &self.deprecated_last_timestamp,
            &old.deprecated_last_timestamp,
        );
        immutable(
            &mut errs,
            "deprecatedCount",
            &self.deprecated_count,
            &old.deprecated_count,
        );
        immutable(&mut errs, "type", &self.type_, &old.type_);
        immutable(&mut errs, "eventTime", &self.event_time, &old.event_time);
        immutable(&mut errs, "action", &self.action, &old.action);
        immutable(&mut errs, "related", &self.related, &old.related);
        immutable(
            &mut errs,
            "reportingController",
            &self.reporting_controller,
            &old.reporting_controller,
        );
        immutable(
            &mut errs,
            "reportingInstance",
            &self.reporting_instance,
            &old.reporting_instance,
        );
        errs
    }

    fn field_value(&self, field: &str) -> Option<String> {
        let r = &self.regarding;
        let value = match field {
            "regarding.kind" | "involvedObject.kind" => &r.kind,
            "regarding.namespace" | "involvedObject.namespace" => &r.namespace,
            "regarding.name" | "involvedObject.name" => &r.name,
            "regarding.uid" | "involvedObject.uid" => &r.uid,
            "regarding.apiVersion" | "involvedObject.apiVersion" => &r.api_version,
            "regarding.resourceVersion" | "involvedObject.resourceVersion" => &r.resource_version,
            "regarding.fieldPath" | "involvedObject.fieldPath" => &r.field_path,
            "reason" => &self.reason,
            "type" => &self.type_,
            "reportingController" | "reportingComponent" => &self.reporting_controller,
            // The legacy source's component, else the reporting controller (Kubernetes'
            // `ToSelectableFields`).
            "source" if self.deprecated_source.component.is_empty() => &self.reporting_controller,
            "source" => &self.deprecated_source.component,
            _ => return None,
        };
        Some(value.clone())
    }
}

impl ProtoKind for Event {
    fn to_proto_bytes(&self) -> Vec<u8> {
        wire::Event {
            metadata: Some(object_meta_to_wire(&self.metadata)),
            event_time: self.event_time.as_ref().map(micro_time_to_wire),
            series: self.series.as_ref().map(|s| wire::EventSeries {
                count: s.count,
                last_observed_time: s.last_observed_time.as_ref().map(micro_time_to_wire),
            }),
            reporting_controller: self.reporting_controller.clone(),
            reporting_instance: self.reporting_instance.clone(),
            action: self.action.clone(),
            reason: self.reason.clone(),
            // Go writes struct-valued fields always; pointers only when set.
            regarding: Some(self.regarding.to_wire()),
            related: self.related.as_ref().map(ObjectReference::to_wire),
            note: self.note.clone(),
            r#type: self.type_.clone(),
            deprecated_source: Some(wire::EventSource {
                component: self.deprecated_source.component.clone(),
                host: self.deprecated_source.host.clone(),
            }),
            deprecated_first_timestamp: self.deprecated_first_timestamp.as_ref().map(time_to_wire),
            deprecated_last_timestamp: self.deprecated_last_timestamp.as_ref().map(time_to_wire),
            deprecated_count: self.deprecated_count,
        }
        .encode_to_vec()
    }

    fn from_proto_bytes(raw: &[u8]) -> Result<Self, ApiError> {
        let m = wire::Event::decode(raw).map_err(|e| decode_error("Event", e))?;
        let series = match m.series {
            None => None,
            Some(s) => Some(EventSeries {
                count: s.count,
                last_observed_time: micro_time_from_wire(s.last_observed_time.as_ref())?,
            }),
        };
        let source = m.deprecated_source.unwrap_or_default();
        Ok(Event {
            api_version: String::new(),
            kind: String::new(),
            metadata: object_meta_from_wire(m.metadata.unwrap_or_default())?,
            event_time: micro_time_from_wire(m.event_time.as_ref())?,
            series,
            reporting_controller: m.reporting_controller,
            reporting_instance: m.reporting_instance,
            action: m.action,
            reason: m.reason,
            regarding: ObjectReference::from_wire(m.regarding.unwrap_or_default()),
            related: m.related.map(ObjectReference::from_wire),
            note: m.note,
            type_: m.r#type,
            deprecated_source: EventSource {
                component: source.component,
                host: source.host,
            },
            deprecated_first_timestamp: time_from_wire(m.deprecated_first_timestamp.as_ref())?,
            deprecated_last_timestamp: time_from_wire(m.deprecated_last_timestamp.as_ref())?,
            deprecated_count: m.deprecated_count,
        })
    }
}

/// `k8s.io.api.events.v1` messages of this kind (tags from Kubernetes' `generated.proto`;
/// `EventSource` is core v1's).
mod wire {
    pub(crate) use crate::codec::wire::{ObjectMeta, Time};
    pub(crate) use crate::kinds::service_account::wire::ObjectReference;

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct EventSeries {
        #[prost(int32, tag = "1")]
        pub count: i32,
        /// A `MicroTime`: the same message as `Time`, with `nanos` set.
        #[prost(message, optional, tag = "2")]
        pub last_observed_time: Option<Time>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct EventSource {
        #[prost(string, tag = "1")]
        pub component: String,
        #[prost(string, tag = "2")]
        pub host: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Event {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, optional, tag = "2")]
        pub event_time: Option<Time>,
        #[prost(message, optional, tag = "3")]
        pub series: Option<EventSeries>,
        #[prost(string, tag = "4")]
        pub reporting_controller: String,
        #[prost(string, tag = "5")]
        pub reporting_instance: String,
        #[prost(string, tag = "6")]
        pub action: String,
        #[prost(string, tag = "7")]
        pub reason: String,
        #[prost(message, optional, tag = "8")]
        pub regarding: Option<ObjectReference>,
        #[prost(message, optional, tag = "9")]
        pub related: Option<ObjectReference>,
        #[prost(string, tag = "10")]
        pub note: String,
        #[prost(string, tag = "11")]
        pub r#type: String,
        #[prost(message, optional, tag = "12")]
        pub deprecated_source: Option<EventSource>,
        #[prost(message, optional, tag = "13")]
        pub deprecated_first_timestamp: Option<Time>,
        #[prost(message, optional, tag = "14")]
        pub deprecated_last_timestamp: Option<Time>,
        #[prost(int32, tag = "15")]
        pub deprecated_count: i32,
    }
}

#[cfg(test)]
mod tests;
