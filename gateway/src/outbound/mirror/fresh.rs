//! Proof that a cache is as fresh as the upstream, for the reads that must start from the
//! upstream's newest state (a watch with `sendInitialEvents=true` and no resourceVersion: how
//! client-go's informers start, kubelets' single-object informers of ConfigMaps among them).
//! The upstream offers no progress request, so the proof is asked of it in two steps, each
//! served by its watch cache:
//!
//! 1. A streaming list with no resourceVersion and a field selector no object matches: the
//!    upstream answers only once its own cache has caught up with etcd, and its
//!    `initial-events-end` bookmark names that revision, R. Each read waits for a first step
//!    begun after it arrived; reads arriving meanwhile share the next one.
//! 2. When this cache is behind R: a short watch from this cache's revision, every event
//!    after it in order, then a bookmark (kube-apiserver sends one two seconds before a
//!    watch's deadline, one to two seconds in) at its cache's revision. The events and the
//!    bookmark are applied to this cache as the informer's own are (the cache skips what it
//!    already has). One such watch runs at a time per resource ([`Freshness`]'s pusher) for
//!    every read waiting: a bookmark is at a revision the upstream reached after it answered
//!    every first step begun before it, so it releases them all, and a read is released as
//!    soon as the cache reaches its own R, whichever watch brought it there.
//!
//! A burst of informers starting at once costs the upstream a few small requests, not a list
//! each; two informers of one resource started together (a kubelet mounting a ConfigMap and
//! the `kube-root-ca.crt` ConfigMap) wait for one bookmark, not one each.
//!
//! A read of one object (its name as the field selector: a kubelet's ConfigMap and Secret
//! informers) is proven for that object alone ([`prove_object`]): one small upstream read of
//! it, answered at once, and no wait for a bookmark.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use svc_core::ResourceInfo;
use svc_core::watch::WatchCache;
use svc_storage::{FeedItem, Revision};
use tokio::sync::oneshot;

use super::informer::{
    Bookmark, Line, Taken, collection_path, flush, lines, namespaced_path, open, parse_rv,
    take_line,
};
use crate::base::deadline::Deadline as _;
use crate::outbound::upstream::Upstream;
use svc_core::watch::unstructured::ObjectHead;

/// The longest a proof may take (its second step's watch lasts 3 s; the bookmark comes
/// after one to two).
pub const PROOF_TIMEOUT: Duration = Duration::from_secs(6);
/// The second step's watch: kube-apiserver bookmarks a watch two seconds before its end (and
/// not at all when that is already past as the watch starts).
const SHORT_WATCH_SECONDS: u32 = 3;
/// A name no object has (names are DNS subdomains, which have no upper case).
const NO_SUCH_NAME: &str = "SVC-PROXY-FRESHNESS-PROBE";

type Waiter = oneshot::Sender<Result<Revision, String>>;

/// The proofs of one resource: the reads waiting for a first step, and the revision the
/// second step's pusher is to bring the cache to.
#[derive(Default)]
pub struct Freshness {
    /// Reads waiting for the upstream's newest revision, and whether a first step runs.
    newest: Mutex<(Vec<Waiter>, bool)>,
    /// The pusher's state.
    push: Arc<Mutex<Push>>,
    /// Notified when the pusher gives up, so that the reads waiting pass through at once.
    failed: Arc<tokio::sync::Notify>,
}

/// What the pusher is to do.
#[derive(Default)]
struct Push {
    /// The highest revision a read has waited for.
    target: Revision,
    /// Reads waiting now: the pusher stops when none is left.
    waiting: usize,
    /// Whether a pusher runs.
    running: bool,
}

/// A read's place among the pusher's waiters, given back when it stops waiting.
struct Waiting(Arc<Mutex<Push>>);

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.waiting = s.waiting.saturating_sub(1);
    }
}

impl Freshness {
    /// Waits until the cache is proven at least as fresh as the upstream was when this was
    /// called; an error (the upstream cannot give the proof) sends the read upstream.
    /// `bookmarks`: the upstream has been seen to bookmark this resource, so a short watch
    /// that ended without a bookmark was late, not refused, and another is tried.
    pub async fn prove(
        &self,
        upstream: &Upstream,
        info: &'static ResourceInfo,
        cache: &WatchCache,
        bookmarks: bool,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now().later(PROOF_TIMEOUT);
        let newest = tokio::time::timeout_at(deadline, self.newest(upstream, info))
            .await
            .unwrap_or_else(|_| Err(format!("no proof within {PROOF_TIMEOUT:?}")))?;
        if cache.revision() >= newest {
            return Ok(());
        }
        // Told when the pusher gives up (an upstream that does not bookmark this resource).
        let failed = self.failed.notified();
        tokio::pin!(failed);
        failed.as_mut().enable();
        let _waiting = self.push_to(newest, upstream, info, cache, bookmarks);
        let reached = async {
            tokio::select! {
                r = cache.wait_for_revision(newest) => r.map_err(|e| e.to_string()),
                _ = failed => Err("the upstream's watch brought no bookmark".to_string()),
            }
        };
        match tokio::time::timeout_at(deadline, reached).await {
            Ok(r) => r,
            Err(_) => {
                let e = format!(
                    "the cache reached {} and not {newest} within {PROOF_TIMEOUT:?}",
                    cache.revision()
                );
                tracing::debug!(resource = info.plural, error = %e, "freshness not proven");
                Err(e)
            }
        }
    }

