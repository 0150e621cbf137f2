//! Watch guarantees under faults: writers create, update and delete ServiceAccounts while
//! watchers (bookmarks on, some with label selectors, one reading slowly so it falls behind
//! the writers, all resuming from their last revision whenever a stream ends and relisting
//! after 410) record every stream; a fault strikes midway (the gateway killed with SIGKILL and
//! restarted, the etcd leader killed and restarted twice, or every etcd member stopped for 10 s);
//! then the recorded history must be ordered, unique, atomic, bookmarkable, reliable and
//! resumable (`support::watch_validator`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use svc_gateway::base::flags::StorageBackend;
use svc_storage::etcd::testing::EtcdCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::support::client::{Client, TestServer, WatchStream, create_namespace};
use crate::support::process::{ServerProcess, admin_client, free_port};
use crate::support::watch_validator::{
    End, EventType, History, Item, Op, Outcome, Snapshot, Start, Stream, WatcherLog, Write,
};

pub(crate) const NS: &str = "guarantees";
pub(crate) const BASE: &str = "/api/v1/namespaces/guarantees/serviceaccounts";
/// The annotation naming the write that made an object's state.
pub(crate) const WRITE_ID: &str = "guarantees.svc.io/write";
/// Each test's whole budget (watchers give up 40 s after the traffic starts).
const LIMIT: Duration = Duration::from_secs(60);

