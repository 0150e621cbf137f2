//! The watcher scenarios (`fanout`, `slow-watcher`) and the write-only ones (`churn`,
//! `events`): set up the target, open watchers, run writers for the duration, drain, and
//! turn counters and histograms into a `Results` (with the server process's CPU per delivered
//! event). etcd is driven over native gRPC (`etcd.rs`), the raw baseline's server runs as a
//! child process (`raw.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::Bytes;
use futures::StreamExt;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Params;
use crate::report::{Counts, Percentiles, Results, TargetInfo};
use crate::run::Scenario;
use crate::setup::{Tgt, ensure_namespace, event_body, resolve_target, sa_body};
use crate::stats::{self, Live, new_hist, now_nanos, proc_cpu_secs};
use crate::target::{self, Conn, Endpoint};
use crate::watch::{Format, GroupCtx, Opener, WStream, run_group, tag};

/// A receiver's stream and how many watchers it carries (more than one: a raw-mux
/// connection's logical streams).
type Receiving = (WStream, usize);

/// Objects each fan-out writer creates once and then updates in turn.
const POOL: u64 = 50;
/// Concurrent connection attempts while opening watchers.
const OPEN_CONCURRENCY: usize = 256;

/// What a writer writes.
#[derive(Clone, Debug)]
enum Writes {
    /// Creates `POOL` service accounts, then updates them in turn (fan-out).
    Pool,
    /// Create, update, delete, each name once.
    Churn,
    /// Creates Events of this group, each name once.
    Events(String),
}

/// Everything a run collects while it goes.
struct Harness {
    live: Arc<Live>,
    total: Arc<parking_lot::Mutex<hdrhistogram::Histogram<u64>>>,
    series: Arc<parking_lot::Mutex<Vec<stats::Sample>>>,
    writers_stop: (watch::Sender<bool>, watch::Receiver<bool>),
    groups_stop: (watch::Sender<bool>, watch::Receiver<bool>),
}

impl Harness {
    fn new() -> Self {
        Harness {
            live: Live::new(),
            total: Arc::new(parking_lot::Mutex::new(new_hist())),
            series: Arc::new(parking_lot::Mutex::new(Vec::new())),
            writers_stop: watch::channel(false),
            groups_stop: watch::channel(false),
        }
    }
}

