//! `ServiceAccount` (`v1`, namespaced): a principal with secrets, wire-identical to Kubernetes.

use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::codec::convert::{object_meta_from_wire, object_meta_to_wire};
use crate::codec::{ProtoKind, decode_error};
use crate::meta::ObjectMeta;
use crate::patch::strategy::Strategy;
use crate::resource::{Resource, ResourceInfo, STANDARD_VERBS, Scope, SubresourceInfo};
use crate::status::ApiError;
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

impl ObjectReference {
    pub(crate) fn to_wire(&self) -> wire::ObjectReference {
        wire::ObjectReference {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            api_version: self.api_version.clone(),
            resource_version: self.resource_version.clone(),
            field_path: self.field_path.clone(),
        }
    }

    pub(crate) fn from_wire(r: wire::ObjectReference) -> Self {
        ObjectReference {
            kind: r.kind,
            namespace: r.namespace,
            name: r.name,
            uid: r.uid,
            api_version: r.api_version,
            resource_version: r.resource_version,
            field_path: r.field_path,
        }
    }
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
    delete_returns_object: true,
    merge_strategies: &[
        ("secrets", Strategy::Keyed("name")),
        ("imagePullSecrets", Strategy::Atomic),
    ],
    columns: &[],
    schema,
    subresources: &[SubresourceInfo {
        name: "token",
        verbs: &["create"],
        kind: "TokenRequest",
        group_version: Some(("authentication.svc.io", "v1")),
    }],
    stored: true,
    expires: false,
};

fn schema() -> Value {
    let string = json!({"type": "string"});
    json!({
        "automountServiceAccountToken": {"type": "boolean"},
        "imagePullSecrets": {"type": "array", "x-kubernetes-list-type": "atomic", "items": {
            "type": "object", "properties": {"name": string}}},
        "secrets": {"type": "array", "x-kubernetes-patch-merge-key": "name",
            "x-kubernetes-patch-strategy": "merge", "items": {"type": "object", "properties": {
                "kind": string, "namespace": string, "name": string, "uid": string,
                "apiVersion": string, "resourceVersion": string, "fieldPath": string}}},
    })
}

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

impl ProtoKind for ServiceAccount {
    fn to_proto_bytes(&self) -> Vec<u8> {
        wire::ServiceAccount {
            metadata: Some(object_meta_to_wire(&self.metadata)),
            secrets: self.secrets.iter().map(ObjectReference::to_wire).collect(),
            image_pull_secrets: self
                .image_pull_secrets
                .iter()
                .map(|r| wire::LocalObjectReference {
                    name: r.name.clone(),
                })
                .collect(),
            automount_service_account_token: self.automount_service_account_token,
        }
        .encode_to_vec()
    }

    fn from_proto_bytes(raw: &[u8]) -> Result<Self, ApiError> {
        let m = wire::ServiceAccount::decode(raw).map_err(|e| decode_error("ServiceAccount", e))?;
        Ok(ServiceAccount {
            api_version: String::new(),
            kind: String::new(),
            metadata: object_meta_from_wire(m.metadata.unwrap_or_default())?,
            secrets: m
                .secrets
                .into_iter()
                .map(ObjectReference::from_wire)
                .collect(),
            image_pull_secrets: m
                .image_pull_secrets
                .into_iter()
                .map(|r| LocalObjectReference { name: r.name })
                .collect(),
            automount_service_account_token: m.automount_service_account_token,
        })
    }
}

/// `k8s.io.api.core.v1` messages of this kind (tags from Kubernetes' `generated.proto`).
pub(crate) mod wire {
    pub(crate) use crate::codec::wire::ObjectMeta;

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct ObjectReference {
        #[prost(string, tag = "1")]
        pub kind: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        #[prost(string, tag = "3")]
        pub name: String,
        #[prost(string, tag = "4")]
        pub uid: String,
        #[prost(string, tag = "5")]
        pub api_version: String,
        #[prost(string, tag = "6")]
        pub resource_version: String,
        #[prost(string, tag = "7")]
        pub field_path: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct LocalObjectReference {
        #[prost(string, tag = "1")]
        pub name: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct ServiceAccount {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, repeated, tag = "2")]
        pub secrets: Vec<ObjectReference>,
        #[prost(message, repeated, tag = "3")]
        pub image_pull_secrets: Vec<LocalObjectReference>,
        #[prost(bool, optional, tag = "4")]
        pub automount_service_account_token: Option<bool>,
    }
}
