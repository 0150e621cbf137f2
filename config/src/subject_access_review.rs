//! The SubjectAccessReview a webhook authorizer sends and reads back
//! (`authorization.svc.io/v1` and `v1beta1`): the spec names who asks to do what, the
//! status is the webhook's answer. The two versions differ only in the groups field
//! (`groups` in v1, `group` in v1beta1). Match conditions see the spec in v1 form.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const GROUP: &str = "authorization.svc.io";
pub const KIND: &str = "SubjectAccessReview";
/// The versions a webhook may speak, the preferred first.
pub const VERSIONS: &[&str] = &["v1", "v1beta1"];

/// Who asks to do what (`SubjectAccessReviewSpec`, v1 field names).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubjectAccessReviewSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_attributes: Option<ResourceAttributes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_resource_attributes: Option<NonResourceAttributes>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceAttributes {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub verb: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subresource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The request's field selector (Kubernetes 1.31+), for authorizers that decide by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<SelectorAttributes>,
    /// The request's label selector (Kubernetes 1.31+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<SelectorAttributes>,
}

/// A selector of a reviewed request, as written (`rawSelector`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SelectorAttributes {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub raw_selector: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NonResourceAttributes {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub verb: String,
}

/// The webhook's answer (`SubjectAccessReviewStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubjectAccessReviewStatus {
    pub allowed: bool,
    /// An explicit deny: later authorizers are not asked. Only meaningful when not allowed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub denied: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub evaluation_error: String,
}

/// Why a webhook's answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MalformedReview {
    #[error("response is not a SubjectAccessReview: {0}")]
    Decode(String),
    #[error("response has apiVersion {found:?}, expected {expected:?}")]
    ApiVersion { found: String, expected: String },
    #[error("response has kind {0:?}, expected \"SubjectAccessReview\"")]
    Kind(String),
    #[error("response has no status")]
    NoStatus,
}

/// `authorization.svc.io/<version>`.
pub fn api_version(version: &str) -> String {
    format!("{GROUP}/{version}")
}

/// The request body sent to a webhook: `spec` in `version` (`v1` or `v1beta1`), as
/// Kubernetes writes it (empty metadata, an unset status).
pub fn encode_request(spec: &SubjectAccessReviewSpec, version: &str) -> Vec<u8> {
    let mut spec = serde_json::to_value(spec).unwrap_or(Value::Null);
    if version == "v1beta1"
        && let Some(obj) = spec.as_object_mut()
        && let Some(groups) = obj.remove("groups")
    {
        obj.insert("group".into(), groups);
    }
    let doc = serde_json::json!({
        "apiVersion": api_version(version),
        "kind": KIND,
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": {"allowed": false},
    });
    serde_json::to_vec(&doc).unwrap_or_default()
}

/// Reads a webhook's response in `version`: the status, after checking the type meta when the
/// webhook wrote one. Unknown fields are ignored, as a Go client ignores them.
pub fn decode_response(
    body: &[u8],
    version: &str,
) -> Result<SubjectAccessReviewStatus, MalformedReview> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Review {
        #[serde(default)]
        api_version: String,
        #[serde(default)]
        kind: String,
        status: Option<SubjectAccessReviewStatus>,
    }
    let review: Review =
        serde_json::from_slice(body).map_err(|e| MalformedReview::Decode(e.to_string()))?;
    let expected = api_version(version);
    if !review.api_version.is_empty() && review.api_version != expected {
        return Err(MalformedReview::ApiVersion {
            found: review.api_version,
            expected,
        });
    }
    if !review.kind.is_empty() && review.kind != KIND {
        return Err(MalformedReview::Kind(review.kind));
    }
    review.status.ok_or(MalformedReview::NoStatus)
}

/// Decodes a request body in either version back to the v1 spec (what a webhook server
/// does; the tests' webhooks use it).
pub fn decode_request(body: &[u8]) -> Result<(String, SubjectAccessReviewSpec), MalformedReview> {
    let mut doc: Value =
        serde_json::from_slice(body).map_err(|e| MalformedReview::Decode(e.to_string()))?;
    let version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut spec = doc
        .get_mut("spec")
        .map(Value::take)
        .ok_or_else(|| MalformedReview::Decode("no spec".into()))?;
    if version == api_version("v1beta1")
        && let Some(obj) = spec.as_object_mut()
        && let Some(group) = obj.remove("group")
    {
        obj.insert("groups".into(), group);
    }
    let spec = serde_json::from_value(spec).map_err(|e| MalformedReview::Decode(e.to_string()))?;
    Ok((version, spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SubjectAccessReviewSpec {
        SubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: "demo".into(),
                verb: "get".into(),
                version: "v1".into(),
                resource: "serviceaccounts".into(),
                name: "builder".into(),
                ..Default::default()
            }),
            user: "jane".into(),
            groups: vec!["dev".into(), "system:authenticated".into()],
            ..Default::default()
        }
    }

    #[test]
    fn v1_and_v1beta1_differ_only_in_the_groups_field() {
        let v1: Value = serde_json::from_slice(&encode_request(&spec(), "v1")).unwrap();
        assert_eq!(v1["apiVersion"], "authorization.svc.io/v1");
        assert_eq!(v1["kind"], "SubjectAccessReview");
        assert_eq!(v1["spec"]["groups"][0], "dev");
        assert_eq!(v1["spec"]["resourceAttributes"]["namespace"], "demo");
        assert!(v1["spec"].get("nonResourceAttributes").is_none());
        let beta: Value = serde_json::from_slice(&encode_request(&spec(), "v1beta1")).unwrap();
        assert_eq!(beta["apiVersion"], "authorization.svc.io/v1beta1");
        assert_eq!(beta["spec"]["group"][1], "system:authenticated");
        assert!(beta["spec"].get("groups").is_none());
        for body in [
            encode_request(&spec(), "v1"),
            encode_request(&spec(), "v1beta1"),
        ] {
            assert_eq!(decode_request(&body).unwrap().1, spec());
        }
    }

    #[test]
    fn responses_are_read_leniently_but_must_be_reviews() {
        let ok = br#"{"apiVersion":"authorization.svc.io/v1","kind":"SubjectAccessReview",
            "status":{"allowed":false,"denied":true,"reason":"no","future":1}}"#;
        let status = decode_response(ok, "v1").unwrap();
        assert!(status.denied && !status.allowed);
        assert_eq!(status.reason, "no");
        assert_eq!(
            decode_response(br#"{"status":{"allowed":true}}"#, "v1beta1"),
            Ok(SubjectAccessReviewStatus {
                allowed: true,
                ..Default::default()
            })
        );
        assert!(matches!(
            decode_response(ok, "v1beta1"),
            Err(MalformedReview::ApiVersion { .. })
        ));
        assert!(matches!(
            decode_response(br#"{"kind":"Pod","status":{"allowed":true}}"#, "v1"),
            Err(MalformedReview::Kind(_))
        ));
        assert_eq!(
            decode_response(br#"{"kind":"SubjectAccessReview"}"#, "v1"),
            Err(MalformedReview::NoStatus)
        );
        assert!(matches!(
            decode_response(br#"{"status":{"allowed":"yes"}}"#, "v1"),
            Err(MalformedReview::Decode(_))
        ));
        assert!(matches!(
            decode_response(b"<html>", "v1"),
            Err(MalformedReview::Decode(_))
        ));
    }
}
