//! Several gateways on one etcd (real etcd processes on loopback, started per test):
//! one shared PKI, one ordered event stream seen identically by watchers on every gateway,
//! "Most Recent" reads consistent across gateways, and the faults: an etcd member killed
//! during writes, and etcd down then back.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::client::{Client, TestServer, WatchStream, create_namespace, summary};
use http::{Method, StatusCode};
use parking_lot::Mutex;
use serde_json::{Value, json};
use svc_gateway::base::flags::StorageBackend;
use svc_storage::etcd::testing::EtcdCluster;
use tokio::task::JoinHandle;

/// (type, name, resourceVersion) of one watch event.
type Seen = (String, String, i64);

/// When a watcher has read enough.
type Done = Arc<dyn Fn(&[Seen]) -> bool + Send + Sync>;

/// A gateway on `endpoints`, its certificates in the shared `cert_dir`.
async fn gateway(endpoints: Vec<String>, cert_dir: &Path) -> TestServer {
    let cert_dir = cert_dir.to_path_buf();
    TestServer::start_with(move |o| {
        o.storage_backend = StorageBackend::Etcd;
        o.etcd_servers = endpoints;
        o.cert_dir = Some(cert_dir);
    })
    .await
}

/// `client`'s credentials (issued by the shared CA) pointed at another gateway.
fn against(client: &Client, srv: &TestServer, h2: bool) -> Client {
    Client {
        addr: srv.handle().addr,
        tls: client.tls.clone(),
        h2,
    }
}

fn rv_of(obj: &Value) -> i64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no resourceVersion in {obj}"))
}

/// The list's resourceVersion ("Most Recent" read).
async fn list_rv(c: &Client, path: &str) -> i64 {
    let (s, list) = c.get(path).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    rv_of(&list)
}

/// Opens `n` watches of `path` as h2 streams on one connection of `client`; each is read by a
/// task collecting events until `done(events)` or `limit`.
async fn open_watchers(
    client: &Client,
    path: &str,
    n: usize,
    limit: Duration,
    done: Done,
) -> Vec<JoinHandle<Vec<Seen>>> {
    let mut conn = client.connect().await.unwrap();
    let mut handles = Vec::new();
    for _ in 0..n {
        let resp = conn
            .send(Client::build(Method::GET, path, bytes::Bytes::new(), &[]))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut stream = WatchStream::from_body(resp.into_body());
        let done = done.clone();
        handles.push(tokio::spawn(async move {
            let mut events: Vec<Seen> = Vec::new();
            let _ = tokio::time::timeout(limit, async {
                while !done(&events) {
                    let Some(ev) = stream.next().await else {
                        break;
                    };
                    let (kind, name, rv) = summary(&ev);
                    events.push((kind, name, rv.parse().unwrap_or(0)));
                }
            })
            .await;
            events
        }));
    }
    handles
}

/// Asserts `events` are exactly the `acked` writes (plus `extra` names allowed, e.g. writes
/// whose acknowledgement was lost), each once, in strictly increasing revision order.
fn assert_exactly_once(events: &[Seen], acked: &HashMap<String, i64>, extra: &HashSet<String>) {
    for pair in events.windows(2) {
        assert!(pair[0].2 < pair[1].2, "out of order: {pair:?}");
    }
    let mut names = HashSet::new();
    for (kind, name, rv) in events {
        assert_eq!(kind, "ADDED", "unexpected event {kind} {name}");
        assert!(names.insert(name.clone()), "{name} delivered twice");
        match acked.get(name) {
            Some(want) => assert_eq!(rv, want, "{name} at the wrong revision"),
            None => assert!(extra.contains(name), "{name} was never written"),
        }
    }
    for name in acked.keys() {
        assert!(
            names.contains(name),
            "acknowledged write {name} never delivered"
        );
    }
}

