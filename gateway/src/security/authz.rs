//! Authorization: every request becomes `Attributes` (user, verb, API group, resource,
//! subresource, namespace, name, or a non-resource path) and goes down a chain of
//! authorizers. `system:masters` may do anything; the built-in policy lets anyone read
//! health and version and any authenticated user read discovery; configured authorizers
//! (webhooks) come next. The first that allows or denies decides; when none has an opinion
//! the answer is 403, worded as Kubernetes words it. `webhook` asks a remote authorizer;
//! `load` builds the configured part of the chain from `--authorization-config`.

pub mod webhook;

use std::future::Future;
use std::pin::Pin;

use svc_core::ApiError;
use svc_core::user::UserInfo;

use crate::base::router::ResourceRoute;

pub const GROUP_MASTERS: &str = "system:masters";
pub use svc_core::user::GROUP_AUTHENTICATED;
pub const USER_ANONYMOUS: &str = "system:anonymous";
pub const GROUP_UNAUTHENTICATED: &str = "system:unauthenticated";

/// A request, as an authorizer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    /// For resource requests: group, resource, subresource, namespace, name.
    pub resource: Option<ResourceAccess<'a>>,
    /// For other requests: the path.
    pub path: &'a str,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceAccess<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: &'a str,
    pub name: Option<&'a str>,
}

impl<'a> Attributes<'a> {
    /// The attributes of a request to a resource route.
    pub fn for_resource(route: &'a ResourceRoute, verb: &'a str) -> Attributes<'a> {
        Attributes {
            verb,
            resource: Some(ResourceAccess {
                group: route.info.group,
                version: route.info.version,
                resource: route.info.plural,
                subresource: route.subresource.as_deref(),
                namespace: &route.namespace,
                name: route.name.as_deref(),
            }),
            path: "",
        }
    }
}

/// What one authorizer says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied, with the reason (passed to the client after the standard message).
    Deny(String),
    /// Neither: the next authorizer decides.
    NoOpinion(String),
}

pub type DecisionFuture<'a> = Pin<Box<dyn Future<Output = Decision> + Send + 'a>>;

/// One link of the chain.
pub trait Authorizer: Send + Sync {
    /// The name metrics and logs use.
    fn name(&self) -> &str;
    fn authorize<'a>(&'a self, user: &'a UserInfo, attrs: &'a Attributes<'a>)
    -> DecisionFuture<'a>;
}

/// The built-in policy Kubernetes grants through its default roles: anyone may read health
/// and version (`system:public-info-viewer`), any authenticated user may read discovery and
/// OpenAPI (`system:discovery`). Checked in place, before any configured authorizer, so the
/// requests it decides cost no allocation.
fn default_policy_allows(user: &UserInfo, attrs: &Attributes<'_>) -> bool {
    attrs.resource.is_none()
        && attrs.verb == "get"
        && if user.in_group(GROUP_AUTHENTICATED) {
            discovery_path(attrs.path)
        } else {
            public_path(attrs.path)
        }
}

/// Paths anyone may read (health and version).
pub fn public_path(path: &str) -> bool {
    matches!(path, "/healthz" | "/livez" | "/readyz" | "/version")
        || ["/healthz/", "/livez/", "/readyz/"]
            .iter()
            .any(|p| path.starts_with(p))
}

/// Paths any authenticated user may read.
fn discovery_path(path: &str) -> bool {
    public_path(path)
        || matches!(path, "/api" | "/apis" | "/openapi/v2" | "/openapi/v3")
        || path.starts_with("/api/")
        || path.starts_with("/apis/")
        || path.starts_with("/openapi/")
}

/// `type: AlwaysAllow` in the configuration file: allows every request.
pub struct AlwaysAllow {
    pub name: String,
}

impl Authorizer for AlwaysAllow {
    fn name(&self) -> &str {
        &self.name
    }
    fn authorize<'a>(&'a self, _: &'a UserInfo, _: &'a Attributes<'a>) -> DecisionFuture<'a> {
        Box::pin(std::future::ready(Decision::Allow))
    }
}

/// `type: AlwaysDeny` in the configuration file. As in Kubernetes it has no opinion (with
/// the reason "Everything is forbidden."), so an authorizer after it may still allow; at the
/// end of the chain it is a 403.
pub struct AlwaysDeny {
    pub name: String,
}

/// The reason Kubernetes' AlwaysDeny authorizer gives.
pub const ALWAYS_DENY_REASON: &str = "Everything is forbidden.";

impl Authorizer for AlwaysDeny {
    fn name(&self) -> &str {
        &self.name
    }
    fn authorize<'a>(&'a self, _: &'a UserInfo, _: &'a Attributes<'a>) -> DecisionFuture<'a> {
        Box::pin(std::future::ready(Decision::NoOpinion(
            ALWAYS_DENY_REASON.to_string(),
        )))
    }
}

/// The authorizer chain of a server: `system:masters` (may do anything) and the built-in
/// policy, checked in place, then the configured authorizers in order.
pub struct Chain {
    authorizers: Vec<Box<dyn Authorizer>>,
}

impl Default for Chain {
    fn default() -> Self {
        Chain::new(Vec::new())
    }
}

impl Chain {
    /// `system:masters` and the built-in policy first, then `configured` in order.
    pub fn new(configured: Vec<Box<dyn Authorizer>>) -> Self {
        Chain {
            authorizers: configured,
        }
    }

