//! `AdmissionReview` (`admission.svc.io/v1`): the request an admission webhook receives and
//! the response it returns, with the rules a response must keep (`uid` echoed, `allowed`
//! set, a `patch` only as `JSONPatch`, from a mutating webhook, and decodable).

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ConfigKind, Path};
use svc_core::user::UserInfo;
use svc_core::validation::ErrorList;

pub const API_VERSION: &str = "admission.svc.io/v1";
pub const OPERATIONS: &[&str] = &["CREATE", "UPDATE", "DELETE", "CONNECT"];
/// The only patch type a response may carry.
pub const JSON_PATCH: &str = "JSONPatch";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<AdmissionRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<AdmissionResponse>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Identifies this round trip; the response echoes it.
    #[serde(default)]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<GroupVersionKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<GroupVersionResource>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sub_resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_kind: Option<GroupVersionKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_resource: Option<GroupVersionResource>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_sub_resource: String,
    /// Empty on a create whose name the server generates.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// One of [`OPERATIONS`].
    #[serde(default)]
    pub operation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_info: Option<UserInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    /// Only for UPDATE and DELETE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_object: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// Copied from the request.
    #[serde(default)]
    pub uid: String,
    /// Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<bool>,
    /// Why the request was denied (ignored when allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ResponseStatus>,
    /// A JSON Patch (RFC 6902), base64 in JSON as Go writes `[]byte`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// Keys are prefixed with the webhook's name by the server.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The `Status` of a denial, as webhooks write it (every field optional).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResponseStatus {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
}

impl AdmissionRequest {
    pub fn validate(&self, at: &Path) -> ErrorList {
        let mut errors = ErrorList::default();
        if self.uid.is_empty() {
            errors.required(at.child("uid").as_str(), "");
        }
        match &self.kind {
            None => errors.required(at.child("kind").as_str(), ""),
            Some(gvk) => {
                if gvk.version.is_empty() {
                    errors.required(at.child("kind").child("version").as_str(), "");
                }
                if gvk.kind.is_empty() {
                    errors.required(at.child("kind").child("kind").as_str(), "");
                }
            }
        }
        match &self.resource {
            None => errors.required(at.child("resource").as_str(), ""),
            Some(gvr) => {
                if gvr.version.is_empty() {
                    errors.required(at.child("resource").child("version").as_str(), "");
                }
                if gvr.resource.is_empty() {
                    errors.required(at.child("resource").child("resource").as_str(), "");
                }
            }
        }
        let op = at.child("operation");
        if self.operation.is_empty() {
            errors.required(op.as_str(), "");
        } else if !OPERATIONS.contains(&self.operation.as_str()) {
            errors.not_supported(op.as_str(), &self.operation, OPERATIONS);
        } else if self.old_object.is_some()
            && !matches!(self.operation.as_str(), "UPDATE" | "DELETE")
        {
            errors.forbidden(
                at.child("oldObject").as_str(),
                "only UPDATE and DELETE requests carry the old object",
            );
        }
        if self.user_info.is_none() {
            errors.required(at.child("userInfo").as_str(), "");
        }
        for (name, v) in [
            ("object", &self.object),
            ("oldObject", &self.old_object),
            ("options", &self.options),
        ] {
            if let Some(v) = v
                && !v.is_object()
                && !v.is_null()
            {
                errors.invalid(at.child(name).as_str(), &v.to_string(), "must be an object");
            }
        }
        errors
    }
}

impl AdmissionResponse {
    /// The response's own rules: `uid` and `allowed` set, a patch only with `patchType`
    /// `JSONPatch` and decoding to a JSON Patch document.
    pub fn validate(&self, at: &Path) -> ErrorList {
        let mut errors = ErrorList::default();
        if self.uid.is_empty() {
            errors.required(at.child("uid").as_str(), "");
        }
        if self.allowed.is_none() {
            errors.required(at.child("allowed").as_str(), "");
        }
        let patch_type = at.child("patchType");
        match self.patch_type.as_deref() {
            None | Some("") => {
                if self.patch.as_deref().is_some_and(|p| !p.is_empty()) {
                    errors.required(patch_type.as_str(), "a patch needs patchType JSONPatch");
                }
            }
            Some(JSON_PATCH) => {}
            Some(other) => errors.not_supported(patch_type.as_str(), other, &[JSON_PATCH]),
        }
        if let Some(patch) = self.patch.as_deref().filter(|p| !p.is_empty())
            && let Err(problem) = decode_patch(patch)
        {
            errors.invalid(at.child("patch").as_str(), &truncated(patch), &problem);
        }
        errors
    }

    /// Checks a webhook's response against the request it answers: [`Self::validate`], the
    /// echoed `uid`, and no patch from a validating webhook.
    pub fn verify(&self, request_uid: &str, mutating: bool) -> ErrorList {
        let at = Path::root("response");
        let mut errors = self.validate(&at);
        if !self.uid.is_empty() && self.uid != request_uid {
            errors.invalid(
                at.child("uid").as_str(),
                &self.uid,
                &format!("must be the request's uid {request_uid:?}"),
            );
        }
        if !mutating && self.patch.as_deref().is_some_and(|p| !p.is_empty()) {
            errors.forbidden(
                at.child("patch").as_str(),
                "a validating webhook may not patch",
            );
        }
        errors
    }

    /// The JSON Patch operations of the response, if it carries a patch.
    pub fn patch_operations(&self) -> Result<Option<Vec<Value>>, String> {
        match self.patch.as_deref() {
            None | Some("") => Ok(None),
            Some(p) => decode_patch(p).map(Some),
        }
    }
}

