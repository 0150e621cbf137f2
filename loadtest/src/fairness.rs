//! `fairness`: does one client hammering the server starve another? A writer (user B,
//! `--writer-kubeconfig`) creates ServiceAccounts at a fixed rate (`--rate` across
//! `--writers`, each a steady ticker that skips ticks it cannot keep up with) for
//! `--duration` alone, then for `--duration` again while a hammer (user A, `--kubeconfig`)
//! runs `--clients` concurrent unpaged lists of a collection of `--objects` as fast as answers
//! come, retrying 429s after a short pause. The report gives the writer's achieved rate and
//! p99 in both phases and their ratios (target: ≥ 90 % of the rate kept, p99 within 2×),
//! what the hammer got (lists, 429s), and the CPU each process used in each phase. The two
//! users must not be `system:masters`, which the server exempts from its limits; the
//! hammer's user also seeds the collection.
//!
//! So that the verdict measures the server and not the load generator, the two clients do
//! not share a runtime or a CPU budget: the writers run on their own thread and
//! current-thread runtime (`stats::on_own_thread`), and the hammer is a child process
//! (`svc-loadtest fairness-hammer`, spawned like `raw-server`) pinned with `taskset` to
//! `--hammer-cpus` (default: the last core) at niceness `--hammer-nice` (default 10), so
//! that it takes at most one core and yields it to the server and the writer when they want
//! it. Its clients list over HTTP/1.1, or over h2 with `--hammer-h2` (a connection each). The
//! hammer does not build the listed objects: it counts each list's items in one
//! pass over the bytes (`count_items`) and counts a list short of the collection as an error.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use tokio::io::AsyncBufReadExt;

use crate::Params;
use crate::report::{Counts, Percentiles, Results};
use crate::setup::{Tgt, ensure_namespace, resolve_target, sa_body, seed};
use crate::stats::{self, Live, new_hist, now_nanos, proc_cpu_secs};
use crate::target::{self, Conn, Endpoint};

/// A request that takes longer than this counts as an error rather than hanging the run.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What the writer achieved in one phase.
struct Phase {
    acked: u64,
    errors: u64,
    secs: f64,
    latency: hdrhistogram::Histogram<u64>,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.acked as f64 / self.secs.max(1e-3)
    }
    fn p99_ms(&self) -> f64 {
        self.latency.value_at_quantile(0.99) as f64 / 1000.0
    }
}

/// Runs the writers for `duration` on their own thread and runtime: each creates one object
/// per tick of its share of `rate`, on its own connection opened there.
async fn write_phase(
    ep: &Endpoint,
    ns: &str,
    p: &Params,
    phase: &str,
    live: &Arc<Live>,
) -> Result<Phase> {
    let writers = p.writers.max(1);
    let period = Duration::from_secs_f64(writers as f64 / p.rate.max(0.001));
    let (ep, ns, live, size, phase) = (
        ep.clone(),
        ns.to_string(),
        live.clone(),
        p.object_size,
        phase.to_string(),
    );
    let duration = p.duration;
    let done = stats::on_own_thread("lt-writers", move || async move {
        let started = Instant::now();
        let deadline = started + duration;
        let runs = (0..writers).map(|w| {
            let (ep, ns, live, phase) = (ep.clone(), ns.clone(), live.clone(), phase.clone());
            writer(ep, ns, live, phase, w, size, period, deadline)
        });
        let results = futures::future::join_all(runs).await;
        (results, started.elapsed().as_secs_f64())
    })?;
    let (results, secs) = done.await.context("the writers' thread ended early")?;
    let mut out = Phase {
        acked: 0,
        errors: 0,
        secs,
        latency: new_hist(),
    };
    for (a, e, h) in results {
        out.acked += a;
        out.errors += e;
        out.latency.add(&h)?;
    }
    Ok(out)
}

