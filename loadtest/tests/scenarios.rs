//! Runs every scenario of `svc-loadtest` for a second or two at small scale against an
//! in-process svc-gateway (plain-HTTP loopback port), the raw baseline (its server a child
//! process) and a real etcd (native gRPC), and checks the report: the schema, and counts that
//! add up (every watcher saw every acknowledged write, in order, with no gaps, duplicates or
//! errors).
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_svc-loadtest");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs the binary off the test's runtime (it blocks) and returns results.json's runs.
async fn loadtest(args: Vec<String>, out: PathBuf) -> Vec<Value> {
    let o = out.clone();
    let status = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args(&args)
            .arg("--out")
            .arg(&o)
            .stdout(Stdio::null())
            .status()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(status.success(), "svc-loadtest failed");
    check_report_files(&out);
    let v: Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(v["schema"], "svc-loadtest/results/v1");
    v["runs"].as_array().unwrap().clone()
}

fn check_report_files(out: &Path) {
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("| target |"), "{md}");
    for svg in ["throughput.svg", "p99.svg", "latency.svg"] {
        let s = std::fs::read_to_string(out.join(svg)).unwrap();
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    }
}

/// The schema every run shares.
fn check_schema(r: &Value, scenario: &str, kind: &str) {
    assert_eq!(r["scenario"], scenario);
    assert_eq!(r["target"]["kind"], kind);
    assert!(r["machine"]["cores"].as_u64().unwrap() >= 1);
    assert!(r["machine"]["memory_bytes"].as_u64().unwrap() > 0);
    assert!(r["machine"]["kernel"].is_string() && r["machine"]["cpu_model"].is_string());
    assert!(r["params"]["duration"].as_f64().unwrap() > 0.0);
    assert!(!r["series"].as_array().unwrap().is_empty(), "no samples");
    for k in [
        "t",
        "events_per_s",
        "writes_per_s",
        "p99_ms",
        "client_cpu_pct",
    ] {
        assert!(r["series"][0][k].is_number(), "series lacks {k}");
    }
    for h in ["latency_ms", "write_latency_ms"] {
        for k in ["count", "p50", "p90", "p99", "p999", "max"] {
            assert!(r[h][k].is_number(), "{h} lacks {k}");
        }
    }
    let c = &r["counts"];
    assert!(c["writes_acked"].as_u64().unwrap() > 0, "no writes: {r}");
    assert_eq!(c["write_errors"], 0, "{}", r["errors"]);
    assert_eq!(c["watch_errors"], 0, "{}", r["errors"]);
}