    /// The upstream's newest revision, from a first step begun after this was called.
    async fn newest(
        &self,
        upstream: &Upstream,
        info: &'static ResourceInfo,
    ) -> Result<Revision, String> {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut s = self.newest.lock();
            s.0.push(tx);
            !std::mem::replace(&mut s.1, true)
        };
        if lead {
            // This read asks, round after round, while reads keep arriving.
            loop {
                let waiting = {
                    let mut s = self.newest.lock();
                    if s.0.is_empty() {
                        s.1 = false;
                        break;
                    }
                    std::mem::take(&mut s.0)
                };
                let r = upstream_newest(upstream, info).await;
                if let Err(e) = &r {
                    tracing::debug!(resource = info.plural, error = %e, "upstream revision not read");
                }
                for w in waiting {
                    let _ = w.send(r.clone());
                }
            }
        }
        rx.await
            .unwrap_or_else(|_| Err("the proof was abandoned".into()))
    }

    /// Has the pusher bring the cache to `target` at least, starting it when none runs; the
    /// read waits while it holds the answer.
    fn push_to(
        &self,
        target: Revision,
        upstream: &Upstream,
        info: &'static ResourceInfo,
        cache: &WatchCache,
        bookmarks: bool,
    ) -> Waiting {
        let start = {
            let mut s = self.push.lock();
            s.target = s.target.max(target);
            s.waiting = s.waiting.saturating_add(1);
            !std::mem::replace(&mut s.running, true)
        };
        if start {
            tokio::spawn(push(
                self.push.clone(),
                self.failed.clone(),
                upstream.clone(),
                info,
                cache.clone(),
                bookmarks,
            ));
        }
        Waiting(self.push.clone())
    }
}

/// The pusher: short watches from the cache's revision until the cache has reached every
/// revision asked for, or one fails (the reads waiting then pass through). A short watch that
/// ended without a bookmark fails the proof, unless the resource is known to bookmark
/// (`bookmarks`) and the watch ran its course: kube-apiserver bookmarks a watch two seconds
/// before its end, and a busy one may send it late, so another is tried while reads wait.
async fn push(
    state: Arc<Mutex<Push>>,
    failed: Arc<tokio::sync::Notify>,
    upstream: Upstream,
    info: &'static ResourceInfo,
    cache: WatchCache,
    bookmarks: bool,
) {
    loop {
        {
            let mut s = state.lock();
            if s.waiting == 0 || cache.revision() >= s.target {
                s.running = false;
                return;
            }
        }
        let started = Instant::now();
        match catch_up(&upstream, info, &cache, &state).await {
            Ok(CaughtUp::Reached) => {}
            Ok(CaughtUp::NoBookmark(e))
                if bookmarks && started.elapsed() >= Duration::from_secs(1) =>
            {
                tracing::debug!(resource = info.plural, error = %e, "freshness: trying again");
            }
            Ok(CaughtUp::NoBookmark(e)) | Err(e) => {
                tracing::debug!(resource = info.plural, error = %e, "freshness not proven");
                state.lock().running = false;
                failed.notify_waiters();
                return;
            }
        }
    }
}

/// How long a cache may take to hold an object as the upstream's proof of it has it (the
/// informer's own watch brings the change; it is usually there already).
pub const OBJECT_CATCH_UP: Duration = Duration::from_secs(1);

