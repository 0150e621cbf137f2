//! `list`: concurrent clients list a large collection (paged or not, JSON or protobuf, gzip
//! or not) for the run's duration; each full list (every page) is timed and must hold
//! exactly the collection's N items (the collection is seeded by `setup::seed`).

use std::io::Read as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;

use crate::Params;
use crate::report::{Counts, Percentiles, Results};
use crate::setup::{Seeded, Tgt, pct, resolve_target, seed};
use crate::stats::{self, Live, new_hist};
use crate::target::{self, Conn, Endpoint};

/// A page that takes longer than this counts as an error rather than hanging the run.
const PAGE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one full list (every page) came to.
#[derive(Default)]
struct Outcome {
    items: u64,
    pages: u64,
    wire: u64,
    decoded: u64,
    gzipped: u64,
}

/// A failed page: the status when the server answered, for counting 429s and 5xx apart.
struct ListErr {
    status: Option<StatusCode>,
    msg: String,
    /// The connection is unusable (transport error): the client reconnects.
    broken: bool,
}

#[derive(serde::Deserialize)]
struct JsonList {
    #[serde(default)]
    metadata: JsonListMeta,
    #[serde(default)]
    items: Vec<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize, Default)]
struct JsonListMeta {
    #[serde(default, rename = "continue")]
    cont: Option<String>,
}

fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let c = *b.get(*i)?;
        *i += 1;
        v |= ((c & 0x7f) as u64) << shift;
        if c & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Walks one protobuf message, calling `f(field, bytes)` for length-delimited fields and
/// skipping the rest; `None` on a malformed message.
fn fields<'a>(b: &'a [u8], mut f: impl FnMut(u64, &'a [u8])) -> Option<()> {
    let mut i = 0;
    while i < b.len() {
        let key = varint(b, &mut i)?;
        match key & 7 {
            0 => {
                varint(b, &mut i)?;
            }
            1 => i += 8,
            5 => i += 4,
            2 => {
                let len = varint(b, &mut i)? as usize;
                let v = b.get(i..i.checked_add(len)?)?;
                f(key >> 3, v);
                i += len;
            }
            _ => return None,
        }
    }
    (i == b.len()).then_some(())
}

/// A protobuf list: the `k8s\0` envelope (Unknown: field 2 is the raw list), then the
/// list's field 1 (ListMeta: field 3 is `continue`) and repeated field 2 (items). No schema
/// crate is needed to count items and follow pages.
fn proto_list(b: &[u8]) -> Option<(u64, String)> {
    let env = b.strip_prefix(b"k8s\0")?;
    let mut raw = None;
    fields(env, |f, v| {
        if f == 2 {
            raw = Some(v);
        }
    })?;
    let (mut items, mut meta) = (0u64, None);
    fields(raw?, |f, v| match f {
        1 => meta = Some(v),
        2 => items += 1,
        _ => {}
    })?;
    let mut cont = String::new();
    if let Some(m) = meta {
        fields(m, |f, v| {
            if f == 3 {
                cont = String::from_utf8_lossy(v).into_owned();
            }
        })?;
    }
    Some((items, cont))
}

/// One page's path: `limit` when paged, the `continue` token after the first page, and the
/// `resourceVersion` on the first page only (a continued list carries its own).
fn list_path(ns: &str, page_size: usize, rv: Option<&str>, cont: &str) -> String {
    let mut q = Vec::new();
    if page_size > 0 {
        q.push(format!("limit={page_size}"));
    }
    if !cont.is_empty() {
        q.push(format!("continue={}", pct(cont)));
    } else if let Some(rv) = rv {
        q.push(format!("resourceVersion={}", pct(rv)));
    }
    let mut path = format!("/api/v1/namespaces/{ns}/serviceaccounts");
    if !q.is_empty() {
        path.push('?');
        path.push_str(&q.join("&"));
    }
    path
}

