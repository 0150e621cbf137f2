//! Real Kubernetes clients against the real binary: kubectl (create, get -o yaml, watch,
//! delete) across a SIGKILL and restart, and the official Python client (list, watch,
//! replace, delete). Both are installed by the project's test command.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::kubectl::{kubectl, ok, spawn_ready};
use crate::support::process::free_port;

#[test]
fn kubectl_works_across_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = spawn_ready(dir.path(), port);
    let d = dir.path();

    assert!(ok(d, &["create", "namespace", "demo"], None).contains("namespace/demo created"));
    assert!(
        ok(
            d,
            &["create", "serviceaccount", "builder", "-n", "demo"],
            None
        )
        .contains("serviceaccount/builder created")
    );
    let yaml = ok(
        d,
        &[
            "get",
            "serviceaccount",
            "builder",
            "-n",
            "demo",
            "-o",
            "yaml",
        ],
        None,
    );
    for want in [
        "kind: ServiceAccount",
        "name: builder",
        "namespace: demo",
        "resourceVersion:",
        "uid:",
    ] {
        assert!(yaml.contains(want), "missing {want:?} in\n{yaml}");
    }
    let table = ok(d, &["get", "namespaces"], None);
    assert!(
        table.contains("demo") && table.contains("kube-system"),
        "{table}"
    );

    // A watch across all namespaces sees a later create.
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(d.join("admin.kubeconfig"))
        .args([
            "get",
            "serviceaccounts",
            "-A",
            "--watch",
            "--output-watch-events",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The initial listing arrives first; then create.
    let first = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("watch printed nothing");
    assert!(first.contains("NAME"), "{first}");
    ok(
        d,
        &["create", "serviceaccount", "later", "-n", "demo"],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = false;
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200))
            && line.contains("ADDED")
            && line.contains("later")
        {
            seen = true;
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen, "kubectl --watch never showed the new service account");

    // Identity as a new user meets it: a token for the account, used by kubectl as a bearer
    // token (authenticated, so the answer is 403 naming the account, not 401), and Secrets.
    let token = ok(d, &["create", "token", "builder", "-n", "demo"], None);
    let token = token.trim();
    assert_eq!(token.split('.').count(), 3, "{token}");
    // A kubeconfig of its own for the account: the admin's cluster, the token as the user.
    let builder_config = d.join("builder.kubeconfig");
    std::fs::copy(d.join("admin.kubeconfig"), &builder_config).unwrap();
    let config = |args: &[&str]| {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&builder_config)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let cluster = ok(
        d,
        &["config", "view", "-o", "jsonpath={.clusters[0].name}"],
        None,
    );
    config(&["config", "set-credentials", "builder", "--token", token]);
    config(&[
        "config",
        "set-context",
        "builder",
        "--cluster",
        cluster.trim(),
        "--user",
        "builder",
    ]);
    let as_builder = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&builder_config)
        .args(["--context", "builder", "get", "secrets", "-n", "demo"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&as_builder.stderr);
    assert!(!as_builder.status.success());
    assert!(
        err.contains(
            "User \"system:serviceaccount:demo:builder\" cannot list resource \"secrets\""
        ),
        "{err}"
    );
    assert!(
        ok(
            d,
            &[
                "create",
                "secret",
                "generic",
                "creds",
                "-n",
                "demo",
                "--from-literal=k=v"
            ],
            None
        )
        .contains("secret/creds created")
    );
    let secret = ok(
        d,
        &[
            "get",
            "secret",
            "creds",
            "-n",
            "demo",
            "-o",
            "jsonpath={.type} {.data.k}",
        ],
        None,
    );
    assert_eq!(secret, "Opaque dg==");
    let default_sa = ok(
        d,
        &[
            "get",
            "serviceaccount",
            "default",
            "-n",
            "demo",
            "-o",
            "name",
        ],
        None,
    );
    assert_eq!(default_sa.trim(), "serviceaccount/default");

    // kill -9 and restart: the objects survive.
    server.kill();
    let mut server = spawn_ready(d, port);
    let after = ok(
        d,
        &["get", "serviceaccounts", "-n", "demo", "-o", "name"],
        None,
    );
    assert!(
        after.contains("serviceaccount/builder") && after.contains("serviceaccount/later"),
        "{after}"
    );

    assert!(
        ok(
            d,
            &["delete", "serviceaccount", "later", "-n", "demo"],
            None
        )
        .contains("deleted")
    );
    // SIGTERM: a clean exit.
    let status = server
        .terminate(Duration::from_secs(20))
        .expect("no exit within 20 s of SIGTERM");
    assert!(status.success(), "exit after SIGTERM: {status}");
    let mut server = spawn_ready(d, port);
    let missing = kubectl(d, &["get", "serviceaccount", "later", "-n", "demo"], None);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("NotFound"));
    server.kill();
}

#[test]
fn python_client_lists_and_watches() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = spawn_ready(dir.path(), port);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/clients/python_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(dir.path().join("admin.kubeconfig"))
        .arg("py-ns")
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    server.kill();
    assert!(
        out.status.success(),
        "python client failed (the test command installs the `kubernetes` package):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for check in ["list ok", "watch ok", "replace ok", "delete ok", "token ok"] {
        assert!(stdout.contains(check), "missing {check:?}:\n{stdout}");
    }
}
