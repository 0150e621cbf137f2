//! Test support: the real `svc-gateway` binary as a child process that is killed (SIGKILL)
//! and reaped when dropped, so a failing test never leaves a server behind; and an admin
//! client of it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use http::StatusCode;
use svc_gateway::outbound::pki::{PkiOptions, ensure_pki};

use super::client::{Client, eventually};

pub struct ServerProcess(Child);

impl ServerProcess {
    /// Starts the binary on 127.0.0.1:`port` with its data in `dir`.
    pub fn spawn(dir: &Path, port: u16) -> Self {
        Self::spawn_with(dir, port, &[])
    }

    /// Like `spawn`, with more flags.
    pub fn spawn_with(dir: &Path, port: u16, flags: &[&str]) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_svc-gateway"))
            .args([
                "--data-dir",
                dir.to_str().unwrap(),
                "--bind-address",
                "127.0.0.1",
            ])
            .args(["--secure-port", &port.to_string(), "--log-level", "warn"])
            .args(flags)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start svc-gateway");
        ServerProcess(child)
    }

    /// Sends SIGTERM and waits up to `limit` for the process to exit; returns its exit status.
    pub fn terminate(&mut self, limit: std::time::Duration) -> Option<std::process::ExitStatus> {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        None
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An admin client of the child on `port` once it serves: the child writes its PKI in `dir`
/// on first start, so this waits for it, loads it, then waits for `/readyz`.
pub async fn admin_client(dir: &Path, port: u16) -> Client {
    let kubeconfig = dir.join("admin.kubeconfig");
    eventually(Duration::from_secs(20), "the PKI is written", || async {
        kubeconfig.exists()
    })
    .await;
    let pki = ensure_pki(
        &dir.join("pki"),
        &PkiOptions {
            tls_sans: vec![],
            admin_kubeconfig_path: kubeconfig,
            server_url: format!("https://127.0.0.1:{port}"),
            cluster_signing: None,
        },
    )
    .unwrap();
    let (cert, key) = pki.admin_credentials();
    let tls = pki
        .client_config_for(Some((cert, key)), &[b"http/1.1"])
        .unwrap();
    let c = Client {
        addr: ([127, 0, 0, 1], port).into(),
        tls,
        h2: false,
    };
    eventually(Duration::from_secs(20), "the server is ready", || async {
        c.connect().await.is_ok() && c.get("/readyz").await.0 == StatusCode::OK
    })
    .await;
    c
}