async fn full_list(c: &mut Conn, ns: &str, p: &Params) -> Result<Outcome, ListErr> {
    let proto = p.media == "protobuf";
    let mut out = Outcome::default();
    let mut cont = String::new();
    loop {
        let path = list_path(ns, p.page_size, p.resource_version.as_deref(), &cont);
        let mut req = target::request(Method::GET, &path, Bytes::new(), "");
        let h = req.headers_mut();
        h.insert(
            "accept",
            http::HeaderValue::from_static(if proto {
                "application/vnd.kubernetes.protobuf"
            } else {
                "application/json"
            }),
        );
        if p.gzip {
            h.insert("accept-encoding", http::HeaderValue::from_static("gzip"));
        }
        let broken = |msg: String| ListErr {
            status: None,
            msg,
            broken: true,
        };
        let resp = tokio::time::timeout(PAGE_TIMEOUT, async {
            let resp = c.send(req).await?;
            let st = resp.status();
            let gz = resp
                .headers()
                .get("content-encoding")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
            let body = resp.into_body().collect().await?.to_bytes();
            anyhow::Ok((st, gz, body))
        })
        .await;
        let (st, gz, body) = match resp {
            Err(_) => return Err(broken(format!("list page: no answer in {PAGE_TIMEOUT:?}"))),
            Ok(Err(e)) => return Err(broken(format!("list page: {e:#}"))),
            Ok(Ok(r)) => r,
        };
        if st != StatusCode::OK {
            return Err(ListErr {
                status: Some(st),
                msg: format!(
                    "list page: {st}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(200)])
                ),
                broken: false,
            });
        }
        out.pages += 1;
        out.wire += body.len() as u64;
        let plain = if gz {
            out.gzipped += 1;
            let mut v = Vec::with_capacity(body.len() * 4);
            if let Err(e) = flate2::read::GzDecoder::new(&body[..]).read_to_end(&mut v) {
                return Err(ListErr {
                    status: Some(st),
                    msg: format!("gunzip: {e}"),
                    broken: false,
                });
            }
            Bytes::from(v)
        } else {
            body
        };
        out.decoded += plain.len() as u64;
        let bad = |msg: String| ListErr {
            status: Some(st),
            msg,
            broken: false,
        };
        let (items, next) = if proto {
            proto_list(&plain).ok_or_else(|| bad("list page: malformed protobuf".into()))?
        } else {
            let l: JsonList = serde_json::from_slice(&plain)
                .map_err(|e| bad(format!("list page: bad JSON: {e}")))?;
            (l.items.len() as u64, l.metadata.cont.unwrap_or_default())
        };
        out.items += items;
        if next.is_empty() {
            return Ok(out);
        }
        if p.page_size == 0 {
            return Err(bad("unpaged list returned a continue token".into()));
        }
        cont = next;
    }
}

#[derive(Default)]
struct Totals {
    lists: AtomicU64,
    items: AtomicU64,
    pages: AtomicU64,
    wire: AtomicU64,
    decoded: AtomicU64,
    gzipped: AtomicU64,
    inconsistent: AtomicU64,
    errors: AtomicU64,
    e429: AtomicU64,
    e5xx: AtomicU64,
}

