//! One watch (Kubernetes' `cache_watcher.go`): its filter (namespace, name, a field its
//! selector pins, which choose its bucket in the dispatch index) and the selector transition
//! rules, the initial events, the drain that turns queued positions into shared frames,
//! bookmarks, and the slow-consumer policy: a watcher whose queue ran over walks the ring from
//! its position itself, then doubles its queue (up to the bound) for next time, and one the
//! ring has moved past ends with a 410 `ERROR`.
//!
//! No task of its own serves a [`Watcher`]: whoever serves its connection polls it, an
//! HTTP/1.1 response body or an h2 connection's task, which polls all the connection's watches
//! and names itself their wake group ([`Watcher::set_wake_group`]) so the wake gate counts
//! them as one task. Woken through [`Watcher::ready`] (or by its server's timer at
//! [`Watcher::next_bookmark_at`]), it hands a batch of frames up to a byte budget from
//! [`Watcher::drain`], written as one chunk, until `finished`. A drain borrows the frames under
//! the cache's state lock, cloning none of the `Arc`s every watcher shares. The cache never
//! blocks on a watcher and never holds frames for it.

use std::collections::VecDeque;
use std::future::Future;
use std::ops::Bound;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use svc_storage::{KeyRange, Revision};

use super::cache::WatchCache;
use super::cached::{CachedObject, Selector};
use super::dispatch::{QUEUE_START, WatcherSlot};
use super::frames::{FrameEncoder, FrameFormat};
use super::history::{EventType, WatchCacheEvent};
use super::snapshots::State;
use crate::status::ApiError;

/// Frames handed out by one drain at most, whatever the byte budget.
const MAX_FRAMES_PER_DRAIN: usize = 4096;

/// Which objects a watch is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct WatchFilter {
    /// The namespace, or `None` for every namespace; `Some("")` for cluster-scoped types.
    pub namespace: Option<Box<str>>,
    /// The name, when the field selector pins `metadata.name` (single-object watches).
    pub name: Option<Box<str>>,
    /// Another field the selector pins to a value (`spec.nodeName=node-1`, a kubelet's pods):
    /// the watcher is filed under it, so an event visits only the watchers of its value.
    pub pinned: Option<(Box<str>, Box<str>)>,
    pub selector: Selector,
    /// Events at or before this revision are not for this watcher (a watch that started
    /// ahead of the cache, [`WatchStart::Ahead`]); 0 for every other watch.
    pub after: Revision,
}

/// Where a watcher is filed in the dispatch index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bucket<'a> {
    All,
    Namespace(&'a str),
    Name(&'a str, &'a str),
    /// A pinned field and its value, across namespaces (the filter still checks them).
    Field(&'a str, &'a str),
}

impl WatchFilter {
    /// The filter of a watch on `namespace` (None or empty: all namespaces) with `selector`.
    /// Field terms `metadata.namespace=` and `metadata.name=` narrow the index bucket, so
    /// a single-object watch is only ever visited for events of that object.
    pub fn new(namespace: Option<&str>, selector: Selector, namespaced: bool) -> Self {
        let namespace = if !namespaced {
            Some("")
        } else {
            namespace
                .filter(|ns| !ns.is_empty())
                .or_else(|| selector.fields.exact("metadata.namespace"))
        };
        let pinned = selector
            .fields
            .terms
            .iter()
            .find(|t| !t.negated && !t.field.starts_with("metadata."))
            .map(|t| (t.field.as_str().into(), t.value.as_str().into()));
        WatchFilter {
            namespace: namespace.map(Into::into),
            name: selector.fields.exact("metadata.name").map(Into::into),
            pinned,
            selector,
            after: 0,
        }
    }