pub async fn run(scenario: Scenario, p: &Params) -> Result<Results> {
    let (tgt, mut info) = resolve_target(p).await?;
    let h = Harness::new();
    let run_id = format!("lt-{}-{}", std::process::id(), now_nanos() % 1_000_000_000);
    let writes = match scenario {
        Scenario::Churn => Writes::Churn,
        Scenario::Events => Writes::Events(p.event_group.clone()),
        _ => Writes::Pool,
    };
    if scenario == Scenario::Events && !matches!(tgt, Tgt::Server(_)) {
        bail!("the events scenario needs an API server (--server or --kubeconfig)");
    }
    let watchers = if matches!(writes, Writes::Pool) {
        p.watchers
    } else {
        0
    };

    // Set up the target and open the watchers before any write, so every watcher is
    // expected to see every acknowledged write.
    let (mut streams, format, opener, stalled_opener): (Vec<Receiving>, Format, Option<Opener>, _) =
        match &tgt {
            Tgt::Server(ep) if p.h2_frames => {
                let (s, format) = frames_setup(ep, &run_id, p, watchers).await?;
                (s, format, None, Some(ep.clone()))
            }
            Tgt::Server(ep) => {
                let (opener, format) = k8s_setup(ep, &run_id, p).await?;
                let s = open_all(watchers, p.h2_connections, ep, opener.clone()).await?;
                let s = s.into_iter().map(|s| (s, 1)).collect();
                (s, format, Some(opener), Some(ep.clone()))
            }
            Tgt::Etcd(_) => (Vec::new(), Format::Raw(p.object_size.max(16)), None, None),
            Tgt::Raw => (Vec::new(), Format::Raw(raw_frame_size(p)), None, None),
        };
    let prefix = format!("/loadtest/{run_id}/");
    let (_etcd, etcd_tasks, etcd_opened) = match &tgt {
        Tgt::Etcd(ep) => {
            let (e, w) = open_etcd_watchers(&ep.url, &prefix, watchers, p, &h).await?;
            (Some(e), w.tasks, w.opened)
        }
        _ => (None, Vec::new(), 0),
    };
    let raw_child = if matches!(tgt, Tgt::Raw) {
        Some(start_raw(p, &mut info, watchers, &mut streams).await?)
    } else {
        None
    };
    let raw_addr = raw_child.as_ref().map(|c| c.addr);
    let opened = streams.iter().map(|(_, n)| n).sum::<usize>() + etcd_opened;
    let open_failures = watchers - opened;

    let groups = spawn_groups(streams, &h, format, &opener);

    let server_pid = info.server_pid.map(|p| p.to_string());
    let sampler = tokio::spawn(stats::sampler(
        h.live.clone(),
        info.server_pid,
        h.total.clone(),
        h.series.clone(),
        format!("{} {}", scenario.name(), info.kind),
    ));

    // Writers.
    let store_pid = p.store_pid.map(|p| p.to_string());
    let cpu_start = server_pid.as_deref().and_then(proc_cpu_secs);
    let store_start = store_pid.as_deref().and_then(proc_cpu_secs);
    let tcp_start = stats::KernelTcp::read();
    let started = Instant::now();
    let writers_done = spawn_writers(scenario, p, &tgt, raw_addr, &run_id, &writes, &h)?;

    let (phase_a, stalled_held) =
        hold_writes(scenario, p, &h, stalled_opener.as_ref(), &run_id).await?;
    let _ = h.writers_stop.0.send(true);
    if let Some(done) = writers_done {
        let _ = done.await;
    }
    let write_phase = started.elapsed();

    let acked = h.live.writes.load(Relaxed);
    let expected_total = acked * opened as u64;
    drain(&h, opened, expected_total, p.drain).await;
    let elapsed = started.elapsed();
    let cpu_end = server_pid.as_deref().and_then(proc_cpu_secs);
    let store_end = store_pid.as_deref().and_then(proc_cpu_secs);
    let kernel_tcp = tcp_start
        .zip(stats::KernelTcp::read())
        .map(|(a, b)| b.since(&a));
    h.live.stopping.store(true, Relaxed);
    let _ = h.groups_stop.0.send(true);
    let states = collect_states(groups, etcd_tasks).await;
    if let Some(c) = raw_child {
        c.stop().await;
    }
    let _ = sampler.await;
    drop(stalled_held);
    if let Tgt::Server(ep) = &tgt {
        crate::setup::remove_namespace(ep, &run_id).await;
    }

    let t = Tally {
        watchers,
        opened,
        open_failures,
        acked,
        expected_total,
        write_phase,
        elapsed,
        server_cpu_s: cpu_start.zip(cpu_end).map(|(a, b)| (b - a).max(0.0)),
        store_cpu_s: store_start.zip(store_end).map(|(a, b)| (b - a).max(0.0)),
        kernel_tcp,
    };
    results(scenario, p, info, &h, &states, phase_a, t)
}

/// etcd: watches multiplexed on Watch streams over a few connections, each stream read by
/// its own task (not by the receiver groups).
async fn open_etcd_watchers(
    url: &str,
    prefix: &str,
    watchers: usize,
    p: &Params,
    h: &Harness,
) -> Result<(crate::etcd::Etcd, crate::etcd::Watchers)> {
    let e = crate::etcd::Etcd::connect(url, p.etcd_connections).await?;
    let rev = e.revision(prefix.as_bytes()).await?;
    let w = crate::etcd::open_watchers(
        &e,
        prefix.as_bytes(),
        rev + 1,
        watchers,
        p.etcd_watches_per_stream,
        h.live.clone(),
        h.groups_stop.1.clone(),
    )
    .await?;
    Ok((e, w))
}

