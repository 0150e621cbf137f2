//! Corrupt and torn data: damaged records are reported as `Corrupt` and can be force-deleted;
//! a damaged data file or inconsistent meta makes `open` fail instead of serving.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use bytes::Bytes;
use redb::ReadableTable;
use svc_storage::conformance::{events_until, ok};
use svc_storage::embedded::DATA_FILE;
use svc_storage::{EmbeddedStore, EventKind, KeyRange, Store, StoreError};

#[path = "support/embedded.rs"]
mod support;
use support::{config, key};

fn assert_corrupt<T: std::fmt::Debug>(what: &str, result: Result<T, StoreError>, naming: &str) {
    match result {
        Err(StoreError::Corrupt { location, detail }) => {
            assert!(
                location.contains(naming),
                "{what}: location {location:?} should name {naming:?}"
            );
            assert!(!detail.is_empty());
        }
        other => panic!("{what}: expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn a_damaged_record_is_reported_and_can_be_force_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    let k = key("/objs/bad");
    let v1 = ok("create", store.create(k.clone(), key("good value")).await);
    let v2 = ok(
        "update",
        store
            .update(k.clone(), key("newer value"), v1.mod_revision)
            .await,
    );
    let neighbour = ok("create", store.create(key("/objs/ok"), key("fine")).await);

    // Flip one bit of the stored record, as a bad disk or a bug would.
    let mut raw = ok("raw", store.debug_get_raw(k.clone()).await)
        .unwrap()
        .to_vec();
    let last = raw.len() - 1;
    raw[last] ^= 0x01;
    ok("plant", store.debug_put_raw(k.clone(), raw).await);

    assert_corrupt("get", store.get(k.clone(), None).await, "/objs/bad");
    assert_corrupt(
        "range",
        store.range(KeyRange::prefix("/objs/"), None, 0).await,
        "/objs/bad",
    );
    assert_corrupt(
        "update",
        store.update(k.clone(), key("x"), v2.mod_revision).await,
        "/objs/bad",
    );
    assert_corrupt(
        "create",
        store.create(k.clone(), key("x")).await,
        "/objs/bad",
    );
    assert_corrupt(
        "conditional delete",
        store.delete(k.clone(), Some(v2.mod_revision)).await,
        "/objs/bad",
    );
    // Other keys and the (intact) history are unaffected.
    assert_eq!(
        ok(
            "get neighbour",
            store.get(neighbour.key.clone(), None).await
        )
        .0,
        Some(neighbour)
    );
    assert_eq!(
        ok(
            "get past",
            store.get(k.clone(), Some(v1.mod_revision)).await
        )
        .0,
        Some(v1)
    );

    // The force-delete path: an unconditional delete removes what cannot be read.
    let before = ok("revision", store.current_revision().await);
    let mut feed = store.watch(KeyRange::prefix("/objs/"), before);
    let (deleted, rev) = ok("force delete", store.delete(k.clone(), None).await);
    // The damaged record is never served; the previous value reported is the newest intact
    // history record, here the version the damaged record was a copy of.
    assert_eq!(deleted, v2);
    assert!(rev > before);
    let events = events_until(&mut feed, rev).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, EventKind::Delete);
    assert_eq!(events[0].prev_kv, Some(v2.clone()));
    let mut replay = store.watch(KeyRange::prefix("/objs/"), before);
    assert_eq!(
        events_until(&mut replay, rev).await,
        events,
        "live and replayed events agree"
    );
    assert_eq!(ok("get", store.get(k.clone(), None).await).0, None);
    let fresh = ok("re-create", store.create(k, key("again")).await);
    assert_eq!(fresh.version, 1);
}

#[tokio::test]
async fn garbage_and_short_records_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    for (name, raw) in [
        ("/g/empty", &b""[..]),
        ("/g/short", b"abc"),
        ("/g/garbage", b"this is not a record at all"),
    ] {
        ok(
            "plant",
            store
                .debug_put_raw(key(name), Bytes::from_static(raw))
                .await,
        );
        assert_corrupt("get", store.get(key(name), None).await, name);
    }
    // A valid record filed under another key is caught too (the checksum covers the key).
    let other = ok("create", store.create(key("/g/other"), key("v")).await);
    let raw = ok("raw", store.debug_get_raw(other.key).await).unwrap();
    ok("plant", store.debug_put_raw(key("/g/moved"), raw).await);
    assert_corrupt("get", store.get(key("/g/moved"), None).await, "/g/moved");
    let (deleted, _) = ok("force delete", store.delete(key("/g/moved"), None).await);
    // Never written through the store, so there is no intact previous value: only the key.
    assert_eq!(deleted.key, key("/g/moved"));
    assert!(deleted.value.is_empty());
    assert_eq!(deleted.mod_revision, 0);
}