    pub fn matches(&self, obj: &CachedObject) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| *obj.namespace == *ns)
            && self.name.as_deref().is_none_or(|n| *obj.name == *n)
            && self.selector.matches(obj)
    }

    /// What `event` is to this watcher: `MODIFIED` if the object matched before and after,
    /// `ADDED` if it starts matching, `DELETED` (of the previous object) if it stops
    /// matching or is deleted while matching, nothing if it matched at no point.
    pub fn transition(&self, event: &WatchCacheEvent) -> Option<EventType> {
        self.transition_by(event, |obj| self.matches(obj))
    }

    /// [`transition`](Self::transition), for a watcher that dispatch found in the index
    /// bucket of the event's object ([`bucket`](Self::bucket)): the bucket already holds its
    /// namespace (and name), and the previous object shares the key, so a filter with no
    /// selector matched both and needs no comparison. Every other filter is checked in full.
    pub(crate) fn transition_in_bucket(&self, event: &WatchCacheEvent) -> Option<EventType> {
        if self.selector.is_empty() {
            self.transition_by(event, |_| true)
        } else {
            self.transition(event)
        }
    }

    /// The transition table, with `matches` saying whether an object matches this filter.
    fn transition_by(
        &self,
        event: &WatchCacheEvent,
        matches: impl Fn(&CachedObject) -> bool,
    ) -> Option<EventType> {
        if event.revision <= self.after {
            return None;
        }
        let before = event.prev.as_deref().is_some_and(&matches);
        let after = event.event_type != EventType::Deleted && matches(&event.object);
        match (before, after) {
            (true, true) => Some(EventType::Modified),
            (false, true) => Some(EventType::Added),
            (true, false) => Some(EventType::Deleted),
            (false, false) => None,
        }
    }

    pub(crate) fn bucket(&self) -> Bucket<'_> {
        match (
            self.namespace.as_deref(),
            self.name.as_deref(),
            &self.pinned,
        ) {
            (Some(ns), Some(name), _) => Bucket::Name(ns, name),
            (_, _, Some((field, value))) => Bucket::Field(field, value),
            (Some(ns), None, None) => Bucket::Namespace(ns),
            (None, _, None) => Bucket::All,
        }
    }
}

/// What watches served from one registration have in common ([`Watcher::share_key`]): equal
/// keys are worth trying [`Watcher::absorb`] on (the filter is compared by its hash here, in
/// full there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShareKey {
    cache: usize,
    format: FrameFormat,
    bookmarks: bool,
    filter: u64,
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchStart {
    /// From the cache's current revision, with no initial events.
    Now,
    /// Synthetic `ADDED` events for the current state first (resourceVersion unset or `0`,
    /// or `sendInitialEvents=true`), then live events; `end_bookmark` adds the bookmark
    /// annotated `k8s.io/initial-events-end` after the initial events.
    InitialEvents { end_bookmark: bool },
    /// Every event after this revision: 410 if the ring no longer reaches back to it.
    After(Revision),
    /// Every event after this revision, which the cache may not have reached yet: the caller
    /// knows the source has (proxy mode, whose caches each follow their own upstream watch
    /// and learn a revision from another). Until the cache gets there, the events it applies
    /// at or before the revision are skipped for this watcher; from there on it is `After`.
    Ahead(Revision),
}

/// A watch to register with [`WatchCache::watch`].
#[derive(Clone, Debug)]
pub struct WatchRequest {
    /// None (or empty) for all namespaces.
    pub namespace: Option<String>,
    pub selector: Selector,
    pub start: WatchStart,
    /// `allowWatchBookmarks`: periodic `BOOKMARK` frames.
    pub bookmarks: bool,
    pub format: FrameFormat,
}

/// One batch of frames from [`Watcher::drain`], ready for one coalesced write.
#[derive(Debug, Default)]
pub struct Drain {
    pub frames: Vec<Bytes>,
    pub bytes: usize,
    /// More frames are ready now: drain again without waiting.
    pub more: bool,
    /// The stream is over (after an `ERROR` frame): write the frames, then end the response.
    pub finished: bool,
}

impl Drain {
    fn push(&mut self, frame: Bytes) {
        self.bytes = self.bytes.saturating_add(frame.len());
        self.frames.push(frame);
    }