/// One writer until `deadline`: its acknowledged creates, its errors, and their latency.
#[allow(clippy::too_many_arguments)]
async fn writer(
    ep: Endpoint,
    ns: String,
    live: Arc<Live>,
    phase: String,
    w: usize,
    size: usize,
    period: Duration,
    deadline: Instant,
) -> (u64, u64, hdrhistogram::Histogram<u64>) {
    let mut hist = new_hist();
    let (mut acked, mut errors) = (0u64, 0u64);
    let mut conn: Option<Conn> = None;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut n = 0u64;
    loop {
        tick.tick().await;
        if Instant::now() >= deadline {
            break;
        }
        if conn.is_none() {
            match ep.connect(false).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    errors += 1;
                    live.write_failed(format!("writer connect: {e:#}"));
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        n += 1;
        let name = format!("{phase}-{w}-{n}-{}", now_nanos());
        let body = sa_body(&ns, &name, size);
        let path = format!("/api/v1/namespaces/{ns}/serviceaccounts");
        let t0 = Instant::now();
        let r = tokio::time::timeout(
            REQUEST_TIMEOUT,
            c.call(Method::POST, &path, body.into(), "application/json"),
        )
        .await;
        match r {
            Ok(Ok((st, _))) if st == StatusCode::CREATED => {
                let us = (t0.elapsed().as_micros() as u64).max(1);
                hist.saturating_record(us);
                // The series' writes/s and p99 are the writer's.
                live.writes.fetch_add(1, Relaxed);
                if let Some(h) = live.interval.lock().as_mut() {
                    h.saturating_record(us);
                }
                acked += 1;
            }
            Ok(Ok((st, b))) => {
                errors += 1;
                live.write_failed(format!(
                    "writer create: {st}: {}",
                    String::from_utf8_lossy(&b[..b.len().min(200)])
                ));
            }
            Ok(Err(e)) => {
                errors += 1;
                live.write_failed(format!("writer create: {e:#}"));
                conn = None;
            }
            Err(_) => {
                errors += 1;
                live.write_failed(format!("writer create: no answer in {REQUEST_TIMEOUT:?}"));
                conn = None;
            }
        }
    }
    (acked, errors, hist)
}

/// What the hammer got, as its child process reports it.
#[derive(Default)]
struct Hammer {
    lists: AtomicU64,
    items: AtomicU64,
    e429: AtomicU64,
    errors: AtomicU64,
    /// Lists that held fewer items than the collection (also counted in `errors`).
    short: AtomicU64,
}

impl Hammer {
    /// The line the child prints: `counts LISTS ITEMS E429 ERRORS SHORT`.
    fn line(&self) -> String {
        let g = |a: &AtomicU64| a.load(Relaxed);
        format!(
            "counts {} {} {} {} {}",
            g(&self.lists),
            g(&self.items),
            g(&self.e429),
            g(&self.errors),
            g(&self.short)
        )
    }

    /// Takes the counts of a `counts` line (they are cumulative); false for any other line.
    fn take_line(&self, line: &str) -> bool {
        let Some(rest) = line.trim().strip_prefix("counts ") else {
            return false;
        };
        let v: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        let [lists, items, e429, errors, short] = v[..] else {
            return false;
        };
        self.lists.store(lists, Relaxed);
        self.items.store(items, Relaxed);
        self.e429.store(e429, Relaxed);
        self.errors.store(errors, Relaxed);
        self.short.store(short, Relaxed);
        true
    }
}

/// The items of a JSON list response, counted without building them: one pass over the
/// bytes that follows strings (and their escapes) and nesting, and counts the objects opened
/// directly inside the top-level object's `"items"` array. An error when the document is cut
/// short, its brackets do not match, it has no `items` array, or text follows its end.
pub fn count_items(b: &[u8]) -> Result<u64> {
    let mut stack: Vec<u8> = Vec::with_capacity(16);
    // The top-level object's last key was "items" and only `:` and blanks followed it.
    let mut key_items = false;
    let (mut in_items, mut saw_items, mut ended) = (false, false, false);
    let mut count = 0u64;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        i += 1;
        if c.is_ascii_whitespace() {
            continue;
        }
        if ended {
            bail!("text after the end of the list at byte {}", i - 1);
        }
        match c {
            b'"' => {
                // To the closing quote, skipping escapes; most of a list's bytes are in
                // strings, and memchr crosses them fast.
                let start = i;
                loop {
                    let Some(k) = memchr::memchr2(b'"', b'\\', &b[i.min(b.len())..]) else {
                        bail!("the list is cut short in a string ({} bytes)", b.len());
                    };
                    let j = i + k;
                    if b[j] == b'\\' {
                        i = j + 2;
                        continue;
                    }
                    i = j + 1;
                    key_items = stack.len() == 1 && &b[start..j] == b"items";
                    break;
                }
                continue;
            }
            b':' => continue,
            b'{' | b'[' => {
                if c == b'{' && in_items && stack.len() == 2 {
                    count += 1;
                }
                if c == b'[' && key_items && stack.len() == 1 && !saw_items {
                    in_items = true;
                    saw_items = true;
                }
                stack.push(c);
            }
            b'}' | b']' => {
                let open = if c == b'}' { b'{' } else { b'[' };
                if stack.pop() != Some(open) {
                    bail!("unmatched {:?} at byte {}", c as char, i - 1);
                }
                if stack.len() == 1 {
                    in_items = false;
                }
                ended = stack.is_empty();
            }
            _ => {}
        }
        key_items = false;
    }
    if !ended {
        bail!("the list is cut short ({} bytes)", b.len());
    }
    if !saw_items {
        bail!("the list has no items array");
    }
    Ok(count)
}