/// Writes some data and closes the store; returns the data file's path.
async fn populated(dir: &Path) -> std::path::PathBuf {
    let store = EmbeddedStore::open(dir, config()).unwrap();
    for i in 0..300 {
        let value = Bytes::from(format!("{i:0>200}"));
        ok(
            "create",
            store.create(key(&format!("/data/{i:04}")), value).await,
        );
    }
    drop(store);
    dir.join(DATA_FILE)
}

fn open_err(dir: &Path) -> StoreError {
    match EmbeddedStore::open(dir, config()) {
        Ok(store) => panic!("open of a damaged directory succeeded: {store:?}"),
        Err(err) => err,
    }
}

#[tokio::test]
async fn a_garbled_data_file_fails_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path()).await;
    let len = std::fs::metadata(&path).unwrap().len();
    let mut file = OpenOptions::new().write(true).open(&path).unwrap();
    // Overwrite a stretch of every page past the header with garbage.
    let mut offset = 4096;
    while offset + 64 < len {
        file.seek(SeekFrom::Start(offset + 100)).unwrap();
        file.write_all(&[0xA5; 64]).unwrap();
        offset += 4096;
    }
    file.sync_all().unwrap();
    drop(file);
    let err = open_err(dir.path());
    assert!(
        matches!(err, StoreError::Corrupt { .. }),
        "expected Corrupt, got {err:?}"
    );
}

#[tokio::test]
async fn a_truncated_data_file_fails_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path()).await;
    let len = std::fs::metadata(&path).unwrap().len();
    // A lost last page, half the file, and nothing at all.
    for cut in [len - 4096, len / 2, 0] {
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(cut).unwrap();
        drop(file);
        let err = open_err(dir.path());
        assert!(
            matches!(err, StoreError::Corrupt { .. }),
            "cut to {cut} bytes: expected Corrupt, got {err:?}"
        );
    }
}

/// Edits the redb file directly, as a bug or a partial restore might.
fn tamper(path: &Path, edit: impl FnOnce(&redb::WriteTransaction)) {
    let db = redb::Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    edit(&txn);
    txn.commit().unwrap();
}

const LOG: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log");
const META: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("meta");

#[tokio::test]
async fn a_log_that_does_not_reach_the_revision_counter_fails_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path()).await;
    tamper(&path, |txn| {
        txn.open_table(LOG).unwrap().pop_last().unwrap();
    });
    let err = open_err(dir.path());
    match err {
        StoreError::Corrupt { location, detail } => {
            assert_eq!(location, "log");
            assert!(detail.contains("revision counter is 300"), "{detail}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn a_damaged_meta_record_fails_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path()).await;
    tamper(&path, |txn| {
        let mut meta = txn.open_table(META).unwrap();
        let mut raw = meta.get("revision").unwrap().unwrap().value().to_vec();
        raw[5] ^= 0x10;
        meta.insert("revision", raw.as_slice()).unwrap();
    });
    match open_err(dir.path()) {
        StoreError::Corrupt { location, .. } => assert_eq!(location, "meta/revision"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn a_damaged_log_tail_fails_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path()).await;
    tamper(&path, |txn| {
        let mut log = txn.open_table(LOG).unwrap();
        let mut raw = log.get(299).unwrap().unwrap().value().to_vec();
        raw[6] ^= 0x01;
        log.insert(299, raw.as_slice()).unwrap();
    });
    match open_err(dir.path()) {
        StoreError::Corrupt { location, .. } => assert_eq!(location, "log/299"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}
