//! Lists and watches served from proxy mode's caches (`outbound/mirror.rs`), and the rules
//! that decide which ones may be: a GET of a cached resource's collection whose answer the
//! cache can give exactly as the upstream would.
//!
//! | request | served |
//! |---|---|
//! | list, `resourceVersion=0` or `NotOlderThan` | from the cache, once it has reached the version |
//! | list, `Exact` (or a version with `limit`) | from the cache's snapshots; passed through when they no longer reach back |
//! | list, resourceVersion unset (a consistent read) | passed through, as proving the cache fresh takes up to a second; but past [`crate::outbound::mirror::STORM_LISTS`] a second (a relist storm), from the cache once proven fresh, one proof for them all (429 when the upstream is too busy to give it) |
//! | list, continue token of this proxy | from the snapshot it names (410 when gone) |
//! | list, the upstream's continue token | passed through |
//! | watch, `resourceVersion=0` | from the cache, initial events first |
//! | watch from a version the cache holds history for, `sendInitialEvents` included | from the cache |
//! | watch from a version past the cache that another cache has seen upstream (a consistent list's) | from the cache, skipping what comes up to the version |
//! | watch from an older version (one held before this proxy started) | passed through, so clients resume instead of relisting; 410 when the pass-through is over its bound (`http/proxy/bounds.rs`), so they relist from the cache |
//! | watch, resourceVersion unset, `sendInitialEvents=true` (client-go's informers) | from the cache, once proven as fresh as the upstream (`outbound/mirror/fresh.rs`): for one object (its name as the field selector: a kubelet's ConfigMap and Secret informers), that object as upstream has it now; passed through when the upstream cannot prove it, 429 with `Retry-After` when it is too busy to within [`crate::outbound::mirror::fresh::PROOF_TIMEOUT`] |
//! | watch, resourceVersion unset, no initial events | passed through (a consistent start) |
//! | protobuf of a built-in kind (kubelets, controllers) | from the cache, written from the upstream's JSON (`svc_core::watch::unstructured::protobuf`) |
//! | protobuf only of a custom resource (which the upstream refuses too), Tables, field selectors the cache cannot evaluate, bad parameters | passed through: the upstream answers |
//!
//! A cached read is authorized first with the upstream's SubjectAccessReview, selectors
//! included (`security/access_review.rs`, grants cached 10 s), as the user the caller is, or
//! impersonates once the upstream allows it. While a cache has not been filled yet its reads
//! answer 429 with `Retry-After`, as kube-apiserver does while its watch cache initializes;
//! a version the cache has not reached within [`CATCH_UP`] is passed through.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::{HeaderMap, Response, header};
use svc_config::subject_access_review::{ResourceAttributes, SelectorAttributes};
use svc_core::ApiError;
use svc_core::selector::{FieldSelector, LabelSelector};
use svc_core::table::IncludeObject;
use svc_core::user::UserInfo;
use svc_core::watch::{FrameFormat, ListRequest, Selector, WatchRequest, WatchStart};

use crate::base::query::{ListOptions, Query};
use crate::http::api::Api;
use crate::http::negotiate::{self, Format};
use crate::http::proxy::Proxy;
use crate::http::respond::{self, Body};
use crate::outbound::mirror::fresh::{RETRY_AFTER_SECONDS, Unproven};
use crate::outbound::mirror::{Mirror, Mirrored};
use crate::registry::list::{decode_token, expired_continue, page_meta, reads_exactly};
use crate::security::impersonation;

/// How long a cached read waits for its cache to reach the version it names before it is
/// passed through instead.
pub const CATCH_UP: Duration = Duration::from_millis(100);

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

