//! Failed commits: a failed fsync (injected inside redb's file backend) and a full disk (a
//! size-limited tmpfs). Nothing acknowledged is lost, nothing failed is acknowledged, reads
//! and watches go on, `ready` reports the failure, and writes resume by themselves.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use svc_storage::conformance::{assert_ordered, events_until, ok, within};
use svc_storage::{EmbeddedStore, EventKind, KeyRange, KeyValue, Store, StoreError};

#[path = "support/embedded.rs"]
mod support;
use support::{config, key};

/// Creates `n` keys under `prefix` concurrently; returns what each answered.
async fn create_many(
    store: &Arc<EmbeddedStore>,
    prefix: &str,
    n: usize,
    value: &Bytes,
) -> Vec<(Bytes, Result<KeyValue, StoreError>)> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = store.clone();
            let k = key(&format!("{prefix}{i:04}"));
            let value = value.clone();
            tokio::spawn(async move { (k.clone(), store.create(k, value).await) })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

/// Polls `ready` until it answers as `want` (a state change the committer makes by itself).
async fn await_ready(store: &EmbeddedStore, want: bool) -> Result<(), StoreError> {
    within("ready to change", async {
        loop {
            let ready = store.ready().await;
            if ready.is_ok() == want {
                return ready;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// Every acknowledged key is there with its value; every failed one is absent.
async fn check_contents(
    store: &EmbeddedStore,
    acknowledged: &[KeyValue],
    failed: &[Bytes],
) -> Result<(), String> {
    for kv in acknowledged {
        let (got, _) = store
            .get(kv.key.clone(), None)
            .await
            .map_err(|e| e.to_string())?;
        if got.as_ref() != Some(kv) {
            return Err(format!("acknowledged {:?} reads as {got:?}", kv.key));
        }
    }
    for k in failed {
        let (got, _) = store
            .get(k.clone(), None)
            .await
            .map_err(|e| e.to_string())?;
        if got.is_some() {
            return Err(format!("failed write {k:?} is stored: {got:?}"));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_fsync_fails_its_batch_and_the_store_goes_on_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    let value = Bytes::from_static(b"value");
    let mut acknowledged: Vec<KeyValue> = create_many(&store, "/before/", 20, &value)
        .await
        .into_iter()
        .map(|(_, r)| ok("create before", r))
        .collect();
    let start = ok("revision", store.current_revision().await);
    let mut feed = store.watch(KeyRange::prefix("/"), start);

    store.inject_sync_failures(1);
    let answers = create_many(&store, "/during/", 50, &value).await;
    let mut failed = Vec::new();
    for (k, answer) in answers {
        match answer {
            Ok(kv) => acknowledged.push(kv),
            Err(StoreError::WriteFailed(detail)) => {
                assert!(
                    detail.contains("nothing of it was acknowledged"),
                    "{detail}"
                );
                assert!(detail.contains("os error 5"), "names the cause: {detail}");
                failed.push(k);
            }
            Err(other) => panic!("expected WriteFailed, got {other:?}"),
        }
    }
    assert!(!failed.is_empty(), "the failed fsync failed no write");

    // Reads go on (redb refuses the failed handle; the store reopened it). The failed batch
    // is all or nothing: absent, or (when the fsync failed after the data reached the file)
    // adopted whole on reopening, never acknowledged either way.
    let mut found = Vec::new();
    for k in &failed {
        found.push(ok("get", store.get(k.clone(), None).await).0);
    }
    let adopted = found.iter().all(Option::is_some);
    assert!(
        adopted || found.iter().all(Option::is_none),
        "a failed batch is all or nothing: {found:?}"
    );
    let mut absent = failed.clone();
    if adopted {
        acknowledged.extend(found.into_iter().flatten());
        absent.clear();
    }
    check_contents(&store, &acknowledged, &absent)
        .await
        .unwrap();
    // Writes go on, and the first successful commit clears the failure.
    let after = ok(
        "create after",
        store.create(key("/after"), value.clone()).await,
    );
    acknowledged.push(after.clone());
    ok("ready", store.ready().await);

    // The watcher saw every stored write after `start`, in order, and nothing else.
    let events = events_until(&mut feed, after.mod_revision).await;
    assert_ordered(&events);
    assert!(events.iter().all(|e| e.kind == EventKind::Put));
    let mut seen: Vec<Bytes> = events.iter().map(|e| e.kv.key.clone()).collect();
    let mut want: Vec<Bytes> = acknowledged
        .iter()
        .filter(|kv| kv.mod_revision > start)
        .map(|kv| kv.key.clone())
        .collect();
    seen.sort();
    want.sort();
    assert_eq!(seen, want, "the feed carries exactly what is stored");

    // Durable: a fresh open (all checks run) holds exactly the acknowledged writes.
    store.close();
    drop(store);
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    check_contents(&store, &acknowledged, &absent)
        .await
        .unwrap();
    assert_eq!(
        ok("revision", store.current_revision().await),
        after.mod_revision
    );
}

#[tokio::test]
async fn a_failing_disk_is_reported_until_it_works_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    let a = ok("create", store.create(key("/a"), key("1")).await);
    ok(
        "update",
        store.update(key("/a"), key("1"), a.mod_revision).await,
    );
    let a = ok("get", store.get(key("/a"), None).await).0.unwrap();
    // Every fsync fails from now on: the commit, the reopen's repair, every probe.
    store.inject_sync_failures(u32::MAX);
    let err = store.create(key("/b"), key("2")).await.unwrap_err();
    assert!(matches!(err, StoreError::WriteFailed(_)), "{err:?}");
    match store.ready().await {
        Err(StoreError::WriteFailed(detail)) => assert!(detail.contains("os error 5"), "{detail}"),
        Err(StoreError::Unavailable(detail)) => assert!(detail.contains("reopened"), "{detail}"),
        other => panic!("ready while fsync fails: {other:?}"),
    }
    // Once the committer has tried to reopen it, a file redb cannot repair is not served:
    // reads fail with a clear error instead. (Until then, what redb still has in memory of
    // the last good commit may be served.)
    within("reads to be refused", async {
        loop {
            match store.get(key("/a"), None).await {
                Err(StoreError::Unavailable(detail)) => {
                    assert!(detail.contains("reopened"), "{detail}");
                    break;
                }
                Ok((Some(kv), _)) => assert_eq!(kv, a),
                other => panic!("read while the file cannot be reopened: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let err = store.create(key("/c"), key("3")).await.unwrap_err();
    match err {
        StoreError::WriteFailed(detail) => {
            assert!(detail.contains("cannot be reopened"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
    // A compaction asked for meanwhile waits (nothing but the probe writes while commits
    // fail) and runs once they work again.
    let compaction = tokio::spawn({
        let store = store.clone();
        async move { store.compact(a.mod_revision).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!compaction.is_finished(), "compacted while commits fail");
    // The disk heals; no client write is needed for the store to notice.
    store.inject_sync_failures(0);
    ok("ready", await_ready(&store, true).await);
    assert_eq!(ok("get", store.get(key("/a"), None).await).0, Some(a));
    ok(
        "compaction",
        within("compaction", compaction).await.unwrap(),
    );
    // The failed write is either absent or, reaching the file before its fsync failed,
    // adopted on reopening (redb commits with one fsync, its header included).
    match ok("get", store.get(key("/b"), None).await).0 {
        None => drop(ok("create", store.create(key("/b"), key("2")).await)),
        Some(kv) => assert_eq!(kv.value, key("2")),
    }
    assert_eq!(ok("get", store.get(key("/c"), None).await).0, None);
    ok("create", store.create(key("/c"), key("3")).await);
}

/// A tmpfs of a fixed size, mounted for one test and unmounted when dropped (panics too).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` only outside CI when mounting is not permitted; in CI that is a failure.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("tmpfs")
            .arg(dir.path())
            .output();
        match out {
            Ok(out) if out.status.success() => Some(Tmpfs { dir }),
            other => {
                let why = format!("cannot mount a tmpfs (root needed): {other:?}");
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    panic!("{why}");
                }
                eprintln!("SKIPPED outside CI: {why}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let status = Command::new("umount").arg(self.dir.path()).status();
        if !status.is_ok_and(|s| s.success()) {
            // Busy (a handle still open): detach it so the directory can go.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}

/// Fills the filesystem at `dir` with one file until it refuses more; returns its path.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xAB; 64 * 1024];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(err) if err.raw_os_error() == Some(28) => break,
            Err(err) => panic!("filling the disk: {err}"),
        }
    }
    // Smaller pieces take the rest.
    while file.write_all(&[0xAB; 512]).is_ok() {}
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_fails_writes_keeps_reads_and_recovers_when_space_returns() {
    let Some(fs) = Tmpfs::mount("8m") else {
        return;
    };
    let dir = fs.path().join("store");
    let store = EmbeddedStore::open(&dir, config()).unwrap();
    let value = Bytes::from(vec![b'v'; 64 * 1024]);
    let mut acknowledged: Vec<KeyValue> = Vec::new();
    for i in 0..8 {
        let kv = ok(
            "create",
            store
                .create(key(&format!("/before/{i}")), value.clone())
                .await,
        );
        acknowledged.push(kv);
    }
    let start = ok("revision", store.current_revision().await);
    let mut feed = store.watch(KeyRange::prefix("/"), start);
    let filler = fill(fs.path());

    // Write until the disk refuses; every refusal names the cause.
    let mut failed = Vec::new();
    for i in 0..200 {
        let k = key(&format!("/full/{i:04}"));
        match store.create(k.clone(), value.clone()).await {
            Ok(kv) => acknowledged.push(kv),
            Err(StoreError::WriteFailed(detail)) => {
                assert!(detail.contains("No space left on device"), "{detail}");
                failed.push(k);
                break;
            }
            Err(other) => panic!("expected WriteFailed, got {other:?}"),
        }
    }
    assert!(!failed.is_empty(), "the full disk never refused a write");
    assert!(matches!(
        store.ready().await,
        Err(StoreError::WriteFailed(_))
    ));
    // Reads, lists and watches go on.
    ok("health", store.health().await);
    check_contents(&store, &acknowledged, &failed)
        .await
        .unwrap();
    let listed = ok("range", store.range(KeyRange::prefix("/"), None, 0).await);
    assert_eq!(listed.kvs.len(), acknowledged.len());
    let last = acknowledged.last().unwrap().mod_revision;
    if last > start {
        let events = events_until(&mut feed, last).await;
        assert_eq!(events.len() as i64, last - start);
    }

    // Space returns: the probe notices without any client write, and writes resume.
    std::fs::remove_file(&filler).unwrap();
    ok("ready", await_ready(&store, true).await);
    for k in &failed {
        acknowledged.push(ok("retry", store.create(k.clone(), value.clone()).await));
    }
    let more = ok("create", store.create(key("/after"), key("x")).await);
    acknowledged.push(more.clone());
    let events = events_until(&mut feed, more.mod_revision).await;
    assert_ordered(&events);
    assert_eq!(events.last().map(|e| e.kv.key.clone()), Some(key("/after")));

    store.close();
    drop(store);
    let store = EmbeddedStore::open(&dir, config()).unwrap();
    check_contents(&store, &acknowledged, &[]).await.unwrap();
    drop(store);
    drop(fs);
}

#[test]
fn the_data_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    // Created by the store.
    let fresh = parent.path().join("a/b/store");
    drop(EmbeddedStore::open(&fresh, config()).unwrap());
    assert_eq!(mode(&fresh), 0o700);
    // Created by someone else, readable by all: narrowed.
    let open = parent.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    drop(EmbeddedStore::open(&open, config()).unwrap());
    assert_eq!(mode(&open), 0o700);
}
