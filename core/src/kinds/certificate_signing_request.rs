//! `CertificateSigningRequest` (`certificates.svc.io/v1`, cluster-scoped): a request for an
//! X.509 certificate, approved through `/approval` and issued through `/status`.
//!
//! The rules are Kubernetes' `certificates.k8s.io/v1` (registry strategy and validation):
//! the spec is fixed at creation, the requester is recorded from the authenticated user, a
//! plain update keeps the stored status, `/approval` changes only the conditions and
//! `/status` only the certificate and the conditions other than Approved and Denied.
//! Validation is in `validation` (PEM and X.509 parsing in the crate's `pem`), the protobuf
//! form in `wire`.

mod validation;
mod wire;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::meta::{ObjectMeta, Time};
use crate::patch::strategy::Strategy;
use crate::resource::{
    Column, Resource, ResourceInfo, STANDARD_VERBS, SUBRESOURCE_VERBS, Scope, SubresourceInfo,
};
use crate::status::ApiError;
use crate::table::{age, human_duration};
use crate::user::UserInfo;
use crate::validation::{ErrorList, NameRule};

pub use crate::pem::{PemBlock, decode_pem, parse_request};

/// Condition types with a meaning to the server; each may only be `True`.
pub const CONDITION_APPROVED: &str = "Approved";
pub const CONDITION_DENIED: &str = "Denied";
pub const CONDITION_FAILED: &str = "Failed";

/// The well-known signers the server itself issues for.
pub const SIGNER_APISERVER_CLIENT: &str = "svc.io/apiserver-client";
pub const SIGNER_APISERVER_CLIENT_AGENT: &str = "svc.io/apiserver-client-agent";
pub const SIGNER_AGENT_SERVING: &str = "svc.io/agent-serving";

/// The subresources: `approval` holds the Approved and Denied conditions, `status` the
/// certificate and the other conditions.
pub const SUBRESOURCE_APPROVAL: &str = "approval";
pub const SUBRESOURCE_STATUS: &str = "status";

/// Every key usage a request may ask for, in the spec's order.
pub const KEY_USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// The shortest validity a request may ask for.
pub const MIN_EXPIRATION_SECONDS: i32 = 600;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSigningRequestSpec {
    /// The PEM `CERTIFICATE REQUEST`; base64 in JSON and YAML.
    #[serde(default, with = "base64_bytes")]
    pub request: Vec<u8>,
    #[serde(default)]
    pub signer_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usages: Vec<String>,
    /// The requester, recorded by the server on create.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSigningRequestCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSigningRequestStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<CertificateSigningRequestCondition>,
    /// The issued certificate (PEM); base64 in JSON and YAML.
    #[serde(default, with = "base64_bytes", skip_serializing_if = "Vec::is_empty")]
    pub certificate: Vec<u8>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSigningRequest {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: CertificateSigningRequestSpec,
    #[serde(default)]
    pub status: CertificateSigningRequestStatus,
}

impl CertificateSigningRequestStatus {
    /// The condition of type `ty`, if present.
    pub fn condition(&self, ty: &str) -> Option<&CertificateSigningRequestCondition> {
        self.conditions.iter().find(|c| c.type_ == ty)
    }

    /// Whether a condition of type `ty` is present with status `True`.
    pub fn has_true(&self, ty: &str) -> bool {
        self.condition(ty).is_some_and(|c| c.status == "True")
    }
}

static INFO: ResourceInfo = ResourceInfo {
    group: "certificates.svc.io",
    version: "v1",
    kind: "CertificateSigningRequest",
    list_kind: "CertificateSigningRequestList",
    plural: "certificatesigningrequests",
    singular: "certificatesigningrequest",
    short_names: &["csr"],
    scope: Scope::Cluster,
    verbs: STANDARD_VERBS,
    // Kubernetes does not care what requests are called: any valid path segment.
    name_rule: NameRule::PathSegment,
    extra_fields: &["spec.signerName"],
    allow_create_on_update: false,
    delete_returns_object: false,
    merge_strategies: &[
        ("spec.usages", Strategy::Atomic),
        ("spec.groups", Strategy::Atomic),
        ("spec.extra", Strategy::Map),
        ("status.conditions", Strategy::Keyed("type")),
    ],
    columns: COLUMNS,
    schema,
    subresources: &[
        SubresourceInfo {
            name: SUBRESOURCE_APPROVAL,
            verbs: SUBRESOURCE_VERBS,
            kind: "CertificateSigningRequest",
            group_version: None,
        },
        SubresourceInfo {
            name: SUBRESOURCE_STATUS,
            verbs: SUBRESOURCE_VERBS,
            kind: "CertificateSigningRequest",
            group_version: None,
        },
    ],
    stored: true,
    expires: false,
};

/// Kubernetes' printer columns for the kind (`kubectl get csr`).
const COLUMNS: &[Column] = &[
    Column {
        name: "Age",
        ty: "string",
        format: "",
        priority: 0,
        description: "CreationTimestamp is a timestamp representing the server time when this \
                      object was created.",
        cell: age_cell,
    },
    Column {
        name: "SignerName",
        ty: "string",
        format: "",
        priority: 0,
        description: "signerName indicates the requested signer, and is a qualified name.",
        cell: signer_cell,
    },
    Column {
        name: "Requestor",
        ty: "string",
        format: "",
        priority: 0,
        description: "username contains the name of the user that created the \
                      CertificateSigningRequest.",
        cell: requestor_cell,
    },
    Column {
        name: "RequestedDuration",
        ty: "string",
        format: "",
        priority: 0,
        description: "expirationSeconds is the requested duration of validity of the issued \
                      certificate.",
        cell: duration_cell,
    },
    Column {
        name: "Condition",
        ty: "string",
        format: "",
        priority: 0,
        description: "conditions applied to the request. Known conditions are \"Approved\", \
                      \"Denied\", and \"Failed\".",
        cell: condition_cell,
    },
];

fn age_cell(obj: &Value, now: time::OffsetDateTime) -> Value {
    let created = obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str);
    Value::String(age(created, now))
}