/// raw: the server is a child process; each reader is returned once it is subscribed, so
/// no frame is sent before every reader can see it. With `--raw-connections`, the watchers
/// are logical streams over that many connections (raw-mux), each connection's streams
/// numbered contiguously so that a receiver group owns whole connections.
async fn start_raw(
    p: &Params,
    info: &mut TargetInfo,
    watchers: usize,
    streams: &mut Vec<Receiving>,
) -> Result<crate::raw::RawChild> {
    use crate::raw::mux;
    let child = crate::raw::RawChild::spawn(p.raw_cpus.as_deref()).await?;
    let addr = child.addr;
    info.server_pid = Some(p.server_pid.unwrap_or(child.pid));
    let pinned = p
        .raw_cpus
        .as_deref()
        .map(|c| format!(", taskset -c {c}"))
        .unwrap_or_default();
    let Some(conns) = p.raw_connections else {
        info.endpoint = format!(
            "{addr} (raw-server, pid {}{pinned}; {}-byte frames)",
            child.pid,
            raw_frame_size(p)
        );
        let socks: Vec<Result<tokio::net::TcpStream>> = futures::stream::iter(0..watchers)
            .map(|_| crate::raw::connect_reader(addr))
            .buffered(OPEN_CONCURRENCY)
            .collect()
            .await;
        for (i, s) in socks.into_iter().enumerate() {
            let s = tokio_util::io::ReaderStream::with_capacity(s?, crate::raw::MAX_WRITE);
            streams.push((tag(i, s), 1));
        }
        return Ok(child);
    };
    let conns = conns.clamp(1, watchers.max(1));
    info.endpoint = format!(
        "{addr} (raw-server, pid {}{pinned}; raw-mux: {watchers} streams over {conns} \
         connections, {}-byte frames)",
        child.pid,
        raw_frame_size(p)
    );
    let widths: Vec<usize> = (0..conns)
        .map(|c| mux::streams_on(watchers, conns, c))
        .filter(|n| *n > 0)
        .collect();
    let socks: Vec<Result<tokio::net::TcpStream>> = futures::stream::iter(widths.clone())
        .map(|n| crate::raw::connect_mux(addr, u32::try_from(n).unwrap_or(u32::MAX)))
        .buffered(OPEN_CONCURRENCY)
        .collect()
        .await;
    let mut base = 0;
    for (s, n) in socks.into_iter().zip(widths) {
        let s: WStream = Box::pin(mux::DemuxStream::new(s?, base, n as u32));
        streams.push((s, n));
        base += n;
    }
    Ok(child)
}

/// The size of a raw server's frames: `--raw-frame-bytes`, or the objects' size.
fn raw_frame_size(p: &Params) -> usize {
    p.raw_frame_bytes.unwrap_or(p.object_size).max(16)
}

/// Receivers: a few tasks, each multiplexing a share of the streams. A stream carries
/// `width` watchers (a raw-mux connection many, any other stream one), numbered on from the
/// previous stream's.
fn spawn_groups(
    streams: Vec<Receiving>,
    h: &Harness,
    format: Format,
    opener: &Option<Opener>,
) -> Vec<JoinHandle<crate::watch::Group>> {
    let mut groups: Vec<JoinHandle<crate::watch::Group>> = Vec::new();
    if !streams.is_empty() {
        let ngroups = streams.len().clamp(1, 16);
        // (first watcher, watchers, streams) of each group.
        let mut buckets: Vec<(usize, usize, Vec<WStream>)> =
            (0..ngroups).map(|_| (0, 0, Vec::new())).collect();
        // Streams are tagged in order; group g gets a contiguous range of them, and so of
        // watchers.
        let per = streams.len().div_ceil(ngroups).max(1);
        let mut next = 0;
        for (i, (s, width)) in streams.into_iter().enumerate() {
            let b = &mut buckets[i / per];
            if b.2.is_empty() {
                b.0 = next;
            }
            b.1 += width;
            b.2.push(s);
            next += width;
        }
        for (base, n, b) in buckets {
            if b.is_empty() {
                continue;
            }
            let ctx = GroupCtx {
                live: h.live.clone(),
                format,
                opener: opener.clone(),
                stop: h.groups_stop.1.clone(),
            };
            groups.push(tokio::spawn(run_group(ctx, base, b, n)));
        }
    }
    groups
}

