//! `Status`, the API's error object, and `ApiError`, the structured error every layer above
//! storage returns. `ApiError::to_status` is the one place that picks reasons and codes.

use serde::{Deserialize, Serialize};

use crate::meta::ListMeta;

/// One reason a request was invalid, naming the field (`metadata.name`, `spec.usages[2]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusCause {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDetails {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<StatusCause>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<i32>,
}

/// The `Status` object (`v1`), returned for every error and for some successful deletes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub kind: String,
    pub api_version: String,
    pub metadata: ListMeta,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<StatusDetails>,
    /// The HTTP code of a failure; 0, and left out, in a success (as Go's `omitempty`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub code: u16,
}

fn is_zero(code: &u16) -> bool {
    *code == 0
}

impl Status {
    pub fn success(details: Option<StatusDetails>) -> Self {
        Status {
            kind: "Status".into(),
            api_version: "v1".into(),
            metadata: ListMeta::default(),
            status: "Success".into(),
            message: String::new(),
            reason: String::new(),
            details,
            code: 0,
        }
    }

    fn failure(code: u16, reason: &str, message: String, details: Option<StatusDetails>) -> Self {
        Status {
            kind: "Status".into(),
            api_version: "v1".into(),
            metadata: ListMeta::default(),
            status: "Failure".into(),
            message,
            reason: reason.into(),
            details,
            code,
        }
    }
}

/// The resource an error is about: `serviceaccounts "default"` in messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subject {
    pub group: String,
    /// Plural resource name (`serviceaccounts`), as Kubernetes puts in `details.kind`.
    pub resource: String,
    pub name: String,
}

impl Subject {
    pub fn new(group: &str, resource: &str, name: &str) -> Self {
        Subject {
            group: group.into(),
            resource: resource.into(),
            name: name.into(),
        }
    }

    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    fn details(&self, causes: Vec<StatusCause>) -> StatusDetails {
        StatusDetails {
            name: self.name.clone(),
            group: self.group.clone(),
            kind: self.resource.clone(),
            causes,
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{} \"{}\" not found", .0.qualified(), .0.name)]
    NotFound(Subject),
    /// 404 for a path that names no resource or endpoint at all.
    #[error("the server could not find the requested resource ({0})")]
    PathNotFound(String),
    #[error("{} \"{}\" already exists", .0.qualified(), .0.name)]
    AlreadyExists(Subject),
    #[error("Operation cannot be fulfilled on {} \"{}\": {message}", subject.qualified(), subject.name)]
    Conflict { subject: Subject, message: String },
    /// 422: the object is invalid; `kind` is the object's Kind (`ServiceAccount`). The
    /// message names the kind with its group (`Event.events.svc.io`), as Kubernetes'
    /// `GroupKind` prints.
    #[error(
        "{} \"{name}\" is invalid: {}",
        group_kind(kind, group),
        join_causes(causes)
    )]
    Invalid {
        kind: String,
        group: String,
        name: String,
        causes: Vec<StatusCause>,
    },
    /// 422 with no object named: Kubernetes' generic answer when a JSON patch operation
    /// cannot be applied (`NewGenericServerResponse(422, ...)`), the message as the one cause.
    #[error("{0}")]
    Unprocessable(String),
    /// 409 for server-side apply: each cause names a field and the manager that owns it.
    #[error("{message}")]
    ApplyConflict {
        message: String,
        causes: Vec<StatusCause>,
    },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    /// 403; `subject`, where the refusal is about one object, names it in the details, with
    /// `causes`.
    #[error("{message}")]
    Forbidden {
        message: String,
        subject: Option<Subject>,
        causes: Vec<StatusCause>,
    },
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    NotAcceptable(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    RequestEntityTooLarge(String),
    /// 410 with reason `Expired`: a resourceVersion or continue token that is too old.
    #[error("{0}")]
    Expired(String),
    /// 410 with reason `Gone`.
    #[error("{0}")]
    Gone(String),
    /// 504: a request or a call that took too long; may carry a retry hint.
    #[error("{message}")]
    Timeout {
        message: String,
        retry_after_seconds: Option<i32>,
    },
    /// 504 with reason `Timeout`: a resourceVersion the server has not reached, as Kubernetes
    /// answers it: its `Timeout: ` prefix, the `ResourceVersionTooLarge` cause by which clients
    /// know it (client-go's reflector then lists afresh), a retry after 1 s.
    #[error("Timeout: Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion { requested: i64, current: i64 },
    #[error("{message}")]
    TooManyRequests {
        message: String,
        retry_after_seconds: Option<i32>,
    },
    #[error("{0}")]
    ServiceUnavailable(String),
    #[error("Internal error occurred: {0}")]
    Internal(String),
}

/// `Kind.group`, or `Kind` in the core group.
fn group_kind(kind: &str, group: &str) -> String {
    if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    }
}