/// Every watcher saw every acknowledged write exactly once, in order.
fn check_fanout(r: &Value, watchers: u64) {
    let c = &r["counts"];
    assert_eq!(c["watchers_opened"], watchers);
    assert_eq!(c["watchers_complete"], watchers, "{c}");
    assert_eq!(c["missing"], 0);
    assert_eq!(c["duplicates"], 0);
    assert_eq!(c["reconnects"], 0);
    assert_eq!(c["events_delivered"], c["events_expected"]);
    assert_eq!(
        c["events_delivered"].as_u64().unwrap(),
        c["writes_acked"].as_u64().unwrap() * watchers
    );
    assert!(c["events_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(
        r["latency_ms"]["count"].as_u64().unwrap(),
        c["events_delivered"].as_u64().unwrap()
    );
    // Offered against achieved writes/s, and every acknowledged write's latency.
    if let Some(offered) = c["offered_writes_per_s"].as_f64() {
        let achieved = c["write_rate_achieved"].as_f64().unwrap();
        let rate = c["writes_per_s"].as_f64().unwrap();
        assert!(
            achieved > 0.0 && (achieved - rate / offered).abs() < 1e-9,
            "{c}"
        );
    } else {
        assert!(c["write_rate_achieved"].is_null(), "{c}");
    }
    let w = &r["write_latency_ms"];
    let ms = |k: &str| w[k].as_f64().unwrap();
    assert!(
        0.0 < ms("p50") && ms("p50") <= ms("p99") && ms("p99") <= ms("p999"),
        "{w}"
    );
}

/// A list run: full lists happened, each held exactly `objects` items plus the server's own
/// (the namespace's `default` ServiceAccount), bytes were counted, pages and gzip as asked,
/// no errors.
fn check_list(r: &Value, objects: u64, paged: bool, gzip: bool) {
    assert_eq!(r["scenario"], "list");
    assert_eq!(r["target"]["kind"], "kubernetes");
    assert!(!r["series"].as_array().unwrap().is_empty(), "no samples");
    let x = &r["extra"];
    let lists = x["lists"].as_u64().unwrap();
    assert!(lists > 0, "{x}");
    assert_eq!(x["objects"], objects);
    assert_eq!(x["server_objects"], 1, "the namespace's default account");
    assert_eq!(x["inconsistent_lists"], 0, "{}", r["errors"]);
    assert_eq!(x["list_errors"], 0, "{}", r["errors"]);
    assert_eq!(
        r["counts"]["events_delivered"].as_u64().unwrap(),
        lists * (objects + 1)
    );
    assert_eq!(
        r["latency_ms"]["count"].as_u64().unwrap(),
        lists,
        "one latency per full list"
    );
    for k in [
        "lists_per_s",
        "items_per_s",
        "wire_bytes_per_s",
        "decoded_bytes_per_s",
    ] {
        assert!(x[k].as_f64().unwrap() > 0.0, "{k}: {x}");
    }
    let pages = x["pages"].as_u64().unwrap();
    if paged {
        assert!(pages >= lists * objects.div_ceil(50), "{x}");
    } else {
        assert_eq!(pages, lists);
    }
    if gzip {
        assert_eq!(x["gzip_responses"], pages);
        assert!(x["wire_bytes_per_s"].as_f64() < x["decoded_bytes_per_s"].as_f64());
    } else {
        assert_eq!(x["gzip_responses"], 0);
        assert_eq!(x["wire_bytes_per_s"], x["decoded_bytes_per_s"]);
    }
}

/// A relist-storm run: every watcher re-listed and re-watched after the storm, the time is
/// measured for each, no relist errors, and no gaps or duplicates afterwards.
fn check_relist(r: &Value, watchers: u64) {
    check_schema(r, "relist-storm", "kubernetes");
    let c = &r["counts"];
    let x = &r["extra"];
    assert_eq!(c["watchers_opened"], watchers);
    assert_eq!(x["storm_rewatched"], watchers, "{x}");
    assert_eq!(x["storm_all_back"], true);
    assert_eq!(r["latency_ms"]["count"], watchers);
    assert!(r["latency_ms"]["max"].as_f64().unwrap() > 0.0);
    for k in [
        "relist_errors_429",
        "relist_errors_5xx",
        "relist_errors_other",
    ] {
        assert_eq!(x[k], 0, "{k}: {}", r["errors"]);
    }
    assert!(c["reconnects"].as_u64().unwrap() >= watchers, "{c}");
    assert_eq!(c["watchers_complete"], watchers, "{c}");
    assert_eq!(c["missing"], 0);
    assert_eq!(c["duplicates"], 0);
    assert_eq!(c["events_delivered"], c["events_expected"]);
    assert!(c["events_delivered"].as_u64().unwrap() > 0);
}

/// A copy of the admin kubeconfig whose current user is a new service account's token
/// (kubectl, which the test command installs, creates both).
fn token_kubeconfig(admin: &str, dir: &Path) -> String {
    let kubectl = |config: &str, a: &[&str]| -> String {
        let o = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(config)
            .args(a)
            .output()
            .expect("kubectl is installed by the test command");
        assert!(
            o.status.success(),
            "kubectl {a:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    kubectl(
        admin,
        &["create", "serviceaccount", "lt-bench", "-n", "default"],
    );
    let token = kubectl(admin, &["create", "token", "lt-bench", "-n", "default"]);
    let cluster = kubectl(
        admin,
        &["config", "view", "-o", "jsonpath={.clusters[0].name}"],
    );
    let copy = dir.join("token.kubeconfig").display().to_string();
    std::fs::copy(admin, &copy).unwrap();
    kubectl(
        &copy,
        &["config", "set-credentials", "lt-bench", "--token", &token],
    );
    kubectl(
        &copy,
        &[
            "config",
            "set-context",
            "lt-bench",
            "--cluster",
            &cluster,
            "--user",
            "lt-bench",
        ],
    );
    kubectl(&copy, &["config", "use-context", "lt-bench"]);
    copy
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The etcd process, killed on drop; its data directory goes with it.
struct Etcd(Child, #[allow(dead_code)] tempfile::TempDir);

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_etcd() -> (Etcd, String) {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{client}");
    let child = Command::new("etcd")
        .arg("--data-dir")
        .arg(dir.path().join("etcd"))
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args([
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
        ])
        .args([
            "--initial-cluster",
            &format!("default=http://127.0.0.1:{peer}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd must be installed (scripts/test.sh installs etcd-server)");
    let etcd = Etcd(child, dir);
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(20), "etcd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Listening precedes leadership by a moment; the first write would wait for it anyway.
    std::thread::sleep(Duration::from_millis(500));
    (etcd, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_against_every_target() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = svc_gateway::base::flags::Options::for_tests(dir.path().join("server"));
    opts.insecure_port = free_port();
    opts.log_level = "warn".into();
    let server = svc_gateway::run::start(opts).await.unwrap();
    let url = format!("http://{}", server.insecure_addr.unwrap());
    let kubeconfig = server.admin_kubeconfig.display().to_string();
    let (etcd, etcd_url) = start_etcd();
    let out = |n: &str| dir.path().join(n);
    let small = ["--watchers", "50", "--duration", "2s", "--drain", "10s"];

    // fanout, HTTP/1.1, JSON, fixed rate.
    let mut a = args(&[
        "fanout",
        "--server",
        &url,
        "--rate",
        "100",
        "--writers",
        "2",
    ]);
    a.extend(args(&small));
    let r = &loadtest(a, out("fanout-h1")).await[0];
    check_schema(r, "fanout", "kubernetes");
    check_fanout(r, 50);

    // fanout, h2 streams over 2 TLS connections from the kubeconfig, protobuf, full speed.
    let mut a = args(&[
        "fanout",
        "--kubeconfig",
        &kubeconfig,
        "--h2-connections",
        "2",
    ]);
    a.extend(args(&["--media", "protobuf", "--max", "--writers", "2"]));
    a.extend(args(&small));
    let r = &loadtest(a, out("fanout-h2")).await[0];
    check_schema(r, "fanout", "kubernetes");
    check_fanout(r, 50);

    // The same over the frame-level h2 client (one reader per connection), JSON.
    let mut a = args(&[
        "fanout",
        "--kubeconfig",
        &kubeconfig,
        "--h2-connections",
        "3",
        "--h2-frames",
    ]);
    a.extend(args(&["--max", "--writers", "2"]));
    a.extend(args(&small));
    let r = &loadtest(a, out("fanout-h2-frames")).await[0];
    check_schema(r, "fanout", "kubernetes");
    check_fanout(r, 50);

    // The raw baseline: dense sequence numbers make gaps exact.
    let mut a = args(&["fanout", "--raw", "--max"]);
    a.extend(args(&small));
    let r = &loadtest(a, out("fanout-raw")).await[0];
    check_schema(r, "fanout", "raw");
    check_fanout(r, 50);

    // etcd's watchers on a key prefix, multiplexed on gRPC Watch streams.
    let mut a = args(&["fanout", "--etcd-endpoints", &etcd_url, "--rate", "100"]);
    a.extend(args(&small));
    let r = &loadtest(a, out("fanout-etcd")).await[0];
    check_schema(r, "fanout", "etcd");
    check_fanout(r, 50);

    // slow-watcher: stalled watchers join halfway; the healthy ones miss nothing and are
    // never cut off.
    let mut a = args(&[
        "slow-watcher",
        "--server",
        &url,
        "--stalled",
        "5",
        "--rate",
        "100",
    ]);
    a.extend(args(&small));
    let r = &loadtest(a, out("slow")).await[0];
    check_schema(r, "slow-watcher", "kubernetes");
    check_fanout(r, 50);
    assert!(r["extra"]["latency_before_stall_ms"]["p99"].is_number());
    assert!(r["extra"]["latency_with_stall_ms"]["p99"].is_number());

    // churn: creates, updates, deletes; every write acknowledged, nothing watched.
    for (name, target) in [("churn", &url), ("churn-etcd", &etcd_url)] {
        let flag = if name == "churn" {
            "--server"
        } else {
            "--etcd-endpoints"
        };
        let a = args(&["churn", flag, target, "--writers", "4", "--max"]);
        let mut a = a;
        a.extend(args(&["--duration", "1s"]));
        let r = &loadtest(a, out(name)).await[0];
        check_schema(
            r,
            "churn",
            if name == "churn" {
                "kubernetes"
            } else {
                "etcd"
            },
        );
        assert!(r["write_latency_ms"]["count"].as_u64().unwrap() > 0);
        assert_eq!(r["counts"]["events_delivered"], 0);
    }

    // events: Event creates only; every one acknowledged and none refused.
    let a = args(&["events", "--server", &url, "--writers", "4", "--max"]);
    let mut a = a;
    a.extend(args(&["--duration", "1s"]));
    let r = &loadtest(a, out("events")).await[0];
    check_schema(r, "events", "kubernetes");
    assert!(r["counts"]["writes_acked"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["counts"]["write_errors"], 0, "{r}");
    assert_eq!(
        r["write_latency_ms"]["count"], r["counts"]["writes_acked"],
        "{r}"
    );

    // list: paged and unpaged, JSON and protobuf, gzip on and off; every full list holds
    // exactly the seeded objects, and gzip really was applied when asked for.
    for (i, (page, media, gzip)) in [
        ("0", "json", true),
        ("50", "protobuf", true),
        ("50", "json", false),
        ("0", "protobuf", false),
    ]
    .into_iter()
    .enumerate()
    {
        let mut a = args(&[
            "list",
            "--server",
            &url,
            "--objects",
            "200",
            "--clients",
            "4",
        ]);
        a.extend(args(&[
            "--page-size",
            page,
            "--media",
            media,
            "--duration",
            "2s",
        ]));
        if gzip {
            a.push("--gzip".into());
        }
        let r = &loadtest(a, out(&format!("list-{i}"))).await[0];
        check_list(r, 200, page != "0", gzip);
    }

    // get: the admin's certificate, then a service-account token as the kubeconfig's user;
    // with the token, a resource the account may not read is 403 on every request.
    let r = &loadtest(
        args(&[
            "get",
            "--kubeconfig",
            &kubeconfig,
            "--clients",
            "2",
            "--duration",
            "1s",
        ]),
        out("get-cert"),
    )
    .await[0];
    assert_eq!(r["extra"]["authentication"], "client certificate", "{r}");
    assert!(r["extra"]["requests_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["extra"]["non_2xx"], 0, "{r}");
    let token_kubeconfig = token_kubeconfig(&kubeconfig, dir.path());
    let r = &loadtest(
        args(&[
            "get",
            "--kubeconfig",
            &token_kubeconfig,
            "--clients",
            "2",
            "--duration",
            "1s",
        ]),
        out("get-token"),
    )
    .await[0];
    assert_eq!(r["extra"]["authentication"], "bearer token", "{r}");
    assert!(r["extra"]["requests_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["extra"]["non_2xx"], 0, "{r}");
    let r = &loadtest(
        args(&[
            "get",
            "--kubeconfig",
            &token_kubeconfig,
            "--clients",
            "1",
            "--duration",
            "1s",
            "--path",
            "/api/v1/namespaces",
        ]),
        out("get-token-forbidden"),
    )
    .await[0];
    assert_eq!(r["extra"]["requests_per_s"], 0.0, "{r}");
    assert!(r["extra"]["non_2xx"].as_u64().unwrap() > 0, "{r}");
    assert!(
        r["errors"][0].as_str().unwrap().contains("403"),
        "{}",
        r["errors"]
    );

    // relist-storm: 50 watchers drop their watches at once, re-list and re-watch; all come
    // back, and afterwards each sees every acknowledged write once, in order.
    let mut a = args(&["relist-storm", "--server", &url, "--objects", "200"]);
    a.extend(args(&["--rate", "50"]));
    a.extend(args(&small));
    let r = &loadtest(a, out("relist-storm")).await[0];
    check_relist(r, 50);

    // compare: one scenario file, two targets, one report with ratios.
    let scenario = dir.path().join("scenario.yaml");
    std::fs::write(
        &scenario,
        format!(
            "scenario: fanout\nparams:\n  watchers: 20\n  duration: 1s\n  rate: 50\n\
             targets:\n  - name: gateway\n    server: {url}\n  - name: down\n    server: http://127.0.0.1:{}\n  - name: etcd\n    etcd_endpoints: {etcd_url}\n  - name: raw\n    raw: true\n",
            free_port()
        ),
    )
    .unwrap();
    // "down" (nothing listens there) fails; the report records it and the others still run.
    let cmp = out("compare");
    let runs = loadtest(
        args(&["compare", "--scenario", scenario.to_str().unwrap()]),
        cmp.clone(),
    )
    .await;
    assert_eq!(runs.len(), 3);
    for (r, kind) in runs.iter().zip(["kubernetes", "etcd", "raw"]) {
        check_schema(r, "fanout", kind);
        check_fanout(r, 20);
    }
    let md = std::fs::read_to_string(cmp.join("report.md")).unwrap();
    assert!(md.contains("Ratios"), "{md}");
    // Rows and ratio heads carry each target's name from the scenario file.
    assert!(md.contains("| | gateway | etcd | raw |"), "{md}");
    assert!(md.contains("Against the baselines"), "{md}");
    assert!(
        md.contains(&format!("gateway ({url}) ÷ etcd ({etcd_url})")),
        "{md}"
    );
    assert!(
        md.contains(&format!("gateway ({url}) ÷ raw (127.0.0.1:")),
        "{md}"
    );
    assert!(cmp.join("gateway").join("results.json").exists());
    let v: Value =
        serde_json::from_slice(&std::fs::read(cmp.join("results.json")).unwrap()).unwrap();
    let failures = v["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{v}");
    assert_eq!(failures[0]["target"], "down");
    assert!(
        failures[0]["error"].as_str().unwrap().contains("connect"),
        "{v}"
    );
    assert!(md.contains("Failed targets"), "{md}");

    drop(etcd);
    server.shutdown().await;
}

/// Runs the binary (blocking) and returns its pid and results.json's first run.
fn loadtest_pid(args: &[&str], out: &Path) -> (u32, Value) {
    let mut child = Command::new(BIN)
        .args(args)
        .arg("--out")
        .arg(out)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(child.wait().unwrap().success(), "svc-loadtest failed");
    check_report_files(out);
    let v: Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    (pid, v["runs"][0].clone())
}

/// One Prometheus sample of etcd's /metrics (plain HTTP/1.0 on its client port).
fn etcd_metric(url: &str, series: &str) -> f64 {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The native etcd baseline: 30 watchers as 7 watches per gRPC Watch stream (5 streams over
/// 2 connections), each seeing every Put, and etcd's CPU found by its port.
#[test]
fn etcd_baseline_multiplexes_watches_on_grpc_streams() {
    let (etcd, url) = start_etcd();
    let watch_streams = r#"grpc_server_started_total{grpc_method="Watch",grpc_service="etcdserverpb.Watch",grpc_type="bidi_stream"}"#;
    let streams_before = etcd_metric(&url, watch_streams);
    let out = tempfile::tempdir().unwrap();
    let (_, r) = loadtest_pid(
        &[
            "fanout",
            "--etcd-endpoints",
            &url,
            "--watchers",
            "30",
            "--etcd-connections",
            "2",
            "--etcd-watches-per-stream",
            "7",
            "--rate",
            "20",
            "--duration",
            "1s",
            "--drain",
            "5s",
        ],
        out.path(),
    );
    check_schema(&r, "fanout", "etcd");
    check_fanout(&r, 30);
    let c = &r["counts"];
    assert_eq!(c["offered_writes_per_s"], 20.0);
    assert_eq!(c["offered_events_per_s"], 600.0);
    // 30 watches on ceil(30 / 7) = 5 streams, not one stream (or connection) per watcher.
    assert_eq!(etcd_metric(&url, watch_streams) - streams_before, 5.0);
    assert_eq!(r["target"]["server_pid"], etcd.0.id(), "{}", r["target"]);
    assert!(c["server_cpu_s"].as_f64().unwrap() >= 0.0, "{c}");
    assert!(c["server_cpu_us_per_event"].is_number(), "{c}");
    assert!(
        r["series"][0]["server_cpu_pct"].is_number(),
        "{}",
        r["series"]
    );
    drop(etcd);
}

/// The raw baseline's server is a child process of the load generator, measured from /proc
/// and gone when the run ends; every reader gets every frame.
#[test]
fn raw_baseline_server_runs_in_its_own_process() {
    let out = tempfile::tempdir().unwrap();
    let (pid, r) = loadtest_pid(
        &[
            "fanout",
            "--raw",
            "--watchers",
            "20",
            "--rate",
            "500",
            "--object-size",
            "100",
            "--duration",
            "1s",
            "--drain",
            "5s",
        ],
        out.path(),
    );
    check_schema(&r, "fanout", "raw");
    check_fanout(&r, 20);
    let server = r["target"]["server_pid"].as_u64().unwrap() as u32;
    assert_ne!(server, pid, "the raw server ran in the load generator");
    assert_ne!(server, std::process::id());
    assert!(
        r["target"]["endpoint"]
            .as_str()
            .unwrap()
            .contains(&format!("pid {server}")),
        "{}",
        r["target"]
    );
    assert!(r["counts"]["server_cpu_s"].is_number(), "{}", r["counts"]);
    assert_eq!(r["counts"]["offered_writes_per_s"], 500.0);
    // Killed and reaped by the load generator before it exited.
    assert!(!Path::new(&format!("/proc/{server}")).exists());
}

/// Starts `raw-server` on a free port: the child and the address it names on its first line.
fn spawn_raw_server() -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .args(["raw-server", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_string();
    (child, addr)
}

/// `raw-server` on its own: names the port it bound, fans a writer's frames out to a reader.
#[test]
fn raw_server_fans_out_frames() {
    use std::io::{Read, Write};
    let (mut child, addr) = spawn_raw_server();
    let mut reader = std::net::TcpStream::connect(&addr).unwrap();
    reader
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    reader.write_all(b"R").unwrap();
    let mut ok = [0u8; 1];
    reader.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"K");
    let mut writer = std::net::TcpStream::connect(&addr).unwrap();
    writer.write_all(b"W").unwrap();
    writer.write_all(&32u32.to_le_bytes()).unwrap();
    // Two frames and a half: only whole frames go out.
    let frames: Vec<u8> = (0..80u8).collect();
    writer.write_all(&frames).unwrap();
    let mut got = [0u8; 64];
    reader.read_exact(&mut got).unwrap();
    assert_eq!(&got[..], &frames[..64]);
    writer.write_all(&[0u8; 16]).unwrap();
    let mut third = [0u8; 32];
    reader.read_exact(&mut third).unwrap();
    assert_eq!(&third[..16], &frames[64..80]);
    let _ = child.kill();
    let _ = child.wait();
}

/// raw-mux: the watchers are logical streams over a few connections of the raw server, each
/// counted like any watcher: every stream gets every frame, in order, at a fixed rate and at
/// full speed (where the server stops reading the writer while a connection is behind), with
/// the server pinned to a CPU the second time.
#[test]
fn raw_mux_baseline_gives_every_stream_every_frame() {
    for pace in [&["--rate", "500"][..], &["--max", "--raw-cpus", "0"]] {
        let out = tempfile::tempdir().unwrap();
        let mut a = vec![
            "fanout",
            "--raw",
            "--raw-connections",
            "3",
            "--watchers",
            "20",
            "--object-size",
            "100",
            "--duration",
            "1s",
            "--drain",
            "5s",
        ];
        a.extend(pace);
        let (_, r) = loadtest_pid(&a, out.path());
        check_schema(&r, "fanout", "raw");
        check_fanout(&r, 20);
        assert!(
            r["target"]["endpoint"]
                .as_str()
                .unwrap()
                .contains("raw-mux: 20 streams over 3 connections"),
            "{}",
            r["target"]
        );
        let pinned = r["target"]["endpoint"]
            .as_str()
            .unwrap()
            .contains("taskset -c 0;");
        assert_eq!(pinned, pace.contains(&"--raw-cpus"), "{}", r["target"]);
        let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
        assert!(
            md.contains("20 watchers as raw-mux streams over 3 connections"),
            "{md}"
        );
    }
}

/// `raw-server`'s multiplexed readers on the wire: `M` and a stream count, `K`, then per
/// batch a chunk for each stream (id and length, u32 LE each, and the stream's copy).
#[test]
fn raw_server_multiplexes_streams_on_one_connection() {
    use std::io::{Read, Write};
    let (mut child, addr) = spawn_raw_server();
    let mut reader = std::net::TcpStream::connect(&addr).unwrap();
    reader
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    reader.write_all(b"M").unwrap();
    reader.write_all(&3u32.to_le_bytes()).unwrap();
    let mut ok = [0u8; 1];
    reader.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"K");
    let mut writer = std::net::TcpStream::connect(&addr).unwrap();
    writer.write_all(b"W").unwrap();
    writer.write_all(&32u32.to_le_bytes()).unwrap();
    let frames: Vec<u8> = (0..96u8).collect();
    writer.write_all(&frames).unwrap();
    // However the server batched the three frames, each stream gets all of them, in order.
    let mut got = vec![Vec::new(); 3];
    while got.iter().any(|g| g.len() < frames.len()) {
        let mut h = [0u8; 8];
        reader.read_exact(&mut h).unwrap();
        let id = u32::from_le_bytes(h[..4].try_into().unwrap()) as usize;
        let len = u32::from_le_bytes(h[4..].try_into().unwrap()) as usize;
        assert!(
            id < 3 && len > 0 && len.is_multiple_of(32),
            "chunk {id} of {len} bytes"
        );
        let mut b = vec![0u8; len];
        reader.read_exact(&mut b).unwrap();
        got[id].extend(b);
    }
    for g in &got {
        assert_eq!(g, &frames);
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn refuses_non_loopback_targets() {
    let out = tempfile::tempdir().unwrap();
    let o = Command::new(BIN)
        .args([
            "fanout",
            "--server",
            "http://192.0.2.1:80",
            "--duration",
            "1s",
        ])
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("loopback"));
}

/// Allows the named users everything on resources (standing in for a configured authorizer:
/// the server grants users outside `system:masters` nothing on resources by itself).
struct AllowUsers(&'static [&'static str]);

impl svc_gateway::security::authz::Authorizer for AllowUsers {
    fn name(&self) -> &str {
        "allow-users"
    }
    fn authorize<'a>(
        &'a self,
        user: &'a svc_core::user::UserInfo,
        attrs: &'a svc_gateway::security::authz::Attributes<'a>,
    ) -> svc_gateway::security::authz::DecisionFuture<'a> {
        use svc_gateway::security::authz::Decision;
        let d = if attrs.resource.is_some() && self.0.contains(&user.username.as_str()) {
            Decision::Allow
        } else {
            Decision::NoOpinion(String::new())
        };
        Box::pin(std::future::ready(d))
    }
}

/// A kubeconfig for `user` with a client certificate from the server's CA (no groups).
fn user_kubeconfig(server: &svc_gateway::run::ServerHandle, user: &str, dir: &Path) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let (cert, key) = server
        .pki
        .issue_client_cert(user, &[], Duration::from_secs(3600))
        .unwrap();
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: {user}\nclusters:\n- name: svc\n  \
         cluster:\n    server: https://{}\n    certificate-authority-data: {}\nusers:\n- name: \
         {user}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n\
         contexts:\n- name: {user}\n  context:\n    cluster: svc\n    user: {user}\n",
        server.addr,
        b64(server.pki.ca_pem()),
        b64(&cert),
        b64(&key),
    );
    let path = dir.join(format!("{user}.kubeconfig"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// `fairness` in a short debug run: the writer and the hammer are two users outside
/// `system:masters`; the hammer meets the small read-only limit (its queue full, 429s) while
/// every one of the writer's creates succeeds in both phases, and every list the hammer got
/// held the whole collection. Rates and p99s are reported, not judged: they are measured in
/// release (BENCHMARKS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fairness_reports_the_writer_alone_and_beside_the_hammer() {
    fairness_case(false).await;
}

/// The same with the hammer listing over h2 (`--hammer-h2`, a connection per client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fairness_reports_the_writer_beside_a_hammer_listing_over_h2() {
    fairness_case(true).await;
}

async fn fairness_case(h2: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = svc_gateway::base::flags::Options::for_tests(dir.path().join("server"));
    opts.log_level = "warn".into();
    // One seat and a queue of one: any third list at once is refused, however much of the
    // hammer's time goes to reading answers rather than waiting for them.
    opts.max_requests_inflight = 1;
    opts.max_queued_requests_per_user = 1;
    let server = svc_gateway::run::start(opts).await.unwrap();
    server
        .app
        .standalone()
        .expect("a standalone server")
        .security
        .set_authorizers(vec![Box::new(AllowUsers(&["lt-hammer", "lt-writer"]))]);
    let hammer = user_kubeconfig(&server, "lt-hammer", dir.path());
    let writer = user_kubeconfig(&server, "lt-writer", dir.path());
    let mut flags = vec![
        "fairness",
        "--kubeconfig",
        &hammer,
        "--writer-kubeconfig",
        &writer,
        "--objects",
        "500",
        "--clients",
        "8",
        "--rate",
        "20",
        "--writers",
        "2",
        "--duration",
        "2s",
        // Pinned (the default) but not niced: on a busy machine a niced hammer gets
        // too little CPU to keep three lists in flight at once, and the test is of
        // what the server refuses, not of the measurement's CPU policy.
        "--hammer-nice",
        "0",
    ];
    if h2 {
        flags.push("--hammer-h2");
    }
    let r = &loadtest(args(&flags), dir.path().join("fairness")).await[0];
    assert_eq!(r["scenario"], "fairness");
    let x = &r["extra"];
    for k in [
        "writer_rate_alone",
        "writer_rate_hammered",
        "writer_p99_ms_alone",
        "writer_p99_ms_hammered",
        "rate_kept",
        "p99_ratio",
    ] {
        assert!(x[k].as_f64().unwrap() > 0.0, "{k}: {x}");
    }
    assert!(x["target_met"].is_boolean(), "{x}");
    assert_eq!(x["writer_errors_alone"], 0, "{}", r["errors"]);
    assert_eq!(x["writer_errors_hammered"], 0, "{}", r["errors"]);
    assert_eq!(r["counts"]["write_errors"], 0);
    let lists = x["hammer_lists"].as_u64().unwrap();
    assert!(lists > 0, "{x}");
    // Every list held the 500 seeded accounts and the namespace's `default` one.
    assert_eq!(x["hammer_items"].as_u64().unwrap(), lists * 501, "{x}");
    assert!(x["hammer_429"].as_u64().unwrap() > 0, "{x}");
    assert_eq!(x["hammer_errors"], 0, "{x}");
    assert_eq!(x["hammer_short_lists"], 0, "{x}");
    // The hammer ran in its own process (its CPU read from its own /proc entry), the writer
    // on the load generator's writer thread; each phase's CPU is reported.
    let process = if h2 {
        "svc-loadtest fairness-hammer --h2"
    } else {
        "svc-loadtest fairness-hammer"
    };
    assert!(
        x["hammer_process"].as_str().unwrap().ends_with(process),
        "{x}"
    );
    // Only the hammer's clients may speak h2 (the writer and the seeding speak HTTP/1.1).
    let h2_writes = server.app.h2_writes.get();
    assert_eq!(h2_writes > 0, h2, "h2 writes: {h2_writes}");
    assert!(x["hammer_cpu_pct"].as_f64().unwrap() > 0.0, "{x}");
    for k in ["loadgen_cpu_pct_alone", "loadgen_cpu_pct_hammered"] {
        assert!(x[k].as_f64().unwrap() >= 0.0, "{k}: {x}");
    }
    for k in ["server_cpu_pct_alone", "server_cpu_pct_hammered"] {
        assert!(x[k].is_null() || x[k].as_f64().unwrap() >= 0.0, "{k}: {x}");
    }
    let c = &r["counts"];
    assert_eq!(c["offered_writes_per_s"], 20.0);
    assert!(c["write_rate_achieved"].as_f64().unwrap() > 0.0, "{c}");
    assert_eq!(
        r["counts"]["writes_acked"].as_u64().unwrap(),
        r["write_latency_ms"]["count"].as_u64().unwrap()
            + r["latency_ms"]["count"].as_u64().unwrap()
    );
    server.shutdown().await;
}
