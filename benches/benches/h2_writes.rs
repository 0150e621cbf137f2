//! What an h2 connection's round costs at its socket: 100 DATA frames of one event each (a
//! 9-byte head and 450 bytes), written the way the h2 crate writes frames over 256 bytes
//! (one write and one flush per frame), through the gateway's `LedgerIo` into a real Unix
//! socket whose other end a thread drains.
//!
//! Measures `h2_writes/round_of_100_frames/{per_frame,gathered,framed_on_the_wire}`:
//! `per_frame` with no round open (every flush goes to the socket: one system call per frame,
//! as before the gathering); `gathered` with the round open, closed after the last frame and
//! flushed once (one system call per round); `framed_on_the_wire` with the payloads framed by
//! the gateway's own wire (`serve/h2wire.rs`) as its watches frame them since the h2 crate no
//! longer carries them: per stream the room asked for and one event framed, then one flush
//! that splices the frames into the output and writes them. Throughput is in frames.
//!
//! Run: `cargo bench -p svc-benches --bench h2_writes`
//!
//! Results (2 shared cores, AMD EPYC KVM guest, noisy; 2026-11-27; criterion's median):
//! - `per_frame`: 94.8 µs a round (1.05 M frames/s), 100.0 socket writes a round;
//! - `gathered`: 7.69 µs a round (13.0 M frames/s), 1.0 socket write a round: 12.3× less.
//!
//! 2026-11-29, same machine, one run:
//! - `per_frame` 133.5 µs, `gathered` 12.6 µs, `framed_on_the_wire` 11.5 µs a round (8.7 M
//!   frames/s, 0.115 µs a frame for the room, the framing, the splice and the socket's
//!   share), 1.0 socket write a round.
//!
//! A Unix socket costs less per write than the loopback TCP the gateway serves on, so the
//! gap at a real connection is wider, not narrower.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io::Read;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use prometheus_client::metrics::gauge::Gauge;
use svc_gateway::observe::metrics::striped::StripedCounter;
use svc_gateway::serve::h2ledger::{Ledger, LedgerIo, Round};
use svc_gateway::serve::h2wire::{Inbound, Limit, Outbound, Room, Wire};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

const FRAMES: usize = 100;
const PAYLOAD: usize = 450;

/// One DATA frame on stream `id`: head and payload.
fn frame(id: u32) -> Vec<u8> {
    let mut f = vec![
        (PAYLOAD >> 16) as u8,
        (PAYLOAD >> 8) as u8,
        PAYLOAD as u8,
        0,
        0,
    ];
    f.extend_from_slice(&id.to_be_bytes());
    f.extend(std::iter::repeat_n(b'x', PAYLOAD));
    f
}

/// A Unix socket whose other end a thread drains; the thread returns the bytes it read once
/// the socket is shut down.
fn drained_socket(rt: &tokio::runtime::Runtime) -> (UnixStream, std::thread::JoinHandle<usize>) {
    let (ours, theirs) = rt.block_on(async { UnixStream::pair().unwrap() });
    let mut theirs = theirs.into_std().unwrap();
    theirs.set_nonblocking(false).unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0usize;
        loop {
            match theirs.read(&mut buf) {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n,
            }
        }
    });
    (ours, reader)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let frames: Vec<Vec<u8>> = (0..FRAMES as u32).map(|i| frame(2 * i + 1)).collect();
    let mut g = c.benchmark_group("h2_writes");
    g.throughput(Throughput::Elements(FRAMES as u64));
    g.measurement_time(Duration::from_secs(3));
    for gathered in [false, true] {
        let (ours, reader) = drained_socket(&rt);
        let writes = StripedCounter::default();
        let round = Round::default();
        let mut io = LedgerIo::new(
            ours,
            Ledger::new(Gauge::default(), writes.clone(), StripedCounter::default()),
            round.clone(),
            Wire::default(),
        );
        let name = if gathered { "gathered" } else { "per_frame" };
        let mut rounds = 0u64;
        g.bench_function(BenchmarkId::new("round_of_100_frames", name), |b| {
            b.iter(|| {
                rt.block_on(async {
                    if gathered {
                        round.open();
                    }
                    for f in &frames {
                        io.write_all(f).await.unwrap();
                        io.flush().await.unwrap();
                    }
                    round.close();
                    io.flush().await.unwrap();
                });
                rounds += 1;
            })
        });
        rt.block_on(async { io.shutdown().await.unwrap() });
        drop(io);
        let read = reader.join().unwrap();
        assert_eq!(
            read,
            rounds as usize * FRAMES * (9 + PAYLOAD),
            "{name}: every byte arrived"
        );
        let per_round = writes.get() as f64 / rounds as f64;
        println!("{name}: {per_round:.1} socket writes per round of {FRAMES} frames");
        if gathered {
            assert!(per_round < 2.0, "{per_round}");
        } else {
            assert!(per_round >= FRAMES as f64, "{per_round}");
        }
    }
    g.finish();
}

