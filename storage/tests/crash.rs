//! Crash safety: a child process writes concurrently and prints every acknowledged write;
//! the parent kills it with SIGKILL at a random moment, reopens the directory and checks
//! that every acknowledged write is there, nothing unattempted is, and revisions go on.
//!
//! The child is this same test binary, re-run with `CHILD_DIR` set.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use svc_storage::conformance::{events_until, ok};
use svc_storage::{EmbeddedStore, EventKind, KeyRange, Store};

#[path = "support/embedded.rs"]
mod support;
use support::config;

const CHILD_DIR: &str = "SVC_STORAGE_CRASH_CHILD_DIR";
const CHILD_ROUND: &str = "SVC_STORAGE_CRASH_CHILD_ROUND";
const WRITERS: usize = 16;
const ROUNDS: usize = 4;

fn key_of(round: usize, writer: usize) -> String {
    format!("/crash/r{round}/w{writer:02}")
}

/// The child: writers that loop create → updates → delete → create ... until killed.
/// Prints `ACK <key> <revision> <value>` or `DEL <key> <revision>` after each acknowledgement.
fn child(dir: &str, round: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = EmbeddedStore::open(std::path::Path::new(dir), config()).unwrap();
        let mut tasks = Vec::new();
        for writer in 0..WRITERS {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let key = Bytes::from(key_of(round, writer));
                let mut current: Option<i64> = None;
                for i in 0u64.. {
                    let line = match current {
                        None => {
                            let kv = store
                                .create(key.clone(), Bytes::from(i.to_string()))
                                .await
                                .unwrap();
                            current = Some(kv.mod_revision);
                            format!("ACK {} {} {i}\n", key_of(round, writer), kv.mod_revision)
                        }
                        Some(rev) if i % 7 == 6 => {
                            let (_, deleted) = store.delete(key.clone(), Some(rev)).await.unwrap();
                            current = None;
                            format!("DEL {} {deleted}\n", key_of(round, writer))
                        }
                        Some(rev) => {
                            let value = Bytes::from(i.to_string());
                            let kv = store.update(key.clone(), value, rev).await.unwrap();
                            current = Some(kv.mod_revision);
                            format!("ACK {} {} {i}\n", key_of(round, writer), kv.mod_revision)
                        }
                    };
                    // Printed only after the write returned, flushed so the parent sees it
                    // even if the process dies right after.
                    let mut out = std::io::stdout().lock();
                    out.write_all(line.as_bytes()).unwrap();
                    out.flush().unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
}

/// A small xorshift: the kill moment only needs to vary, not to be cryptographic.
fn random_millis(seed: &mut u64, low: u64, high: u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    low + *seed % (high - low)
}

enum Ack {
    Put {
        key: String,
        revision: i64,
        value: String,
    },
    Delete {
        key: String,
        revision: i64,
    },
}

fn parse(line: &str) -> Option<Ack> {
    let parts: Vec<&str> = line.split_whitespace().collect();
    match parts.as_slice() {
        ["ACK", key, revision, value] => Some(Ack::Put {
            key: (*key).to_string(),
            revision: revision.parse().ok()?,
            value: (*value).to_string(),
        }),
        ["DEL", key, revision] => Some(Ack::Delete {
            key: (*key).to_string(),
            revision: revision.parse().ok()?,
        }),
        _ => None,
    }
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    if let Ok(dir) = std::env::var(CHILD_DIR) {
        let round = std::env::var(CHILD_ROUND)
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        child(&dir, round);
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut acked: Vec<Ack> = Vec::new();
    for round in 0..ROUNDS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "acknowledged_writes_survive_sigkill",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, dir.path())
            .env(CHILD_ROUND, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| parse(&l))
                .collect::<Vec<_>>()
        });
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let wait = random_millis(&mut seed, 200, 800);
        std::thread::sleep(Duration::from_millis(wait));
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        let lines = reader.join().unwrap();
        let stderr = errors.join().unwrap();
        assert!(!stderr.contains("panicked"), "child failed:\n{stderr}");
        println!(
            "round {round}: killed after {wait} ms ({status}), {} acknowledged writes",
            lines.len()
        );
        acked.extend(lines);
        verify(dir.path(), &acked, round);
    }
    assert!(!acked.is_empty(), "no child ever acknowledged a write");
    println!("crash test took {:?}", started.elapsed());
}

