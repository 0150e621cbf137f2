//! Proof that a cache is as fresh as the upstream, for the reads that must start from the
//! upstream's newest state (a watch with `sendInitialEvents=true` and no resourceVersion: how
//! client-go's informers start, kubelets' single-object informers of ConfigMaps among them).
//! The upstream offers no progress request, so the proof is asked of it in two steps, each
//! served by its watch cache:
//!
//! 1. A streaming list with no resourceVersion and a field selector no object matches: the
//!    upstream answers only once its own cache has caught up with etcd, and its
//!    `initial-events-end` bookmark names that revision, R. Each read waits for a first step
//!    begun after it arrived; reads arriving meanwhile share the next one, begun at least
//!    [`STEP_GAP`] after the one before it, so that a storm's reads share a few steps.
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
//!
//! A proof that is not given says why ([`Unproven`]). An upstream that cannot give it (it
//! refuses the first step, or sends no bookmarks for the resource) has the read passed
//! through. An upstream too slow or too busy to give it in time has the read answered 429
//! with a `Retry-After`, as kube-apiserver's own priority and fairness does: client-go
//! retries after it, and its reflector backs off. Passing those reads through would send a
//! streaming list each to the upstream that is already behind, all at once: the proxy
//! would turn its slowness into a collapse. The first steps run apart from the reads that
//! wait on them, so one read giving up never leaves the others without a step.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use svc_core::ResourceInfo;
use svc_core::watch::WatchCache;
use svc_storage::{FeedItem, Revision};
use tokio::sync::oneshot;

use crate::base::deadline::Deadline as _;
use crate::outbound::upstream::Upstream;
use crate::outbound::upstream::watch::{
    Bookmark, Line, NotOpened, Taken, WatchBody, collection_path, lines, namespaced_path, open,
    parse_rv, take_line,
};
use crate::registry::caches::reflector;
use svc_core::watch::unstructured::ObjectHead;

/// The longest a read waits for its proof: room for a first step begun before it arrived
/// to end and one of its own to be answered by an upstream slow to catch up (kube-apiserver
/// under load takes seconds), and for the short watches of the second step. A client
/// starting directly would wait as long; one told to try again would wait longer.
pub const PROOF_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the upstream may take to answer a first step (`timeoutSeconds` of its
/// streaming list; a step is abandoned here a little later).
const PROBE_SECONDS: u64 = 12;
/// The least time between the starts of two first steps of one resource: a read arriving
/// while a step runs waits up to this much longer, and a relist storm of a few seconds
/// costs the upstream about five steps a second instead of one per round trip (33 in a
/// storm of 2.3 s).
pub const STEP_GAP: Duration = Duration::from_millis(200);
/// How long a read told the upstream is busy waits before trying again.
pub const RETRY_AFTER_SECONDS: i32 = 1;
/// The second step's watch: kube-apiserver bookmarks a watch two seconds before its end (and
/// not at all when that is already past as the watch starts).
const SHORT_WATCH_SECONDS: u32 = 3;
/// A name no object has (names are DNS subdomains, which have no upper case).
const NO_SUCH_NAME: &str = "SVC-PROXY-FRESHNESS-PROBE";

/// Why a proof was not given, which decides what becomes of the read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unproven {
    /// The upstream did not answer in time, or answered that it is overloaded (429, 503,
    /// 504, or no answer at all): the read is told to try again later.
    Busy(String),
    /// The upstream cannot give this proof (it refuses the first step, or sends no bookmarks
    /// for the resource): the read passes through.
    Refused(String),
}

impl std::fmt::Display for Unproven {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Busy(e) => write!(f, "the upstream is busy: {e}"),
            Self::Refused(e) => write!(f, "the upstream cannot prove it: {e}"),
        }
    }
}

/// Proofs of freshness asked for, those the upstream could not give (their reads passed
/// through), and those it was too busy to give in time (their reads were told to try again).
#[derive(Debug, Default)]
pub struct ProofCounts {
    pub asked: AtomicU64,
    pub refused: AtomicU64,
    pub busy: AtomicU64,
}

impl ProofCounts {
    /// Counts a proof and how it ended.
    pub fn count(&self, outcome: &Result<(), Unproven>) {
        self.asked.fetch_add(1, Ordering::Relaxed);
        let failed = match outcome {
            Ok(()) => return,
            Err(Unproven::Refused(_)) => &self.refused,
            Err(Unproven::Busy(_)) => &self.busy,
        };
        failed.fetch_add(1, Ordering::Relaxed);
    }
}

type Waiter = oneshot::Sender<Result<Revision, Unproven>>;