    fn full(&self, max_bytes: usize) -> bool {
        self.bytes >= max_bytes || self.frames.len() >= MAX_FRAMES_PER_DRAIN
    }
}

/// The initial events still to send: a private O(1) snapshot, walked in key order.
#[derive(Debug)]
struct InitialPhase {
    state: State,
    revision: Revision,
    range: KeyRange,
    after: Option<Bytes>,
    end_bookmark: bool,
}

/// One registered watch, owned by the task that serves it. Dropping it unregisters it.
#[derive(Debug)]
pub struct Watcher {
    cache: WatchCache,
    slot: Arc<WatcherSlot>,
    id: u32,
    format: FrameFormat,
    /// Boxed: only new `sendInitialEvents` watches have one, idle watchers stay small.
    initial: Option<Box<InitialPhase>>,
    bookmarks: bool,
    /// Everything up to this revision has been delivered (the revision a bookmark may carry
    /// and a client would resume from).
    synced: Revision,
    next_bookmark: Option<Instant>,
    finished: bool,
}

impl Watcher {
    /// Names the task group that drives this watcher (an h2 connection's task, which polls
    /// every watch on it): the wake gate wakes a group's watchers together (`wakes.rs`).
    /// 0, the default, is no group.
    pub fn set_wake_group(&self, group: u64) {
        self.slot.state.lock().group = group;
    }

    #[allow(clippy::too_many_arguments)] // internal constructor, called from one place
    pub(crate) fn new(
        cache: WatchCache,
        slot: Arc<WatcherSlot>,
        id: u32,
        req: &WatchRequest,
        initial_state: Option<(State, KeyRange)>,
        synced: Revision,
        now: Instant,
    ) -> Self {
        let initial = match (req.start, initial_state) {
            (WatchStart::InitialEvents { end_bookmark }, Some((state, range))) => {
                Some(Box::new(InitialPhase {
                    state,
                    revision: synced,
                    range,
                    after: None,
                    end_bookmark,
                }))
            }
            _ => None,
        };
        let interval = cache.config().bookmark_interval;
        Watcher {
            cache,
            slot,
            id,
            format: req.format,
            initial,
            bookmarks: req.bookmarks,
            synced,
            // An interval too long to add means no bookmarks.
            next_bookmark: req.bookmarks.then(|| now.checked_add(interval)).flatten(),
            finished: false,
        }
    }