/// Starts the writers for the target; `None` when there are none to wait for.
fn spawn_writers(
    scenario: Scenario,
    p: &Params,
    tgt: &Tgt,
    raw_addr: Option<std::net::SocketAddr>,
    run_id: &str,
    writes: &Writes,
    h: &Harness,
) -> Result<Option<tokio::sync::oneshot::Receiver<()>>> {
    let writers = p.writers.max(1);
    let per_writer_rate = if p.max {
        None
    } else {
        Some(p.rate / writers as f64)
    };
    // The writers run on their own thread and runtime (`stats::on_own_thread`), each
    // opening its own connection there: the watchers' event parsing in this runtime cannot
    // delay a write or its acknowledgement.
    let live = h.live.clone();
    let stop = h.writers_stop.1.clone();
    let size = p.object_size;
    let writers_done = match (tgt, raw_addr) {
        (Tgt::Raw, Some(addr)) => {
            let rate = if p.max { None } else { Some(p.rate) };
            let size = raw_frame_size(p);
            Some(stats::on_own_thread("lt-writer", move || async move {
                if let Err(e) = crate::raw::produce(addr, size, rate, stop, live.clone()).await {
                    live.write_failed(format!("raw writer: {e:#}"));
                }
            })?)
        }
        (Tgt::Server(ep), _) => {
            let (ep, run_id, writes) = (ep.clone(), run_id.to_string(), writes.clone());
            Some(stats::on_own_thread("lt-writers", move || async move {
                futures::future::join_all((0..writers).map(|w| {
                    k8s_writer(
                        ep.clone(),
                        run_id.clone(),
                        w,
                        Pace::new(per_writer_rate, w, writers),
                        size,
                        writes.clone(),
                        live.clone(),
                        stop.clone(),
                    )
                }))
                .await;
            })?)
        }
        (Tgt::Etcd(ep), _) => {
            // Connections of the writers' own (one each), not the watchers'.
            let (url, run_id) = (ep.url.clone(), run_id.to_string());
            let churn = scenario == Scenario::Churn;
            Some(stats::on_own_thread("lt-writers", move || async move {
                let etcd = match crate::etcd::Etcd::connect(&url, writers).await {
                    Ok(e) => e,
                    Err(e) => {
                        live.write_failed(format!("etcd writer: {e:#}"));
                        return;
                    }
                };
                futures::future::join_all((0..writers).map(|w| {
                    etcd_writer(
                        etcd.clone(),
                        run_id.clone(),
                        w,
                        Pace::new(per_writer_rate, w, writers),
                        size,
                        churn,
                        live.clone(),
                        stop.clone(),
                    )
                }))
                .await;
            })?)
        }
        _ => None,
    };
    Ok(writers_done)
}

/// A stalled watcher's connection and response, held and never read.
type Stalled = (Conn, http::Response<hyper::body::Incoming>);

/// Lets the writers run for the duration; slow-watcher also opens the stalled watchers half
/// way and returns the latency histogram from before them.
async fn hold_writes(
    scenario: Scenario,
    p: &Params,
    h: &Harness,
    stalled_opener: Option<&Endpoint>,
    run_id: &str,
) -> Result<(Option<hdrhistogram::Histogram<u64>>, Vec<Stalled>)> {
    // slow-watcher: half the run healthy, then stalled watchers join and never read.
    let mut phase_a = None;
    let mut stalled_held = Vec::new();
    if scenario == Scenario::SlowWatcher {
        tokio::time::sleep(p.duration / 2).await;
        phase_a = Some(snapshot_total(h));
        if let Some(ep) = stalled_opener {
            let path = format!("/api/v1/namespaces/{run_id}/serviceaccounts?watch=1");
            for _ in 0..p.stalled {
                let mut c = ep.connect(false).await?;
                let resp = c
                    .send(target::request(Method::GET, &path, Bytes::new(), ""))
                    .await?;
                // Held, never read: the server sees a watcher whose socket fills up.
                stalled_held.push((c, resp));
            }
        }
        tokio::time::sleep(p.duration - p.duration / 2).await;
    } else {
        tokio::time::sleep(p.duration).await;
    }
    Ok((phase_a, stalled_held))
}

