//! Storage faults and secrets at rest and in logs, through the real server: a full disk (a
//! size-limited tmpfs) fails writes with 500 and a message naming the cause while reads,
//! watches and `/livez` go on and `/readyz/etcd-readiness` fails, and recovers once space
//! returns; a corrupt data file stops the binary from starting; key files are 0600 and data
//! directories 0700; a trace-level log of token, review, bearer and CSR traffic holds no
//! token and no key.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::certificates;
use crate::support::client::{Client, TestServer, create_namespace, eventually};
use crate::support::process::{admin_client, free_port};

/// A tmpfs of a fixed size, mounted for one test and unmounted when dropped (panics too).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` only outside CI when mounting is not permitted; in CI that fails the test.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("tmpfs")
            .arg(dir.path())
            .output();
        match out {
            Ok(out) if out.status.success() => Some(Tmpfs { dir }),
            other => {
                let why = format!("cannot mount a tmpfs (root needed): {other:?}");
                assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
                eprintln!("SKIPPED outside CI: {why}");
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let path = self.dir.path();
        if !Command::new("umount")
            .arg(path)
            .status()
            .is_ok_and(|s| s.success())
        {
            // Still busy (a task of the stopped server): detach it so the directory can go.
            let _ = Command::new("umount").arg("-l").arg(path).status();
        }
    }
}

/// Fills the filesystem holding `dir` until it refuses more; returns the filler's path.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xAB; 64 * 1024];
    while file.write_all(&chunk).is_ok() {}
    while file.write_all(&[0xAB; 512]).is_ok() {}
    path
}

fn secret(name: &str, bytes: usize) -> Value {
    let data = base64::engine::general_purpose::STANDARD.encode(vec![b's'; bytes]);
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
           "data": {"blob": data}})
}