    pub fn format(&self) -> FrameFormat {
        self.format
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Everything up to this revision has been handed out by `drain`.
    pub fn synced_revision(&self) -> Revision {
        self.synced
    }

    /// When the next periodic bookmark is due (None without bookmarks): a timer for the
    /// gateway's loop, after which `drain` adds the bookmark.
    pub fn next_bookmark_at(&self) -> Option<Instant> {
        self.next_bookmark.filter(|_| !self.finished)
    }

    /// Resolves once `drain` has something to return. Owns what it needs (no borrow of the
    /// watcher), so it can sit in a `select!` next to timers.
    pub fn ready(&self) -> Ready {
        Ready {
            slot: self.slot.clone(),
            now: self.initial.is_some() || self.finished,
        }
    }

    /// [`Watcher::ready`] polled in place: Ready once `drain` has something to return,
    /// else `cx`'s waker is kept to be woken then.
    pub fn poll_ready(&self, cx: &Context<'_>) -> Poll<()> {
        if self.initial.is_some() || self.finished {
            return Poll::Ready(());
        }
        poll_slot(&self.slot, cx)
    }

    /// The frames ready now, up to about `max_bytes` (at least one frame if any is ready).
    /// Adds a bookmark when one is due and the watcher is caught up. Never blocks on I/O;
    /// takes the cache's state lock shared and this watcher's own lock, briefly.
    pub fn drain(&mut self, max_bytes: usize, now: Instant) -> Drain {
        let mut out = Drain::default();
        if self.finished {
            out.finished = true;
            return out;
        }
        let max_bytes = max_bytes.max(1);
        if self.initial.is_some() {
            self.drain_initial(&mut out, max_bytes);
            if self.initial.is_some() || self.finished {
                out.more = !self.finished;
                out.finished = self.finished;
                return out;
            }
        }
        self.drain_events(&mut out, max_bytes, now);
        out.finished = self.finished;
        out
    }

    fn drain_initial(&mut self, out: &mut Drain, max_bytes: usize) {
        let Some(init) = self.initial.as_mut() else {
            return;
        };
        let encoder = &self.cache.shared.encoder;
        let lower = match &init.after {
            Some(k) => Bound::Excluded(&k[..]),
            None => Bound::Included(&init.range.start[..]),
        };
        let upper = if init.range.end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(&init.range.end[..])
        };
        let mut last: Option<&Bytes> = None;
        let mut exhausted = true;
        for (key, obj) in init.state.range::<_, [u8]>((lower, upper)) {
            if out.full(max_bytes) {
                exhausted = false;
                break;
            }
            last = Some(key);
            if !self.slot.filter.matches(obj) {
                continue;
            }
            match encoder.object_frame(EventType::Added, obj, self.format) {
                Ok(f) => out.push(f),
                Err(e) => {
                    out.push(encoder.error(&e, self.format));
                    self.finished = true;
                    return;
                }
            }
        }
        if !exhausted {
            init.after = last.cloned().or(init.after.take());
            return;
        }
        let revision = init.revision;
        let end_bookmark = init.end_bookmark;
        self.initial = None;
        self.synced = self.synced.max(revision);
        if end_bookmark {
            match encoder.bookmark(revision, true, self.format) {
                Ok(f) => out.push(f),
                Err(e) => {
                    out.push(encoder.error(&e, self.format));
                    self.finished = true;
                }
            }
        }
    }

