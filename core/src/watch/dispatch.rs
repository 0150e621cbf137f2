//! The watcher registry and event dispatch (the fan-out half of Kubernetes' `cacher.go`).
//!
//! Watchers are indexed by namespace, by namespace and name for single-object watches, by a
//! field their selector pins to a value (`spec.nodeName=node-1`: every kubelet watches its
//! own pods so), plus one bucket for watches across all namespaces, so dispatching an event
//! visits only the watchers that could match it: O(matching), never O(all watchers).
//!
//! Dispatch pushes no frames. It appends one `u64` (the event's sequence number and the event
//! type this watcher sees) to the watcher's queue and wakes it; the watcher resolves those
//! positions against the shared ring when it drains and takes the shared frames. A queue
//! that reaches its limit is not an error: it is dropped and replaced by a cursor interval
//! over the ring (`catchup`), which the watcher walks itself. So a watcher costs at most
//! `watcher_queue_limit * 8` bytes whatever it does, and it ends (410) only when the ring
//! moves past its position. Such lagging watchers sit in an ordered set by position, so the
//! eviction that overruns them finds them in O(log n) and wakes them with the news.
//!
//! Dispatch allocates nothing per event once warm: it never grows a queue (one that is full
//! overflows into the walk above, and the watcher doubles its own queue, up to the limit, when
//! it has walked), the cache keeps its wake list from event to event, and the wake gate keeps
//! its slots. It runs on the caches' ingest thread, where what the cache keeps is allocated;
//! short-lived blocks among those would leave pages resident after a load.
//!
//! Locks: the cache's state lock, then this registry's mutex, then one watcher's slot mutex;
//! always in that order. Watchers draining take only the state lock (shared) and their own
//! slot, never the registry, so thousands of them do not contend with one another.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::task::Waker;

use parking_lot::Mutex;
use svc_storage::Revision;

use super::frames::FrameFormat;
use super::history::WatchCacheEvent;
use super::interval::WatchCacheInterval;
use super::wakes::Wakeup;
use super::watcher::{Bucket, WatchFilter};

/// What one watcher shares with the dispatcher. Kept small: this is the per-watcher cost.
#[derive(Debug)]
pub(crate) struct WatcherSlot {
    pub(crate) filter: WatchFilter,
    pub(crate) state: Mutex<SlotState>,
}

#[derive(Debug, Default)]
pub(crate) struct SlotState {
    /// Positions of matching events not yet drained: `seq << 2 | event type`.
    pub(crate) queue: VecDeque<u64>,
    /// Events to walk (and filter) before the queue: resumed history or an overflowed queue.
    pub(crate) catchup: Option<WatchCacheInterval>,
    /// The key this watcher is filed under in `Registry::lagging`, if it is.
    pub(crate) lagging_key: Option<u64>,
    pub(crate) waker: Option<Waker>,
    /// The task group the waker belongs to (`Watcher::set_wake_group`: an h2 connection,
    /// whose task drives all its watches); 0 for none. The gate wakes a group's watchers
    /// together, so their connection runs once for all of them.
    pub(crate) group: u64,
    /// The media type it is served in (`FrameFormat::index`): dispatch reports which frames
    /// its watchers will need. Kept here, beside what dispatch touches anyway.
    pub(crate) format: u8,
    /// Set when the ring moved past this watcher (or the cache was relisted): the oldest
    /// revision a watch may resume from, for the 410 message.
    pub(crate) expired: Option<Revision>,
    /// A bookmark is owed now, not at the watcher's next interval: the cache was resynced,
    /// and a client should hold the new revision before anything asks it to resume.
    pub(crate) bookmark_now: bool,
}

impl SlotState {
    /// Whether a drain would produce something now.
    pub(crate) fn has_work(&self) -> bool {
        !self.queue.is_empty()
            || self.catchup.is_some()
            || self.expired.is_some()
            || self.bookmark_now
    }

    fn expire(&mut self, oldest: Revision, wake: &mut Vec<Wakeup>) {
        self.expired = Some(oldest);
        self.queue = VecDeque::new();
        self.catchup = None;
        if let Some(w) = self.waker.take() {
            wake.push((self.group, w));
        }
    }

    /// The sequence number of the oldest event this watcher still needs, if any.
    fn oldest_needed(&self) -> Option<u64> {
        match &self.catchup {
            Some(c) => Some(c.position()),
            None => self.queue.front().map(|p| p >> 2),
        }
    }
}

/// Positions a new watcher's queue holds before it first falls back to walking the ring.
/// Dispatch never grows a queue (it runs on the caches' ingest thread, whose long-lived
/// allocations short-lived ones would scatter, and it is the hot loop); a watcher that had to
/// walk doubles its own queue, up to `watcher_queue_limit`, on its own thread.
pub(crate) const QUEUE_START: usize = 8;

/// The bit of one (event type, format) frame in `dispatch`'s answer.
pub(crate) fn frame_bit(ty: super::EventType, format: FrameFormat) -> u16 {
    frame_bit_at(ty, format.index() as u8)
}