fn signer_cell(obj: &Value, _now: time::OffsetDateTime) -> Value {
    match obj.pointer("/spec/signerName").and_then(Value::as_str) {
        Some(s) if !s.is_empty() => json!(s),
        _ => json!("<none>"),
    }
}

fn requestor_cell(obj: &Value, _now: time::OffsetDateTime) -> Value {
    json!(
        obj.pointer("/spec/username")
            .and_then(Value::as_str)
            .unwrap_or("")
    )
}

fn duration_cell(obj: &Value, _now: time::OffsetDateTime) -> Value {
    match obj
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
    {
        Some(secs) => json!(human_duration(secs)),
        None => json!("<none>"),
    }
}

/// `Pending`, `Approved` or `Denied`, then `,Failed` and `,Issued` as they apply: the
/// order of precedence of Kubernetes' printer.
fn condition_cell(obj: &Value, _now: time::OffsetDateTime) -> Value {
    let has = |ty: &str| {
        obj.pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty))
    };
    let mut s = if has(CONDITION_DENIED) {
        "Denied".to_string()
    } else if has(CONDITION_APPROVED) {
        "Approved".to_string()
    } else {
        "Pending".to_string()
    };
    if has(CONDITION_FAILED) {
        s.push_str(",Failed");
    }
    if obj
        .pointer("/status/certificate")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty())
    {
        s.push_str(",Issued");
    }
    Value::String(s)
}

fn schema() -> Value {
    let string = json!({"type": "string"});
    let time = json!({"type": "string", "format": "date-time"});
    let strings = json!({"type": "array", "items": string, "x-kubernetes-list-type": "atomic"});
    json!({
        "spec": {"type": "object", "required": ["request", "signerName"], "properties": {
            "request": {"type": "string", "format": "byte", "x-kubernetes-list-type": "atomic"},
            "signerName": string,
            "expirationSeconds": {"type": "integer", "format": "int32"},
            "usages": {"type": "array", "x-kubernetes-list-type": "atomic",
                "items": {"type": "string", "enum": KEY_USAGES}},
            "username": string,
            "uid": string,
            "groups": strings,
            "extra": {"type": "object", "additionalProperties": strings}}},
        "status": {"type": "object", "properties": {
            "conditions": {"type": "array", "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"], "x-kubernetes-patch-merge-key": "type",
                "x-kubernetes-patch-strategy": "merge",
                "items": {"type": "object", "required": ["type", "status"], "properties": {
                    "type": string, "status": string, "reason": string, "message": string,
                    "lastUpdateTime": time, "lastTransitionTime": time}}},
            "certificate": {"type": "string", "format": "byte",
                "x-kubernetes-list-type": "atomic"}}},
    })
}

impl Resource for CertificateSigningRequest {
    const INFO: &'static ResourceInfo = &INFO;

    crate::resource::object_accessors!();

    fn prepare_for_create(&mut self) {
        // Requests cannot be created approved, issued or failed.
        self.status = CertificateSigningRequestStatus::default();
    }

    fn prepare_for_create_by(&mut self, user: &UserInfo) {
        self.spec.username = user.username.clone();
        self.spec.uid = user.uid.clone();
        self.spec.groups = user.groups.clone();
        self.spec.extra = user.extra.clone();
    }

