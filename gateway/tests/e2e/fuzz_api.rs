//! Schemathesis, a third-party API fuzzer, against the real binary: driven by the OpenAPI v3
//! document of every group the server serves, authenticated with the admin certificate, it
//! sends generated valid and invalid requests. Every answer must be below 500, every error a
//! `Status` naming its own code (`clients/schemathesis_hooks.py`), every request answered
//! within the request timeout (watches are given `timeoutSeconds=1`), and the server must
//! still be alive and ready afterwards.
//!
//! Bounded for CI: `SVC_FUZZ_SECONDS` per group (default 20) and `SVC_FUZZ_EXAMPLES` per
//! operation (default 10); `SVC_FUZZ_SEED` replays a run (the seed is printed). Without
//! schemathesis installed the test is skipped, except under `CI=true`, where it fails.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::kubectl::{kubectl, spawn_ready};
use crate::support::process::free_port;

/// The OpenAPI v3 documents to fuzz, one schemathesis run each (it takes one document).
const GROUPS: &[&str] = &[
    "api/v1",
    "apis/authentication.svc.io/v1",
    "apis/certificates.svc.io/v1",
    "apis/events.svc.io/v1",
    "apis/admissionregistration.svc.io/v1",
];

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn schemathesis_installed() -> bool {
    Command::new("schemathesis")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn schemathesis_finds_no_server_errors_and_only_status_errors() {
    if !schemathesis_installed() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "schemathesis is not installed (scripts/test.sh installs it)"
        );
        eprintln!("skipping: schemathesis is not installed (scripts/test.sh installs it)");
        return;
    }
    let seconds = env_u64("SVC_FUZZ_SECONDS", 20).max(1);
    let examples = env_u64("SVC_FUZZ_EXAMPLES", 10).max(1);
    let seed = std::env::var("SVC_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000_007
        });
    eprintln!("schemathesis seed {seed} (SVC_FUZZ_SEED={seed} replays it)");

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = free_port();
    let mut server = spawn_ready(d, port);
    let hooks =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/clients/schemathesis_hooks.py");
    let pki = d.join("pki");
    let mut failures = Vec::new();
    for group in GROUPS {
        let doc = kubectl(d, &["get", "--raw", &format!("/openapi/v3/{group}")], None);
        assert!(
            doc.status.success(),
            "GET /openapi/v3/{group}: {}",
            String::from_utf8_lossy(&doc.stderr)
        );
        let doc_path = d.join(format!("openapi-{}.json", group.replace('/', "_")));
        std::fs::write(&doc_path, &doc.stdout).unwrap();
        // `timeout` bounds the whole run in case schemathesis itself hangs.
        let out = Command::new("timeout")
            .args([
                "--kill-after=10",
                &(seconds + 120).to_string(),
                "schemathesis",
            ])
            // Its cache and reports go to the data directory, not the source tree.
            .current_dir(d)
            .env("SCHEMATHESIS_HOOKS", &hooks)
            .env("NO_COLOR", "1")
            .arg("run")
            .arg(&doc_path)
            .args(["--url", &format!("https://127.0.0.1:{port}")])
            .arg("--request-cert")
            .arg(pki.join("admin.crt"))
            .arg("--request-cert-key")
            .arg(pki.join("admin.key"))
            .arg("--tls-verify")
            .arg(pki.join("ca.crt"))
            .args(["--checks", "not_a_server_error,error_is_status"])
            .args(["--max-examples", &examples.to_string()])
            .args(["--max-time", &seconds.to_string()])
            .args(["--request-timeout", "10", "--workers", "2", "--no-color"])
            .args(["--seed", &seed.to_string()])
            .args(["--generation-database", "none"])
            .output()
            .expect("run schemathesis");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let summary = stdout
            .lines()
            .rev()
            .find(|l| l.contains(" in ") && l.starts_with('='))
            .unwrap_or("(no summary)");
        let cases = stdout
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(|c: char| c.is_ascii_digit()) && l.contains(" generated"))
            .unwrap_or("")
            .trim();
        eprintln!("schemathesis {group}: {cases} {summary}");
        if !out.status.success() {
            failures.push(format!(
                "schemathesis against /openapi/v3/{group} failed ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }

    // No crash: the process is still running and still serves.
    let ready = kubectl(d, &["get", "--raw", "/readyz"], None);
    let alive = ready.status.success();
    let status = server.terminate(Duration::from_secs(20));
    assert!(
        alive,
        "the server stopped serving during the fuzzing: {}",
        String::from_utf8_lossy(&ready.stderr)
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "the server did not exit cleanly on SIGTERM after the fuzzing: {status:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