fn join_causes(causes: &[StatusCause]) -> String {
    let parts: Vec<String> = causes
        .iter()
        .map(|c| {
            if c.field.is_empty() {
                c.message.clone()
            } else {
                format!("{}: {}", c.field, c.message)
            }
        })
        .collect();
    if let [only] = parts.as_slice() {
        only.clone()
    } else {
        format!("[{}]", parts.join(", "))
    }
}

impl ApiError {
    pub fn code(&self) -> u16 {
        match self {
            ApiError::NotFound(_) | ApiError::PathNotFound(_) => 404,
            ApiError::AlreadyExists(_)
            | ApiError::Conflict { .. }
            | ApiError::ApplyConflict { .. } => 409,
            ApiError::Invalid { .. } | ApiError::Unprocessable(_) => 422,
            ApiError::BadRequest(_) => 400,
            ApiError::Unauthorized(_) => 401,
            ApiError::Forbidden { .. } => 403,
            ApiError::MethodNotAllowed(_) => 405,
            ApiError::NotAcceptable(_) => 406,
            ApiError::UnsupportedMediaType(_) => 415,
            ApiError::RequestEntityTooLarge(_) => 413,
            ApiError::Expired(_) | ApiError::Gone(_) => 410,
            ApiError::Timeout { .. } | ApiError::TooLargeResourceVersion { .. } => 504,
            ApiError::TooManyRequests { .. } => 429,
            ApiError::ServiceUnavailable(_) => 503,
            ApiError::Internal(_) => 500,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::NotFound(_) | ApiError::PathNotFound(_) => "NotFound",
            ApiError::AlreadyExists(_) => "AlreadyExists",
            ApiError::Conflict { .. } | ApiError::ApplyConflict { .. } => "Conflict",
            ApiError::Invalid { .. } | ApiError::Unprocessable(_) => "Invalid",
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::Unauthorized(_) => "Unauthorized",
            ApiError::Forbidden { .. } => "Forbidden",
            ApiError::MethodNotAllowed(_) => "MethodNotAllowed",
            ApiError::NotAcceptable(_) => "NotAcceptable",
            ApiError::UnsupportedMediaType(_) => "UnsupportedMediaType",
            ApiError::RequestEntityTooLarge(_) => "RequestEntityTooLarge",
            ApiError::Expired(_) => "Expired",
            ApiError::Gone(_) => "Gone",
            ApiError::Timeout { .. } | ApiError::TooLargeResourceVersion { .. } => "Timeout",
            ApiError::TooManyRequests { .. } => "TooManyRequests",
            ApiError::ServiceUnavailable(_) => "ServiceUnavailable",
            ApiError::Internal(_) => "InternalError",
        }
    }

    /// Seconds a client should wait before retrying, where the error carries a hint.
    pub fn retry_after(&self) -> Option<i32> {
        match self {
            ApiError::Timeout {
                retry_after_seconds,
                ..
            }
            | ApiError::TooManyRequests {
                retry_after_seconds,
                ..
            } => *retry_after_seconds,
            ApiError::TooLargeResourceVersion { .. } => Some(1),
            _ => None,
        }
    }

