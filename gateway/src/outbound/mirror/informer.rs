//! One upstream list+watch per cached resource, filling its watch cache: a streaming list
//! (a watch with `sendInitialEvents`, ended by its `initial-events-end` bookmark) where the
//! upstream offers one, else a paginated list (the first page a consistent read), then a
//! watch with bookmarks from the list's resourceVersion, resumed from the last revision seen when it ends or fails. A watch the
//! upstream refuses as too old (410, its history compacted) is followed by a new list whose
//! differences from the cache reach clients as ordinary events (`WatchCache::resync`), so
//! they stay connected.
//!
//! Quiet resources: kube-apiserver bookmarks the watches of the resources it watch-caches
//! about once a minute, and sends no bookmarks at all for those it does not (Events), whose
//! watches read etcd directly. A watch of such a resource resumed from its last event after a
//! quiet spell longer than etcd's compaction interval (5 minutes in kube-apiserver) is a 410
//! and a full relist, for nothing having happened. So watches are asked to last hours
//! ([`WATCH_SECONDS`], where client-go asks 5 to 10 minutes), and silence counts against a
//! watch only once its resource has been seen to bookmark: past
//! `--upstream-watch-idle-timeout` (150 s) such a watch may be hung, and is opened again from
//! where it was, at once and quietly. A dead connection under a quiet watch is found by the
//! upstream client's h2 PINGs (`outbound/client.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt as _;
use rand::Rng as _;
use serde::Deserialize;
use serde_json::value::RawValue;
use svc_core::ResourceInfo;
use svc_core::watch::WatchCache;
use svc_core::watch::unstructured::{ObjectHead, with_type_meta};
use svc_storage::{Event, EventKind, FeedItem, KeyValue, Revision};
use tokio::sync::{Notify, watch};

use crate::outbound::client;
use crate::outbound::upstream::{CALL_TIMEOUT, Upstream};

/// Items per page of the upstream list.
const PAGE: usize = 500;
/// How long one page of the upstream list may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest list page read (500 large objects).
const MAX_PAGE_BYTES: usize = 512 << 20;
/// The longest watch event line read (an object is at most 1.5 MiB in etcd; room to spare).
const MAX_LINE: usize = 16 << 20;
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What an informer reports, read by metrics, `/readyz` and the read path.
#[derive(Debug, Default)]
pub struct InformerStatus {
    /// The cache has been filled at least once.
    pub synced: AtomicBool,
    /// An upstream watch is open now.
    pub watching: AtomicBool,
    /// Full lists read (the first one included).
    pub lists: AtomicU64,
    /// The revision of the last full list the cache was filled or resynced with: the upstream
    /// serves no watch from before it (that is why it was read), and every client of the
    /// cache was told it at once (a resync bookmarks them all).
    pub filled_at: AtomicI64,
    /// Upstream watches opened.
    pub watches: AtomicU64,
    /// Proofs of freshness asked for (`mirror/fresh.rs`); those the upstream could not give
    /// (their reads passed through), and those it was too busy to give in time (their reads
    /// were told to try again).
    pub proofs: AtomicU64,
    pub proofs_failed: AtomicU64,
    pub proofs_busy: AtomicU64,
    /// A watch of this resource has carried a bookmark: the upstream bookmarks it, so
    /// silence on its watch is a sign of trouble.
    pub bookmarks: AtomicBool,
    /// Milliseconds since the informer started at the last word from the upstream (an event,
    /// a bookmark, a list), for the lag metric.
    pub last_contact_ms: AtomicI64,
    pub started: std::sync::OnceLock<Instant>,
}

