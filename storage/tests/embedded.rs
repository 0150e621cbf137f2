//! The storage conformance suite, run against the embedded engine.

use std::time::Duration;

use svc_storage::conformance::Subject;
use svc_storage::{AutoCompaction, EmbeddedConfig, EmbeddedStore};

fn config() -> EmbeddedConfig {
    EmbeddedConfig {
        progress_interval: Duration::from_millis(50),
        auto_compaction: AutoCompaction::Disabled,
        ..EmbeddedConfig::default()
    }
}

async fn subject() -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    Subject::new(store).keep_alive(dir)
}

svc_storage::store_conformance_tests!(subject);