    pub fn to_status(&self) -> Status {
        let details = match self {
            ApiError::NotFound(s) | ApiError::AlreadyExists(s) => Some(s.details(vec![])),
            ApiError::Forbidden {
                subject: Some(s),
                causes,
                ..
            } => Some(s.details(causes.clone())),
            ApiError::Conflict { subject, .. } => Some(subject.details(vec![])),
            ApiError::ApplyConflict { causes, .. } => Some(StatusDetails {
                causes: causes.clone(),
                ..Default::default()
            }),
            ApiError::Unprocessable(message) => Some(StatusDetails {
                causes: vec![StatusCause {
                    message: message.clone(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ApiError::Invalid {
                kind,
                group,
                name,
                causes,
            } => Some(StatusDetails {
                name: name.clone(),
                group: group.clone(),
                kind: kind.clone(),
                causes: causes.clone(),
                ..Default::default()
            }),
            ApiError::Timeout {
                retry_after_seconds: Some(s),
                ..
            }
            | ApiError::TooManyRequests {
                retry_after_seconds: Some(s),
                ..
            } => Some(StatusDetails {
                retry_after_seconds: Some(*s),
                ..Default::default()
            }),
            ApiError::TooLargeResourceVersion { .. } => Some(StatusDetails {
                causes: vec![StatusCause {
                    reason: "ResourceVersionTooLarge".into(),
                    message: "Too large resource version".into(),
                    field: String::new(),
                }],
                retry_after_seconds: self.retry_after(),
                ..Default::default()
            }),
            _ => None,
        };
        Status::failure(self.code(), self.reason(), self.to_string(), details)
    }

    /// 403 about no one object.
    pub fn forbidden(msg: impl Into<String>) -> Self {
        ApiError::Forbidden {
            message: msg.into(),
            subject: None,
            causes: vec![],
        }
    }

    pub fn bad_request(msg: impl Into<String>) -> Self {
        ApiError::BadRequest(msg.into())
    }

    /// 429 for a request refused at a limit, in kube-apiserver's words with the reason
    /// (`queue-full`, a flag's bound), to be tried again after a second.
    pub fn too_many_requests(reason: &str) -> Self {
        ApiError::TooManyRequests {
            message: format!("Too many requests, please try again later ({reason})."),
            retry_after_seconds: Some(1),
        }
    }

    pub fn unprocessable(msg: impl Into<String>) -> Self {
        ApiError::Unprocessable(msg.into())
    }

    pub fn internal(msg: impl std::fmt::Display) -> Self {
        ApiError::Internal(msg.to_string())
    }

    /// `Too large resource version` (504), as Kubernetes answers for a future version.
    pub fn too_large_resource_version(requested: i64, current: i64) -> Self {
        ApiError::TooLargeResourceVersion { requested, current }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_kubernetes_shape() {
        let e = ApiError::NotFound(Subject::new("", "serviceaccounts", "builder"));
        let v = serde_json::to_value(e.to_status()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "serviceaccounts \"builder\" not found", "reason": "NotFound",
                "details": {"name": "builder", "kind": "serviceaccounts"}, "code": 404
            })
        );
    }

    /// kube-apiserver's `storage.NewTooLargeResourceVersionError`, field for field: client-go's
    /// reflector knows it by the cause, and then lists afresh.
    #[test]
    fn too_large_resource_version_matches_kubernetes_shape() {
        let e = ApiError::too_large_resource_version(10, 5);
        assert_eq!(e.retry_after(), Some(1));
        let v = serde_json::to_value(e.to_status()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Timeout: Too large resource version: 10, current: 5",
                "reason": "Timeout",
                "details": {
                    "causes": [{
                        "reason": "ResourceVersionTooLarge",
                        "message": "Too large resource version"
                    }],
                    "retryAfterSeconds": 1
                },
                "code": 504
            })
        );
    }

    /// kube-apiserver's success Status (a delete of a kind that does not return the object,
    /// a deletecollection) has no `code`.
    #[test]
    fn success_matches_kubernetes_shape() {
        let v = serde_json::to_value(Status::success(None)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"
            })
        );
        let back: Status = serde_json::from_value(v).unwrap();
        assert_eq!(back, Status::success(None));
    }

    /// A refusal about one object names it in its details, as Kubernetes' `NewForbidden`.
    #[test]
    fn forbidden_names_its_object_when_it_has_one() {
        let about = ApiError::Forbidden {
            message: "secrets \"late\" is forbidden: unable to create new content".into(),
            subject: Some(Subject::new("", "secrets", "late")),
            causes: vec![StatusCause {
                reason: "NamespaceTerminating".into(),
                message: "namespace ns is being terminated".into(),
                field: "metadata.namespace".into(),
            }],
        };
        let v = serde_json::to_value(about.to_status()).unwrap();
        assert_eq!(
            v["details"],
            serde_json::json!({"name": "late", "kind": "secrets", "causes": [{
                "reason": "NamespaceTerminating",
                "message": "namespace ns is being terminated",
                "field": "metadata.namespace"
            }]})
        );
        assert_eq!(
            (v["code"].as_u64(), v["reason"].as_str()),
            (Some(403), Some("Forbidden"))
        );
        let plain = serde_json::to_value(ApiError::forbidden("no").to_status()).unwrap();
        assert!(plain.get("details").is_none(), "{plain}");
    }

    #[test]
    fn invalid_names_every_field() {
        let e = ApiError::Invalid {
            kind: "Namespace".into(),
            group: String::new(),
            name: "Bad_Name".into(),
            causes: vec![StatusCause {
                reason: "FieldValueInvalid".into(),
                message: "Invalid value: \"Bad_Name\": a lowercase RFC 1123 label".into(),
                field: "metadata.name".into(),
            }],
        };
        let s = e.to_status();
        assert_eq!(s.code, 422);
        assert!(
            s.message.contains("metadata.name: Invalid value"),
            "{}",
            s.message
        );
        assert_eq!(s.details.unwrap().causes[0].field, "metadata.name");
    }

    #[test]
    fn grouped_resources_are_qualified() {
        let e = ApiError::AlreadyExists(Subject::new("events.svc.io", "events", "e1"));
        assert_eq!(e.to_string(), "events.events.svc.io \"e1\" already exists");
        assert_eq!(e.code(), 409);
        // An invalid object names its kind with the group; the core group's kind stands alone.
        let invalid = |group: &str| ApiError::Invalid {
            kind: "Event".into(),
            group: group.into(),
            name: "e1".into(),
            causes: vec![StatusCause {
                reason: "FieldValueRequired".into(),
                message: "Required value".into(),
                field: "reason".into(),
            }],
        };
        assert_eq!(
            invalid("events.svc.io").to_string(),
            "Event.events.svc.io \"e1\" is invalid: reason: Required value"
        );
        assert_eq!(
            invalid("").to_string(),
            "Event \"e1\" is invalid: reason: Required value"
        );
    }
}