    fn drain_events(&mut self, out: &mut Drain, max_bytes: usize, now: Instant) {
        // Borrowed, not cloned, and frames taken under the lock where they are encoded
        // already (nearly always): every watcher of the cache drains through the same
        // `Arc`s, and each clone and drop of one is an atomic write to a cache line that
        // every core delivering events then passes around.
        let shared = &self.cache.shared;
        let mut picked: Vec<Picked> = Vec::new();
        let mut estimate = out.bytes;
        let mut overrun: Option<Revision> = None;
        let mut forced = false;
        let caught_up_at;
        let format = self.format;
        let pick = |ev: &Arc<WatchCacheEvent>, ty: EventType| match FrameEncoder::encoded_frame(
            ev, ty, format,
        ) {
            Some(frame) => Picked::Frame(frame, ev.revision),
            None => Picked::Event(ev.clone(), ty),
        };
        {
            let inner = shared.inner.read();
            let mut st = self.slot.state.lock();
            let room = |picked: &Vec<_>, estimate: usize| {
                estimate < max_bytes
                    && out.frames.len().saturating_add(picked.len()) < MAX_FRAMES_PER_DRAIN
            };
            if let Some(oldest) = st.expired {
                overrun = Some(oldest);
            }
            let walked = st.catchup.is_some();
            // The catch-up interval first: its events all precede the queued ones.
            if let (None, Some(mut iv)) = (overrun, st.catchup) {
                while room(&picked, estimate) {
                    match iv.next(&inner.history) {
                        Err(o) => {
                            overrun = Some(o.oldest_revision);
                            break;
                        }
                        Ok(None) => break,
                        Ok(Some(ev)) => {
                            if let Some(ty) = self.slot.filter.transition(ev) {
                                estimate = estimate.saturating_add(frame_estimate(ev));
                                picked.push(pick(ev, ty));
                            }
                        }
                    }
                }
                st.catchup = (!iv.is_done()).then_some(iv);
            }
            let mut taken = 0usize;
            while overrun.is_none() && st.catchup.is_none() && room(&picked, estimate) {
                let Some(p) = st.queue.pop_front() else {
                    break;
                };
                taken = taken.saturating_add(1);
                match inner.history.get(p >> 2) {
                    Err(o) => overrun = Some(o.oldest_revision),
                    Ok(Some(ev)) => {
                        estimate = estimate.saturating_add(frame_estimate(ev));
                        picked.push(pick(ev, EventType::from_bits(p)));
                    }
                    Ok(None) => {}
                }
            }
            let cap = st.queue.capacity();
            if walked && st.catchup.is_none() && overrun.is_none() {
                // The queue ran over (or the watch began behind): room for twice as many
                // positions next time, allocated here rather than by dispatch.
                let want = cap.saturating_mul(2).min(shared.config.watcher_queue_limit);
                let more = want.saturating_sub(st.queue.len());
                st.queue.reserve_exact(more);
            } else if st.queue.is_empty() && cap > 64 && taken.saturating_mul(4) < cap {
                // A burst grew the queue; a watcher getting a few events at a time should
                // not keep the capacity.
                st.queue = VecDeque::with_capacity(taken.saturating_mul(2).max(QUEUE_START));
            }
            if overrun.is_some() {
                st.queue = Default::default();
                st.catchup = None;
            }
            // A bookmark owed now is given once everything before it has been drained.
            if overrun.is_none() && st.queue.is_empty() && st.catchup.is_none() {
                forced = std::mem::take(&mut st.bookmark_now);
            }
            caught_up_at = (!st.has_work()).then_some(inner.revision);
            out.more = st.has_work() && overrun.is_none();
        }

        let encoder = &shared.encoder;
        let mut failed = false;
        for p in picked {
            // Frames not encoded yet are encoded here, outside the lock.
            let (frame, revision) = match p {
                Picked::Frame(frame, revision) => (frame, revision),
                Picked::Event(ev, ty) => (encoder.event_frame(&ev, ty, format), ev.revision),
            };
            match frame {
                Ok(f) => {
                    out.push(f);
                    self.synced = self.synced.max(revision);
                }
                Err(e) => {
                    out.push(encoder.error(&e, format));
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            self.finish();
            return;
        }
        let encoder = &self.cache.shared.encoder;
        if let Some(oldest) = overrun {
            let err = ApiError::Expired(format!(
                "too old resource version: {} ({oldest})",
                self.synced
            ));
            out.push(encoder.error(&err, self.format));
            self.finish();
            return;
        }
        if let Some(revision) = caught_up_at {
            self.synced = self.synced.max(revision);
            if self.next_bookmark.is_some_and(|t| forced || now >= t) {
                self.next_bookmark = now.checked_add(self.cache.config().bookmark_interval);
                match encoder.bookmark(self.synced, false, self.format) {
                    Ok(f) => out.push(f),
                    Err(e) => {
                        out.push(encoder.error(&e, self.format));
                        self.finish();
                    }
                }
            }
        }
    }

    /// What another watch must have in common with this one to be served from its frames
    /// ([`Watcher::absorb`]): None while it still has initial events to send, or is over.
    pub fn share_key(&self) -> Option<ShareKey> {
        if self.initial.is_some() || self.finished {
            return None;
        }
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&self.slot.filter, &mut h);
        Some(ShareKey {
            cache: Arc::as_ptr(&self.cache.shared) as usize,
            format: self.format,
            bookmarks: self.bookmarks,
            filter: std::hash::Hasher::finish(&h),
        })
    }

    /// Takes `other` in when it is the same watch at the same place: the same cache, filter,
    /// media type and bookmarks, neither with initial events left, and the same events queued
    /// for both (nothing walked from the ring, nothing expired). From then on every frame
    /// this watcher drains is one `other` would have drained, so `other` is dropped (its
    /// registration with it) and its stream is served from this watcher's frames. Gives
    /// `other` back otherwise. Checked under the cache's state lock, which dispatch needs.
    pub fn absorb(&mut self, other: Watcher) -> Result<(), Watcher> {
        let alike = Arc::ptr_eq(&self.cache.shared, &other.cache.shared)
            && self.format == other.format
            && self.bookmarks == other.bookmarks
            && self.initial.is_none()
            && other.initial.is_none()
            && !self.finished
            && !other.finished
            && self.slot.filter == other.slot.filter;
        if !alike {
            return Err(other);
        }
        let same_place = {
            let _inner = self.cache.shared.inner.read();
            // Two slots at once: dispatch, the only other taker of more than one, is held
            // off by the state lock; and both watchers are this caller's.
            let a = self.slot.state.lock();
            let b = other.slot.state.lock();
            a.catchup.is_none()
                && b.catchup.is_none()
                && a.expired.is_none()
                && b.expired.is_none()
                && !b.bookmark_now
                && a.queue == b.queue
        };
        if !same_place {
            return Err(other);
        }
        // Both were given every matching event up to either's revision.
        self.synced = self.synced.max(other.synced);
        Ok(())
    }

    /// A watcher of the same watch registered at this one's place: every event after what
    /// this one has drained (a stream served from its frames leaving it to go at its own
    /// pace). 410 when the ring no longer reaches back there, 429 when the cache has
    /// `max_watchers`.
    pub fn fork(&self, now: Instant) -> Result<Watcher, ApiError> {
        let req = WatchRequest {
            namespace: None,
            selector: Selector::default(),
            start: WatchStart::Ahead(self.synced),
            bookmarks: self.bookmarks,
            format: self.format,
        };
        self.cache.register(self.slot.filter.clone(), &req, now)
    }

    /// A bookmark at everything delivered so far, e.g. just before a timeout ends the stream.
    /// None without bookmarks, once finished, or while initial events are still being sent
    /// (a bookmark then would tell the client it had a state it never got).
    pub fn final_bookmark(&mut self) -> Option<Bytes> {
        if !self.bookmarks || self.finished || self.initial.is_some() {
            return None;
        }
        let shared = &self.cache.shared;
        {
            let inner = shared.inner.read();
            if !self.slot.state.lock().has_work() {
                self.synced = self.synced.max(inner.revision);
            }
        }
        shared
            .encoder
            .bookmark(self.synced, false, self.format)
            .ok()
    }

    /// Queued positions and whether the watcher is walking the ring itself (tests).
    #[cfg(test)]
    pub(crate) fn backlog(&self) -> (usize, bool) {
        let st = self.slot.state.lock();
        (st.queue.len(), st.catchup.is_some())
    }

    /// Positions its queue holds before dispatch sends it walking (tests).
    #[cfg(test)]
    pub(crate) fn queue_room(&self) -> usize {
        self.slot.state.lock().queue.capacity()
    }

    fn finish(&mut self) {
        self.finished = true;
        self.next_bookmark = None;
        self.cache
            .shared
            .registry
            .lock()
            .remove(self.id, &self.slot);
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.cache
            .shared
            .registry
            .lock()
            .remove(self.id, &self.slot);
    }
}

/// An event a drain picked under the cache's lock: its frame, or the event itself when its
/// frame is still to be encoded.
enum Picked {
    Frame(Result<Bytes, ApiError>, Revision),
    Event(Arc<WatchCacheEvent>, EventType),
}

fn frame_estimate(ev: &WatchCacheEvent) -> usize {
    ev.object.json.len().saturating_add(48)
}

/// The future of [`Watcher::ready`].
#[derive(Debug)]
pub struct Ready {
    slot: Arc<WatcherSlot>,
    now: bool,
}

impl Future for Ready {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.now {
            return Poll::Ready(());
        }
        poll_slot(&self.slot, cx)
    }
}

fn poll_slot(slot: &WatcherSlot, cx: &Context<'_>) -> Poll<()> {
    let mut st = slot.state.lock();
    if st.has_work() {
        return Poll::Ready(());
    }
    if !st.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
        st.waker = Some(cx.waker().clone());
    }
    Poll::Pending
}