impl InformerStatus {
    fn contact(&self) {
        let start = *self.started.get_or_init(Instant::now);
        let ms = i64::try_from(start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.last_contact_ms.store(ms, Ordering::Relaxed);
    }

    /// Seconds since the upstream last said something about this resource.
    pub fn silence(&self) -> f64 {
        let start = *self.started.get_or_init(Instant::now);
        let now = start.elapsed().as_millis() as f64;
        ((now - self.last_contact_ms.load(Ordering::Relaxed) as f64) / 1000.0).max(0.0)
    }
}

/// The collection path of a resource upstream (`/api/v1/pods`, `/apis/apps/v1/deployments`).
pub fn collection_path(info: &ResourceInfo) -> String {
    if info.group.is_empty() {
        format!("/api/{}/{}", info.version, info.plural)
    } else {
        format!("/apis/{}/{}/{}", info.group, info.version, info.plural)
    }
}

/// The path of a namespace's part of a namespaced resource's collection.
pub fn namespaced_path(info: &ResourceInfo, namespace: &str) -> String {
    let namespace: String = form_urlencoded::byte_serialize(namespace.as_bytes()).collect();
    if info.group.is_empty() {
        format!(
            "/api/{}/namespaces/{namespace}/{}",
            info.version, info.plural
        )
    } else {
        format!(
            "/apis/{}/{}/namespaces/{namespace}/{}",
            info.group, info.version, info.plural
        )
    }
}

/// Runs until `stop` is set: list, watch, resume, relist. With `resume_from` (the revision
/// a previous run of this proxy kept, `mirror/resume.rs`), the first fill is the upstream's
/// state at that revision (an Exact list) and the watch goes on from there, so that clients
/// of the previous run resume their watches from this cache; the newest state, as without
/// it, when the upstream no longer holds that revision.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    upstream: Upstream,
    info: &'static ResourceInfo,
    cache: WatchCache,
    status: Arc<InformerStatus>,
    mut stop: watch::Receiver<bool>,
    changed: Option<Arc<Notify>>,
    idle: Duration,
    mut resume_from: Option<Revision>,
) {
    status.started.get_or_init(Instant::now);
    let mut from: Option<Revision> = None;
    let mut backoff = BACKOFF_MIN;
    let mut streaming = true;
    // The cache holds a resumed state that no upstream watch has carried on from yet, and
    // whether the next fill replaces the cache instead of resyncing it (below).
    let mut resumed = false;
    let mut replace = false;
    loop {
        if *stop.borrow() {
            return;
        }
        let rev = match from {
            Some(rev) => rev,
            None => match first_fill(&upstream, info, &mut streaming, resume_from.take()).await {
                Ok((kvs, rev, from_point)) => {
                    resumed = from_point;
                    let now = Instant::now();
                    let report = if std::mem::take(&mut replace) {
                        cache.replace(&kvs, rev, now)
                    } else {
                        cache.resync(&kvs, rev, now)
                    };
                    for e in &report.errors {
                        tracing::warn!(resource = info.plural, error = %e, "upstream object left out");
                    }
                    status.lists.fetch_add(1, Ordering::Relaxed);
                    status.filled_at.store(rev, Ordering::Release);
                    status.synced.store(true, Ordering::Release);
                    status.contact();
                    if let Some(n) = &changed {
                        n.notify_one();
                    }
                    rev
                }
                Err(e) => {
                    tracing::warn!(resource = info.plural, group = info.group, error = %e, "listing upstream failed");
                    if sleep_or_stop(&mut stop, jitter(backoff)).await {
                        return;
                    }
                    backoff = backoff.saturating_mul(2).min(BACKOFF_MAX);
                    continue;
                }
            },
        };
        status.watching.store(true, Ordering::Relaxed);
        status.watches.fetch_add(1, Ordering::Relaxed);
        let end = stream(
            &upstream, info, &cache, &status, rev, &mut stop, &changed, idle,
        )
        .await;
        status.watching.store(false, Ordering::Relaxed);
        match end {
            End::Stopped => return,
            // A resumed state whose history the upstream no longer holds is replaced, not
            // resynced: its watchers may stand anywhere after the resume point, where the
            // differences a resync sends are not their differences (an object they hold
            // would come as ADDED). They end with 410 and list again.
            End::Expired => {
                replace = std::mem::take(&mut resumed);
                let why = if replace {
                    "the upstream no longer holds the resumed revision: filling from the newest state"
                } else {
                    "upstream history compacted: relisting"
                };
                tracing::info!(resource = info.plural, group = info.group, "{why}");
                from = None;
                backoff = BACKOFF_MIN;
            }
            End::Closed(last) => {
                resumed = false;
                from = Some(last);
                backoff = BACKOFF_MIN;
            }
            End::Failed(last, e) => {
                resumed &= last <= rev;
                tracing::warn!(resource = info.plural, group = info.group, error = %e, "upstream watch failed");
                from = Some(last);
                if sleep_or_stop(&mut stop, jitter(backoff)).await {
                    return;
                }
                backoff = backoff.saturating_mul(2).min(BACKOFF_MAX);
            }
        }
    }
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.5..1.0))
}

