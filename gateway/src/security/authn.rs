//! Authentication: who is calling. The chain is the client certificate (verified by TLS),
//! then a bearer token (service-account tokens, then the JWT authenticators of
//! `--authentication-config`), then anonymous where allowed (by default only probes of health
//! and version; `--anonymous-auth` or the file's `anonymous` say otherwise); a credential that
//! is presented but not accepted is a 401, never anonymous.

use svc_core::ApiError;
use svc_core::user::UserInfo;

use svc_config::authentication::AnonymousAuthConfig;

use crate::registry::state::Registry;
use crate::security::authz::{
    GROUP_AUTHENTICATED, GROUP_MASTERS, GROUP_UNAUTHENTICATED, USER_ANONYMOUS, public_path,
};
use crate::security::jwt::{self, Verdict};
use crate::security::state::Security;
use crate::security::token_review::TokenReviewer;

/// What the connection established about the caller before any request arrived.
#[derive(Clone, Debug)]
pub struct ConnIdentity {
    /// The user of a verified client certificate.
    pub cert_user: Option<UserInfo>,
    /// The loopback-only plain-HTTP listener, where every caller is an administrator.
    pub insecure: bool,
    /// The client's address (audit's `sourceIPs`).
    pub peer: Option<std::net::SocketAddr>,
    /// Proxy mode: the certificate is a front proxy's, whose caller the request's headers
    /// name ([`RequestHeaderNames`]).
    pub front_proxy: bool,
}

/// The headers a front proxy names its caller in (`--requestheader-*-headers`).
#[derive(Clone, Debug, Default)]
pub struct RequestHeaderNames {
    pub username: Vec<String>,
    pub group: Vec<String>,
    pub extra_prefix: Vec<String>,
    pub uid: Vec<String>,
}

impl RequestHeaderNames {
    /// The caller a front proxy names, as kube-apiserver's request-header authenticator reads
    /// it: the first username header present (none: not authenticated), every value of the
    /// group headers and `system:authenticated`, extra keys lower-cased and percent-decoded,
    /// the first uid header.
    pub fn user(&self, headers: &http::HeaderMap) -> Option<UserInfo> {
        let first = |names: &[String]| {
            names.iter().find_map(|n| {
                headers
                    .get(n.as_str())
                    .and_then(|v| v.to_str().ok())
                    .filter(|v| !v.is_empty())
                    .map(str::to_string)
            })
        };
        let username = first(&self.username)?;
        let mut groups: Vec<String> = self
            .group
            .iter()
            .flat_map(|n| headers.get_all(n.as_str()))
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect();
        // As kube-apiserver adds it to everyone it authenticates.
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        let mut extra: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (name, value) in headers {
            let lower = name.as_str();
            let Some(key) = self
                .extra_prefix
                .iter()
                .find_map(|p| lower.strip_prefix(p.to_ascii_lowercase().as_str()))
            else {
                continue;
            };
            let key = crate::security::impersonation::unescape_key(key)
                .unwrap_or_else(|| key.to_string())
                .to_ascii_lowercase();
            if let Ok(v) = value.to_str() {
                extra.entry(key).or_default().push(v.to_string());
            }
        }
        Some(UserInfo {
            username,
            uid: first(&self.uid).unwrap_or_default(),
            groups,
            extra,
        })
    }
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

fn unauthorized() -> ApiError {
    ApiError::Unauthorized("Unauthorized".into())
}

/// The bearer token of an `Authorization` header (`Bearer <token>`, scheme case-insensitive).
pub fn bearer_token(headers: &http::HeaderMap) -> Option<Result<&str, ()>> {
    let v = headers.get(http::header::AUTHORIZATION)?;
    let Ok(v) = v.to_str() else {
        return Some(Err(()));
    };
    let (scheme, token) = v.trim().split_once(' ').unwrap_or((v, ""));
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Some(Err(()));
    }
    Some(Ok(token))
}

/// Whether a request without a credential may go on as `system:anonymous`: as the
/// configuration file's `anonymous` says when it has one (the flag is then refused at start);
/// else everywhere with `--anonymous-auth=true`, nowhere with `false`, and by default only
/// probes of health and version.
fn anonymous_allowed(
    setting: Option<bool>,
    file: Option<&AnonymousAuthConfig>,
    method: &http::Method,
    path: &str,
) -> bool {
    if let Some(config) = file {
        return jwt::anonymous_allowed_by(config, path);
    }
    match setting {
        Some(allowed) => allowed,
        None => (method == http::Method::GET || method == http::Method::HEAD) && public_path(path),
    }
}

