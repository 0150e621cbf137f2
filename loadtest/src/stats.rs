//! Live counters shared by writers and watchers, the once-a-second sampler (series,
//! progress line, /proc CPU and RSS), the machine description, and the writers' own thread
//! (`on_own_thread`).

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;

/// Latencies are recorded in microseconds, from 1 µs to 10 minutes, 3 significant digits.
pub fn new_hist() -> Histogram<u64> {
    match Histogram::new_with_bounds(1, 600_000_000, 3) {
        Ok(hist) => hist,
        // The bounds are constants; should they ever be refused, the run cannot measure.
        Err(e) => {
            eprintln!("svc-loadtest: cannot create a latency histogram: {e}");
            std::process::exit(2)
        }
    }
}

pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[derive(Default)]
pub struct Live {
    pub delivered: AtomicU64,
    pub writes: AtomicU64,
    pub write_errors: AtomicU64,
    pub watch_errors: AtomicU64,
    pub reconnects: AtomicU64,
    pub stopping: AtomicBool,
    /// Delivery latencies since the last sample (the sampler folds them into `total`).
    pub interval: Mutex<Option<Histogram<u64>>>,
    pub write_lat: Mutex<Option<Histogram<u64>>>,
    pub error_samples: Mutex<Vec<String>>,
}

impl Live {
    pub fn new() -> Arc<Self> {
        let l = Live::default();
        *l.interval.lock() = Some(new_hist());
        *l.write_lat.lock() = Some(new_hist());
        Arc::new(l)
    }

    /// Keeps the first few distinct error messages for the report.
    /// Counts a write the server refused or that failed in transit, keeping a sample message.
    pub fn write_failed(&self, msg: String) {
        self.write_errors
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.note_error(msg);
    }

    pub fn note_error(&self, msg: String) {
        let mut e = self.error_samples.lock();
        if e.len() < 20 && !e.contains(&msg) {
            e.push(msg);
        }
    }

    pub fn record_write(&self, micros: u64) {
        self.record_writes(micros, 1);
    }

    /// `n` writes acknowledged together after `micros` (the raw writer's batches).
    pub fn record_writes(&self, micros: u64, n: u64) {
        if let Some(h) = self.write_lat.lock().as_mut() {
            h.saturating_record_n(micros.max(1), n);
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Seconds since the measured phase began.
    pub t: f64,
    pub events_per_s: f64,
    pub writes_per_s: f64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub client_cpu_pct: f64,
    pub server_cpu_pct: Option<f64>,
    pub server_rss_bytes: Option<u64>,
}

/// CPU seconds (user + system) of a process, from /proc/<pid>/stat.
pub fn proc_cpu_secs(pid: &str) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces: fields are counted after its closing paren.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on every Linux configuration this runs on.
    Some(ticks / 100.0)
}

pub fn proc_rss_bytes(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The machine's TCP counters that tell a run the kernel held back: times TCP memory went
/// past `net.ipv4.tcp_mem`'s pressure level, segments dropped because a socket's receive
/// queue could not be charged, and segments sent again. Every process's sockets count, the
/// load generator's among them: on one machine a fan-out that outruns its reader fills
/// receive queues until the kernel drops and retransmits, and a run that went there measures
/// the kernel as much as the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelTcp {
    pub memory_pressures: u64,
    pub rcvq_drops: u64,
    pub retrans_segs: u64,
}

impl KernelTcp {
    /// The counters now; `None` where /proc/net is not readable.
    pub fn read() -> Option<KernelTcp> {
        let netstat = std::fs::read_to_string("/proc/net/netstat").ok()?;
        let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
        Some(KernelTcp {
            memory_pressures: counter(&netstat, "TcpExt:", "TCPMemoryPressures")?,
            rcvq_drops: counter(&netstat, "TcpExt:", "TCPRcvQDrop")?,
            retrans_segs: counter(&snmp, "Tcp:", "RetransSegs")?,
        })
    }

    /// What was counted from `earlier` to this reading.
    pub fn since(&self, earlier: &KernelTcp) -> KernelTcp {
        KernelTcp {
            memory_pressures: self
                .memory_pressures
                .saturating_sub(earlier.memory_pressures),
            rcvq_drops: self.rcvq_drops.saturating_sub(earlier.rcvq_drops),
            retrans_segs: self.retrans_segs.saturating_sub(earlier.retrans_segs),
        }
    }

