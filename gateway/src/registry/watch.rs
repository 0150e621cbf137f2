//! Where a watch starts, by Kubernetes' resourceVersion rules: unset is a consistent start
//! (the cache first catches up with the store's current revision), `0` is any recent point,
//! a revision is "after that one" once the cache has reached it; `sendInitialEvents` (and its
//! defaults) decides whether the current state comes first, ended by a bookmark when asked.
//! The answer is the cache's watcher, which the HTTP side streams.

use std::time::Instant;

use svc_core::ApiError;
use svc_core::object::parse_resource_version;
use svc_core::registry::Kind;
use svc_core::watch::{FrameFormat, Selector, WatchRequest, WatchStart, Watcher};

use crate::registry::caches::freshness::{wait_for_cache, wait_for_consistent};
use crate::registry::state::Registry;

/// What a watch asks for.
pub struct WatchFrom<'a> {
    /// The namespace watched; None for all.
    pub namespace: Option<String>,
    pub selector: Selector,
    pub resource_version: Option<&'a str>,
    pub send_initial_events: Option<bool>,
    pub bookmarks: bool,
    pub format: FrameFormat,
}

/// Whether a watch starts with the current state as events, as Kubernetes decides it:
/// `sendInitialEvents` where given; otherwise for a watch from no version (the state now,
/// "get state and start at most recent") or from "0" (any state), and not from a version.
pub fn initial_events(resource_version: Option<&str>, send_initial_events: Option<bool>) -> bool {
    match (resource_version, send_initial_events) {
        (_, Some(v)) => v,
        (None | Some("0"), None) => true,
        (Some(_), None) => false,
    }
}

/// Where a watch starts, in both modes, once its cache is where the rules want it: caught up
/// with its source for an unset version, at any recent point for "0", at or past `v` for a
/// version `v` (or, `ahead`, behind `v` where the caller knows the source has passed it:
/// proxy mode, whose caches each follow their own upstream watch). An explicit
/// `sendInitialEvents=true` with bookmarks ends the initial events with the
/// `initial-events-end` bookmark; so does any initial listing from a given revision.
pub fn watch_start(
    resource_version: Option<&str>,
    send_initial_events: Option<bool>,
    bookmarks: bool,
    ahead: bool,
) -> Result<WatchStart, ApiError> {
    let initial = initial_events(resource_version, send_initial_events);
    let asked_end = bookmarks && send_initial_events == Some(true);
    Ok(match resource_version {
        None | Some("0") if initial => WatchStart::InitialEvents {
            end_bookmark: asked_end,
        },
        None | Some("0") => WatchStart::Now,
        Some(_) if initial => WatchStart::InitialEvents {
            end_bookmark: bookmarks,
        },
        Some(v) if ahead => WatchStart::Ahead(parse_resource_version(v)?),
        Some(v) => WatchStart::After(parse_resource_version(v)?),
    })
}

/// Starts a watch of `T`. The outer error is the request's (a bad resourceVersion, a cache
/// that did not catch up in time); the inner one is a start the history no longer holds
/// (410), which Kubernetes sends as the stream's only frame rather than as the response.
pub async fn start<T: Kind>(
    registry: &Registry,
    from: WatchFrom<'_>,
) -> Result<Result<Watcher, ApiError>, ApiError> {
    let cache = registry.caches.get(T::INFO);
    let rv = from.resource_version;
    match rv {
        None => wait_for_consistent(registry.store.as_ref(), cache).await?,
        Some("0") => {}
        Some(v) => wait_for_cache(cache, parse_resource_version(v)?).await?,
    }
    let start = watch_start(rv, from.send_initial_events, from.bookmarks, false)?;
    let req = WatchRequest {
        namespace: from.namespace,
        selector: from.selector,
        start,
        bookmarks: from.bookmarks,
        format: from.format,
    };
    match cache.watch(req, Instant::now()) {
        Ok(w) => Ok(Ok(w)),
        Err(e @ (ApiError::Expired(_) | ApiError::Gone(_))) => Ok(Err(e)),
        Err(e) => Err(e),
    }
}