/// One unpaged list; the number of items, or the status it was refused with.
async fn list_once(c: &mut Conn, ns: &str) -> Result<std::result::Result<u64, StatusCode>> {
    let path = format!("/api/v1/namespaces/{ns}/serviceaccounts");
    let req = target::request(Method::GET, &path, Bytes::new(), "");
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let resp = c.send(req).await?;
        let st = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((st, body))
    })
    .await
    .context("list: no answer in time")??;
    if resp.0 != StatusCode::OK {
        return Ok(Err(resp.0));
    }
    Ok(Ok(count_items(&resp.1).context("list")?))
}

/// Starts `clients` tasks listing `ns` until `stop`, each on a connection of its own (h2 or
/// HTTP/1.1); a list with fewer than `expect` items is short (an error).
fn hammer(
    ep: &Endpoint,
    ns: &str,
    clients: usize,
    expect: u64,
    h2: bool,
    stop: &Arc<AtomicBool>,
    h: &Arc<Hammer>,
) {
    for _ in 0..clients.max(1) {
        let (ep, ns, stop, h) = (ep.clone(), ns.to_string(), stop.clone(), h.clone());
        tokio::spawn(async move {
            let mut conn: Option<Conn> = None;
            while !stop.load(Relaxed) {
                if conn.is_none() {
                    match ep.connect(h2).await {
                        Ok(c) => conn = Some(c),
                        Err(_) => {
                            h.errors.fetch_add(1, Relaxed);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                }
                let Some(c) = conn.as_mut() else { continue };
                match list_once(c, &ns).await {
                    Ok(Ok(items)) => {
                        h.lists.fetch_add(1, Relaxed);
                        h.items.fetch_add(items, Relaxed);
                        if items < expect {
                            h.short.fetch_add(1, Relaxed);
                            h.errors.fetch_add(1, Relaxed);
                        }
                    }
                    Ok(Err(st)) => {
                        if st == StatusCode::TOO_MANY_REQUESTS {
                            h.e429.fetch_add(1, Relaxed);
                        } else {
                            h.errors.fetch_add(1, Relaxed);
                        }
                        // A short pause, as a client honouring Retry-After loosely would.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(_) => {
                        h.errors.fetch_add(1, Relaxed);
                        conn = None;
                    }
                }
            }
        });
    }
}

/// `svc-loadtest fairness-hammer`: the hammer's own process (spawned by `fairness`).
#[derive(clap::Args)]
pub struct HammerArgs {
    /// The hammer user's kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The namespace whose ServiceAccounts are listed.
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    clients: usize,
    /// Items a whole list holds at least.
    #[arg(long)]
    expect: u64,
    #[arg(long)]
    allow_remote: bool,
    /// List over h2 (one connection per client) instead of HTTP/1.1.
    #[arg(long)]
    h2: bool,
}

/// The hammer's process: lists until standard input closes, printing its cumulative counts
/// (`Hammer::line`) four times a second and once more at the end.
pub async fn hammer_main(a: HammerArgs) -> Result<()> {
    let ep = target::from_kubeconfig(&a.kubeconfig, a.allow_remote).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let h = Arc::new(Hammer::default());
    hammer(&ep, &a.namespace, a.clients, a.expect, a.h2, &stop, &h);
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        let _ = tx.send(());
    });
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut rx => break,
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", h.line())?;
        out.flush()?;
    }
    stop.store(true, Relaxed);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", h.line())?;
    out.flush()?;
    Ok(())
}

