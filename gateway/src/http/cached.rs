//! Lists and watches of proxy mode's caches (`registry/caches/upstream.rs`), over HTTP: the
//! collection read from the path, the media types the cache can write, the caller's access
//! asked of the upstream, and then the plan of the registry's decision (`registry/delegate.rs`:
//! whether the cache answers, after which proof and from which revision) carried out. `None`
//! passes the request through to the upstream: protobuf only of a custom resource (which the
//! upstream refuses too), Tables, field selectors the cache cannot evaluate, bad parameters,
//! and whatever the decision gives the upstream.
//!
//! A cached read is authorized first with the upstream's SubjectAccessReview, selectors
//! included (`security/access_review.rs`, grants cached 10 s), as the user the caller is, or
//! impersonates once the upstream allows it. While a cache has not been filled yet its reads
//! answer 429 with `Retry-After`, as kube-apiserver does while its watch cache initializes;
//! a version the cache has not reached within [`delegate::CATCH_UP`] is passed through.

use std::sync::Arc;

use http::{HeaderMap, Response, header};
use svc_config::subject_access_review::{ResourceAttributes, SelectorAttributes};
use svc_core::ApiError;
use svc_core::selector::{FieldSelector, LabelSelector};
use svc_core::table::IncludeObject;
use svc_core::user::UserInfo;
use svc_core::watch::{Selector, WatchRequest, WatchStart};

use crate::base::query::{ListOptions, Query};
use crate::http::api::Api;
use crate::http::negotiate::{self, Format};
use crate::http::proxy::Proxy;
use crate::http::respond::{self, Body};
use crate::registry::caches::upstream::{Passing, UpstreamCache, UpstreamCaches};
use crate::registry::delegate::{self, Delegation, NotCached, Read, decide};
use crate::registry::list::decode_token;
use crate::security::impersonation;

/// A collection request: /api/v1[/namespaces/NS]/RES or /apis/G/V[/namespaces/NS]/RES.
struct Collection<'a> {
    group: &'a str,
    version: &'a str,
    namespace: &'a str,
    resource: &'a str,
}

fn collection(path: &str) -> Option<Collection<'_>> {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, resource) = match rest {
        [resource] => ("", *resource),
        ["namespaces", ns, resource] if !ns.is_empty() => (*ns, *resource),
        _ => return None,
    };
    (!resource.is_empty()).then_some(Collection {
        group,
        version,
        namespace,
        resource,
    })
}

/// What a read passed through carries from the cache's decision.
#[derive(Debug, Default)]
pub struct Passed {
    /// The 410 the cache would answer a watch from a version older than its history.
    pub older: Option<ApiError>,
    /// A consistent list's place in flight (`Storm`), held until its response ends.
    pub passing: Option<Passing>,
}

