//! Typed lists from the watch caches: the resourceVersion × resourceVersionMatch ×
//! limit/continue rules of the spec, selectors, continue tokens that pin every page to one
//! revision, and the store's history when a cache no longer holds the revision asked for.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use svc_core::object::parse_resource_version;
use svc_core::registry::Kind;
use svc_core::watch::{CachedObject, ListRequest, ListResult, Selector, WatchCache};
use svc_core::{ApiError, ListMeta};
use svc_storage::{KeyRange, StoreError};

use crate::base::query::{ListOptions, RvMatch};
use crate::registry::caches::freshness::{wait_for_cache, wait_for_consistent};
use crate::registry::errors;
use crate::registry::state::Registry;

/// Rejects the combinations the spec's list table marks invalid (400).
pub fn validate(opts: &ListOptions) -> Result<(), ApiError> {
    let bad = |m: &str| Err(ApiError::bad_request(m.to_string()));
    let rv = opts.resource_version.as_deref();
    if opts.watch {
        match (opts.send_initial_events, opts.resource_version_match) {
            (Some(true), m) if m != Some(RvMatch::NotOlderThan) => {
                return bad(
                    "resourceVersionMatch: Forbidden: sendInitialEvents requires setting \
                            resourceVersionMatch to NotOlderThan",
                );
            }
            (None, Some(_)) => {
                return bad(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden \
                            for watch unless sendInitialEvents is provided",
                );
            }
            _ => {}
        }
    } else if opts.send_initial_events.is_some() {
        return bad("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list");
    }
    if let Some(m) = opts.resource_version_match {
        if rv.is_none() && !opts.watch {
            return bad(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden \
                        unless resourceVersion is provided",
            );
        }
        if opts.continue_token.is_some() {
            return bad(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when \
                        continue is provided",
            );
        }
        if m == RvMatch::Exact && rv == Some("0") {
            return bad(
                "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is \
                        forbidden for resourceVersion \"0\"",
            );
        }
    }
    if opts.continue_token.is_some() && rv.is_some_and(|v| v != "0") && !opts.watch {
        return bad("specifying resource version is not allowed when using continue");
    }
    Ok(())
}

/// A continue token of this server: the revision its pages are read at, where the next page
/// starts, and when the first was served.
#[derive(Debug, Serialize, Deserialize)]
pub struct ContinueToken {
    v: String,
    pub rv: i64,
    /// The last key returned so far, relative to the collection's key prefix.
    pub start: String,
    /// When the first page was served (Unix seconds), for the token's lifetime.
    pub t: i64,
}

const TOKEN_VERSION: &str = "meta.svc.io/v1";

/// How far in the future a token's issue time may lie (another gateway's clock running ahead).
const CONTINUE_CLOCK_SKEW_SECS: i64 = 60;

pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

pub fn encode_token(rv: i64, last_key: &[u8], issued: i64) -> String {
    let t = ContinueToken {
        v: TOKEN_VERSION.into(),
        rv,
        start: String::from_utf8_lossy(last_key).into_owned(),
        t: issued,
    };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&t).unwrap_or_default())
}

pub fn decode_token(token: &str, ttl: Duration) -> Result<ContinueToken, ApiError> {
    let invalid =
        || ApiError::bad_request("continue key is not valid: the token could not be decoded");
    let raw = URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| invalid())?;
    let t: ContinueToken = serde_json::from_slice(&raw).map_err(|_| invalid())?;
    // A token may only move forward inside its own collection.
    if t.v != TOKEN_VERSION || t.rv <= 0 || t.start.starts_with('/') || t.start.contains("..") {
        return Err(invalid());
    }
    // A token from the future was not written by a server (peers' clocks may differ a little);
    // left alone it would never expire.
    let now = unix_now();
    if t.t > now.saturating_add(CONTINUE_CLOCK_SKEW_SECS) {
        return Err(invalid());
    }
    if now.saturating_sub(t.t) > i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX) {
        return Err(expired_continue());
    }
    Ok(t)
}

