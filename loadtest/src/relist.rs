//! `relist-storm`: W watchers, each behaving like a client-go reflector (list, then watch
//! from the list's resourceVersion; on a 410 ERROR event or a broken stream, list again).
//! A third of the way in, every watcher's connection is closed on the client side at one
//! instant and all of them re-list and re-watch at once — the herd a server sees when its
//! history expires for everyone. Measured: per-watcher time from that instant until its new
//! watch is accepted, relist errors (429, 5xx), and that afterwards every watcher sees every
//! acknowledged write exactly once, in order.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use memchr::memmem;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::Params;
use crate::report::{Counts, Percentiles, Results, TargetInfo};
use crate::setup::{Tgt, resolve_target, sa_body, seed};
use crate::stats::{self, Live, new_hist, now_nanos};
use crate::target::{self, Endpoint};

/// Objects the writers create once and then update in turn.
const POOL: u64 = 50;

/// One watcher's current segment: everything since its latest list.
#[derive(Default)]
struct Seg {
    /// The resourceVersion of the latest list (its watch starts after it).
    from_rv: u64,
    last_rv: u64,
    seen: u64,
    dups: u64,
    watching: bool,
}

#[derive(Default)]
struct StormCounters {
    relists: AtomicU64,
    e429: AtomicU64,
    e5xx: AtomicU64,
    other_errors: AtomicU64,
    expired_410: AtomicU64,
    stream_ends: AtomicU64,
    watching: AtomicU64,
}

/// Per watcher: the time from the storm to its accepted re-watch, in µs.
type Times = Arc<Mutex<Vec<Option<u64>>>>;

fn digits(b: &[u8]) -> Option<u64> {
    let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
    std::str::from_utf8(&b[..n]).ok()?.parse().ok()
}

fn after<'a>(hay: &'a [u8], needle: &[u8]) -> Option<&'a [u8]> {
    memmem::find(hay, needle).map(|i| &hay[i + needle.len()..])
}

/// A list response's body: only its resourceVersion is read; the items are skipped without
/// building them (a herd of 2,000 lists of 1,000 objects is about a gigabyte of JSON, and
/// building a `Value` of each made the load generator, not the server, the bottleneck).
#[derive(serde::Deserialize)]
struct ListHead {
    /// Only field read; `items` and the rest are skipped as unknown fields.
    metadata: ListMeta,
}

#[derive(serde::Deserialize)]
struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
}

/// The resourceVersion of a whole JSON list.
fn list_rv(body: &[u8]) -> Result<u64, String> {
    let l: ListHead = serde_json::from_slice(body).map_err(|e| format!("bad JSON: {e}"))?;
    l.metadata
        .resource_version
        .parse()
        .map_err(|_| "no resourceVersion".to_string())
}

/// The most of a list's start kept to find its resourceVersion in.
const LIST_HEAD_MAX: usize = 64 * 1024;

/// The resourceVersion of a list's start, when the list's own `metadata` (which both
/// kube-apiserver and svc-gateway write before `items`) holds it: `Some(Err)` when it is
/// there but not a number, `None` when the start does not tell (yet).
fn head_rv(head: &[u8]) -> Option<Result<u64, String>> {
    let items = memmem::find(head, b"\"items\":")?;
    let before = &head[..items];
    let meta = memmem::find(before, b"\"metadata\":")?;
    let rv = after(&before[meta..], b"\"resourceVersion\":\"")?;
    Some(digits(rv).ok_or_else(|| "no resourceVersion".to_string()))
}

/// Reads a list's whole body, as a reflector does before it watches, but keeps only its
/// start: the resourceVersion is read there and the items stream past without being kept
/// (copying 2,000 bodies of 400 KB into buffers and scanning them was most of the load
/// generator's time in a storm, which set the storm's pace through a proxy). A list whose
/// start does not tell is kept whole and parsed.
async fn read_list_rv(mut body: Incoming) -> Result<u64, String> {
    let mut head = BytesMut::new();
    let mut found = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("list body: {e}"))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if found.is_some() {
            continue;
        }
        head.extend_from_slice(&data);
        if head.len() <= LIST_HEAD_MAX || head.len() == data.len() {
            found = head_rv(&head);
            if found.is_some() {
                head = BytesMut::new();
            }
        }
    }
    match found {
        Some(rv) => rv,
        None => list_rv(&head),
    }
}

