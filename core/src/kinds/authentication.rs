//! `authentication.svc.io/v1`: `TokenRequest`, the body of a ServiceAccount's `token`
//! subresource (asked for and answered, never stored), and `TokenReview`, which checks a
//! token and is answered, never stored. Kubernetes' clients send these under
//! `authentication.k8s.io/v1`; that name is accepted too and answered in kind.

use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::codec::convert::{
    object_meta_from_wire, object_meta_to_wire, time_from_wire, time_to_wire,
};
use crate::codec::{ProtoKind, decode_error};
use crate::meta::{ObjectMeta, Time};
use crate::resource::{Resource, ResourceInfo, Scope};
use crate::status::ApiError;
use crate::user::{self, UserInfo};
use crate::validation::{ErrorList, NameRule};

pub const GROUP: &str = "authentication.svc.io";
/// The group Kubernetes' clients name for the same types.
pub const KUBERNETES_GROUP: &str = "authentication.k8s.io";
/// Tokens may not be asked for shorter than this (Kubernetes' minimum).
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
/// The validity of a token when the request names none.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// Whether `api_version` names this group's `v1` under either of its names.
pub fn is_authentication_v1(api_version: &str) -> bool {
    api_version == format!("{GROUP}/v1") || api_version == format!("{KUBERNETES_GROUP}/v1")
}

