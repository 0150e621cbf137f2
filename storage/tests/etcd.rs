//! The storage conformance suite, run against a real etcd on loopback.
//!
//! Each test gets its own single-member etcd (fresh data directory, free ports), so the
//! tests that compact the whole store cannot disturb the others, and the process is killed
//! when the test's subject drops. Startup costs well under a second per test.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use svc_storage::conformance::Subject;
use svc_storage::etcd::testing::{EtcdCluster, ServerTls};
use svc_storage::{EtcdConfig, EtcdStore, EtcdTls, KeyRange, Store, StoreError};

async fn subject() -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let cluster = EtcdCluster::start(dir.path(), 1).await;
    let store = cluster.store("/etcd-test-prefix").await;
    // Dropped in order: the store, then etcd, then its directory.
    Subject::new(store).keep_alive(cluster).keep_alive(dir)
}

svc_storage::store_conformance_tests!(subject);

/// A CA, a serving certificate for 127.0.0.1 and a client certificate, as PEM files.
fn tls_files(dir: &Path) -> (ServerTls, EtcdTls) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let write = |name: &str, pem: String| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let ca_file = write("ca.crt", ca_cert.pem());
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        (
            write(&format!("{name}.crt"), cert.pem()),
            write(&format!("{name}.key"), key.serialize_pem()),
        )
    };
    let (server_cert, server_key) = leaf("server");
    let (client_cert, client_key) = leaf("client");
    (
        ServerTls {
            ca_file: ca_file.clone(),
            cert_file: server_cert,
            key_file: server_key,
        },
        EtcdTls {
            ca_file: Some(ca_file),
            cert_file: Some(client_cert),
            key_file: Some(client_key),
        },
    )
}

/// `--etcd-cafile/--etcd-certfile/--etcd-keyfile`: TLS with client certificates works for
/// writes, reads and the feed; without a client certificate etcd refuses the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = tls_files(dir.path());
    let cluster = EtcdCluster::start_tls(&dir.path().join("etcd"), 1, server, client.clone()).await;
    assert!(cluster.endpoints()[0].starts_with("https://"));
    let store = cluster.store("").await;
    let mut feed = store.watch(KeyRange::prefix("/tls/"), 0);
    let kv = store
        .create(Bytes::from("/tls/a"), Bytes::from("v"))
        .await
        .unwrap();
    let events = svc_storage::conformance::events_until(&mut feed, kv.mod_revision).await;
    assert_eq!(events.last().map(|e| e.kv.clone()), Some(kv.clone()));
    let (got, _) = store.get(Bytes::from("/tls/a"), None).await.unwrap();
    assert_eq!(got, Some(kv));

    let anonymous = EtcdStore::connect(EtcdConfig {
        endpoints: cluster.endpoints(),
        tls: Some(EtcdTls {
            cert_file: None,
            key_file: None,
            ..client
        }),
        request_timeout: Duration::from_secs(2),
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
    assert!(anonymous.health().await.is_err());
}

/// The leader requirement: a member cut off from its quorum refuses calls at once ("no
/// leader") instead of letting them wait out the request timeout (a linearizable read on a
/// leaderless member otherwise waits for a leader), so the store fails over quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_a_leader_refuses_calls_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = EtcdCluster::start(dir.path(), 3).await;
    let survivor = cluster.members[0].client_url();
    cluster.members[1].kill();
    cluster.members[2].kill();
    let request_timeout = Duration::from_secs(5);
    let store = EtcdStore::connect(EtcdConfig {
        endpoints: vec![survivor],
        request_timeout,
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
    // The survivor gives up on its leader within an election timeout (500 ms in tests); until
    // then reads may still succeed.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let started = std::time::Instant::now();
        let result = store.get(Bytes::from("/leader/k"), None).await;
        match result {
            Err(StoreError::Unavailable(message)) if message.contains("no leader") => {
                assert!(
                    started.elapsed() < request_timeout / 2,
                    "{:?}",
                    started.elapsed()
                );
                return;
            }
            other => assert!(
                std::time::Instant::now() < deadline,
                "the member kept answering without a leader: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
