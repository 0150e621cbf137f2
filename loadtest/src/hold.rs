//! The `hold` scenario: many concurrent watches held open (h2 streams over a fixed set of
//! connections, or one HTTP/1.1 connection each), opened in steps. After each step the
//! server's and the load generator's RSS are read from /proc and turned into bytes per watch
//! (ΔRSS / Δwatches), then a few writes go into the namespace every watch watches and each
//! stream's own count must rise by exactly the writes acknowledged (streams that missed or
//! got extra events are reported). Ramping stops early, with the reason recorded, when the
//! machine runs low on memory or opens fail.
//!
//! The receiving side is cheap per stream: no task per stream (a few tasks each poll a
//! `SelectAll` of response bodies), one `AtomicU32` counter per stream, and a partial-line
//! buffer only for a stream whose last chunk ended mid-line.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use clap::Args;
use futures::StreamExt;
use futures::stream::SelectAll;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use memchr::memmem::Finder;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::Params;
use crate::report::{Counts, Percentiles, Results, TargetInfo};
use crate::run::Scenario;
use crate::setup::{Tgt, ensure_namespace, resolve_target, sa_body};
use crate::stats::{self, Live, new_hist, now_nanos, proc_cpu_secs, proc_rss_bytes};
use crate::target::{self, Conn, Endpoint};
use crate::watch::{Item, TS_ANNOTATION, WStream, tag};

/// Tasks receiving the watch streams (each polls its share of them).
const RECEIVERS: usize = 4;
/// Watches opened between two checks of the machine's available memory.
const CHUNK: usize = 10_000;
/// Items a receiver handles before it lets other tasks run.
const YIELD_EVERY: u32 = 64;
/// Stream indices listed in the report per kind of fault.
const SAMPLE: usize = 10;

/// `svc-loadtest hold`: the shared flags plus the steps and checks of this scenario.
#[derive(Args, Clone, Debug, Serialize)]
pub struct HoldArgs {
    #[command(flatten)]
    pub params: Params,
    /// Total watches after each step, ascending, comma-separated (e.g. 10000,100000,1000000);
    /// default: one step of --watchers.
    #[arg(long, value_delimiter = ',')]
    pub steps: Vec<usize>,
    /// Writes (ServiceAccount creates, paced at --rate) after each step; every open watch
    /// must receive each of them.
    #[arg(long, default_value_t = 3)]
    pub writes_per_step: u64,
    /// Wait after a step's last open (and after its writes) before RSS is read.
    #[arg(long, default_value = "3s", value_parser = crate::parse_duration)]
    #[serde(serialize_with = "secs")]
    pub settle: Duration,
    /// Stop ramping when the machine's MemAvailable falls below this (MiB): the run then
    /// reports where it stopped instead of pushing the machine into the OOM killer.
    #[arg(long, default_value_t = 3072)]
    pub min_available_mib: u64,
    /// Watch requests in flight at once while opening.
    #[arg(long, default_value_t = 512)]
    pub open_concurrency: usize,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl HoldArgs {
    /// The scenario with its defaults and the shared flags given (`compare`-style callers).
    pub fn of(params: Params) -> Self {
        HoldArgs {
            params,
            steps: Vec::new(),
            writes_per_step: 3,
            settle: Duration::from_secs(3),
            min_available_mib: 3072,
            open_concurrency: 512,
        }
    }
}

/// The step targets: ascending, none zero; `watchers` alone when none were given.
pub fn plan(steps: &[usize], watchers: usize) -> Result<Vec<usize>> {
    let s = if steps.is_empty() {
        vec![watchers]
    } else {
        steps.to_vec()
    };
    if s.contains(&0) {
        bail!("--steps: every step needs at least one watch");
    }
    if s.windows(2).any(|w| w[1] <= w[0]) {
        bail!("--steps must be strictly ascending (totals after each step): {s:?}");
    }
    Ok(s)
}

/// Bytes per watch added between two readings; `None` without both readings or new watches.
pub fn bytes_per(prev: Option<u64>, now: Option<u64>, prev_n: usize, n: usize) -> Option<f64> {
    let (a, b) = (prev?, now?);
    (n > prev_n).then(|| (b as f64 - a as f64) / (n - prev_n) as f64)
}

/// MemAvailable of /proc/meminfo's text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let l = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(l.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// The kernel's TCP socket memory (all sockets of the machine) from /proc/net/sockstat's
/// text, in bytes: it is in no process's RSS.
pub fn tcp_mem(sockstat: &str) -> Option<u64> {
    let l = sockstat.lines().find(|l| l.starts_with("TCP:"))?;
    let mut f = l.split_whitespace();
    f.position(|w| w == "mem")?;
    // Pages; 4 KiB on every Linux configuration this runs on.
    Some(f.next()?.parse::<u64>().ok()? * 4096)
}

/// What one write phase found, stream by stream.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseCheck {
    /// Streams whose count rose by exactly the writes acknowledged.
    pub complete: u64,
    /// Streams that received fewer events than writes acknowledged, and how many events
    /// they missed in all.
    pub missed_streams: u64,
    pub missing_events: u64,
    /// Streams that received more (duplicates or foreign events).
    pub extra_streams: u64,
    pub extra_events: u64,
    /// The first few indices of each.
    pub first_missed: Vec<usize>,
    pub first_extra: Vec<usize>,
}

