//! Test support: the real `svc-gateway` binary as a child process that is killed (SIGKILL)
//! and reaped when dropped, so a failing test never leaves a server behind.

#![allow(dead_code)] // each test binary uses a different subset

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
