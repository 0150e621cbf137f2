//! svc-storage: the `Store` contract (an etcd-v3-shaped revisioned key-value store) and its backends.
//!
//! Every write is one revision of a single, strictly increasing counter; that revision becomes
//! the object's `resourceVersion` higher up. Writes are compare-and-swap on a key's
//! `mod_revision`, reads can be at the current or at a past (not yet compacted) revision, and
//! every committed change comes back out of an ordered, gap-free change feed. A write may give
//! its key a time to live (`create_with_ttl`, `update_with_ttl`), after which the store deletes
//! the key itself, as etcd does with the keys of an expired lease.
//!
//! The contract alone (this module and [`StoreError`]) needs no backend: crates that only
//! consume a `Store`, such as svc-core, depend on this crate with `default-features = false`.
//! Each backend is a cargo feature, both on by default:
//!
//! - `embedded`: `EmbeddedStore` (one data directory on redb, see `embedded`), the server's
//!   default backend;
//! - `etcd`: `EtcdStore` (an etcd v3 cluster over gRPC, see `etcd`), with an etcd client whose
//!   code is generated ahead of time, so building it needs no `protoc`.
//!
//! With the `conformance` feature, `conformance` holds the test suite every backend runs
//! (`storage/tests/embedded.rs`, `storage/tests/etcd.rs`); a new backend is done when it
//! passes. Anything else implementing [`Store`] could run it too; the watch cache in svc-core
//! does not implement `Store` and has its own tests.
//!
//! **Invariant:** this crate knows bytes, keys and revisions, never objects or HTTP.

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "embedded")]
pub mod embedded;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;

#[cfg(feature = "embedded")]
pub use embedded::{AutoCompaction, EmbeddedConfig, EmbeddedStats, EmbeddedStore};
pub use error::StoreError;
#[cfg(feature = "etcd")]
pub use etcd::{EtcdConfig, EtcdStore, EtcdTls};

use std::pin::Pin;
use std::time::Duration;

/// Deadlines without the panic of `Instant + Duration` on overflow: a duration too large to
/// add (a huge configured interval) means about a century from now, i.e. never.
#[cfg(any(feature = "embedded", feature = "etcd"))]
pub(crate) trait Later: Copy {
    fn checked(self, after: Duration) -> Option<Self>;

    fn later(self, after: Duration) -> Self {
        const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        self.checked(after)
            .or_else(|| self.checked(CENTURY))
            .unwrap_or(self)
    }
}

#[cfg(any(feature = "embedded", feature = "etcd"))]
impl Later for std::time::Instant {
    fn checked(self, after: Duration) -> Option<Self> {
        self.checked_add(after)
    }
}

#[cfg(any(feature = "embedded", feature = "etcd"))]
impl Later for tokio::time::Instant {
    fn checked(self, after: Duration) -> Option<Self> {
        self.checked_add(after)
    }
}

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;

/// A point in the store's history: the global write counter (etcd's `revision`).
/// Revision 0 never holds data; the first write is revision 1.
pub type Revision = i64;

/// One key and its latest (or at-revision) value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Bytes,
    pub value: Bytes,
    /// Revision of the write that created this incarnation of the key.
    pub create_revision: Revision,
    /// Revision of the last write to the key (the object's resourceVersion).
    pub mod_revision: Revision,
    /// Number of writes to this incarnation of the key, starting at 1.
    pub version: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// A committed change, as the change feed delivers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// For `Put`, the new key-value. For `Delete`, the key with an empty value,
    /// `mod_revision` = the revision of the delete, and `create_revision`/`version` = 0.
    pub kv: KeyValue,
    /// The key-value just before this event (None for a create).
    pub prev_kv: Option<KeyValue>,
}

impl Event {
    pub fn revision(&self) -> Revision {
        self.kv.mod_revision
    }
}

/// One item of the change feed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FeedItem {
    /// Committed events, in revision order, gap-free with respect to the watched prefix.
    Events(Vec<Event>),
    /// Nothing under the watched prefix changed up to and including this revision.
    Progress(Revision),
}

/// The result of a range read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeResult {
    /// Matching key-values in key order.
    pub kvs: Vec<KeyValue>,
    /// The revision the read was served at.
    pub revision: Revision,
    /// True when `limit` cut the result short.
    pub more: bool,
}

pub type FeedStream = Pin<Box<dyn Stream<Item = Result<FeedItem, StoreError>> + Send>>;

/// A range of keys `[start, end)`; `end` empty means "to the end of the key space".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub start: Bytes,
    pub end: Bytes,
}

