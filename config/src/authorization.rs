//! `AuthorizationConfiguration` (`apiserver.svc.io/v1beta1`, also `v1` and `v1alpha1`): the
//! ordered authorizers of `--authorization-config`, their rules (the spec's field tables and
//! Limits, and Kubernetes' `ValidateAuthorizationConfiguration` where the spec is silent) and
//! defaults. Match conditions are compiled and type-checked here, so a file that loads is a
//! file whose expressions run.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::{ConfigKind, Duration, Path};
use svc_core::validation::{ErrorList, dns1123_label};

pub const TYPE_WEBHOOK: &str = "Webhook";
pub const TYPE_ALWAYS_ALLOW: &str = "AlwaysAllow";
pub const TYPE_ALWAYS_DENY: &str = "AlwaysDeny";
/// Types this server runs.
pub const SUPPORTED_TYPES: &[&str] = &[TYPE_WEBHOOK, TYPE_ALWAYS_ALLOW, TYPE_ALWAYS_DENY];
/// Types Kubernetes accepts in the file that this server has no implementation of.
pub const UNSUPPORTED_TYPES: &[&str] = &["Node", "RBAC", "ABAC"];

pub const FAILURE_POLICY_NO_OPINION: &str = "NoOpinion";
pub const FAILURE_POLICY_DENY: &str = "Deny";
pub const CONNECTION_SVC_CONFIG: &str = "SvcConfig";