    fn prepare_for_update(&mut self, old: &Self) {
        // The status changes only through the subresources. The requester fields are the
        // server's: a body that leaves them out keeps the recorded ones, one that changes
        // them is refused by `validate_update` like any other change to the spec.
        self.status = old.status.clone();
        let (new, old) = (&mut self.spec, &old.spec);
        if new.username.is_empty() {
            new.username = old.username.clone();
        }
        if new.uid.is_empty() {
            new.uid = old.uid.clone();
        }
        if new.groups.is_empty() {
            new.groups = old.groups.clone();
        }
        if new.extra.is_empty() {
            new.extra = old.extra.clone();
        }
    }

    fn validate(&self) -> ErrorList {
        validation::validate_create(self)
    }

    fn validate_update(&self, old: &Self) -> ErrorList {
        validation::validate_update(self, old, validation::UpdatePath::Object)
    }

    fn field_value(&self, field: &str) -> Option<String> {
        match field {
            "spec.signerName" => Some(self.spec.signer_name.clone()),
            _ => None,
        }
    }

    fn prepare_for_subresource_update(
        &mut self,
        sub: &str,
        old: &Self,
        now: Time,
    ) -> Result<(), ApiError> {
        // Through a subresource the spec is never changed, whatever the body says.
        self.spec = old.spec.clone();
        match sub {
            SUBRESOURCE_APPROVAL => {
                // Only the conditions: the certificate stays as stored.
                populate_condition_timestamps(&mut self.status.conditions, &old.status, now);
                self.status.certificate = old.status.certificate.clone();
                Ok(())
            }
            SUBRESOURCE_STATUS => {
                // Approved and Denied belong to `/approval`: unchanged instances keep their
                // stored form, and adding or removing one is refused by validation.
                preserve_conditions(&mut self.status, &old.status, CONDITION_APPROVED);
                preserve_conditions(&mut self.status, &old.status, CONDITION_DENIED);
                populate_condition_timestamps(&mut self.status.conditions, &old.status, now);
                Ok(())
            }
            other => Err(ApiError::MethodNotAllowed(format!(
                "the server does not allow updates through the {other} subresource of {}",
                INFO.plural
            ))),
        }
    }

    fn validate_subresource_update(&self, sub: &str, old: &Self) -> ErrorList {
        let path = if sub == SUBRESOURCE_APPROVAL {
            validation::UpdatePath::Approval
        } else {
            validation::UpdatePath::Status
        };
        validation::validate_update(self, old, path)
    }
}

/// Copies the stored conditions of type `ty` over the new ones when there are as many of
/// them (Kubernetes' `preserveConditionInstances`).
fn preserve_conditions(
    new: &mut CertificateSigningRequestStatus,
    old: &CertificateSigningRequestStatus,
    ty: &str,
) {
    let old_at: Vec<usize> = indices(&old.conditions, ty);
    let new_at: Vec<usize> = indices(&new.conditions, ty);
    if old_at.len() != new_at.len() {
        return;
    }
    for (n, o) in new_at.into_iter().zip(old_at) {
        if let (Some(slot), Some(kept)) = (new.conditions.get_mut(n), old.conditions.get(o)) {
            *slot = kept.clone();
        }
    }
}

fn indices(conditions: &[CertificateSigningRequestCondition], ty: &str) -> Vec<usize> {
    conditions
        .iter()
        .enumerate()
        .filter(|(_, c)| c.type_ == ty)
        .map(|(i, _)| i)
        .collect()
}

/// Defaults `lastUpdateTime` to `now`, and `lastTransitionTime` to the stored one of a
/// condition with the same type and status, else to `now`.
fn populate_condition_timestamps(
    conditions: &mut [CertificateSigningRequestCondition],
    old: &CertificateSigningRequestStatus,
    now: Time,
) {
    for c in conditions {
        if c.last_update_time.is_none() {
            c.last_update_time = Some(now);
        }
        if c.last_transition_time.is_none() {
            let kept = old
                .conditions
                .iter()
                .find(|o| o.type_ == c.type_ && o.status == c.status)
                .and_then(|o| o.last_transition_time);
            c.last_transition_time = Some(kept.unwrap_or(now));
        }
    }
}

/// `[]byte` fields as Go's encoding/json writes them: standard base64 with padding; line
/// breaks are ignored on input, as Go's decoder does, and `null` reads as empty.
mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(Vec::new());
        };
        let compact: String = text.chars().filter(|c| *c != '\r' && *c != '\n').collect();
        base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|e| serde::de::Error::custom(format!("illegal base64 data: {e}")))
    }
}