pub async fn run(p: &Params) -> Result<Results> {
    let (tgt, info) = resolve_target(p).await?;
    let Tgt::Server(ep) = tgt else {
        bail!("list runs against a Kubernetes-compatible server (--server or --kubeconfig)");
    };
    let live = Live::new();
    let n = p.objects;
    // One namespace per collection size, kept after the run: seeding 10,000 objects takes
    // longer than listing them, and every mode of a benchmark lists the same collection.
    let ns = format!("svc-loadtest-list-{n}");
    eprintln!("seeding {n} objects in {ns}");
    let seed_t0 = Instant::now();
    let seeded = seed(&ep, &ns, n, p.object_size, &live).await?;
    let created = seeded.created;
    // Every full list must hold exactly the collection: the seeded objects and the server's
    // own (a namespace's `default` account).
    let expected = n as u64 + seeded.others;
    let seed_s = seed_t0.elapsed().as_secs_f64();

    let total = Arc::new(parking_lot::Mutex::new(new_hist()));
    let series = Arc::new(parking_lot::Mutex::new(Vec::new()));
    // The series reads `delivered` as items/s and `writes` as lists/s.
    let live_l = Live::new();
    let sampler = tokio::spawn(stats::sampler(
        live_l.clone(),
        info.server_pid,
        total.clone(),
        series.clone(),
        format!("list {}", info.kind),
    ));
    let t = Arc::new(Totals::default());
    let cpu = |pid: Option<u32>| pid.and_then(|p| stats::proc_cpu_secs(&p.to_string()));
    let (cpu0, store0) = (cpu(info.server_pid), cpu(p.store_pid));
    let started = Instant::now();
    let deadline = started + p.duration;
    let mut clients = Vec::new();
    for _ in 0..p.clients.max(1) {
        clients.push(tokio::spawn(client(
            ep.clone(),
            ns.clone(),
            p.clone(),
            t.clone(),
            live_l.clone(),
            deadline,
            expected,
        )));
    }
    for c in clients {
        let _ = c.await;
    }
    let elapsed = started.elapsed();
    let spent = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (b - a).max(0.0));
    let server_cpu_s = spent(cpu0, cpu(info.server_pid));
    let store_cpu_s = spent(store0, cpu(p.store_pid));
    live_l.stopping.store(true, Relaxed);
    let _ = sampler.await;

    let secs = elapsed.as_secs_f64().max(1e-3);
    let total = total.lock().clone();
    let g = |a: &AtomicU64| a.load(Relaxed);
    let extra = extra(p, &t, secs, &seeded, seed_s);
    let mut errors = live.error_samples.lock().clone();
    errors.extend(live_l.error_samples.lock().iter().cloned());
    let write_lat = live.write_lat.lock().take().unwrap_or_else(new_hist);
    let series = series.lock().clone();
    Ok(Results {
        schema: crate::report::SCHEMA.into(),
        scenario: "list".into(),
        target: info,
        params: p.clone(),
        machine: stats::machine(),
        duration_s: secs,
        elapsed_s: secs,
        series,
        latency_ms: Percentiles::of(&total),
        write_latency_ms: Percentiles::of(&write_lat),
        counts: Counts {
            writes_acked: created,
            writes_per_s: created as f64 / seed_s.max(1e-3),
            events_delivered: g(&t.items),
            events_per_s: g(&t.items) as f64 / secs,
            watch_errors: g(&t.errors),
            server_cpu_s,
            store_cpu_s,
            ..Counts::default()
        },
        errors,
        extra,
    })
}