/// The spec's Limits table.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30);
pub const MAX_MATCH_CONDITIONS: usize = 64;
/// Kubernetes' defaults for the cache times when a file leaves them out.
pub const DEFAULT_AUTHORIZED_TTL: Duration = Duration::from_secs(300);
pub const DEFAULT_UNAUTHORIZED_TTL: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationConfiguration {
    #[serde(default)]
    pub authorizers: Vec<AuthorizerConfiguration>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizerConfiguration {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookConfiguration>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookConfiguration {
    /// Absent or zero: Kubernetes' default (5m) applies.
    #[serde(rename = "authorizedTTL", default)]
    pub authorized_ttl: Duration,
    /// Absent or zero: Kubernetes' default (30s) applies.
    #[serde(rename = "unauthorizedTTL", default)]
    pub unauthorized_ttl: Duration,
    /// Required, at most 30 s, no default.
    #[serde(default)]
    pub timeout: Duration,
    #[serde(default)]
    pub subject_access_review_version: String,
    #[serde(default)]
    pub match_condition_subject_access_review_version: String,
    #[serde(default)]
    pub failure_policy: String,
    #[serde(default)]
    pub connection_info: WebhookConnectionInfo,
    #[serde(default)]
    pub match_conditions: Vec<WebhookMatchCondition>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookConnectionInfo {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub svc_config_file: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookMatchCondition {
    #[serde(default)]
    pub expression: String,
}

impl ConfigKind for AuthorizationConfiguration {
    const API_VERSIONS: &'static [&'static str] = &[
        "apiserver.svc.io/v1beta1",
        "apiserver.svc.io/v1",
        "apiserver.svc.io/v1alpha1",
    ];
    const KIND: &'static str = "AuthorizationConfiguration";

    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        let root = Path::root("authorizers");
        if self.authorizers.is_empty() {
            errors.required(
                root.as_str(),
                "at least one authorization mode must be defined",
            );
        }
        let mut names = HashSet::new();
        let mut types = HashSet::new();
        for (i, a) in self.authorizers.iter().enumerate() {
            let path = root.index(i);
            validate_authorizer(a, &path, &mut names, &mut types, &mut errors);
        }
        errors
    }

    fn apply_defaults(&mut self) {
        for w in self
            .authorizers
            .iter_mut()
            .filter_map(|a| a.webhook.as_mut())
        {
            if w.authorized_ttl.is_zero() {
                w.authorized_ttl = DEFAULT_AUTHORIZED_TTL;
            }
            if w.unauthorized_ttl.is_zero() {
                w.unauthorized_ttl = DEFAULT_UNAUTHORIZED_TTL;
            }
        }
    }
}

fn validate_authorizer(
    a: &AuthorizerConfiguration,
    path: &Path,
    names: &mut HashSet<String>,
    types: &mut HashSet<String>,
    errors: &mut ErrorList,
) {
    let type_path = path.child("type");
    if a.type_.is_empty() {
        errors.required(type_path.as_str(), "");
    } else if UNSUPPORTED_TYPES.contains(&a.type_.as_str()) {
        errors.push(
            type_path.as_str(),
            "FieldValueNotSupported",
            format!(
                "Unsupported value: {:?}: not supported by this server: supported values: {}",
                a.type_,
                quoted(SUPPORTED_TYPES)
            ),
        );
    } else if !SUPPORTED_TYPES.contains(&a.type_.as_str()) {
        errors.not_supported(type_path.as_str(), &a.type_, SUPPORTED_TYPES);
    } else if a.type_ != TYPE_WEBHOOK && !types.insert(a.type_.clone()) {
        // As in Kubernetes: only webhooks may appear more than once.
        errors.duplicate(type_path.as_str(), &a.type_);
    }

    let name_path = path.child("name");
    if a.name.is_empty() {
        errors.required(name_path.as_str(), "");
    } else if let Err(msg) = dns1123_label(&a.name) {
        errors.invalid(name_path.as_str(), &a.name, &msg);
    } else if !names.insert(a.name.clone()) {
        errors.duplicate(name_path.as_str(), &a.name);
    }

    let webhook_path = path.child("webhook");
    match (&a.webhook, a.type_ == TYPE_WEBHOOK) {
        (None, true) => errors.required(webhook_path.as_str(), "required when type=Webhook"),
        (Some(_), false) => errors.invalid(
            webhook_path.as_str(),
            "non-null",
            "non-null webhook config is only allowed for type=Webhook",
        ),
        (Some(w), true) => validate_webhook(w, &webhook_path, errors),
        (None, false) => {}
    }
}

fn validate_webhook(w: &WebhookConfiguration, path: &Path, errors: &mut ErrorList) {
    for (field, ttl) in [
        ("authorizedTTL", w.authorized_ttl),
        ("unauthorizedTTL", w.unauthorized_ttl),
    ] {
        if ttl.is_negative() {
            errors.invalid(path.child(field).as_str(), &ttl.to_string(), "must be > 0");
        }
    }

    let timeout = path.child("timeout");
    if w.timeout.is_zero() {
        errors.required(timeout.as_str(), "");
    } else if w.timeout.is_negative() {
        errors.invalid(timeout.as_str(), &w.timeout.to_string(), "must be > 0s");
    } else if w.timeout > MAX_TIMEOUT {
        errors.invalid(timeout.as_str(), &w.timeout.to_string(), "must be <= 30s");
    }

    required_one_of(
        errors,
        &path.child("subjectAccessReviewVersion"),
        &w.subject_access_review_version,
        super::subject_access_review::VERSIONS,
    );
    required_one_of(
        errors,
        &path.child("matchConditionSubjectAccessReviewVersion"),
        &w.match_condition_subject_access_review_version,
        &["v1"],
    );
    required_one_of(
        errors,
        &path.child("failurePolicy"),
        &w.failure_policy,
        &[FAILURE_POLICY_NO_OPINION, FAILURE_POLICY_DENY],
    );

    let conn = path.child("connectionInfo");
    required_one_of(
        errors,
        &conn.child("type"),
        &w.connection_info.type_,
        &[CONNECTION_SVC_CONFIG],
    );
    let file_path = conn.child("svcConfigFile");
    match w.connection_info.svc_config_file.as_deref() {
        _ if w.connection_info.type_ != CONNECTION_SVC_CONFIG => {}
        None | Some("") => errors.required(file_path.as_str(), "required when type=SvcConfig"),
        Some(f) if !std::path::Path::new(f).is_absolute() => {
            errors.invalid(file_path.as_str(), f, "must be an absolute path");
        }
        Some(_) => {}
    }

    let conditions = path.child("matchConditions");
    if w.match_conditions.len() > MAX_MATCH_CONDITIONS {
        errors.push(
            conditions.as_str(),
            "FieldValueTooMany",
            format!(
                "Too many: {}: must have at most {MAX_MATCH_CONDITIONS} items",
                w.match_conditions.len()
            ),
        );
        return;
    }
    let mut seen = HashSet::new();
    for (i, c) in w.match_conditions.iter().enumerate() {
        let expr = conditions.index(i).child("expression");
        if c.expression.trim().is_empty() {
            errors.required(expr.as_str(), "");
        } else if !seen.insert(c.expression.as_str()) {
            errors.duplicate(expr.as_str(), &c.expression);
        } else if let Err(msg) = check_match_condition(&c.expression) {
            errors.invalid(expr.as_str(), &c.expression, &msg);
        }
    }
}

fn required_one_of(errors: &mut ErrorList, path: &Path, value: &str, allowed: &[&str]) {
    if value.is_empty() {
        errors.required(path.as_str(), "");
    } else if !allowed.contains(&value) {
        errors.not_supported(path.as_str(), value, allowed);
    }
}

fn quoted(values: &[&str]) -> String {
    let q: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    q.join(", ")
}

fn check_match_condition(expression: &str) -> Result<(), String> {
    compile_match_condition(expression)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Compiles one match condition over the v1 SubjectAccessReview spec (the variable
/// `request`: `request.user`, `request.resourceAttributes.namespace`, ...) and checks it
/// yields a bool.
pub fn compile_match_condition(
    expression: &str,
) -> Result<svc_cel::Program, svc_cel::CompileError> {
    let env = svc_cel::Env::new().var("request", svc_cel::Type::Dyn);
    let program = svc_cel::compile(expression, &env)?;
    program.expect(&[svc_cel::Type::Bool])?;
    Ok(program)
}

#[cfg(test)]
mod tests;
