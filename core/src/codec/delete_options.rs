//! `DeleteOptions`, the optional body of a delete, decoded from JSON or protobuf into one type.

use prost::Message;
use serde::{Deserialize, Serialize};

use super::envelope::{decode_envelope, encode_envelope};
use super::wire;
use crate::status::ApiError;

/// Must hold for a delete to proceed; a mismatch is a 409.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preconditions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

/// `meta.v1.DeleteOptions`. Fields are `Option` where Kubernetes' are pointers, so "not given"
/// (use the default) stays distinct from `0`/`false`. Validation of the values (negative grace
/// period, unknown propagation policy, dryRun other than `All`) is the caller's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteOptions {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preconditions: Option<Preconditions>,
    /// Deprecated in Kubernetes in favour of `propagationPolicy`; accepted for old clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphan_dependents: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub propagation_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_store_read_error_with_cluster_breaking_potential: Option<bool>,
}

impl DeleteOptions {
    /// Decodes a JSON body; an empty body means all defaults.
    pub fn from_json(body: &[u8]) -> Result<Self, ApiError> {
        if body.is_empty() {
            return Ok(DeleteOptions::default());
        }
        let opts: DeleteOptions = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        check_kind(&opts.kind)?;
        Ok(opts)
    }

    /// Decodes an enveloped protobuf body; an empty body means all defaults.
    ///
    /// Any `apiVersion` is accepted: client-go sends DeleteOptions in the group version of the
    /// resource (`v1`, `certificates.k8s.io/v1`, ...) or as `meta.k8s.io/v1`.
    pub fn from_protobuf(body: &[u8]) -> Result<Self, ApiError> {
        if body.is_empty() {
            return Ok(DeleteOptions::default());
        }
        let (tm, raw) = decode_envelope(body)?;
        check_kind(&tm.kind)?;
        let m = wire::DeleteOptions::decode(raw.as_slice()).map_err(|e| {
            ApiError::bad_request(format!("unable to decode protobuf DeleteOptions: {e}"))
        })?;
        Ok(DeleteOptions {
            api_version: tm.api_version,
            kind: tm.kind,
            grace_period_seconds: m.grace_period_seconds,
            preconditions: m.preconditions.map(|p| Preconditions {
                uid: p.uid,
                resource_version: p.resource_version,
            }),
            orphan_dependents: m.orphan_dependents,
            propagation_policy: m.propagation_policy,
            dry_run: m.dry_run,
            ignore_store_read_error_with_cluster_breaking_potential: m
                .ignore_store_read_error_with_cluster_breaking_potential,
        })
    }

    /// The enveloped protobuf form, as a client would send it; `apiVersion` defaults to
    /// `meta.k8s.io/v1`.
    pub fn to_protobuf(&self) -> Vec<u8> {
        let m = wire::DeleteOptions {
            grace_period_seconds: self.grace_period_seconds,
            preconditions: self.preconditions.as_ref().map(|p| wire::Preconditions {
                uid: p.uid.clone(),
                resource_version: p.resource_version.clone(),
            }),
            orphan_dependents: self.orphan_dependents,
            propagation_policy: self.propagation_policy.clone(),
            dry_run: self.dry_run.clone(),
            ignore_store_read_error_with_cluster_breaking_potential: self
                .ignore_store_read_error_with_cluster_breaking_potential,
        };
        let api_version = if self.api_version.is_empty() {
            "meta.k8s.io/v1"
        } else {
            &self.api_version
        };
        encode_envelope(api_version, "DeleteOptions", &m.encode_to_vec())
    }
}

fn check_kind(kind: &str) -> Result<(), ApiError> {
    if kind.is_empty() || kind == "DeleteOptions" {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "expected a DeleteOptions body, got kind {kind:?}"
        )))
    }
}