pub fn expired_continue() -> ApiError {
    ApiError::Expired(
        "The provided continue parameter is too old to display a consistent list result. You \
         can start a new list without the continue parameter, or use the continue token in this \
         response to retrieve the remainder of the results. Continuing with the provided token \
         results in an inconsistent list - objects that were created, modified, or deleted \
         between the time the first chunk was returned and now may show up in the list."
            .into(),
    )
}

/// One page of a list, as read: from the cache, or from the store as a fallback.
struct Page {
    items: Vec<Arc<CachedObject>>,
    revision: i64,
    continue_after: Option<Bytes>,
    remaining: Option<usize>,
}

impl From<ListResult> for Page {
    fn from(r: ListResult) -> Self {
        Page {
            items: r.items,
            revision: r.revision,
            continue_after: r.continue_after,
            remaining: r.remaining,
        }
    }
}

/// A page of a list, read: the cache that holds the objects' encodings, the list's metadata
/// and the objects.
pub struct Listed<'r> {
    pub cache: &'r WatchCache,
    pub meta: ListMeta,
    pub items: Vec<Arc<CachedObject>>,
}

/// One page of a list of `T` in `namespace` (all namespaces when empty) by the options'
/// resourceVersion, match, limit and continue rules, with the list's metadata (revision,
/// continue token, remaining count).
pub async fn list<'r, T: Kind>(
    registry: &'r Registry,
    namespace: &str,
    opts: &ListOptions,
    selector: Selector,
) -> Result<Listed<'r>, ApiError> {
    let cache = registry.caches.get(T::INFO);
    let prefix = T::INFO.prefix(Some(namespace));
    let limit = opts.limit.map(|l| l as usize);

    // Which revision to read at (None: the cache's current state), and where to start.
    let ReadPoint {
        at,
        start_after,
        issued,
    } = read_point(registry, cache, &prefix, opts, limit).await?;

    let req = ListRequest {
        namespace: (!namespace.is_empty()).then_some(namespace),
        at,
        start_after: start_after.as_deref(),
        limit,
        selector: &selector,
    };
    let page = match at {
        None => Page::from(cache.list(&req)?),
        Some(revision) => {
            // Without `ListFromCacheSnapshot` the caches keep no past states, so a list at a
            // revision (Exact, continue) reads the store's history; with it, only when the
            // revision is older than the cache's snapshots.
            let cached = if registry.lists_from_snapshots {
                match cache.list(&req) {
                    Ok(r) => Some(Page::from(r)),
                    Err(ApiError::Expired(_)) => None,
                    Err(e) => return Err(e),
                }
            } else {
                None
            };
            match cached {
                Some(page) => page,
                None => list_from_store(
                    registry,
                    cache,
                    &prefix,
                    revision,
                    start_after,
                    limit,
                    &selector,
                )
                .await
                .map_err(|e| match e {
                    ApiError::Expired(_) if opts.continue_token.is_some() => expired_continue(),
                    other => other,
                })?,
            }
        }
    };

    let meta = page_meta(
        page.revision,
        page.continue_after.as_deref(),
        page.remaining,
        &prefix,
        &selector,
        issued,
    );
    Ok(Listed {
        cache,
        meta,
        items: page.items,
    })
}

/// Whether a list at a resourceVersion (not `0`) reads at exactly that revision: asked with
/// `Exact`, or (the legacy rule) with a `limit` and no match.
pub fn reads_exactly(opts: &ListOptions, limit: Option<usize>) -> bool {
    opts.resource_version_match == Some(RvMatch::Exact)
        || (opts.resource_version_match.is_none() && limit.is_some())
}

