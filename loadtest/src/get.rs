//! `get`: concurrent clients GET one path (`--path`, default `/version`) as fast as answers
//! come, each on its own HTTP/1.1 connection; requests/s and latency. With the same path and
//! clients, two runs that differ only in the kubeconfig's user (a client certificate, a
//! bearer token) compare what authentication costs per request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;

use crate::Params;
use crate::report::{Counts, Percentiles, Results};
use crate::setup::{Tgt, resolve_target};
use crate::stats::{self, new_hist};
use crate::target::{self, Conn};

#[derive(Default)]
struct Totals {
    ok: AtomicU64,
    other_status: AtomicU64,
    errors: AtomicU64,
}

pub async fn run(p: &Params) -> Result<Results> {
    let (tgt, info) = resolve_target(p).await?;
    let Tgt::Server(ep) = tgt else {
        bail!("get runs against an HTTP server (--server or --kubeconfig)");
    };
    if !p.path.starts_with('/') {
        bail!("--path must start with /");
    }
    let totals = Arc::new(Totals::default());
    let latency = Arc::new(parking_lot::Mutex::new(new_hist()));
    let samples = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let deadline = started + p.duration;
    let mut clients = Vec::new();
    for _ in 0..p.clients.max(1) {
        let (ep, path) = (ep.clone(), p.path.clone());
        let (t, lat, samples) = (totals.clone(), latency.clone(), samples.clone());
        clients.push(tokio::spawn(async move {
            let mut conn: Option<Conn> = None;
            let mut hist = new_hist();
            while Instant::now() < deadline {
                if conn.is_none() {
                    match ep.connect(false).await {
                        Ok(c) => conn = Some(c),
                        Err(e) => {
                            t.errors.fetch_add(1, Relaxed);
                            note(&samples, format!("connect: {e:#}"));
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                }
                let Some(c) = conn.as_mut() else { continue };
                let t0 = Instant::now();
                let req = target::request(Method::GET, &path, Bytes::new(), "");
                let outcome = match c.send(req).await {
                    Ok(resp) => {
                        let status = resp.status();
                        match resp.into_body().collect().await {
                            Ok(_) => Ok(status),
                            Err(e) => Err(format!("reading the body: {e}")),
                        }
                    }
                    Err(e) => Err(format!("{e:#}")),
                };
                match outcome {
                    Ok(s) if s.is_success() => {
                        hist.saturating_record((t0.elapsed().as_micros() as u64).max(1));
                        t.ok.fetch_add(1, Relaxed);
                    }
                    Ok(s) => {
                        t.other_status.fetch_add(1, Relaxed);
                        note(&samples, format!("GET {path}: {s}"));
                    }
                    Err(e) => {
                        t.errors.fetch_add(1, Relaxed);
                        note(&samples, e);
                        conn = None;
                    }
                }
            }
            let _ = lat.lock().add(&hist);
        }));
    }
    for c in clients {
        let _ = c.await;
    }
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    let ok = totals.ok.load(Relaxed);
    let mut extra = serde_json::Map::new();
    extra.insert("path".into(), p.path.clone().into());
    extra.insert("clients".into(), p.clients.max(1).into());
    extra.insert("authentication".into(), auth_kind(&ep).into());
    extra.insert("requests_per_s".into(), (ok as f64 / secs).into());
    extra.insert("non_2xx".into(), totals.other_status.load(Relaxed).into());
    let lat = latency.lock().clone();
    let errors = samples.lock().clone();
    Ok(Results {
        schema: crate::report::SCHEMA.into(),
        scenario: "get".into(),
        target: info,
        params: p.clone(),
        machine: stats::machine(),
        duration_s: secs,
        elapsed_s: secs,
        series: Vec::new(),
        latency_ms: Percentiles::of(&lat),
        write_latency_ms: Percentiles::default(),
        counts: Counts {
            writes_acked: ok,
            writes_per_s: ok as f64 / secs,
            watch_errors: totals.errors.load(Relaxed) + totals.other_status.load(Relaxed),
            ..Counts::default()
        },
        errors,
        extra,
    })
}

fn auth_kind(ep: &target::Endpoint) -> &'static str {
    if ep.exec.is_some() {
        return "exec plugin";
    }
    match (&ep.tls, &ep.bearer) {
        (_, Some(_)) => "bearer token",
        (Some(_), None) => "client certificate",
        (None, None) => "none",
    }
}

/// Keeps the first few distinct error messages.
fn note(samples: &parking_lot::Mutex<Vec<String>>, msg: String) {
    let mut s = samples.lock();
    if s.len() < 10 && !s.contains(&msg) {
        s.push(msg);
    }
}