/// The hammer as a child process, pinned and niced as `--hammer-cpus` and `--hammer-nice`
/// say; killed when dropped.
struct HammerChild {
    child: tokio::process::Child,
    pid: u32,
    reader: tokio::task::JoinHandle<()>,
    /// How it was started, for the report.
    how: String,
}

/// The CPUs the hammer is pinned to: `--hammer-cpus`, else the last core (none on one core;
/// `all` for none).
fn hammer_cpus(p: &Params, cores: usize) -> Option<String> {
    match p.hammer_cpus.as_deref() {
        Some("all") | Some("") => None,
        Some(list) => Some(list.to_string()),
        None => (cores > 1).then(|| (cores - 1).to_string()),
    }
}

impl HammerChild {
    async fn spawn(
        p: &Params,
        ns: &str,
        expect: u64,
        h: &Arc<Hammer>,
        live: &Arc<Live>,
    ) -> Result<Self> {
        let exe = std::env::current_exe().context("locating svc-loadtest")?;
        let kubeconfig = p
            .kubeconfig
            .as_ref()
            .context("the hammer needs --kubeconfig")?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut argv: Vec<String> = Vec::new();
        let mut how = Vec::new();
        if let Some(cpus) = hammer_cpus(p, cores) {
            argv.extend(["taskset".into(), "-c".into(), cpus.clone()]);
            how.push(format!("taskset -c {cpus}"));
        }
        if p.hammer_nice != 0 {
            argv.extend(["nice".into(), "-n".into(), p.hammer_nice.to_string()]);
            how.push(format!("nice -n {}", p.hammer_nice));
        }
        argv.push(exe.display().to_string());
        argv.extend([
            "fairness-hammer".into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--namespace".into(),
            ns.into(),
            "--clients".into(),
            p.clients.max(1).to_string(),
            "--expect".into(),
            expect.to_string(),
        ]);
        if p.allow_remote {
            argv.push("--allow-remote".into());
        }
        if p.hammer_h2 {
            argv.push("--h2".into());
        }
        let mut child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning the hammer: {}", argv.join(" ")))?;
        let pid = child.id().context("the hammer exited at once")?;
        let stdout = child.stdout.take().context("the hammer's stdout")?;
        let (h, live) = (h.clone(), live.clone());
        let reader = tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if h.take_line(&l) {
                    // The series' events/s are the hammer's listed items.
                    live.delivered.store(h.items.load(Relaxed), Relaxed);
                }
            }
        });
        how.push("svc-loadtest fairness-hammer".into());
        if p.hammer_h2 {
            how.push("--h2".into());
        }
        Ok(HammerChild {
            child,
            pid,
            reader,
            how: how.join(" "),
        })
    }

    /// Closes the hammer's standard input (it stops and prints its last counts), reads to
    /// the end of its output, and reaps it; killed if it takes longer than 10 s.
    async fn stop(mut self) -> Result<()> {
        drop(self.child.stdin.take());
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            let _ = (&mut self.reader).await;
            self.child.wait().await
        })
        .await;
        match waited {
            Ok(Ok(st)) if st.success() => Ok(()),
            Ok(Ok(st)) => Err(anyhow!("the hammer exited with {st}")),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => {
                let _ = self.child.kill().await;
                Err(anyhow!("the hammer did not stop within 10 s"))
            }
        }
    }
}

