//! The protobuf form of the kind: `k8s.io.api.certificates.v1` messages, tags from
//! Kubernetes' `generated.proto` (checked against `k8s-pb` 0.9.0's `certificates::v1`).

use std::collections::BTreeMap;

use prost::Message;

use super::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use crate::codec::convert::{
    object_meta_from_wire, object_meta_to_wire, time_from_wire, time_to_wire,
};
use crate::codec::wire::{ObjectMeta, Time};
use crate::codec::{ProtoKind, decode_error};
use crate::status::ApiError;

#[derive(Clone, PartialEq, prost::Message)]
struct ExtraValue {
    #[prost(string, repeated, tag = "1")]
    items: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Spec {
    #[prost(bytes = "vec", tag = "1")]
    request: Vec<u8>,
    #[prost(string, tag = "2")]
    username: String,
    #[prost(string, tag = "3")]
    uid: String,
    #[prost(string, repeated, tag = "4")]
    groups: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    usages: Vec<String>,
    #[prost(btree_map = "string, message", tag = "6")]
    extra: BTreeMap<String, ExtraValue>,
    #[prost(string, tag = "7")]
    signer_name: String,
    /// A Go `*int32`: present or not.
    #[prost(int32, optional, tag = "8")]
    expiration_seconds: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Condition {
    #[prost(string, tag = "1")]
    r#type: String,
    #[prost(string, tag = "2")]
    reason: String,
    #[prost(string, tag = "3")]
    message: String,
    #[prost(message, optional, tag = "4")]
    last_update_time: Option<Time>,
    #[prost(message, optional, tag = "5")]
    last_transition_time: Option<Time>,
    #[prost(string, tag = "6")]
    status: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Status {
    #[prost(message, repeated, tag = "1")]
    conditions: Vec<Condition>,
    #[prost(bytes = "vec", tag = "2")]
    certificate: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Csr {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<Spec>,
    #[prost(message, optional, tag = "3")]
    status: Option<Status>,
}

fn condition_to_wire(c: &CertificateSigningRequestCondition) -> Condition {
    Condition {
        r#type: c.type_.clone(),
        reason: c.reason.clone(),
        message: c.message.clone(),
        last_update_time: c.last_update_time.as_ref().map(time_to_wire),
        last_transition_time: c.last_transition_time.as_ref().map(time_to_wire),
        status: c.status.clone(),
    }
}

fn condition_from_wire(c: Condition) -> Result<CertificateSigningRequestCondition, ApiError> {
    Ok(CertificateSigningRequestCondition {
        type_: c.r#type,
        status: c.status,
        reason: c.reason,
        message: c.message,
        last_update_time: time_from_wire(c.last_update_time.as_ref())?,
        last_transition_time: time_from_wire(c.last_transition_time.as_ref())?,
    })
}

impl ProtoKind for CertificateSigningRequest {
    fn to_proto_bytes(&self) -> Vec<u8> {
        let spec = &self.spec;
        Csr {
            metadata: Some(object_meta_to_wire(&self.metadata)),
            spec: Some(Spec {
                request: spec.request.clone(),
                username: spec.username.clone(),
                uid: spec.uid.clone(),
                groups: spec.groups.clone(),
                usages: spec.usages.clone(),
                extra: spec
                    .extra
                    .iter()
                    .map(|(k, v)| (k.clone(), ExtraValue { items: v.clone() }))
                    .collect(),
                signer_name: spec.signer_name.clone(),
                expiration_seconds: spec.expiration_seconds,
            }),
            status: Some(Status {
                conditions: self
                    .status
                    .conditions
                    .iter()
                    .map(condition_to_wire)
                    .collect(),
                certificate: self.status.certificate.clone(),
            }),
        }
        .encode_to_vec()
    }

    fn from_proto_bytes(raw: &[u8]) -> Result<Self, ApiError> {
        let m = Csr::decode(raw).map_err(|e| decode_error("CertificateSigningRequest", e))?;
        let spec = m.spec.unwrap_or_default();
        let status = m.status.unwrap_or_default();
        Ok(CertificateSigningRequest {
            api_version: String::new(),
            kind: String::new(),
            metadata: object_meta_from_wire(m.metadata.unwrap_or_default())?,
            spec: CertificateSigningRequestSpec {
                request: spec.request,
                signer_name: spec.signer_name,
                expiration_seconds: spec.expiration_seconds,
                usages: spec.usages,
                username: spec.username,
                uid: spec.uid,
                groups: spec.groups,
                extra: spec.extra.into_iter().map(|(k, v)| (k, v.items)).collect(),
            },
            status: CertificateSigningRequestStatus {
                conditions: status
                    .conditions
                    .into_iter()
                    .map(condition_from_wire)
                    .collect::<Result<_, _>>()?,
                certificate: status.certificate,
            },
        })
    }
}
