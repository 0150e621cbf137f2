//! Authentication (who is calling) and authorization (may they): client certificates now,
//! anonymous access when enabled; `system:masters` may do anything.

use svc_core::ApiError;

use crate::pki::UserInfo;

pub const GROUP_MASTERS: &str = "system:masters";
pub const GROUP_AUTHENTICATED: &str = "system:authenticated";
pub const USER_ANONYMOUS: &str = "system:anonymous";
pub const GROUP_UNAUTHENTICATED: &str = "system:unauthenticated";

/// What the connection established about the caller before any request arrived.
#[derive(Clone, Debug)]
pub struct ConnIdentity {
    /// The user of a verified client certificate.
    pub cert_user: Option<UserInfo>,
    /// The loopback-only plain-HTTP listener, where every caller is an administrator.
    pub insecure: bool,
}

pub fn anonymous() -> UserInfo {
    UserInfo {
        username: USER_ANONYMOUS.into(),
        uid: String::new(),
        groups: vec![GROUP_UNAUTHENTICATED.into()],
        extra: Default::default(),
    }
}

fn loopback_admin() -> UserInfo {
    UserInfo {
        username: "system:insecure-loopback".into(),
        uid: String::new(),
        groups: vec![GROUP_MASTERS.into(), GROUP_AUTHENTICATED.into()],
        extra: Default::default(),
    }
}

/// Finds the caller. A request with no usable credential is anonymous when anonymous access
/// is enabled, and 401 otherwise.
pub fn authenticate(
    conn: &ConnIdentity,
    headers: &http::HeaderMap,
    anonymous_enabled: bool,
) -> Result<UserInfo, ApiError> {
    if conn.insecure {
        return Ok(loopback_admin());
    }
    if let Some(user) = &conn.cert_user {
        return Ok(user.clone());
    }
    if headers.contains_key(http::header::AUTHORIZATION) {
        // No token authenticator is configured that accepts it: a presented but unknown
        // credential is never treated as anonymous.
        return Err(ApiError::Unauthorized("Unauthorized".into()));
    }
    if anonymous_enabled {
        return Ok(anonymous());
    }
    Err(ApiError::Unauthorized("Unauthorized".into()))
}

/// A request, as the authorizer sees it.
#[derive(Debug)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    /// For resource requests: group, resource, subresource, namespace, name.
    pub resource: Option<ResourceAttributes<'a>>,
    /// For other requests: the path.
    pub path: &'a str,
}

#[derive(Debug)]
pub struct ResourceAttributes<'a> {
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: &'a str,
    pub name: Option<&'a str>,
}

/// Paths anyone may read (Kubernetes' `system:public-info-viewer`).
fn public_path(path: &str) -> bool {
    matches!(path, "/healthz" | "/livez" | "/readyz" | "/version")
        || ["/healthz/", "/livez/", "/readyz/"]
            .iter()
            .any(|p| path.starts_with(p))
}

/// Paths any authenticated user may read (Kubernetes' `system:discovery`, `system:basic-user`).
fn discovery_path(path: &str) -> bool {
    public_path(path)
        || matches!(path, "/api" | "/apis" | "/openapi/v2" | "/openapi/v3")
        || path.starts_with("/api/")
        || path.starts_with("/apis/")
        || path.starts_with("/openapi/")
}

pub fn authorize(user: &UserInfo, attrs: &Attributes<'_>) -> Result<(), ApiError> {
    if user.groups.iter().any(|g| g == GROUP_MASTERS) {
        return Ok(());
    }
    let anonymous = user.username == USER_ANONYMOUS;
    if attrs.resource.is_none() && attrs.verb == "get" {
        let allowed = if anonymous {
            public_path(attrs.path)
        } else {
            discovery_path(attrs.path)
        };
        if allowed {
            return Ok(());
        }
    }
    Err(forbidden(user, attrs))
}

fn forbidden(user: &UserInfo, attrs: &Attributes<'_>) -> ApiError {
    match &attrs.resource {
        Some(r) => {
            let what = match r.subresource {
                Some(sub) => format!("{}/{}", r.resource, sub),
                None => r.resource.to_string(),
            };
            let scope = if r.namespace.is_empty() {
                "at the cluster scope".to_string()
            } else {
                format!("in the namespace \"{}\"", r.namespace)
            };
            let subject = match r.name {
                Some(n) => format!("{} \"{n}\"", r.resource),
                None => r.resource.to_string(),
            };
            ApiError::Forbidden(format!(
                "{subject} is forbidden: User \"{}\" cannot {} resource \"{what}\" in API group \
                 \"{}\" {scope}",
                user.username, attrs.verb, r.group
            ))
        }
        None => ApiError::Forbidden(format!(
            "forbidden: User \"{}\" cannot {} path \"{}\"",
            user.username, attrs.verb, attrs.path
        )),
    }
}
