//! `ServiceAccount` (`v1`, namespaced): a principal with secrets, wire-identical to Kubernetes.

use serde::{Deserialize, Serialize};

use crate::meta::ObjectMeta;
use crate::resource::{Resource, ResourceInfo, STANDARD_VERBS, Scope};
use crate::validation::declarative::{Check, Format, Rule};
use crate::validation::{ErrorList, NameRule};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field_path: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccount {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Secrets pods running as this account may use; strategic merge on key `name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<ObjectReference>,
    /// Secrets for pulling images; atomic on merge.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automount_service_account_token: Option<bool>,
}

static INFO: ResourceInfo = ResourceInfo {
    group: "",
    version: "v1",
    kind: "ServiceAccount",
    list_kind: "ServiceAccountList",
    plural: "serviceaccounts",
    singular: "serviceaccount",
    short_names: &["sa"],
    scope: Scope::Namespaced,
    verbs: STANDARD_VERBS,
    name_rule: NameRule::Dns1123Subdomain,
    extra_fields: &[],
    allow_create_on_update: false,
};

/// The declarative form of ServiceAccount validation: what `validate` below and
/// `validation::validate_object_meta` check by hand.
static RULES: [Rule; 8] = [
    Rule::new(
        "metadata.name",
        Check::Required("name or generateName is required"),
    ),
    Rule::new("metadata.name", Check::Format(Format::Dns1123Subdomain)),
    Rule::new("metadata.name", Check::Immutable),
    Rule::new("metadata.namespace", Check::Required("")),
    Rule::new("metadata.namespace", Check::Format(Format::Dns1123Label)),
    Rule::new("metadata.namespace", Check::Immutable),
    Rule::new("secrets[*].name", Check::Required("")),
    Rule::new("imagePullSecrets[*].name", Check::Required("")),
];

impl Resource for ServiceAccount {
    const INFO: &'static ResourceInfo = &INFO;

    crate::resource::object_accessors!();

    fn declarative_rules() -> &'static [Rule] {
        &RULES
    }

    fn validate(&self) -> ErrorList {
        let mut errs = ErrorList::default();
        for (i, s) in self.secrets.iter().enumerate() {
            if s.name.is_empty() {
                errs.required(&format!("secrets[{i}].name"), "");
            }
        }
        for (i, s) in self.image_pull_secrets.iter().enumerate() {
            if s.name.is_empty() {
                errs.required(&format!("imagePullSecrets[{i}].name"), "");
            }
        }
        errs
    }
}