    /// Ok when allowed; 403 naming user, verb, resource and scope otherwise.
    pub async fn authorize(&self, user: &UserInfo, attrs: &Attributes<'_>) -> Result<(), ApiError> {
        self.authorize_with_reason(user, attrs)
            .await
            .map(drop)
            .map_err(|(e, _)| e)
    }

    /// [`Chain::authorize`] with the deciding reason (empty when none was given), which
    /// audit records: Ok(reason) when allowed, the 403 and the reason otherwise.
    pub async fn authorize_with_reason(
        &self,
        user: &UserInfo,
        attrs: &Attributes<'_>,
    ) -> Result<String, (ApiError, String)> {
        if user.in_group(GROUP_MASTERS) || default_policy_allows(user, attrs) {
            return Ok(String::new());
        }
        let mut reasons = Vec::new();
        for a in &self.authorizers {
            match a.authorize(user, attrs).await {
                Decision::Allow => return Ok(String::new()),
                Decision::Deny(reason) => return Err((forbidden(user, attrs, &reason), reason)),
                Decision::NoOpinion(reason) => {
                    if !reason.is_empty() {
                        reasons.push(reason);
                    }
                }
            }
        }
        let reason = reasons.join(", ");
        Err((forbidden(user, attrs, &reason), reason))
    }
}

/// Kubernetes' wording of a 403, with the authorizers' reason after a colon if any.
pub fn forbidden(user: &UserInfo, attrs: &Attributes<'_>, reason: &str) -> ApiError {
    let base = match &attrs.resource {
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
            // The resource as Kubernetes qualifies it (`certificatesigningrequests.certificates.svc.io`).
            let qualified = if r.group.is_empty() {
                r.resource.to_string()
            } else {
                format!("{}.{}", r.resource, r.group)
            };
            let subject = match r.name {
                Some(n) => format!("{qualified} \"{n}\""),
                None => qualified,
            };
            format!(
                "{subject} is forbidden: User \"{}\" cannot {} resource \"{what}\" in API group \
                 \"{}\" {scope}",
                user.username, attrs.verb, r.group
            )
        }
        None => format!(
            "forbidden: User \"{}\" cannot {} path \"{}\"",
            user.username, attrs.verb, attrs.path
        ),
    };
    if reason.is_empty() {
        ApiError::forbidden(base)
    } else {
        ApiError::forbidden(format!("{base}: {reason}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            username: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        }
    }

    fn sa_get<'a>() -> Attributes<'a> {
        Attributes {
            verb: "get",
            resource: Some(ResourceAccess {
                group: "",
                version: "v1",
                resource: "serviceaccounts",
                subresource: Some("token"),
                namespace: "demo",
                name: Some("builder"),
            }),
            path: "/api/v1/namespaces/demo/serviceaccounts/builder/token",
        }
    }

    struct Fixed(Decision);
    impl Authorizer for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }
        fn authorize<'a>(&'a self, _: &'a UserInfo, _: &'a Attributes<'a>) -> DecisionFuture<'a> {
            Box::pin(std::future::ready(self.0.clone()))
        }
    }

    #[tokio::test]
    async fn masters_anyone_and_the_authenticated() {
        let chain = Chain::default();
        let admin = user("admin", &[GROUP_MASTERS]);
        assert!(chain.authorize(&admin, &sa_get()).await.is_ok());
        let jane = user("jane", &[GROUP_AUTHENTICATED]);
        let err = chain.authorize(&jane, &sa_get()).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "serviceaccounts \"builder\" is forbidden: User \"jane\" cannot get resource \
             \"serviceaccounts/token\" in API group \"\" in the namespace \"demo\""
        );
        let discovery = Attributes {
            verb: "get",
            resource: None,
            path: "/apis",
        };
        assert!(chain.authorize(&jane, &discovery).await.is_ok());
        let anon = user(USER_ANONYMOUS, &[GROUP_UNAUTHENTICATED]);
        assert!(chain.authorize(&anon, &discovery).await.is_err());
        let health = Attributes {
            path: "/readyz",
            ..discovery.clone()
        };
        assert!(chain.authorize(&anon, &health).await.is_ok());
        let post = Attributes {
            verb: "create",
            ..health.clone()
        };
        assert!(chain.authorize(&anon, &post).await.is_err());
    }

    #[tokio::test]
    async fn a_deny_stops_the_chain_and_no_opinion_passes_it_on() {
        let jane = user("jane", &[GROUP_AUTHENTICATED]);
        let deny_then_allow = Chain::new(vec![
            Box::new(Fixed(Decision::Deny("policy says no".into()))),
            Box::new(Fixed(Decision::Allow)),
        ]);
        let err = deny_then_allow
            .authorize(&jane, &sa_get())
            .await
            .unwrap_err();
        assert!(err.to_string().ends_with(": policy says no"), "{err}");
        let pass_then_allow = Chain::new(vec![
            Box::new(Fixed(Decision::NoOpinion("no rule".into()))),
            Box::new(Fixed(Decision::Allow)),
        ]);
        assert!(pass_then_allow.authorize(&jane, &sa_get()).await.is_ok());
        let only_pass = Chain::new(vec![Box::new(Fixed(Decision::NoOpinion("no rule".into())))]);
        let err = only_pass.authorize(&jane, &sa_get()).await.unwrap_err();
        assert_eq!(err.code(), 403);
        assert!(err.to_string().ends_with(": no rule"), "{err}");
    }
}
