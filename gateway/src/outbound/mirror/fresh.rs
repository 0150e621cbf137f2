//! Proof that a cache is as fresh as the upstream, for the reads that must start from the
//! upstream's newest state (a watch with `sendInitialEvents=true` and no resourceVersion: how
//! client-go's informers start). The upstream offers no progress request, so the proof is
//! asked of it in two steps, each served by its watch cache:
//!
//! 1. A streaming list with no resourceVersion and a field selector no object matches: the
//!    upstream answers only once its own cache has caught up with etcd, and its
//!    `initial-events-end` bookmark names that revision, R.
//! 2. A short watch from this cache's revision: every event after it, in order, then a
//!    bookmark (kube-apiserver sends one two seconds before a watch's deadline) at its
//!    cache's revision, now at least R. The events and the bookmark are applied to this
//!    cache as the informer's own are (the cache skips what it already has).
//!
//! Reads waiting meanwhile share one proof ([`Freshness`]): a burst of informers starting at
//! once costs the upstream two small requests, not a list each. A read that arrives after a
//! proof's first step waits for the next one, so each is proven against a revision taken
//! after it arrived.

use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use svc_core::ResourceInfo;
use svc_core::watch::WatchCache;
use svc_storage::FeedItem;
use tokio::sync::oneshot;

use super::informer::{Bookmark, Line, Taken, collection_path, flush, lines, take_line};
use crate::outbound::client;
use crate::outbound::upstream::Upstream;

/// The longest a proof may take (its second step's watch lasts 3 s; the bookmark comes
/// after about one).
pub const PROOF_TIMEOUT: Duration = Duration::from_secs(6);
/// The second step's watch: kube-apiserver bookmarks a watch two seconds before its end.
const SHORT_WATCH_SECONDS: u32 = 3;
/// A name no object has (names are DNS subdomains, which have no upper case).
const NO_SUCH_NAME: &str = "SVC-PROXY-FRESHNESS-PROBE";

type Waiter = oneshot::Sender<Result<(), String>>;

/// The reads of one resource waiting for a proof, and whether one is under way.
#[derive(Default)]
pub struct Freshness {
    state: Mutex<(Vec<Waiter>, bool)>,
}

impl Freshness {
    /// Waits until the cache is proven at least as fresh as the upstream was when this was
    /// called; an error (the upstream cannot give the proof) sends the read upstream.
    pub async fn prove(
        &self,
        upstream: &Upstream,
        info: &'static ResourceInfo,
        cache: &WatchCache,
    ) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut s = self.state.lock();
            s.0.push(tx);
            !std::mem::replace(&mut s.1, true)
        };
        if lead {
            // This read runs the proofs, round after round, while reads keep arriving.
            loop {
                let waiting = {
                    let mut s = self.state.lock();
                    if s.0.is_empty() {
                        s.1 = false;
                        break;
                    }
                    std::mem::take(&mut s.0)
                };
                let r = tokio::time::timeout(PROOF_TIMEOUT, proof(upstream, info, cache))
                    .await
                    .unwrap_or_else(|_| Err(format!("no proof within {PROOF_TIMEOUT:?}")));
                if let Err(e) = &r {
                    tracing::debug!(resource = info.plural, error = %e, "freshness not proven");
                }
                for w in waiting {
                    let _ = w.send(r.clone());
                }
            }
        }
        rx.await
            .unwrap_or_else(|_| Err("the proof was abandoned".into()))
    }
}

async fn open(upstream: &Upstream, url: &str) -> Result<hyper::body::Incoming, String> {
    let request = http::Request::get(url)
        .header(http::header::ACCEPT, "application/json")
        .body(client::buffered(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let response = upstream.send(request).await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("{url} answered {}", response.status()));
    }
    Ok(response.into_body())
}

async fn proof(
    upstream: &Upstream,
    info: &'static ResourceInfo,
    cache: &WatchCache,
) -> Result<(), String> {
    let path = collection_path(info);
    // 1. The upstream's newest revision, once its cache has it.
    let url = format!(
        "{path}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan\
         &allowWatchBookmarks=true&fieldSelector=metadata.name%3D{NO_SUCH_NAME}&timeoutSeconds=10"
    );
    let body = open(upstream, &url).await?;
    let newest = lines(body, |line| {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let l: Line<'_> = serde_json::from_slice(line).map_err(|e| e.to_string())?;
        if l.ty != "BOOKMARK" {
            return Err(format!("{} before the initial events ended", l.ty));
        }
        Bookmark::initial_events_end(l.object.get().as_bytes())
    })
    .await?
    .ok_or("the streaming list ended without its initial-events-end bookmark")?;
    if cache.revision() >= newest {
        return Ok(());
    }
    // 2. Everything after this cache's revision, up to a bookmark at `newest` or later.
    let from = cache.revision();
    let url = format!(
        "{path}?watch=1&allowWatchBookmarks=true&resourceVersion={from}\
         &timeoutSeconds={SHORT_WATCH_SECONDS}"
    );
    let body = open(upstream, &url).await?;
    let reached = lines(body, |line| {
        let mut events = Vec::new();
        let taken = take_line(info, line, &mut events).map_err(|e| e.to_string())?;
        flush(cache, &mut events, info);
        if let Taken::Bookmark(rev) = taken {
            cache.apply(FeedItem::Progress(rev), Instant::now());
        }
        Ok((cache.revision() >= newest).then_some(()))
    })
    .await?;
    reached.ok_or_else(|| {
        format!(
            "the upstream's watch from {from} ended before revision {newest} (at {})",
            cache.revision()
        )
    })
}
