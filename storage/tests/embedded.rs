//! The storage conformance suite, run against the embedded engine.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use svc_storage::EmbeddedStore;
use svc_storage::conformance::Subject;

#[path = "support/embedded.rs"]
mod support;
use support::config;

async fn subject() -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    Subject::new(store).keep_alive(dir)
}

svc_storage::store_conformance_tests!(subject);