/// Compares each open stream's count before and after a phase with the `acked` writes
/// (`open[i]` false: watch `i` never opened, and is not checked).
pub fn check(before: &[u32], after: &[u32], open: &[bool], acked: u64) -> PhaseCheck {
    let mut c = PhaseCheck::default();
    for (i, (b, a)) in before.iter().zip(after).enumerate() {
        if !open.get(i).copied().unwrap_or(false) {
            continue;
        }
        let got = u64::from(a.wrapping_sub(*b));
        if got == acked {
            c.complete += 1;
        } else if got < acked {
            c.missed_streams += 1;
            c.missing_events += acked - got;
            if c.first_missed.len() < SAMPLE {
                c.first_missed.push(i);
            }
        } else {
            c.extra_streams += 1;
            c.extra_events += got - acked;
            if c.first_extra.len() < SAMPLE {
                c.first_extra.push(i);
            }
        }
    }
    c
}

/// Events in a watch stream's bytes: complete JSON lines carrying the run's timestamp
/// annotation (the writes of this run); `ERROR` events are counted apart. `rem` holds a
/// line cut by the end of a chunk until the rest arrives.
pub struct LineCounter {
    ts: Finder<'static>,
    error: Finder<'static>,
}

impl Default for LineCounter {
    fn default() -> Self {
        LineCounter {
            ts: Finder::new(format!("\"{TS_ANNOTATION}\":\"").as_bytes()).into_owned(),
            error: Finder::new(b"\"type\":\"ERROR\"").into_owned(),
        }
    }
}

impl LineCounter {
    /// Returns (events, errors) in the complete lines of `rem` + `chunk`; the incomplete
    /// tail stays in `rem`.
    pub fn feed(&self, rem: &mut BytesMut, chunk: &[u8]) -> (u32, u32) {
        let (mut events, mut errors) = (0, 0);
        crate::watch::complete_lines(rem, chunk, |line| {
            if self.error.find(line).is_some() {
                errors += 1;
            } else if self.ts.find(line).is_some() {
                events += 1;
            }
        });
        (events, errors)
    }
}

/// Per-stream counters the receivers update and the checks read.
struct StreamCounters {
    counts: Vec<AtomicU32>,
    live: Arc<Live>,
    ended: AtomicU64,
    error_events: AtomicU64,
}

impl StreamCounters {
    fn new(watches: usize, live: Arc<Live>) -> Self {
        StreamCounters {
            counts: (0..watches).map(|_| AtomicU32::new(0)).collect(),
            live,
            ended: AtomicU64::new(0),
            error_events: AtomicU64::new(0),
        }
    }
}

