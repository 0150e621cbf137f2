//! What every resource handler shares: the request (`RestRequest`), its path namespace, the
//! selectors, the field manager, reading the current object with its error mapping, and the
//! store writes that give expiring kinds their time to live.

use bytes::Bytes;
use http::{header, request};
use svc_core::resource::field_value;
use svc_core::selector::{FieldSelector, LabelSelector};
use svc_core::status::StatusCause;
use svc_core::strict::FieldValidation;
use svc_core::{ApiError, Resource};

use crate::base::query::{ListOptions, Query};
use crate::base::router::ResourceRoute;
use crate::base::verb::Verb;
use crate::http::api::Standalone;
use crate::http::negotiate::Format;
use crate::registry::admission::{self};
use crate::registry::write::WriteRequest;
use crate::security::authz::Attributes;
use svc_core::user::UserInfo;

/// Checks that the caller may also do `verb` to the request's object: apply that creates
/// needs `create` besides `patch`, force deletion needs `unsafe-delete-ignore-read-errors`
/// besides `delete`, as Kubernetes asks.
pub(super) async fn authorize_also(
    app: &Standalone,
    call: &RestRequest,
    verb: &str,
) -> Result<(), ApiError> {
    let attrs = Attributes::for_resource(&call.route, verb);
    app.security
        .authorizer()
        .authorize(&call.user, &attrs)
        .await
}

/// The warnings of a response: field validation's, then admission's.
pub(super) fn response_warnings(decoded: &[String], outcome: &admission::Outcome) -> Vec<String> {
    let mut all = decoded.to_vec();
    all.extend(outcome.warnings.iter().cloned());
    all
}

/// Kubernetes' limit on `fieldManager`.
const MAX_FIELD_MANAGER_LEN: usize = 128;

/// One request to a resource endpoint.
pub struct RestRequest {
    pub parts: request::Parts,
    pub body: Bytes,
    pub route: ResourceRoute,
    pub query: Query,
    /// The request's verb, as the pipeline computed it.
    pub verb: Verb,
    pub user: UserInfo,
    /// The negotiated response format.
    pub format: Format,
}

impl RestRequest {
    /// 422 Invalid of the write's options (`CreateOptions`, `UpdateOptions`, `PatchOptions` or
    /// `DeleteOptions`, by method), as Kubernetes refuses a bad `dryRun`, `fieldValidation`,
    /// `fieldManager` or `force`.
    pub fn invalid_options(&self, cause: StatusCause) -> ApiError {
        let kind = match self.parts.method {
            http::Method::PUT => "UpdateOptions",
            http::Method::PATCH => "PatchOptions",
            http::Method::DELETE => "DeleteOptions",
            _ => "CreateOptions",
        };
        ApiError::Invalid {
            kind: kind.into(),
            group: "meta.svc.io".into(),
            name: String::new(),
            causes: vec![cause],
        }
    }

    /// The query's `dryRun`.
    pub fn dry_run(&self) -> Result<bool, ApiError> {
        self.query.dry_run().map_err(|c| self.invalid_options(c))
    }

    /// The query's `fieldValidation`.
    pub fn field_validation(&self) -> Result<FieldValidation, ApiError> {
        FieldValidation::parse(self.query.get("fieldValidation"))
            .map_err(|c| self.invalid_options(c))
    }

    /// Who writes and how, for the registry's typed writes.
    pub fn write_request(&self, dry_run: bool) -> WriteRequest<'_> {
        WriteRequest {
            user: &self.user,
            subresource: self.route.subresource.as_deref(),
            dry_run,
            audit: self.parts.extensions.get(),
        }
    }
}

/// The namespace of an object route, validated.
pub(super) fn path_namespace<T: Resource>(route: &ResourceRoute) -> Result<&str, ApiError> {
    if T::INFO.namespaced() && route.namespace.is_empty() {
        return Err(ApiError::bad_request(
            "a namespace is required for this resource",
        ));
    }
    Ok(&route.namespace)
}

/// The label and field selectors of a request, parsed once.
#[derive(Debug, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn parse<T: Resource>(opts: &ListOptions) -> Result<Self, ApiError> {
        let labels = LabelSelector::parse(&opts.label_selector)
            .map_err(|e| ApiError::bad_request(format!("unable to parse labelSelector: {e}")))?;
        let fields = FieldSelector::parse(&opts.field_selector, |f| T::INFO.supports_field(f))
            .map_err(|e| ApiError::bad_request(format!("unable to parse fieldSelector: {e}")))?;
        Ok(Selectors { labels, fields })
    }

    pub fn matches<T: Resource>(&self, obj: &T) -> bool {
        self.labels.matches(&obj.meta().labels) && self.fields.matches(|f| field_value(obj, f))
    }
}

/// The `fieldManager` of a write: the query parameter, else (non-apply only) the user agent
/// up to its first `/`, as Kubernetes derives it.
pub fn field_manager(call: &RestRequest, required: bool) -> Result<String, ApiError> {
    let manager = match call.query.get("fieldManager") {
        Some(m) if !m.is_empty() => m.to_string(),
        _ if required => {
            return Err(call.invalid_options(StatusCause {
                reason: "FieldValueRequired".into(),
                message: "Required value: is required for apply patch".into(),
                field: "fieldManager".into(),
            }));
        }
        _ => call
            .parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .unwrap_or_default()
            .chars()
            .take(MAX_FIELD_MANAGER_LEN)
            .collect(),
    };
    if manager.chars().count() > MAX_FIELD_MANAGER_LEN {
        return Err(ApiError::Invalid {
            kind: "PatchOptions".into(),
            group: String::new(),
            name: String::new(),
            causes: vec![StatusCause {
                reason: "FieldValueTooLong".into(),
                message: format!("Too long: may not be longer than {MAX_FIELD_MANAGER_LEN}"),
                field: "fieldManager".into(),
            }],
        });
    }
    Ok(manager)
}
