//! The byte budget of an h2 connection's watches: what they hold outside the cache's ring.
//!
//! A watch's frames are shared while they wait in the cache's ring. They become the
//! connection's own once drained: a batch coalesced for one stream, then queued in h2 until
//! the socket takes it. A client that reads slower than events arrive would otherwise make
//! every one of its streams hold a batch and h2's per-stream buffer, multiplied by its streams
//! (4 GiB at 50,000 watchers in the overload that found it).
//!
//! [`Ledger`] counts those bytes per connection: bytes handed to h2 and not yet written, and
//! chunks a watch drained but could not hand over yet. [`LedgerIo`] wraps the connection's
//! socket and reads the frame headers h2 writes, so each DATA frame written for a watch
//! stream is credited back. Once [`WATCH_BUDGET`] bytes wait in h2 for the socket, the
//! connection's watches stop draining: their events wait in the ring, shared, and a watch
//! that falls out of the ring's history ends with the cache's 410, as a slow watcher does in
//! kube-apiserver. Draining resumes once the socket has taken the queue down to half.
//!
//! Only what waits for the socket counts against the budget. A watch drains no more than its
//! stream's flow-control window lets out (`h2conn.rs`), so what h2 holds always waits for the
//! socket alone; a stream whose client leaves its window shut keeps its events in the ring
//! (only an event larger than the room it had waits in a chunk of its own), and must not
//! stop the connection's other streams, as h2's flow control means it not to.

use std::collections::HashMap;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes an h2 connection's watches may have waiting in h2 for the socket before they stop
/// draining. The kernel's socket buffer (megabytes, on a fast link) fills first, so this only
/// keeps it fed; 500 connections hold at most 128 MiB together. A connection holds at
/// most this and the one batch that reached it, plus, per stream, the part of one event
/// larger than its window's room.
pub const WATCH_BUDGET: usize = 256 * 1024;

/// DATA, in an h2 frame header's type octet.
const DATA: u8 = 0;
/// An h2 frame header: 24-bit length, type, flags, 31-bit stream id.
const HEADER_LEN: usize = 9;

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// `State::streams`' sum: what waits for the socket, against the budget. Changed under
    /// the lock; read without it by the common case of [`Ledger::spent`].
    queued: AtomicUsize,
}

#[derive(Default)]
struct State {
    /// Per watch stream: bytes handed to h2 and not yet written.
    streams: HashMap<u32, usize>,
    /// Everything the connection's watches hold: `queued` and the chunks not yet handed to
    /// h2 (the gauge's share).
    held: usize,
    /// Watches that found the budget spent, woken when it is half free again.
    blocked: Vec<Waker>,
    /// How many times `blocked` was woken: a watch polled again while still parked does
    /// not file its waker twice.
    wakes: u64,
}

/// One h2 connection's count of what its watches hold; shared by its watches and its socket.
#[derive(Clone)]
pub struct Ledger {
    state: Arc<Shared>,
    /// Every connection's held bytes together (`svc_http2_watch_held_bytes`).
    gauge: Gauge,
}

impl Ledger {
    pub fn new(gauge: Gauge) -> Self {
        Ledger {
            state: Arc::default(),
            gauge,
        }
    }

    /// True when the budget is spent: the caller must not drain, and is woken when it may.
    /// `parked` is the caller's own record of where its waker was filed.
    pub fn spent(&self, cx: &Context<'_>, parked: &mut Option<u64>) -> bool {
        if self.state.queued.load(Ordering::Acquire) < WATCH_BUDGET {
            return false;
        }
        // Checked again under the lock, which every decrease and its wake-ups take.
        let mut s = self.state.state.lock();
        if self.state.queued.load(Ordering::Acquire) < WATCH_BUDGET {
            return false;
        }
        if *parked != Some(s.wakes) {
            *parked = Some(s.wakes);
            s.blocked.push(cx.waker().clone());
        }
        true
    }

    /// A watch drained a chunk of `n` bytes.
    pub fn hold(&self, n: usize) {
        let mut s = self.state.state.lock();
        s.held = s.held.saturating_add(n);
        self.gauge.inc_by(gauge_value(n));
    }