/// Lists the collection (no resourceVersion: the newest state, as a reflector does) on a
/// fresh connection and opens a watch from the list's resourceVersion. Retries with backoff
/// on 429, 5xx and transport errors, counting each, until `stop`.
async fn relist_and_watch(
    ep: &Endpoint,
    ns: &str,
    sh: &StormCounters,
    live: &Live,
    stop: &watch::Receiver<bool>,
    idx: usize,
) -> Option<(u64, Incoming)> {
    let mut backoff = Duration::from_millis(50);
    let coll = format!("/api/v1/namespaces/{ns}/serviceaccounts");
    while !*stop.borrow() {
        sh.relists.fetch_add(1, Relaxed);
        let r: Result<(u64, Incoming), (Option<StatusCode>, String)> = async {
            let mut c = ep
                .connect(false)
                .await
                .map_err(|e| (None, format!("connect: {e:#}")))?;
            let resp = c
                .send(target::request(Method::GET, &coll, Bytes::new(), ""))
                .await
                .map_err(|e| (None, format!("relist: {e:#}")))?;
            let st = resp.status();
            if st != StatusCode::OK {
                let b = resp.into_body().collect().await.map(|b| b.to_bytes());
                let b = b.unwrap_or_default();
                return Err((
                    Some(st),
                    format!(
                        "relist: {st}: {}",
                        String::from_utf8_lossy(&b[..b.len().min(200)])
                    ),
                ));
            }
            let rv = read_list_rv(resp.into_body())
                .await
                .map_err(|e| (Some(st), format!("relist: {e}")))?;
            let path = format!("{coll}?watch=1&resourceVersion={rv}");
            let resp = c
                .send(target::request(Method::GET, &path, Bytes::new(), ""))
                .await
                .map_err(|e| (None, format!("watch: {e:#}")))?;
            let st = resp.status();
            if st != StatusCode::OK {
                return Err((Some(st), format!("watch: {st}")));
            }
            // The connection lives as long as the response body.
            Ok((rv, resp.into_body()))
        }
        .await;
        match r {
            Ok(x) => return Some(x),
            Err((st, msg)) => {
                match st.map(|s| s.as_u16()) {
                    Some(429) => sh.e429.fetch_add(1, Relaxed),
                    Some(500..=599) => sh.e5xx.fetch_add(1, Relaxed),
                    _ => sh.other_errors.fetch_add(1, Relaxed),
                };
                live.watch_errors.fetch_add(1, Relaxed);
                live.note_error(msg);
                // Jittered exponential backoff, as a reflector's: a herd that retries in
                // lockstep would only hit the server again all at once.
                let jitter = Duration::from_millis((idx as u64 * 7919) % 50);
                tokio::time::sleep(backoff + jitter).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
    None
}

/// What ended a watch: the storm (client closes), a 410 or a broken stream (relist), stop.
enum End {
    Storm,
    Relist,
    Stop,
}

#[allow(clippy::too_many_arguments)]
async fn watcher(
    idx: usize,
    ep: Endpoint,
    ns: String,
    seg: Arc<Mutex<Seg>>,
    sh: Arc<StormCounters>,
    live: Arc<Live>,
    times: Times,
    mut storm: watch::Receiver<Option<Instant>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut storm_at: Option<Instant> = None;
    loop {
        let Some((rv, mut body)) = relist_and_watch(&ep, &ns, &sh, &live, &stop, idx).await else {
            return;
        };
        if let Some(t) = storm_at.take() {
            times.lock()[idx] = Some(t.elapsed().as_micros() as u64);
        }
        {
            let mut s = seg.lock();
            *s = Seg {
                from_rv: rv,
                last_rv: rv,
                watching: true,
                ..Seg::default()
            };
        }
        sh.watching.fetch_add(1, Relaxed);
        let mut rem = BytesMut::new();
        let end = loop {
            tokio::select! {
                f = body.frame() => match f {
                    Some(Ok(f)) => {
                        let Ok(data) = f.into_data() else { continue };
                        rem.extend_from_slice(&data);
                        if parse(&mut rem, &seg, &sh, &live) {
                            break End::Relist;
                        }
                    }
                    _ => {
                        if !*stop.borrow() {
                            sh.stream_ends.fetch_add(1, Relaxed);
                        }
                        break End::Relist;
                    }
                },
                r = storm.changed() => {
                    if r.is_err() { break End::Stop }
                    storm_at = *storm.borrow();
                    break End::Storm;
                }
                _ = stop.changed() => break End::Stop,
            }
        };
        seg.lock().watching = false;
        sh.watching.fetch_sub(1, Relaxed);
        // Dropping the body closes this watch's connection (HTTP/1.1: one request at a time).
        drop(body);
        match end {
            End::Stop => return,
            End::Storm | End::Relist => {}
        }
    }
}

/// Parses complete JSON lines; returns true when a 410 ERROR says to relist.
fn parse(rem: &mut BytesMut, seg: &Mutex<Seg>, sh: &StormCounters, live: &Live) -> bool {
    while let Some(nl) = memchr::memchr(b'\n', rem) {
        let line = rem.split_to(nl + 1);
        let ty = after(&line, b"\"type\":\"").unwrap_or_default();
        if ty.starts_with(b"BOOKMARK") || line.iter().all(|c| c.is_ascii_whitespace()) {
            continue;
        }
        if ty.starts_with(b"ERROR") {
            if memmem::find(&line, b"\"code\":410").is_some() {
                sh.expired_410.fetch_add(1, Relaxed);
                return true;
            }
            live.watch_errors.fetch_add(1, Relaxed);
            live.note_error(format!(
                "watch ERROR event: {}",
                String::from_utf8_lossy(&line[..line.len().min(300)])
            ));
            continue;
        }
        let Some(rv) = after(&line, b"\"resourceVersion\":\"").and_then(digits) else {
            live.watch_errors.fetch_add(1, Relaxed);
            live.note_error("watch event without a resourceVersion".into());
            continue;
        };
        let mut s = seg.lock();
        if rv <= s.last_rv {
            s.dups += 1;
        }
        s.last_rv = s.last_rv.max(rv);
        s.seen += 1;
        live.delivered.fetch_add(1, Relaxed);
    }
    false
}

/// One writer: creates `POOL` objects, then updates them in turn, recording the
/// resourceVersion of every acknowledged write (what every watcher must then see).
#[allow(clippy::too_many_arguments)]
async fn writer(
    ep: Endpoint,
    ns: String,
    w: usize,
    rate: Option<f64>,
    size: usize,
    live: Arc<Live>,
    acked: Arc<Mutex<Vec<u64>>>,
    stop: watch::Receiver<bool>,
) {
    let coll = format!("/api/v1/namespaces/{ns}/serviceaccounts");
    let start = Instant::now();
    let mut conn = None;
    let mut i: u64 = 0;
    while !*stop.borrow() {
        if let Some(r) = rate.filter(|r| *r > 0.0) {
            let at = start + Duration::from_secs_f64(i as f64 / r);
            tokio::time::sleep_until(at.into()).await;
            if *stop.borrow() {
                break;
            }
        }
        let name = format!("w-{w}-{}", i % POOL);
        let (m, path) = if i < POOL {
            (Method::POST, coll.clone())
        } else {
            (Method::PUT, format!("{coll}/{name}"))
        };
        i += 1;
        if conn.is_none() {
            conn = ep.connect(false).await.ok();
        }
        let Some(c) = conn.as_mut() else {
            live.write_errors.fetch_add(1, Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let t0 = Instant::now();
        let body = sa_body(&ns, &name, size);
        match c.call(m, &path, body.into(), "application/json").await {
            Ok((st, b)) if st.is_success() => {
                live.writes.fetch_add(1, Relaxed);
                live.record_write(t0.elapsed().as_micros() as u64);
                let rv = serde_json::from_slice::<serde_json::Value>(&b)
                    .ok()
                    .and_then(|v| v["metadata"]["resourceVersion"].as_str()?.parse().ok());
                match rv {
                    Some(rv) => acked.lock().push(rv),
                    None => {
                        live.write_failed("write answer without a resourceVersion".into());
                    }
                }
            }
            Ok((st, b)) => {
                live.write_failed(format!(
                    "write {path}: {st}: {}",
                    String::from_utf8_lossy(&b[..b.len().min(200)])
                ));
            }
            Err(e) => {
                live.write_failed(format!("write {path}: {e:#}"));
                conn = None;
            }
        }
    }
}

/// Waits until `cond` holds or `limit` passes; returns whether it held.
async fn wait_for(limit: Duration, cond: impl Fn() -> bool) -> bool {
    let t0 = Instant::now();
    while !cond() {
        if t0.elapsed() >= limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// The quiet window measured before the storm.
const QUIET_WINDOW: Duration = Duration::from_secs(2);

/// The processes whose costs the storm is measured by.
struct Pids {
    server: Option<String>,
    store: Option<String>,
}

/// CPU seconds of the server and the store, and the store's RSS, at one instant.
struct Sample {
    at: Instant,
    server_cpu: Option<f64>,
    store_cpu: Option<f64>,
    store_rss: Option<u64>,
}

impl Pids {
    fn sample(&self) -> Sample {
        Sample {
            at: Instant::now(),
            server_cpu: self.server.as_deref().and_then(stats::proc_cpu_secs),
            store_cpu: self.store.as_deref().and_then(stats::proc_cpu_secs),
            store_rss: self.store.as_deref().and_then(stats::proc_rss_bytes),
        }
    }
}

impl Sample {
    /// Cores used (server, store) between `earlier` and this sample, over at least `min_s`.
    fn rates_since(&self, earlier: &Sample, min_s: f64) -> (Option<f64>, Option<f64>) {
        let secs = self
            .at
            .duration_since(earlier.at)
            .as_secs_f64()
            .max(min_s)
            .max(1e-3);
        let rate = |a: Option<f64>, b: Option<f64>| Some((a? - b?).max(0.0) / secs);
        (
            rate(self.server_cpu, earlier.server_cpu),
            rate(self.store_cpu, earlier.store_cpu),
        )
    }
}

/// What the storm cost: cores (server, store) quiet and during, the store's RSS.
struct StormCosts {
    quiet: (Option<f64>, Option<f64>),
    storm: (Option<f64>, Option<f64>),
    store_rss_before: Option<u64>,
    store_rss_peak: Option<u64>,
}

pub async fn run(p: &Params) -> Result<Results> {
    let (tgt, info) = resolve_target(p).await?;
    let Tgt::Server(ep) = tgt else {
        bail!(
            "relist-storm runs against a Kubernetes-compatible server (--server or --kubeconfig)"
        );
    };
    if p.media != "json" {
        bail!("relist-storm watches in JSON only");
    }
    let live = Live::new();
    let ns = format!(
        "lt-storm-{}-{}",
        std::process::id(),
        now_nanos() % 1_000_000_000
    );
    // The collection every relist returns: --objects ServiceAccounts (the writers add POOL).
    seed(&ep, &ns, p.objects, p.object_size, &live).await?;

    let w = p.watchers;
    let sh = Arc::new(StormCounters::default());
    let segs: Vec<Arc<Mutex<Seg>>> = (0..w).map(|_| Arc::default()).collect();
    let times: Times = Arc::new(Mutex::new(vec![None; w]));
    let (storm_tx, storm_rx) = watch::channel(None::<Instant>);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (wstop_tx, wstop_rx) = watch::channel(false);
    let total = Arc::new(Mutex::new(new_hist()));
    let series = Arc::new(Mutex::new(Vec::new()));
    let sampler = tokio::spawn(stats::sampler(
        live.clone(),
        info.server_pid,
        total.clone(),
        series.clone(),
        format!("relist-storm {}", info.kind),
    ));

    // Initial list+watch for everyone (also a herd, but not the one measured).
    let t_open = Instant::now();
    let tasks = spawn_watchers(&ep, &ns, &segs, &sh, &live, &times, (&storm_rx, &stop_rx));
    let opened = wait_for(Duration::from_secs(120), || all_watching(&sh, w)).await;
    let initial_open_s = t_open.elapsed().as_secs_f64();
    let watchers_opened = sh.watching.load(Relaxed);
    if !opened {
        live.note_error(format!(
            "only {watchers_opened} of {w} watchers were watching after 120 s"
        ));
    }

    let acked = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let wh = spawn_writers(p, &ep, &ns, &live, &acked, &wstop_rx);
    tokio::time::sleep(p.duration / 3).await;

    // What the server and the store (`--store-pid`: etcd, or a proxy's upstream) spend in two
    // quiet seconds before the storm, and during it.
    let pids = Pids {
        server: info.server_pid.map(|p| p.to_string()),
        store: p.store_pid.map(|p| p.to_string()),
    };
    let quiet = pids.sample();
    tokio::time::sleep(QUIET_WINDOW).await;
    let before = pids.sample();
    let rss_peak = Arc::new(Mutex::new(before.store_rss));
    let rss_sampler = {
        let (peak, pid) = (rss_peak.clone(), pids.store.clone());
        let mut done = stop_rx.clone();
        tokio::spawn(async move {
            let Some(pid) = pid else { return };
            loop {
                if let Some(r) = stats::proc_rss_bytes(&pid) {
                    let mut p = peak.lock();
                    *p = Some(p.map_or(r, |m: u64| m.max(r)));
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = done.changed() => return,
                }
            }
        })
    };
    let relists_before = sh.relists.load(Relaxed);
    let storm_at = Instant::now();
    let all_back = storm(&storm_tx, storm_at, &times, &sh, w).await;
    let storm_s = storm_at.elapsed().as_secs_f64();
    let after = pids.sample();
    rss_sampler.abort();
    let costs = StormCosts {
        quiet: before.rates_since(&quiet, QUIET_WINDOW.as_secs_f64()),
        storm: after.rates_since(&before, storm_s),
        store_rss_before: before.store_rss,
        store_rss_peak: *rss_peak.lock(),
    };
    // Writes keep going for the rest of the run, and at least a third of it after everyone
    // is back, so the gap check covers writes made after the storm.
    let rest = (p.duration * 2 / 3).saturating_sub(storm_at.elapsed());
    tokio::time::sleep(rest.max(p.duration / 3)).await;
    let _ = wstop_tx.send(true);
    for h in wh {
        let _ = h.await;
    }
    let write_phase = started.elapsed();

    // Drain: every watcher must see every acknowledged write after its latest list.
    let mut acked = std::mem::take(&mut *acked.lock());
    acked.sort_unstable();
    wait_for(p.drain, || {
        segs.iter().all(|s| {
            let s = s.lock();
            s.seen >= expected_after(&acked, s.from_rv)
        })
    })
    .await;
    let elapsed = started.elapsed();
    live.stopping.store(true, Relaxed);
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    let _ = sampler.await;
    crate::setup::remove_namespace(&ep, &ns).await;

    let m = Measured {
        watchers_opened,
        initial_open_s,
        relists_before,
        storm_s,
        all_back,
        costs,
        acked,
        write_phase,
        elapsed,
        series: series.lock().clone(),
    };
    Ok(results(p, info, &sh, &live, &segs, times.lock().clone(), m))
}

fn all_watching(sh: &StormCounters, w: usize) -> bool {
    sh.watching.load(Relaxed) == w as u64
}

/// Each watcher's task: an initial list and watch, then a relist when the storm comes.
fn spawn_watchers(
    ep: &Endpoint,
    ns: &str,
    segs: &[Arc<Mutex<Seg>>],
    sh: &Arc<StormCounters>,
    live: &Arc<Live>,
    times: &Times,
    (storm_rx, stop_rx): (&watch::Receiver<Option<Instant>>, &watch::Receiver<bool>),
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::with_capacity(segs.len());
    for (i, seg) in segs.iter().enumerate() {
        tasks.push(tokio::spawn(watcher(
            i,
            ep.clone(),
            ns.to_string(),
            seg.clone(),
            sh.clone(),
            live.clone(),
            times.clone(),
            storm_rx.clone(),
            stop_rx.clone(),
        )));
    }
    tasks
}

/// The storm: one instant, every watch closed by its client. Waits (up to 120 s) until
/// every watcher has relisted and watches again; whether they all did.
async fn storm(
    storm_tx: &watch::Sender<Option<Instant>>,
    storm_at: Instant,
    times: &Times,
    sh: &StormCounters,
    w: usize,
) -> bool {
    let _ = storm_tx.send(Some(storm_at));
    wait_for(Duration::from_secs(120), || {
        times.lock().iter().filter(|t| t.is_some()).count() == w && all_watching(sh, w)
    })
    .await
}

/// Writes acknowledged at revisions after `from`, of the sorted `acked`.
fn expected_after(acked: &[u64], from: u64) -> u64 {
    (acked.len() - acked.partition_point(|&r| r <= from)) as u64
}

/// The writers, each adding ServiceAccounts at its share of `--rate` until stopped.
fn spawn_writers(
    p: &Params,
    ep: &Endpoint,
    ns: &str,
    live: &Arc<Live>,
    acked: &Arc<Mutex<Vec<u64>>>,
    wstop_rx: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let writers = p.writers.max(1);
    let rate = (!p.max).then(|| p.rate / writers as f64);
    let mut wh = Vec::new();
    for i in 0..writers {
        wh.push(tokio::spawn(writer(
            ep.clone(),
            ns.to_string(),
            i,
            rate,
            p.object_size,
            live.clone(),
            acked.clone(),
            wstop_rx.clone(),
        )));
    }
    wh
}

/// What the run measured, for `results`.
struct Measured {
    watchers_opened: u64,
    initial_open_s: f64,
    relists_before: u64,
    storm_s: f64,
    costs: StormCosts,
    all_back: bool,
    /// Revisions of the acknowledged writes, sorted.
    acked: Vec<u64>,
    write_phase: Duration,
    elapsed: Duration,
    series: Vec<stats::Sample>,
}

/// Turns the watchers' segments, the relist times and the counters into `Results`.
fn results(
    p: &Params,
    info: TargetInfo,
    sh: &StormCounters,
    live: &Live,
    segs: &[Arc<Mutex<Seg>>],
    times: Vec<Option<u64>>,
    m: Measured,
) -> Results {
    let w = p.watchers;
    let acked = &m.acked;
    let expected_of = |from: u64| expected_after(acked, from);
    let (mut delivered, mut expected, mut complete, mut missing, mut dups) = (0, 0, 0, 0, 0);
    for s in segs {
        let s = s.lock();
        let e = expected_of(s.from_rv);
        delivered += s.seen;
        expected += e;
        missing += e.saturating_sub(s.seen);
        dups += s.dups;
        if s.seen == e && s.dups == 0 {
            complete += 1;
        }
    }
    let mut relist = new_hist();
    for t in times.iter().flatten() {
        relist.saturating_record((*t).max(1));
    }
    let rewatched = times.iter().flatten().count();
    let g = |a: &AtomicU64| a.load(Relaxed);
    let mut extra = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        extra.insert(k.into(), v);
    };
    put("objects", p.objects.into());
    put("initial_open_s", m.initial_open_s.into());
    put("storm_watchers", w.into());
    put("storm_rewatched", rewatched.into());
    put("storm_all_back", m.all_back.into());
    put(
        "all_watching_again_ms",
        (relist.max() as f64 / 1000.0).into(),
    );
    put("storm_wait_s", m.storm_s.into());
    let cores = |v: Option<f64>| v.map_or(serde_json::Value::Null, Into::into);
    put("server_cores_quiet", cores(m.costs.quiet.0));
    put("server_cores_storm", cores(m.costs.storm.0));
    put("store_cores_quiet", cores(m.costs.quiet.1));
    put("store_cores_storm", cores(m.costs.storm.1));
    let mib = |v: Option<u64>| v.map_or(serde_json::Value::Null, |b| (b as f64 / 1048576.0).into());
    put("store_rss_before_mib", mib(m.costs.store_rss_before));
    put("store_rss_storm_peak_mib", mib(m.costs.store_rss_peak));
    put(
        "relists_in_storm",
        (g(&sh.relists) - m.relists_before).into(),
    );
    put("relist_errors_429", g(&sh.e429).into());
    put("relist_errors_5xx", g(&sh.e5xx).into());
    put("relist_errors_other", g(&sh.other_errors).into());
    put("expired_410_events", g(&sh.expired_410).into());
    put("stream_ends", g(&sh.stream_ends).into());
    let series = m.series;
    let write_lat = live.write_lat.lock().take().unwrap_or_else(new_hist);
    let acked_n = acked.len() as u64;
    let secs = m.elapsed.as_secs_f64().max(1e-3);
    Results {
        schema: crate::report::SCHEMA.into(),
        scenario: "relist-storm".into(),
        target: info,
        params: p.clone(),
        machine: stats::machine(),
        duration_s: m.write_phase.as_secs_f64(),
        elapsed_s: secs,
        series,
        // The scenario's latency: storm instant → that watcher's new watch accepted.
        latency_ms: Percentiles::of(&relist),
        write_latency_ms: Percentiles::of(&write_lat),
        counts: Counts {
            watchers: w as u64,
            watchers_opened: m.watchers_opened,
            writes_acked: acked_n,
            writes_per_s: acked_n as f64 / m.write_phase.as_secs_f64().max(1e-3),
            events_delivered: delivered,
            events_expected: expected,
            events_per_s: delivered as f64 / secs,
            watchers_complete: complete,
            missing,
            duplicates: dups,
            reconnects: g(&sh.relists).saturating_sub(w as u64),
            expired: g(&sh.expired_410),
            write_errors: g(&live.write_errors),
            watch_errors: g(&live.watch_errors),
            ..Default::default()
        },
        errors: live.error_samples.lock().clone(),
        extra,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_gives_its_resource_version_without_its_items() {
        let body = br#"{"kind":"ServiceAccountList","apiVersion":"v1","metadata":{"resourceVersion":"42"},"items":[{"metadata":{"resourceVersion":"7"}}]}"#;
        assert_eq!(list_rv(body), Ok(42));
        assert!(list_rv(br#"{"metadata":{},"items":[]}"#).is_err());
        assert!(list_rv(b"{").is_err());
    }

    #[test]
    fn a_list_start_gives_the_lists_own_resource_version() {
        let body = br#"{"kind":"ServiceAccountList","apiVersion":"v1","metadata":{"resourceVersion":"42"},"items":[{"metadata":{"resourceVersion":"7"}}]}"#;
        assert_eq!(head_rv(body), Some(Ok(42)));
        // Not yet at the items: the start does not tell.
        assert_eq!(
            head_rv(br#"{"kind":"List","metadata":{"resourceVersion":"4"#),
            None
        );
        // An item's resourceVersion is never taken for the list's.
        assert_eq!(head_rv(br#"{"items":[{"metadata":{"resourceVersion":"7"}}],"metadata":{"resourceVersion":"9"}}"#), None);
        assert_eq!(
            head_rv(br#"{"metadata":{},"items":[{"metadata":{"resourceVersion":"7"}}]}"#),
            None
        );
        assert!(matches!(
            head_rv(br#"{"metadata":{"resourceVersion":"x"},"items":[]}"#),
            Some(Err(_))
        ));
    }
}
