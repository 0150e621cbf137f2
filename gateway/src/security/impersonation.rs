//! Impersonation in proxy mode. A caller's own `Impersonate-*` headers (`kubectl --as`) are
//! honoured only after the upstream allows each part with a SubjectAccessReview on the
//! `impersonate` verb, asked as kube-apiserver's impersonation filter asks it (users or
//! service accounts, groups, uids, user extras; answers cached by `access_review.rs`); the
//! proxy then acts as the impersonated user. Only these legacy `impersonate` grants are
//! asked about: kube-apiserver 1.37's constrained impersonation (`impersonate:<mode>`,
//! `impersonate-on:<mode>:<verb>` on the request's resource) is not, so the proxy may refuse
//! what the upstream would allow, never the reverse. The headers the proxy sends upstream
//! are written here too, with extra keys percent-encoded as client-go encodes them.

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName, HeaderValue};
use svc_config::subject_access_review::ResourceAttributes;
use svc_core::ApiError;
use svc_core::user::UserInfo;

use crate::security::access_review::AccessReviewer;

pub const USER: &str = "impersonate-user";
pub const GROUP: &str = "impersonate-group";
pub const UID: &str = "impersonate-uid";
pub const EXTRA_PREFIX: &str = "impersonate-extra-";

const ANONYMOUS: &str = "system:anonymous";
const AUTHENTICATED: &str = "system:authenticated";
const UNAUTHENTICATED: &str = "system:unauthenticated";
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// Whether a header is one a caller may not pass on as it stands: impersonation and the
/// request-header (front-proxy) identity.
pub fn is_identity_header(name: &HeaderName) -> bool {
    let n = name.as_str();
    n.starts_with("impersonate-") || n.starts_with("x-remote-")
}

/// Whether a header asks for impersonation (`Impersonate-*`).
pub fn is_impersonation_header(name: &HeaderName) -> bool {
    name.as_str().starts_with("impersonate-")
}

/// What the caller asked to act as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requested {
    pub user: String,
    pub groups: Vec<String>,
    pub uid: Option<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The caller's impersonation headers: `None` when there are none; 400 for a group, uid or
/// extra without a user, or a value that is not text (as kube-apiserver refuses them).
pub fn requested(headers: &HeaderMap) -> Result<Option<Requested>, ApiError> {
    let text = |v: &HeaderValue| {
        v.to_str()
            .map(str::to_owned)
            .map_err(|_| ApiError::bad_request("an impersonation header is not text"))
    };
    let mut found = false;
    let mut r = Requested::default();
    for (name, value) in headers {
        let n = name.as_str();
        if n == USER {
            found = true;
            r.user = text(value)?;
        } else if n == GROUP {
            found = true;
            r.groups.push(text(value)?);
        } else if n == UID {
            found = true;
            r.uid = Some(text(value)?);
        } else if let Some(key) = n.strip_prefix(EXTRA_PREFIX) {
            found = true;
            let key = unescape_key(key)
                .ok_or_else(|| ApiError::bad_request(format!("malformed header {n:?}")))?;
            r.extra.entry(key).or_default().push(text(value)?);
        }
    }
    if !found {
        return Ok(None);
    }
    if r.user.is_empty() {
        return Err(ApiError::bad_request(
            "requested impersonation of groups, a uid or extras without impersonating a user",
        ));
    }
    Ok(Some(r))
}

/// The headers that make the upstream act as `user` (the proxy's credential must be allowed
/// to impersonate): user, one group header per group, uid and extras when set.
pub fn headers_for(user: &UserInfo, out: &mut HeaderMap) -> Result<(), ApiError> {
    let value = |v: &str| {
        HeaderValue::from_str(v).map_err(|_| {
            ApiError::bad_request(format!("the identity {v:?} cannot be sent in a header"))
        })
    };
    out.insert(HeaderName::from_static(USER), value(&user.username)?);
    for g in &user.groups {
        out.append(HeaderName::from_static(GROUP), value(g)?);
    }
    if !user.uid.is_empty() {
        out.insert(HeaderName::from_static(UID), value(&user.uid)?);
    }
    for (key, values) in &user.extra {
        let name = HeaderName::from_bytes(format!("{EXTRA_PREFIX}{}", escape_key(key)).as_bytes())
            .map_err(|_| ApiError::bad_request(format!("the extra key {key:?} is not sendable")))?;
        for v in values {
            out.append(name.clone(), value(v)?);
        }
    }
    Ok(())
}

/// Bytes a header name may carry as they are (RFC 9110 `tchar`), less `%`, the escape.
fn legal_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b)
}