fn frame_bit_at(ty: super::EventType, format: u8) -> u16 {
    let i = (ty as u32)
        .wrapping_mul(FrameFormat::ALL.len() as u32)
        .wrapping_add(u32::from(format));
    1u16.checked_shl(i).unwrap_or(0)
}

pub(crate) fn pack(seq: u64, ty: super::EventType) -> u64 {
    (seq << 2) | ty as u64
}

#[derive(Debug)]
struct Entry {
    slot: Arc<WatcherSlot>,
    /// Index in its bucket's list, kept up to date by swap-removes.
    pos: usize,
}

#[derive(Debug, Default)]
struct NsBucket {
    watchers: Vec<u32>,
    by_name: HashMap<Box<str>, Vec<u32>>,
}

/// Every registered watcher, indexed for dispatch. Ids are slots in `entries`, reused.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    entries: Vec<Option<Entry>>,
    free: Vec<u32>,
    len: usize,
    all: Vec<u32>,
    by_ns: HashMap<Box<str>, NsBucket>,
    /// Watchers by pinned field, then value.
    by_field: HashMap<Box<str>, HashMap<Box<str>, Vec<u32>>>,
    /// Watchers walking the ring themselves, by the position they need (possibly stale low).
    lagging: BTreeSet<(u64, u32)>,
    /// Watchers examined by dispatch since the cache was made (a test and a metric).
    pub(crate) visits: u64,
}

