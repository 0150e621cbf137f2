//! The storage conformance suite, run against a real etcd on loopback.
//!
//! Each test gets its own single-member etcd (fresh data directory, free ports), so the
//! tests that compact the whole store cannot disturb the others, and the process is killed
//! when the test's subject drops. Startup costs well under a second per test.

use svc_storage::conformance::Subject;
use svc_storage::etcd::testing::EtcdCluster;

async fn subject() -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let cluster = EtcdCluster::start(dir.path(), 1).await;
    let store = cluster.store("/etcd-test-prefix").await;
    // Dropped in order: the store, then etcd, then its directory.
    Subject::new(store).keep_alive(cluster).keep_alive(dir)
}

svc_storage::store_conformance_tests!(subject);