    /// For a report's `extra`.
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "memory_pressures": self.memory_pressures,
            "rcvq_drops": self.rcvq_drops,
            "retrans_segs": self.retrans_segs,
        })
    }
}

/// A counter of /proc/net/netstat or /proc/net/snmp: each section is a line of names after
/// `prefix` and a line of values after it, in the same order.
fn counter(table: &str, prefix: &str, name: &str) -> Option<u64> {
    let mut lines = table.lines().filter(|l| l.starts_with(prefix));
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let at = names.split_whitespace().position(|n| n == name);
        if let Some(at) = at {
            return values.split_whitespace().nth(at)?.parse().ok();
        }
    }
    None
}

/// The process listening on TCP `port` (any local address), found through /proc/net/tcp{,6}
/// and the processes' open sockets; `None` when no process of ours that can be inspected
/// holds it.
pub fn pid_listening_on(port: u16) -> Option<u32> {
    let mut sockets = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(s) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in s.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT, st 0A is LISTEN, the inode is column 10.
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let p = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if *state == "0A" && p == Some(port) {
                sockets.push(format!("socket:[{inode}]"));
            }
        }
    }
    if sockets.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && sockets.iter().any(|s| target.as_os_str() == s.as_str())
            {
                return Some(pid);
            }
        }
    }
    None
}

/// Samples once a second until `stop` is set; prints a progress line to stderr.
pub async fn sampler(
    live: Arc<Live>,
    server_pid: Option<u32>,
    total: Arc<Mutex<Histogram<u64>>>,
    series: Arc<Mutex<Vec<Sample>>>,
    label: String,
) {
    let start = Instant::now();
    let server_pid = server_pid.map(|p| p.to_string());
    let mut last = (0u64, 0u64, start);
    let mut last_cpu = proc_cpu_secs("self").unwrap_or(0.0);
    let mut last_scpu = server_pid.as_deref().and_then(proc_cpu_secs);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = Instant::now();
        let dt = now.duration_since(last.2).as_secs_f64().max(1e-3);
        let d = live.delivered.load(Relaxed);
        let w = live.writes.load(Relaxed);
        let errors = live.write_errors.load(Relaxed) + live.watch_errors.load(Relaxed);
        // The total's lock is taken before the interval is swapped out, so a reader of the
        // total never sees samples that have left the interval but not yet reached the total.
        let mut t = total.lock();
        let interval = live.interval.lock().replace(new_hist());
        let (p50, p99) = match interval {
            Some(h) => {
                let _ = t.add(&h);
                (
                    h.value_at_quantile(0.5) as f64 / 1000.0,
                    h.value_at_quantile(0.99) as f64 / 1000.0,
                )
            }
            None => (0.0, 0.0),
        };
        drop(t);
        let cpu = proc_cpu_secs("self").unwrap_or(last_cpu);
        let scpu = server_pid.as_deref().and_then(proc_cpu_secs);
        let s = Sample {
            t: now.duration_since(start).as_secs_f64(),
            events_per_s: (d - last.0) as f64 / dt,
            writes_per_s: (w - last.1) as f64 / dt,
            errors,
            p50_ms: p50,
            p99_ms: p99,
            client_cpu_pct: (cpu - last_cpu) / dt * 100.0,
            server_cpu_pct: match (scpu, last_scpu) {
                (Some(a), Some(b)) => Some((a - b) / dt * 100.0),
                _ => None,
            },
            server_rss_bytes: server_pid.as_deref().and_then(proc_rss_bytes),
        };
        let p99_total = total.lock().value_at_quantile(0.99) as f64 / 1000.0;
        let mut err = std::io::stderr();
        let _ = write!(
            err,
            "\r[{label}] {:>5.0}s  events/s {:>10.0}  writes/s {:>8.0}  p99 {:>8.2} ms  errors {}   ",
            s.t, s.events_per_s, s.writes_per_s, p99_total, errors
        );
        let _ = err.flush();
        series.lock().push(s);
        last = (d, w, now);
        last_cpu = cpu;
        last_scpu = scpu;
        if live.stopping.load(Relaxed) {
            // Samples recorded after this tick's merge but before the stop would otherwise
            // be left behind in the interval: fold them in on the way out.
            let mut t = total.lock();
            if let Some(rest) = live.interval.lock().replace(new_hist()) {
                let _ = t.add(&rest);
            }
            let _ = writeln!(err);
            return;
        }
    }
}