/// One request that may fail in any way (connection refused, reset, timeout): None then.
async fn try_request(
    c: &Client,
    method: Method,
    path: &str,
    body: Option<&Value>,
    limit: Duration,
) -> Option<(StatusCode, Value)> {
    let attempt = async {
        let mut conn = c.connect().await.ok()?;
        let body = body.map(Value::to_string).unwrap_or_default();
        let req = Client::build(method, path, body, &[("content-type", "application/json")]);
        let resp = conn.send(req).await.ok()?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        Some((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    };
    tokio::time::timeout(limit, attempt).await.ok().flatten()
}

fn rv_of(v: &Value) -> Option<i64> {
    v["metadata"]["resourceVersion"].as_str()?.parse().ok()
}

fn object(key: &str, group: &str, id: &str) -> Value {
    json!({"metadata": {
        "name": key,
        "labels": {"group": group},
        "annotations": {WRITE_ID: id},
    }})
}

/// Writes one change and records its outcome: acknowledged only on the expected success
/// answer; anything else may or may not have been committed.
async fn write(
    c: &Client,
    ids: &AtomicUsize,
    key: &str,
    group: &str,
    op: Op,
) -> (Write, Option<i64>) {
    let id = format!("w{}", ids.fetch_add(1, Ordering::Relaxed));
    let limit = Duration::from_secs(10);
    let body = object(key, group, &id);
    let path = format!("{BASE}/{key}");
    let (answer, ok) = match op {
        Op::Create => (
            try_request(c, Method::POST, BASE, Some(&body), limit).await,
            StatusCode::CREATED,
        ),
        Op::Update => (
            try_request(c, Method::PUT, &path, Some(&body), limit).await,
            StatusCode::OK,
        ),
        Op::Delete => (
            try_request(c, Method::DELETE, &path, None, limit).await,
            StatusCode::OK,
        ),
    };
    let (outcome, rv) = match answer {
        Some((s, v)) if s == ok => {
            let rv = rv_of(&v);
            // A delete answers with the state before it.
            let committed = if op == Op::Delete { None } else { rv };
            (Outcome::Acked(committed), Some(rv.unwrap_or(0)))
        }
        _ => (Outcome::Unknown, None),
    };
    let w = Write {
        id,
        key: key.to_string(),
        op,
        labels: BTreeMap::from([("group".to_string(), group.to_string())]),
        outcome,
    };
    (w, rv)
}

/// Creates, updates and deletes its own keys until `stop`. A key whose write had an unknown
/// outcome is left alone from then on (its state cannot be known).
async fn writer(c: Client, w: usize, stop: Arc<AtomicBool>, ids: Arc<AtomicUsize>) -> Vec<Write> {
    let mut rng = StdRng::seed_from_u64(w as u64);
    let mut live: Vec<(String, &'static str)> = Vec::new();
    let mut log = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let roll: f64 = rng.random();
        let (key, group, op) = if live.is_empty() || roll < 0.5 {
            n += 1;
            let group = if n % 2 == 0 { "a" } else { "b" };
            (format!("obj-{w}-{n}"), group, Op::Create)
        } else {
            let i = rng.random_range(0..live.len());
            let (key, group) = live[i].clone();
            let op = if roll < 0.8 { Op::Update } else { Op::Delete };
            if op == Op::Delete {
                live.swap_remove(i);
            }
            (key, group, op)
        };
        let (entry, acked) = write(&c, &ids, &key, group, op).await;
        log.push(entry);
        match (acked, op) {
            (Some(_), Op::Create) => live.push((key, group)),
            (Some(_), _) => {}
            (None, _) => {
                live.retain(|(k, _)| *k != key);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    log
}

/// A list of `selector` now: (revision, items as (name, resourceVersion)).
async fn list(c: &Client, selector: Option<&str>) -> Option<(i64, Vec<(String, i64)>)> {
    let path = match selector {
        Some(s) => format!("{BASE}?labelSelector={}", s.replace('=', "%3D")),
        None => BASE.to_string(),
    };
    let (s, v) = try_request(c, Method::GET, &path, None, Duration::from_secs(10)).await?;
    if s != StatusCode::OK {
        return None;
    }
    let items = v["items"]
        .as_array()?
        .iter()
        .map(|o| Some((o["metadata"]["name"].as_str()?.to_string(), rv_of(o)?)))
        .collect::<Option<Vec<_>>>()?;
    Some((rv_of(&v)?, items))
}

/// One recorded item of a watch stream, or the end of the stream.
enum Read {
    Item(Item),
    Gone,
    Closed,
}

fn decode(ev: &Value) -> Read {
    let obj = &ev["object"];
    match ev["type"].as_str() {
        Some("BOOKMARK") => rv_of(obj).map_or(Read::Closed, |rv| Read::Item(Item::Bookmark(rv))),
        Some("ERROR") if obj["code"] == 410 => Read::Gone,
        Some("ERROR") => {
            // Any other error ends the stream; the client resumes from where it got.
            eprintln!("watch ended with {ev}");
            Read::Closed
        }
        Some(t) => match (EventType::parse(t), rv_of(obj)) {
            (Some(kind), Some(rv)) => Read::Item(Item::Event {
                kind,
                key: obj["metadata"]["name"].as_str().unwrap_or("").to_string(),
                rv,
                write: obj["metadata"]["annotations"][WRITE_ID]
                    .as_str()
                    .map(str::to_string),
            }),
            _ => panic!("unexpected watch event {ev}"),
        },
        None => panic!("watch event without a type: {ev}"),
    }
}

/// Watches until it has seen the revision `target` names (once set) or `deadline`: each
/// stream asks for bookmarks and ends after a few seconds; it resumes from the last revision
/// seen, and relists after 410 Gone.
async fn watcher(
    c: Client,
    name: &'static str,
    selector: Option<(&'static str, &'static str)>,
    target: watch::Receiver<Option<i64>>,
    deadline: Instant,
    seed: u64,
    slow: bool,
) -> WatcherLog {
    let mut log = WatcherLog::new(name, selector);
    let selector_query = selector.map(|(k, v)| format!("{k}={v}"));
    let mut rng = StdRng::seed_from_u64(seed);
    let mut resume: Option<i64> = None;
    let mut progress = 0;
    let reached = |progress: i64| target.borrow().is_some_and(|t| progress >= t);
    while Instant::now() < deadline && !reached(progress) {
        let (start, from) = match resume {
            Some(rv) => (Start::Resume(rv), rv),
            None => match list(&c, selector_query.as_deref()).await {
                Some((rv, items)) => (Start::Relist { rv, items }, rv),
                None => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        progress = from;
        resume = Some(from);
        let mut stream = Stream {
            start,
            items: Vec::new(),
            end: End::Closed,
        };
        let mut path = format!(
            "{BASE}?watch=1&allowWatchBookmarks=true&resourceVersion={from}&timeoutSeconds={}",
            rng.random_range(2..6)
        );
        if let Some(s) = &selector_query {
            path.push_str(&format!("&labelSelector={}", s.replace('=', "%3D")));
        }
        let opened = async {
            let mut conn = c.connect().await.ok()?;
            let req = Client::build(Method::GET, &path, Bytes::new(), &[]);
            let resp = conn.send(req).await.ok()?;
            Some((conn, resp))
        };
        match tokio::time::timeout(Duration::from_secs(10), opened).await {
            Ok(Some((_conn, resp))) if resp.status() == StatusCode::OK => {
                let mut events = WatchStream::from_body(resp.into_body());
                loop {
                    if reached(progress) || Instant::now() >= deadline {
                        stream.end = End::Stopped;
                        break;
                    }
                    let ev = match tokio::time::timeout(Duration::from_millis(300), events.next())
                        .await
                    {
                        Err(_) => continue,
                        Ok(None) => break,
                        Ok(Some(ev)) => ev,
                    };
                    match decode(&ev) {
                        Read::Item(item) => {
                            if slow {
                                // Falls behind the writers, so the server holds its backlog.
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            let rv = match &item {
                                Item::Bookmark(rv) | Item::Event { rv, .. } => *rv,
                            };
                            progress = progress.max(rv);
                            resume = Some(progress);
                            stream.items.push(item);
                        }
                        Read::Gone => {
                            stream.end = End::Gone;
                            resume = None;
                            break;
                        }
                        Read::Closed => break,
                    }
                }
            }
            Ok(Some((_, resp))) if resp.status() == StatusCode::GONE => {
                stream.end = End::Gone;
                resume = None;
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
        let stopped = stream.end == End::Stopped;
        log.streams.push(stream);
        if stopped {
            break;
        }
    }
    log
}

/// Writers and watchers around a fault: `fault` runs after two seconds of traffic; writers go
/// on for two more seconds after it returns, then one last write whose revision every
/// watcher must reach; then the history, with the final list, is validated.
pub(crate) async fn run_with_fault<F, Fut>(c: Client, fault: F) -> History
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let started = Instant::now();
    let deadline = started + Duration::from_secs(40);
    let (target_tx, target) = watch::channel(None);
    let specs: [(&str, Option<(&str, &str)>); 5] = [
        ("all-1", None),
        ("all-2", None),
        ("group-a", Some(("group", "a"))),
        ("group-b", Some(("group", "b"))),
        ("slow", None),
    ];
    let watchers: Vec<_> = specs
        .iter()
        .enumerate()
        .map(|(i, (name, sel))| {
            tokio::spawn(watcher(
                c.clone(),
                name,
                *sel,
                target.clone(),
                deadline,
                i as u64,
                *name == "slow",
            ))
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..3)
        .map(|w| tokio::spawn(writer(c.clone(), w, stop.clone(), ids.clone())))
        .collect();

    tokio::time::sleep(Duration::from_secs(2)).await;
    fault().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut writes = Vec::new();
    for w in writers {
        writes.extend(w.await.unwrap());
    }
    // The final write, after every other: retried (each attempt recorded) until acknowledged.
    let mut final_rv = None;
    for i in 0..20 {
        let (w, rv) = write(&c, &ids, &format!("obj-final-{i}"), "final", Op::Create).await;
        writes.push(w);
        if let Some(rv) = rv {
            final_rv = Some(rv);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let final_rv = final_rv.expect("the final write was never acknowledged");
    target_tx.send_replace(Some(final_rv));
    let mut logs = Vec::new();
    for w in watchers {
        logs.push(w.await.unwrap());
    }
    let (list_rv, items) = list(&c, None).await.expect("the final list");
    let history = History {
        writes,
        watchers: logs,
        snapshots: vec![Snapshot {
            what: "final list".to_string(),
            rv: list_rv,
            items,
        }],
        final_rv: Some(final_rv),
    };
    let acked = history
        .writes
        .iter()
        .filter(|w| matches!(w.outcome, Outcome::Acked(_)))
        .count();
    eprintln!(
        "{} writes ({acked} acknowledged), final revision {final_rv}; {}; in {:?}",
        history.writes.len(),
        history.counts(),
        started.elapsed()
    );
    assert!(acked > 20, "too few writes acknowledged to tell anything");
    history.assert_valid();
    // The same history with one delivered event taken away must fail: the recording is
    // really checked.
    let mut broken = history.clone();
    let stream = broken.watchers[0]
        .streams
        .iter_mut()
        .find(|s| s.items.iter().any(|i| matches!(i, Item::Event { .. })))
        .expect("a stream with events");
    let at = stream
        .items
        .iter()
        .position(|i| matches!(i, Item::Event { .. }))
        .unwrap();
    stream.items.remove(at);
    assert!(
        !broken.validate().is_empty(),
        "a dropped event went unnoticed"
    );
    history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_keep_their_guarantees_across_a_gateway_sigkill() {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let flags = ["--watch-bookmark-interval", "1s"];
        let mut child = ServerProcess::spawn_with(dir.path(), port, &flags);
        let c = admin_client(dir.path(), port).await;
        create_namespace(&c, NS).await;
        let (path, child_ref) = (dir.path(), &mut child);
        run_with_fault(c, move || async move {
            child_ref.kill();
            *child_ref = ServerProcess::spawn_with(path, port, &flags);
            admin_client(path, port).await;
        })
        .await;
        child.kill();
    })
    .await
    .expect("the test ran over its time limit");
}

/// A gateway on `etcd` (every endpoint), with frequent bookmarks.
async fn etcd_gateway(etcd: &EtcdCluster) -> TestServer {
    let endpoints = etcd.endpoints();
    let s = TestServer::start_with(move |o| {
        o.storage_backend = StorageBackend::Etcd;
        o.etcd_servers = endpoints;
        o.watch_bookmark_interval = Duration::from_secs(1);
    })
    .await;
    create_namespace(&s.admin(), NS).await;
    s
}

/// Asks a member for its status over etcd's JSON gateway: is it the leader?
async fn is_leader(port: u16) -> bool {
    let ask = async {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let req = "POST /v3/maintenance/status HTTP/1.1\r\nHost: localhost\r\n\
                   Content-Type: application/json\r\nContent-Length: 2\r\n\
                   Connection: close\r\n\r\n{}";
        tcp.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        tcp.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf);
        let body = &text[text.find('{')?..=text.rfind('}')?];
        let v: Value = serde_json::from_str(body).ok()?;
        Some(v["leader"].is_string() && v["leader"] == v["header"]["member_id"])
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// The member that leads (waiting out an election in progress).
async fn find_leader(cluster: &EtcdCluster) -> usize {
    for _ in 0..50 {
        for (i, m) in cluster.members.iter().enumerate() {
            if is_leader(m.client_port).await {
                return i;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no etcd member says it leads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_keep_their_guarantees_across_etcd_leader_sigkills() {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut etcd = EtcdCluster::start(&dir.path().join("etcd"), 3).await;
        let g = etcd_gateway(&etcd).await;
        let cluster = &mut etcd;
        // The leader dies, comes back; then the new leader dies and comes back.
        run_with_fault(g.admin(), move || async move {
            for _ in 0..2 {
                let leader = find_leader(cluster).await;
                eprintln!("killing the etcd leader {}", cluster.members[leader].name);
                cluster.members[leader].kill();
                tokio::time::sleep(Duration::from_secs(2)).await;
                cluster.members[leader].start();
                cluster.wait_ready(Duration::from_secs(20)).await;
            }
        })
        .await;
    })
    .await
    .expect("the test ran over its time limit");
}

/// Processes stopped with SIGSTOP, continued with SIGCONT when dropped (also when a test
/// fails midway).
struct Stopped(Vec<u32>);

impl Stopped {
    fn new(pids: Vec<u32>) -> Self {
        signal("-STOP", &pids);
        Stopped(pids)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal("-CONT", &self.0);
    }
}

fn signal(sig: &str, pids: &[u32]) {
    let status = std::process::Command::new("kill")
        .arg(sig)
        .args(pids.iter().map(u32::to_string))
        .status();
    assert!(status.is_ok_and(|s| s.success()), "kill {sig} {pids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_keep_their_guarantees_while_etcd_is_stopped_for_ten_seconds() {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let etcd = EtcdCluster::start(&dir.path().join("etcd"), 3).await;
        let g = etcd_gateway(&etcd).await;
        let pids: Vec<u32> = etcd.members.iter().filter_map(|m| m.pid()).collect();
        assert_eq!(pids.len(), 3);
        run_with_fault(g.admin(), move || async move {
            let stopped = Stopped::new(pids);
            tokio::time::sleep(Duration::from_secs(10)).await;
            drop(stopped);
        })
        .await;
    })
    .await
    .expect("the test ran over its time limit");
}
