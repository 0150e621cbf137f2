//! Whether a list or watch of a resource proxy mode caches is answered by its cache or passed
//! to the upstream: the one decision, taken beside the resourceVersion rules
//! (`registry/watch.rs`), as kube-apiserver's `shouldDelegateList` takes its own. The cache
//! answers only what it can answer exactly as the upstream would:
//!
//! | request | answered |
//! |---|---|
//! | list, `resourceVersion=0` or `NotOlderThan` | by the cache, once it has reached the version |
//! | list, `Exact` (or a version with `limit`) | by the cache's snapshots; the upstream when they no longer reach back |
//! | list, resourceVersion unset (a consistent read) | the upstream, as proving the cache fresh takes up to a second; but past [`STORM_LISTS`](crate::registry::caches::upstream::STORM_LISTS) a second (for the rest of it), and a third while two are answered upstream (a relist storm, until a second passes without one), the cache once proven fresh, one proof for them all (429 when the upstream is too busy to give it) |
//! | list, continue token of this proxy | the snapshot it names (410 when gone) |
//! | list, the upstream's continue token | the upstream |
//! | watch, `resourceVersion=0` | the cache, initial events first |
//! | watch from a version the cache holds history for, `sendInitialEvents` included | the cache |
//! | watch from a version past the cache that another cache has seen upstream (a consistent list's) | the cache, skipping what comes up to the version |
//! | watch from an older version (one held before this proxy started) | the upstream, so clients resume instead of relisting; 410 when the pass-through is over its bound (`http/proxy/bounds.rs`), so they relist from the cache |
//! | watch, resourceVersion unset, `sendInitialEvents=true` (client-go's informers) | the cache, once proven as fresh as the upstream (`caches/upstream/fresh.rs`): for one object (its name as the field selector, in its namespace: a kubelet's ConfigMap and Secret informers), that object as upstream has it now; the upstream when it cannot prove it, 429 with `Retry-After` when it is too busy to |
//! | watch, resourceVersion unset, no initial events | the upstream (a consistent start) |
//! | a resourceVersion that is not a positive integer, an expired token of the upstream's, bad parameters | the upstream: it answers with its own words |
//!
//! [`ready`] carries a plan's steps out, and [`watch`] and [`list`] read the cache as it says:
//! `http/cached.rs` calls them as the REST handlers call `registry/watch.rs` and
//! `registry/list.rs`, and keeps what is about HTTP (the media types the cache can write,
//! Tables, the response).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use svc_core::watch::{CachedObject, ListRequest, Selector, WatchRequest, WatchStart, Watcher};
use svc_core::{ApiError, ListMeta};
use svc_storage::Revision;

use crate::base::query::ListOptions;
use crate::registry::caches::upstream::fresh::{RETRY_AFTER_SECONDS, Unproven};
use crate::registry::caches::upstream::{Passing, UpstreamCache, UpstreamCaches};
use crate::registry::list::{
    ContinueToken, ReadPoint, expired_continue, page_meta, reads_exactly, unix_now,
};
use crate::registry::watch::{initial_events, watch_start};

/// How long a cached read waits for its cache to reach the version it names before it is
/// passed through instead.
pub const CATCH_UP: Duration = Duration::from_millis(100);

/// A list or watch of a cached collection, as the decision reads it.
pub struct Read<'a> {
    pub opts: &'a ListOptions,
    /// The continue token, when it is this proxy's (decoded and not expired).
    pub token: Option<&'a ContinueToken>,
    /// The namespace of the path; empty for all.
    pub namespace: &'a str,
    /// The name a `metadata.name` field selector pins.
    pub pinned: Option<&'a str>,
}

/// Who answers.
#[derive(Debug)]
pub enum Delegation<'a> {
    /// The upstream.
    Upstream,
    /// The upstream, for a consistent list outside a storm: counted in flight until its
    /// response ends (`caches/upstream.rs` `Storm`).
    Passing(Passing),
    /// The upstream, as the cache's history no longer reaches back to the version; when the
    /// pass-through cannot be admitted, this 410 instead (kube-apiserver's words), so that
    /// the client lists again, from the cache.
    UpstreamOrGone(ApiError),
    /// The cache, after the plan's steps.
    Cache(Plan<'a>),
}