    /// `n` bytes of a held chunk went to h2 on stream `id`: still held until written.
    pub fn handed(&self, id: u32, n: usize) {
        let mut s = self.state.state.lock();
        self.queue(&mut s, id, n);
    }

    /// A watch drained `n` bytes and handed them all to h2 at once (`hold` and `handed`).
    pub fn sent(&self, id: u32, n: usize) {
        let mut s = self.state.state.lock();
        s.held = s.held.saturating_add(n);
        self.gauge.inc_by(gauge_value(n));
        self.queue(&mut s, id, n);
    }

    fn queue(&self, s: &mut State, id: u32, n: usize) {
        let queued = s.streams.entry(id).or_default();
        *queued = queued.saturating_add(n);
        let _ = self
            .state
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_add(n))
            });
    }

    fn unqueue(&self, n: usize) {
        let _ = self
            .state
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_sub(n))
            });
    }

    /// A watch ends: what it held and what h2 had not written for it (h2 drops a reset
    /// stream's queue) are freed.
    pub fn end(&self, id: u32, unsent: usize) {
        let mut s = self.state.state.lock();
        let queued = s.streams.remove(&id).unwrap_or(0);
        self.unqueue(queued);
        let freed = queued.saturating_add(unsent);
        self.free(&mut s, freed);
    }

    /// `n` payload bytes of a DATA frame on stream `id` went to the socket.
    fn written(&self, id: u32, n: usize) {
        let mut s = self.state.state.lock();
        let Some(queued) = s.streams.get_mut(&id) else {
            // Not a watch stream (a list, a proxied response): not counted.
            return;
        };
        let freed = n.min(*queued);
        *queued = queued.saturating_sub(freed);
        self.unqueue(freed);
        self.free(&mut s, freed);
    }

    fn free(&self, s: &mut State, n: usize) {
        if n == 0 {
            return;
        }
        s.held = s.held.saturating_sub(n);
        self.gauge.dec_by(gauge_value(n));
        if !s.blocked.is_empty() && self.state.queued.load(Ordering::Acquire) <= WATCH_BUDGET / 2 {
            s.wakes = s.wakes.wrapping_add(1);
            for w in s.blocked.drain(..) {
                w.wake();
            }
        }
    }

    /// The bytes held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.state.state.lock().held
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        // The last handle (the socket's or a watch's) gives the connection's share back.
        if Arc::strong_count(&self.state) == 1 {
            let held = self.state.state.lock().held;
            self.gauge.dec_by(gauge_value(held));
        }
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Follows the frames h2 writes, across writes that split them anywhere, and credits each
/// DATA frame's payload to its stream.
#[derive(Default)]
struct FrameReader {
    header: [u8; HEADER_LEN],
    /// Header bytes read so far.
    have: usize,
    /// Payload bytes of the current frame still to pass.
    payload_left: usize,
}

impl FrameReader {
    /// Reads `bytes`, the next bytes on the wire; calls `data(stream, len)` for each DATA
    /// frame whose header completes.
    fn read(&mut self, mut bytes: &[u8], data: &mut impl FnMut(u32, usize)) {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let skip = self.payload_left.min(bytes.len());
                self.payload_left = self.payload_left.saturating_sub(skip);
                bytes = bytes.get(skip..).unwrap_or_default();
                continue;
            }
            let take = HEADER_LEN.saturating_sub(self.have).min(bytes.len());
            let (head, rest) = bytes.split_at(take);
            if let Some(dst) = self
                .header
                .get_mut(self.have..self.have.saturating_add(take))
            {
                dst.copy_from_slice(head);
            }
            self.have = self.have.saturating_add(take);
            bytes = rest;
            if self.have == HEADER_LEN {
                self.have = 0;
                let [l0, l1, l2, kind, _flags, s0, s1, s2, s3] = self.header;
                let len = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
                let stream = u32::from_be_bytes([s0 & 0x7f, s1, s2, s3]);
                if kind == DATA && len > 0 {
                    data(stream, len);
                }
                self.payload_left = len;
            }
        }
    }
}

/// The connection's socket, as h2 writes to it: every byte written goes through a
/// [`FrameReader`] that credits the [`Ledger`].
pub struct LedgerIo<I> {
    io: I,
    ledger: Ledger,
    frames: FrameReader,
}

