//! `/healthz`, `/livez`, `/readyz` and their per-check paths, with `verbose` and `exclude`,
//! in the output format Kubernetes uses. In proxy mode the storage checks give way to one
//! `upstream` check of `/readyz`: the upstream answers its own `/readyz`.

use std::sync::atomic::Ordering;

use crate::base::query::Query;
use crate::http::api::{Api, Standalone};
use crate::http::respond::{self, Body};
use crate::outbound::upstream::Upstream;
use http::StatusCode;

/// Runs every check that belongs to `endpoint`, in a fixed order.
async fn run_checks(app: &Standalone, endpoint: &str) -> Vec<(String, Result<(), String>)> {
    let mut out: Vec<(String, Result<(), String>)> = vec![
        ("ping".into(), Ok(())),
        ("log".into(), Ok(())),
        (
            "etcd".into(),
            app.registry.store.health().await.map_err(|e| e.to_string()),
        ),
    ];
    if endpoint != "livez" {
        // Kubernetes' readyz-only storage check: reads AND writes. A store that cannot commit
        // (a full disk, a failing fsync) is alive, so `/livez` stays good and nothing restarts
        // it, but not ready, so traffic goes elsewhere until writes work again.
        out.push((
            "etcd-readiness".into(),
            app.registry.store.ready().await.map_err(|e| e.to_string()),
        ));
        out.push(("autoregister-completion".into(), Ok(())));
    }
    for (name, done) in app.api.hooks.list() {
        out.push((
            name,
            if done {
                Ok(())
            } else {
                Err("not finished".into())
            },
        ));
    }
    if endpoint == "readyz" {
        let shutting_down = app.api.shutting_down.load(Ordering::Acquire);
        out.push((
            "shutdown".into(),
            if shutting_down {
                Err("process is shutting down".into())
            } else {
                Ok(())
            },
        ));
    }
    out
}

pub async fn serve(
    app: &Standalone,
    endpoint: &str,
    check: Option<&str>,
    query: &Query,
) -> http::Response<Body> {
    let checks = run_checks(app, endpoint).await;
    report(&app.api, endpoint, check, query, checks)
}

/// The checks of a proxy: alive while it runs; ready while the upstream is and it is not
/// shutting down (a dead upstream is no reason to restart the proxy, so `/livez` and
/// `/healthz` leave it out).
pub async fn serve_proxied(
    app: &Api,
    upstream: &Upstream,
    caches: Option<&crate::registry::caches::upstream::UpstreamCaches>,
    endpoint: &str,
    check: Option<&str>,
    query: &Query,
) -> http::Response<Body> {
    let mut checks: Vec<(String, Result<(), String>)> =
        vec![("ping".into(), Ok(())), ("log".into(), Ok(()))];
    if endpoint == "readyz" {
        checks.push(("upstream".into(), upstream.ready().await));
        if let Some(m) = caches {
            checks.push(("proxy-caches-synced".into(), m.synced()));
        }
        let shutting_down = app.shutting_down.load(Ordering::Acquire);
        checks.push((
            "shutdown".into(),
            if shutting_down {
                Err("process is shutting down".into())
            } else {
                Ok(())
            },
        ));
    }
    report(app, endpoint, check, query, checks)
}

fn report(
    app: &Api,
    endpoint: &str,
    check: Option<&str>,
    query: &Query,
    checks: Vec<(String, Result<(), String>)>,
) -> http::Response<Body> {
    let in_grace = endpoint == "livez" && app.started.elapsed() < app.opts.livez_grace_period;

    if let Some(name) = check {
        return match checks.iter().find(|(n, _)| n == name) {
            Some((_, Ok(()))) => respond::text(StatusCode::OK, "ok"),
            Some((_, Err(_))) if in_grace => respond::text(StatusCode::OK, "ok"),
            Some((_, Err(e))) => respond::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("internal server error: {e}\n"),
            ),
            None => respond::text(StatusCode::NOT_FOUND, "404 page not found\n"),
        };
    }

    let excluded: Vec<&str> = query
        .get_all("exclude")
        .into_iter()
        .flat_map(|v| v.split(','))
        .filter(|s| !s.is_empty())
        .collect();
    let mut body = String::new();
    let mut failed = false;
    for (name, result) in &checks {
        if excluded.contains(&name.as_str()) {
            body.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        match result {
            Ok(()) => body.push_str(&format!("[+]{name} ok\n")),
            Err(_) => {
                failed = true;
                // Reasons are withheld from the HTTP body, as Kubernetes does; they are logged.
                body.push_str(&format!("[-]{name} failed: reason withheld\n"));
            }
        }
    }
    let unknown: Vec<&str> = excluded
        .iter()
        .copied()
        .filter(|e| !checks.iter().any(|(n, _)| n == e))
        .collect();
    if !unknown.is_empty() {
        body.push_str(&format!(
            "warn: some health checks cannot be excluded: no matches for {}\n",
            unknown
                .iter()
                .map(|u| format!("\"{u}\""))
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    if failed && !in_grace {
        for (name, result) in &checks {
            if let Err(e) = result {
                tracing::warn!(endpoint, check = %name, error = %e, "health check failed");
            }
        }
        body.push_str(&format!("{endpoint} check failed\n"));
        return respond::text(StatusCode::INTERNAL_SERVER_ERROR, body);
    }
    if query.has("verbose") {
        body.push_str(&format!("{endpoint} check passed\n"));
        respond::text(StatusCode::OK, body)
    } else {
        respond::text(StatusCode::OK, "ok")
    }
}