/// The answer for a cached read; `None` when the request is to be passed through. A watch
/// from a version older than the cache's history is passed through so that its client
/// resumes; `older` is then set to the 410 the cache would answer (kube-apiserver's words),
/// for the caller to give when the pass-through cannot be admitted: the client then lists
/// again, from this cache, instead of retrying a refusal. A consistent list passed through
/// outside a storm sets `passed.passing`, to be held until its response ends.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    api: &Arc<Api>,
    proxy: &Proxy,
    caches: &UpstreamCaches,
    caller: &UserInfo,
    path: &str,
    query: &Query,
    headers: &HeaderMap,
    passed: &mut Passed,
) -> Option<Response<Body>> {
    // Read as kube-apiserver reads it: the path percent-decoded first (`perm%2Da` is the
    // namespace `perm-a`, for the authorization check as for the cache).
    let decoded = crate::base::router::percent_decode(path)?;
    let target = collection(&decoded)?;
    let cached = caches.get(target.group, target.version, target.resource)?;
    let info = cached.info;
    if !target.namespace.is_empty() && !info.namespaced() {
        return None;
    }
    let opts = ListOptions::from_query(query).ok()?;
    crate::registry::list::validate(&opts).ok()?;
    let ours_token = match &opts.continue_token {
        Some(t) => match decode_token(t, api.opts.continue_token_ttl) {
            Ok(t) => Some(t),
            // This proxy's token, too old: the upstream could not read it at all.
            Err(e @ ApiError::Expired(_)) => return Some(respond::error(&e)),
            // Not this proxy's: the upstream's own, or nobody's.
            Err(_) => return None,
        },
        None => None,
    };
    let protobuf = cached.writes_protobuf();
    let format = cached_format(headers, api, opts.watch, protobuf)?;
    let labels = LabelSelector::parse(&opts.label_selector).ok()?;
    // The kind's own fields, and `metadata.namespace` only where it is namespaced: a field
    // selector the upstream refuses is passed through, for its own 400.
    let fields = FieldSelector::parse(&opts.field_selector, |f| info.supports_field(f)).ok()?;
    let include = match format {
        Format::Table => return None,
        _ => IncludeObject::parse(query.get("includeObject")).ok()?,
    };

    let name = pinned_name(&fields).map(str::to_string);
    let read = Read {
        opts: &opts,
        token: ours_token.as_ref(),
        namespace: target.namespace,
        pinned: name.as_deref(),
    };
    let plan = match decide(&read, &cached, || caches.max_revision()) {
        Delegation::Upstream => return None,
        Delegation::Passing(p) => {
            passed.passing = Some(p);
            return None;
        }
        Delegation::UpstreamOrGone(gone) => {
            passed.older = Some(gone);
            return None;
        }
        Delegation::Cache(plan) => plan,
    };

    // Whom it is for, and whether the upstream lets them.
    let acting = match impersonation::requested(headers) {
        Ok(None) => caller.clone(),
        Ok(Some(wanted)) => {
            match impersonation::impersonate(&proxy.reviews, caller, wanted).await {
                Ok(u) => u,
                Err(e) => return Some(respond::error(&e)),
            }
        }
        Err(e) => return Some(respond::error(&e)),
    };
    if let Err(e) = impersonation::passable(&acting) {
        return Some(respond::error(&e));
    }
    let verb = if opts.watch { "watch" } else { "list" };
    if let Err(e) = authorize(
        proxy,
        &acting,
        &cached,
        target.namespace,
        name.as_deref(),
        verb,
        &opts,
    )
    .await
    {
        return Some(respond::error(&e));
    }
    match delegate::ready(caches, &cached, &plan, target.namespace).await {
        Ok(()) => {}
        Err(NotCached::Upstream) => return None,
        Err(NotCached::Error(e)) => return Some(respond::error(&e)),
    }
    let selector = Selector::new(labels, fields);
    let answer = match plan.start {
        Some(start) => watch(
            api,
            &cached,
            target.namespace,
            &opts,
            start,
            selector,
            format,
        ),
        None => delegate::list(
            &cached,
            target.namespace,
            &opts,
            ours_token.as_ref(),
            &selector,
        )
        .and_then(|(items, meta)| {
            // This proxy's continue tokens are among `opts`' (decoded as `ours_token`).
            let whole = respond::Whole::of(target.namespace, &selector, &opts);
            Ok(respond::list(
                &cached.cache,
                &meta,
                &items,
                format,
                query.pretty(),
                include,
                whole,
            )?)
        }),
    };
    match answer {
        Ok(resp) => {
            api.metrics.proxy_cache_read(info, verb);
            Some(resp)
        }
        Err(NotCached::Upstream) => None,
        Err(NotCached::Error(e)) => Some(respond::error_in(&e, format)),
    }
}

/// What the cache answers in: JSON, protobuf for the built-in kinds (`protobuf`: the cache
/// can write it), JSON for a client that prefers protobuf of a kind without it but takes JSON
/// (as client-go's clients do), YAML and partial metadata for lists, CBOR. `None`: protobuf
/// only of a kind without it, or Tables, which the upstream answers.
fn cached_format(headers: &HeaderMap, api: &Api, watch: bool, protobuf: bool) -> Option<Format> {
    match negotiate::response_format(headers, &api.opts.feature_gates, watch).ok()? {
        f @ Format::Protobuf(_) if protobuf => Some(f),
        Format::Protobuf(_) => {
            let accept = headers.get(header::ACCEPT)?.to_str().ok()?;
            accept
                .split(',')
                .any(|r| {
                    let mut parts = r.split(';').map(str::trim);
                    let essence = parts.next().unwrap_or_default();
                    essence.eq_ignore_ascii_case("application/json")
                        && !parts.any(|p| p.replace(' ', "") == "q=0")
                })
                .then_some(Format::Json)
        }
        Format::Table => None,
        Format::Yaml if watch => None,
        f => Some(f),
    }
}