/// One receiver task: polls its streams until `stop`; new streams arrive on `add`.
async fn receive(
    sh: Arc<StreamCounters>,
    mut add: mpsc::UnboundedReceiver<WStream>,
    mut stop: watch::Receiver<bool>,
) {
    let lines = LineCounter::default();
    let mut all: SelectAll<WStream> = SelectAll::new();
    let mut partial: HashMap<usize, BytesMut> = HashMap::new();
    let mut polled = 0u32;
    loop {
        // A SelectAll of many ready streams hardly ever returns Pending: without an explicit
        // yield this task can hold its worker for seconds, starving the connection tasks
        // (whose missed h2 PING answers make the server close connections) and the sampler.
        polled = polled.wrapping_add(1);
        if polled.is_multiple_of(YIELD_EVERY) {
            tokio::task::yield_now().await;
        }
        tokio::select! {
            Some((idx, item)) = all.next(), if !all.is_empty() => match item {
                Item::Data(b) => {
                    let rem = partial.entry(idx).or_default();
                    let (ev, err) = lines.feed(rem, &b);
                    if rem.is_empty() {
                        partial.remove(&idx);
                    }
                    if let Some(c) = sh.counts.get(idx) {
                        c.fetch_add(ev, Relaxed);
                    }
                    sh.live.delivered.fetch_add(u64::from(ev), Relaxed);
                    if err > 0 {
                        sh.error_events.fetch_add(u64::from(err), Relaxed);
                        sh.live.note_error(format!("watch {idx}: an ERROR event"));
                    }
                }
                Item::Err(e) => {
                    if !sh.live.stopping.load(Relaxed) {
                        sh.live.watch_errors.fetch_add(1, Relaxed);
                        sh.live.note_error(format!("watch {idx}: {e}"));
                    }
                }
                Item::End => {
                    if !sh.live.stopping.load(Relaxed) {
                        sh.ended.fetch_add(1, Relaxed);
                        sh.live.note_error(format!("watch {idx} ended early"));
                    }
                }
            },
            s = add.recv() => match s {
                Some(s) => all.push(s),
                None => break,
            },
            r = stop.changed() => if r.is_err() || *stop.borrow() { break },
        }
    }
}

/// How watches are opened: h2 streams over shared connections, or a connection each.
struct Opener {
    ep: Endpoint,
    ns: String,
    h2: Vec<Conn>,
}

impl Opener {
    async fn open(&self, idx: usize, rv: u64) -> Result<WStream> {
        let mut conn = match self
            .h2
            .get(idx % self.h2.len().max(1))
            .and_then(Conn::share)
        {
            Some(c) => c,
            None => self.ep.connect(false).await?,
        };
        let path = format!(
            "/api/v1/namespaces/{}/serviceaccounts?watch=1&resourceVersion={rv}",
            self.ns
        );
        let resp = conn
            .send(target::request(Method::GET, &path, Bytes::new(), ""))
            .await?;
        if resp.status() != StatusCode::OK {
            let st = resp.status();
            let b = resp.into_body().collect().await?.to_bytes();
            bail!(
                "watch: {st}: {}",
                String::from_utf8_lossy(&b[..b.len().min(300)])
            );
        }
        // The connection lives as long as its response body.
        Ok(tag(idx, resp.into_body().into_data_stream()))
    }
}

/// One step's figures.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Step {
    pub target: usize,
    pub open: usize,
    pub open_failures: usize,
    pub open_s: f64,
    pub server_rss_bytes: Option<u64>,
    pub client_rss_bytes: Option<u64>,
    /// ΔRSS / Δwatches against the previous step (the first: against the connections alone).
    pub server_bytes_per_watch: Option<f64>,
    pub client_bytes_per_watch: Option<f64>,
    /// The machine's TCP socket memory (kernel, both ends of every connection).
    pub tcp_mem_bytes: Option<u64>,
    /// Server RSS after the step's writes were delivered (buffers a first event allocates).
    pub server_rss_after_writes_bytes: Option<u64>,
    pub server_bytes_per_watch_after_writes: Option<f64>,
    pub writes_acked: u64,
    pub events_delivered: u64,
    pub events_expected: u64,
    /// From the first write to the last stream's last event (or the drain bound).
    pub deliver_s: f64,
    pub server_cpu_us_per_event: Option<f64>,
    pub check: PhaseCheck,
}

fn rss(pid: Option<&str>) -> Option<u64> {
    pid.and_then(proc_rss_bytes)
}