/// How the cache answers.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan<'a> {
    /// Proven as fresh as the upstream first: a read from the newest state.
    pub proof: Option<Proof<'a>>,
    /// The revision the cache must reach first (within `http/cached.rs`'s `CATCH_UP`, or the
    /// upstream answers): a version asked for, or a continue token's.
    pub reach: Option<Revision>,
    /// Where a watch starts; None for a list.
    pub start: Option<WatchStart>,
}

/// What a proof covers.
#[derive(Debug, PartialEq, Eq)]
pub enum Proof<'a> {
    /// One object, by name (in the read's namespace).
    Object(&'a str),
    /// The whole cache.
    Whole,
}

/// Decides who answers `read` of `cached`; `upstream_reached` gives the newest revision any
/// of the proxy's caches has seen upstream, read only for a watch from a version.
pub fn decide<'a>(
    read: &Read<'a>,
    cached: &UpstreamCache,
    upstream_reached: impl FnOnce() -> Revision,
) -> Delegation<'a> {
    let opts = read.opts;
    let rv = opts.resource_version.as_deref();
    let rv_num = match rv {
        None | Some("0") => None,
        Some(v) => match v.parse::<Revision>().ok().filter(|n| *n > 0) {
            Some(n) => Some(n),
            None => return Delegation::Upstream,
        },
    };
    // client-go's informers start so: a streaming list from the newest state.
    let consistent_start = opts.watch && rv.is_none() && opts.send_initial_events == Some(true);
    // A consistent list is the upstream's, unless many arrive at once (informers relisting
    // together): then they share one proof of freshness and the cache answers them.
    let consistent_list = !opts.watch && rv.is_none() && read.token.is_none();
    if consistent_list && let Some(passing) = cached.storm.arrived() {
        return Delegation::Passing(passing);
    }
    if opts.watch {
        if rv.is_none() && !consistent_start {
            return Delegation::Upstream;
        }
        let oldest = cached.cache.oldest_revision();
        if let Some(n) = rv_num.filter(|n| *n < oldest) {
            return Delegation::UpstreamOrGone(ApiError::Expired(format!(
                "too old resource version: {n} ({})",
                oldest.saturating_sub(1)
            )));
        }
    }
    // One object: a name, and a namespace exactly where the kind has them.
    let one_object = read.namespace.is_empty() != cached.info.namespaced();
    let proof = (consistent_start || consistent_list).then(|| {
        match read.pinned.filter(|_| consistent_start && one_object) {
            Some(name) => Proof::Object(name),
            None => Proof::Whole,
        }
    });
    let wanted = rv_num.or(read.token.map(|t| t.rv));
    // A watch from a revision the upstream is known to have reached (another cache saw it)
    // starts at once, ahead of this cache if need be: it wants only what comes after, and
    // this cache's upstream watch delivers that in order. Initial events and lists need
    // the cache itself at the revision.
    let ahead = opts.watch
        && !initial_events(rv, opts.send_initial_events)
        && wanted.is_some_and(|n| n <= upstream_reached());
    let start = if opts.watch {
        match watch_start(
            rv,
            opts.send_initial_events,
            opts.allow_watch_bookmarks,
            ahead,
        ) {
            Ok(s) => Some(s),
            Err(_) => return Delegation::Upstream,
        }
    } else {
        None
    };
    Delegation::Cache(Plan {
        proof,
        reach: wanted.filter(|_| !ahead),
        start,
    })
}

/// Why the cache does not answer after all.
#[derive(Debug)]
pub enum NotCached {
    /// The upstream answers: it cannot prove the cache fresh, the cache did not reach the
    /// version in time, or its history or snapshots moved on meanwhile.
    Upstream,
    /// This error answers (a cache still filling, an upstream too busy to prove it fresh,
    /// a bad request).
    Error(ApiError),
}

impl From<ApiError> for NotCached {
    fn from(e: ApiError) -> Self {
        NotCached::Error(e)
    }
}

