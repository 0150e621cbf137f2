//! `svc-loadtest`: load scenarios (watch fan-out, slow watchers, write churn, event creates)
//! against a
//! Kubernetes-compatible API server, etcd, or a raw TCP fan-out baseline, with a report.

mod exec;
mod fairness;
mod fanout;
mod get;
mod list;
mod raw;
mod relist;
mod report;
mod run;
mod setup;
mod stats;
mod target;
mod watch;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};

use run::Scenario;

#[derive(Parser)]
#[command(
    name = "svc-loadtest",
    version,
    about = "Load harness: watch fan-out and friends."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// N watchers on one collection while writers create and update objects.
    Fanout(Params),
    /// Like fanout; halfway through, `--stalled` extra watchers join and never read.
    SlowWatcher(Params),
    /// Concurrent writers creating, updating and deleting; no watchers.
    Churn(Params),
    /// Concurrent writers creating Events (`--event-group`, default events.svc.io); no
    /// watchers. Creates/s is the figure (writes/s in the report).
    Events(Params),
    /// Concurrent clients list a large collection (--objects, --clients, --page-size,
    /// --media, --gzip); lists/s, items/s, bytes/s and per-list latency.
    List(Params),
    /// Watchers all drop their watches at one instant, then re-list and re-watch as a
    /// reflector does after a 410; time until all watch again, errors, gaps after.
    RelistStorm(Params),
    /// Concurrent clients GET one path (--path, --clients) as fast as answers come:
    /// requests/s and latency (compare a certificate user with a token user).
    Get(Params),
    /// A writer (--writer-kubeconfig) creates at --rate alone, then beside a hammer
    /// (--kubeconfig, another user) running --clients concurrent unpaged lists of --objects:
    /// the writer's rate and p99 in both phases.
    Fairness(Params),
    /// Runs one YAML scenario against several targets in turn; one report with ratios.
    Compare(CompareArgs),
}

/// Flags shared by the scenarios (also the `params` of a compare scenario file).
#[derive(Args, Clone, Debug, Serialize)]
pub struct Params {
    /// Built-in raw TCP fan-out on 127.0.0.1: the hardware ceiling.
    #[arg(long)]
    pub raw: bool,
    /// A kubeconfig (current context; client certificate and CA from its base64 data).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// A plain-HTTP server URL, e.g. http://127.0.0.1:18080 (svc-gateway --insecure-port).
    #[arg(long)]
    pub server: Option<String>,
    /// etcd client URLs (v3 JSON gateway), comma-separated; the first is used.
    #[arg(long)]
    pub etcd_endpoints: Option<String>,
    #[arg(long, default_value_t = 100)]
    pub watchers: usize,
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
    /// Report directory.
    #[arg(long, default_value = "loadtest-report")]
    pub out: PathBuf,
    /// Multiplex watchers as h2 streams over this many connections (default: HTTP/1.1,
    /// one connection per watcher).
    #[arg(long)]
    pub h2_connections: Option<usize>,
    /// Watch media type: json or protobuf.
    #[arg(long, default_value = "json", value_parser = ["json", "protobuf"])]
    pub media: String,
    #[arg(long, default_value_t = 1)]
    pub writers: usize,
    /// Total writes per second across writers (ignored with --max).
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Write as fast as acknowledgements allow.
    #[arg(long)]
    pub max: bool,
    /// Approximate size in bytes of each written object (frame size for --raw).
    #[arg(long, default_value_t = 400)]
    pub object_size: usize,
    /// Sample this process's CPU and RSS from /proc.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Allow non-loopback targets (never needed on one machine).
    #[arg(long)]
    pub allow_remote: bool,
    /// slow-watcher: how many stalled watchers join halfway.
    #[arg(long, default_value_t = 10)]
    pub stalled: usize,
    /// Longest wait after the writers stop for watchers to catch up.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    #[serde(serialize_with = "secs")]
    pub drain: Duration,
    /// list, relist-storm: objects in the listed collection (created if missing).
    #[arg(long, default_value_t = 1000)]
    pub objects: usize,
    /// list: concurrent listing clients, one HTTP/1.1 connection each.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// list: `limit` per page, following `continue` to the end; 0 lists in one response.
    #[arg(long, default_value_t = 0)]
    pub page_size: usize,
    /// list: send `Accept-Encoding: gzip` (bytes on the wire are the compressed ones).
    #[arg(long)]
    pub gzip: bool,
    /// get: the path each request asks for.
    #[arg(long, default_value = "/version")]
    pub path: String,
    /// events: the API group of the Event kind (`events.k8s.io` for a Kubernetes server).
    #[arg(long, default_value = "events.svc.io")]
    pub event_group: String,
    /// fairness: the writer's kubeconfig (a user other than --kubeconfig's, neither in
    /// system:masters).
    #[arg(long)]
    pub writer_kubeconfig: Option<PathBuf>,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s}"))?;
    let mult = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("bad duration unit in {s} (ms, s, m, h)")),
    };
    Ok(Duration::from_secs_f64(v * mult))
}

