//! The raw baseline: `svc-loadtest raw-server`, a minimal fan-out server in its own process
//! (the load generator spawns itself with that subcommand and kills it at the end, so the
//! server's CPU is its own, read from /proc like any server's). One writer connection sends
//! fixed-size frames; the server hands each batch of whole frames to every reader connection,
//! coalescing a connection's pending batches into one write of up to 64 KiB. It does no
//! encoding, no storage and no bookkeeping: the hardware ceiling beside every server figure.
//!
//! The protocol: a client's first byte is `R` (a reader: the server answers `K` once it is
//! subscribed, then sends frames), `M` (a multiplexed reader of many logical streams, see
//! `mux.rs`) or `W` (the writer: a 4-byte little-endian frame size, then frames). A frame is
//! seq (u64 LE), the writer's timestamp (u64 LE) and padding.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch};

use crate::stats::{Live, now_nanos};

pub mod mux;

pub const MAX_WRITE: usize = 64 * 1024;
const READER: u8 = b'R';
const MUX_READER: u8 = b'M';
const WRITER: u8 = b'W';
const READY: u8 = b'K';
/// Batches the slowest reader may fall behind before the server stops reading the writer.
const BEHIND: usize = 64;
/// Largest frame accepted from a writer.
const MAX_FRAME: u32 = 1 << 20;

/// `svc-loadtest raw-server`: serves until killed (or, with `exit_with_stdin`, until its
/// standard input closes, so that it never outlives the load generator that spawned it).
pub async fn serve_main(listen: SocketAddr, exit_with_stdin: bool) -> Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    // The first line tells a parent which port was bound (with port 0).
    println!("listening on {}", listener.local_addr()?);
    if exit_with_stdin {
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            std::process::exit(0);
        });
    }
    // 256 batches of up to 64 KiB: a slow receiver may fall 16 MiB behind before it lags.
    let (tx, _) = broadcast::channel::<Bytes>(256);
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            continue;
        };
        let _ = sock.set_nodelay(true);
        tokio::spawn(connection(sock, tx.clone()));
    }
}

async fn connection(mut sock: TcpStream, tx: broadcast::Sender<Bytes>) {
    let mut hello = [0u8; 1];
    if sock.read_exact(&mut hello).await.is_err() {
        return;
    }
    match hello[0] {
        READER => {
            let rx = tx.subscribe();
            if sock.write_all(&[READY]).await.is_ok() {
                serve(sock, rx).await;
            }
        }
        MUX_READER => {
            let Ok(streams) = sock.read_u32_le().await else {
                return;
            };
            if !(1..=mux::MAX_STREAMS).contains(&streams) {
                return;
            }
            let rx = tx.subscribe();
            if sock.write_all(&[READY]).await.is_ok() {
                mux::serve(sock, rx, streams).await;
            }
        }
        WRITER => {
            let Ok(frame) = sock.read_u32_le().await else {
                return;
            };
            if (16..=MAX_FRAME).contains(&frame) {
                ingest(sock, tx, frame as usize).await;
            }
        }
        _ => {}
    }
}

