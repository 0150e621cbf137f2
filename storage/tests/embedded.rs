//! The storage conformance suite, run against the embedded engine.

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