/// A frame header.
fn head(kind: u8, flags: u8, id: u32, len: usize) -> Vec<u8> {
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&id.to_be_bytes());
    f
}

/// The same round with the payloads framed by the gateway's wire (`h2wire.rs`), as its
/// watches frame them: per stream the room asked for and one event framed, then one flush
/// that splices them into the output and writes them.
fn framed(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wire = Wire::default();
    // The client's side, as the wire reads it: huge windows, FRAMES streams opened.
    let mut client = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    client.extend(head(4, 0, 0, 6));
    client.extend([0, 4, 0x7f, 0xff, 0xff, 0xff]);
    for i in 0..FRAMES as u32 {
        client.extend(head(1, 4, 2 * i + 1, 1));
        client.push(0x82);
    }
    let mut inbound = Inbound::new(wire.clone());
    let mut seen = Vec::new();
    inbound.feed(&client, &mut seen);
    let mut outbound = Outbound::default();
    for i in 0..FRAMES as u32 {
        let mut h = head(1, 4, 2 * i + 1, 1);
        h.push(0x88);
        outbound.feed(&h, &wire);
    }
    let topup = |inbound: &mut Inbound| {
        let mut u = head(8, 0, 0, 4);
        u.extend_from_slice(&(1u32 << 30).to_be_bytes());
        inbound.feed(&u, &mut Vec::new());
    };
    let (ours, reader) = drained_socket(&rt);
    let writes = StripedCounter::default();
    let round = Round::default();
    let mut io = LedgerIo::new(
        ours,
        Ledger::new(Gauge::default(), writes.clone(), StripedCounter::default()),
        round.clone(),
        wire.clone(),
    );
    let event = bytes::Bytes::from(vec![b'x'; PAYLOAD]);
    let mut g = c.benchmark_group("h2_writes");
    g.throughput(Throughput::Elements(FRAMES as u64));
    g.measurement_time(Duration::from_secs(3));
    let mut rounds = 0u64;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    g.bench_function(
        BenchmarkId::new("round_of_100_frames", "framed_on_the_wire"),
        |b| {
            b.iter(|| {
                if rounds.is_multiple_of(1000) {
                    topup(&mut inbound);
                }
                round.open();
                wire.open_round();
                for i in 0..FRAMES as u32 {
                    let id = 2 * i + 1;
                    let std::task::Poll::Ready(Room::Bytes(n)) =
                        wire.poll_room(&cx, id, PAYLOAD, Limit::Round)
                    else {
                        panic!("no room on stream {id}");
                    };
                    wire.frame(id, std::slice::from_ref(&event), n, false);
                }
                round.close();
                rt.block_on(async { io.flush().await.unwrap() });
                let _ = &mut cx;
                rounds += 1;
            })
        },
    );
    g.finish();
    rt.block_on(async { io.shutdown().await.unwrap() });
    drop(io);
    let read = reader.join().unwrap();
    assert_eq!(
        read,
        rounds as usize * FRAMES * (9 + PAYLOAD),
        "every framed byte arrived"
    );
    let per_round = writes.get() as f64 / rounds as f64;
    println!("framed_on_the_wire: {per_round:.1} socket writes per round of {FRAMES} frames");
    assert!(per_round < 2.0, "{per_round}");
}

criterion_group!(benches, bench, framed);
criterion_main!(benches);
