//! `svc-loadtest hold` for a few seconds against an in-process svc-gateway (plain-HTTP
//! loopback port): watches opened in two steps as h2 streams over two connections and as
//! HTTP/1.1 connections, and the report's accounting: every step's watches open, RSS read
//! and turned into bytes per watch, and every stream received every acknowledged write.

// Test code: panics are how a test fails, and counts are small.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_svc-loadtest");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `hold` off the test's runtime (the binary blocks) and returns its one run.
async fn hold(args: Vec<String>, out: &Path) -> Value {
    let o = out.to_path_buf();
    let status = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .arg("hold")
            .args(&args)
            .args([
                "--writes-per-step",
                "2",
                "--rate",
                "20",
                "--settle",
                "200ms",
            ])
            .args(["--drain", "10s", "--min-available-mib", "0"])
            .arg("--out")
            .arg(&o)
            .stdout(Stdio::null())
            .status()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(status.success(), "svc-loadtest hold failed");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## hold:"), "{md}");
    let v: Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    v["runs"][0].clone()
}

/// Each step held its total, read both processes' RSS, and every stream got each write.
fn check(r: &Value, steps: &[u64]) {
    assert_eq!(r["scenario"], "hold");
    let x = &r["extra"];
    assert!(x["stopped"].is_null(), "{}", x["stopped"]);
    assert_eq!(x["ended_early"], 0);
    assert_eq!(x["error_events"], 0);
    let s = x["steps"].as_array().unwrap();
    assert_eq!(s.len(), steps.len());
    for (s, want) in s.iter().zip(steps) {
        assert_eq!(s["open"], *want, "{s}");
        assert_eq!(s["open_failures"], 0);
        assert!(s["server_rss_bytes"].as_u64().unwrap() > 0, "{s}");
        assert!(s["client_rss_bytes"].as_u64().unwrap() > 0, "{s}");
        assert!(s["server_bytes_per_watch"].is_number(), "{s}");
        assert!(s["client_bytes_per_watch"].is_number(), "{s}");
        assert_eq!(s["writes_acked"], 2);
        assert_eq!(s["events_expected"], 2 * want);
        assert_eq!(s["events_delivered"], 2 * want, "{s}");
        assert_eq!(s["check"]["complete"], *want, "{s}");
        assert_eq!(s["check"]["missed_streams"], 0);
        assert_eq!(s["check"]["extra_streams"], 0);
    }
    let c = &r["counts"];
    let last = *steps.last().unwrap();
    assert_eq!(c["watchers_opened"], last);
    assert_eq!(c["watchers_complete"], last);
    assert_eq!(c["writes_acked"], 2 * steps.len() as u64);
    assert_eq!(c["missing"], 0);
    assert_eq!(c["duplicates"], 0);
    assert_eq!(c["watch_errors"], 0, "{}", r["errors"]);
    assert_eq!(c["write_errors"], 0, "{}", r["errors"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_counts_every_stream_at_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = svc_gateway::base::flags::Options::for_tests(dir.path().join("server"));
    opts.insecure_port = free_port();
    opts.log_level = "warn".into();
    let server = svc_gateway::run::start(opts).await.unwrap();
    let url = format!("http://{}", server.insecure_addr.unwrap());
    let a = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let r = hold(
        a(&[
            "--server",
            &url,
            "--h2-connections",
            "2",
            "--steps",
            "40,100",
        ]),
        &dir.path().join("h2"),
    )
    .await;
    check(&r, &[40, 100]);
    assert!(r["extra"]["server_bytes_per_connection"].is_number());

    let r = hold(
        a(&["--server", &url, "--steps", "10,30"]),
        &dir.path().join("h1"),
    )
    .await;
    check(&r, &[10, 30]);
    assert!(r["extra"]["server_bytes_per_connection"].is_null());

    // Steps must grow: a bad plan is refused before anything opens.
    let status = Command::new(BIN)
        .args(["hold", "--server", &url, "--steps", "30,10"])
        .arg("--out")
        .arg(dir.path().join("bad"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success());
}