const SECRETS: &str = "/api/v1/namespaces/full/secrets";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_writes_with_500_and_readyz_until_space_returns() {
    let Some(fs) = Tmpfs::mount("24m") else {
        return;
    };
    let data = fs.dir.path().join("data");
    let srv = TestServer::start_with(|o| o.data_dir = data.clone()).await;
    let c = srv.admin();
    create_namespace(&c, "full").await;
    let (s, v) = c.post(SECRETS, secret("before", 1024)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let mut watch = c.watch(&format!("{SECRETS}?watch=true")).await;

    let filler = fill(fs.dir.path());
    let mut created = vec!["before".to_string()];
    let mut refusal = None;
    for i in 0..100 {
        let name = format!("s{i}");
        let (s, v) = c.post(SECRETS, secret(&name, 256 * 1024)).await;
        if s == StatusCode::CREATED {
            created.push(name);
            continue;
        }
        refusal = Some((name, s, v));
        break;
    }
    let (failed, status, body) = refusal.expect("the full disk never refused a write");
    // 500 InternalError, as Kubernetes answers when etcd is out of space: the outcome of a
    // failed commit is not known to be nothing (a failed fsync may have written it), so 503's
    // "try again, nothing happened" would promise too much.
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "InternalError", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("No space left on device"),
        "the message names the cause: {message}"
    );

    // Not ready (the named check fails and is listed), but alive, and reads go on.
    let (s, _) = c.get("/readyz/etcd-readiness").await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    let (s, body) = c.get("/readyz?verbose").await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    let text = body.as_str().unwrap();
    assert!(
        text.lines()
            .any(|l| l == "[-]etcd-readiness failed: reason withheld"),
        "{text}"
    );
    assert!(text.lines().any(|l| l == "[+]etcd ok"), "{text}");
    let (s, _) = c.get("/livez").await;
    assert_eq!(s, StatusCode::OK);
    let (s, list) = c.get(SECRETS).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let mut names: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    let mut want = created.clone();
    want.sort();
    assert_eq!(names, want, "exactly the acknowledged writes are stored");
    let (s, _) = c.get(&format!("{SECRETS}/{failed}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // The watch saw every acknowledged create after it started.
    // (Without a resourceVersion it starts with the existing objects, `before` included.)
    for name in &created {
        let event = watch
            .next_within(Duration::from_secs(10))
            .await
            .expect("a watch event");
        assert_eq!(event["type"], "ADDED");
        assert_eq!(event["object"]["metadata"]["name"], name.as_str());
    }

    // Space returns: the store notices by itself and writes resume.
    std::fs::remove_file(&filler).unwrap();
    eventually(Duration::from_secs(10), "readyz is good again", || async {
        c.get("/readyz").await.0 == StatusCode::OK
    })
    .await;
    let (s, v) = c.post(SECRETS, secret(&failed, 256 * 1024)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let event = watch
        .next_within(Duration::from_secs(10))
        .await
        .expect("the watch goes on");
    assert_eq!(event["object"]["metadata"]["name"], failed.as_str());
    drop(watch);
    drop(srv);
    drop(fs);
}

/// Runs the binary on `dir` with `RUST_LOG=trace`, its log (stdout and stderr) in `log`.
fn spawn_binary(dir: &Path, port: u16, log: &Path) -> std::process::Child {
    let file = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_svc-gateway"))
        .args(["--data-dir", dir.to_str().unwrap()])
        .args(["--bind-address", "127.0.0.1"])
        .args(["--secure-port", &port.to_string(), "--log-level", "trace"])
        .env("RUST_LOG", "trace")
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .stdin(Stdio::null())
        .spawn()
        .expect("start svc-gateway")
}

struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for the child to exit, at most `limit`; `None` if it is still running.
fn wait_exit(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_data_file_stops_the_binary_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("first.log");
    let port = free_port();
    let mut first = Reaped(spawn_binary(dir.path(), port, &log));
    let c = admin_client(dir.path(), port).await;
    create_namespace(&c, "doomed").await;
    let _ = Command::new("kill")
        .args(["-TERM", &first.0.id().to_string()])
        .status();
    assert!(wait_exit(&mut first.0, Duration::from_secs(20)).is_some());

    // Damage every page past the header, as a bad disk would.
    let path = dir
        .path()
        .join("store")
        .join(svc_storage::embedded::DATA_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let mut offset = 4096;
    while offset + 164 < bytes.len() {
        for b in &mut bytes[offset + 100..offset + 164] {
            *b ^= 0xA5;
        }
        offset += 4096;
    }
    std::fs::write(&path, &bytes).unwrap();

    let log = dir.path().join("second.log");
    let mut second = Reaped(spawn_binary(dir.path(), free_port(), &log));
    let status = wait_exit(&mut second.0, Duration::from_secs(30))
        .expect("a server on a corrupt data file must not keep running");
    assert!(!status.success(), "{status:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("store.redb"), "names the file:\n{text}");
    assert!(text.contains("corrupt"), "says it is corrupt:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_files_are_0600_and_data_directories_0700() {
    let parent = tempfile::tempdir().unwrap();
    let data = parent.path().join("data");
    let srv = TestServer::start_with(|o| o.data_dir = data.clone()).await;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for dir in [data.clone(), data.join("store"), data.join("pki")] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    }
    let mut keys = 0;
    for entry in std::fs::read_dir(data.join("pki")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.contains("PRIVATE KEY") {
            keys += 1;
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }
    assert!(
        keys >= 3,
        "expected the CA, serving, admin and service-account keys"
    );
    assert_eq!(mode(&data.join("admin.kubeconfig")), 0o600);
    drop(srv);
}

/// The base64 lines of every PEM block in `text` (the key material itself).
fn pem_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.len() >= 32 && !l.starts_with("-----"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_log_holds_no_token_and_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let port = free_port();
    let mut child = Reaped(spawn_binary(dir.path(), port, &log));
    let c = admin_client(dir.path(), port).await;
    create_namespace(&c, "quiet").await;

    // Token issuance.
    let (s, tr) = c
        .post(
            "/api/v1/namespaces/quiet/serviceaccounts/default/token",
            json!({"apiVersion": "authentication.svc.io/v1", "kind": "TokenRequest",
                   "spec": {}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{tr}");
    let token = tr["status"]["token"].as_str().unwrap().to_string();
    // TokenReview, of a good token and of a forged one.
    let forged = format!("{}x", &token[..token.len() - 1]);
    for t in [&token, &forged] {
        let (s, v) = c
            .post(
                "/apis/authentication.svc.io/v1/tokenreviews",
                json!({"apiVersion": "authentication.svc.io/v1", "kind": "TokenReview",
                       "spec": {"token": t}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    assert_eq!(
        c.post(
            "/apis/authentication.svc.io/v1/tokenreviews",
            json!({"apiVersion": "authentication.svc.io/v1", "kind": "TokenReview",
                   "spec": {"token": token}}),
        )
        .await
        .1["status"]["authenticated"],
        true
    );
    // Bearer requests, good and bad.
    let anon = Client {
        addr: c.addr,
        tls: svc_gateway::outbound::pki::ensure_pki(
            &dir.path().join("pki"),
            &svc_gateway::outbound::pki::PkiOptions {
                tls_sans: vec![],
                admin_kubeconfig_path: dir.path().join("admin.kubeconfig"),
                server_url: format!("https://127.0.0.1:{port}"),
                cluster_signing: None,
            },
        )
        .unwrap()
        .client_config_for(None, &[b"http/1.1"])
        .unwrap(),
        h2: false,
    };
    for (t, want) in [
        (&token, StatusCode::FORBIDDEN),
        (&forged, StatusCode::UNAUTHORIZED),
    ] {
        let auth = format!("Bearer {t}");
        let r = anon
            .request(
                Method::GET,
                "/api/v1/namespaces/quiet/secrets",
                "",
                &[("authorization", auth.as_str())],
            )
            .await;
        assert_eq!(r.status, want, "{}", r.text());
    }
    // A CSR signed by the cluster CA.
    let (csr_key, pem) = certificates::request("quiet-user", None, &[]);
    certificates::create(
        &c,
        certificates::body(
            "quiet",
            &pem,
            "svc.io/apiserver-client",
            certificates::CLIENT_USAGES,
            None,
        ),
    )
    .await;
    let (s, v) = certificates::decide(&c, "quiet", "Approved").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let issued = certificates::wait_until(&c, "quiet", "issued", |v| {
        certificates::certificate(v).is_some()
    })
    .await;
    assert!(certificates::certificate(&issued).is_some());

    let _ = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status();
    assert!(wait_exit(&mut child.0, Duration::from_secs(20)).is_some());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines().count() > 50 && text.contains("TRACE"),
        "the log is at trace level:\n{}",
        &text[..text.len().min(2000)]
    );

    let mut secrets: Vec<(String, String)> = Vec::new();
    // The tokens, whole and each part (the signature alone is the secret part).
    for t in [&token, &forged] {
        secrets.push(("token".into(), t.to_string()));
        for part in t.split('.').filter(|p| p.len() >= 16) {
            secrets.push(("token part".into(), part.to_string()));
        }
    }
    // Every private key on disk, and the CSR's key: their base64 lines, in PEM and as one
    // unbroken base64 string.
    let mut key_pems = vec![("csr key".to_string(), csr_key.serialize_pem())];
    for entry in std::fs::read_dir(dir.path().join("pki")).unwrap() {
        let path = entry.unwrap().path();
        let pem = std::fs::read_to_string(&path).unwrap_or_default();
        if pem.contains("PRIVATE KEY") {
            key_pems.push((path.display().to_string(), pem));
        }
    }
    assert!(key_pems.len() >= 4, "{key_pems:?}");
    for (name, pem) in &key_pems {
        let lines = pem_lines(pem);
        secrets.push((name.clone(), lines.concat()));
        for line in lines {
            secrets.push((name.clone(), line));
        }
    }
    for (what, secret) in &secrets {
        assert!(
            !text.contains(secret.as_str()),
            "the log holds a {what}: {secret}"
        );
    }
    for marker in ["PRIVATE KEY", "Bearer "] {
        assert!(!text.contains(marker), "the log holds {marker:?}");
    }
}
