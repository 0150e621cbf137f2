//! `Namespace` (`v1`, cluster-scoped): the scope of namespaced objects.

use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::codec::convert::{
    object_meta_from_wire, object_meta_to_wire, time_from_wire, time_to_wire,
};
use crate::codec::{ProtoKind, decode_error};
use crate::meta::{ObjectMeta, Time};
use crate::patch::strategy::Strategy;
use crate::resource::{Resource, ResourceInfo, SUBRESOURCE_VERBS, Scope, SubresourceInfo};
use crate::status::ApiError;
use crate::validation::declarative::{Check, Format, Rule};
use crate::validation::{ErrorList, NameRule};

pub const PHASE_ACTIVE: &str = "Active";
pub const PHASE_TERMINATING: &str = "Terminating";
/// The finalizer the server puts on every namespace; it is removed once the contents are gone.
pub const FINALIZER_KUBERNETES: &str = "kubernetes";
/// `namespaces/status`: the phase and conditions.
pub const SUBRESOURCE_STATUS: &str = "status";
/// `namespaces/finalize`: `spec.finalizers`.
pub const SUBRESOURCE_FINALIZE: &str = "finalize";
/// The label every namespace carries with its own name, as Kubernetes sets it (so that a
/// namespace selector can pick namespaces by name).
pub const LABEL_METADATA_NAME: &str = "kubernetes.io/metadata.name";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceStatus {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<serde_json::Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Namespace {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NamespaceSpec,
    #[serde(default)]
    pub status: NamespaceStatus,
}

static INFO: ResourceInfo = ResourceInfo {
    group: "",
    version: "v1",
    kind: "Namespace",
    list_kind: "NamespaceList",
    plural: "namespaces",
    singular: "namespace",
    short_names: &["ns"],
    scope: Scope::Cluster,
    // No deletecollection, as in Kubernetes: one request must not delete every namespace.
    verbs: &[
        "create", "delete", "get", "list", "patch", "update", "watch",
    ],
    name_rule: NameRule::Dns1123Label,
    extra_fields: &["status.phase"],
    allow_create_on_update: false,
    delete_returns_object: true,
    merge_strategies: &[
        ("spec.finalizers", Strategy::Atomic),
        ("status.conditions", Strategy::Keyed("type")),
    ],
    columns: &[],
    schema,
    // As kube-apiserver serves them: the namespace controller writes conditions through
    // `status` and empties `spec.finalizers` through `finalize`.
    subresources: &[
        SubresourceInfo {
            name: SUBRESOURCE_STATUS,
            verbs: SUBRESOURCE_VERBS,
            kind: "Namespace",
            group_version: None,
        },
        SubresourceInfo {
            name: SUBRESOURCE_FINALIZE,
            verbs: &["update"],
            kind: "Namespace",
            group_version: None,
        },
    ],
    stored: true,
    expires: false,
};

fn schema() -> Value {
    json!({
        "spec": {"type": "object", "properties": {
            "finalizers": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "atomic"}}},
        "status": {"type": "object", "properties": {
            "phase": {"type": "string"},
            "conditions": {"type": "array", "items": {"type": "object"}}}},
    })
}

/// The declarative form of Namespace validation: the name (also checked by hand in
/// `validation::validate_object_meta`), and the phase, which only the server sets.
static RULES: [Rule; 4] = [
    Rule::new(
        "metadata.name",
        Check::Required("name or generateName is required"),
    ),
    Rule::new("metadata.name", Check::Format(Format::Dns1123Label)),
    Rule::new("metadata.name", Check::Immutable),
    Rule::new(
        "status.phase",
        Check::Enum(&[PHASE_ACTIVE, PHASE_TERMINATING]),
    ),
];

impl Resource for Namespace {
    const INFO: &'static ResourceInfo = &INFO;

    crate::resource::object_accessors!();

    fn declarative_rules() -> &'static [Rule] {
        &RULES
    }

    fn prepare_for_create(&mut self) {
        self.metadata
            .labels
            .insert(LABEL_METADATA_NAME.into(), self.metadata.name.clone());
        if !self
            .spec
            .finalizers
            .iter()
            .any(|f| f == FINALIZER_KUBERNETES)
        {
            self.spec.finalizers.push(FINALIZER_KUBERNETES.into());
        }
        self.status = NamespaceStatus {
            phase: PHASE_ACTIVE.into(),
            conditions: vec![],
        };
    }

    fn prepare_for_update(&mut self, old: &Self) {
        // Status and spec.finalizers change only through the lifecycle, not a plain update.
        self.spec = old.spec.clone();
        self.status = old.status.clone();
        self.metadata
            .labels
            .insert(LABEL_METADATA_NAME.into(), self.metadata.name.clone());
    }

    fn has_kind_finalizers(&self) -> bool {
        !self.spec.finalizers.is_empty()
    }

    fn mark_terminating(&mut self) {
        self.status.phase = PHASE_TERMINATING.into();
    }

    fn prepare_for_subresource_update(
        &mut self,
        sub: &str,
        old: &Self,
        _now: Time,
    ) -> Result<(), ApiError> {
        match sub {
            SUBRESOURCE_STATUS => self.spec = old.spec.clone(),
            SUBRESOURCE_FINALIZE => self.status = old.status.clone(),
            other => {
                return Err(ApiError::MethodNotAllowed(format!(
                    "the server does not allow updates through the {other} subresource of {}",
                    INFO.plural
                )));
            }
        }
        Ok(())
    }

    /// Kubernetes' rules: the phase follows the deletion (`status`), and each finalizer is a
    /// qualified name (`finalize`).
    fn validate_subresource_update(&self, sub: &str, old: &Self) -> ErrorList {
        let mut errs = self.validate_update(old);
        if sub == SUBRESOURCE_STATUS {
            let (want, rule) = if self.metadata.deletion_timestamp.is_none() {
                (
                    PHASE_ACTIVE,
                    "may only be 'Active' if `deletionTimestamp` is empty",
                )
            } else {
                (
                    PHASE_TERMINATING,
                    "may only be 'Terminating' if `deletionTimestamp` is not empty",
                )
            };
            if self.status.phase != want {
                errs.invalid("status.Phase", &self.status.phase, rule);
            }
        } else {
            for (i, f) in self.spec.finalizers.iter().enumerate() {
                if let Err(e) = crate::validation::qualified_name(f) {
                    errs.invalid(&format!("spec.finalizers[{i}]"), f, &e);
                }
            }
        }
        errs
    }

    fn field_value(&self, field: &str) -> Option<String> {
        match field {
            "status.phase" => Some(self.status.phase.clone()),
            _ => None,
        }
    }
}

