//! `svc-loadtest get` with kubeconfig users whose credentials come from exec plugins (shell
//! scripts written here) against an in-process svc-gateway over TLS: a service account's token,
//! a client certificate in `system:masters`, reuse of one credential for a whole run, a re-run
//! after a 401 and after expiry, and a failing plugin's error.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_svc-loadtest");
const V1: &str = "client.authentication.svc.io/v1";
const V1BETA1: &str = "client.authentication.svc.io/v1beta1";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A POST on the unauthenticated loopback port (it acts as `system:masters`), repeated while
/// the server answers 404 (namespaces appear shortly after start) for up to 10 s.
fn post(addr: SocketAddr, path: &str, body: &Value) -> Value {
    let t0 = std::time::Instant::now();
    loop {
        let (status, v) = post_once(addr, path, body);
        if status == 201 {
            return v;
        }
        assert!(
            status == 404 && t0.elapsed() < Duration::from_secs(10),
            "{status} {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn post_once(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{resp}"));
    let (start, end) = (resp.find('{').unwrap(), resp.rfind('}').unwrap());
    (status, serde_json::from_str(&resp[start..=end]).unwrap())
}

/// Writes an executable plugin script.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// A kubeconfig (JSON is YAML) for the admin kubeconfig's cluster with an exec user.
fn kubeconfig(admin: &Value, dir: &Path, name: &str, exec: Value) -> PathBuf {
    let mut cluster = admin["clusters"][0].clone();
    cluster["cluster"]["extensions"] =
        json!([{"name": "client.authentication.svc.io/exec", "extension": {"purpose": "load"}}]);
    let kc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "plugin", "user": {"exec": exec}}],
        "contexts": [{"name": "c", "context": {"cluster": cluster["name"], "user": "plugin"}}],
        "current-context": "c",
    });
    let p = dir.join(name);
    std::fs::write(&p, kc.to_string()).unwrap();
    p
}

/// Runs `get --path /version` for `secs` seconds with 4 clients; the run's report, or the
/// failure's stderr.
async fn get(kubeconfig: PathBuf, out: PathBuf, secs: u32) -> Result<Value, String> {
    tokio::task::spawn_blocking(move || {
        let o = Command::new(BIN)
            .arg("get")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--path", "/version", "--clients", "4"])
            .args(["--duration", &format!("{secs}s")])
            .arg("--out")
            .arg(&out)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).into_owned());
        }
        let v: Value =
            serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
        Ok(v["runs"][0].clone())
    })
    .await
    .unwrap()
}

fn check_ok(r: &Value) -> u64 {
    let x = &r["extra"];
    let rate = x["requests_per_s"].as_f64().unwrap();
    eprintln!("{}: {rate:.0} requests/s", r["target"]["endpoint"]);
    assert_eq!(x["authentication"], "exec plugin", "{x}");
    assert!(rate > 0.0, "{r}");
    assert_eq!(x["non_2xx"], 0, "{}", r["errors"]);
    assert_eq!(
        r["errors"].as_array().map_or(0, Vec::len),
        0,
        "{}",
        r["errors"]
    );
    r["latency_ms"]["count"].as_u64().unwrap()
}

fn runs(counter: &Path) -> usize {
    std::fs::read_to_string(counter).unwrap().lines().count()
}

/// Prints an ExecCredential of `$API` with the token in `$TOKEN_FILE` (the first run's token
/// is `garbage` when `$BAD_FIRST` is set), expiring in `$LIFE` seconds; counts runs in
/// `$COUNT` and keeps the input in `$INFO_OUT`.
const TOKEN_PLUGIN: &str = r#"echo run >> "$COUNT"
printf '%s' "$SVC_EXEC_INFO" > "$INFO_OUT"
n=$(wc -l < "$COUNT")
tok=$(cat "$TOKEN_FILE")
if [ -n "$BAD_FIRST" ] && [ "$n" -eq 1 ]; then tok=garbage; fi
exp=$(date -u -d "@$(( $(date +%s) + $LIFE ))" +%Y-%m-%dT%H:%M:%SZ)
printf '{"apiVersion":"%s","kind":"ExecCredential","status":{"token":"%s","expirationTimestamp":"%s"}}' "$API" "$tok" "$exp"
"#;

