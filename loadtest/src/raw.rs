//! The raw baseline: a minimal fan-out server on 127.0.0.1 sending fixed-size frames to N
//! connections, coalescing each connection's pending frames into one write of up to 64 KiB.
//! It does no encoding, no storage and no bookkeeping: the hardware ceiling beside every
//! server figure.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch};

use crate::stats::{Live, now_nanos};

pub const MAX_WRITE: usize = 64 * 1024;

pub struct RawServer {
    pub addr: std::net::SocketAddr,
    pub tx: broadcast::Sender<Bytes>,
}

/// Binds the listener and serves every accepted connection from one broadcast channel.
pub async fn start(stop: watch::Receiver<bool>) -> Result<RawServer> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    // 256 batches of up to 64 KiB: a slow receiver may fall 16 MiB behind before it lags.
    let (tx, _) = broadcast::channel::<Bytes>(256);
    let tx2 = tx.clone();
    let mut stop2 = stop.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = listener.accept() => {
                    let Ok((sock, _)) = r else { continue };
                    let _ = sock.set_nodelay(true);
                    tokio::spawn(serve(sock, tx2.subscribe()));
                }
                _ = stop2.changed() => return,
            }
        }
    });
    Ok(RawServer { addr, tx })
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

/// Produces frames until `stop`: at `rate` frames/s, or as fast as the slowest receiver
/// allows (batches of 64 KiB) when `rate` is None. Returns the number of frames sent.
pub async fn produce(
    tx: broadcast::Sender<Bytes>,
    frame: usize,
    rate: Option<f64>,
    stop: watch::Receiver<bool>,
    live: Arc<Live>,
) -> u64 {
    let frame = frame.max(16);
    let start = Instant::now();
    let mut seq: u64 = 0;
    let per_batch_max = (MAX_WRITE / frame).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while !*stop.borrow() {
        let n = match rate {
            Some(r) => {
                tick.tick().await;
                let due = (start.elapsed().as_secs_f64() * r) as u64;
                (due.saturating_sub(seq) as usize).min(per_batch_max * 64)
            }
            None => {
                // Pace by the slowest receiver instead of letting it lag.
                while tx.len() > 64 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                per_batch_max
            }
        };
        let mut left = n;
        while left > 0 {
            let k = left.min(per_batch_max);
            let ts = now_nanos();
            let mut b = BytesMut::with_capacity(k * frame);
            for _ in 0..k {
                b.put_u64_le(seq);
                b.put_u64_le(ts);
                b.put_bytes(b'x', frame - 16);
                seq += 1;
            }
            let _ = tx.send(b.freeze());
            live.writes.fetch_add(k as u64, Relaxed);
            left -= k;
        }
        if rate.is_none() {
            tokio::task::yield_now().await;
        }
    }
    seq
}