fn available() -> Option<u64> {
    mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// Runs the scenario against an API server (`--server` or `--kubeconfig`).
pub async fn run(a: &HoldArgs) -> Result<Results> {
    let p = &a.params;
    let steps = plan(&a.steps, p.watchers)?;
    if p.media != "json" {
        bail!("hold counts JSON watch events: leave --media at json");
    }
    let (tgt, info) = resolve_target(p).await?;
    let Tgt::Server(ep) = tgt else {
        bail!("hold needs an API server (--server or --kubeconfig)");
    };
    let spid = info.server_pid.map(|p| p.to_string());
    let spid = spid.as_deref();
    let ns = format!("lt-{}-{}", std::process::id(), now_nanos() % 1_000_000_000);
    let mut wconn = ep.connect(false).await?;
    ensure_namespace(&mut wconn, &ns).await?;

    let max = *steps.last().unwrap_or(&0);
    let live = Live::new();
    let sh = Arc::new(StreamCounters::new(max, live.clone()));
    tokio::time::sleep(a.settle).await;
    let server_base = rss(spid);
    let client_base = rss(Some("self"));

    let h2 = open_h2(a, &ep).await?;
    let server_conns = rss(spid);
    let client_conns = rss(Some("self"));
    let per_connection = |base: Option<u64>, now: Option<u64>| {
        (!h2.is_empty())
            .then(|| bytes_per(base, now, 0, h2.len()))
            .flatten()
    };
    let server_per_conn = per_connection(server_base, server_conns);
    let client_per_conn = per_connection(client_base, client_conns);
    let opener = Arc::new(Opener {
        ep: ep.clone(),
        ns: ns.clone(),
        h2,
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let (adders, receivers) = spawn_receivers(&sh, &stop_rx);
    let total = Arc::new(parking_lot::Mutex::new(new_hist()));
    let series = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let sampler = tokio::spawn(stats::sampler(
        live.clone(),
        info.server_pid,
        total.clone(),
        series.clone(),
        format!("hold {}", info.kind),
    ));

    let started = Instant::now();
    let mut r = Ramp {
        a,
        ep: &ep,
        ns: &ns,
        spid,
        opener,
        sh: sh.clone(),
        live: live.clone(),
        adders,
        wconn,
        open: 0,
        failures: 0,
        written: 0,
        stopped: None,
        opened_ok: vec![false; max],
        complete_all: vec![false; max],
        server_conns,
        prev: (server_conns, client_conns, 0),
        steps: Vec::new(),
    };
    r.run(&steps).await?;
    let elapsed = started.elapsed().as_secs_f64();
    live.stopping.store(true, Relaxed);
    let _ = stop_tx.send(true);
    drop(std::mem::take(&mut r.adders));
    for r in receivers {
        let _ = r.await;
    }
    let _ = sampler.await;
    crate::setup::remove_namespace(&ep, &ns).await;

    let extra = extra(
        a,
        &r,
        (server_base, client_base),
        (server_per_conn, client_per_conn),
    )?;
    let latency_ms = Percentiles::of(&total.lock());
    let series = series.lock().clone();
    Ok(results(p, info, &r, elapsed, series, latency_ms, extra))
}

/// Receivers: a few tasks, each polling the streams handed to it on its channel.
fn spawn_receivers(
    sh: &Arc<StreamCounters>,
    stop_rx: &watch::Receiver<bool>,
) -> (
    Vec<mpsc::UnboundedSender<WStream>>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let mut adders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..RECEIVERS {
        let (tx, rx) = mpsc::unbounded_channel();
        adders.push(tx);
        receivers.push(tokio::spawn(receive(sh.clone(), rx, stop_rx.clone())));
    }
    (adders, receivers)
}

/// The report's hold-specific fields: the steps, the transport, memory per connection and
/// why the ramp stopped.
fn extra(
    a: &HoldArgs,
    r: &Ramp<'_>,
    rss_base: (Option<u64>, Option<u64>),
    per_conn: (Option<f64>, Option<f64>),
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let mut extra = serde_json::Map::new();
    extra.insert("steps".into(), serde_json::to_value(&r.steps)?);
    extra.insert(
        "transport".into(),
        match a.params.h2_connections {
            Some(c) => format!("h2, {c} connections"),
            None => "HTTP/1.1, one connection per watch".into(),
        }
        .into(),
    );
    extra.insert("server_rss_base_bytes".into(), rss_base.0.into());
    extra.insert("client_rss_base_bytes".into(), rss_base.1.into());
    extra.insert("server_bytes_per_connection".into(), per_conn.0.into());
    extra.insert("client_bytes_per_connection".into(), per_conn.1.into());
    extra.insert("stopped".into(), r.stopped.clone().into());
    extra.insert("ended_early".into(), r.sh.ended.load(Relaxed).into());
    extra.insert(
        "error_events".into(),
        r.sh.error_events.load(Relaxed).into(),
    );
    extra.insert("hold".into(), serde_json::to_value(a)?);
    Ok(extra)
}

/// h2: every connection first, so that a step's ΔRSS is the streams' alone.
async fn open_h2(a: &HoldArgs, ep: &Endpoint) -> Result<Vec<Conn>> {
    let mut h2 = Vec::new();
    if let Some(c) = a.params.h2_connections {
        let conns: Vec<Result<Conn>> = futures::stream::iter(0..c.max(1))
            .map(|_| ep.connect(true))
            .buffered(64)
            .collect()
            .await;
        for c in conns {
            h2.push(c.context("opening the h2 connections")?);
        }
        tokio::time::sleep(a.settle).await;
    }
    Ok(h2)
}

/// The ramp's state from step to step.
struct Ramp<'a> {
    a: &'a HoldArgs,
    ep: &'a Endpoint,
    ns: &'a str,
    spid: Option<&'a str>,
    opener: Arc<Opener>,
    sh: Arc<StreamCounters>,
    live: Arc<Live>,
    adders: Vec<mpsc::UnboundedSender<WStream>>,
    /// The connection the writes go over.
    wconn: Conn,
    open: usize,
    failures: usize,
    written: u64,
    stopped: Option<String>,
    /// Watches that opened, and those that have had every event of every phase so far.
    opened_ok: Vec<bool>,
    complete_all: Vec<bool>,
    /// Server RSS with the connections open and no watches.
    server_conns: Option<u64>,
    /// Server and client RSS and the watch count after the previous step.
    prev: (Option<u64>, Option<u64>, usize),
    steps: Vec<Step>,
}

impl Ramp<'_> {
    /// Takes the steps in turn until one opens no more watches or the ramp stops.
    async fn run(&mut self, steps: &[usize]) -> Result<()> {
        for &target in steps {
            let Some(step) = self.step(target).await? else {
                break;
            };
            self.steps.push(step);
            if self.stopped.is_some() {
                break;
            }
        }
        Ok(())
    }

    /// Opens watches up to `target`, writes, and measures; `None` when no watch more opened.
    async fn step(&mut self, target: usize) -> Result<Option<Step>> {
        let (a, spid) = (self.a, self.spid);
        let p = &a.params;
        let t0 = Instant::now();
        let rv = crate::setup::list_rv(&mut self.wconn, self.ns).await?;
        let step_failures_before = self.failures;
        self.open_to(target, rv).await;
        let open = self.open;
        let open_s = t0.elapsed().as_secs_f64();
        let (prev_server, prev_client, prev_n) = self.prev;
        if open == prev_n {
            return Ok(None);
        }
        tokio::time::sleep(a.settle).await;
        let (server_now, client_now) = (rss(spid), rss(Some("self")));
        let tcp_mem_bytes = std::fs::read_to_string("/proc/net/sockstat")
            .ok()
            .and_then(|s| tcp_mem(&s));

        // Writes: every open stream must receive each acknowledged one.
        // A fresh connection for the writes: the one the step began with sat idle while the
        // watches opened (a million take minutes), long enough for the server's idle timeout.
        self.wconn = self.ep.connect(false).await?;
        let live = self.live.clone();
        let before: Vec<u32> = self.sh.counts[..open]
            .iter()
            .map(|c| c.load(Relaxed))
            .collect();
        let delivered_before = live.delivered.load(Relaxed);
        let cpu0 = spid.and_then(proc_cpu_secs);
        let w0 = Instant::now();
        let acked = self.write(w0).await?;
        let expected = acked * self.opened_ok[..open].iter().filter(|o| **o).count() as u64;
        while live.delivered.load(Relaxed) - delivered_before < expected && w0.elapsed() < p.drain {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let deliver_s = w0.elapsed().as_secs_f64();
        let cpu1 = spid.and_then(proc_cpu_secs);
        let after: Vec<u32> = self.sh.counts[..open]
            .iter()
            .map(|c| c.load(Relaxed))
            .collect();
        let delivered = live.delivered.load(Relaxed) - delivered_before;
        let c = check(&before, &after, &self.opened_ok[..open], acked);
        for i in 0..open {
            if u64::from(after[i].wrapping_sub(before[i])) != acked {
                self.complete_all[i] = false;
            }
        }
        tokio::time::sleep(a.settle).await;
        let server_after = rss(spid);
        let step = Step {
            target,
            open,
            open_failures: self.failures - step_failures_before,
            open_s,
            server_rss_bytes: server_now,
            client_rss_bytes: client_now,
            server_bytes_per_watch: bytes_per(prev_server, server_now, prev_n, open),
            client_bytes_per_watch: bytes_per(prev_client, client_now, prev_n, open),
            tcp_mem_bytes,
            server_rss_after_writes_bytes: server_after,
            server_bytes_per_watch_after_writes: bytes_per(
                self.server_conns,
                server_after,
                0,
                open,
            ),
            writes_acked: acked,
            events_delivered: delivered,
            events_expected: expected,
            deliver_s,
            server_cpu_us_per_event: cpu0
                .zip(cpu1)
                .filter(|_| delivered > 0)
                .map(|(a, b)| (b - a).max(0.0) * 1e6 / delivered as f64),
            check: c,
        };
        self.prev = (server_after.or(server_now), client_now, open);
        Ok(Some(step))
    }

    /// Opens watches in chunks up to `target`, stopping early when memory runs low or too
    /// many opens fail.
    async fn open_to(&mut self, target: usize, rv: u64) {
        let a = self.a;
        let live = &self.live;
        while self.open < target && self.stopped.is_none() {
            let open = self.open;
            if let Some(avail) = available()
                && avail < a.min_available_mib << 20
            {
                self.stopped = Some(format!(
                    "stopped at {open} watches: MemAvailable {} MiB < --min-available-mib {}",
                    avail >> 20,
                    a.min_available_mib
                ));
                break;
            }
            let end = (open + CHUNK).min(target);
            let opened: Vec<(usize, Result<WStream>)> = futures::stream::iter(open..end)
                .map(|i| {
                    let o = self.opener.clone();
                    async move { (i, o.open(i, rv).await) }
                })
                .buffer_unordered(a.open_concurrency.max(1))
                .collect()
                .await;
            let mut chunk_failures = 0;
            for (i, r) in opened {
                match r {
                    Ok(s) => {
                        self.opened_ok[i] = true;
                        self.complete_all[i] = true;
                        let _ = self.adders[i % RECEIVERS].send(s);
                    }
                    Err(e) => {
                        chunk_failures += 1;
                        live.watch_errors.fetch_add(1, Relaxed);
                        live.note_error(format!("opening watch {i}: {e:#}"));
                    }
                }
            }
            self.failures += chunk_failures;
            // More than a tenth of a chunk refused: the server (or a limit) is saying no.
            if chunk_failures * 10 > end - open {
                self.stopped = Some(format!(
                    "stopped at {end} watches: {chunk_failures} of the last {} opens failed \
                     (see errors)",
                    end - open
                ));
            }
            self.open = end;
        }
    }

    /// The step's writes, paced at `--rate` from `w0`; returns how many were acknowledged.
    async fn write(&mut self, w0: Instant) -> Result<u64> {
        let (a, ns) = (self.a, self.ns);
        let p = &a.params;
        let live = &self.live;
        let mut acked = 0u64;
        for i in 0..a.writes_per_step {
            if p.rate > 0.0 {
                let at = w0 + Duration::from_secs_f64(i as f64 / p.rate);
                tokio::time::sleep_until(at.into()).await;
            }
            let name = format!("h-{}", self.written);
            self.written += 1;
            let path = format!("/api/v1/namespaces/{ns}/serviceaccounts");
            let body = sa_body(ns, &name, p.object_size);
            let t = Instant::now();
            match self
                .wconn
                .call(Method::POST, &path, body.into(), "application/json")
                .await
            {
                Ok((st, _)) if st.is_success() => {
                    acked += 1;
                    live.writes.fetch_add(1, Relaxed);
                    live.record_write(t.elapsed().as_micros() as u64);
                }
                Ok((st, b)) => live.write_failed(format!(
                    "write {name}: {st}: {}",
                    String::from_utf8_lossy(&b[..b.len().min(200)])
                )),
                Err(e) => {
                    live.write_failed(format!("write {name}: {e:#}"));
                    self.wconn = self.ep.connect(false).await?;
                }
            }
        }
        Ok(acked)
    }
}

/// The run's `Results`: the steps' sums, and the watches that opened and stayed complete.
fn results(
    p: &Params,
    info: TargetInfo,
    r: &Ramp<'_>,
    elapsed: f64,
    series: Vec<stats::Sample>,
    latency_ms: Percentiles,
    extra: serde_json::Map<String, serde_json::Value>,
) -> Results {
    let out = &r.steps;
    let live = &r.live;
    let sh = &r.sh;
    let max = r.opened_ok.len();
    let acked: u64 = out.iter().map(|s| s.writes_acked).sum();
    let delivered: u64 = out.iter().map(|s| s.events_delivered).sum();
    let expected: u64 = out.iter().map(|s| s.events_expected).sum();
    let write_lat = live.write_lat.lock().take().unwrap_or_else(new_hist);
    Results {
        schema: crate::report::SCHEMA.into(),
        scenario: Scenario::Hold.name().into(),
        target: info,
        // The report's header names the watch count of the last step, not --watchers.
        params: Params {
            watchers: max,
            ..p.clone()
        },
        machine: stats::machine(),
        duration_s: elapsed,
        elapsed_s: elapsed,
        series,
        latency_ms,
        write_latency_ms: Percentiles::of(&write_lat),
        counts: Counts {
            watchers: max as u64,
            watchers_opened: r.opened_ok.iter().filter(|o| **o).count() as u64,
            writes_acked: acked,
            writes_per_s: if elapsed > 0.0 {
                acked as f64 / elapsed
            } else {
                0.0
            },
            events_delivered: delivered,
            events_expected: expected,
            events_per_s: delivered as f64 / elapsed.max(1e-3),
            watchers_complete: r.complete_all[..r.open].iter().filter(|c| **c).count() as u64,
            missing: out.iter().map(|s| s.check.missing_events).sum(),
            duplicates: out.iter().map(|s| s.check.extra_events).sum(),
            reconnects: 0,
            expired: 0,
            write_errors: live.write_errors.load(Relaxed),
            watch_errors: live.watch_errors.load(Relaxed) + sh.ended.load(Relaxed),
            offered_writes_per_s: Some(p.rate),
            write_rate_achieved: (p.rate > 0.0 && elapsed > 0.0)
                .then(|| acked as f64 / elapsed / p.rate),
            offered_events_per_s: None,
            server_cpu_s: None,
            server_cpu_us_per_event: None,
            store_cpu_s: None,
            store_cpu_us_per_event: None,
        },
        errors: live.error_samples.lock().clone(),
        extra,
    }
}

fn mib(b: Option<u64>) -> String {
    b.map(|b| format!("{:.0}", b as f64 / (1 << 20) as f64))
        .unwrap_or_else(|| "–".into())
}

fn per(b: Option<f64>) -> String {
    b.map(|b| format!("{:.0}", b)).unwrap_or_else(|| "–".into())
}

/// The steps table appended to report.md.
pub fn markdown(r: &Results) -> String {
    let mut m = String::new();
    let x = &r.extra;
    let _ = writeln!(
        m,
        "\n## hold: {} (server base RSS {} MiB; per connection: server {} B, client {} B)\n",
        x.get("transport").and_then(|v| v.as_str()).unwrap_or("?"),
        mib(x.get("server_rss_base_bytes").and_then(|v| v.as_u64())),
        per(x
            .get("server_bytes_per_connection")
            .and_then(|v| v.as_f64())),
        per(x
            .get("client_bytes_per_connection")
            .and_then(|v| v.as_f64())),
    );
    let _ = writeln!(
        m,
        "| watches | open s | server RSS MiB | server B/watch | after writes B/watch (all) | client RSS MiB | client B/watch | kernel TCP MiB | writes | streams complete | missed (events) | extra | deliver s | server µs/event |"
    );
    let _ = writeln!(
        m,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let steps: Vec<Step> = x
        .get("steps")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    for s in &steps {
        let _ = writeln!(
            m,
            "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {} ({}) | {} | {:.2} | {} |",
            s.open,
            s.open_s,
            mib(s.server_rss_bytes),
            per(s.server_bytes_per_watch),
            per(s.server_bytes_per_watch_after_writes),
            mib(s.client_rss_bytes),
            per(s.client_bytes_per_watch),
            mib(s.tcp_mem_bytes),
            s.writes_acked,
            s.check.complete,
            s.open,
            s.check.missed_streams,
            s.check.missing_events,
            s.check.extra_streams,
            s.deliver_s,
            s.server_cpu_us_per_event
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "–".into()),
        );
        if !s.check.first_missed.is_empty() {
            let _ = writeln!(
                m,
                "\nstreams that missed events (first): {:?}\n",
                s.check.first_missed
            );
        }
    }
    if let Some(why) = x.get("stopped").and_then(|v| v.as_str()) {
        let _ = writeln!(m, "\n**Ramp stopped early:** {why}");
    }
    m
}

/// `svc-loadtest hold`: runs, writes the report (with the steps table) and prints it.
pub async fn main(a: HoldArgs) -> Result<()> {
    let r = run(&a).await?;
    let out = &a.params.out;
    let md = write_report(out, &r)?;
    println!("{md}");
    eprintln!("report: {}", out.join("report.md").display());
    Ok(())
}

/// Writes one run's report directory (with the steps' table) and returns its markdown.
pub fn write_report(out: &std::path::Path, r: &Results) -> Result<String> {
    crate::report::write(out, std::slice::from_ref(r))?;
    let md = format!(
        "{}{}",
        crate::report::markdown(std::slice::from_ref(r)),
        markdown(r)
    );
    std::fs::write(out.join("report.md"), &md)?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_ascending_totals() {
        assert_eq!(plan(&[], 7).unwrap(), vec![7]);
        assert_eq!(plan(&[10, 100, 1000], 7).unwrap(), vec![10, 100, 1000]);
        assert!(plan(&[10, 10], 7).is_err());
        assert!(plan(&[100, 10], 7).is_err());
        assert!(plan(&[0, 10], 7).is_err());
        assert!(plan(&[], 0).is_err());
    }

    #[test]
    fn bytes_per_watch_is_the_rss_delta_over_new_watches() {
        assert_eq!(bytes_per(Some(1000), Some(21_000), 10, 20), Some(2000.0));
        // RSS may shrink (freed pages returned): a negative figure, not a wrap.
        assert_eq!(bytes_per(Some(5000), Some(4000), 0, 10), Some(-100.0));
        assert_eq!(bytes_per(None, Some(1), 0, 1), None);
        assert_eq!(bytes_per(Some(1), None, 0, 1), None);
        assert_eq!(bytes_per(Some(1), Some(2), 5, 5), None);
    }

    #[test]
    fn reads_tcp_socket_memory() {
        let s = "sockets: used 180\nTCP: inuse 5 orphan 0 tw 2 alloc 9 mem 3\nUDP: inuse 0 mem 7\n";
        assert_eq!(tcp_mem(s), Some(3 * 4096));
        assert_eq!(tcp_mem("UDP: inuse 0 mem 7\n"), None);
    }

    #[test]
    fn reads_mem_available() {
        let m = "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(mem_available(m), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn every_stream_is_checked_against_the_acknowledged_writes() {
        let before = [0, 5, 2, 7, u32::MAX];
        let after = [3, 8, 2, 11, 2];
        let c = check(&before, &after, &[true; 5], 3);
        assert_eq!(c.complete, 3, "{c:?}"); // 0, 1, and 4 (the counter wrapped)
        assert_eq!(c.missed_streams, 1);
        assert_eq!(c.missing_events, 3);
        assert_eq!(c.first_missed, vec![2]);
        assert_eq!(c.extra_streams, 1);
        assert_eq!(c.extra_events, 1);
        assert_eq!(c.first_extra, vec![3]);
        // Only the first few indices are kept.
        let many = check(&[0; 100], &[0; 100], &[true; 100], 1);
        assert_eq!(many.missed_streams, 100);
        assert_eq!(many.first_missed.len(), SAMPLE);
        // A watch that never opened is not checked.
        let some = check(&[0; 4], &[1, 0, 1, 1], &[true, false, true, true], 1);
        assert_eq!((some.complete, some.missed_streams), (3, 0));
        let many = check(&[0; 100], &[0; 100], &[true; 100], 1);
        assert_eq!(many.missed_streams, 100);
        assert_eq!(many.first_missed.len(), SAMPLE);
    }

    fn event(ts: u64) -> String {
        format!(
            "{{\"type\":\"ADDED\",\"object\":{{\"metadata\":{{\"annotations\":{{\"{TS_ANNOTATION}\":\"{ts}\"}}}}}}}}\n"
        )
    }

    #[test]
    fn counts_events_across_chunk_boundaries() {
        let lc = LineCounter::default();
        let mut rem = BytesMut::new();
        let two = format!("{}{}", event(1), event(2));
        assert_eq!(lc.feed(&mut rem, two.as_bytes()), (2, 0));
        assert!(rem.is_empty());
        // One event cut in three pieces counts once, when its newline arrives.
        let e = event(3);
        let b = e.as_bytes();
        assert_eq!(lc.feed(&mut rem, &b[..10]), (0, 0));
        assert_eq!(lc.feed(&mut rem, &b[10..20]), (0, 0));
        let tail = format!("{}{}", &e[20..], &event(4)[..5]);
        assert_eq!(lc.feed(&mut rem, tail.as_bytes()), (1, 0));
        assert_eq!(&rem[..], &event(4).as_bytes()[..5]);
        assert_eq!(lc.feed(&mut rem, &event(4).as_bytes()[5..]), (1, 0));
        assert!(rem.is_empty());
        // Lines without the run's annotation (another writer's objects) are not counted;
        // ERROR events are counted apart.
        let other =
            "{\"type\":\"ADDED\",\"object\":{}}\n{\"type\":\"ERROR\",\"object\":{\"code\":410}}\n";
        assert_eq!(lc.feed(&mut rem, other.as_bytes()), (0, 1));
    }
}