/// client-go's `headerKeyEscape`: every other byte as `%XX`.
pub fn escape_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if legal_key_byte(b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// kube-apiserver's reading of an extra key: lower case, then percent-decoded (`None` for
/// a bad escape or bytes that are not UTF-8).
pub fn unescape_key(key: &str) -> Option<String> {
    let lower = key.to_ascii_lowercase();
    let mut out = Vec::with_capacity(lower.len());
    let mut bytes = lower.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hi = char::from(bytes.next()?).to_digit(16)?;
            let lo = char::from(bytes.next()?).to_digit(16)?;
            out.push(u8::try_from(hi.checked_mul(16)?.checked_add(lo)?).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// The user `caller` acts as once the upstream allows every part of `wanted`, asked in
/// kube-apiserver's order (user, groups, extras, uid): 403 naming the first part refused,
/// 503 when the upstream cannot be asked.
pub async fn impersonate(
    reviews: &AccessReviewer,
    caller: &UserInfo,
    wanted: Requested,
) -> Result<UserInfo, ApiError> {
    let mut checks: Vec<ResourceAttributes> = Vec::new();
    let mut groups = wanted.groups.clone();
    match service_account(&wanted.user) {
        Some((namespace, name)) => {
            checks.push(attrs("", "serviceaccounts", "", namespace, name));
            if wanted.groups.is_empty() {
                groups.push("system:serviceaccounts".into());
                groups.push(format!("system:serviceaccounts:{namespace}"));
            }
        }
        None => checks.push(attrs("", "users", "", "", &wanted.user)),
    }
    for g in &wanted.groups {
        checks.push(attrs("", "groups", "", "", g));
    }
    for (key, values) in &wanted.extra {
        for v in values {
            checks.push(attrs("authentication.k8s.io", "userextras", key, "", v));
        }
    }
    if let Some(uid) = &wanted.uid {
        checks.push(attrs("authentication.k8s.io", "uids", "", "", uid));
    }
    for check in checks {
        let (allowed, reason) = reviews.review(caller, Some(check.clone()), None).await?;
        if !allowed {
            return Err(forbidden(caller, &check, &reason));
        }
    }
    if wanted.user == ANONYMOUS {
        if !groups.iter().any(|g| g == UNAUTHENTICATED) {
            groups.push(UNAUTHENTICATED.into());
        }
    } else if !groups
        .iter()
        .any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED)
    {
        groups.push(AUTHENTICATED.into());
    }
    Ok(UserInfo {
        username: wanted.user,
        uid: wanted.uid.unwrap_or_default(),
        groups,
        extra: wanted.extra,
    })
}

/// `system:serviceaccount:<namespace>:<name>` split, when well formed.
fn service_account(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
    let (namespace, name) = rest.split_once(':')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains(':')).then_some((namespace, name))
}

fn attrs(
    group: &str,
    resource: &str,
    subresource: &str,
    namespace: &str,
    name: &str,
) -> ResourceAttributes {
    ResourceAttributes {
        namespace: namespace.into(),
        verb: "impersonate".into(),
        group: group.into(),
        version: String::new(),
        resource: resource.into(),
        subresource: subresource.into(),
        name: name.into(),
        ..Default::default()
    }
}

/// kube-apiserver's words for a refused impersonation.
fn forbidden(caller: &UserInfo, check: &ResourceAttributes, reason: &str) -> ApiError {
    let resource = if check.subresource.is_empty() {
        check.resource.clone()
    } else {
        format!("{}/{}", check.resource, check.subresource)
    };
    let qualified = if check.group.is_empty() {
        check.resource.clone()
    } else {
        format!("{}.{}", check.resource, check.group)
    };
    let scope = if check.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", check.namespace)
    };
    let mut message = format!(
        "{qualified} \"{}\" is forbidden: User \"{}\" cannot impersonate resource \"{resource}\" \
         in API group \"{}\" {scope}",
        check.name, caller.username, check.group
    );
    if !reason.is_empty() {
        message.push_str(": ");
        message.push_str(reason);
    }
    ApiError::forbidden(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_keys_are_escaped_as_client_go_escapes_them() {
        let key = "authentication.kubernetes.io/pod-name";
        assert_eq!(escape_key(key), "authentication.kubernetes.io%2Fpod-name");
        assert_eq!(escape_key("a%b c"), "a%25b%20c");
        assert_eq!(unescape_key(&escape_key(key)).as_deref(), Some(key));
        assert_eq!(unescape_key("Foo%2fBar").as_deref(), Some("foo/bar"));
        assert_eq!(unescape_key("bad%2"), None);
        assert_eq!(unescape_key("bad%zz"), None);
    }

    #[test]
    fn identity_headers_are_read_and_written_alike() {
        let user = UserInfo {
            username: "alice".into(),
            uid: "42".into(),
            groups: vec!["dev".into(), "system:authenticated".into()],
            extra: [(
                "scopes.example.com/x".to_string(),
                vec!["a".into(), "b".into()],
            )]
            .into_iter()
            .collect(),
        };
        let mut headers = HeaderMap::new();
        headers_for(&user, &mut headers).unwrap();
        assert_eq!(headers.get_all(GROUP).iter().count(), 2);
        assert!(headers.contains_key("impersonate-extra-scopes.example.com%2Fx"));
        let back = requested(&headers).unwrap().unwrap();
        assert_eq!(back.user, "alice");
        assert_eq!(back.groups, user.groups);
        assert_eq!(back.uid.as_deref(), Some("42"));
        assert_eq!(back.extra, user.extra);
        assert!(headers.keys().all(is_identity_header));
        assert!(!is_identity_header(&http::header::AUTHORIZATION));
        assert!(is_identity_header(&HeaderName::from_static(
            "x-remote-user"
        )));
    }

    #[test]
    fn a_group_without_a_user_is_refused() {
        let mut headers = HeaderMap::new();
        assert_eq!(requested(&headers).unwrap(), None);
        headers.insert(GROUP, HeaderValue::from_static("system:masters"));
        assert_eq!(requested(&headers).unwrap_err().code(), 400);
    }

    #[test]
    fn refusals_read_as_kubernetes_writes_them() {
        let alice = UserInfo {
            username: "alice".into(),
            ..UserInfo::default()
        };
        let e = forbidden(&alice, &attrs("", "users", "", "", "bob"), "");
        assert_eq!(
            e.to_string(),
            "users \"bob\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in \
             API group \"\" at the cluster scope"
        );
        assert_eq!(
            service_account("system:serviceaccount:ns:sa"),
            Some(("ns", "sa"))
        );
        assert_eq!(service_account("system:serviceaccount:ns"), None);
    }
}
