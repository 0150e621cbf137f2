//! The storage conformance suite: one set of tests every `Store` must pass (crate feature
//! `conformance`). A new backend is done when it passes the suite.
//!
//! Run it for a backend with [`store_conformance_tests!`](crate::store_conformance_tests),
//! given an async factory of [`Subject`]s, one fresh per test:
//!
//! ```ignore
//! svc_storage::store_conformance_tests!(|| async {
//!     let dir = tempfile::tempdir().unwrap();
//!     let store = MyStore::open(dir.path()).unwrap();
//!     svc_storage::conformance::Subject::new(store).keep_alive(dir)
//! });
//! ```
//!
//! Each test function is also public (`conformance::kv::*`, `conformance::watch::*`,
//! `conformance::ttl::*`) to be called directly. Tests only touch keys under the subject's
//! unique prefix and only assert relations between their own revisions, so they can share
//! one etcd cluster, EXCEPT the ones named `compaction*`/`watch_from_compacted_revision_fails`, which compact the whole
//! store. Progress tests need the backend's progress interval to be short (well under 10 s).
//! The crate using the macro needs `tokio` (with `macros` and `rt-multi-thread`) as a
//! dev-dependency.
// Test support, compiled only with the `conformance` feature: a panic is how a check fails,
// and arithmetic and indexing are on the suite's own small data.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

pub mod kv;
pub mod ttl;
pub mod watch;

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;

use crate::{Event, FeedItem, FeedStream, KeyRange, Revision, Store, StoreError};

/// How long any single wait of the suite may take before the test fails. Generous: it only
/// bounds a hung test, it asserts nothing about speed.
pub const WAIT: Duration = Duration::from_secs(20);

/// A store under test plus whatever must live as long as it (e.g. its temp directory).
pub struct Subject {
    // Fields drop in order: the store before the guards it may still need while closing.
    pub store: Arc<dyn Store>,
    /// Every key a test writes starts with this (unique per subject).
    pub prefix: String,
    keep_alive: Vec<Box<dyn Any + Send>>,
}

impl Subject {
    pub fn new(store: Arc<dyn Store>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("/conformance/{}-{nanos}-{n}/", std::process::id());
        Subject {
            store,
            prefix,
            keep_alive: Vec::new(),
        }
    }

    /// Keeps `guard` alive as long as the subject (dropped after the store handle).
    pub fn keep_alive(mut self, guard: impl Any + Send) -> Self {
        self.keep_alive.push(Box::new(guard));
        self
    }

    /// The full key for a test-local name.
    pub fn key(&self, name: &str) -> Bytes {
        Bytes::from(format!("{}{name}", self.prefix))
    }

    /// Every key of this subject.
    pub fn range(&self) -> KeyRange {
        KeyRange::prefix(self.prefix.clone())
    }

    /// Keys under a test-local sub-prefix.
    pub fn sub_range(&self, name: &str) -> KeyRange {
        KeyRange::prefix(self.key(name))
    }
}

/// Expands to one `#[tokio::test]` per conformance test, each on a fresh subject from
/// `$factory` (an expression callable as `$factory().await -> Subject`).
#[macro_export]
macro_rules! store_conformance_tests {
    ($factory:expr) => {
        $crate::store_conformance_tests!(@each $factory;
            kv::create_and_already_exists,
            kv::health_and_current_reads,
            kv::update_compare_and_swap,
            kv::delete_with_and_without_expected,
            kv::revisions_strictly_increase_across_keys,
            kv::reads_at_past_revisions,
            kv::range_limit_and_more,
            kv::prefix_ranges_do_not_leak,
            kv::future_revision_is_refused,
            kv::compaction_discards_history_keeps_state,
            kv::concurrent_writers_get_unique_revisions,
            watch::watch_from_zero_sees_everything_in_order,
            watch::watch_resumes_exactly_from_the_middle,
            watch::watch_is_filtered_by_range,
            watch::watch_delivers_live_events,
            watch::events_carry_prev_kv,
            watch::progress_arrives_when_idle,
            watch::watch_from_compacted_revision_fails,
            watch::concurrent_writers_all_seen_in_order,
            ttl::ttl_keys_expire_with_a_delete_event,
            ttl::ttl_follows_the_latest_write,
        );
    };
    (@each $factory:expr; $($module:ident :: $name:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let subject = ($factory)().await;
                $crate::conformance::$module::$name(&subject).await;
            }
        )*
    };
}

/// Fails the test if `fut` takes longer than [`WAIT`].
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

/// Reads the feed until an event with revision >= `until` arrived; returns all events.
/// Progress items are skipped; an error item fails the test.
pub async fn events_until(feed: &mut FeedStream, until: Revision) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    within(&format!("events up to revision {until}"), async {
        while events.last().is_none_or(|e| e.revision() < until) {
            match feed.next().await {
                Some(Ok(FeedItem::Events(batch))) => {
                    assert!(!batch.is_empty(), "feed delivered an empty Events item");
                    events.extend(batch);
                }
                Some(Ok(FeedItem::Progress(_))) => {}
                Some(Err(err)) => panic!("feed failed: {err}"),
                None => panic!("feed ended before revision {until}"),
            }
        }
    })
    .await;
    events
}

/// Asserts the events are in strictly increasing revision order.
pub fn assert_ordered(events: &[Event]) {
    for pair in events.windows(2) {
        assert!(
            pair[0].revision() < pair[1].revision(),
            "feed out of order: {} then {}",
            pair[0].revision(),
            pair[1].revision()
        );
    }
}

/// Unwraps a store call, naming the step in the failure.
pub fn ok<T>(what: &str, result: Result<T, StoreError>) -> T {
    match result {
        Ok(value) => value,
        Err(err) => panic!("{what} failed: {err}"),
    }
}