/// The proofs of one resource: the reads waiting for a first step, and the revision the
/// second step's pusher is to bring the cache to.
#[derive(Default)]
pub struct Freshness {
    /// Reads waiting for the upstream's newest revision, and whether a task runs first
    /// steps for them.
    newest: Arc<Mutex<(Vec<Waiter>, bool)>>,
    /// The pusher's state.
    push: Arc<Mutex<Push>>,
    /// Notified when the pusher gives up, so that the reads waiting stop at once.
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
    /// Why the last pusher gave up, for the reads it leaves.
    gave_up: Option<Unproven>,
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
    /// called, or says why it cannot be ([`Unproven`]).
    /// `bookmarks`: the upstream has been seen to bookmark this resource, so a short watch
    /// that ended without a bookmark was late, not refused, and another is tried.
    pub async fn prove(
        &self,
        upstream: &Upstream,
        info: &'static ResourceInfo,
        cache: &WatchCache,
        bookmarks: bool,
    ) -> Result<(), Unproven> {
        let deadline = tokio::time::Instant::now().later(PROOF_TIMEOUT);
        let newest = tokio::time::timeout_at(deadline, self.newest(upstream, info))
            .await
            .unwrap_or_else(|_| {
                Err(Unproven::Busy(format!(
                    "no revision from the upstream within {PROOF_TIMEOUT:?}"
                )))
            })?;
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
                r = cache.wait_for_revision(newest) => {
                    r.map_err(|e| Unproven::Refused(e.to_string()))
                }
                _ = failed => Err(self.push.lock().gave_up.clone().unwrap_or_else(|| {
                    Unproven::Refused("the upstream's watch brought no bookmark".into())
                })),
            }
        };
        match tokio::time::timeout_at(deadline, reached).await {
            Ok(r) => r,
            Err(_) => {
                let e = Unproven::Busy(format!(
                    "the cache reached {} and not {newest} within {PROOF_TIMEOUT:?}",
                    cache.revision()
                ));
                tracing::debug!(resource = info.plural, error = %e, "freshness not proven");
                Err(e)
            }
        }
    }

    /// The upstream's newest revision, from a first step begun after this was called. The
    /// steps run in a task of their own while reads wait, one at a time: a read that stops
    /// waiting stops no step.
    async fn newest(
        &self,
        upstream: &Upstream,
        info: &'static ResourceInfo,
    ) -> Result<Revision, Unproven> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut s = self.newest.lock();
            s.0.retain(|w| !w.is_closed());
            s.0.push(tx);
            !std::mem::replace(&mut s.1, true)
        };
        if start {
            tokio::spawn(first_steps(self.newest.clone(), upstream.clone(), info));
        }
        rx.await
            .unwrap_or_else(|_| Err(Unproven::Busy("the proof was abandoned".into())))
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
            if !s.running {
                s.gave_up = None;
            }
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

