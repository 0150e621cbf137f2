//! `ProtoKind` for each served kind: the mapping between its struct and its `core.v1` message.

use prost::Message;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::convert::{object_meta_from_wire, object_meta_to_wire, time_from_wire, time_to_wire};
use super::{ProtoKind, wire};
use crate::kinds::{LocalObjectReference, ObjectReference, ServiceAccount};
use crate::kinds::{Namespace, NamespaceSpec, NamespaceStatus};
use crate::meta::Time;
use crate::status::ApiError;

fn decode_error(kind: &str, e: prost::DecodeError) -> ApiError {
    ApiError::bad_request(format!("unable to decode protobuf {kind}: {e}"))
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

impl ProtoKind for ServiceAccount {
    fn to_proto_bytes(&self) -> Vec<u8> {
        wire::ServiceAccount {
            metadata: Some(object_meta_to_wire(&self.metadata)),
            secrets: self
                .secrets
                .iter()
                .map(|r| wire::ObjectReference {
                    kind: r.kind.clone(),
                    namespace: r.namespace.clone(),
                    name: r.name.clone(),
                    uid: r.uid.clone(),
                    api_version: r.api_version.clone(),
                    resource_version: r.resource_version.clone(),
                    field_path: r.field_path.clone(),
                })
                .collect(),
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
                .map(|r| ObjectReference {
                    kind: r.kind,
                    namespace: r.namespace,
                    name: r.name,
                    uid: r.uid,
                    api_version: r.api_version,
                    resource_version: r.resource_version,
                    field_path: r.field_path,
                })
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
