//! Maps a request path to what serves it: discovery, health, metrics, or a resource
//! (type, namespace, name, subresource), following the spec's path shapes.

use svc_core::ResourceInfo;
use svc_core::registry;

use crate::base::query::Query;

#[derive(Debug, PartialEq)]
pub enum Route {
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/{group}`
    Group(String),
    /// `/api/v1` or `/apis/{group}/{version}`
    ResourceList {
        group: String,
        version: String,
    },
    Version,
    /// `/healthz`, `/livez`, `/readyz`, optionally with one check name.
    Health {
        endpoint: &'static str,
        check: Option<String>,
    },
    Metrics,
    OpenApiV2,
    OpenApiV3Index,
    OpenApiV3 {
        group: String,
        version: String,
    },
    Resource(ResourceRoute),
    NotFound,
}

#[derive(Debug)]
pub struct ResourceRoute {
    pub info: &'static ResourceInfo,
    /// The namespace from the path; empty for cluster-scoped types and all-namespace lists.
    pub namespace: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl PartialEq for ResourceRoute {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.info, other.info)
            && self.namespace == other.namespace
            && self.name == other.name
            && self.subresource == other.subresource
    }
}

fn decode(seg: &str) -> Option<String> {
    let s = percent_decode(seg)?;
    if s.is_empty() { None } else { Some(s) }
}

/// `%XX` escapes decoded, as Go's `url.URL.Path` holds a request's path; `None` for a bad
/// escape or bytes that are not UTF-8.
pub(crate) fn percent_decode(seg: &str) -> Option<String> {
    let mut bytes = seg.bytes();
    let mut out = Vec::with_capacity(seg.len());
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

pub fn route(path: &str) -> Route {
    let trimmed = path.trim_end_matches('/');
    let segs: Vec<&str> = trimmed.split('/').skip(1).collect();
    let mut decoded = Vec::with_capacity(segs.len());
    for s in &segs {
        match decode(s) {
            Some(d) => decoded.push(d),
            None if trimmed.is_empty() => break,
            None => return Route::NotFound,
        }
    }
    let s: Vec<&str> = decoded.iter().map(String::as_str).collect();
    match s.as_slice() {
        ["api"] => Route::CoreVersions,
        ["apis"] => Route::Groups,
        ["version"] => Route::Version,
        ["metrics"] => Route::Metrics,
        ["openapi", "v2"] => Route::OpenApiV2,
        ["openapi", "v3"] => Route::OpenApiV3Index,
        ["openapi", "v3", "api", "v1"] => Route::OpenApiV3 {
            group: String::new(),
            version: "v1".into(),
        },
        ["openapi", "v3", "apis", g, v] => Route::OpenApiV3 {
            group: g.to_string(),
            version: v.to_string(),
        },
        [endpoint @ ("healthz" | "livez" | "readyz"), rest @ ..] => {
            let endpoint = match *endpoint {
                "healthz" => "healthz",
                "livez" => "livez",
                _ => "readyz",
            };
            let check = if rest.is_empty() {
                None
            } else {
                Some(rest.join("/"))
            };
            Route::Health { endpoint, check }
        }
        ["api", "v1"] => Route::ResourceList {
            group: String::new(),
            version: "v1".into(),
        },
        ["apis", g] => Route::Group(g.to_string()),
        ["apis", g, v] => Route::ResourceList {
            group: g.to_string(),
            version: v.to_string(),
        },
        ["api", "v1", rest @ ..] => resource("", "v1", rest),
        ["apis", g, v, rest @ ..] => resource(g, v, rest),
        _ => Route::NotFound,
    }
}

fn resource(group: &str, version: &str, rest: &[&str]) -> Route {
    let lookup = |plural: &str| registry::lookup(group, version, plural);
    let r = |info, namespace: &str, name: Option<&&str>, sub: Option<&&str>| {
        Route::Resource(ResourceRoute {
            info,
            namespace: namespace.to_string(),
            name: name.map(|n| n.to_string()),
            subresource: sub.map(|s| s.to_string()),
        })
    };
    // `namespaces/{ns}/{type}...` addresses a namespaced type, unless `{type}` is not one, in
    // which case it is a subresource of the namespace itself (`namespaces/x/status`).
    if let ["namespaces", ns, plural, tail @ ..] = rest
        && let Some(info) = lookup(plural).filter(|i| i.namespaced())
    {
        return match tail {
            [] | [_] | [_, _] => r(info, ns, tail.first(), tail.get(1)),
            _ => Route::NotFound,
        };
    }
    match rest {
        [plural, tail @ ..] if tail.len() <= 2 => match lookup(plural) {
            // A namespaced type by name without a namespace has no meaning: only collections.
            Some(info) if info.namespaced() && !tail.is_empty() => Route::NotFound,
            Some(info) => r(info, "", tail.first(), tail.get(1)),
            None => Route::NotFound,
        },
        _ => Route::NotFound,
    }
}

/// Whether a request asks for a watch, and the segments of its path after the group and
/// version with the deprecated `watch` segment left out. A watch is `?watch=true` (read as
/// every query flag is, [`Query::bool`]) or a `/watch/` path (`/api/v1/watch/pods`).
pub fn watch_and_rest(uri: &http::Uri) -> (bool, Vec<&str>) {
    let watch = Query::parse(uri.query()).bool("watch").unwrap_or(false);
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..),
        Some(&"apis") => segments.get(3..),
        _ => None,
    }
    .unwrap_or_default();
    match rest.split_first() {
        Some((&"watch", tail)) => (true, tail.to_vec()),
        _ => (watch, rest.to_vec()),
    }
}

/// Whether a request asks for a watch (see [`watch_and_rest`]).
pub fn is_watch(uri: &http::Uri) -> bool {
    watch_and_rest(uri).0
}

#[cfg(test)]
mod tests {
    #[test]
    fn watches_are_told_by_their_query_or_their_deprecated_path() {
        let watch = |u: &str| super::is_watch(&u.parse().unwrap());
        assert!(watch("/api/v1/pods?watch=true"));
        assert!(watch(
            "/apis/apps/v1/namespaces/a/deployments?watch=1&resourceVersion=5"
        ));
        assert!(watch("/api/v1/watch/namespaces/a/pods"));
        assert!(watch("/apis/apps/v1/watch/deployments"));
        assert!(!watch("/api/v1/pods"));
        assert!(!watch("/api/v1/pods?watch=false"));
        assert!(!watch("/api/v1/namespaces/watch/pods"));
        assert!(!watch("/apis/apps/v1/namespaces/watch"));
        assert!(!watch("/readyz"));
    }

    use super::*;

    fn res(path: &str) -> (String, String, Option<String>, Option<String>) {
        match route(path) {
            Route::Resource(r) => (r.info.plural.into(), r.namespace, r.name, r.subresource),
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn resource_paths() {
        assert_eq!(
            res("/api/v1/namespaces"),
            ("namespaces".into(), "".into(), None, None)
        );
        assert_eq!(
            res("/api/v1/namespaces/kube-system"),
            (
                "namespaces".into(),
                "".into(),
                Some("kube-system".into()),
                None
            )
        );
        assert_eq!(
            res("/api/v1/namespaces/x/status"),
            (
                "namespaces".into(),
                "".into(),
                Some("x".into()),
                Some("status".into())
            )
        );
        assert_eq!(
            res("/api/v1/namespaces/x/serviceaccounts"),
            ("serviceaccounts".into(), "x".into(), None, None)
        );
        assert_eq!(
            res("/api/v1/namespaces/x/serviceaccounts/default/token"),
            (
                "serviceaccounts".into(),
                "x".into(),
                Some("default".into()),
                Some("token".into())
            )
        );
        assert_eq!(
            res("/api/v1/serviceaccounts"),
            ("serviceaccounts".into(), "".into(), None, None)
        );
    }

    #[test]
    fn other_paths() {
        assert_eq!(route("/api"), Route::CoreVersions);
        assert_eq!(route("/api/"), Route::CoreVersions);
        assert_eq!(route("/apis"), Route::Groups);
        assert_eq!(
            route("/livez/ping"),
            Route::Health {
                endpoint: "livez",
                check: Some("ping".into())
            }
        );
        assert_eq!(
            route("/readyz/poststarthook/bootstrap"),
            Route::Health {
                endpoint: "readyz",
                check: Some("poststarthook/bootstrap".into())
            }
        );
        assert_eq!(route("/api/v1/serviceaccounts/x"), Route::NotFound);
        assert_eq!(route("/api/v1/pods"), Route::NotFound);
        assert_eq!(
            route("/api/v1/namespaces/a/serviceaccounts/b/c/d"),
            Route::NotFound
        );
        assert_eq!(
            route("/api/v1/namespaces/a%2Fb"),
            Route::Resource(ResourceRoute {
                info: registry::lookup("", "v1", "namespaces").unwrap(),
                namespace: String::new(),
                name: Some("a/b".into()),
                subresource: None,
            })
        );
        assert_eq!(route("/api/v1/namespaces/%zz"), Route::NotFound);
        assert_eq!(route("/"), Route::NotFound);
        assert_eq!(route("/nope"), Route::NotFound);
    }
}