impl KeyRange {
    /// Every key that starts with `prefix` (etcd's `WithPrefix`).
    pub fn prefix(prefix: impl Into<Bytes>) -> Self {
        let start: Bytes = prefix.into();
        let mut end = start.to_vec();
        while let Some(last) = end.last_mut() {
            if let Some(next) = last.checked_add(1) {
                *last = next;
                break;
            }
            end.pop();
        }
        KeyRange {
            start,
            end: Bytes::from(end),
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        key >= &self.start[..] && (self.end.is_empty() || key < &self.end[..])
    }
}

/// The storage contract. Implemented by the embedded engine and etcd.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Creates `key` if absent. Fails with `AlreadyExists` otherwise. Durable when it returns.
    async fn create(&self, key: Bytes, value: Bytes) -> Result<KeyValue, StoreError>;

    /// Replaces `key`'s value if its `mod_revision` equals `expected`, removing any time to
    /// live the key had (see `create_with_ttl`). `NotFound` if absent, `Conflict` (with the
    /// current key-value) if the revision differs.
    async fn update(
        &self,
        key: Bytes,
        value: Bytes,
        expected: Revision,
    ) -> Result<KeyValue, StoreError>;

    /// `create` of a key that expires: once `ttl` has passed, the store deletes it on its own
    /// with an ordinary revisioned delete (a `Delete` event in every feed, `prev_kv` set), as
    /// etcd deletes the keys of an expired lease. Expiry is never early and may be late by the
    /// backend's granularity: etcd's backend shares one lease among keys expiring close
    /// together (up to `ttl / 20`, at most a minute, later than asked, as Kubernetes' lease
    /// manager does); the embedded engine keeps each key's own deadline. Nothing scans the
    /// store to find expired keys.
    ///
    /// The time to live belongs to the write, as an etcd lease belongs to a put: a later
    /// `update_with_ttl` replaces it (counting from that update), a plain `update` removes it
    /// (the key then stays until deleted), and a delete ends it.
    async fn create_with_ttl(
        &self,
        key: Bytes,
        value: Bytes,
        ttl: Duration,
    ) -> Result<KeyValue, StoreError>;

    /// `update` that gives the key a time to live of `ttl` from now, replacing any it had
    /// (see `create_with_ttl`).
    async fn update_with_ttl(
        &self,
        key: Bytes,
        value: Bytes,
        expected: Revision,
        ttl: Duration,
    ) -> Result<KeyValue, StoreError>;

    /// Deletes `key`, if `expected` is given only when its `mod_revision` equals it.
    /// Returns the deleted key-value and the revision of the delete.
    async fn delete(
        &self,
        key: Bytes,
        expected: Option<Revision>,
    ) -> Result<(KeyValue, Revision), StoreError>;

    /// Reads one key at `at` (None = current). `Compacted` / `FutureRevision` as for `range`.
    async fn get(
        &self,
        key: Bytes,
        at: Option<Revision>,
    ) -> Result<(Option<KeyValue>, Revision), StoreError>;

    /// Reads `range` at revision `at` (None = current), at most `limit` keys (0 = no limit).
    /// `Compacted` if `at` is older than the compaction point, `FutureRevision` if newer than
    /// the current revision.
    async fn range(
        &self,
        range: KeyRange,
        at: Option<Revision>,
        limit: usize,
    ) -> Result<RangeResult, StoreError>;

    /// The current (latest committed) revision.
    async fn current_revision(&self) -> Result<Revision, StoreError>;

    /// The revision below which history is gone (reads and feeds before it fail `Compacted`).
    async fn compacted_revision(&self) -> Result<Revision, StoreError>;

    /// Discards history older than `revision`, keeping each key's state as of `revision`.
    /// `FutureRevision` if `revision` is newer than the current revision; compacting at or
    /// below the current compaction point succeeds and changes nothing.
    async fn compact(&self, revision: Revision) -> Result<(), StoreError>;

    /// An ordered, gap-free feed of every event in `range` with revision > `after`, followed by
    /// live events as they commit, with `Progress` items when idle (at least every
    /// `progress_interval` of the backend). Fails with `Compacted` (as the first item) if
    /// events after `after` have been compacted away, i.e. if `after` is below the compacted
    /// revision. After an error item the feed ends; it also ends (`None`) when the store
    /// is closed.
    fn watch(&self, range: KeyRange, after: Revision) -> FeedStream;

    /// Checks that the backend can serve reads (used by `/livez` and `/readyz`).
    async fn health(&self) -> Result<(), StoreError>;

    /// Checks that the backend can serve reads and writes (used by `/readyz` only): a store
    /// whose last commit failed, e.g. on a full disk, is alive but not ready.
    async fn ready(&self) -> Result<(), StoreError> {
        self.health().await
    }
}
