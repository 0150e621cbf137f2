//! The watch cache: one per resource type, fed by a change feed (the store's, or in proxy mode
//! the upstream's watch), serving every list and watch from memory. Sans-IO: the gateway owns
//! the fill loop, the tasks and the sockets; this module owns the data structures and says who
//! is ready for what.
//!
//! The split mirrors the Kubernetes cacher:
//!
//! | file | Kubernetes | holds |
//! |---|---|---|
//! | [`cache`] | `watch_cache.go`, ingest half of `cacher.go` | [`WatchCache`]: state, apply, resync, prune |
//! | `cache/read.rs` | `watch_cache.go` reads | snapshots of the state, lists, gets, initial events |
//! | [`snapshots`] | `watch_cache.go` snapshots | [`Snapshot`], the list-snapshot ring |
//! | [`history`] | `watch_cache.go` ring | [`WatchCacheEvent`], the history ring |
//! | [`interval`] | `watch_cache_interval.go` | [`WatchCacheInterval`], an overrunnable cursor |
//! | [`dispatch`] | fan-out half of `cacher.go` | the watcher index (namespace, name, a pinned field) and dispatch |
//! | [`watcher`] | `cache_watcher.go` | [`Watcher`]: filter, transitions, drain, bookmarks |
//! | [`frames`] | `caching_object.go` | frames encoded once per event and format |
//! | [`cached`] | `storeElement` | [`CachedObject`], [`KindCodec`], [`Selector`] |
//! | [`waiters`] | `waitUntilFreshAndBlock` | [`RevisionWait`]: resolves once the cache reaches a revision |
//! | [`settings`] | the cacher's configuration | [`WatchCacheConfig`]: every bound |
//! | [`wakes`] | (none) | [`WakeGate`]: watcher wake-ups paced in slices under load |
//! | [`unstructured`] | `unstructured.go` | the codec of kinds described at run time (proxy mode) |
//!
//! # Fan-out: cursors with a per-watcher index, not pushed frames
//!
//! Pushing frames into per-watcher queues (Kubernetes' design) costs memory per watcher that
//! grows with its backlog, and needs a policy for full queues that either blocks the writer
//! or drops watchers early. Pure cursors (each watcher walks the shared ring and filters) cost
//! nothing per watcher but make every wake-up walk every event since the last one: with
//! 10,000 watchers in 10,000 namespaces that is O(all events) per watcher, O(watchers ×
//! events) overall.
//!
//! So this cache does both halves of each: the ring is the only owner of events and frames
//! (frames are encoded once per event and format and shared as `Bytes`), and dispatch, which
//! finds the interested watchers through a namespace/name index in O(matching), appends to
//! each one only a `u64` (sequence number and event type) and wakes it. A woken watcher
//! resolves those positions against the ring and takes the shared frames in one batch, up to
//! a byte budget, for one coalesced write. When a watcher's index queue reaches its bound it
//! is dropped and replaced by a cursor interval over the ring, which the watcher walks and
//! filters itself (and then doubles its own queue, up to the bound: dispatch never grows one);
//! it ends with a 410 `ERROR` frame only when the ring moves past its position. Hence:
//! - ingest cost per event: O(log n) state update + O(matching watchers);
//! - memory per watcher: a few hundred bytes idle, at most `watcher_queue_limit × 8` bytes
//!   busy or stalled; the events themselves are bounded by the ring's age, bytes and count;
//! - a stalled client never blocks ingest or other watchers, and never pins old events.
//!
//! # How the gateway drives it
//!
//! - **Ingest task** (one per type; in the gateway all of them on one thread):
//!   `store.range(prefix)` then [`WatchCache::replace`]; then `store.watch(prefix, revision)`
//!   and [`WatchCache::apply`] for each feed item (progress items too); [`WatchCache::prune`]
//!   on a timer when the feed is idle; on a feed error, relist and `replace` again. Proxy mode's
//!   caches are fed from an upstream list and watch instead, and a relist after a 410 goes
//!   through [`WatchCache::resync`], which sends the differences as events.
//! - **List**: for "Most Recent" reads, read the store's current revision and await
//!   [`WatchCache::wait_for_revision`] (with a timeout: 504); then [`WatchCache::list`] at
//!   `None` (current) or `Some(rev)` (Exact, continue tokens). Items carry their canonical
//!   JSON for splicing into the response.
//! - **Pacer task** (one per gateway): caches built with [`WatchCache::with_gate`] share a
//!   [`WakeGate::paced`] gate; the task awaits [`WakeGate::pace`] and calls
//!   [`WakeGate::release`] (one slice of deferred watcher wake-ups) until it returns 0,
//!   yielding to the runtime after each slice. [`WatchCache::new`] wakes every watcher at once.
//! - **Watch**: [`WatchCache::watch`] returns a [`Watcher`], which no task of its own serves:
//!   whoever serves the connection polls it (an HTTP/1.1 response body, or an h2 connection's
//!   task, which polls every watch of the connection and names itself their wake group with
//!   [`Watcher::set_wake_group`]). Woken through [`Watcher::ready`], or by its server's timer
//!   at [`Watcher::next_bookmark_at`], it [`Watcher::drain`]s a batch of shared frames, written
//!   as one chunk; at the request's timeout its server writes [`Watcher::final_bookmark`] and
//!   ends it; it stops when `finished`.

pub mod cache;
pub mod cached;
pub mod dispatch;
pub mod frames;
pub mod history;
pub mod interval;
pub mod settings;
pub mod shared_list;
pub mod snapshots;
pub mod unstructured;
pub mod waiters;
pub mod wakes;
pub mod watcher;

#[cfg(test)]
mod tests;

pub use cache::{ApplyReport, ListRequest, WatchCache, WatchCacheStats};
pub use cached::{CachedObject, KindCodec, Selector};
pub use frames::{FrameFormat, FrameStats, MetaGroup};
pub use history::{EventType, Overrun, WatchCacheEvent};
pub use interval::WatchCacheInterval;
pub use settings::WatchCacheConfig;
pub use shared_list::{ListMedia, SharedLists};
pub use snapshots::{ListResult, Snapshot, State};
pub use waiters::RevisionWait;
pub use wakes::{Backlog, WakeGate};
pub use watcher::{Drain, Ready, ShareKey, WatchFilter, WatchRequest, WatchStart, Watcher};