/// Sleeps `d`; true when `stop` was set meanwhile.
async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *stop.borrow(),
        _ = crate::base::lifecycle::until_set(stop) => true,
    }
}

#[derive(Deserialize)]
struct ListPage<'a> {
    #[serde(default)]
    metadata: ListHead,
    #[serde(borrow, default)]
    items: Vec<&'a RawValue>,
}

#[derive(Default, Deserialize)]
struct ListHead {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
    #[serde(default, rename = "continue")]
    continue_: String,
}

pub(super) fn parse_rv(rv: &str) -> Result<Revision, String> {
    rv.parse::<Revision>()
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| format!("resourceVersion {rv:?} is not a positive integer"))
}

/// One object of `info` as the cache takes it: its key and JSON (with its type).
fn key_value(info: &ResourceInfo, raw: Bytes) -> Result<KeyValue, String> {
    let head: ObjectHead<'_> = serde_json::from_slice(&raw).map_err(|e| e.to_string())?;
    let rev = parse_rv(&head.metadata.resource_version)?;
    let key = Bytes::from(info.key(&head.metadata.namespace, &head.metadata.name));
    let value = with_type_meta(raw.clone(), &head, &info.api_version(), info.kind);
    Ok(KeyValue {
        key,
        value,
        create_revision: rev,
        mod_revision: rev,
        version: 1,
    })
}

/// The state at `resume_from` where the upstream still holds it (and true), else the newest.
async fn first_fill(
    upstream: &Upstream,
    info: &'static ResourceInfo,
    streaming: &mut bool,
    resume_from: Option<Revision>,
) -> Result<(Vec<KeyValue>, Revision, bool), String> {
    if let Some(at) = resume_from {
        let read = match list(upstream, info, Some(at)).await {
            // Listed: the upstream must also still watch from there, or the cache would
            // take watchers it cannot carry on for (checked before any joins).
            Ok(read) if watchable_from(upstream, info, at).await => Ok(read),
            Ok(_) => Err("the upstream no longer watches from it".to_string()),
            Err(e) => Err(e),
        };
        match read {
            Ok((kvs, rev)) => {
                tracing::info!(
                    resource = info.plural,
                    group = info.group,
                    revision = at,
                    "resuming from the revision kept by the last run"
                );
                return Ok((kvs, rev, true));
            }
            Err(e) => tracing::info!(
                resource = info.plural,
                group = info.group,
                revision = at,
                error = %e,
                "cannot resume from the revision kept by the last run: listing the newest state"
            ),
        }
    }
    let (kvs, rev) = fill(upstream, info, streaming).await?;
    Ok((kvs, rev, false))
}

/// How often a cache's history and snapshots are pruned while its watch is quiet.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// How long the upstream is given to refuse a watch from a resume point (kube-apiserver
/// refuses one from a version its history no longer holds at once, as its first event).
const RESUME_PROBE: Duration = Duration::from_secs(1);

/// Whether the upstream takes a watch from `at`: false when it refuses it (an `ERROR` first,
/// an error status, a failed request) within [`RESUME_PROBE`]; true when it sends anything
/// else or nothing.
async fn watchable_from(upstream: &Upstream, info: &'static ResourceInfo, at: Revision) -> bool {
    let url = format!(
        "{}?watch=1&allowWatchBookmarks=true&resourceVersion={at}&timeoutSeconds=2",
        collection_path(info)
    );
    let probe = async {
        let body = open(upstream, &url).await?;
        let first = lines(body, |line| {
            if line.iter().all(u8::is_ascii_whitespace) {
                return Ok(None);
            }
            let l: Line<'_> = serde_json::from_slice(line).map_err(|e| e.to_string())?;
            Ok(Some(l.ty != "ERROR"))
        })
        .await?;
        Ok::<bool, String>(first.unwrap_or(true))
    };
    match tokio::time::timeout(RESUME_PROBE, probe).await {
        Ok(Ok(takes)) => takes,
        Ok(Err(_)) => false,
        // Nothing within the probe's time: a quiet resource's watch, taken.
        Err(_) => true,
    }
}

/// Opens `url` (a watch, for its lines) as the proxy, in JSON: an error unless the upstream
/// answers 2xx.
pub(super) async fn open(upstream: &Upstream, url: &str) -> Result<hyper::body::Incoming, String> {
    let response = get(upstream, url).await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("{url} answered {}", response.status()));
    }
    Ok(response.into_body())
}

