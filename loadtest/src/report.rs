//! The report directory: `results.json` (one schema, below), `report.md` (tables, ratios when
//! several targets ran) and SVG charts. The SVG is written by hand: a few polylines and
//! `<text>` labels need no plotting library and no fonts on the machine that renders them.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::Params;
use crate::stats::{Machine, Sample};

/// Bumped whenever a field changes meaning; readers check it.
pub const SCHEMA: &str = "svc-loadtest/results/v1";

/// One run of one scenario against one target. `results.json` holds `{"schema", "runs": [..]}`.
#[derive(Clone, Debug, Serialize)]
pub struct Results {
    pub schema: String,
    pub scenario: String,
    pub target: TargetInfo,
    pub params: Params,
    pub machine: Machine,
    /// Seconds writers ran.
    pub duration_s: f64,
    /// Seconds from the first write to the end of the drain (rates are over this).
    pub elapsed_s: f64,
    /// One sample a second.
    pub series: Vec<Sample>,
    /// Write-to-delivery latency over all watchers.
    pub latency_ms: Percentiles,
    /// Acknowledged-write latency as the writers saw it: from sending the request to its
    /// acknowledgement (the writers run on their own thread, so it is the server's time
    /// plus the loopback, not time spent waiting for the load generator).
    pub write_latency_ms: Percentiles,
    pub counts: Counts,
    /// The first distinct error messages.
    pub errors: Vec<String>,
    /// Scenario-specific figures (e.g. slow-watcher's before/after percentiles).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetInfo {
    /// `kubernetes`, `etcd` or `raw`.
    pub kind: String,
    pub endpoint: String,
    /// The server process whose CPU and RSS were sampled (`--server-pid`, the process
    /// listening on the target's loopback port, or the raw server's child process).
    #[serde(default)]
    pub server_pid: Option<u32>,
    /// The target's `name` in a compare scenario file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Self {
        let ms = |v: u64| v as f64 / 1000.0;
        Percentiles {
            count: h.len(),
            p50: ms(h.value_at_quantile(0.5)),
            p90: ms(h.value_at_quantile(0.9)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Counts {
    pub watchers: u64,
    pub watchers_opened: u64,
    pub writes_acked: u64,
    pub writes_per_s: f64,
    pub events_delivered: u64,
    /// `writes_acked × watchers_opened`: what every watcher seeing every write adds up to.
    pub events_expected: u64,
    pub events_per_s: f64,
    /// Watchers that saw exactly every acknowledged write, in order, without duplicates.
    pub watchers_complete: u64,
    /// Events some watcher never saw (sum over watchers).
    pub missing: u64,
    /// Events not newer than the one before them (sum over watchers).
    pub duplicates: u64,
    pub reconnects: u64,
    /// Watchers that were told their resourceVersion had expired (410).
    pub expired: u64,
    pub write_errors: u64,
    pub watch_errors: u64,
    /// Writes/s asked for (`--rate`; none with `--max`).
    #[serde(default)]
    pub offered_writes_per_s: Option<f64>,
    /// `writes_per_s ÷ offered_writes_per_s`: the share of the offered write rate achieved
    /// (1.0: every offered write acknowledged in time; none with `--max`).
    #[serde(default)]
    pub write_rate_achieved: Option<f64>,
    /// `offered_writes_per_s × watchers_opened`: events/s if every watcher kept up.
    #[serde(default)]
    pub offered_events_per_s: Option<f64>,
    /// CPU seconds (user + system) the server process used from the first write to the end
    /// of the drain, from /proc/<pid>/stat.
    #[serde(default)]
    pub server_cpu_s: Option<f64>,
    /// `server_cpu_s` in µs per delivered event (per acknowledged write when nothing watches).
    #[serde(default)]
    pub server_cpu_us_per_event: Option<f64>,
    /// CPU seconds of the store process (`--store-pid`, e.g. a kube-apiserver's etcd) over
    /// the same span; not included in `server_cpu_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_cpu_s: Option<f64>,
    /// `store_cpu_s` in µs per delivered event (per acknowledged write when nothing watches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_cpu_us_per_event: Option<f64>,
}

/// A compare target that did not produce a run (listed in `results.json` under `failures`).
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    pub target: String,
    pub error: String,
}

pub fn write(dir: &Path, runs: &[Results]) -> Result<()> {
    write_with_failures(dir, runs, &[])
}

pub fn write_with_failures(dir: &Path, runs: &[Results], failures: &[Failure]) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let json = serde_json::json!({ "schema": SCHEMA, "runs": runs, "failures": failures });
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    std::fs::write(
        dir.join("throughput.svg"),
        chart("events delivered per second", "events/s", runs, |s| {
            s.events_per_s
        }),
    )?;
    std::fs::write(
        dir.join("p99.svg"),
        chart(
            "p99 write-to-delivery latency per second",
            "ms",
            runs,
            |s| s.p99_ms,
        ),
    )?;
    if runs
        .iter()
        .any(|r| r.series.iter().any(|s| s.server_rss_bytes.is_some()))
    {
        std::fs::write(
            dir.join("server-cpu.svg"),
            chart("server CPU", "% of one core", runs, |s| {
                s.server_cpu_pct.unwrap_or(0.0)
            }),
        )?;
        std::fs::write(
            dir.join("server-rss.svg"),
            chart("server RSS", "MiB", runs, |s| {
                s.server_rss_bytes.unwrap_or(0) as f64 / (1 << 20) as f64
            }),
        )?;
    }
    std::fs::write(dir.join("latency.svg"), percentile_chart(runs))?;
    std::fs::write(
        dir.join("report.md"),
        markdown_with_failures(runs, failures),
    )?;
    Ok(())
}

/// The target's compare name, else its kind (the ratio table's row and column heads).
fn short_label(r: &Results) -> &str {
    r.target.name.as_deref().unwrap_or(&r.target.kind)
}

fn label(r: &Results) -> String {
    match &r.target.name {
        Some(name) => format!("{name} ({})", r.target.endpoint),
        None => format!("{} ({})", r.target.kind, r.target.endpoint),
    }
}

pub fn markdown_with_failures(runs: &[Results], failures: &[Failure]) -> String {
    let mut m = if runs.is_empty() {
        "# svc-loadtest: no run succeeded\n".to_string()
    } else {
        markdown(runs)
    };
    if !failures.is_empty() {
        let _ = writeln!(m, "\n## Failed targets\n\n| target | error |\n|---|---|");
        for f in failures {
            let _ = writeln!(
                m,
                "| {} | `{}` |",
                f.target,
                f.error
                    .replace('`', "'")
                    .replace('|', "/")
                    .replace('\n', " ")
            );
        }
    }
    m
}

/// The scenario-specific table of `list` and `relist-storm` (their figures live in `extra`).
fn scenario_table(m: &mut String, runs: &[Results]) {
    let x =
        |r: &Results, k: &str| -> f64 { r.extra.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0) };
    let Some(first) = runs.first() else { return };
    if first.scenario == "list" {
        let _ = writeln!(
            m,
            "| target | objects | clients | page size | resourceVersion | media | gzip | lists/s | items/s | MB/s on the wire | bytes/list | p50 ms | p99 ms | max ms | inconsistent | errors (429/5xx) |"
        );
        let _ = writeln!(
            m,
            "|---|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for r in runs {
            let l = &r.latency_ms;
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.0} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {} ({}/{}) |",
                label(r),
                x(r, "objects"),
                x(r, "clients"),
                x(r, "page_size"),
                r.params.resource_version.as_deref().unwrap_or("unset"),
                r.params.media,
                if r.params.gzip { "on" } else { "off" },
                x(r, "lists_per_s"),
                x(r, "items_per_s"),
                x(r, "wire_bytes_per_s") / 1e6,
                x(r, "wire_bytes_per_list"),
                l.p50,
                l.p99,
                l.max,
                x(r, "inconsistent_lists"),
                x(r, "list_errors"),
                x(r, "list_errors_429"),
                x(r, "list_errors_5xx"),
            );
        }
    } else {
        let _ = writeln!(
            m,
            "| target | watchers | objects | back watching | relist+rewatch p50 ms | p99 ms | max ms | relist errors 429/5xx/other | 410 events | writes after | complete watchers | missing | dups |"
        );
        let _ = writeln!(
            m,
            "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
        );
        for r in runs {
            let l = &r.latency_ms;
            let c = &r.counts;
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {}/{}/{} | {} | {} | {}/{} | {} | {} |",
                label(r),
                c.watchers,
                x(r, "objects"),
                x(r, "storm_rewatched"),
                l.p50,
                l.p99,
                l.max,
                x(r, "relist_errors_429"),
                x(r, "relist_errors_5xx"),
                x(r, "relist_errors_other"),
                x(r, "expired_410_events"),
                c.writes_acked,
                c.watchers_complete,
                c.watchers,
                c.missing,
                c.duplicates,
            );
        }
    }
}