fn token_user(dir: &Path, tag: &str, api: &str, life: u32, bad_first: bool) -> (Value, PathBuf) {
    let count = dir.join(format!("{tag}.count"));
    let mut env = vec![
        json!({"name": "COUNT", "value": count.display().to_string()}),
        json!({"name": "INFO_OUT", "value": dir.join(format!("{tag}.info")).display().to_string()}),
        json!({"name": "TOKEN_FILE", "value": dir.join("sa.token").display().to_string()}),
        json!({"name": "LIFE", "value": life.to_string()}),
        json!({"name": "API", "value": api}),
    ];
    if bad_first {
        env.push(json!({"name": "BAD_FIRST", "value": "1"}));
    }
    let exec = json!({
        "apiVersion": api,
        // Relative to the kubeconfig's directory.
        "command": "./token-plugin.sh",
        "env": env,
        "provideClusterInfo": true,
        "interactiveMode": "Never",
    });
    (exec, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_plugins_authenticate_get_runs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut opts = svc_gateway::base::flags::Options::for_tests(d.join("server"));
    opts.insecure_port = free_port();
    opts.log_level = "warn".into();
    let server = svc_gateway::run::start(opts).await.unwrap();
    let insecure = server.insecure_addr.unwrap();
    let admin: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&server.admin_kubeconfig).unwrap())
            .unwrap();

    // A service account and a token for it.
    post(
        insecure,
        "/api/v1/namespaces/default/serviceaccounts",
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "load"}}),
    );
    let tr = post(
        insecure,
        "/api/v1/namespaces/default/serviceaccounts/load/token",
        &json!({"apiVersion": "authentication.svc.io/v1", "kind": "TokenRequest", "spec": {}}),
    );
    let token = tr["status"]["token"].as_str().unwrap();
    std::fs::write(d.join("sa.token"), token).unwrap();
    script(d, "token-plugin.sh", TOKEN_PLUGIN);

    // 1. The token plugin, v1: one run serves the whole load; its input names the cluster.
    let (exec, count) = token_user(d, "plain", V1, 3600, false);
    let kc = kubeconfig(&admin, d, "plain.yaml", exec);
    let r = get(kc, d.join("out-plain"), 2).await.unwrap();
    let requests = check_ok(&r);
    assert_eq!(runs(&count), 1, "the credential was not reused");
    assert!(requests > 10, "{requests}");
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("plain.info")).unwrap()).unwrap();
    assert_eq!(info["apiVersion"], V1);
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(info["spec"]["interactive"], false);
    let cluster = &admin["clusters"][0]["cluster"];
    assert_eq!(info["spec"]["cluster"]["server"], cluster["server"]);
    assert_eq!(
        info["spec"]["cluster"]["certificate-authority-data"],
        cluster["certificate-authority-data"]
    );
    assert_eq!(
        info["spec"]["cluster"]["config"],
        json!({"purpose": "load"})
    );

    // 2. The first token is refused (401): the plugin runs once more, the request is retried
    // and nothing fails.
    let (exec, count) = token_user(d, "bad", V1, 3600, true);
    let kc = kubeconfig(&admin, d, "bad.yaml", exec);
    let r = get(kc, d.join("out-bad"), 2).await.unwrap();
    check_ok(&r);
    assert_eq!(runs(&count), 2, "one re-run after the 401");

    // 3. A token living two seconds, v1beta1: refreshed before it expires, a few runs in all.
    let (exec, count) = token_user(d, "short", V1BETA1, 2, false);
    let kc = kubeconfig(&admin, d, "short.yaml", exec);
    let r = get(kc, d.join("out-short"), 3).await.unwrap();
    let requests = check_ok(&r);
    let n = runs(&count);
    assert!(
        (2..=8).contains(&n),
        "{n} plugin runs in 3 s with 2 s tokens"
    );
    assert!(requests > 10 * n as u64, "{requests} requests, {n} runs");

    // 4. A client certificate in system:masters.
    let (cert, key) = server
        .pki
        .issue_client_cert(
            "exec-loadtest",
            &["system:masters".to_string()],
            Duration::from_secs(3600),
        )
        .unwrap();
    let cred = json!({"apiVersion": V1, "kind": "ExecCredential",
        "status": {"clientCertificateData": cert, "clientKeyData": key}});
    std::fs::write(d.join("cert.json"), cred.to_string()).unwrap();
    let p = script(
        d,
        "cert-plugin.sh",
        &format!(
            "echo run >> {d}/cert.count\ncat {d}/cert.json\n",
            d = d.display()
        ),
    );
    let kc = kubeconfig(
        &admin,
        d,
        "cert.yaml",
        json!({"apiVersion": V1, "command": p.display().to_string()}),
    );
    let r = get(kc, d.join("out-cert"), 2).await.unwrap();
    check_ok(&r);
    assert_eq!(runs(&d.join("cert.count")), 1);

    // 5. A plugin answering another apiVersion, and a failing one: the run fails at once,
    // naming the plugin and what went wrong.
    let kc = kubeconfig(
        &admin,
        d,
        "mismatch.yaml",
        json!({"apiVersion": V1BETA1, "command": p.display().to_string()}),
    );
    let e = get(kc, d.join("out-mismatch"), 1).await.unwrap_err();
    assert!(
        e.contains("cert-plugin.sh") && e.contains("does not match"),
        "{e}"
    );
    let fail = script(d, "fail-plugin.sh", "echo 'login required' >&2\nexit 1\n");
    let kc = kubeconfig(
        &admin,
        d,
        "fail.yaml",
        json!({"apiVersion": V1, "command": fail.display().to_string()}),
    );
    let e = get(kc, d.join("out-fail"), 1).await.unwrap_err();
    assert!(
        e.contains("fail-plugin.sh") && e.contains("login required"),
        "{e}"
    );
}