/// First steps, round after round, while reads wait for one: each round answers the reads
/// that were waiting when it began.
async fn first_steps(
    state: Arc<Mutex<(Vec<Waiter>, bool)>>,
    upstream: Upstream,
    info: &'static ResourceInfo,
) {
    let mut last_start: Option<tokio::time::Instant> = None;
    loop {
        if let Some(at) = last_start {
            // Reads that arrive meanwhile join this step.
            tokio::time::sleep_until(at.later(STEP_GAP)).await;
        }
        let waiting = {
            let mut s = state.lock();
            s.0.retain(|w| !w.is_closed());
            if s.0.is_empty() {
                s.1 = false;
                return;
            }
            std::mem::take(&mut s.0)
        };
        last_start = Some(tokio::time::Instant::now());
        let bound = Duration::from_secs(PROBE_SECONDS + 2);
        let r = tokio::time::timeout(bound, upstream_newest(&upstream, info))
            .await
            .unwrap_or_else(|_| {
                Err(Unproven::Busy(format!(
                    "no revision from the upstream within {bound:?}"
                )))
            });
        if let Err(e) = &r {
            tracing::debug!(resource = info.plural, error = %e, "upstream revision not read");
        }
        for w in waiting {
            let _ = w.send(r.clone());
        }
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
        let e = match catch_up(&upstream, info, &cache, &state).await {
            Ok(CaughtUp::Reached) => continue,
            Ok(CaughtUp::NoBookmark(e))
                if bookmarks && started.elapsed() >= Duration::from_secs(1) =>
            {
                tracing::debug!(resource = info.plural, error = %e, "freshness: trying again");
                continue;
            }
            Ok(CaughtUp::NoBookmark(e)) => Unproven::Refused(e),
            Err(e) => e,
        };
        tracing::debug!(resource = info.plural, error = %e, "freshness not proven");
        {
            let mut s = state.lock();
            s.running = false;
            s.gave_up = Some(e);
        }
        failed.notify_waiters();
        return;
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
) -> Result<(), Unproven> {
    let read = upstream_object(upstream, info, namespace, name, PROBE_SECONDS);
    let (upstream_rv, newest) = tokio::time::timeout(PROOF_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| {
            Err(Unproven::Busy(format!(
                "no answer from the upstream within {PROOF_TIMEOUT:?}"
            )))
        })?;
    let key = info.key(namespace, name);
    let deadline = Instant::now().later(OBJECT_CATCH_UP);
    loop {
        let (held, _) = cache
            .get(&key)
            .map_err(|e| Unproven::Refused(e.to_string()))?;
        let held = held.map(|o| o.resource_version);
        match (held, upstream_rv) {
            (None, None) => return Ok(()),
            (Some(c), Some(u)) if c >= u => return Ok(()),
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(Unproven::Busy(format!(
                "the cache holds {key:?} at {held:?}, the upstream at {upstream_rv:?} \
                 (revision {newest})",
                key = String::from_utf8_lossy(&key)
            )));
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
    seconds: u64,
) -> Result<(Option<Revision>, Revision), Unproven> {
    let path = if namespace.is_empty() {
        collection_path(info)
    } else {
        namespaced_path(info, namespace)
    };
    let selector: String =
        form_urlencoded::byte_serialize(format!("metadata.name={name}").as_bytes()).collect();
    let url = format!(
        "{path}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan\
         &allowWatchBookmarks=true&fieldSelector={selector}&timeoutSeconds={seconds}"
    );
    let body = probe(upstream, &url).await?;
    let mut found = None;
    // Why a line ended the read; a broken stream (none) is the upstream being busy.
    let mut why = None;
    let newest = lines(body, |line| {
        initial_event(line, &mut found).map_err(|e| {
            let message = e.to_string();
            why = Some(e);
            message
        })
    })
    .await
    .map_err(|e| why.take().unwrap_or(Unproven::Busy(e)))?
    .ok_or_else(|| {
        // An upstream that ignores `sendInitialEvents` ends it so.
        Unproven::Refused("the streaming list ended without its initial-events-end bookmark".into())
    })?;
    Ok((found, newest))
}

/// One line of a streaming list of one object: the object's resourceVersion kept in
/// `found`, or the revision of the bookmark that ends the initial events. An error event
/// (kube-apiserver's own cache not fresh in time) is the upstream being busy; anything else
/// it should not have sent, that it cannot give the proof.
fn initial_event(line: &[u8], found: &mut Option<Revision>) -> Result<Option<Revision>, Unproven> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let l: Line<'_> = serde_json::from_slice(line).map_err(|e| Unproven::Refused(e.to_string()))?;
    match &*l.ty {
        "ADDED" => {
            let head: ObjectHead<'_> = serde_json::from_str(l.object.get())
                .map_err(|e| Unproven::Refused(e.to_string()))?;
            *found = Some(parse_rv(&head.metadata.resource_version).map_err(Unproven::Refused)?);
            Ok(None)
        }
        "BOOKMARK" => {
            Bookmark::initial_events_end(l.object.get().as_bytes()).map_err(Unproven::Refused)
        }
        "ERROR" => Err(Unproven::Busy(format!(
            "the upstream's error: {}",
            l.object.get()
        ))),
        other => Err(Unproven::Refused(format!(
            "{other} before the initial events ended"
        ))),
    }
}

/// Opens a proof's upstream read: an answer that says the upstream is overloaded (429, 503,
/// 504), or none at all, is [`Unproven::Busy`]; another refusal is [`Unproven::Refused`].
async fn probe(upstream: &Upstream, url: &str) -> Result<WatchBody, Unproven> {
    open(upstream, url).await.map_err(|e| match e {
        NotOpened::Busy(e) => Unproven::Busy(e),
        NotOpened::Refused(e) => Unproven::Refused(e),
    })
}

async fn upstream_newest(
    upstream: &Upstream,
    info: &'static ResourceInfo,
) -> Result<Revision, Unproven> {
    let (_, newest) = upstream_object(upstream, info, "", NO_SUCH_NAME, PROBE_SECONDS).await?;
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
) -> Result<CaughtUp, Unproven> {
    let path = collection_path(info);
    let from = cache.revision();
    let url = format!(
        "{path}?watch=1&allowWatchBookmarks=true&resourceVersion={from}\
         &timeoutSeconds={SHORT_WATCH_SECONDS}"
    );
    let body = probe(upstream, &url).await?;
    let mut bookmarked = false;
    let reached = lines(body, |line| {
        let mut events = Vec::new();
        let taken = take_line(info, line, &mut events).map_err(|e| e.to_string())?;
        if !events.is_empty() {
            reflector::apply(cache, FeedItem::Events(events));
        }
        if let Taken::Bookmark(rev) = taken {
            bookmarked = true;
            reflector::apply(cache, FeedItem::Progress(rev));
        }
        Ok((cache.revision() >= state.lock().target).then_some(()))
    })
    .await
    .map_err(Unproven::Busy)?;
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
