//! `Namespace` (`v1`, cluster-scoped): the scope of namespaced objects.

use serde::{Deserialize, Serialize};

use crate::meta::ObjectMeta;
use crate::resource::{Resource, ResourceInfo, STANDARD_VERBS, Scope};
use crate::validation::NameRule;
use crate::validation::declarative::{Check, Format, Rule};

pub const PHASE_ACTIVE: &str = "Active";
pub const PHASE_TERMINATING: &str = "Terminating";
/// The finalizer the server puts on every namespace; it is removed once the contents are gone.
pub const FINALIZER_KUBERNETES: &str = "kubernetes";

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
    verbs: STANDARD_VERBS,
    name_rule: NameRule::Dns1123Label,
    extra_fields: &["status.phase"],
    allow_create_on_update: false,
};

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
    }

    fn has_kind_finalizers(&self) -> bool {
        !self.spec.finalizers.is_empty()
    }

    fn mark_terminating(&mut self) {
        self.status.phase = PHASE_TERMINATING.into();
    }

    fn field_value(&self, field: &str) -> Option<String> {
        match field {
            "status.phase" => Some(self.status.phase.clone()),
            _ => None,
        }
    }
}