/// Asks the upstream whether `user` may `verb` the collection (the object `name` names, when a
/// field selector pins one), with the request's selectors.
async fn authorize(
    proxy: &Proxy,
    user: &UserInfo,
    cached: &UpstreamCache,
    namespace: &str,
    name: Option<&str>,
    verb: &str,
    opts: &ListOptions,
) -> Result<(), ApiError> {
    let info = cached.info;
    let selector = |raw: &str| {
        (!raw.is_empty()).then(|| SelectorAttributes {
            raw_selector: raw.to_string(),
        })
    };
    let attrs = ResourceAttributes {
        namespace: namespace.to_string(),
        verb: verb.to_string(),
        group: info.group.to_string(),
        version: info.version.to_string(),
        resource: info.plural.to_string(),
        name: name.unwrap_or_default().to_string(),
        field_selector: selector(&opts.field_selector),
        label_selector: selector(&opts.label_selector),
        ..Default::default()
    };
    let (allowed, reason) = proxy.reviews.review(user, Some(attrs), None).await?;
    if allowed {
        return Ok(());
    }
    // kube-apiserver's words.
    let scope = if namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{namespace}\"")
    };
    let mut message = format!(
        "{} is forbidden: User \"{}\" cannot {verb} resource \"{}\" in API group \"{}\" {scope}",
        info.plural, user.username, info.plural, info.group
    );
    if !reason.is_empty() {
        message.push_str(": ");
        message.push_str(&reason);
    }
    Err(ApiError::forbidden(message))
}

/// The name a list or watch is about, as kube-apiserver's request info takes it for
/// authorization: the value a `metadata.name` term of the field selector pins (`=` or `==`),
/// when it could be a path segment. The Node authorizer allows a node its own Node and the
/// ConfigMaps and Secrets of its pods this way, one object at a time.
fn pinned_name(fields: &FieldSelector) -> Option<&str> {
    fields
        .exact("metadata.name")
        .filter(|n| !n.is_empty() && *n != "." && *n != ".." && !n.contains(['/', '%']))
}

fn watch(
    api: &Api,
    cached: &UpstreamCache,
    namespace: &str,
    opts: &ListOptions,
    start: WatchStart,
    selector: Selector,
    format: Format,
) -> Result<Response<Body>, NotCached> {
    let info = cached.info;
    // A format with no watch frames is the upstream's to answer.
    let frames = format.watch_frames().map_err(|_| NotCached::Upstream)?;
    let req = WatchRequest {
        namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
        selector,
        start,
        bookmarks: opts.allow_watch_bookmarks,
        format: frames,
    };
    let watcher = delegate::watch(cached, req)?;
    Ok(crate::http::stream::watch_response(
        api,
        info,
        !namespace.is_empty(),
        Some(watcher),
        None,
        opts.timeout_seconds,
        format,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_pinned_by_the_field_selector_is_authorized_as_kube_apiserver_does() {
        let name_of = |sel: &str| {
            let fields = FieldSelector::parse(sel, |_| true).ok()?;
            pinned_name(&fields).map(str::to_string)
        };
        assert_eq!(name_of("metadata.name=cm1").as_deref(), Some("cm1"));
        assert_eq!(name_of("metadata.name==cm1").as_deref(), Some("cm1"));
        assert_eq!(
            name_of("metadata.namespace=kp,metadata.name=hollow-1").as_deref(),
            Some("hollow-1")
        );
        for none in [
            "",
            "metadata.name!=cm1",
            "spec.nodeName=n1",
            "metadata.name=a/b",
            "metadata.name=..",
            "metadata.name=a%2f",
            "bad selector",
        ] {
            assert_eq!(name_of(none), None, "{none}");
        }
    }

    #[test]
    fn only_collections_are_read_from_the_cache() {
        let c = collection("/api/v1/namespaces/a/pods").unwrap();
        assert_eq!(
            (c.group, c.version, c.namespace, c.resource),
            ("", "v1", "a", "pods")
        );
        let c = collection("/apis/apps/v1/deployments").unwrap();
        assert_eq!(
            (c.group, c.version, c.resource),
            ("apps", "v1", "deployments")
        );
        for p in [
            "/api/v1/namespaces/a/pods/p",
            "/api/v1/namespaces/a/pods/p/log",
            "/api/v1/namespaces//pods",
            "/api/v1",
            "/apis/apps/v1/watch/deployments",
            "/healthz",
        ] {
            assert!(collection(p).is_none(), "{p}");
        }
        // `namespaces` itself is a collection of its own.
        let c = collection("/api/v1/namespaces").unwrap();
        assert_eq!(c.resource, "namespaces");
    }
}