/// One client: full lists, one after another on one connection, until `deadline`.
async fn client(
    ep: Endpoint,
    ns: String,
    p: Params,
    t: Arc<Totals>,
    live: Arc<Live>,
    deadline: Instant,
    expected: u64,
) {
    let mut conn: Option<Conn> = None;
    while Instant::now() < deadline {
        if conn.is_none() {
            match ep.connect(false).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    t.errors.fetch_add(1, Relaxed);
                    live.watch_errors.fetch_add(1, Relaxed);
                    live.note_error(format!("connect: {e:#}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let t0 = Instant::now();
        match full_list(c, &ns, &p).await {
            Ok(o) => record_list(&t, &live, t0, &o, expected),
            Err(e) => {
                let broken = e.broken;
                record_error(&t, &live, e);
                if broken {
                    conn = None;
                }
                // Back off a little: a server shedding load should not be hammered.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Counts a full list that began at `t0`, and notes it when it did not hold `expected` items.
fn record_list(t: &Totals, live: &Live, t0: Instant, o: &Outcome, expected: u64) {
    let us = t0.elapsed().as_micros() as u64;
    if let Some(h) = live.interval.lock().as_mut() {
        h.saturating_record(us.max(1));
    }
    t.lists.fetch_add(1, Relaxed);
    live.writes.fetch_add(1, Relaxed);
    live.delivered.fetch_add(o.items, Relaxed);
    t.items.fetch_add(o.items, Relaxed);
    t.pages.fetch_add(o.pages, Relaxed);
    t.wire.fetch_add(o.wire, Relaxed);
    t.decoded.fetch_add(o.decoded, Relaxed);
    t.gzipped.fetch_add(o.gzipped, Relaxed);
    if o.items != expected {
        t.inconsistent.fetch_add(1, Relaxed);
        live.note_error(format!(
            "a full list held {} items, not {expected}",
            o.items
        ));
    }
}

/// Counts a failed list.
fn record_error(t: &Totals, live: &Live, e: ListErr) {
    t.errors.fetch_add(1, Relaxed);
    live.watch_errors.fetch_add(1, Relaxed);
    match e.status.map(|s| s.as_u16()) {
        Some(429) => t.e429.fetch_add(1, Relaxed),
        Some(500..=599) => t.e5xx.fetch_add(1, Relaxed),
        _ => 0,
    };
    live.note_error(e.msg);
}

/// The list scenario's report fields: the collection, the mode, and rates over `secs`.
fn extra(
    p: &Params,
    t: &Totals,
    secs: f64,
    seeded: &Seeded,
    seed_s: f64,
) -> serde_json::Map<String, serde_json::Value> {
    let n = p.objects;
    let created = seeded.created;
    let g = |a: &AtomicU64| a.load(Relaxed);
    let lists = g(&t.lists);
    let mut extra = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        extra.insert(k.into(), v);
    };
    put("objects", n.into());
    put("server_objects", seeded.others.into());
    put("clients", p.clients.max(1).into());
    put("page_size", p.page_size.into());
    put("media", p.media.clone().into());
    put(
        "resource_version",
        p.resource_version
            .clone()
            .map_or("unset".into(), Into::into),
    );
    put("gzip", p.gzip.into());
    put("lists", lists.into());
    put("lists_per_s", (lists as f64 / secs).into());
    put("items_per_s", (g(&t.items) as f64 / secs).into());
    put("wire_bytes_per_s", (g(&t.wire) as f64 / secs).into());
    put("decoded_bytes_per_s", (g(&t.decoded) as f64 / secs).into());
    put(
        "wire_bytes_per_list",
        (g(&t.wire) as f64 / lists.max(1) as f64).into(),
    );
    put("pages", g(&t.pages).into());
    put("gzip_responses", g(&t.gzipped).into());
    put("inconsistent_lists", g(&t.inconsistent).into());
    put("list_errors", g(&t.errors).into());
    put("list_errors_429", g(&t.e429).into());
    put("list_errors_5xx", g(&t.e5xx).into());
    put("objects_created", created.into());
    put("seed_s", seed_s.into());
    extra
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protobuf_list_items_and_continue() {
        // ListMeta { continue: "abc" }, two items, wrapped in Unknown { raw }.
        let meta = [0x1a, 3, b'a', b'b', b'c'];
        let mut list = vec![0x0a, meta.len() as u8];
        list.extend_from_slice(&meta);
        list.extend_from_slice(&[0x12, 1, 0x00, 0x12, 0]);
        let mut b = b"k8s\0".to_vec();
        b.extend_from_slice(&[0x0a, 0, 0x12, list.len() as u8]);
        b.extend_from_slice(&list);
        assert_eq!(proto_list(&b), Some((2, "abc".into())));
        assert_eq!(proto_list(&b[..b.len() - 1]), None);
        assert_eq!(proto_list(b"{}"), None);
    }

    #[test]
    fn list_paths_carry_the_resource_version_on_the_first_page_only() {
        let base = "/api/v1/namespaces/n/serviceaccounts";
        assert_eq!(list_path("n", 0, None, ""), base);
        assert_eq!(
            list_path("n", 0, Some("0"), ""),
            format!("{base}?resourceVersion=0")
        );
        assert_eq!(list_path("n", 500, None, ""), format!("{base}?limit=500"));
        assert_eq!(
            list_path("n", 500, Some("0"), ""),
            format!("{base}?limit=500&resourceVersion=0")
        );
        assert_eq!(
            list_path("n", 500, Some("0"), "a+b="),
            format!("{base}?limit=500&continue=a%2Bb%3D")
        );
    }

    #[test]
    fn percent_encoding() {
        assert_eq!(pct("a+b/c=="), "a%2Bb%2Fc%3D%3D");
    }
}