#[derive(Args)]
struct CompareArgs {
    /// YAML: `scenario: fanout`, `params: {flag: value}`, `targets: [{name, flag: value}]`.
    #[arg(long)]
    scenario: PathBuf,
    #[arg(long)]
    out: PathBuf,
}

#[derive(Deserialize)]
struct ScenarioFile {
    scenario: String,
    #[serde(default)]
    params: BTreeMap<String, serde_json::Value>,
    targets: Vec<BTreeMap<String, serde_json::Value>>,
}

fn scenario_of(name: &str) -> Result<Scenario> {
    Ok(match name {
        "fanout" => Scenario::Fanout,
        "slow-watcher" => Scenario::SlowWatcher,
        "churn" => Scenario::Churn,
        "events" => Scenario::Events,
        "list" => Scenario::List,
        "relist-storm" => Scenario::RelistStorm,
        "get" => Scenario::Get,
        "fairness" => Scenario::Fairness,
        _ => bail!(
            "unknown scenario {name} (fanout, slow-watcher, churn, events, list, relist-storm, \
             get, fairness)"
        ),
    })
}

/// Turns `{flag: value}` into `--flag value` (`true` is a bare flag, `false` is left out).
fn flags(m: &BTreeMap<String, serde_json::Value>, out: &mut Vec<String>) {
    for (k, v) in m {
        if k == "name" {
            continue;
        }
        let flag = format!("--{}", k.replace('_', "-"));
        match v {
            serde_json::Value::Bool(true) => out.push(flag),
            serde_json::Value::Bool(false) | serde_json::Value::Null => {}
            serde_json::Value::String(s) => {
                out.push(flag);
                out.push(s.clone());
            }
            other => {
                out.push(flag);
                out.push(other.to_string());
            }
        }
    }
}

async fn compare(a: CompareArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.scenario)
        .with_context(|| format!("{}", a.scenario.display()))?;
    let file: ScenarioFile = serde_saphyr::from_str(&text).context("parsing the scenario file")?;
    let sc = scenario_of(&file.scenario)?;
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    for (i, t) in file.targets.iter().enumerate() {
        let name = t
            .get("name")
            .and_then(|v| v.as_str())
            .map(String::from)
            .unwrap_or_else(|| format!("target-{i}"));
        let mut argv = vec!["svc-loadtest".to_string(), file.scenario.clone()];
        flags(&file.params, &mut argv);
        flags(t, &mut argv);
        argv.push("--out".into());
        argv.push(a.out.join(&name).display().to_string());
        eprintln!("== {name}");
        // A target that fails is recorded and the next one still runs: one broken target
        // should not cost the figures of all the others.
        match run_target(sc, &argv).await {
            Ok(r) => runs.push(r),
            Err(e) => {
                eprintln!("target {name} failed: {e:#}");
                failures.push(report::Failure {
                    target: name,
                    error: format!("{e:#}"),
                });
            }
        }
    }
    report::write_with_failures(&a.out, &runs, &failures)?;
    println!("{}", report::markdown_with_failures(&runs, &failures));
    if runs.is_empty() {
        bail!("every target failed");
    }
    Ok(())
}

async fn run_target(sc: Scenario, argv: &[String]) -> Result<report::Results> {
    let cli = Cli::try_parse_from(argv)?;
    let (Cmd::Fanout(p)
    | Cmd::SlowWatcher(p)
    | Cmd::Churn(p)
    | Cmd::Events(p)
    | Cmd::List(p)
    | Cmd::RelistStorm(p)
    | Cmd::Get(p)
    | Cmd::Fairness(p)) = cli.cmd
    else {
        bail!("nested compare");
    };
    let r = run::run(sc, &p).await?;
    report::write(&p.out, std::slice::from_ref(&r))?;
    Ok(r)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (sc, p) = match cli.cmd {
            Cmd::Fanout(p) => (Scenario::Fanout, p),
            Cmd::SlowWatcher(p) => (Scenario::SlowWatcher, p),
            Cmd::Churn(p) => (Scenario::Churn, p),
            Cmd::Events(p) => (Scenario::Events, p),
            Cmd::List(p) => (Scenario::List, p),
            Cmd::RelistStorm(p) => (Scenario::RelistStorm, p),
            Cmd::Get(p) => (Scenario::Get, p),
            Cmd::Fairness(p) => (Scenario::Fairness, p),
            Cmd::Compare(a) => return compare(a).await,
        };
        let r = run::run(sc, &p).await?;
        report::write(&p.out, std::slice::from_ref(&r))?;
        println!("{}", report::markdown(std::slice::from_ref(&r)));
        eprintln!("report: {}", p.out.join("report.md").display());
        Ok(())
    })
}