const WATCHERS: usize = 100;
const WRITES: usize = 1000;
const WRITERS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_watchers_see_one_ordered_stream() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 1).await;
    let certs = dir.path().join("pki");
    // Concurrent first starts on one --cert-dir: one creates the PKI, the others load it.
    let (a, b, c) = tokio::join!(
        gateway(etcd.endpoints(), &certs),
        gateway(etcd.endpoints(), &certs),
        gateway(etcd.endpoints(), &certs),
    );
    let gateways = [&a, &b, &c];
    // One admin credential (written by whichever started first) works against all.
    let admin = a.admin();
    let clients: Vec<Client> = gateways.iter().map(|g| against(&admin, g, false)).collect();
    create_namespace(&clients[0], "scale").await;
    let base = "/api/v1/namespaces/scale/serviceaccounts";
    let rv = list_rv(&clients[1], base).await;

    let done: Done = Arc::new(|e| e.len() >= WRITES);
    let mut watchers = Vec::new();
    for (i, g) in gateways.iter().enumerate() {
        let n = WATCHERS / 3 + usize::from(i < WATCHERS % 3);
        let h2 = against(&admin, g, true);
        let path = format!("{base}?watch=1&resourceVersion={rv}");
        watchers.extend(open_watchers(&h2, &path, n, Duration::from_secs(90), done.clone()).await);
    }
    assert_eq!(watchers.len(), WATCHERS);

    let started = Instant::now();
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let clients = clients.clone();
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            for i in (w..WRITES).step_by(WRITERS) {
                let name = format!("cm-{i:04}");
                let c = &clients[i % clients.len()];
                let (s, obj) = c.post(base, json!({"metadata": {"name": name}})).await;
                assert_eq!(s, StatusCode::CREATED, "{obj}");
                acked.lock().insert(name, rv_of(&obj));
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let write_time = started.elapsed();
    let acked = acked.lock().clone();
    assert_eq!(acked.len(), WRITES);

    let mut first: Option<Vec<Seen>> = None;
    for w in watchers {
        let events = w.await.unwrap();
        assert_eq!(events.len(), WRITES, "a watcher missed events");
        assert_exactly_once(&events, &acked, &HashSet::new());
        match &first {
            None => first = Some(events),
            Some(f) => assert_eq!(&events, f, "watchers disagree on the stream"),
        }
    }
    eprintln!(
        "{WRITES} writes through 3 gateways in {write_time:?}; {WATCHERS} watchers saw all, in order, after {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn most_recent_list_on_one_gateway_sees_writes_acknowledged_by_another() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 1).await;
    let certs = dir.path().join("pki");
    let a = gateway(etcd.endpoints(), &certs).await;
    let b = gateway(etcd.endpoints(), &certs).await;
    let ca = a.admin();
    let cb = against(&ca, &b, false);
    create_namespace(&ca, "fresh").await;
    let base = "/api/v1/namespaces/fresh/serviceaccounts";
    for i in 0..20 {
        let name = format!("cm-{i}");
        let (s, obj) = ca.post(base, json!({"metadata": {"name": name}})).await;
        assert_eq!(s, StatusCode::CREATED, "{obj}");
        let written = rv_of(&obj);
        let (s, list) = cb.get(base).await;
        assert_eq!(s, StatusCode::OK, "{list}");
        assert!(
            rv_of(&list) >= written,
            "list older than an acknowledged write"
        );
        let names: Vec<&str> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str())
            .collect();
        assert!(names.contains(&name.as_str()), "B's list misses {name}");
        // A single GET on B is also current.
        let (s, got) = cb.get(&format!("{base}/{name}")).await;
        assert_eq!(s, StatusCode::OK, "{got}");
    }
}