/// CPU seconds of a process now (`self` for this one), or 0 when it cannot be read.
fn cpu_of(pid: &str) -> f64 {
    proc_cpu_secs(pid).unwrap_or(0.0)
}

pub async fn run(p: &Params) -> Result<Results> {
    let (tgt, info) = resolve_target(p).await?;
    let Tgt::Server(hammer_ep) = tgt else {
        bail!("fairness runs against a Kubernetes-compatible server (--kubeconfig)");
    };
    let Some(wk) = &p.writer_kubeconfig else {
        bail!("fairness needs --writer-kubeconfig: the writer is another user than the hammer");
    };
    let writer_ep = target::from_kubeconfig(wk, p.allow_remote).await?;
    let live = Live::new();
    let n = p.objects;
    let ns = format!("svc-loadtest-list-{n}");
    let wns = "svc-loadtest-fair-writes";
    eprintln!("seeding {n} objects in {ns}");
    let seeded = seed(&hammer_ep, &ns, n, p.object_size, &Live::new()).await?;
    let expect = n as u64 + seeded.others;
    ensure_namespace(&mut hammer_ep.connect(false).await?, wns).await?;

    let total = Arc::new(parking_lot::Mutex::new(new_hist()));
    let series = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let sampler = tokio::spawn(stats::sampler(
        live.clone(),
        info.server_pid,
        total.clone(),
        series.clone(),
        format!("fairness {}", info.kind),
    ));
    let server = info.server_pid.map(|p| p.to_string());
    let server_cpu = || server.as_deref().map(cpu_of);
    eprintln!("phase 1: the writer alone");
    let cpu0 = (server_cpu(), cpu_of("self"));
    let alone = write_phase(&writer_ep, wns, p, "alone", &live).await?;
    let cpu1 = (server_cpu(), cpu_of("self"));
    eprintln!("phase 2: the writer beside {} hammering lists", p.clients);
    let h = Arc::new(Hammer::default());
    let child = HammerChild::spawn(p, &ns, expect, &h, &live).await?;
    let hpid = child.pid.to_string();
    let how = child.how.clone();
    let hcpu0 = cpu_of(&hpid);
    let hammer_t0 = Instant::now();
    let hammered = write_phase(&writer_ep, wns, p, "hammered", &live).await;
    let hammer_secs = hammer_t0.elapsed().as_secs_f64().max(1e-3);
    let cpu2 = (server_cpu(), cpu_of("self"));
    // Read before the child is reaped (its /proc entry goes with it).
    let hcpu = cpu_of(&hpid) - hcpu0;
    let stopped = child.stop().await;
    let hammered = hammered?;
    stopped?;
    live.stopping.store(true, Relaxed);
    let _ = sampler.await;

    let g = |a: &AtomicU64| a.load(Relaxed);
    let cpu = CpuReadings {
        start: cpu0,
        alone: cpu1,
        hammered: cpu2,
        hammer: hcpu,
    };
    let extra = extra(p, &alone, &hammered, &h, hammer_secs, how, cpu);
    let series = series.lock().clone();
    let secs = alone.secs + hammered.secs;
    let acked = alone.acked + hammered.acked;
    Ok(Results {
        schema: crate::report::SCHEMA.into(),
        scenario: "fairness".into(),
        target: info,
        params: p.clone(),
        machine: stats::machine(),
        duration_s: secs,
        elapsed_s: secs,
        series,
        // The writer's latency with the hammer, and (below) without it.
        latency_ms: Percentiles::of(&hammered.latency),
        write_latency_ms: Percentiles::of(&alone.latency),
        counts: Counts {
            writes_acked: acked,
            writes_per_s: acked as f64 / secs.max(1e-3),
            events_delivered: g(&h.items),
            events_per_s: g(&h.items) as f64 / hammer_secs,
            write_errors: alone.errors + hammered.errors,
            offered_writes_per_s: Some(p.rate),
            write_rate_achieved: Some(acked as f64 / secs.max(1e-3) / p.rate.max(1e-9)),
            watch_errors: g(&h.errors),
            ..Counts::default()
        },
        errors: live.error_samples.lock().clone(),
        extra,
    })
}