fn truncated(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Decodes a base64 JSON Patch: an array of objects each with an `op`.
fn decode_patch(patch: &str) -> Result<Vec<Value>, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|e| format!("must be base64: {e}"))?;
    let value: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("must be a JSON Patch: {e}"))?;
    let Value::Array(ops) = value else {
        return Err("must be a JSON Patch: an array of operations".into());
    };
    for (i, op) in ops.iter().enumerate() {
        if op.get("op").and_then(Value::as_str).is_none() {
            return Err(format!("must be a JSON Patch: operation {i} has no \"op\""));
        }
    }
    Ok(ops)
}

impl ConfigKind for AdmissionReview {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = "AdmissionReview";

    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        if self.request.is_none() && self.response.is_none() {
            errors.required("request", "a review carries a request, a response, or both");
        }
        if let Some(r) = &self.request {
            errors.extend(r.validate(&Path::root("request")));
        }
        if let Some(r) = &self.response {
            errors.extend(r.validate(&Path::root("response")));
            if let Some(req) = &self.request
                && !r.uid.is_empty()
                && !req.uid.is_empty()
                && r.uid != req.uid
            {
                errors.invalid("response.uid", &r.uid, "must be the request's uid");
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load;

    const HEAD: &str = "apiVersion: admission.svc.io/v1\nkind: AdmissionReview\n";
    const REQUEST: &str = "request:\n  uid: 7f0b\n  kind: {group: events.svc.io, version: v1, \
                           kind: Event}\n  resource: {group: events.svc.io, version: v1, \
                           resource: events}\n  namespace: default\n  operation: CREATE\n  \
                           userInfo: {username: alice}\n  object: {metadata: {name: e}}\n";

    fn fields(body: &str) -> Vec<String> {
        match load::<AdmissionReview>(format!("{HEAD}{body}").as_bytes()) {
            Ok(_) => vec![],
            Err(e) => e.errors.0.into_iter().map(|c| c.field).collect(),
        }
    }

    #[test]
    fn requests_and_responses() {
        // `[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]`
        let patch = base64::engine::general_purpose::STANDARD
            .encode(br#"[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]"#);
        for (body, expected) in [
            (REQUEST.to_string(), vec![]),
            ("response: {uid: 7f0b, allowed: true}\n".into(), vec![]),
            (
                format!(
                    "response: {{uid: 7f0b, allowed: true, patchType: JSONPatch, patch: {patch}}}\n"
                ),
                vec![],
            ),
            ("".into(), vec!["request"]),
            (
                "request: {operation: CREATE}\n".into(),
                vec![
                    "request.uid",
                    "request.kind",
                    "request.resource",
                    "request.userInfo",
                ],
            ),
            (
                REQUEST.replace("CREATE", "PATCH"),
                vec!["request.operation"],
            ),
            (
                format!("{REQUEST}  oldObject: {{}}\n"),
                vec!["request.oldObject"],
            ),
            (
                REQUEST.replace("kind: Event}", "kind: \"\"}"),
                vec!["request.kind.kind"],
            ),
            ("response: {allowed: false}\n".into(), vec!["response.uid"]),
            ("response: {uid: a}\n".into(), vec!["response.allowed"]),
            (
                format!("response: {{uid: a, allowed: true, patch: {patch}}}\n"),
                vec!["response.patchType"],
            ),
            (
                format!(
                    "response: {{uid: a, allowed: true, patchType: MergePatch, patch: {patch}}}\n"
                ),
                vec!["response.patchType"],
            ),
            (
                "response: {uid: a, allowed: true, patchType: JSONPatch, patch: \"e30=\"}\n".into(),
                vec!["response.patch"],
            ),
            (
                "response: {uid: a, allowed: true, patchType: JSONPatch, patch: \"!!\"}\n".into(),
                vec!["response.patch"],
            ),
            (
                format!("{REQUEST}response: {{uid: other, allowed: true}}\n"),
                vec!["response.uid"],
            ),
            (
                "response: {uid: a, allowed: false, status: {code: 403, message: denied}, \
                 warnings: [careful], auditAnnotations: {k: v}}\n"
                    .into(),
                vec![],
            ),
            (
                "response: {uid: a, allowed: true, reason: x}\n".into(),
                vec!["response.reason"],
            ),
        ] {
            assert_eq!(fields(&body), expected, "{body}");
        }
    }

    #[test]
    fn a_webhook_response_is_verified_against_its_request() {
        let patch =
            base64::engine::general_purpose::STANDARD.encode(br#"[{"op":"remove","path":"/a"}]"#);
        let ok = AdmissionResponse {
            uid: "u1".into(),
            allowed: Some(true),
            patch: Some(patch.clone()),
            patch_type: Some(JSON_PATCH.into()),
            ..Default::default()
        };
        assert!(ok.verify("u1", true).is_empty());
        assert_eq!(ok.patch_operations().unwrap().unwrap().len(), 1);
        let reasons = |e: ErrorList| -> Vec<(String, String)> {
            e.0.into_iter().map(|c| (c.field, c.reason)).collect()
        };
        assert_eq!(
            reasons(ok.verify("u2", true)),
            [("response.uid".to_string(), "FieldValueInvalid".to_string())]
        );
        assert_eq!(
            reasons(ok.verify("u1", false)),
            [(
                "response.patch".to_string(),
                "FieldValueForbidden".to_string()
            )]
        );
        let none = AdmissionResponse {
            uid: "u1".into(),
            allowed: Some(false),
            ..Default::default()
        };
        assert_eq!(none.patch_operations(), Ok(None));
    }
}