/// The object a token is bound to (`Secret`; `Pod` in Kubernetes, not served here).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BoundObjectReference {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRequestSpec {
    #[serde(default)]
    pub audiences: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_object_ref: Option<BoundObjectReference>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRequestStatus {
    #[serde(default)]
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_timestamp: Option<Time>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRequest {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: TokenRequestSpec,
    #[serde(default)]
    pub status: TokenRequestStatus,
}

/// No verbs: served only as the `token` subresource of `serviceaccounts`.
static TOKEN_REQUEST: ResourceInfo = ResourceInfo {
    group: GROUP,
    version: "v1",
    kind: "TokenRequest",
    list_kind: "TokenRequestList",
    plural: "tokenrequests",
    singular: "tokenrequest",
    short_names: &[],
    scope: Scope::Namespaced,
    verbs: &[],
    name_rule: NameRule::Dns1123Subdomain,
    extra_fields: &[],
    allow_create_on_update: false,
    delete_returns_object: false,
    merge_strategies: &[],
    columns: &[],
    schema: token_request_schema,
    subresources: &[],
    stored: false,
    expires: false,
};

fn token_request_schema() -> Value {
    json!({
        "spec": {"type": "object", "required": ["audiences"], "properties": {
            "audiences": {"type": "array", "items": {"type": "string"}},
            "expirationSeconds": {"type": "integer", "format": "int64"},
            "boundObjectRef": {"type": "object", "properties": {
                "kind": {"type": "string"}, "apiVersion": {"type": "string"},
                "name": {"type": "string"}, "uid": {"type": "string"}}}}},
        "status": {"type": "object", "properties": {
            "token": {"type": "string"},
            "expirationTimestamp": {"type": "string", "format": "date-time"}}},
    })
}

impl Resource for TokenRequest {
    const INFO: &'static ResourceInfo = &TOKEN_REQUEST;

    crate::resource::object_accessors!();

    /// A token request is valid for its kind alone; the bound object and the account are
    /// checked where they are looked up.
    fn validate(&self) -> ErrorList {
        let mut errs = ErrorList::default();
        if let Some(s) = self.spec.expiration_seconds {
            if s < MIN_EXPIRATION_SECONDS {
                errs.invalid(
                    "spec.expirationSeconds",
                    &s.to_string(),
                    "may not specify a duration less than 10 minutes",
                );
            } else if s > 1 << 32 {
                errs.invalid(
                    "spec.expirationSeconds",
                    &s.to_string(),
                    "may not specify a duration larger than 2^32 seconds",
                );
            }
        }
        if let Some(b) = &self.spec.bound_object_ref {
            if b.name.is_empty() {
                errs.required("spec.boundObjectRef.name", "");
            }
            match b.kind.as_str() {
                "Secret" => {
                    if !b.api_version.is_empty() && b.api_version != "v1" {
                        errs.invalid(
                            "spec.boundObjectRef.apiVersion",
                            &b.api_version,
                            "must be v1 for a Secret",
                        );
                    }
                }
                "Pod" => errs.forbidden(
                    "spec.boundObjectRef.kind",
                    "tokens cannot be bound to a Pod: this server serves no pods",
                ),
                other => errs.not_supported("spec.boundObjectRef.kind", other, &["Secret"]),
            }
        }
        errs
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenReviewSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenReviewStatus {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub authenticated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<UserInfo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenReview {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: TokenReviewSpec,
    #[serde(default)]
    pub status: TokenReviewStatus,
}

static TOKEN_REVIEW: ResourceInfo = ResourceInfo {
    group: GROUP,
    version: "v1",
    kind: "TokenReview",
    list_kind: "TokenReviewList",
    plural: "tokenreviews",
    singular: "tokenreview",
    short_names: &[],
    scope: Scope::Cluster,
    verbs: &["create"],
    name_rule: NameRule::Dns1123Subdomain,
    extra_fields: &[],
    allow_create_on_update: false,
    delete_returns_object: false,
    merge_strategies: &[],
    columns: &[],
    schema: token_review_schema,
    subresources: &[],
    stored: false,
    expires: false,
};

fn token_review_schema() -> Value {
    let strings = json!({"type": "array", "items": {"type": "string"}});
    json!({
        "spec": {"type": "object", "properties": {
            "token": {"type": "string"}, "audiences": strings}},
        "status": {"type": "object", "properties": {
            "authenticated": {"type": "boolean"}, "error": {"type": "string"},
            "audiences": strings,
            "user": {"type": "object", "properties": {
                "username": {"type": "string"}, "uid": {"type": "string"}, "groups": strings,
                "extra": {"type": "object", "additionalProperties": strings}}}}},
    })
}

impl Resource for TokenReview {
    const INFO: &'static ResourceInfo = &TOKEN_REVIEW;

    crate::resource::object_accessors!();

    fn validate(&self) -> ErrorList {
        let mut errs = ErrorList::default();
        if self.spec.token.is_empty() {
            errs.required("spec.token", "");
        }
        errs
    }
}

impl ProtoKind for TokenRequest {
    fn to_proto_bytes(&self) -> Vec<u8> {
        wire::TokenRequest {
            metadata: Some(object_meta_to_wire(&self.metadata)),
            spec: Some(wire::TokenRequestSpec {
                audiences: self.spec.audiences.clone(),
                bound_object_ref: self.spec.bound_object_ref.as_ref().map(|b| {
                    wire::BoundObjectReference {
                        kind: b.kind.clone(),
                        api_version: b.api_version.clone(),
                        name: b.name.clone(),
                        uid: b.uid.clone(),
                    }
                }),
                expiration_seconds: self.spec.expiration_seconds,
            }),
            status: Some(wire::TokenRequestStatus {
                token: self.status.token.clone(),
                expiration_timestamp: self.status.expiration_timestamp.as_ref().map(time_to_wire),
            }),
        }
        .encode_to_vec()
    }

    fn from_proto_bytes(raw: &[u8]) -> Result<Self, ApiError> {
        let m = wire::TokenRequest::decode(raw).map_err(|e| decode_error("TokenRequest", e))?;
        let spec = m.spec.unwrap_or_default();
        let status = m.status.unwrap_or_default();
        Ok(TokenRequest {
            api_version: String::new(),
            kind: String::new(),
            metadata: object_meta_from_wire(m.metadata.unwrap_or_default())?,
            spec: TokenRequestSpec {
                audiences: spec.audiences,
                expiration_seconds: spec.expiration_seconds,
                bound_object_ref: spec.bound_object_ref.map(|b| BoundObjectReference {
                    kind: b.kind,
                    api_version: b.api_version,
                    name: b.name,
                    uid: b.uid,
                }),
            },
            status: TokenRequestStatus {
                token: status.token,
                expiration_timestamp: time_from_wire(status.expiration_timestamp.as_ref())?,
            },
        })
    }
}

impl ProtoKind for TokenReview {
    fn to_proto_bytes(&self) -> Vec<u8> {
        wire::TokenReview {
            metadata: Some(object_meta_to_wire(&self.metadata)),
            spec: Some(wire::TokenReviewSpec {
                token: self.spec.token.clone(),
                audiences: self.spec.audiences.clone(),
            }),
            status: Some(wire::TokenReviewStatus {
                authenticated: Some(self.status.authenticated),
                user: self.status.user.as_ref().map(user::wire::to_wire),
                error: self.status.error.clone(),
                audiences: self.status.audiences.clone(),
            }),
        }
        .encode_to_vec()
    }

    fn from_proto_bytes(raw: &[u8]) -> Result<Self, ApiError> {
        let m = wire::TokenReview::decode(raw).map_err(|e| decode_error("TokenReview", e))?;
        let spec = m.spec.unwrap_or_default();
        let status = m.status.unwrap_or_default();
        Ok(TokenReview {
            api_version: String::new(),
            kind: String::new(),
            metadata: object_meta_from_wire(m.metadata.unwrap_or_default())?,
            spec: TokenReviewSpec {
                token: spec.token,
                audiences: spec.audiences,
            },
            status: TokenReviewStatus {
                authenticated: status.authenticated.unwrap_or(false),
                user: status.user.map(user::wire::from_wire),
                error: status.error,
                audiences: status.audiences,
            },
        })
    }
}

/// `k8s.io.api.authentication.v1` messages (tags from Kubernetes' `generated.proto`).
mod wire {
    pub(crate) use crate::codec::wire::{ObjectMeta, Time};
    pub(crate) use crate::user::wire::UserInfo;

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct BoundObjectReference {
        #[prost(string, tag = "1")]
        pub kind: String,
        #[prost(string, tag = "2")]
        pub api_version: String,
        #[prost(string, tag = "3")]
        pub name: String,
        #[prost(string, tag = "4")]
        pub uid: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct TokenRequestSpec {
        #[prost(string, repeated, tag = "1")]
        pub audiences: Vec<String>,
        #[prost(message, optional, tag = "3")]
        pub bound_object_ref: Option<BoundObjectReference>,
        #[prost(int64, optional, tag = "4")]
        pub expiration_seconds: Option<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct TokenRequestStatus {
        #[prost(string, tag = "1")]
        pub token: String,
        #[prost(message, optional, tag = "2")]
        pub expiration_timestamp: Option<Time>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct TokenRequest {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, optional, tag = "2")]
        pub spec: Option<TokenRequestSpec>,
        #[prost(message, optional, tag = "3")]
        pub status: Option<TokenRequestStatus>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct TokenReviewSpec {
        #[prost(string, tag = "1")]
        pub token: String,
        #[prost(string, repeated, tag = "2")]
        pub audiences: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct TokenReviewStatus {
        #[prost(bool, optional, tag = "1")]
        pub authenticated: Option<bool>,
        #[prost(message, optional, tag = "2")]
        pub user: Option<UserInfo>,
        #[prost(string, tag = "3")]
        pub error: String,
        #[prost(string, repeated, tag = "4")]
        pub audiences: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct TokenReview {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, optional, tag = "2")]
        pub spec: Option<TokenReviewSpec>,
        #[prost(message, optional, tag = "3")]
        pub status: Option<TokenReviewStatus>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn causes(errs: ErrorList) -> Vec<(String, String)> {
        errs.0.into_iter().map(|c| (c.field, c.reason)).collect()
    }

    #[test]
    fn token_requests_are_checked_field_by_field() {
        let mut r = TokenRequest::default();
        assert!(r.validate().is_empty());
        r.spec.expiration_seconds = Some(599);
        r.spec.bound_object_ref = Some(BoundObjectReference {
            kind: "Pod".into(),
            name: "p".into(),
            ..Default::default()
        });
        assert_eq!(
            causes(r.validate()),
            [
                ("spec.expirationSeconds".into(), "FieldValueInvalid".into()),
                (
                    "spec.boundObjectRef.kind".into(),
                    "FieldValueForbidden".into()
                ),
            ]
        );
        r.spec.expiration_seconds = Some(600);
        r.spec.bound_object_ref = Some(BoundObjectReference {
            kind: "ConfigMap".into(),
            ..Default::default()
        });
        assert_eq!(
            causes(r.validate()),
            [
                (
                    "spec.boundObjectRef.name".into(),
                    "FieldValueRequired".into()
                ),
                (
                    "spec.boundObjectRef.kind".into(),
                    "FieldValueNotSupported".into()
                ),
            ]
        );
    }

    #[test]
    fn both_group_names_are_this_group() {
        assert!(is_authentication_v1("authentication.svc.io/v1"));
        assert!(is_authentication_v1("authentication.k8s.io/v1"));
        assert!(!is_authentication_v1("authentication.k8s.io/v1beta1"));
    }

    #[test]
    fn protobuf_round_trips() {
        let mut r = TokenRequest::default();
        r.spec.audiences = vec!["a".into()];
        r.spec.expiration_seconds = Some(3600);
        r.status.token = "t".into();
        assert_eq!(
            TokenRequest::from_proto_bytes(&r.to_proto_bytes()).unwrap(),
            r
        );
        let mut v = TokenReview::default();
        v.spec.token = "t".into();
        v.status.authenticated = true;
        v.status.user = Some(UserInfo {
            username: "u".into(),
            groups: vec!["g".into()],
            extra: [("k".to_string(), vec!["v".to_string()])].into(),
            ..Default::default()
        });
        assert_eq!(
            TokenReview::from_proto_bytes(&v.to_proto_bytes()).unwrap(),
            v
        );
    }
}