/// CPU seconds read at the phase boundaries: the server's (when known) and this process's,
/// at the start, after the writer alone and after the hammered phase; and the hammer's own.
struct CpuReadings {
    start: (Option<f64>, f64),
    alone: (Option<f64>, f64),
    hammered: (Option<f64>, f64),
    hammer: f64,
}

/// The fairness report's fields: the writer's rate and p99 alone and hammered, whether the
/// target was met, the hammer's counts, and each process's CPU per phase.
fn extra(
    p: &Params,
    alone: &Phase,
    hammered: &Phase,
    h: &Hammer,
    hammer_secs: f64,
    how: String,
    cpu: CpuReadings,
) -> serde_json::Map<String, serde_json::Value> {
    let g = |a: &AtomicU64| a.load(Relaxed);
    let rate_kept = hammered.rate() / alone.rate().max(1e-9);
    let p99_ratio = hammered.p99_ms() / alone.p99_ms().max(1e-3);
    let mut extra = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        extra.insert(k.into(), v);
    };
    put("objects", p.objects.into());
    put("hammer_clients", p.clients.max(1).into());
    put("writer_target_rate", p.rate.into());
    put("writer_rate_alone", alone.rate().into());
    put("writer_rate_hammered", hammered.rate().into());
    put("writer_p99_ms_alone", alone.p99_ms().into());
    put("writer_p99_ms_hammered", hammered.p99_ms().into());
    put("writer_errors_alone", alone.errors.into());
    put("writer_errors_hammered", hammered.errors.into());
    put("rate_kept", rate_kept.into());
    put("p99_ratio", p99_ratio.into());
    put("target_met", (rate_kept >= 0.9 && p99_ratio <= 2.0).into());
    put("hammer_lists", g(&h.lists).into());
    put(
        "hammer_lists_per_s",
        (g(&h.lists) as f64 / hammer_secs).into(),
    );
    put("hammer_items", g(&h.items).into());
    put("hammer_429", g(&h.e429).into());
    put("hammer_errors", g(&h.errors).into());
    put("hammer_short_lists", g(&h.short).into());
    put("hammer_process", how.into());
    // CPU in % of one core over each phase: which process used how much.
    let pct = |a: f64, b: f64, secs: f64| ((b - a).max(0.0) / secs.max(1e-3) * 100.0).into();
    let opt_pct = |a: Option<f64>, b: Option<f64>, secs: f64| match (a, b) {
        (Some(a), Some(b)) => pct(a, b, secs),
        _ => serde_json::Value::Null,
    };
    put(
        "server_cpu_pct_alone",
        opt_pct(cpu.start.0, cpu.alone.0, alone.secs),
    );
    put(
        "server_cpu_pct_hammered",
        opt_pct(cpu.alone.0, cpu.hammered.0, hammered.secs),
    );
    put(
        "loadgen_cpu_pct_alone",
        pct(cpu.start.1, cpu.alone.1, alone.secs),
    );
    put(
        "loadgen_cpu_pct_hammered",
        pct(cpu.alone.1, cpu.hammered.1, hammered.secs),
    );
    put("hammer_cpu_pct", pct(0.0, cpu.hammer, hammer_secs));
    extra
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_items_of_a_list_without_building_them() {
        let list =
            br#"{"kind":"ServiceAccountList","apiVersion":"v1","metadata":{"resourceVersion":"7"},
            "items":[{"metadata":{"name":"a","annotations":{"x":"{[\"items\":[{}]"}}},
                     {"metadata":{"name":"b"},"items":[{"nested":{}}]},
                     {}]}"#;
        assert_eq!(count_items(list).unwrap(), 3);
        assert_eq!(count_items(br#"{"items":[],"metadata":{}}"#).unwrap(), 0);
        // A key "items" only counts at the top level, and a string value "items" is no key.
        assert_eq!(
            count_items(br#"{"kind":"items","x":[{}],"items":[{},{}]}"#).unwrap(),
            2
        );
        assert_eq!(count_items(b" {\"items\" : [ {} ] }\n").unwrap(), 1);
        // Escaped quotes and backslashes inside strings do not end them.
        let escaped = br#"{"items":[{"a":"x\"}],{\\"},{"b":"\\\\"}]}"#;
        assert_eq!(count_items(escaped).unwrap(), 2);
        for cut in 1..escaped.len() {
            assert!(count_items(&escaped[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn a_list_cut_short_or_malformed_is_an_error() {
        let whole = br#"{"items":[{"a":"b"},{"c":"d"}]}"#;
        for cut in 1..whole.len() {
            assert!(count_items(&whole[..cut]).is_err(), "cut at {cut}");
        }
        for bad in [
            &br#"{"items":[{]}"#[..],
            br#"{"metadata":{}}"#,
            br#"{"items":[{}]}{"#,
            br#"{"items":[{}]} x"#,
            br#"{"items":[{"a":"unterminated}]}"#,
            b"",
        ] {
            assert!(
                count_items(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_hammer_counts_cross_the_process_boundary_as_one_line() {
        let h = Hammer::default();
        h.lists.store(12, Relaxed);
        h.items.store(6012, Relaxed);
        h.e429.store(3, Relaxed);
        h.errors.store(1, Relaxed);
        h.short.store(1, Relaxed);
        let parent = Hammer::default();
        assert!(parent.take_line(&h.line()));
        assert_eq!(parent.line(), "counts 12 6012 3 1 1");
        assert!(!parent.take_line("listening on 127.0.0.1:1"));
        assert!(!parent.take_line("counts 1 2"));
        assert_eq!(parent.lists.load(Relaxed), 12);
    }

    #[test]
    fn the_hammer_is_pinned_to_the_last_core_unless_told_otherwise() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            p: Params,
        }
        let parse = |args: &[&str]| {
            <Flags as clap::Parser>::parse_from(
                std::iter::once("svc-loadtest").chain(args.iter().copied()),
            )
            .p
        };
        let p = parse(&[]);
        assert_eq!(hammer_cpus(&p, 2).as_deref(), Some("1"));
        assert_eq!(hammer_cpus(&p, 8).as_deref(), Some("7"));
        assert_eq!(hammer_cpus(&p, 1), None);
        assert_eq!(p.hammer_nice, 10);
        let p = parse(&["--hammer-cpus", "0,2", "--hammer-nice", "0"]);
        assert_eq!(hammer_cpus(&p, 4).as_deref(), Some("0,2"));
        assert_eq!(p.hammer_nice, 0);
        assert_eq!(hammer_cpus(&parse(&["--hammer-cpus", "all"]), 4), None);
    }
}