impl ProtoKind for Namespace {
    fn to_proto_bytes(&self) -> Vec<u8> {
        // metadata, spec and status are Go values, so Go always writes them; so do we.
        wire::Namespace {
            metadata: Some(object_meta_to_wire(&self.metadata)),
            spec: Some(wire::NamespaceSpec {
                finalizers: self.spec.finalizers.clone(),
            }),
            status: Some(wire::NamespaceStatus {
                phase: self.status.phase.clone(),
                conditions: self
                    .status
                    .conditions
                    .iter()
                    .map(condition_to_wire)
                    .collect(),
            }),
        }
        .encode_to_vec()
    }

    fn from_proto_bytes(raw: &[u8]) -> Result<Self, ApiError> {
        let m = wire::Namespace::decode(raw).map_err(|e| decode_error("Namespace", e))?;
        let spec = m.spec.unwrap_or_default();
        let status = m.status.unwrap_or_default();
        Ok(Namespace {
            api_version: String::new(),
            kind: String::new(),
            metadata: object_meta_from_wire(m.metadata.unwrap_or_default())?,
            spec: NamespaceSpec {
                finalizers: spec.finalizers,
            },
            status: NamespaceStatus {
                phase: status.phase,
                conditions: status
                    .conditions
                    .into_iter()
                    .map(condition_from_wire)
                    .collect::<Result<_, _>>()?,
            },
        })
    }
}

// Our `NamespaceStatus.conditions` holds JSON values, not a typed struct. The protobuf form
// can carry only NamespaceCondition's fields (type, status, lastTransitionTime, reason,
// message): other keys, non-string values and non-object entries are dropped, and a
// lastTransitionTime that is not RFC 3339 is left out. The server writes these conditions
// itself, so in practice they always have that shape.
fn condition_to_wire(c: &Value) -> wire::NamespaceCondition {
    let text = |key: &str| c.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    wire::NamespaceCondition {
        r#type: text("type"),
        status: text("status"),
        last_transition_time: c
            .get("lastTransitionTime")
            .and_then(Value::as_str)
            .and_then(|s| OffsetDateTime::parse(s, &Rfc3339).ok())
            .map(|t| time_to_wire(&Time(t))),
        reason: text("reason"),
        message: text("message"),
    }
}

fn condition_from_wire(c: wire::NamespaceCondition) -> Result<Value, ApiError> {
    let mut m = Map::new();
    let mut put = |key: &str, v: String| {
        if !v.is_empty() {
            m.insert(key.to_string(), Value::String(v));
        }
    };
    put("type", c.r#type);
    put("status", c.status);
    if let Some(t) = time_from_wire(c.last_transition_time.as_ref())? {
        put("lastTransitionTime", t.to_rfc3339());
    }
    put("reason", c.reason);
    put("message", c.message);
    Ok(Value::Object(m))
}

/// `k8s.io.api.core.v1` messages of this kind (tags from Kubernetes' `generated.proto`).
mod wire {
    pub(crate) use crate::codec::wire::{ObjectMeta, Time};

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct NamespaceSpec {
        #[prost(string, repeated, tag = "1")]
        pub finalizers: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct NamespaceCondition {
        #[prost(string, tag = "1")]
        pub r#type: String,
        #[prost(string, tag = "2")]
        pub status: String,
        // Tag 3 is unused in Kubernetes' NamespaceCondition.
        #[prost(message, optional, tag = "4")]
        pub last_transition_time: Option<Time>,
        #[prost(string, tag = "5")]
        pub reason: String,
        #[prost(string, tag = "6")]
        pub message: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct NamespaceStatus {
        #[prost(string, tag = "1")]
        pub phase: String,
        #[prost(message, repeated, tag = "2")]
        pub conditions: Vec<NamespaceCondition>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Namespace {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, optional, tag = "2")]
        pub spec: Option<NamespaceSpec>,
        #[prost(message, optional, tag = "3")]
        pub status: Option<NamespaceStatus>,
    }
}