pub fn markdown(runs: &[Results]) -> String {
    let mut m = String::new();
    let Some(first) = runs.first() else {
        return "no runs\n".into();
    };
    header(&mut m, first);
    if first.scenario == "list" || first.scenario == "relist-storm" {
        scenario_table(&mut m, runs);
        for r in runs {
            errors_seen(&mut m, r);
        }
        let _ = writeln!(
            m,
            "\n![throughput (items/s for list, events/s for relist-storm)](throughput.svg)"
        );
        return m;
    }
    results_table(&mut m, runs);
    if runs.len() > 1 {
        ratios(&mut m, runs);
    }
    baselines(&mut m, runs);
    for r in runs {
        run_notes(&mut m, r);
        errors_seen(&mut m, r);
    }
    let _ = writeln!(
        m,
        "\n![throughput](throughput.svg)\n\n![p99 over time](p99.svg)\n\n![latency percentiles](latency.svg)"
    );
    if runs
        .iter()
        .any(|r| r.series.iter().any(|s| s.server_rss_bytes.is_some()))
    {
        let _ = writeln!(
            m,
            "\n![server CPU](server-cpu.svg)\n\n![server RSS](server-rss.svg)"
        );
    }
    m
}

/// The report's title, the machine and the parameters.
fn header(m: &mut String, first: &Results) {
    let _ = writeln!(m, "# svc-loadtest: {}\n", first.scenario);
    let mc = &first.machine;
    let _ = writeln!(
        m,
        "Machine: {} cores ({}), {:.1} GiB memory, Linux {}; load generator on the same machine.\n",
        mc.cores,
        mc.cpu_model,
        mc.memory_bytes as f64 / (1u64 << 30) as f64,
        mc.kernel
    );
    let p = &first.params;
    let _ = writeln!(
        m,
        "Parameters: {} watchers{}, {} writers at {}, {}-byte objects, {} media, {:?} per run.\n",
        p.watchers,
        match (p.h2_connections, p.raw_connections.filter(|_| p.raw)) {
            (Some(c), _) => format!(" as h2 streams over {c} connections"),
            (None, Some(c)) => format!(" as raw-mux streams over {c} connections"),
            (None, None) => " over one HTTP/1.1 connection each".into(),
        },
        p.writers,
        if p.max {
            "full speed".to_string()
        } else {
            format!("{} writes/s in total", p.rate)
        },
        p.object_size,
        p.media,
        p.duration
    );
}