/// Drain: waits (bounded by `limit`) until every watcher has every acknowledged write.
async fn drain(h: &Harness, opened: usize, expected_total: u64, limit: Duration) {
    let drain_start = Instant::now();
    while opened > 0
        && h.live.delivered.load(Relaxed) < expected_total
        && drain_start.elapsed() < limit
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every watcher's state, from the receiver groups and the etcd stream tasks.
async fn collect_states(
    groups: Vec<JoinHandle<crate::watch::Group>>,
    etcd_tasks: Vec<JoinHandle<Vec<crate::watch::WState>>>,
) -> Vec<crate::watch::WState> {
    let mut states = Vec::new();
    for g in groups {
        if let Ok(g) = g.await {
            states.extend(g.states);
        }
    }
    for t in etcd_tasks {
        if let Ok(s) = t.await {
            states.extend(s);
        }
    }
    states
}

/// What a run counted, for `results`.
struct Tally {
    watchers: usize,
    opened: usize,
    open_failures: usize,
    acked: u64,
    expected_total: u64,
    write_phase: Duration,
    elapsed: Duration,
    server_cpu_s: Option<f64>,
    store_cpu_s: Option<f64>,
    /// The kernel's TCP counters over the writes and the drain.
    kernel_tcp: Option<stats::KernelTcp>,
}

/// Turns the run's counters and histograms into its `Results`.
fn results(
    scenario: Scenario,
    p: &Params,
    info: TargetInfo,
    h: &Harness,
    states: &[crate::watch::WState],
    phase_a: Option<hdrhistogram::Histogram<u64>>,
    t: Tally,
) -> Result<Results> {
    let total = h.total.lock().clone();
    let write_lat = h.live.write_lat.lock().take().unwrap_or_else(new_hist);
    let delivered: u64 = states.iter().map(|s| s.count).sum();
    let complete = states
        .iter()
        .filter(|s| s.count == t.acked && s.dups == 0)
        .count();
    let missing: u64 = states
        .iter()
        .map(|s| t.acked.saturating_sub(s.count).max(s.gaps))
        .sum();
    let dups: u64 = states.iter().map(|s| s.dups).sum();
    let expired = states.iter().filter(|s| s.expired).count();
    let secs = t.elapsed.as_secs_f64().max(1e-3);
    let mut extra = serde_json::Map::new();
    let chunks: u64 = states.iter().map(|s| s.chunks).sum();
    if chunks > 0 {
        extra.insert(
            "events_per_chunk".into(),
            (delivered as f64 / chunks as f64).into(),
        );
    }
    if let Some(k) = t.kernel_tcp {
        extra.insert("kernel_tcp".into(), k.to_json());
    }
    if let Some(a) = phase_a {
        let mut b = total.clone();
        let _ = b.subtract(&a);
        extra.insert(
            "latency_before_stall_ms".into(),
            serde_json::to_value(Percentiles::of(&a))?,
        );
        extra.insert(
            "latency_with_stall_ms".into(),
            serde_json::to_value(Percentiles::of(&b))?,
        );
        extra.insert("stalled_watchers".into(), p.stalled.into());
    }
    let series = h.series.lock().clone();
    let offered_writes_per_s = (!p.max).then_some(p.rate);
    let server_cpu_s = t.server_cpu_s;
    let per = if delivered > 0 { delivered } else { t.acked };
    let per_event = |cpu: Option<f64>| cpu.filter(|_| per > 0).map(|c| c * 1e6 / per as f64);
    let server_cpu_us_per_event = per_event(server_cpu_s);
    Ok(Results {
        schema: crate::report::SCHEMA.into(),
        scenario: scenario.name().into(),
        target: info,
        params: p.clone(),
        machine: stats::machine(),
        duration_s: t.write_phase.as_secs_f64(),
        elapsed_s: secs,
        series,
        latency_ms: Percentiles::of(&total),
        write_latency_ms: Percentiles::of(&write_lat),
        counts: Counts {
            watchers: t.watchers as u64,
            watchers_opened: t.opened as u64,
            writes_acked: t.acked,
            writes_per_s: t.acked as f64 / t.write_phase.as_secs_f64().max(1e-3),
            events_delivered: delivered,
            events_expected: t.expected_total,
            events_per_s: delivered as f64 / secs,
            watchers_complete: complete as u64,
            missing,
            duplicates: dups,
            reconnects: h.live.reconnects.load(Relaxed),
            expired: expired as u64,
            write_errors: h.live.write_errors.load(Relaxed),
            watch_errors: h.live.watch_errors.load(Relaxed) + t.open_failures as u64,
            offered_writes_per_s,
            write_rate_achieved: offered_writes_per_s
                .filter(|o| *o > 0.0)
                .map(|o| t.acked as f64 / t.write_phase.as_secs_f64().max(1e-3) / o),
            offered_events_per_s: offered_writes_per_s.map(|r| r * t.opened as f64),
            server_cpu_s,
            server_cpu_us_per_event,
            store_cpu_s: t.store_cpu_s,
            store_cpu_us_per_event: per_event(t.store_cpu_s),
        },
        errors: h.live.error_samples.lock().clone(),
        extra,
    })
}

fn snapshot_total(h: &Harness) -> hdrhistogram::Histogram<u64> {
    // Same lock order as the sampler (total, then interval): no samples in between.
    let mut t = h.total.lock();
    let interval = h.live.interval.lock().replace(new_hist());
    if let Some(i) = interval {
        let _ = t.add(&i);
    }
    t.clone()
}

/// Opens `n` watchers: one HTTP/1.1 connection each, or h2 streams spread over `h2` connections.
async fn open_all(
    n: usize,
    h2: Option<usize>,
    ep: &Endpoint,
    opener: Opener,
) -> Result<Vec<WStream>> {
    let _ = (h2, ep);
    let opened: Vec<Result<WStream>> = futures::stream::iter(0..n)
        .map(|i| opener(i, 0))
        .buffer_unordered(OPEN_CONCURRENCY)
        .collect()
        .await;
    let mut out = Vec::with_capacity(n);
    let mut first_err = None;
    for r in opened {
        match r {
            Ok(s) => out.push(s),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if out.is_empty()
        && let Some(e) = first_err
    {
        return Err(e.context("no watcher could be opened"));
    }
    if let Some(e) = first_err {
        eprintln!("warning: {} watchers failed to open: {e:#}", n - out.len());
    }
    // Groups own contiguous index ranges: re-tag the opened streams 0..len.
    Ok(out
        .into_iter()
        .enumerate()
        .map(|(i, s)| -> WStream { Box::pin(s.map(move |(_, item)| (i, item))) })
        .collect())
}

/// A writer's connection: the open one, or a new one. On a failed connect the failure is
/// counted, the writer backs off briefly, and `None` tells it to try again.
async fn writer_conn<'a>(
    ep: &Endpoint,
    conn: &'a mut Option<Conn>,
    live: &Live,
    what: &str,
) -> Option<&'a mut Conn> {
    if conn.is_none() {
        match ep.connect(false).await {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                live.write_failed(format!("{what}: {e:#}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                return None;
            }
        }
    }
    conn.as_mut()
}

/// As [`k8s_setup`], with the watchers opened at once by the frame-level h2 client
/// (`--h2-frames`): one receiving stream per connection.
async fn frames_setup(
    ep: &Endpoint,
    ns: &str,
    p: &Params,
    watchers: usize,
) -> Result<(Vec<Receiving>, Format)> {
    let Some(conns) = p.h2_connections else {
        bail!("--h2-frames needs --h2-connections");
    };
    let mut c = ep.connect(false).await?;
    ensure_namespace(&mut c, ns).await?;
    let rv = crate::setup::list_rv(&mut c, ns).await?;
    let (format, accept) = if p.media == "protobuf" {
        (
            Format::K8sProto,
            "application/vnd.kubernetes.protobuf;stream=watch",
        )
    } else {
        (Format::K8sJson, "application/json")
    };
    let path = format!("/api/v1/namespaces/{ns}/serviceaccounts?watch=1&resourceVersion={rv}");
    let opened = crate::h2frames::open(ep, watchers, conns, accept, |_| path.clone()).await?;
    // Each connection carries a contiguous range of watchers, numbered on from the last.
    let mut base = 0;
    let mut out = Vec::with_capacity(opened.len());
    for (s, n) in opened {
        let s: WStream = Box::pin(s.map(move |(i, item)| (base + i, item)));
        out.push((s, n));
        base += n;
    }
    Ok((out, format))
}

/// Creates the run's namespace, reads the collection's resourceVersion, and returns the
/// watcher opener (which also serves reconnects, resuming from the last revision seen).
async fn k8s_setup(ep: &Endpoint, ns: &str, p: &Params) -> Result<(Opener, Format)> {
    let mut c = ep.connect(false).await?;
    ensure_namespace(&mut c, ns).await?;
    let rv = crate::setup::list_rv(&mut c, ns).await?;
    let proto = p.media == "protobuf";
    let format = if proto {
        Format::K8sProto
    } else {
        Format::K8sJson
    };
    // h2: a fixed set of shared connections; watchers are spread round-robin.
    let mut shared = Vec::new();
    if let Some(m) = p.h2_connections {
        for _ in 0..m.max(1) {
            shared.push(ep.connect(true).await?);
        }
    }
    let shared = Arc::new(shared);
    let ep = ep.clone();
    let ns = ns.to_string();
    let start_rv = rv;
    let opener: Opener = Arc::new(move |idx, last| {
        let ep = ep.clone();
        let ns = ns.clone();
        let shared = shared.clone();
        Box::pin(async move {
            let from = if last == 0 { start_rv } else { last };
            let mut conn = match shared.get(idx % shared.len().max(1)).and_then(Conn::share) {
                Some(c) => c,
                None => ep.connect(false).await?,
            };
            let path =
                format!("/api/v1/namespaces/{ns}/serviceaccounts?watch=1&resourceVersion={from}");
            let accept = if proto {
                "application/vnd.kubernetes.protobuf;stream=watch"
            } else {
                "application/json"
            };
            let mut req = target::request(Method::GET, &path, Bytes::new(), "");
            if let Ok(v) = accept.parse() {
                req.headers_mut().insert("accept", v);
            }
            let resp = conn.send(req).await?;
            if resp.status() != StatusCode::OK {
                let st = resp.status();
                let b = resp.into_body().collect().await?.to_bytes();
                bail!(
                    "watch: {st}: {}",
                    String::from_utf8_lossy(&b[..b.len().min(300)])
                );
            }
            // The connection lives as long as its response body (hyper keeps it).
            Ok(tag(idx, resp.into_body().into_data_stream()))
        })
    });
    Ok((opener, format))
}

/// When one of several writers sends: each at its share of the rate (`None`: at full
/// speed), writer `w` of `n` shifted by `w / n` of its interval, so that together they
/// offer one even stream of writes, as the raw baseline's single writer does, not `n`
/// writes at once every interval.
#[derive(Clone, Copy, Debug)]
struct Pace {
    per_writer: Option<f64>,
    phase: f64,
}

impl Pace {
    fn new(per_writer: Option<f64>, w: usize, writers: usize) -> Self {
        Pace {
            per_writer,
            phase: w as f64 / writers.max(1) as f64,
        }
    }

    /// When write `i` is due (`None`: at once).
    fn due(&self, start: Instant, i: u64) -> Option<Instant> {
        let r = self.per_writer.filter(|r| *r > 0.0)?;
        Some(start + Duration::from_secs_f64((i as f64 + self.phase) / r))
    }

    /// Waits until write `i` is due, or until `stop` is set: a writer waiting out its
    /// interval must not hold the end of the run (at 1 write/s per writer that added up to a
    /// second to the write phase, and took 8 % off the write rate the gateway's rows
    /// reported).
    async fn wait(&self, start: Instant, i: u64, stop: &mut watch::Receiver<bool>) {
        if let Some(at) = self.due(start, i) {
            tokio::select! {
                () = tokio::time::sleep_until(at.into()) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }
    }
}

/// One writer, on its own HTTP/1.1 connection, writing what `writes` says.
#[allow(clippy::too_many_arguments)]
async fn k8s_writer(
    ep: Endpoint,
    ns: String,
    w: usize,
    rate: Pace,
    size: usize,
    writes: Writes,
    live: Arc<Live>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conn: Option<Conn> = None;
    let start = Instant::now();
    let coll = format!("/api/v1/namespaces/{ns}/serviceaccounts");
    let mut i: u64 = 0;
    while !*stop.borrow() {
        rate.wait(start, i, &mut stop).await;
        if *stop.borrow() {
            break;
        }
        let (method, path, body) = match &writes {
            Writes::Churn => {
                let name = format!("c-{w}-{}", i / 3);
                match i % 3 {
                    0 => (Method::POST, coll.clone(), sa_body(&ns, &name, size)),
                    1 => (
                        Method::PUT,
                        format!("{coll}/{name}"),
                        sa_body(&ns, &name, size),
                    ),
                    _ => (Method::DELETE, format!("{coll}/{name}"), String::new()),
                }
            }
            Writes::Pool => {
                let name = format!("w-{w}-{}", i % POOL);
                if i < POOL {
                    (Method::POST, coll.clone(), sa_body(&ns, &name, size))
                } else {
                    (
                        Method::PUT,
                        format!("{coll}/{name}"),
                        sa_body(&ns, &name, size),
                    )
                }
            }
            Writes::Events(group) => (
                Method::POST,
                format!("/apis/{group}/v1/namespaces/{ns}/events"),
                event_body(group, &ns, &format!("e-{w}-{i}"), size),
            ),
        };
        i += 1;
        let Some(c) = writer_conn(&ep, &mut conn, &live, "writer connect").await else {
            continue;
        };
        let t0 = Instant::now();
        match c.call(method, &path, body.into(), "application/json").await {
            Ok((st, _)) if st.is_success() => {
                live.writes.fetch_add(1, Relaxed);
                live.record_write(t0.elapsed().as_micros() as u64);
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

/// One etcd writer: KV Put (and DeleteRange for churn) on connection `w`, each acknowledged
/// before the next.
#[allow(clippy::too_many_arguments)]
async fn etcd_writer(
    etcd: crate::etcd::Etcd,
    run: String,
    w: usize,
    rate: Pace,
    size: usize,
    churn: bool,
    live: Arc<Live>,
    mut stop: watch::Receiver<bool>,
) {
    use crate::etcd::Write;
    let start = Instant::now();
    let mut i: u64 = 0;
    while !*stop.borrow() {
        rate.wait(start, i, &mut stop).await;
        if *stop.borrow() {
            break;
        }
        let key = if churn {
            format!("/loadtest/{run}/c-{w}-{}", i / 3)
        } else {
            format!("/loadtest/{run}/w-{w}-{}", i % POOL)
        }
        .into_bytes();
        let op = if churn && i % 3 == 2 {
            Write::Delete(key)
        } else {
            // The value starts with the 19-digit timestamp the watchers decode.
            let mut v = format!("{:019}:", now_nanos()).into_bytes();
            v.resize(size.max(v.len()), b'x');
            Write::Put(key, v)
        };
        i += 1;
        let t0 = Instant::now();
        match crate::etcd::write(&etcd, w, op).await {
            Ok(()) => {
                live.writes.fetch_add(1, Relaxed);
                live.record_write(t0.elapsed().as_micros() as u64);
            }
            Err(e) => live.write_failed(format!("{e:#}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_together_offer_one_even_stream_of_writes() {
        // 10 writers at 10 writes/s each: 100 writes/s, one every 10 ms, not 10 at once.
        let start = Instant::now();
        let mut at: Vec<u128> = (0..10)
            .flat_map(|w| {
                let pace = Pace::new(Some(10.0), w, 10);
                (0..3).map(move |i| {
                    pace.due(start, i)
                        .unwrap()
                        .duration_since(start)
                        .as_micros()
                })
            })
            .collect();
        at.sort_unstable();
        let want: Vec<u128> = (0..30).map(|k| k * 10_000).collect();
        for (got, want) in at.iter().zip(&want) {
            assert!(got.abs_diff(*want) <= 1, "{at:?}");
        }
        assert_eq!(at.len(), 30);
        // At full speed nobody waits.
        assert_eq!(Pace::new(None, 3, 10).due(start, 1000), None);
    }
}