/// The metadata of a page read at `revision` from the collection at `prefix`: a continue
/// token when more follows `continue_after` (issued when the first page was), and the count
/// of what remains when no selector filters it, as Kubernetes gives it.
pub fn page_meta(
    revision: i64,
    continue_after: Option<&[u8]>,
    remaining: Option<usize>,
    prefix: &[u8],
    selector: &Selector,
    issued: i64,
) -> ListMeta {
    let mut meta = ListMeta {
        resource_version: revision.to_string(),
        ..Default::default()
    };
    if let Some(last) = continue_after {
        meta.continue_ = encode_token(
            revision,
            last.get(prefix.len()..).unwrap_or_default(),
            issued,
        );
        if selector.is_empty() {
            meta.remaining_item_count = remaining.map(|r| r as i64);
        }
    }
    meta
}

/// Where a list reads: at a revision (None: the cache's current state), after a key (a
/// continue token's), and when its first page was served (a token's lifetime runs from it).
pub struct ReadPoint {
    pub at: Option<i64>,
    pub start_after: Option<Vec<u8>>,
    pub issued: i64,
}

impl ReadPoint {
    /// A continue token's next page, in both modes: at the token's revision, after its last
    /// key under the collection's `prefix`, issued when its first page was.
    pub fn after_token(t: &ContinueToken, prefix: &[u8]) -> Self {
        let mut start = prefix.to_vec();
        start.extend_from_slice(t.start.as_bytes());
        ReadPoint {
            at: Some(t.rv),
            start_after: Some(start),
            issued: t.t,
        }
    }
}

/// The read point of a list by its continue token or resourceVersion rules, once the cache
/// has caught up with it.
async fn read_point(
    registry: &Registry,
    cache: &WatchCache,
    prefix: &[u8],
    opts: &ListOptions,
    limit: Option<usize>,
) -> Result<ReadPoint, ApiError> {
    if let Some(token) = &opts.continue_token {
        let t = decode_token(token, registry.continue_token_ttl)?;
        if t.rv > cache.revision() {
            // Past this cache: another gateway's token while this cache catches up (wait), or
            // past the store itself, which no server could have written.
            let current = registry
                .store
                .current_revision()
                .await
                .map_err(errors::store_error)?;
            if t.rv > current {
                return Err(ApiError::bad_request(
                    "continue key is not valid: its resource version is in the future",
                ));
            }
            wait_for_cache(cache, t.rv).await?;
        }
        return Ok(ReadPoint::after_token(&t, prefix));
    }
    let at = match opts.resource_version.as_deref() {
        None => {
            wait_for_consistent(registry.store.as_ref(), cache).await?;
            None
        }
        Some("0") => None,
        Some(rv) => {
            let rv = parse_resource_version(rv)?;
            let exact = reads_exactly(opts, limit);
            wait_for_cache(cache, rv).await?;
            exact.then_some(rv)
        }
    };
    Ok(ReadPoint {
        at,
        start_after: None,
        issued: unix_now(),
    })
}

