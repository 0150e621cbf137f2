//! `fairness`: does one client hammering the server starve another? A writer (user B,
//! `--writer-kubeconfig`) creates ServiceAccounts at a fixed rate (`--rate` across
//! `--writers`, each a steady ticker that skips ticks it cannot keep up with) for
//! `--duration` alone, then for `--duration` again while a hammer (user A, `--kubeconfig`)
//! runs `--clients` concurrent unpaged lists of a collection of `--objects` as fast as answers
//! come, retrying 429s after a short pause. The report gives the writer's achieved rate and
//! p99 in both phases and their ratios (target: ≥ 90 % of the rate kept, p99 within 2×),
//! and what the hammer got (lists, 429s). The two users must not be `system:masters`, which
//! the server exempts from its limits; the hammer's user also seeds the collection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;

use crate::Params;
use crate::report::{Counts, Percentiles, Results};
use crate::setup::{Tgt, ensure_namespace, resolve_target, sa_body, seed};
use crate::stats::{self, Live, new_hist, now_nanos};
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

/// Runs the writers for `duration`: each creates one object per tick of its share of `rate`.
async fn write_phase(
    ep: &Endpoint,
    ns: &str,
    p: &Params,
    phase: &str,
    live: &Arc<Live>,
) -> Result<Phase> {
    let writers = p.writers.max(1);
    let period = Duration::from_secs_f64(writers as f64 / p.rate.max(0.001));
    let started = Instant::now();
    let deadline = started + p.duration;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (ep, ns, live) = (ep.clone(), ns.to_string(), live.clone());
        let (size, phase) = (p.object_size, phase.to_string());
        tasks.push(tokio::spawn(async move {
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
                        live.write_failed(format!(
                            "writer create: no answer in {REQUEST_TIMEOUT:?}"
                        ));
                        conn = None;
                    }
                }
            }
            (acked, errors, hist)
        }));
    }
    let mut out = Phase {
        acked: 0,
        errors: 0,
        secs: 0.0,
        latency: new_hist(),
    };
    for t in tasks {
        let (a, e, h) = t.await.context("writer task")?;
        out.acked += a;
        out.errors += e;
        out.latency.add(&h)?;
    }
    out.secs = started.elapsed().as_secs_f64();
    Ok(out)
}

#[derive(Default)]
struct Hammer {
    lists: AtomicU64,
    items: AtomicU64,
    e429: AtomicU64,
    errors: AtomicU64,
}

/// One unpaged list; the number of items, or the status it was refused with.
async fn list_once(c: &mut Conn, ns: &str) -> Result<std::result::Result<u64, StatusCode>> {
    #[derive(serde::Deserialize)]
    struct List {
        items: Vec<serde::de::IgnoredAny>,
    }
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
    let l: List = serde_json::from_slice(&resp.1).context("list: bad JSON")?;
    Ok(Ok(l.items.len() as u64))
}

/// Starts `clients` tasks listing `ns` until `stop`; the series' events/s are their items.
fn hammer(
    ep: &Endpoint,
    ns: &str,
    clients: usize,
    stop: &Arc<AtomicBool>,
    h: &Arc<Hammer>,
    live: &Arc<Live>,
) {
    for _ in 0..clients.max(1) {
        let (ep, ns, stop, h) = (ep.clone(), ns.to_string(), stop.clone(), h.clone());
        let live = live.clone();
        tokio::spawn(async move {
            let mut conn: Option<Conn> = None;
            while !stop.load(Relaxed) {
                if conn.is_none() {
                    match ep.connect(false).await {
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
                        live.delivered.fetch_add(items, Relaxed);
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
    seed(&hammer_ep, &ns, n, p.object_size, &Live::new()).await?;
    ensure_namespace(&mut hammer_ep.connect(false).await?, wns).await?;

    let total = Arc::new(parking_lot::Mutex::new(new_hist()));
    let series = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let sampler = tokio::spawn(stats::sampler(
        live.clone(),
        p.server_pid,
        total.clone(),
        series.clone(),
        format!("fairness {}", info.kind),
    ));
    eprintln!("phase 1: the writer alone");
    let alone = write_phase(&writer_ep, wns, p, "alone", &live).await?;
    eprintln!("phase 2: the writer beside {} hammering lists", p.clients);
    let stop = Arc::new(AtomicBool::new(false));
    let h = Arc::new(Hammer::default());
    hammer(&hammer_ep, &ns, p.clients, &stop, &h, &live);
    let hammer_t0 = Instant::now();
    let hammered = write_phase(&writer_ep, wns, p, "hammered", &live).await;
    stop.store(true, Relaxed);
    let hammer_secs = hammer_t0.elapsed().as_secs_f64().max(1e-3);
    let hammered = hammered?;
    live.stopping.store(true, Relaxed);
    let _ = sampler.await;

    let g = |a: &AtomicU64| a.load(Relaxed);
    let rate_kept = hammered.rate() / alone.rate().max(1e-9);
    let p99_ratio = hammered.p99_ms() / alone.p99_ms().max(1e-3);
    let mut extra = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        extra.insert(k.into(), v);
    };
    put("objects", n.into());
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
            watch_errors: g(&h.errors),
            ..Counts::default()
        },
        errors: live.error_samples.lock().clone(),
        extra,
    })
}