/// Finds the caller of a request that arrived on a connection.
pub async fn authenticate(
    security: &Security,
    registry: &Registry,
    anonymous_auth: Option<bool>,
    conn: &ConnIdentity,
    method: &http::Method,
    path: &str,
    headers: &http::HeaderMap,
) -> Result<UserInfo, ApiError> {
    if conn.insecure {
        return Ok(loopback_admin());
    }
    if let Some(user) = &conn.cert_user {
        return Ok(user.clone());
    }
    let authentication = security.authentication();
    match bearer_token(headers) {
        Some(Ok(token)) => {
            // Issuers are disjoint (no JWT authenticator may claim the service-account
            // issuer), so a token the JWT authenticators call theirs is never a
            // service-account token: asking them first changes no answer, and costs nothing
            // without a configuration file.
            match authentication.authenticate(token).await {
                Verdict::Accepted(user) => return Ok(UserInfo::clone(&user)),
                Verdict::Refused(e) => {
                    tracing::debug!(error = %e, "JWT rejected");
                    return Err(unauthorized());
                }
                Verdict::NotOurs => {}
            }
            match security
                .tokens
                .authenticate(token, &[], &registry.caches, registry.store.as_ref())
                .await
            {
                Ok(a) => Ok(a.user),
                Err(e) => {
                    tracing::debug!(error = %e, "bearer token rejected");
                    Err(unauthorized())
                }
            }
        }
        Some(Err(())) => Err(unauthorized()),
        None if anonymous_allowed(
            anonymous_auth,
            authentication.anonymous.as_ref(),
            method,
            path,
        ) =>
        {
            Ok(anonymous())
        }
        None => Err(unauthorized()),
    }
}

/// Finds the caller of a request to the proxy (`--upstream-kubeconfig`): the client
/// certificate (verified by TLS against `--client-ca-file`), else a bearer token the
/// upstream's TokenReview accepts, else anonymous for probes of health and version only.
/// There is no loopback listener in proxy mode, and a refused credential is a 401.
pub async fn authenticate_proxied(
    reviewer: &TokenReviewer,
    conn: &ConnIdentity,
    front_proxy: &RequestHeaderNames,
    method: &http::Method,
    path: &str,
    headers: &http::HeaderMap,
) -> Result<UserInfo, ApiError> {
    if conn.front_proxy {
        // The front proxy authenticated its caller; without a name there is no caller.
        return front_proxy.user(headers).ok_or_else(unauthorized);
    }
    if let Some(user) = &conn.cert_user {
        return Ok(user.clone());
    }
    match bearer_token(headers) {
        Some(Ok(token)) => reviewer.authenticate(token).await.map_err(|e| {
            tracing::debug!(error = %e, "bearer token rejected");
            unauthorized()
        }),
        Some(Err(())) => Err(unauthorized()),
        None if anonymous_allowed(None, None, method, path) => Ok(anonymous()),
        None => Err(unauthorized()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_default_only_probes_are_anonymous() {
        use http::Method;
        for path in ["/healthz", "/livez", "/readyz", "/readyz/etcd", "/version"] {
            assert!(anonymous_allowed(None, None, &Method::GET, path), "{path}");
            assert!(
                !anonymous_allowed(None, None, &Method::POST, path),
                "{path}"
            );
            assert!(
                !anonymous_allowed(Some(false), None, &Method::GET, path),
                "{path}"
            );
        }
        for path in [
            "/api",
            "/metrics",
            "/api/v1/namespaces",
            "/readyzz",
            "/versions",
        ] {
            assert!(!anonymous_allowed(None, None, &Method::GET, path), "{path}");
            assert!(
                anonymous_allowed(Some(true), None, &Method::GET, path),
                "{path}"
            );
        }
    }

    #[test]
    fn the_files_anonymous_settings_replace_the_default() {
        use http::Method;
        use svc_config::authentication::AnonymousAuthCondition;
        let only = |paths: &[&str]| AnonymousAuthConfig {
            enabled: true,
            conditions: paths
                .iter()
                .map(|p| AnonymousAuthCondition {
                    path: p.to_string(),
                })
                .collect(),
        };
        let livez = only(&["/livez"]);
        assert!(anonymous_allowed(
            None,
            Some(&livez),
            &Method::GET,
            "/livez"
        ));
        assert!(anonymous_allowed(
            None,
            Some(&livez),
            &Method::POST,
            "/livez"
        ));
        assert!(!anonymous_allowed(
            None,
            Some(&livez),
            &Method::GET,
            "/readyz"
        ));
        assert!(anonymous_allowed(
            None,
            Some(&only(&[])),
            &Method::GET,
            "/api"
        ));
        let off = AnonymousAuthConfig::default();
        assert!(!anonymous_allowed(
            None,
            Some(&off),
            &Method::GET,
            "/readyz"
        ));
    }

    #[test]
    fn bearer_tokens_are_read_strictly() {
        let h = |v: &str| {
            let mut m = http::HeaderMap::new();
            m.insert(http::header::AUTHORIZATION, v.parse().unwrap());
            m
        };
        assert_eq!(bearer_token(&h("Bearer abc")), Some(Ok("abc")));
        assert_eq!(bearer_token(&h("bearer  abc ")), Some(Ok("abc")));
        assert_eq!(bearer_token(&h("Basic abc")), Some(Err(())));
        assert_eq!(bearer_token(&h("Bearer")), Some(Err(())));
        assert_eq!(bearer_token(&http::HeaderMap::new()), None);
    }
}