/// One row per run: throughput, latency percentiles, CPU per event and the counts.
fn results_table(m: &mut String, runs: &[Results]) {
    let _ = writeln!(
        m,
        "| target | writes/s (offered, achieved) | write ack p50 / p99 / p99.9 ms | events/s (offered) | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | server CPU µs/event | complete watchers | missing | dups | errors | reconnects |"
    );
    let _ = writeln!(
        m,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in runs {
        let c = &r.counts;
        let l = &r.latency_ms;
        let _ = writeln!(
            m,
            "| {} | {} | {} | {:.0} ({}) | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {}/{} | {} | {} | {} | {} |",
            label(r),
            write_rate_cell(c),
            write_latency_cell(&r.write_latency_ms),
            c.events_per_s,
            opt(c.offered_events_per_s, 0, "max"),
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max,
            match c.store_cpu_us_per_event {
                Some(st) => format!(
                    "{} (+{st:.2} store)",
                    opt(c.server_cpu_us_per_event, 2, "–")
                ),
                None => opt(c.server_cpu_us_per_event, 2, "–"),
            },
            c.watchers_complete,
            c.watchers_opened,
            c.missing,
            c.duplicates,
            c.write_errors + c.watch_errors,
            c.reconnects
        );
    }
}

/// Each run's throughput over each other's.
fn ratios(m: &mut String, runs: &[Results]) {
    let _ = writeln!(
        m,
        "\nRatios (row ÷ column, events/s delivered; writes/s for churn and events):\n"
    );
    let metric = |r: &Results| {
        if r.scenario == "churn" || r.scenario == "events" {
            r.counts.writes_per_s
        } else {
            r.counts.events_per_s
        }
    };
    let _ = write!(m, "| |");
    for r in runs {
        let _ = write!(m, " {} |", short_label(r));
    }
    let _ = write!(m, "\n|---|");
    for _ in runs {
        let _ = write!(m, "---:|");
    }
    let _ = writeln!(m);
    for a in runs {
        let _ = write!(m, "| {} |", short_label(a));
        for b in runs {
            let v = metric(a) / metric(b).max(1e-9);
            let _ = write!(m, " {v:.2}× |");
        }
        let _ = writeln!(m);
    }
}

/// A run's extra fields and its server's and client's peaks.
fn run_notes(m: &mut String, r: &Results) {
    if !r.extra.is_empty() {
        let _ = writeln!(
            m,
            "\n{} extra: `{}`",
            label(r),
            serde_json::Value::Object(r.extra.clone())
        );
    }
    if let Some(s) = r.series.iter().filter_map(|s| s.server_rss_bytes).max() {
        let cpu = r
            .series
            .iter()
            .filter_map(|s| s.server_cpu_pct)
            .fold(0.0, f64::max);
        let _ = writeln!(
            m,
            "\n{}: server peak RSS {:.1} MiB, peak CPU {:.0}% of one core.",
            label(r),
            s as f64 / (1 << 20) as f64,
            cpu
        );
    }
    let ccpu = r
        .series
        .iter()
        .map(|s| s.client_cpu_pct)
        .fold(0.0, f64::max);
    let _ = writeln!(
        m,
        "\n{}: client peak CPU {:.0}% of one core.",
        label(r),
        ccpu
    );
}

/// The errors a run saw, if any.
fn errors_seen(m: &mut String, r: &Results) {
    if !r.errors.is_empty() {
        let _ = writeln!(m, "\nErrors seen ({}):\n", label(r));
        for e in &r.errors {
            let _ = writeln!(m, "- `{}`", e.replace('`', "'"));
        }
    }
}

/// Achieved writes/s, then what was offered and the share achieved: `49.0 (100, 49 %)`, or
/// `812.0 (max)` with `--max`.
fn write_rate_cell(c: &Counts) -> String {
    match (c.offered_writes_per_s, c.write_rate_achieved) {
        (Some(o), Some(a)) => format!("{:.1} ({o:.0}, {:.0} %)", c.writes_per_s, a * 100.0),
        (Some(o), None) => format!("{:.1} ({o:.0})", c.writes_per_s),
        (None, _) => format!("{:.1} (max)", c.writes_per_s),
    }
}

/// Request-to-acknowledgement latency of the writes: `p50 / p99 / p99.9` in ms.
fn write_latency_cell(w: &Percentiles) -> String {
    format!("{:.2} / {:.2} / {:.2}", w.p50, w.p99, w.p999)
}

/// A figure with `digits` decimals, or `none` when there is none.
fn opt(v: Option<f64>, digits: usize, none: &str) -> String {
    v.map_or_else(|| none.to_string(), |v| format!("{v:.digits$}"))
}

/// Each server run against each baseline run (raw, etcd): events/s delivered (writes/s when
/// nothing watches), p99 latency, and server CPU per delivered event.
fn baselines(m: &mut String, runs: &[Results]) {
    let servers: Vec<&Results> = runs
        .iter()
        .filter(|r| r.target.kind == "kubernetes")
        .collect();
    let bases: Vec<&Results> = runs
        .iter()
        .filter(|r| r.target.kind == "raw" || r.target.kind == "etcd")
        .collect();
    if servers.is_empty() || bases.is_empty() {
        return;
    }
    let rate = |r: &Results| {
        if r.counts.events_delivered > 0 {
            r.counts.events_per_s
        } else {
            r.counts.writes_per_s
        }
    };
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}×", a / b)
        } else {
            "–".to_string()
        }
    };
    let _ = writeln!(
        m,
        "\nAgainst the baselines (gateway ÷ baseline; events/s: higher is better, p99 and CPU per event: lower is better):\n"
    );
    let _ = writeln!(
        m,
        "| gateway ÷ | events/s | p99 latency | p99.9 latency | server CPU µs/event |\n|---|---:|---:|---:|---:|"
    );
    for s in &servers {
        for b in &bases {
            let cpu = match (
                s.counts.server_cpu_us_per_event,
                b.counts.server_cpu_us_per_event,
            ) {
                (Some(a), Some(c)) => ratio(a, c),
                _ => "–".into(),
            };
            let _ = writeln!(
                m,
                "| {} ÷ {} | {} | {} | {} | {} |",
                label(s),
                label(b),
                ratio(rate(s), rate(b)),
                ratio(s.latency_ms.p99, b.latency_ms.p99),
                ratio(s.latency_ms.p999, b.latency_ms.p999),
                cpu
            );
        }
    }
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
const W: f64 = 720.0;
const H: f64 = 360.0;
const L: f64 = 80.0;
const B: f64 = 40.0;
const T: f64 = 40.0;
const R: f64 = 20.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn frame(svg: &mut String, title: &str, unit: &str, xmax: f64, ymax: f64, xlabel: &str) {
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    let (x0, y0, x1, y1) = (L, H - B, W - R, T);
    let _ = write!(
        svg,
        r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>"#
    );
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let y = y0 - f * (y0 - y1);
        let x = x0 + f * (x1 - x0);
        let _ = write!(
            svg,
            r##"<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            x0 - 4.0,
            y + 4.0,
            fmt_num(ymax * f),
            y0 + 16.0,
            fmt_num(xmax * f)
        );
    }
    let _ = write!(
        svg,
        r#"<text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle">{}</text><text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        H / 2.0,
        H / 2.0,
        esc(unit),
        (x0 + x1) / 2.0,
        H - 6.0,
        esc(xlabel)
    );
}