/// Proof for a read of one object (a consistent start whose field selector names it: a
/// kubelet's ConfigMap and Secret informers): the upstream's newest state of that object alone
/// (a streaming list from the newest state with its name as the field selector, answered at
/// once), and the cache holding it at the same resourceVersion (or both without it). The
/// object is then the same in the cache as upstream at the upstream's newest revision, and
/// whatever changes it later reaches the cache by its informer's watch: the read may start
/// from the cache. Costs the upstream one small read, and the read no wait for a bookmark.
pub async fn prove_object(
    upstream: &Upstream,
    info: &'static ResourceInfo,
    cache: &WatchCache,
    namespace: &str,
    name: &str,
) -> Result<(), String> {
    let read = upstream_object(upstream, info, namespace, name);
    let (upstream_rv, newest) = tokio::time::timeout(PROOF_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| Err(format!("no proof within {PROOF_TIMEOUT:?}")))?;
    let key = info.key(namespace, name);
    let deadline = Instant::now().later(OBJECT_CATCH_UP);
    loop {
        let (held, _) = cache.get(&key).map_err(|e| e.to_string())?;
        let held = held.map(|o| o.resource_version);
        match (held, upstream_rv) {
            (None, None) => return Ok(()),
            (Some(c), Some(u)) if c >= u => return Ok(()),
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the cache holds {key:?} at {held:?}, the upstream at {upstream_rv:?} \
                 (revision {newest})",
                key = String::from_utf8_lossy(&key)
            ));
        }
        // The change is on its way by the informer's watch.
        let next = cache.revision().saturating_add(1);
        let _ =
            tokio::time::timeout(Duration::from_millis(20), cache.wait_for_revision(next)).await;
    }
}

/// The upstream's newest state of one object: its resourceVersion (None when there is no
/// such object), and the revision of the read.
async fn upstream_object(
    upstream: &Upstream,
    info: &'static ResourceInfo,
    namespace: &str,
    name: &str,
) -> Result<(Option<Revision>, Revision), String> {
    let path = if namespace.is_empty() {
        collection_path(info)
    } else {
        namespaced_path(info, namespace)
    };
    let selector: String =
        form_urlencoded::byte_serialize(format!("metadata.name={name}").as_bytes()).collect();
    let url = format!(
        "{path}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan\
         &allowWatchBookmarks=true&fieldSelector={selector}&timeoutSeconds=10"
    );
    let body = open(upstream, &url).await?;
    let mut found = None;
    let newest = lines(body, |line| {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let l: Line<'_> = serde_json::from_slice(line).map_err(|e| e.to_string())?;
        match &*l.ty {
            "ADDED" => {
                let head: ObjectHead<'_> =
                    serde_json::from_str(l.object.get()).map_err(|e| e.to_string())?;
                found = Some(parse_rv(&head.metadata.resource_version)?);
                Ok(None)
            }
            "BOOKMARK" => Bookmark::initial_events_end(l.object.get().as_bytes()),
            other => Err(format!("{other} before the initial events ended")),
        }
    })
    .await?
    .ok_or_else(|| {
        "the streaming list ended without its initial-events-end bookmark".to_string()
    })?;
    Ok((found, newest))
}

/// The first step: the upstream's newest revision, once its cache has it (a streaming list
/// of an object no one has).
async fn upstream_newest(
    upstream: &Upstream,
    info: &'static ResourceInfo,
) -> Result<Revision, String> {
    let (_, newest) = upstream_object(upstream, info, "", NO_SUCH_NAME).await?;
    Ok(newest)
}

/// The second step: one short watch from the cache's revision, its events and bookmark
/// applied to the cache, read until the cache has reached the revision asked for (which
/// reads arriving meanwhile may raise) or the watch ends.
async fn catch_up(
    upstream: &Upstream,
    info: &'static ResourceInfo,
    cache: &WatchCache,
    state: &Mutex<Push>,
) -> Result<CaughtUp, String> {
    let path = collection_path(info);
    let from = cache.revision();
    let url = format!(
        "{path}?watch=1&allowWatchBookmarks=true&resourceVersion={from}\
         &timeoutSeconds={SHORT_WATCH_SECONDS}"
    );
    let body = open(upstream, &url).await?;
    let mut bookmarked = false;
    let reached = lines(body, |line| {
        let mut events = Vec::new();
        let taken = take_line(info, line, &mut events).map_err(|e| e.to_string())?;
        flush(cache, &mut events, info);
        if let Taken::Bookmark(rev) = taken {
            bookmarked = true;
            cache.apply(FeedItem::Progress(rev), Instant::now());
        }
        Ok((cache.revision() >= state.lock().target).then_some(()))
    })
    .await?;
    Ok(match (reached, bookmarked) {
        (Some(()), _) | (None, true) => CaughtUp::Reached,
        (None, false) => CaughtUp::NoBookmark(format!(
            "the upstream's watch from {from} ended without a bookmark (at {})",
            cache.revision()
        )),
    })
}

/// How a short watch of [`catch_up`] ended.
enum CaughtUp {
    /// At the revision asked for, or with a bookmark (the pusher looks again).
    Reached,
    /// With neither: why.
    NoBookmark(String),
}