/// Reads the writer's frames and broadcasts every batch of whole ones; stops reading (so TCP
/// pushes back on the writer) while the slowest reader is more than `BEHIND` batches behind.
async fn ingest(mut sock: TcpStream, tx: broadcast::Sender<Bytes>, frame: usize) {
    let mut buf = BytesMut::with_capacity(MAX_WRITE + frame);
    loop {
        while tx.len() > BEHIND {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if buf.capacity() - buf.len() < frame {
            buf.reserve(MAX_WRITE + frame);
        }
        match sock.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let whole = buf.len() / frame * frame;
        if whole > 0 {
            let _ = tx.send(buf.split_to(whole).freeze());
        }
    }
}

async fn serve(mut sock: TcpStream, mut rx: broadcast::Receiver<Bytes>) {
    let mut buf = BytesMut::with_capacity(MAX_WRITE);
    loop {
        let first = match rx.recv().await {
            Ok(b) => b,
            // A lagging connection loses frames: the receiver counts the gap.
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let r = if rx.is_empty() || first.len() >= MAX_WRITE {
            sock.write_all(&first).await
        } else {
            buf.clear();
            buf.extend_from_slice(&first);
            while buf.len() < MAX_WRITE {
                match rx.try_recv() {
                    Ok(b) => buf.extend_from_slice(&b),
                    Err(_) => break,
                }
            }
            sock.write_all(&buf).await
        };
        if r.is_err() {
            return;
        }
    }
}

/// The raw server as a child process of the load generator; killed when dropped.
pub struct RawChild {
    child: tokio::process::Child,
    pub addr: SocketAddr,
    pub pid: u32,
}

impl RawChild {
    /// Spawns this executable as `raw-server` on a free loopback port (pinned with
    /// `taskset -c` to `cpus` when given) and waits until it listens.
    pub async fn spawn(cpus: Option<&str>) -> Result<Self> {
        let exe = std::env::current_exe().context("locating svc-loadtest")?;
        let args = ["raw-server", "--listen", "127.0.0.1:0", "--exit-with-stdin"];
        let mut cmd = match cpus {
            Some(cpus) => {
                let mut c = tokio::process::Command::new("taskset");
                c.args(["-c", cpus]).arg(exe).args(args);
                c
            }
            None => {
                let mut c = tokio::process::Command::new(exe);
                c.args(args);
                c
            }
        };
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| match cpus {
                Some(c) => format!("spawning raw-server under taskset -c {c}"),
                None => "spawning raw-server".into(),
            })?;
        let pid = child.id().context("raw-server exited at once")?;
        let stdout = child.stdout.take().context("raw-server stdout")?;
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .map_err(|_| anyhow!("raw-server did not start within 10 s"))??;
        let addr: SocketAddr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| anyhow!("raw-server said {line:?}"))?;
        Ok(RawChild { child, addr, pid })
    }

    /// Kills the server and reaps it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// A reader connection, returned once the server has subscribed it (so it sees every frame
/// the writer sends afterwards).
pub async fn connect_reader(addr: SocketAddr) -> Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    s.write_all(&[READER]).await?;
    let mut ok = [0u8; 1];
    s.read_exact(&mut ok).await?;
    if ok[0] != READY {
        bail!("raw-server answered {:?}", ok[0]);
    }
    Ok(s)
}

/// A multiplexed reader connection carrying `streams` logical streams, returned once the
/// server has subscribed it.
pub async fn connect_mux(addr: SocketAddr, streams: u32) -> Result<TcpStream> {
    if !(1..=mux::MAX_STREAMS).contains(&streams) {
        bail!(
            "raw-mux: {streams} streams on one connection (1 to {})",
            mux::MAX_STREAMS
        );
    }
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mut hello = [MUX_READER; 5];
    hello[1..].copy_from_slice(&streams.to_le_bytes());
    s.write_all(&hello).await?;
    let mut ok = [0u8; 1];
    s.read_exact(&mut ok).await?;
    if ok[0] != READY {
        bail!("raw-server answered {:?}", ok[0]);
    }
    Ok(s)
}

/// Sends frames to the server until `stop`: at `rate` frames/s, or as fast as the server
/// takes them (it pushes back while its slowest reader is behind) when `rate` is None. A
/// frame counts as written once the socket took it.
pub async fn produce(
    addr: SocketAddr,
    frame: usize,
    rate: Option<f64>,
    stop: watch::Receiver<bool>,
    live: Arc<Live>,
) -> Result<u64> {
    let frame = frame.clamp(16, MAX_FRAME as usize);
    let mut sock = TcpStream::connect(addr).await?;
    sock.set_nodelay(true)?;
    sock.write_all(&[WRITER]).await?;
    sock.write_u32_le(frame as u32).await?;
    let start = Instant::now();
    let mut seq: u64 = 0;
    let per_batch_max = (MAX_WRITE / frame).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut b = BytesMut::with_capacity(per_batch_max * frame);
    while !*stop.borrow() {
        let n = match rate {
            Some(r) => {
                tick.tick().await;
                let due = (start.elapsed().as_secs_f64() * r) as u64;
                (due.saturating_sub(seq) as usize).min(per_batch_max * 64)
            }
            None => per_batch_max,
        };
        let mut left = n;
        while left > 0 {
            let k = left.min(per_batch_max);
            let ts = now_nanos();
            b.clear();
            for i in 0..k as u64 {
                b.put_u64_le(seq + i);
                b.put_u64_le(ts);
                b.put_bytes(b'x', frame - 16);
            }
            let t0 = Instant::now();
            sock.write_all(&b).await?;
            seq += k as u64;
            live.writes.fetch_add(k as u64, Relaxed);
            // The socket taking the batch is the raw writer's acknowledgement.
            live.record_writes(t0.elapsed().as_micros() as u64, k as u64);
            left -= k;
        }
    }
    Ok(seq)
}