fn verify(dir: &std::path::Path, acked: &[Ack], round: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store: Arc<EmbeddedStore> = EmbeddedStore::open(dir, config()).unwrap();
        let current = ok("current_revision", store.current_revision().await);
        let mut last_acked = 0;
        let mut final_rev: HashMap<&str, i64> = HashMap::new();
        for ack in acked {
            let (key, revision) = match ack {
                Ack::Put {
                    key,
                    revision,
                    value,
                } => {
                    let (kv, _) = ok(
                        "get",
                        store.get(Bytes::from(key.clone()), Some(*revision)).await,
                    );
                    let kv = kv.unwrap_or_else(|| {
                        panic!("acknowledged write {key}@{revision} is missing")
                    });
                    assert_eq!(kv.mod_revision, *revision, "{key}");
                    assert_eq!(kv.value, Bytes::from(value.clone()), "{key}@{revision}");
                    (key, *revision)
                }
                Ack::Delete { key, revision } => {
                    let (kv, _) = ok(
                        "get",
                        store.get(Bytes::from(key.clone()), Some(*revision)).await,
                    );
                    assert_eq!(kv, None, "acknowledged delete {key}@{revision} is undone");
                    (key, *revision)
                }
            };
            last_acked = last_acked.max(revision);
            let entry = final_rev.entry(key.as_str()).or_insert(revision);
            *entry = (*entry).max(revision);
        }
        assert!(
            current >= last_acked,
            "revision {current} went back below acknowledged {last_acked}"
        );
        // The latest state of each key is at or after its latest acknowledged write.
        let state = ok(
            "range",
            store.range(KeyRange::prefix("/crash/"), None, 0).await,
        );
        let mut present: BTreeMap<String, i64> = BTreeMap::new();
        for kv in &state.kvs {
            let key = String::from_utf8(kv.key.to_vec()).unwrap();
            // Nothing that was never attempted: only the keys and values the children write.
            let valid = (0..=round).any(|r| (0..WRITERS).any(|w| key_of(r, w) == key));
            assert!(valid, "unexpected key {key}");
            let value: u64 = std::str::from_utf8(&kv.value)
                .unwrap()
                .parse()
                .expect("unexpected value");
            assert!(value < 1_000_000);
            present.insert(key, kv.mod_revision);
        }
        for (key, rev) in &final_rev {
            if let Some(now) = present.get(*key) {
                assert!(
                    *now >= *rev,
                    "{key} is at {now}, older than acknowledged {rev}"
                );
            }
        }
        // The log is whole: replaying from 0 yields every revision exactly once.
        let mut feed = store.watch(KeyRange::prefix("/"), 0);
        let events = if current > 0 {
            events_until(&mut feed, current).await
        } else {
            Vec::new()
        };
        let revisions: Vec<i64> = events.iter().map(|e| e.revision()).collect();
        assert_eq!(
            revisions,
            (1..=current).collect::<Vec<_>>(),
            "the event log has gaps"
        );
        assert!(
            events
                .iter()
                .all(|e| e.kind == EventKind::Delete || !e.kv.value.is_empty())
        );
        // Revisions continue strictly above everything acknowledged.
        let probe = ok(
            "create",
            store
                .create(Bytes::from(format!("/probe/{round}")), Bytes::from("p"))
                .await,
        );
        assert!(probe.mod_revision > last_acked.max(current));
        drop(feed);
    });
}
