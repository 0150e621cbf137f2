//! Test support: the real `svc-gateway` binary as a child process that is killed (SIGKILL)
//! and reaped when dropped, so a failing test never leaves a server behind.

use std::path::Path;
use std::process::{Child, Command, Stdio};

pub struct ServerProcess(Child);

impl ServerProcess {
    /// Starts the binary on 127.0.0.1:`port` with its data in `dir`.
    pub fn spawn(dir: &Path, port: u16) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_svc-gateway"))
            .args([
                "--data-dir",
                dir.to_str().unwrap(),
                "--bind-address",
                "127.0.0.1",
            ])
            .args(["--secure-port", &port.to_string(), "--log-level", "warn"])
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