/// A list at an exact revision the cache no longer holds, read from the store's history
/// (410 once the store has compacted it too).
async fn list_from_store(
    registry: &Registry,
    cache: &WatchCache,
    prefix: &[u8],
    revision: i64,
    start_after: Option<Vec<u8>>,
    limit: Option<usize>,
    selector: &Selector,
) -> Result<Page, ApiError> {
    let ingest = cache.codec().ingest;
    let end = KeyRange::prefix(prefix.to_vec()).end;
    let start = match start_after {
        Some(mut k) => {
            k.push(0);
            k
        }
        None => prefix.to_vec(),
    };
    let mut range = KeyRange {
        start: Bytes::from(start),
        end: end.clone(),
    };
    let mut items = Vec::new();
    let mut continue_after = None;
    let page_size = limit.map(|l| l.max(64)).unwrap_or(0);
    'pages: loop {
        let res = registry
            .store
            .range(range.clone(), Some(revision), page_size)
            .await
            .map_err(|e| match e {
                StoreError::Compacted {
                    requested,
                    compacted,
                } => ApiError::Expired(format!(
                    "too old resource version: {requested} ({compacted})"
                )),
                other => errors::store_error(other),
            })?;
        for (i, kv) in res.kvs.iter().enumerate() {
            let obj = Arc::new(ingest(kv)?);
            if selector.matches(&obj) {
                items.push(obj);
            }
            if limit.is_some_and(|l| items.len() >= l) {
                if i.saturating_add(1) < res.kvs.len() || res.more {
                    continue_after = Some(kv.key.clone());
                }
                break 'pages;
            }
        }
        match (res.more, res.kvs.last()) {
            (true, Some(last)) => {
                let mut k = last.key.to_vec();
                k.push(0);
                range.start = Bytes::from(k);
            }
            _ => break,
        }
    }
    let remaining = match &continue_after {
        Some(last) if selector.is_empty() => {
            let mut k = last.to_vec();
            k.push(0);
            let rest = KeyRange {
                start: Bytes::from(k),
                end,
            };
            let r = registry
                .store
                .range(rest, Some(revision), 0)
                .await
                .map_err(errors::store_error)?;
            Some(r.kvs.len())
        }
        _ => None,
    };
    Ok(Page {
        items,
        revision,
        continue_after,
        remaining,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::query::Query;

    fn opts(q: &str) -> ListOptions {
        ListOptions::from_query(&Query::parse(Some(q))).unwrap()
    }

    #[test]
    fn invalid_combinations_are_rejected() {
        for q in [
            "resourceVersionMatch=Exact",
            "resourceVersionMatch=NotOlderThan",
            "resourceVersion=0&resourceVersionMatch=Exact",
            "resourceVersion=5&limit=2&continue=abc",
            "resourceVersion=5&resourceVersionMatch=Exact&continue=abc",
            "sendInitialEvents=true",
            "watch=1&sendInitialEvents=true",
            "watch=1&resourceVersion=1&resourceVersionMatch=Exact",
        ] {
            assert_eq!(validate(&opts(q)).unwrap_err().code(), 400, "{q}");
        }
        for q in [
            "",
            "resourceVersion=0",
            "resourceVersion=0&resourceVersionMatch=NotOlderThan",
            "resourceVersion=7&resourceVersionMatch=Exact&limit=5",
            "limit=2&continue=abc",
            "resourceVersion=0&limit=2&continue=abc",
            "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        ] {
            assert!(validate(&opts(q)).is_ok(), "{q}");
        }
    }

    #[test]
    fn tokens_round_trip_and_reject_tampering() {
        let ttl = Duration::from_secs(300);
        let t = encode_token(42, b"ns/name", unix_now());
        let d = decode_token(&t, ttl).unwrap();
        assert_eq!((d.rv, d.start.as_str()), (42, "ns/name"));
        assert!(decode_token("not-a-token", ttl).is_err());
        let old = encode_token(42, b"ns/name", unix_now() - 301);
        assert_eq!(decode_token(&old, ttl).unwrap_err().code(), 410);
        let escape =
            URL_SAFE_NO_PAD.encode(br#"{"v":"meta.svc.io/v1","rv":3,"start":"/registry/x","t":0}"#);
        assert!(decode_token(&escape, ttl).is_err());
        // Issued in the future (past the clock skew allowed): it would never expire.
        let future = encode_token(42, b"ns/name", unix_now() + 3600);
        assert_eq!(decode_token(&future, ttl).unwrap_err().code(), 400);
        let skewed = encode_token(42, b"ns/name", unix_now() + 10);
        assert!(decode_token(&skewed, ttl).is_ok());
        let far = encode_token(42, b"ns/name", i64::MAX);
        assert_eq!(decode_token(&far, ttl).unwrap_err().code(), 400);
        let ancient = encode_token(42, b"ns/name", i64::MIN);
        assert_eq!(decode_token(&ancient, ttl).unwrap_err().code(), 410);
    }
}
