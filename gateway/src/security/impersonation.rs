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

/// The caller's impersonation headers, read as kube-apiserver's impersonation filter reads
/// them: the first `Impersonate-User` and the first `Impersonate-Uid` (Go's `Header.Get`;
/// an empty one is none), every group and extra. `None` when no user is asked for and nothing
/// else is either; 400 for a group, uid or extra without a user, or a value that is not text.
pub fn requested(headers: &HeaderMap) -> Result<Option<Requested>, ApiError> {
    let text = |v: &HeaderValue| {
        v.to_str()
            .map(str::to_owned)
            .map_err(|_| ApiError::bad_request("an impersonation header is not text"))
    };
    let mut r = Requested::default();
    if let Some(user) = headers.get(USER) {
        r.user = text(user)?;
    }
    if let Some(uid) = headers.get(UID) {
        r.uid = Some(text(uid)?).filter(|u| !u.is_empty());
    }
    for group in headers.get_all(GROUP) {
        r.groups.push(text(group)?);
    }
    for (name, value) in headers {
        let n = name.as_str();
        if let Some(key) = n.strip_prefix(EXTRA_PREFIX) {
            let key = unescape_key(key)
                .ok_or_else(|| ApiError::bad_request(format!("malformed header {n:?}")))?;
            r.extra.entry(key).or_default().push(text(value)?);
        }
    }
    let others = !r.groups.is_empty() || r.uid.is_some() || !r.extra.is_empty();
    if r.user.is_empty() {
        if others {
            return Err(ApiError::bad_request(
                "requested impersonation of groups, a uid or extras without impersonating a user",
            ));
        }
        return Ok(None);
    }
    Ok(Some(r))
}

/// Whether the upstream reads `value` from a header exactly as it was sent: Go's HTTP/1.1
/// server trims leading and trailing blanks, and no server keeps control characters, so a
/// value with either would reach the upstream as another identity.
fn passes_exactly(value: &str) -> bool {
    let blank = |c: char| c == ' ' || c == '\t';
    !value.starts_with(blank) && !value.ends_with(blank) && !value.chars().any(char::is_control)
}

/// Refuses (403, logged) an identity the upstream would not read exactly as it is from
/// `Impersonate-*` headers: a name, uid, group, extra key or extra value with leading or
/// trailing blanks or control characters (a certificate's `O= system:masters` would
/// otherwise reach the upstream as `system:masters`). Every path that acts for a caller
/// upstream asks this first, cached reads included, so all of them refuse alike.
pub fn passable(user: &UserInfo) -> Result<(), ApiError> {
    let extras = user
        .extra
        .iter()
        .flat_map(|(k, vs)| std::iter::once(k).chain(vs.iter()));
    let bad = std::iter::once(&user.username)
        .chain(std::iter::once(&user.uid))
        .chain(user.groups.iter())
        .chain(extras)
        .find(|v| !passes_exactly(v));
    match bad {
        None => Ok(()),
        Some(value) => {
            tracing::warn!(
                user = ?user.username,
                value = ?value,
                "refused: the identity cannot be passed upstream exactly"
            );
            Err(ApiError::forbidden(format!(
                "the identity of User {:?} cannot be passed to the upstream API server exactly: \
                 {value:?} has leading or trailing blanks or control characters",
                user.username
            )))
        }
    }
}

/// The headers that make the upstream act as `user` (the proxy's credential must be allowed
/// to impersonate): user, one group header per group, uid and extras when set; 403 for an
/// identity they cannot carry exactly ([`passable`]).
pub fn headers_for(user: &UserInfo, out: &mut HeaderMap) -> Result<(), ApiError> {
    passable(user)?;
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

/// `system:serviceaccount:<namespace>:<name>` split, when well formed as kube-apiserver's
/// `SplitUsername` says: two parts, the namespace a DNS-1123 label and the name a DNS-1123
/// subdomain. Any other name is a plain user's, impersonated as one.
fn service_account(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
    let (namespace, name) = rest.split_once(':')?;
    let valid = !name.contains(':')
        && svc_core::validation::dns1123_label(namespace).is_ok()
        && svc_core::validation::dns1123_subdomain(name).is_ok();
    valid.then_some((namespace, name))
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

    #[test]
    fn the_first_user_and_uid_are_read_as_go_reads_them() {
        let mut headers = HeaderMap::new();
        headers.append(USER, HeaderValue::from_static("admin"));
        headers.append(USER, HeaderValue::from_static("erin"));
        headers.append(UID, HeaderValue::from_static("u1"));
        headers.append(UID, HeaderValue::from_static("u2"));
        let r = requested(&headers).unwrap().unwrap();
        assert_eq!(r.user, "admin");
        assert_eq!(r.uid.as_deref(), Some("u1"));
        // An empty user with nothing else asks for nothing; with a group it is refused.
        let mut empty = HeaderMap::new();
        empty.insert(USER, HeaderValue::from_static(""));
        assert_eq!(requested(&empty).unwrap(), None);
        empty.insert(GROUP, HeaderValue::from_static("g"));
        assert_eq!(requested(&empty).unwrap_err().code(), 400);
    }

    #[test]
    fn service_account_names_are_validated_as_kube_apiserver_validates_them() {
        for bad in [
            "system:serviceaccount:ns:NOT_VALID",
            "system:serviceaccount:ns:a:b",
            "system:serviceaccount:NS:sa",
            "system:serviceaccount::sa",
            "system:serviceaccount:ns:",
            "system:serviceaccount:ns:-sa",
        ] {
            assert_eq!(service_account(bad), None, "{bad}");
        }
        assert_eq!(
            service_account("system:serviceaccount:kube-system:node.controller"),
            Some(("kube-system", "node.controller"))
        );
    }

    #[test]
    fn identities_the_upstream_would_read_otherwise_are_refused() {
        let user = |name: &str, group: &str| UserInfo {
            username: name.into(),
            groups: vec![group.into(), "system:authenticated".into()],
            ..UserInfo::default()
        };
        for (name, group) in [
            ("bob", " system:masters"),
            ("bob", "system:masters "),
            ("bob", "system:masters\t"),
            (" bob", "dev"),
            ("bob\t", "dev"),
            ("bo\u{7}b", "dev"),
        ] {
            let mut out = HeaderMap::new();
            let e = headers_for(&user(name, group), &mut out).unwrap_err();
            assert_eq!(e.code(), 403, "{name:?} {group:?}");
            assert!(out.is_empty());
        }
        let mut extra = user("bob", "dev");
        extra.extra.insert("scopes".into(), vec!["a ".into()]);
        assert_eq!(passable(&extra).unwrap_err().code(), 403);
        // Inner blanks, empty groups and text beyond ASCII pass as they are.
        let fine = UserInfo {
            username: "jane doe".into(),
            groups: vec![String::new(), "équipe".into()],
            ..UserInfo::default()
        };
        let mut out = HeaderMap::new();
        headers_for(&fine, &mut out).unwrap();
        assert_eq!(out[USER], "jane doe");
    }
}