impl Registry {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn insert(&mut self, slot: Arc<WatcherSlot>) -> u32 {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.entries.push(None);
                // Bounded by `max_watchers`, checked by the caller, far below u32::MAX.
                u32::try_from(self.entries.len().saturating_sub(1)).unwrap_or(u32::MAX)
            }
        };
        let list = self.bucket_mut(slot.filter.bucket());
        list.push(id);
        let pos = list.len().saturating_sub(1);
        {
            let mut st = slot.state.lock();
            if let Some(c) = &st.catchup {
                self.lagging.insert((c.position(), id));
                st.lagging_key = Some(c.position());
            }
        }
        if let Some(e) = self.entries.get_mut(id as usize) {
            *e = Some(Entry { slot, pos });
        }
        self.len = self.len.saturating_add(1);
        id
    }

    fn bucket_mut(&mut self, bucket: Bucket<'_>) -> &mut Vec<u32> {
        match bucket {
            Bucket::All => &mut self.all,
            Bucket::Namespace(ns) => &mut self.by_ns.entry(ns.into()).or_default().watchers,
            Bucket::Name(ns, name) => self
                .by_ns
                .entry(ns.into())
                .or_default()
                .by_name
                .entry(name.into())
                .or_default(),
            Bucket::Field(field, value) => self
                .by_field
                .entry(field.into())
                .or_default()
                .entry(value.into())
                .or_default(),
        }
    }

    /// Unregisters watcher `id` if it is still `slot` (ids are reused after removal).
    pub(crate) fn remove(&mut self, id: u32, slot: &Arc<WatcherSlot>) {
        let registered = self
            .entries
            .get(id as usize)
            .and_then(Option::as_ref)
            .is_some_and(|e| Arc::ptr_eq(&e.slot, slot));
        if registered {
            self.remove_id(id);
        }
    }

    fn remove_id(&mut self, id: u32) {
        let Some(entry) = self.entries.get_mut(id as usize).and_then(Option::take) else {
            return;
        };
        self.len = self.len.saturating_sub(1);
        self.free.push(id);
        if let Some(key) = entry.slot.state.lock().lagging_key.take() {
            self.lagging.remove(&(key, id));
        }
        let bucket = entry.slot.filter.bucket();
        let moved = {
            let list = self.bucket_mut(bucket);
            if entry.pos < list.len() {
                list.swap_remove(entry.pos);
                list.get(entry.pos).copied()
            } else {
                None
            }
        };
        if let Some(Some(e)) = moved.and_then(|m| self.entries.get_mut(m as usize)) {
            e.pos = entry.pos;
        }
        // Empty buckets are dropped so that churn over many namespaces leaves nothing behind.
        if let Bucket::Field(field, value) = bucket
            && let Some(values) = self.by_field.get_mut(field)
        {
            if values.get(value).is_some_and(Vec::is_empty) {
                values.remove(value);
            }
            if values.is_empty() {
                self.by_field.remove(field);
            }
        }
        if let Bucket::Namespace(ns) | Bucket::Name(ns, _) = bucket
            && let Some(b) = self.by_ns.get_mut(ns)
        {
            if let Bucket::Name(_, name) = bucket
                && b.by_name.get(name).is_some_and(Vec::is_empty)
            {
                b.by_name.remove(name);
            }
            if b.watchers.is_empty() && b.by_name.is_empty() {
                self.by_ns.remove(ns);
            }
        }
    }

    /// Queues `event` for every watcher it concerns and collects the wakers to call once
    /// the locks are released; returns the frames (`frame_bit` of type and format) those
    /// watchers will need. `ring_first_seq`/`oldest` describe the ring before this
    /// event's eviction pass: a visited watcher whose oldest needed event is already gone is
    /// expired here, so a stalled watcher is found by the next event it would have received.
    pub(crate) fn dispatch(
        &mut self,
        event: &WatchCacheEvent,
        ring_first_seq: u64,
        oldest: Revision,
        queue_limit: usize,
        wake: &mut Vec<Wakeup>,
    ) -> u16 {
        let mut frames = 0u16;
        let mut expired: Vec<u32> = Vec::new();
        {
            let Registry {
                entries,
                all,
                by_ns,
                by_field,
                lagging,
                visits,
                ..
            } = self;
            let ns = by_ns.get(&*event.object.namespace);
            let named = ns.and_then(|b| b.by_name.get(&*event.object.name));
            // Watchers of the pinned values the object has now and had before (one that
            // stops matching is told with a DELETED).
            let mut pinned: Vec<&[u32]> = Vec::new();
            for (field, values) in by_field.iter() {
                let now = event.object.field(field).unwrap_or("");
                pinned.extend(values.get(now).map(Vec::as_slice));
                if let Some(before) = event.prev.as_deref().map(|p| p.field(field).unwrap_or(""))
                    && before != now
                {
                    pinned.extend(values.get(before).map(Vec::as_slice));
                }
            }
            let lists = [
                Some(all.as_slice()),
                ns.map(|b| b.watchers.as_slice()),
                named.map(Vec::as_slice),
            ];
            for &id in lists.into_iter().flatten().chain(pinned).flatten() {
                // A statistic: wrapping costs nothing in the fan-out loop.
                *visits = visits.wrapping_add(1);
                let Some(Some(entry)) = entries.get(id as usize) else {
                    continue;
                };
                let Some(ty) = entry.slot.filter.transition_in_bucket(event) else {
                    continue;
                };
                let mut st = entry.slot.state.lock();
                if st.expired.is_some() {
                    continue;
                }
                if st.oldest_needed().is_some_and(|s| s < ring_first_seq) {
                    st.expire(oldest, wake);
                    expired.push(id);
                    continue;
                }
                // The queue never grows here: growing it is the watcher's (`QUEUE_START`).
                if st.queue.len() >= queue_limit.min(st.queue.capacity()) {
                    overflow(&mut st, id, event.seq, lagging);
                } else {
                    st.queue.push_back(pack(event.seq, ty));
                }
                frames |= frame_bit_at(ty, st.format);
                if let Some(w) = st.waker.take() {
                    wake.push((st.group, w));
                }
            }
        }
        for id in expired {
            self.remove_id(id);
        }
        frames
    }

    /// Ends the lagging watchers whose position the ring has just dropped (`first_seq` is
    /// the ring's new first sequence number), re-filing the others under their real position.
    pub(crate) fn expire_lagging(
        &mut self,
        first_seq: u64,
        oldest: Revision,
        wake: &mut Vec<Wakeup>,
    ) {
        let mut expired = Vec::new();
        while let Some(&(key, id)) = self.lagging.first() {
            if key >= first_seq {
                break;
            }
            self.lagging.pop_first();
            let Some(Some(entry)) = self.entries.get(id as usize) else {
                continue;
            };
            let mut st = entry.slot.state.lock();
            st.lagging_key = None;
            match st.oldest_needed() {
                Some(s) if s < first_seq => {
                    st.expire(oldest, wake);
                    expired.push(id);
                }
                Some(s) if st.catchup.is_some() => {
                    self.lagging.insert((s, id));
                    st.lagging_key = Some(s);
                }
                _ => {}
            }
        }
        for id in expired {
            self.remove_id(id);
        }
    }

    /// Owes every watcher a bookmark now (`SlotState::bookmark_now`), and wakes it for it.
    pub(crate) fn bookmark_all(&mut self, wake: &mut Vec<Wakeup>) {
        for entry in self.entries.iter().flatten() {
            let mut st = entry.slot.state.lock();
            st.bookmark_now = true;
            if let Some(w) = st.waker.take() {
                wake.push((st.group, w));
            }
        }
    }

    /// Ends every watcher (the cache was relisted: its history no longer connects).
    pub(crate) fn expire_all(&mut self, oldest: Revision, wake: &mut Vec<Wakeup>) {
        for entry in self.entries.iter().flatten() {
            entry.slot.state.lock().expire(oldest, wake);
        }
        *self = Registry {
            visits: self.visits,
            ..Registry::default()
        };
    }
}

/// The queue is full: replace it with an interval over the ring covering everything it held
/// and the event at `seq`, and file the watcher as lagging.
fn overflow(st: &mut SlotState, id: u32, seq: u64, lagging: &mut BTreeSet<(u64, u32)>) {
    match &mut st.catchup {
        Some(c) => c.extend_to(seq.saturating_add(1)),
        None => {
            let start = st.queue.front().map_or(seq, |p| p >> 2);
            st.catchup = Some(WatchCacheInterval::new(start, seq.saturating_add(1)));
        }
    }
    st.queue.clear();
    if st.lagging_key.is_none()
        && let Some(c) = &st.catchup
    {
        lagging.insert((c.position(), id));
        st.lagging_key = Some(c.position());
    }
}