/// GETs `url` as the proxy, in JSON: the upstream's answer whatever its status.
pub(super) async fn get(
    upstream: &Upstream,
    url: &str,
) -> Result<http::Response<hyper::body::Incoming>, client::ClientError> {
    let request = http::Request::get(url)
        .header(http::header::ACCEPT, "application/json")
        .body(client::buffered(Bytes::new()))
        .map_err(|e| client::ClientError::Config(e.to_string()))?;
    upstream.send(request).await
}

/// How long a streaming list may take to send the initial state.
const STREAMING_LIST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an upstream watch is asked to last (`timeoutSeconds`), chosen at random in this
/// range for each watch: 2 to 4 hours. A quiet resource's watch resumed after etcd compacted
/// past its last event is a full relist; a long watch makes that rare. kube-apiserver puts no
/// limit on it (its own default is 30 to 60 minutes).
pub const WATCH_SECONDS: std::ops::Range<u64> = 7_200..14_400;

/// Every object of `info` upstream and the revision of the read: streamed where the upstream
/// offers it (less memory there than a list of pages), else page by page.
/// Once a streaming list fails (`streaming` is cleared), this informer lists in pages from
/// then on: an upstream that ignores `sendInitialEvents` never ends the initial events.
async fn fill(
    upstream: &Upstream,
    info: &'static ResourceInfo,
    streaming: &mut bool,
) -> Result<(Vec<KeyValue>, Revision), String> {
    if *streaming {
        let outcome = match tokio::time::timeout(
            STREAMING_LIST_TIMEOUT,
            streaming_list(upstream, info),
        )
        .await
        {
            Ok(Ok(Some(read))) => return Ok(read),
            // Not offered (an upstream without WatchList refuses the request).
            Ok(Ok(None)) => "refused".to_string(),
            Ok(Err(e)) => e,
            Err(_) => format!("no end within {STREAMING_LIST_TIMEOUT:?}"),
        };
        tracing::info!(resource = info.plural, group = info.group, why = %outcome, "listing in pages: the upstream's streaming list did not serve");
        *streaming = false;
    }
    list(upstream, info, None).await
}

/// The initial events of a streaming list from the newest state, up to its
/// `initial-events-end` bookmark; None when the upstream refuses streaming lists.
async fn streaming_list(
    upstream: &Upstream,
    info: &'static ResourceInfo,
) -> Result<Option<(Vec<KeyValue>, Revision)>, String> {
    let url = format!(
        "{}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan\
         &allowWatchBookmarks=true&timeoutSeconds={}",
        collection_path(info),
        STREAMING_LIST_TIMEOUT.as_secs()
    );
    let request = http::Request::get(&url)
        .header(http::header::ACCEPT, "application/json")
        .body(client::buffered(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(CALL_TIMEOUT, upstream.send(request))
        .await
        .map_err(|_| format!("{url}: no answer within {CALL_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    if response.status().is_client_error() {
        return Ok(None);
    }
    if !response.status().is_success() {
        return Err(format!("{url} answered {}", response.status()));
    }
    let mut kvs = Vec::new();
    let end = lines(response.into_body(), |line| {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let parsed: Line<'_> = serde_json::from_slice(line).map_err(|e| e.to_string())?;
        let raw = line.slice_ref(parsed.object.get().as_bytes());
        match &*parsed.ty {
            "ADDED" => {
                kvs.push(key_value(info, raw)?);
                Ok(None)
            }
            "BOOKMARK" => Ok(Bookmark::initial_events_end(&raw)?.map(Some)),
            // An upstream that does not stream lists answers a plain watch, or its refusal
            // as an event: pages instead.
            _ => Ok(Some(None)),
        }
    })
    .await?;
    Ok(end.flatten().map(|rv| (kvs, rv)))
}

/// Feeds the lines of a watch body to `each` until it returns a value or the body ends.
pub(super) async fn lines<T>(
    mut body: hyper::body::Incoming,
    mut each: impl FnMut(&Bytes) -> Result<Option<T>, String>,
) -> Result<Option<T>, String> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line = buf.split_to(nl.saturating_add(1)).freeze();
            if let Some(v) = each(&line)? {
                return Ok(Some(v));
            }
        }
        if buf.len() > MAX_LINE {
            return Err(format!("a watch event over {MAX_LINE} bytes"));
        }
    }
    Ok(None)
}