/// Writes `cm-<tag>-<i>` through `clients` (round robin) until `stop`; returns acknowledged
/// (name → revision) and the names whose outcome is unknown (error answers).
async fn write_until(
    clients: Vec<Client>,
    base: &'static str,
    tag: &'static str,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> (HashMap<String, i64>, HashSet<String>) {
    let mut acked = HashMap::new();
    let mut unknown = HashSet::new();
    let mut i = 0usize;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let name = format!("cm-{tag}-{i:05}");
        let c = &clients[i % clients.len()];
        i += 1;
        let body = json!({"metadata": {"name": name}}).to_string();
        let resp = c.request(
            Method::POST,
            base,
            &body,
            &[("content-type", "application/json")],
        );
        match tokio::time::timeout(Duration::from_secs(15), resp).await {
            Ok(r) if r.status == StatusCode::CREATED => {
                acked.insert(name, rv_of(&r.json()));
            }
            _ => {
                unknown.insert(name);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    (acked, unknown)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_three_etcd_members_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = EtcdCluster::start(&dir.path().join("etcd"), 3).await;
    let certs = dir.path().join("pki");
    let a = gateway(etcd.endpoints(), &certs).await;
    let b = gateway(etcd.endpoints(), &certs).await;
    let ca = a.admin();
    let cb = against(&ca, &b, false);
    create_namespace(&ca, "ha").await;
    let base = "/api/v1/namespaces/ha/serviceaccounts";
    let rv = list_rv(&ca, base).await;

    // Watchers on both gateways read until the writer's final marker arrives.
    let done: Done = Arc::new(|e| e.last().is_some_and(|(_, n, _)| n == "zz-final"));
    let path = format!("{base}?watch=1&resourceVersion={rv}");
    let mut watchers = open_watchers(
        &against(&ca, &a, true),
        &path,
        5,
        Duration::from_secs(90),
        done.clone(),
    )
    .await;
    watchers.extend(
        open_watchers(
            &against(&ca, &b, true),
            &path,
            5,
            Duration::from_secs(90),
            done,
        )
        .await,
    );

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = ["w0", "w1"]
        .into_iter()
        .map(|tag| {
            tokio::spawn(write_until(
                vec![ca.clone(), cb.clone()],
                base,
                tag,
                stop.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    etcd.members[0].kill();
    let killed_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked = HashMap::new();
    let mut unknown = HashSet::new();
    for w in writers {
        let (a, u) = w.await.unwrap();
        acked.extend(a);
        unknown.extend(u);
    }
    // A final marker (also: writes go through after the kill), so watchers know when to stop.
    let (s, obj) = ca
        .post(base, json!({"metadata": {"name": "zz-final"}}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{obj}");
    acked.insert("zz-final".to_string(), rv_of(&obj));
    eprintln!(
        "member killed {:?} before the end; {} writes acknowledged, {} failed or unknown",
        killed_at.elapsed(),
        acked.len(),
        unknown.len()
    );

    // Every acknowledged write is there (a "Most Recent" list on each gateway).
    for c in [&ca, &cb] {
        let (s, list) = c.get(base).await;
        assert_eq!(s, StatusCode::OK, "{list}");
        let present: HashMap<String, i64> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap().to_string(),
                    rv_of(o),
                )
            })
            .collect();
        for (name, rv) in &acked {
            assert_eq!(present.get(name), Some(rv), "acknowledged {name} lost");
        }
    }
    // Every watcher saw every acknowledged write once, in order, with no gap or duplicate.
    for w in watchers {
        let events = w.await.unwrap();
        assert_exactly_once(&events, &acked, &unknown);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_fails_fast_and_watches_resume_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = EtcdCluster::start(&dir.path().join("etcd"), 1).await;
    let g = gateway(etcd.endpoints(), &dir.path().join("pki")).await;
    let c = g.admin();
    create_namespace(&c, "down").await;
    let base = "/api/v1/namespaces/down/serviceaccounts";
    let (s, obj) = c.post(base, json!({"metadata": {"name": "before"}})).await;
    assert_eq!(s, StatusCode::CREATED, "{obj}");
    let mut watch = c
        .watch(&format!("{base}?watch=1&resourceVersion={}", rv_of(&obj)))
        .await;

    etcd.members[0].kill();
    let started = Instant::now();
    let body = json!({"metadata": {"name": "during"}}).to_string();
    let r = c
        .request(
            Method::POST,
            base,
            &body,
            &[("content-type", "application/json")],
        )
        .await;
    assert!(
        r.status == StatusCode::SERVICE_UNAVAILABLE || r.status == StatusCode::GATEWAY_TIMEOUT,
        "write with etcd down: {} {}",
        r.status,
        r.text()
    );
    assert_eq!(r.json()["kind"], "Status");
    eprintln!(
        "write with etcd down: {} after {:?}",
        r.status,
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "write with etcd down took {:?}",
        started.elapsed()
    );
    let r = c.request(Method::GET, "/readyz?verbose", "", &[]).await;
    assert_ne!(r.status, StatusCode::OK);
    assert!(r.text().contains("[-]etcd failed"), "{}", r.text());
    // A "Most Recent" list needs etcd too.
    let r = c.request(Method::GET, base, "", &[]).await;
    assert!(
        r.status.is_server_error(),
        "list with etcd down: {}",
        r.status
    );

    etcd.members[0].start();
    etcd.wait_ready(Duration::from_secs(30)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.get("/readyz").await.0 != StatusCode::OK {
        assert!(Instant::now() < deadline, "never ready after etcd returned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, obj) = c.post(base, json!({"metadata": {"name": "after"}})).await;
    assert_eq!(s, StatusCode::CREATED, "{obj}");
    // The watch opened before the outage continues with the new write: nothing was compacted,
    // so the feed resumed where it stopped (had etcd compacted past it, the cache would have
    // relisted and this watcher would get a 410 ERROR event to relist too).
    let ev = watch
        .next_within(Duration::from_secs(20))
        .await
        .expect("watch ended");
    assert_eq!(ev["type"], "ADDED", "{ev}");
    assert_eq!(ev["object"]["metadata"]["name"], "after");
}
