//! What every scenario shares to get going: resolving the target from the flags, the
//! namespace and objects a run works in, and the seeded collections that `list` and
//! `relist-storm` read. A leaf below the scenarios; it knows none of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::{Method, StatusCode};

use crate::Params;
use crate::report::TargetInfo;
use crate::stats::{Live, now_nanos};
use crate::target::{self, Conn, Endpoint};
use crate::watch::TS_ANNOTATION;

/// Concurrent creates while seeding a collection (each on its own connection).
const SEED_CONCURRENCY: usize = 16;

pub(crate) enum Tgt {
    Server(Endpoint),
    Etcd(Endpoint),
    Raw,
}

pub(crate) async fn resolve_target(p: &Params) -> Result<(Tgt, TargetInfo)> {
    let given = [
        p.raw,
        p.kubeconfig.is_some(),
        p.server.is_some(),
        p.etcd_endpoints.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if given != 1 {
        bail!("give exactly one of --raw, --kubeconfig, --server, --etcd-endpoints");
    }
    if !p.raw
        && (p.raw_connections.is_some() || p.raw_cpus.is_some() || p.raw_frame_bytes.is_some())
    {
        bail!("--raw-connections, --raw-cpus and --raw-frame-bytes need --raw");
    }
    if p.raw_connections == Some(0) {
        bail!("--raw-connections must be at least 1");
    }
    if p.raw {
        return Ok((
            Tgt::Raw,
            TargetInfo {
                kind: "raw".into(),
                endpoint: "127.0.0.1 (raw-server child process)".into(),
                server_pid: None,
                name: None,
            },
        ));
    }
    if let Some(k) = &p.kubeconfig {
        let ep = target::from_kubeconfig(k, p.allow_remote).await?;
        let info = TargetInfo {
            kind: "kubernetes".into(),
            endpoint: ep.url.clone(),
            server_pid: server_pid(p, &ep),
            name: None,
        };
        return Ok((Tgt::Server(ep), info));
    }
    if let Some(s) = &p.server {
        let ep = Endpoint::from_url(s, p.allow_remote).await?;
        if ep.url.starts_with("https") {
            bail!("--server takes plain http://; use --kubeconfig for TLS");
        }
        let info = TargetInfo {
            kind: "kubernetes".into(),
            endpoint: ep.url.clone(),
            server_pid: server_pid(p, &ep),
            name: None,
        };
        return Ok((Tgt::Server(ep), info));
    }
    let urls = p.etcd_endpoints.clone().unwrap_or_default();
    let first = urls.split(',').next().unwrap_or_default().to_string();
    let ep = Endpoint::from_url(&first, p.allow_remote).await?;
    let info = TargetInfo {
        kind: "etcd".into(),
        endpoint: ep.url.clone(),
        server_pid: server_pid(p, &ep),
        name: None,
    };
    Ok((Tgt::Etcd(ep), info))
}

/// The server process whose CPU and memory the report shows: `--server-pid`, else the
/// process listening on a loopback target's port (when it can be inspected).
fn server_pid(p: &Params, ep: &Endpoint) -> Option<u32> {
    p.server_pid.or_else(|| {
        ep.addr
            .ip()
            .is_loopback()
            .then(|| crate::stats::pid_listening_on(ep.addr.port()))
            .flatten()
    })
}

/// Creates namespace `ns` unless it exists already (409 is fine: runs reuse namespaces).
pub(crate) async fn ensure_namespace(c: &mut crate::target::Conn, ns: &str) -> Result<()> {
    let body = format!(r#"{{"apiVersion":"v1","kind":"Namespace","metadata":{{"name":"{ns}"}}}}"#);
    let (st, b) = c
        .call(
            Method::POST,
            "/api/v1/namespaces",
            body.into(),
            "application/json",
        )
        .await?;
    if !st.is_success() && st != StatusCode::CONFLICT {
        bail!(
            "creating namespace {ns}: {st}: {}",
            String::from_utf8_lossy(&b)
        );
    }
    Ok(())
}

pub(crate) fn sa_body(ns: &str, name: &str, size: usize) -> String {
    let ts = now_nanos();
    let head = format!(
        r#"{{"apiVersion":"v1","kind":"ServiceAccount","metadata":{{"name":"{name}","namespace":"{ns}","annotations":{{"{TS_ANNOTATION}":"{ts}","loadtest.svc/pad":""#
    );
    let tail = r#""}}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    format!("{head}{}{tail}", "x".repeat(pad))
}

/// A new Event of `group` (events.svc.io or events.k8s.io, both `v1`) named `name`, about a
/// pod, with a note padding it to about `size` bytes.
pub(crate) fn event_body(group: &str, ns: &str, name: &str, size: usize) -> String {
    let head = format!(
        r#"{{"apiVersion":"{group}/v1","kind":"Event","metadata":{{"name":"{name}","namespace":"{ns}"}},"eventTime":"{}","reportingController":"svc.io/loadtest","reportingInstance":"loadtest-1","action":"Writing","reason":"Load","regarding":{{"apiVersion":"v1","kind":"Pod","namespace":"{ns}","name":"load"}},"type":"Normal","note":""#,
        rfc3339_micro(std::time::SystemTime::now())
    );
    let tail = r#""}"#;
    // Kubernetes caps notes at 1 kB.
    let pad = size.saturating_sub(head.len() + tail.len()).min(1024);
    format!("{head}{}{tail}", "x".repeat(pad))
}

/// `t` as RFC 3339 in UTC with six fractional digits (an Event's `eventTime`).
fn rfc3339_micro(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since the epoch to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3_600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// How long seeding waits for a new namespace's `default` ServiceAccount, which Kubernetes'
/// service-account controller (and this project's) creates; a server without one costs this
/// wait once.
const DEFAULT_ACCOUNT_WAIT: Duration = Duration::from_secs(3);

/// What seeding found and did.
pub struct Seeded {
    pub created: u64,
    /// Objects in the collection the harness did not write (the namespace's `default`
    /// account on a Kubernetes server): a full list holds these besides the seeded ones.
    pub others: u64,
}

/// The names of the ServiceAccounts in `ns`, listed a thousand at a time.
async fn existing_names(c: &mut Conn, ns: &str) -> Result<std::collections::HashSet<String>> {
    let mut have = std::collections::HashSet::new();
    let mut cont = String::new();
    loop {
        let path = format!(
            "/api/v1/namespaces/{ns}/serviceaccounts?limit=1000{}",
            if cont.is_empty() {
                String::new()
            } else {
                format!("&continue={}", pct(&cont))
            }
        );
        let (st, b) = c.call(Method::GET, &path, Bytes::new(), "").await?;
        if !st.is_success() {
            bail!("listing {ns}: {st}: {}", String::from_utf8_lossy(&b));
        }
        let v: serde_json::Value = serde_json::from_slice(&b).context("list response")?;
        for it in v["items"].as_array().into_iter().flatten() {
            if let Some(name) = it["metadata"]["name"].as_str() {
                have.insert(name.to_string());
            }
        }
        cont = v["metadata"]["continue"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if cont.is_empty() {
            break;
        }
    }
    Ok(have)
}

/// Creates `ns` and the ServiceAccounts `l-0..l-{n}` in it that are not there yet, after
/// waiting (briefly) for the namespace's own `default` account so that the collection does
/// not change under the run. Create latencies go to `live`'s write histogram.
pub async fn seed(
    ep: &Endpoint,
    ns: &str,
    n: usize,
    size: usize,
    live: &Arc<Live>,
) -> Result<Seeded> {
    let mut c = ep.connect(false).await?;
    ensure_namespace(&mut c, ns).await?;
    let default = format!("/api/v1/namespaces/{ns}/serviceaccounts/default");
    let waited = Instant::now();
    while waited.elapsed() < DEFAULT_ACCOUNT_WAIT {
        let (st, _) = c.call(Method::GET, &default, Bytes::new(), "").await?;
        if st.is_success() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Which names exist already: a re-run against the same server reuses the collection.
    let have = existing_names(&mut c, ns).await?;
    let seeded: std::collections::HashSet<String> = (0..n).map(|i| format!("l-{i}")).collect();
    let others = have.iter().filter(|name| !seeded.contains(*name)).count() as u64;
    let missing: Arc<Vec<String>> = Arc::new(
        (0..n)
            .map(|i| format!("l-{i}"))
            .filter(|name| !have.contains(name))
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let (created, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..SEED_CONCURRENCY.min(missing.len()) {
        let (ep, ns, missing, next) = (ep.clone(), ns.to_string(), missing.clone(), next.clone());
        let (created, errors, live) = (created.clone(), errors.clone(), live.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn: Option<Conn> = None;
            loop {
                let i = next.fetch_add(1, Relaxed);
                let Some(name) = missing.get(i) else { break };
                if conn.is_none() {
                    conn = ep.connect(false).await.ok();
                }
                let Some(c) = conn.as_mut() else {
                    errors.fetch_add(1, Relaxed);
                    continue;
                };
                let path = format!("/api/v1/namespaces/{ns}/serviceaccounts");
                let t0 = Instant::now();
                match c
                    .call(
                        Method::POST,
                        &path,
                        sa_body(&ns, name, size).into(),
                        "application/json",
                    )
                    .await
                {
                    // 409: someone else created it meanwhile; it is there, which is the point.
                    Ok((st, _)) if st.is_success() || st == StatusCode::CONFLICT => {
                        created.fetch_add(1, Relaxed);
                        live.record_write(t0.elapsed().as_micros() as u64);
                    }
                    Ok((st, b)) => {
                        errors.fetch_add(1, Relaxed);
                        live.note_error(format!(
                            "seeding {name}: {st}: {}",
                            String::from_utf8_lossy(&b[..b.len().min(200)])
                        ));
                    }
                    Err(e) => {
                        errors.fetch_add(1, Relaxed);
                        live.note_error(format!("seeding {name}: {e:#}"));
                        conn = None;
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let errors = errors.load(Relaxed);
    if errors > 0 {
        bail!("{errors} objects could not be created in {ns}");
    }
    Ok(Seeded {
        created: created.load(Relaxed),
        others,
    })
}

/// Percent-encodes a query value (continue tokens are base64 and may hold `+/=`).
/// Best effort: deletes a run's namespace so the server is left as it was.
pub async fn remove_namespace(ep: &Endpoint, ns: &str) {
    if let Ok(mut c) = ep.connect(false).await {
        let _ = c
            .call(
                Method::DELETE,
                &format!("/api/v1/namespaces/{ns}"),
                Bytes::new(),
                "",
            )
            .await;
    }
}

/// The resourceVersion of a one-item list of the namespace's ServiceAccounts (where a watch
/// that must see every later write starts).
pub async fn list_rv(c: &mut Conn, ns: &str) -> Result<u64> {
    let (st, b) = c
        .call(
            Method::GET,
            &format!("/api/v1/namespaces/{ns}/serviceaccounts?limit=1"),
            Bytes::new(),
            "",
        )
        .await?;
    if !st.is_success() {
        bail!("list: {st}: {}", String::from_utf8_lossy(&b));
    }
    let v: serde_json::Value = serde_json::from_slice(&b).context("list response")?;
    v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .context("list has no resourceVersion")
}

pub fn pct(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn event_times_are_rfc3339_with_microseconds() {
        let at = |secs: u64, micros: u64| {
            rfc3339_micro(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(1_714_979_289, 123_456), "2024-05-06T07:08:09.123456Z");
        assert_eq!(at(951_782_400, 1), "2000-02-29T00:00:00.000001Z");
        assert_eq!(at(4_107_542_399, 999_999), "2100-02-28T23:59:59.999999Z");
    }

    #[test]
    fn event_bodies_are_json_of_about_the_size_asked() {
        let body = event_body("events.svc.io", "ns", "e-1", 600);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["apiVersion"], "events.svc.io/v1");
        assert_eq!(v["metadata"]["name"], "e-1");
        assert_eq!(body.len(), 600);
        let huge = event_body("events.k8s.io", "ns", "e-2", 10_000);
        let v: serde_json::Value = serde_json::from_str(&huge).unwrap();
        assert_eq!(v["note"].as_str().unwrap().len(), 1024);
    }
}