/// Every object of `info` upstream, page by page, and the revision of the read: the newest,
/// or exactly `at` (an error when the upstream no longer holds it). A page whose continue
/// token expired starts the list over.
async fn list(
    upstream: &Upstream,
    info: &'static ResourceInfo,
    at: Option<Revision>,
) -> Result<(Vec<KeyValue>, Revision), String> {
    let path = collection_path(info);
    'again: loop {
        let mut kvs = Vec::new();
        let mut token = String::new();
        let mut revision = None;
        loop {
            let url = {
                let mut query = form_urlencoded::Serializer::new(String::new());
                query.append_pair("limit", &PAGE.to_string());
                if !token.is_empty() {
                    query.append_pair("continue", &token);
                } else if let Some(at) = at {
                    query.append_pair("resourceVersion", &at.to_string());
                    query.append_pair("resourceVersionMatch", "Exact");
                }
                format!("{path}?{}", query.finish())
            };
            let (status, body) = upstream
                .get(&url, "application/json", MAX_PAGE_BYTES, LIST_TIMEOUT)
                .await?;
            if status == http::StatusCode::GONE && !token.is_empty() {
                continue 'again;
            }
            if !status.is_success() {
                return Err(format!(
                    "{path} answered {}: {}",
                    status.as_u16(),
                    String::from_utf8_lossy(body.get(..512).unwrap_or(&body))
                ));
            }
            let page: ListPage<'_> = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
            if revision.is_none() {
                revision = Some(parse_rv(&page.metadata.resource_version)?);
            }
            for item in page.items {
                kvs.push(key_value(info, body.slice_ref(item.get().as_bytes()))?);
            }
            if page.metadata.continue_.is_empty() {
                let rev = revision.unwrap_or_default();
                return Ok((kvs, rev));
            }
            token = page.metadata.continue_;
        }
    }
}

/// How an upstream watch ended, with the last revision it reached.
enum End {
    Stopped,
    Expired,
    Closed(Revision),
    Failed(Revision, String),
}

/// One line of a JSON watch stream: its type, and its object as sent.
#[derive(Deserialize)]
pub(super) struct Line<'a> {
    #[serde(rename = "type", borrow)]
    pub(super) ty: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    pub(super) object: &'a RawValue,
}

/// A bookmark's object: its revision, and whether it ends a streaming list's initial
/// events (`k8s.io/initial-events-end`).
#[derive(Deserialize)]
pub(super) struct Bookmark {
    #[serde(default)]
    metadata: BookmarkMeta,
}

#[derive(Default, Deserialize)]
struct BookmarkMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

impl Bookmark {
    /// The revision of the bookmark that ends a streaming list's initial events; None for
    /// any other bookmark.
    pub(super) fn initial_events_end(object: &[u8]) -> Result<Option<Revision>, String> {
        let b: Bookmark = serde_json::from_slice(object).map_err(|e| e.to_string())?;
        let ended = b
            .metadata
            .annotations
            .get("k8s.io/initial-events-end")
            .is_some_and(|v| v == "true");
        if ended {
            parse_rv(&b.metadata.resource_version).map(Some)
        } else {
            Ok(None)
        }
    }
}

#[derive(Deserialize)]
struct StatusHead {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    message: String,
}