fn fmt_num(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn legend(svg: &mut String, names: &[String]) {
    for (i, n) in names.iter().enumerate() {
        let y = T + 4.0 + i as f64 * 16.0;
        let _ = write!(
            svg,
            r#"<rect x="{}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            L + 10.0,
            y,
            COLORS[i % COLORS.len()],
            L + 24.0,
            y + 9.0,
            esc(n)
        );
    }
}

/// A line per run over its per-second series.
fn chart(title: &str, unit: &str, runs: &[Results], f: impl Fn(&Sample) -> f64) -> String {
    let xmax = runs
        .iter()
        .flat_map(|r| r.series.iter().map(|s| s.t))
        .fold(1.0, f64::max);
    let ymax = runs
        .iter()
        .flat_map(|r| r.series.iter().map(&f))
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.1;
    let mut svg = String::new();
    frame(&mut svg, title, unit, xmax, ymax, "seconds");
    for (i, r) in runs.iter().enumerate() {
        let pts: Vec<String> = r
            .series
            .iter()
            .map(|s| {
                let x = L + s.t / xmax * (W - R - L);
                let y = (H - B) - f(s) / ymax * (H - B - T);
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            COLORS[i % COLORS.len()],
            pts.join(" ")
        );
    }
    legend(&mut svg, &runs.iter().map(label).collect::<Vec<_>>());
    svg.push_str("</svg>\n");
    svg
}

/// Grouped bars: p50, p90, p99, p99.9, max per run (log-free, linear ms).
fn percentile_chart(runs: &[Results]) -> String {
    let names = ["p50", "p90", "p99", "p99.9", "max"];
    let vals = |p: &Percentiles| [p.p50, p.p90, p.p99, p.p999, p.max];
    let ymax = runs
        .iter()
        .flat_map(|r| vals(&r.latency_ms))
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.1;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="20" text-anchor="middle" font-size="14">write-to-delivery latency percentiles (ms)</text>"#,
        W / 2.0
    );
    let (x0, y0) = (L, H - B);
    let _ = write!(
        svg,
        r#"<line x1="{x0}" y1="{y0}" x2="{}" y2="{y0}" stroke="black"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{T}" stroke="black"/>"#,
        W - R
    );
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let y = y0 - f * (y0 - T);
        let _ = write!(
            svg,
            r##"<line x1="{x0}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            W - R,
            x0 - 4.0,
            y + 4.0,
            fmt_num(ymax * f)
        );
    }
    let slot = (W - R - L) / names.len() as f64;
    let bw = (slot * 0.8) / runs.len().max(1) as f64;
    for (k, n) in names.iter().enumerate() {
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{n}</text>"#,
            L + slot * (k as f64 + 0.5),
            y0 + 16.0
        );
        for (i, r) in runs.iter().enumerate() {
            let v = vals(&r.latency_ms)[k];
            let h = v / ymax * (y0 - T);
            let _ = write!(
                svg,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{v:.2} ms</title></rect>"#,
                L + slot * k as f64 + slot * 0.1 + bw * i as f64,
                y0 - h,
                bw,
                h,
                COLORS[i % COLORS.len()]
            );
        }
    }
    legend(&mut svg, &runs.iter().map(label).collect::<Vec<_>>());
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        p: Params,
    }

    fn run(kind: &str, offered: Option<f64>, achieved: f64, write: [f64; 3]) -> Results {
        let p = Flags::parse_from(["svc-loadtest", "--rate", "100", "--watchers", "10"]).p;
        Results {
            schema: SCHEMA.into(),
            scenario: "fanout".into(),
            target: TargetInfo {
                kind: kind.into(),
                endpoint: "127.0.0.1:1".into(),
                server_pid: None,
                name: None,
            },
            params: p,
            machine: crate::stats::machine(),
            duration_s: 10.0,
            elapsed_s: 10.0,
            series: Vec::new(),
            latency_ms: Percentiles::default(),
            write_latency_ms: Percentiles {
                count: 490,
                p50: write[0],
                p90: write[0],
                p99: write[1],
                p999: write[2],
                max: write[2],
            },
            counts: Counts {
                writes_per_s: achieved,
                offered_writes_per_s: offered,
                write_rate_achieved: offered.map(|o| achieved / o),
                ..Counts::default()
            },
            errors: Vec::new(),
            extra: serde_json::Map::new(),
        }
    }

    #[test]
    fn every_fanout_row_gives_offered_and_achieved_writes_and_their_latency() {
        let runs = [
            run("kubernetes", Some(100.0), 49.0, [1.5, 20.0, 45.25]),
            run("etcd", Some(100.0), 100.0, [0.8, 2.0, 3.0]),
            run("raw", None, 812.0, [0.01, 0.02, 0.03]),
        ];
        let md = markdown(&runs);
        assert!(
            md.contains("writes/s (offered, achieved) | write ack p50 / p99 / p99.9 ms"),
            "{md}"
        );
        let row = |kind: &str| {
            md.lines()
                .find(|l| l.starts_with(&format!("| {kind} (")))
                .unwrap_or_else(|| panic!("no {kind} row in {md}"))
                .to_string()
        };
        assert!(
            row("kubernetes").contains("| 49.0 (100, 49 %) | 1.50 / 20.00 / 45.25 |"),
            "{md}"
        );
        assert!(
            row("etcd").contains("| 100.0 (100, 100 %) | 0.80 / 2.00 / 3.00 |"),
            "{md}"
        );
        assert!(
            row("raw").contains("| 812.0 (max) | 0.01 / 0.02 / 0.03 |"),
            "{md}"
        );
        // Each row has as many cells as the header.
        let cells = |l: &str| l.matches('|').count();
        let header = md.lines().find(|l| l.starts_with("| target |")).unwrap();
        assert_eq!(cells(&row("kubernetes")), cells(header));
        // compare's report is the same table, with the failures below it.
        let failed = [Failure {
            target: "h2".into(),
            error: "refused".into(),
        }];
        let cmp = markdown_with_failures(&runs, &failed);
        assert!(
            cmp.contains("| 49.0 (100, 49 %) | 1.50 / 20.00 / 45.25 |"),
            "{cmp}"
        );
    }

    #[test]
    fn results_json_carries_the_achieved_share_and_write_percentiles() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[run("kubernetes", Some(100.0), 98.0, [1.0, 40.0, 70.0])],
        )
        .unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("results.json")).unwrap())
                .unwrap();
        let r = &v["runs"][0];
        assert_eq!(r["counts"]["offered_writes_per_s"], 100.0);
        assert_eq!(r["counts"]["writes_per_s"], 98.0);
        assert_eq!(r["counts"]["write_rate_achieved"], 0.98);
        assert_eq!(r["write_latency_ms"]["p50"], 1.0);
        assert_eq!(r["write_latency_ms"]["p99"], 40.0);
        assert_eq!(r["write_latency_ms"]["p999"], 70.0);
        let max = run("raw", None, 500.0, [1.0, 2.0, 3.0]);
        let j = serde_json::to_value(&max).unwrap();
        assert!(j["counts"]["write_rate_achieved"].is_null());
    }
}
