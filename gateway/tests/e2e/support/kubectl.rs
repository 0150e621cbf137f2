//! kubectl against the real binary: start a server process and wait until kubectl (with the
//! admin kubeconfig the server wrote) sees it ready, then run commands and check them.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::process::ServerProcess;

/// How long a fresh server may take to write its kubeconfig and pass `/readyz`.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// Starts the binary on 127.0.0.1:`port` with its data in `dir` and returns once kubectl
/// gets `ok` from `/readyz`.
pub fn spawn_ready(dir: &Path, port: u16) -> ServerProcess {
    let mut server = ServerProcess::spawn(dir, port);
    let deadline = Instant::now() + READY_WITHIN;
    while Instant::now() < deadline {
        if dir.join("admin.kubeconfig").exists()
            && kubectl(dir, &["get", "--raw", "/readyz"], None)
                .status
                .success()
        {
            return server;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill();
    panic!("server never became ready");
}

/// Runs kubectl with the admin kubeconfig in `dir`, feeding `stdin` if given.
pub fn kubectl(dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(dir.join("admin.kubeconfig"))
        // A cache per server: discovery and OpenAPI documents of an earlier server on the same
        // port are never reused.
        .arg("--cache-dir")
        .arg(dir.join("kubectl-cache"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl is installed by the test command (scripts/test.sh)");
    let mut input = child.stdin.take().expect("piped stdin");
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .expect("writing kubectl's stdin");
    drop(input);
    child.wait_with_output().expect("kubectl runs")
}

/// Runs kubectl, asserts it succeeded, and returns its standard output.
pub fn ok(dir: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let out = kubectl(dir, args, stdin);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