/// Watches `info` upstream from `from`, applying what comes to the cache, until the upstream
/// ends it or says nothing for `idle`.
#[allow(clippy::too_many_arguments)]
async fn stream(
    upstream: &Upstream,
    info: &'static ResourceInfo,
    cache: &WatchCache,
    status: &InformerStatus,
    from: Revision,
    stop: &mut watch::Receiver<bool>,
    changed: &Option<Arc<Notify>>,
    idle: Duration,
) -> End {
    let mut last = from;
    let timeout = rand::rng().random_range(WATCH_SECONDS);
    let url = format!(
        "{}?watch=1&allowWatchBookmarks=true&resourceVersion={from}&timeoutSeconds={timeout}",
        collection_path(info)
    );
    let request = match http::Request::get(&url)
        .header(http::header::ACCEPT, "application/json")
        .body(client::buffered(Bytes::new()))
    {
        Ok(r) => r,
        Err(e) => return End::Failed(last, e.to_string()),
    };
    let response = tokio::select! {
        r = tokio::time::timeout(CALL_TIMEOUT, upstream.send(request)) => match r {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return End::Failed(last, e.to_string()),
            Err(_) => return End::Failed(last, format!("no answer within {CALL_TIMEOUT:?}")),
        },
        _ = crate::base::lifecycle::until_set(stop) => return End::Stopped,
    };
    if response.status() == http::StatusCode::GONE {
        return End::Expired;
    }
    if !response.status().is_success() {
        return End::Failed(last, format!("{url} answered {}", response.status()));
    }
    let mut body = response.into_body();
    let mut buf = BytesMut::new();
    // History and snapshots age out on a timer too, as the store-fed caches' do: a quiet
    // resource (Events, which kube-apiserver never bookmarks) sends nothing that would.
    let mut prune = tokio::time::interval(PRUNE_EVERY);
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heard = tokio::time::Instant::now();
    loop {
        // Silence is a sign of trouble only where the upstream bookmarks.
        let patience = if status.bookmarks.load(Ordering::Relaxed) {
            idle
        } else {
            Duration::from_secs(timeout).saturating_add(idle)
        };
        let deadline = heard.checked_add(patience).unwrap_or(heard);
        let frame = tokio::select! {
            f = tokio::time::timeout_at(deadline, body.frame()) => f,
            _ = prune.tick() => {
                cache.prune(Instant::now());
                continue;
            }
            _ = crate::base::lifecycle::until_set(stop) => return End::Stopped,
        };
        heard = tokio::time::Instant::now();
        let data = match frame {
            Err(_) => return End::Closed(last),
            Ok(None) => return End::Closed(last),
            Ok(Some(Err(e))) => return End::Failed(last, e.to_string()),
            Ok(Some(Ok(f))) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
        };
        status.contact();
        buf.extend_from_slice(&data);
        let mut events = Vec::new();
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line = buf.split_to(nl.saturating_add(1)).freeze();
            match take_line(info, &line, &mut events) {
                Ok(Taken::Event(rev)) => last = last.max(rev),
                Ok(Taken::Bookmark(rev)) => {
                    status.bookmarks.store(true, Ordering::Relaxed);
                    flush(cache, &mut events, info);
                    cache.apply(FeedItem::Progress(rev), Instant::now());
                    last = last.max(rev);
                }
                Ok(Taken::Nothing) => {}
                Err(end) => {
                    flush(cache, &mut events, info);
                    return match end {
                        LineEnd::Expired => End::Expired,
                        LineEnd::Failed(e) => End::Failed(last, e),
                    };
                }
            }
        }
        if !events.is_empty() {
            flush(cache, &mut events, info);
            if let Some(n) = changed {
                n.notify_one();
            }
        }
        if buf.len() > MAX_LINE {
            return End::Failed(last, format!("a watch event over {MAX_LINE} bytes"));
        }
    }
}

pub(super) fn flush(cache: &WatchCache, events: &mut Vec<Event>, info: &ResourceInfo) {
    if events.is_empty() {
        return;
    }
    let report = cache.apply(FeedItem::Events(std::mem::take(events)), Instant::now());
    for e in &report.errors {
        tracing::warn!(resource = info.plural, error = %e, "upstream object left out");
    }
}

pub(super) enum Taken {
    Event(Revision),
    Bookmark(Revision),
    Nothing,
}

pub(super) enum LineEnd {
    Expired,
    Failed(String),
}

impl std::fmt::Display for LineEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineEnd::Expired => f.write_str("the upstream's history no longer reaches back (410)"),
            LineEnd::Failed(e) => f.write_str(e),
        }
    }
}