impl<I> LedgerIo<I> {
    pub fn new(io: I, ledger: Ledger) -> Self {
        LedgerIo {
            io,
            ledger,
            frames: FrameReader::default(),
        }
    }

    fn wrote(&mut self, bufs: &[IoSlice<'_>], mut n: usize) {
        let ledger = &self.ledger;
        for b in bufs {
            if n == 0 {
                break;
            }
            let part = b.get(..n.min(b.len())).unwrap_or_default();
            n = n.saturating_sub(part.len());
            self.frames
                .read(part, &mut |stream, len| ledger.written(stream, len));
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for LedgerIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for LedgerIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.wrote(&[IoSlice::new(buf)], n);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.wrote(bufs, n);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A waker that counts its wake-ups, for the serve layer's unit tests.
#[cfg(test)]
pub(crate) fn counting_waker() -> (Arc<AtomicUsize>, Waker) {
    struct Count(Arc<AtomicUsize>);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let woken = Arc::new(AtomicUsize::new(0));
    (woken.clone(), Waker::from(Arc::new(Count(woken))))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::arithmetic_side_effects)]
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, 0];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn wire() -> Vec<u8> {
        let mut w = frame(4, 0, &[0; 6]); // SETTINGS
        w.extend(frame(1, 3, &[7; 20])); // HEADERS
        w.extend(frame(DATA, 3, &[1; 100]));
        w.extend(frame(DATA, 5, &[2; 3000]));
        w.extend(frame(6, 0, &[0; 8])); // PING
        w.extend(frame(DATA, 3, &[])); // end of stream
        w.extend(frame(DATA, 3, &[3; 17]));
        w
    }

    #[test]
    fn data_frames_are_credited_however_the_writes_split_them() {
        let w = wire();
        for chunk in [1, 2, 5, 9, 10, 64, 1000, w.len()] {
            let mut r = FrameReader::default();
            let mut seen = Vec::new();
            for part in w.chunks(chunk) {
                r.read(part, &mut |s, n| seen.push((s, n)));
            }
            assert_eq!(seen, vec![(3, 100), (5, 3000), (3, 17)], "chunk {chunk}");
        }
    }

    #[test]
    fn the_budget_stops_drains_until_the_socket_takes_half() {
        let gauge = Gauge::default();
        let ledger = Ledger::new(gauge.clone());
        let (woken, waker) = counting_waker();
        let cx = Context::from_waker(&waker);
        let (mut a, mut b) = (None, None);
        assert!(!ledger.spent(&cx, &mut a));
        ledger.hold(WATCH_BUDGET);
        ledger.handed(3, WATCH_BUDGET);
        assert!(ledger.spent(&cx, &mut a));
        assert!(ledger.spent(&cx, &mut b));
        // Asked again while parked: filed once.
        assert!(ledger.spent(&cx, &mut a));
        assert_eq!(ledger.state.state.lock().blocked.len(), 2);
        assert_eq!(gauge.get(), WATCH_BUDGET as i64);

        // A quarter written: new drains may go on, but the parked are not woken yet.
        ledger.written(3, WATCH_BUDGET / 4);
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 0);
        // Half written: the blocked watches are woken.
        ledger.written(3, WATCH_BUDGET / 4);
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert!(!ledger.spent(&cx, &mut a));
        // Frames of streams that are not watches do not count.
        ledger.written(9, 1000);
        assert_eq!(ledger.held(), WATCH_BUDGET / 2);
        // A chunk waiting for its stream's window is held, but does not spend the budget.
        ledger.hold(WATCH_BUDGET);
        assert!(!ledger.spent(&cx, &mut a));
        assert_eq!(gauge.get(), (WATCH_BUDGET + WATCH_BUDGET / 2) as i64);
        // A stream that ends frees what h2 had not written and the chunk it held.
        ledger.end(3, WATCH_BUDGET);
        assert_eq!(ledger.held(), 0);
        assert_eq!(gauge.get(), 0);
    }

    #[test]
    fn a_dropped_connection_gives_its_share_back() {
        let gauge = Gauge::default();
        let ledger = Ledger::new(gauge.clone());
        let other = ledger.clone();
        ledger.hold(4096);
        drop(ledger);
        assert_eq!(gauge.get(), 4096);
        drop(other);
        assert_eq!(gauge.get(), 0);
    }
}