/// The answer for a cached read; `None` when the request is to be passed through. A watch
/// from a version older than the cache's history is passed through so that its client
/// resumes; `older` is then set to the 410 the cache would answer (kube-apiserver's words),
/// for the caller to give when the pass-through cannot be admitted: the client then lists
/// again, from this cache, instead of retrying a refusal.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    api: &Arc<Api>,
    proxy: &Proxy,
    mirror: &Mirror,
    caller: &UserInfo,
    path: &str,
    query: &Query,
    headers: &HeaderMap,
    older: &mut Option<ApiError>,
) -> Option<Response<Body>> {
    // Read as kube-apiserver reads it: the path percent-decoded first (`perm%2Da` is the
    // namespace `perm-a`, for the authorization check as for the cache).
    let decoded = crate::base::router::percent_decode(path)?;
    let target = collection(&decoded)?;
    let mirrored = mirror.get(target.group, target.version, target.resource)?;
    let info = mirrored.info;
    if !target.namespace.is_empty() && !info.namespaced() {
        return None;
    }
    let opts = ListOptions::from_query(query).ok()?;
    crate::registry::list::validate(&opts).ok()?;
    let ours_token = match &opts.continue_token {
        Some(t) => match decode_token(t, api.registry.continue_token_ttl) {
            Ok(t) => Some(t),
            // This proxy's token, too old: the upstream could not read it at all.
            Err(e @ ApiError::Expired(_)) => return Some(respond::error(&e)),
            // Not this proxy's: the upstream's own, or nobody's.
            Err(_) => return None,
        },
        None => None,
    };
    let rv = opts.resource_version.as_deref();
    let rv_num = match rv {
        None | Some("0") => None,
        Some(v) => Some(v.parse::<i64>().ok().filter(|n| *n > 0)?),
    };
    // Which requests the cache may answer (the table above).
    // A streaming list from the newest state (client-go's informers start so) waits for
    // proof that the cache is as fresh as the upstream; other consistent reads pass through.
    let consistent_start = opts.watch && rv.is_none() && opts.send_initial_events == Some(true);
    // A consistent list passes through, unless many arrive at once (informers relisting
    // together, a relist storm): then they share one proof of freshness and the cache
    // answers them, sparing the upstream.
    let consistent_list = !opts.watch && rv.is_none() && ours_token.is_none();
    if consistent_list && !mirrored.storm.arrived() {
        return None;
    }
    if opts.watch {
        if rv.is_none() && !consistent_start {
            return None;
        }
        let oldest = mirrored.cache.oldest_revision();
        if let Some(n) = rv_num.filter(|n| *n < oldest) {
            *older = Some(ApiError::Expired(format!(
                "too old resource version: {n} ({})",
                oldest.saturating_sub(1)
            )));
            return None;
        }
    }
    let protobuf = mirrored.cache.codec().protobuf.is_some();
    let format = cached_format(headers, api, opts.watch, protobuf)?;
    let labels = LabelSelector::parse(&opts.label_selector).ok()?;
    // The kind's own fields, and `metadata.namespace` only where it is namespaced: a field
    // selector the upstream refuses is passed through, for its own 400.
    let fields = FieldSelector::parse(&opts.field_selector, |f| info.supports_field(f)).ok()?;
    let include = match format {
        Format::Table => return None,
        _ => IncludeObject::parse(query.get("includeObject")).ok()?,
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
    let name = pinned_name(&fields);
    if let Err(e) = authorize(
        proxy,
        &acting,
        &mirrored,
        target.namespace,
        name,
        verb,
        &opts,
    )
    .await
    {
        return Some(respond::error(&e));
    }
    if !mirrored.status.synced.load(Ordering::Acquire) {
        return Some(respond::error(&ApiError::TooManyRequests {
            message: format!(
                "the proxy's cache of {} is being filled, please try again later",
                info.plural
            ),
            retry_after_seconds: Some(1),
        }));
    }
    // A start from the newest state of one object (a kubelet's ConfigMap and Secret
    // informers) is proven for that object alone, at once; others for the whole cache.
    if consistent_start || consistent_list {
        // One object: a name, and a namespace exactly where the kind has them.
        let one = consistent_start && target.namespace.is_empty() != info.namespaced();
        let proven = match name.filter(|_| one) {
            Some(name) => {
                mirror
                    .prove_object_fresh(&mirrored, target.namespace, name)
                    .await
            }
            None => mirror.prove_fresh(&mirrored).await,
        };
        match proven {
            Ok(()) => {}
            // The upstream cannot prove it: it answers the read itself.
            Err(Unproven::Refused(_)) => return None,
            // The upstream is behind: sending it the read too would only add to its load.
            Err(e @ Unproven::Busy(_)) => {
                return Some(respond::error(&ApiError::TooManyRequests {
                    message: format!(
                        "the proxy could not prove its cache of {} fresh: {e}; please try again later",
                        info.plural
                    ),
                    retry_after_seconds: Some(RETRY_AFTER_SECONDS),
                }));
            }
        }
    }
    let wanted = rv_num.or(ours_token.as_ref().map(|t| t.rv));
    // A watch from a revision the upstream is known to have reached (another cache saw it)
    // starts at once, ahead of this cache if need be: it wants only what comes after, and
    // this cache's upstream watch delivers that in order. Initial events and lists need
    // the cache itself at the revision.
    let ahead =
        opts.watch && !initial_events(&opts) && wanted.is_some_and(|n| n <= mirror.max_revision());
    if let Some(n) = wanted
        && !ahead
        && mirrored.cache.revision() < n
        && tokio::time::timeout(CATCH_UP, mirrored.cache.wait_for_revision(n))
            .await
            .is_err()
    {
        return None;
    }
    let selector = Selector::new(labels, fields);
    let answer = if opts.watch {
        watch(api, &mirrored, target.namespace, &opts, selector, format)
    } else {
        list(
            &mirrored,
            target.namespace,
            &opts,
            ours_token,
            selector,
            format,
            query.pretty(),
            include,
        )
    };
    match answer {
        Ok(resp) => {
            api.metrics.mirror_read(info, verb);
            Some(resp)
        }
        Err(Fallback::PassThrough) => None,
        Err(Fallback::Error(e)) => Some(respond::error_in(&e, format)),
    }
}

/// Whether a watch starts with the current state as events: the registry's rule.
fn initial_events(opts: &ListOptions) -> bool {
    crate::registry::watch::initial_events(
        opts.resource_version.as_deref(),
        opts.send_initial_events,
    )
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
    mirrored: &Mirrored,
    namespace: &str,
    name: Option<&str>,
    verb: &str,
    opts: &ListOptions,
) -> Result<(), ApiError> {
    let info = mirrored.info;
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

/// Why a cached read did not answer.
enum Fallback {
    /// The cache cannot answer as the upstream would (an Exact version older than its
    /// snapshots): the upstream answers.
    PassThrough,
    Error(ApiError),
}

impl From<ApiError> for Fallback {
    fn from(e: ApiError) -> Self {
        Fallback::Error(e)
    }
}

#[allow(clippy::too_many_arguments)]
fn list(
    mirrored: &Mirrored,
    namespace: &str,
    opts: &ListOptions,
    token: Option<crate::registry::list::ContinueToken>,
    selector: Selector,
    format: Format,
    pretty: bool,
    include: IncludeObject,
) -> Result<Response<Body>, Fallback> {
    let info = mirrored.info;
    let cache = &mirrored.cache;
    let prefix = info.prefix(Some(namespace));
    let limit = opts.limit.and_then(|l| usize::try_from(l).ok());
    let (at, start_after, issued) = match &token {
        Some(t) => {
            let mut start = prefix.clone();
            start.extend_from_slice(t.start.as_bytes());
            (Some(t.rv), Some(start), t.t)
        }
        None => {
            let exact = match opts.resource_version.as_deref() {
                None | Some("0") => None,
                Some(v) => reads_exactly(opts, limit).then(|| v.parse::<i64>().unwrap_or_default()),
            };
            (exact, None, crate::registry::list::unix_now())
        }
    };
    let req = ListRequest {
        namespace: (!namespace.is_empty()).then_some(namespace),
        at,
        start_after: start_after.as_deref(),
        limit,
        selector: &selector,
    };
    let page = match cache.list(&req) {
        Ok(p) => p,
        Err(ApiError::Expired(_)) if token.is_some() => return Err(expired_continue().into()),
        Err(ApiError::Expired(_)) => return Err(Fallback::PassThrough),
        Err(e) => return Err(e.into()),
    };
    let meta = page_meta(
        page.revision,
        page.continue_after.as_deref(),
        page.remaining,
        &prefix,
        &selector,
        issued,
    );
    Ok(respond::list(
        cache,
        &meta,
        &page.items,
        format,
        pretty,
        include,
    )?)
}

fn watch(
    api: &Api,
    mirrored: &Mirrored,
    namespace: &str,
    opts: &ListOptions,
    selector: Selector,
    format: Format,
) -> Result<Response<Body>, Fallback> {
    let info = mirrored.info;
    let frames = match format {
        Format::Json => FrameFormat::Json,
        Format::Protobuf(_) => FrameFormat::Protobuf,
        Format::Cbor => FrameFormat::CborSeq,
        Format::PartialMetadata { group, list: false } => FrameFormat::PartialMetadata(group),
        _ => return Err(Fallback::PassThrough),
    };
    let rv = opts.resource_version.as_deref();
    let initial = initial_events(opts);
    let bookmarks = opts.allow_watch_bookmarks;
    let start = match rv {
        Some("0") if initial => WatchStart::InitialEvents {
            end_bookmark: bookmarks && opts.send_initial_events == Some(true),
        },
        Some("0") => WatchStart::Now,
        Some(v) => {
            let v = v.parse::<i64>().unwrap_or_default();
            if initial {
                WatchStart::InitialEvents {
                    end_bookmark: bookmarks,
                }
            } else {
                WatchStart::Ahead(v)
            }
        }
        // Proven fresh first (`serve`), and only with `sendInitialEvents=true`: without it a
        // start from the newest state passes through before this (`serve`).
        None if opts.send_initial_events == Some(true) => WatchStart::InitialEvents {
            end_bookmark: bookmarks,
        },
        None => return Err(Fallback::PassThrough),
    };
    let req = WatchRequest {
        namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
        selector,
        start,
        bookmarks,
        format: frames,
    };
    let (watcher, first) = match mirrored.cache.watch(req, Instant::now()) {
        Ok(w) => (Some(w), None::<bytes::Bytes>),
        // The history moved on meanwhile: the upstream may still hold it.
        Err(ApiError::Expired(_) | ApiError::Gone(_)) => return Err(Fallback::PassThrough),
        Err(e) => return Err(e.into()),
    };
    Ok(crate::http::stream::watch_response(
        api,
        info,
        !namespace.is_empty(),
        watcher,
        first,
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