/// Reads one line of the upstream's JSON watch stream into `events`.
pub(super) fn take_line(
    info: &ResourceInfo,
    line: &Bytes,
    events: &mut Vec<Event>,
) -> Result<Taken, LineEnd> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(Taken::Nothing);
    }
    let parsed: Line<'_> =
        serde_json::from_slice(line).map_err(|e| LineEnd::Failed(format!("watch event: {e}")))?;
    let raw = line.slice_ref(parsed.object.get().as_bytes());
    match &*parsed.ty {
        "ADDED" | "MODIFIED" => {
            let kv = key_value(info, raw).map_err(LineEnd::Failed)?;
            let rev = kv.mod_revision;
            events.push(Event {
                kind: EventKind::Put,
                kv,
                prev_kv: None,
            });
            Ok(Taken::Event(rev))
        }
        "DELETED" => {
            let kv = key_value(info, raw).map_err(LineEnd::Failed)?;
            let rev = kv.mod_revision;
            events.push(Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    value: Bytes::new(),
                    create_revision: 0,
                    version: 0,
                    ..kv
                },
                prev_kv: None,
            });
            Ok(Taken::Event(rev))
        }
        "BOOKMARK" => {
            let head: ObjectHead<'_> = serde_json::from_slice(&raw)
                .map_err(|e| LineEnd::Failed(format!("bookmark: {e}")))?;
            parse_rv(&head.metadata.resource_version)
                .map(Taken::Bookmark)
                .map_err(LineEnd::Failed)
        }
        "ERROR" => {
            let s: StatusHead = serde_json::from_slice(&raw).unwrap_or(StatusHead {
                code: 0,
                message: String::from_utf8_lossy(&raw).into_owned(),
            });
            if s.code == 410 {
                Err(LineEnd::Expired)
            } else {
                Err(LineEnd::Failed(format!("{}: {}", s.code, s.message)))
            }
        }
        other => Err(LineEnd::Failed(format!(
            "unknown watch event type {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use svc_core::watch::{WatchCacheConfig, unstructured};

    fn pods() -> &'static ResourceInfo {
        crate::outbound::mirror::discovery::kind_of(
            &crate::outbound::mirror::discovery::Discovered {
                group: String::new(),
                version: "v1".into(),
                resource: "pods".into(),
                kind: "Pod".into(),
                singular: "pod".into(),
                namespaced: true,
                verbs: vec!["list".into(), "watch".into()],
                short_names: vec![],
            },
        )
    }

    #[test]
    fn watch_lines_become_events_bookmarks_and_ends() {
        let info = pods();
        let mut events = Vec::new();
        let line = |s: &str| Bytes::from(format!("{s}\n"));
        let added = line(
            r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","resourceVersion":"12"}}}"#,
        );
        assert!(matches!(
            take_line(info, &added, &mut events),
            Ok(Taken::Event(12))
        ));
        assert_eq!(&events[0].kv.key[..], b"/registry/pods/ns/p");
        let deleted = line(
            r#"{"type":"DELETED","object":{"metadata":{"name":"p","namespace":"ns","resourceVersion":"13"}}}"#,
        );
        assert!(matches!(
            take_line(info, &deleted, &mut events),
            Ok(Taken::Event(13))
        ));
        assert_eq!(events[1].kind, EventKind::Delete);
        let bookmark = line(
            r#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"20"}}}"#,
        );
        assert!(matches!(
            take_line(info, &bookmark, &mut events),
            Ok(Taken::Bookmark(20))
        ));
        let gone =
            line(r#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}"#);
        assert!(matches!(
            take_line(info, &gone, &mut events),
            Err(LineEnd::Expired)
        ));
        let other = line(r#"{"type":"ERROR","object":{"kind":"Status","code":500}}"#);
        assert!(matches!(
            take_line(info, &other, &mut events),
            Err(LineEnd::Failed(_))
        ));
        let bad_rv =
            line(r#"{"type":"ADDED","object":{"metadata":{"name":"p","resourceVersion":"x"}}}"#);
        assert!(matches!(
            take_line(info, &bad_rv, &mut events),
            Err(LineEnd::Failed(_))
        ));
        assert!(matches!(
            take_line(info, &line(""), &mut events),
            Ok(Taken::Nothing)
        ));
        assert!(take_line(info, &line("{"), &mut events).is_err());

        // The events fill a cache; list items without their type get it.
        let cache = WatchCache::new(unstructured::codec(info), WatchCacheConfig::default());
        let item = key_value(
            info,
            Bytes::from_static(
                br#"{"metadata":{"name":"q","namespace":"ns","resourceVersion":"5"}}"#,
            ),
        )
        .unwrap();
        assert!(
            item.value
                .starts_with(br#"{"apiVersion":"v1","kind":"Pod","#)
        );
        cache.replace(&[item], 10, Instant::now());
        let report = cache.apply(FeedItem::Events(events), Instant::now());
        assert!(report.errors.is_empty());
        assert_eq!(cache.revision(), 13);
    }
}
