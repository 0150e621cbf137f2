//! Test support (feature `conformance`): real etcd servers as child processes on loopback,
//! with free ports and a caller-owned data directory, killed (SIGKILL) and reaped on drop so
//! a failing test never leaves one behind. Needs the `etcd` binary (Debian `etcd-server`).
// Test support, compiled only with the `conformance` feature: a panic is how a check fails,
// and arithmetic and indexing are on the suite's own small data.
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

use super::{EtcdConfig, EtcdStore, EtcdTls};
use crate::Store;

/// A free loopback port (bound and released; the small reuse race is acceptable in tests).
pub fn free_port() -> u16 {
    port_of(&loopback_listener())
}

/// A listener on a free loopback port.
fn loopback_listener() -> TcpListener {
    match TcpListener::bind("127.0.0.1:0") {
        Ok(listener) => listener,
        Err(e) => panic!("no free loopback port: {e}"),
    }
}

fn port_of(listener: &TcpListener) -> u16 {
    match listener.local_addr() {
        Ok(addr) => addr.port(),
        Err(e) => panic!("a bound listener without an address: {e}"),
    }
}

/// Server-side TLS of a test etcd: its serving certificate and key, and the CA that client
/// certificates must chain to (client certificates are then required).
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// One etcd member: its name, ports and data directory, and the process while running.
pub struct EtcdMember {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    initial_cluster: String,
    tls: Option<ServerTls>,
    child: Option<Child>,
}

impl EtcdMember {
    pub fn client_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// Starts (or restarts, on the same data directory and ports) the process.
    pub fn start(&mut self) {
        if self.child.is_some() {
            return;
        }
        if let Err(e) = std::fs::create_dir_all(&self.data_dir) {
            panic!("creating {}: {e}", self.data_dir.display());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data_dir.with_extension("log"));
        let stderr = log.map_or_else(|_| Stdio::null(), Stdio::from);
        let client_url = self.client_url();
        let peer_url = self.peer_url();
        let mut command = Command::new("etcd");
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert_file)
                .arg("--key-file")
                .arg(&tls.key_file)
                .arg("--trusted-ca-file")
                .arg(&tls.ca_file)
                .arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "svc-test"])
            // Fast leader election on loopback, so a killed member costs little time.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn();
        match child {
            Ok(child) => self.child = Some(child),
            Err(e) => panic!("starting etcd (is the etcd-server package installed?): {e}"),
        }
    }

    /// SIGKILL and reap; the data directory stays for a restart.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The running process's id (to stop and continue it with signals).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process was started and has since exited on its own.
    fn has_exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| !matches!(child.try_wait(), Ok(None)))
    }
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How many times a cluster is started on fresh ports before a test gives up.
const START_ATTEMPTS: u32 = 3;

/// One or more etcd members forming one cluster.
pub struct EtcdCluster {
    pub members: Vec<EtcdMember>,
    /// What clients present (with `ServerTls` clusters).
    client_tls: Option<EtcdTls>,
}

impl EtcdCluster {
    /// Starts `size` members under `dir` and waits until the cluster serves.
    pub async fn start(dir: &Path, size: usize) -> Self {
        Self::start_with(dir, size, None).await
    }

    /// Like `start`, serving TLS and requiring client certificates; clients of `store` and
    /// `wait_ready` present `client`.
    pub async fn start_tls(dir: &Path, size: usize, server: ServerTls, client: EtcdTls) -> Self {
        Self::start_with(dir, size, Some((server, client))).await
    }