/// Carries out the steps of `plan` before the cache answers a read in `namespace`: a cache
/// not filled yet answers 429 with `Retry-After`, as kube-apiserver does while its watch
/// cache initializes; then the proof of freshness, if any (an upstream too busy to give it
/// answers 429, one that cannot passes the read through); then the revision to reach.
pub async fn ready(
    caches: &UpstreamCaches,
    cached: &UpstreamCache,
    plan: &Plan<'_>,
    namespace: &str,
) -> Result<(), NotCached> {
    let plural = cached.info.plural;
    if !cached.status.synced.load(Ordering::Acquire) {
        return Err(NotCached::Error(ApiError::TooManyRequests {
            message: format!(
                "the proxy's cache of {plural} is being filled, please try again later"
            ),
            retry_after_seconds: Some(1),
        }));
    }
    let proven = match plan.proof {
        None => Ok(()),
        Some(Proof::Object(name)) => caches.prove_object_fresh(cached, namespace, name).await,
        Some(Proof::Whole) => caches.prove_fresh(cached).await,
    };
    match proven {
        Ok(()) => {}
        // The upstream cannot prove it: it answers the read itself.
        Err(Unproven::Refused(_)) => return Err(NotCached::Upstream),
        // The upstream is behind: sending it the read too would only add to its load.
        Err(e @ Unproven::Busy(_)) => {
            return Err(NotCached::Error(ApiError::TooManyRequests {
                message: format!(
                    "the proxy could not prove its cache of {plural} fresh: {e}; please try again later"
                ),
                retry_after_seconds: Some(RETRY_AFTER_SECONDS),
            }));
        }
    }
    if let Some(n) = plan.reach
        && cached.cache.revision() < n
        && tokio::time::timeout(CATCH_UP, cached.cache.wait_for_revision(n))
            .await
            .is_err()
    {
        return Err(NotCached::Upstream);
    }
    Ok(())
}

/// Registers a watcher of the cache from the plan's start.
pub fn watch(cached: &UpstreamCache, req: WatchRequest) -> Result<Watcher, NotCached> {
    match cached.cache.watch(req, Instant::now()) {
        Ok(w) => Ok(w),
        // The history moved on meanwhile: the upstream may still hold it.
        Err(ApiError::Expired(_) | ApiError::Gone(_)) => Err(NotCached::Upstream),
        Err(e) => Err(e.into()),
    }
}

/// A page of the cache's list in `namespace` (empty for all), by the resourceVersion rules
/// and `token` (this proxy's continue token): its objects and its list metadata.
pub fn list(
    cached: &UpstreamCache,
    namespace: &str,
    opts: &ListOptions,
    token: Option<&ContinueToken>,
    selector: &Selector,
) -> Result<(Vec<Arc<CachedObject>>, ListMeta), NotCached> {
    let prefix = cached.info.prefix(Some(namespace));
    let limit = opts.limit.and_then(|l| usize::try_from(l).ok());
    let ReadPoint {
        at,
        start_after,
        issued,
    } = match token {
        Some(t) => ReadPoint::after_token(t, &prefix),
        None => ReadPoint {
            at: match opts.resource_version.as_deref() {
                None | Some("0") => None,
                Some(v) => reads_exactly(opts, limit).then(|| v.parse::<i64>().unwrap_or_default()),
            },
            start_after: None,
            issued: unix_now(),
        },
    };
    let req = ListRequest {
        namespace: (!namespace.is_empty()).then_some(namespace),
        at,
        start_after: start_after.as_deref(),
        limit,
        selector,
    };
    let page = match cached.cache.list(&req) {
        Ok(p) => p,
        Err(ApiError::Expired(_)) if token.is_some() => return Err(expired_continue().into()),
        // The snapshots no longer reach back to an Exact version: the upstream answers.
        Err(ApiError::Expired(_)) => return Err(NotCached::Upstream),
        Err(e) => return Err(e.into()),
    };
    let meta = page_meta(
        page.revision,
        page.continue_after.as_deref(),
        page.remaining,
        &prefix,
        selector,
        issued,
    );
    Ok((page.items, meta))
}

#[cfg(test)]
mod tests;