/// Runs `make()`'s future on a new OS thread with its own current-thread runtime and hands
/// its output back through the receiver. The writers run this way: beside thousands of
/// watch readers in the main runtime they would wait behind event parsing for a worker,
/// and the harness, not the server, would set the achieved write rate and latency. On
/// their own thread the kernel schedules them beside the readers' threads. Whatever the
/// future connects (hyper's connection tasks, gRPC channels) is spawned on this runtime,
/// so it must be opened inside the future.
pub fn on_own_thread<F, Fut>(
    name: &str,
    make: F,
) -> std::io::Result<tokio::sync::oneshot::Receiver<Fut::Output>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future + 'static,
    Fut::Output: Send + 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let out = rt.block_on(make());
            let _ = tx.send(out);
        })?;
    Ok(rx)
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub memory_bytes: u64,
    pub kernel: String,
    pub cpu_model: String,
}

pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_bytes = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024;
    Machine {
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        memory_bytes,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        cpu_model,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_tcp_counters_are_read_by_name_from_their_section() {
        let netstat = "TcpExt: SyncookiesSent PruneCalled TCPMemoryPressures TCPRcvQDrop\n\
                       TcpExt: 0 233867 22 158505\n\
                       IpExt: InNoRoutes TCPRcvQDrop\n\
                       IpExt: 7 9\n";
        assert_eq!(counter(netstat, "TcpExt:", "TCPMemoryPressures"), Some(22));
        assert_eq!(counter(netstat, "TcpExt:", "TCPRcvQDrop"), Some(158_505));
        assert_eq!(counter(netstat, "IpExt:", "TCPRcvQDrop"), Some(9));
        assert_eq!(counter(netstat, "TcpExt:", "Missing"), None);
        let snmp = "Ip: Forwarding\nIp: 1\nTcp: RtoAlgorithm RetransSegs\nTcp: 1 4242\n";
        assert_eq!(counter(snmp, "Tcp:", "RetransSegs"), Some(4242));
        // This machine's own tables have all three.
        assert!(KernelTcp::read().is_some());
        assert_eq!(
            KernelTcp {
                memory_pressures: 1,
                rcvq_drops: 5,
                retrans_segs: 9
            }
            .since(&KernelTcp {
                memory_pressures: 0,
                rcvq_drops: 2,
                retrans_segs: 10
            }),
            KernelTcp {
                memory_pressures: 1,
                rcvq_drops: 3,
                retrans_segs: 0
            }
        );
    }

    #[test]
    fn finds_the_process_listening_on_a_port() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(pid_listening_on(port), Some(std::process::id()));
        drop(l);
        assert_eq!(pid_listening_on(port), None);
    }

    #[test]
    fn a_future_on_its_own_thread_runs_on_another_thread_and_runtime() {
        let main = std::thread::current().id();
        let rx = on_own_thread("lt-test-writer", move || async move {
            // A timer and a spawned task: the thread's runtime drives both.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let t = tokio::spawn(async { std::thread::current().id() })
                .await
                .unwrap();
            (
                std::thread::current().id(),
                t,
                std::thread::current().name().map(String::from),
            )
        })
        .unwrap();
        let (ran_on, task_on, name) = rx.blocking_recv().unwrap();
        assert_ne!(ran_on, main);
        assert_eq!(
            task_on, ran_on,
            "a current-thread runtime runs its tasks on its thread"
        );
        assert_eq!(name.as_deref(), Some("lt-test-writer"));
    }

    #[test]
    fn reads_this_process_cpu_time() {
        let pid = std::process::id().to_string();
        assert!(proc_cpu_secs(&pid).unwrap() >= 0.0);
        assert!(proc_rss_bytes(&pid).unwrap() > 0);
        assert_eq!(proc_cpu_secs("0"), None);
    }
}