    async fn start_with(dir: &Path, size: usize, tls: Option<(ServerTls, EtcdTls)>) -> Self {
        let (server_tls, client_tls) = match tls {
            Some((server, client)) => (Some(server), Some(client)),
            None => (None, None),
        };
        // A port chosen here can be taken by another test before etcd binds it; the member
        // then exits at once. Such a start is thrown away and tried again on fresh ports.
        for attempt in 1..=START_ATTEMPTS {
            let data = dir.join(format!("try{attempt}"));
            let mut members = Self::members(&data, size, server_tls.as_ref());
            for member in &mut members {
                member.start();
            }
            let mut cluster = EtcdCluster {
                members,
                client_tls: client_tls.clone(),
            };
            match cluster.wait_every_member(Duration::from_secs(30)).await {
                Ok(()) => return cluster,
                Err(exited) if attempt < START_ATTEMPTS => {
                    eprintln!("test etcd member {exited} exited at start; trying fresh ports");
                }
                Err(exited) => panic!(
                    "test etcd member {exited} exited at start {START_ATTEMPTS} times (see {})",
                    data.display()
                ),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// `size` members under `dir` on distinct free ports, not started.
    fn members(dir: &Path, size: usize, tls: Option<&ServerTls>) -> Vec<EtcdMember> {
        // Every listener stays bound until all are chosen, so no two members share a port.
        let listeners: Vec<TcpListener> = (0..size * 2).map(|_| loopback_listener()).collect();
        let ports: Vec<u16> = listeners.iter().map(port_of).collect();
        drop(listeners);
        let initial_cluster = (0..size)
            .map(|i| format!("m{i}=http://127.0.0.1:{}", ports[2 * i + 1]))
            .collect::<Vec<_>>()
            .join(",");
        (0..size)
            .map(|i| EtcdMember {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                data_dir: dir.join(format!("m{i}")),
                initial_cluster: initial_cluster.clone(),
                tls: tls.cloned(),
                child: None,
            })
            .collect()
    }

    /// Waits until each member answers a linearizable read on its own endpoint; `Err` names
    /// a member whose process exited meanwhile.
    async fn wait_every_member(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        for index in 0..self.members.len() {
            let name = self.members[index].name.clone();
            let store = self.probe(vec![self.members[index].client_url()]).await;
            loop {
                let exited = self
                    .members
                    .iter_mut()
                    .find_map(|m| m.has_exited().then(|| m.name.clone()));
                if let Some(exited) = exited {
                    return Err(exited);
                }
                match store.health().await {
                    Ok(()) => break,
                    Err(e) if Instant::now() >= deadline => {
                        panic!("test etcd {name} not ready after {limit:?}: {e}")
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
        Ok(())
    }

    /// A store on `endpoints` for readiness probes: each call gives up after a second.
    async fn probe(&self, endpoints: Vec<String>) -> std::sync::Arc<EtcdStore> {
        let config = EtcdConfig {
            endpoints,
            tls: self.client_tls.clone(),
            request_timeout: Duration::from_secs(1),
            ..EtcdConfig::default()
        };
        match EtcdStore::connect(config).await {
            Ok(store) => store,
            Err(e) => panic!("connecting to the test etcd: {e}"),
        }
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::client_url).collect()
    }

    /// A store on this cluster (all endpoints), keys under `prefix`.
    pub async fn store(&self, prefix: &str) -> std::sync::Arc<EtcdStore> {
        let config = EtcdConfig {
            endpoints: self.endpoints(),
            prefix: prefix.to_string(),
            tls: self.client_tls.clone(),
            progress_interval: Duration::from_millis(100),
            ..EtcdConfig::default()
        };
        match EtcdStore::connect(config).await {
            Ok(store) => store,
            Err(e) => panic!("connecting to the test etcd: {e}"),
        }
    }

    /// Waits until a linearizable read succeeds through the running members.
    pub async fn wait_ready(&self, limit: Duration) {
        let running: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.is_running())
            .map(EtcdMember::client_url)
            .collect();
        let store = self.probe(running).await;
        let deadline = Instant::now() + limit;
        loop {
            match store.health().await {
                Ok(()) => return,
                Err(e) if Instant::now() >= deadline => {
                    panic!("test etcd not ready after {limit:?}: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}
