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

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::observe::metrics::striped::StripedCounter;
use crate::serve::h2wire::{
    DATA, FrameHeads, INBOUND_CARRY, Inbound, Outbound, Sink, StreamIds, Wire,
};

/// Bytes an h2 connection's watches may have waiting in h2 for the socket before they stop
/// draining. The kernel's socket buffer (megabytes, on a fast link) fills first, so this only
/// keeps it fed; 500 connections hold at most 128 MiB together. A connection holds at
/// most this and the one batch that reached it, plus, per stream, the part of one event
/// larger than its window's room.
pub const WATCH_BUDGET: usize = 256 * 1024;

/// How far the gauge may lag behind what a connection holds (see `State::reported`).
const GAUGE_SLACK: usize = 64 * 1024;

struct Shared {
    state: Mutex<State>,
    /// `State::streams`' sum: what waits for the socket, against the budget. Changed under
    /// the lock; read without it by the common case of [`Ledger::spent`].
    queued: AtomicUsize,
    /// Every connection's held bytes together (`svc_http2_watch_held_bytes`).
    gauge: Gauge,
    /// Every connection's writes to its transport (`svc_http2_writes_total`).
    writes: StripedCounter,
    /// Those the transport took only part of (`svc_http2_short_writes_total`): its buffer was
    /// full, the reader behind.
    short: StripedCounter,
}

#[derive(Default)]
struct State {
    /// Per watch stream: bytes handed to h2 and not yet written.
    streams: HashMap<u32, usize, StreamIds>,
    /// Their sum, published in [`Shared::queued`].
    queued: usize,
    /// Everything the connection's watches hold: `queued` and the chunks not yet handed to
    /// h2 (the gauge's share).
    held: usize,
    /// What the gauge was last told of `held`: it is told once the two drift more than
    /// [`GAUGE_SLACK`] apart, and exactly when a watch ends, not once per frame (the gauge
    /// is every connection's, one cache line the cores would pass back and forth).
    reported: usize,
    /// Watches that found the budget spent, woken when it is half free again.
    blocked: Vec<Waker>,
    /// How many times `blocked` was woken: a watch polled again while still parked does
    /// not file its waker twice.
    wakes: u64,
}

/// One h2 connection's count of what its watches hold; shared by its watches and its socket.
/// One pointer: every watch of a million keeps a handle.
#[derive(Clone)]
pub struct Ledger {
    state: Arc<Shared>,
}

impl Ledger {
    /// A ledger telling `gauge` what the connection holds, and counting its transport's
    /// writes in `writes` and those it took only part of in `short`.
    pub fn new(gauge: Gauge, writes: StripedCounter, short: StripedCounter) -> Self {
        Ledger {
            state: Arc::new(Shared {
                state: Mutex::default(),
                queued: AtomicUsize::new(0),
                gauge,
                writes,
                short,
            }),
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

    /// What the budget has left (0 once spent), read without the lock.
    pub fn room(&self) -> usize {
        WATCH_BUDGET.saturating_sub(self.state.queued.load(Ordering::Acquire))
    }

    /// A watch drained a chunk of `n` bytes.
    pub fn hold(&self, n: usize) {
        let mut s = self.state.state.lock();
        s.held = s.held.saturating_add(n);
        self.report(&mut s, GAUGE_SLACK);
    }

    /// `n` bytes of a held chunk went to h2 on stream `id`: still held until written.
    pub fn handed(&self, id: u32, n: usize) {
        let mut s = self.state.state.lock();
        self.queue(&mut s, id, n);
    }

    /// A watch drained `n` bytes and handed them all to h2 at once (`hold` and `handed`).
    pub fn sent(&self, id: u32, n: usize) {
        self.sent_each(std::iter::once(id), n);
    }

    /// Each stream of `ids` was handed `n` drained bytes at once (`sent`, under one lock).
    pub fn sent_each(&self, ids: impl Iterator<Item = u32>, n: usize) {
        let mut s = self.state.state.lock();
        for id in ids {
            s.held = s.held.saturating_add(n);
            self.queue(&mut s, id, n);
        }
        self.report(&mut s, GAUGE_SLACK);
    }

    fn queue(&self, s: &mut State, id: u32, n: usize) {
        let queued = s.streams.entry(id).or_default();
        *queued = queued.saturating_add(n);
        s.queued = s.queued.saturating_add(n);
        self.state.queued.store(s.queued, Ordering::Release);
    }

    fn unqueue(&self, s: &mut State, n: usize) {
        s.queued = s.queued.saturating_sub(n);
        self.state.queued.store(s.queued, Ordering::Release);
    }

    /// Tells the gauge what `held` became, once it drifted more than `slack` from what it
    /// was told last.
    fn report(&self, s: &mut State, slack: usize) {
        if s.held.abs_diff(s.reported) > slack {
            if s.held > s.reported {
                self.state
                    .gauge
                    .inc_by(gauge_value(s.held.saturating_sub(s.reported)));
            } else {
                self.state
                    .gauge
                    .dec_by(gauge_value(s.reported.saturating_sub(s.held)));
            }
            s.reported = s.held;
        }
    }

    /// A watch ends: what it held and what h2 had not written for it (h2 drops a reset
    /// stream's queue) are freed.
    pub fn end(&self, id: u32, unsent: usize) {
        let mut s = self.state.state.lock();
        let queued = s.streams.remove(&id).unwrap_or(0);
        self.unqueue(&mut s, queued);
        let freed = queued.saturating_add(unsent);
        self.free(&mut s, freed);
        self.report(&mut s, 0);
    }

    /// `n` payload bytes of a DATA frame on stream `id` went to the socket.
    fn written(&self, s: &mut State, id: u32, n: usize) {
        let Some(queued) = s.streams.get_mut(&id) else {
            // Not a watch stream (a list, a proxied response): not counted.
            return;
        };
        let freed = n.min(*queued);
        *queued = queued.saturating_sub(freed);
        self.unqueue(s, freed);
        self.free(s, freed);
    }

    fn free(&self, s: &mut State, n: usize) {
        if n == 0 {
            return;
        }
        s.held = s.held.saturating_sub(n);
        if !s.blocked.is_empty() && s.queued <= WATCH_BUDGET / 2 {
            s.wakes = s.wakes.wrapping_add(1);
            for w in s.blocked.drain(..) {
                w.wake();
            }
        }
    }

    /// Credits one DATA frame written, as a socket write carrying only it would.
    #[cfg(test)]
    fn written_one(&self, id: u32, n: usize) {
        let mut s = self.state.state.lock();
        self.written(&mut s, id, n);
        self.report(&mut s, GAUGE_SLACK);
    }

    /// The bytes held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.state.state.lock().held
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // With the last handle (the socket's or a watch's) the connection's share goes back.
        let reported = self.state.get_mut().reported;
        self.gauge.dec_by(gauge_value(reported));
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Follows the frames h2 writes, across writes that split them anywhere, and credits each
/// DATA frame's payload to its stream.
#[derive(Default)]
struct FrameReader(FrameHeads);

impl FrameReader {
    /// Reads `bytes`, which went to the socket, and credits their DATA frames to `ledger`.
    /// The ledger's lock is taken once for the whole write.
    fn credit(&mut self, bytes: &[u8], ledger: &Ledger, wire: &Wire) {
        let mut s = ledger.state.state.lock();
        let mut data = 0usize;
        self.read(bytes, &mut |stream, len| {
            data = data.saturating_add(len);
            ledger.written(&mut s, stream, len)
        });
        ledger.report(&mut s, GAUGE_SLACK);
        drop(s);
        wire.written(data);
    }

    /// Reads `bytes`, the next bytes on the wire; calls `data(stream, len)` for each DATA
    /// frame whose header completes.
    fn read(&mut self, bytes: &[u8], data: &mut impl FnMut(u32, usize)) {
        self.0.feed(bytes, |h| {
            if h.kind == DATA && h.len > 0 {
                data(h.stream, h.len);
            }
        });
    }
}

/// What a connection gathers of h2's writes during a round before passing them on: a write
/// that would take it past this first passes on what is gathered.
pub const GATHER: usize = 64 * 1024;

/// Whether the connection's task is in a round ([`Round::open`]) or ending it
/// ([`Round::close`]): in a round h2's flushes only gather, at its end they pass everything
/// on. Outside any round (the handshake, a connection closing) every flush passes through.
#[derive(Clone, Default)]
pub struct Round(Arc<AtomicBool>);

impl Round {
    pub fn open(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn close(&self) {
        self.0.store(false, Ordering::Relaxed);
    }

    pub fn is_open(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The connection's socket, as h2 writes to it.
///
/// Gathering: h2 flushes after every DATA frame larger than 256 bytes (it keeps one such
/// frame aside at a time, and flushes to take the next), so a round of its connection task
/// that moves one event into each of 100 streams would make 100 socket writes. Its writes
/// are copied here instead, and passed on in one write when the round ends (the connection
/// task closes its [`Round`] and lets h2 flush once more), or sooner once [`GATHER`] bytes
/// are waiting. Outside a round every flush passes through.
///
/// Every byte passed to the socket goes through a [`FrameReader`] that credits the
/// [`Ledger`]: what waits here still counts as waiting for the socket.
pub struct LedgerIo<I> {
    io: I,
    ledger: Ledger,
    frames: FrameReader,
    round: Round,
    /// Bytes h2 wrote and the socket has not taken yet, from `at` on; freed once passed on,
    /// so an idle connection holds none.
    out: Vec<u8>,
    at: usize,
    /// The connection's framed response bodies, spliced in between h2's frames.
    wire: Wire,
    /// The frames h2 writes, followed to find the places between them.
    outbound: Outbound,
    /// The client's frames, read before h2 sees them; what h2 is to see waits in `rd` from
    /// `rd_at` on.
    inbound: Inbound,
    rd: Vec<u8>,
    rd_at: usize,
}

/// What one read from the client's socket takes at most.
const READ_CHUNK: usize = 16 * 1024;

impl<I> LedgerIo<I> {
    pub fn new(io: I, ledger: Ledger, round: Round, wire: Wire) -> Self {
        LedgerIo {
            io,
            ledger,
            frames: FrameReader::default(),
            round,
            out: Vec::new(),
            at: 0,
            inbound: Inbound::new(wire.clone()),
            wire,
            outbound: Outbound::default(),
            rd: Vec::new(),
            rd_at: 0,
        }
    }

    /// Between two of h2's frames, what writers framed joins the output.
    fn splice(&mut self, cx: &Context<'_>) {
        if self.outbound.at_boundary() {
            self.wire.splice(&mut self.out, cx.waker());
        } else {
            self.wire.note_driver(cx.waker());
        }
    }

    fn waiting(&self) -> usize {
        self.out.len().saturating_sub(self.at)
    }

    /// Credits the DATA frames in `n` bytes of `bufs` that went to the socket.
    fn wrote(&mut self, bufs: &[IoSlice<'_>], mut n: usize) {
        for b in bufs {
            if n == 0 {
                break;
            }
            let part = b.get(..n.min(b.len())).unwrap_or_default();
            n = n.saturating_sub(part.len());
            self.frames.credit(part, &self.ledger, &self.wire);
        }
    }
}

impl<I: AsyncWrite + Unpin> LedgerIo<I> {
    /// Passes on everything gathered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.at < self.out.len() {
            let rest = self.out.get(self.at..).unwrap_or_default();
            let r = Pin::new(&mut self.io).poll_write(cx, rest);
            if r.is_ready() {
                self.ledger.state.writes.inc_by(1);
            }
            let n = match r {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => {
                    if n < rest.len() {
                        self.ledger.state.short.inc_by(1);
                    }
                    n
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            self.frames
                .credit(rest.get(..n).unwrap_or_default(), &self.ledger, &self.wire);
            self.at = self.at.saturating_add(n);
        }
        crate::serve::h2wire::spare::give(std::mem::take(&mut self.out));
        self.at = 0;
        Poll::Ready(Ok(()))
    }

    fn poll_gather(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.splice(cx);
        // Inside a frame, h2's bytes are taken only to its end: what writers framed goes in
        // there, before anything h2 wrote after it (an END_STREAM after a stream's last
        // bytes).
        let limit = self.outbound.to_frame_end();
        let total = bufs
            .iter()
            .fold(0usize, |n, b| n.saturating_add(b.len()))
            .min(limit);
        if self.waiting() > 0 && self.waiting().saturating_add(total) > GATHER {
            match self.poll_drain(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        if self.waiting() == 0 && total >= GATHER && limit == usize::MAX {
            // Large enough on its own: straight to the socket, no copy.
            let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
            if r.is_ready() {
                self.ledger.state.writes.inc_by(1);
            }
            if let Poll::Ready(Ok(n)) = r {
                if n < total {
                    self.ledger.state.short.inc_by(1);
                }
                self.wrote(bufs, n);
                self.follow(bufs, n);
            }
            return r;
        }
        if self.out.is_empty() {
            crate::serve::h2wire::spare::furnish(&mut self.out);
            self.out.reserve(GATHER.min(total.max(4096)));
        }
        let mut left = total;
        for b in bufs {
            let part = b.get(..left.min(b.len())).unwrap_or_default();
            self.out.extend_from_slice(part);
            left = left.saturating_sub(part.len());
        }
        self.follow(bufs, total);
        Poll::Ready(Ok(total))
    }

    /// Follows the frames in the first `n` bytes of `bufs`, which h2 wrote.
    fn follow(&mut self, bufs: &[IoSlice<'_>], mut n: usize) {
        for b in bufs {
            if n == 0 {
                break;
            }
            let part = b.get(..n.min(b.len())).unwrap_or_default();
            n = n.saturating_sub(part.len());
            self.outbound.feed(part, &self.wire);
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for LedgerIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.rd_at < this.rd.len() {
                let ready = this.rd.get(this.rd_at..).unwrap_or_default();
                let n = ready.len().min(buf.remaining());
                buf.put_slice(ready.get(..n).unwrap_or_default());
                this.rd_at = this.rd_at.saturating_add(n);
                if this.rd_at >= this.rd.len() {
                    this.rd = Vec::new();
                    this.rd_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            // What h2 is to see goes straight into its buffer: a read no larger than its
            // room (less what Inbound may add from earlier reads) never spills. Holding
            // each read in a buffer of its own left, at 1,000,000 watches, 400 MB of freed
            // 9 KiB buffers between the streams' allocations.
            let room = buf.remaining();
            let cap = if room > INBOUND_CARRY {
                room.saturating_sub(INBOUND_CARRY).min(READ_CHUNK)
            } else {
                READ_CHUNK
            };
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(chunk.get_mut(..cap).unwrap_or_default());
            match Pin::new(&mut this.io).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
            if read.filled().is_empty() {
                // The end: a frame the client left unfinished is h2's to notice.
                return Poll::Ready(Ok(()));
            }
            let before = buf.filled().len();
            this.inbound.feed(
                read.filled(),
                &mut Spill {
                    buf: &mut *buf,
                    rest: &mut this.rd,
                },
            );
            if buf.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
            // Nothing for h2 yet (the wire took every byte, or h2's buffer had no room):
            // read on, or hand over what spilled.
        }
    }
}

/// h2's read buffer, and after it, for what does not fit, the connection's own.
struct Spill<'a, 'b> {
    buf: &'a mut ReadBuf<'b>,
    rest: &'a mut Vec<u8>,
}

impl Sink for Spill<'_, '_> {
    fn put(&mut self, bytes: &[u8]) {
        let n = if self.rest.is_empty() {
            bytes.len().min(self.buf.remaining())
        } else {
            0
        };
        let (now, later) = bytes.split_at(n);
        self.buf.put_slice(now);
        self.rest.extend_from_slice(later);
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for LedgerIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_gather(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_gather(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.splice(cx);
        if self.round.is_open() && self.waiting() < GATHER {
            // Mid-round: the round's end passes it on.
            return Poll::Ready(Ok(()));
        }
        match self.poll_drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.io).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.splice(cx);
        match self.poll_drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.io).poll_shutdown(cx),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::arithmetic_side_effects)]
    use super::*;
    use crate::serve::h2wire::{HEADER_LEN, counting_waker};

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
        let ledger = ledger_on(gauge.clone());
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
        ledger.written_one(3, WATCH_BUDGET / 4);
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 0);
        // Half written: the blocked watches are woken.
        ledger.written_one(3, WATCH_BUDGET / 4);
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert!(!ledger.spent(&cx, &mut a));
        // Frames of streams that are not watches do not count.
        ledger.written_one(9, 1000);
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

    /// A socket that takes at most `room` bytes (then `Pending`), counting its writes.
    #[derive(Default)]
    struct Socket {
        room: usize,
        writes: usize,
        data: Vec<u8>,
    }

    impl Socket {
        /// A socket that takes everything.
        fn open() -> Self {
            Socket {
                room: usize::MAX,
                ..Socket::default()
            }
        }
    }

    impl AsyncWrite for Socket {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.room);
            if n == 0 {
                return Poll::Pending;
            }
            self.room -= n;
            self.writes += 1;
            self.data.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Writes each frame of `wire()` as h2 does (head and payload in one vectored write, then
    /// a flush); every call must complete at once.
    fn write_frames(io: &mut LedgerIo<Socket>, cx: &mut Context<'_>) {
        let w = wire();
        let mut rest = &w[..];
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let (head, tail) = rest.split_at(HEADER_LEN);
            let (payload, tail) = tail.split_at(len);
            let bufs = [IoSlice::new(head), IoSlice::new(payload)];
            let n = match Pin::new(&mut *io).poll_write_vectored(cx, &bufs) {
                Poll::Ready(Ok(n)) => n,
                other => panic!("{other:?}"),
            };
            assert_eq!(n, HEADER_LEN + len);
            assert!(Pin::new(&mut *io).poll_flush(cx).is_ready());
            rest = tail;
        }
    }

    /// A ledger telling `gauge`, its writes counted nowhere.
    fn ledger_on(gauge: Gauge) -> Ledger {
        Ledger::new(gauge, StripedCounter::default(), StripedCounter::default())
    }

    fn ledger_with_watches() -> (Ledger, StripedCounter) {
        ledger_counting_short_writes(StripedCounter::default())
    }

    fn ledger_counting_short_writes(short: StripedCounter) -> (Ledger, StripedCounter) {
        let writes = StripedCounter::default();
        let ledger = Ledger::new(Gauge::default(), writes.clone(), short);
        ledger.sent(3, 117);
        ledger.sent(5, 3000);
        (ledger, writes)
    }

    /// What h2 reads through the connection, in reads of `room` bytes at most: the client's
    /// bytes less the WINDOW_UPDATEs the wire takes, whatever the room (a read spills what
    /// does not fit, and gives it next).
    fn read_through(client: &[u8], room: usize) -> (Vec<u8>, Wire) {
        let wire = Wire::default();
        let mut io = LedgerIo::new(
            client,
            ledger_on(Gauge::default()),
            Round::default(),
            wire.clone(),
        );
        let mut cx = Context::from_waker(Waker::noop());
        let mut seen = Vec::new();
        loop {
            let mut space = vec![0u8; room];
            let mut buf = ReadBuf::new(&mut space);
            match Pin::new(&mut io).poll_read(&mut cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
                Poll::Ready(Ok(())) => seen.extend_from_slice(buf.filled()),
                other => panic!("{other:?}"),
            }
        }
        (seen, wire)
    }

    #[test]
    fn h2_reads_the_clients_frames_less_the_wires_in_any_room() {
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let update = |stream: u32, inc: u32| frame(8, stream, &inc.to_be_bytes());
        let mut passed = PREFACE.to_vec();
        passed.extend(frame(4, 0, &[0; 6])); // SETTINGS
        passed.extend(frame(1, 1, &[0x82; 30])); // HEADERS, stream 1
        let mut client = passed.clone();
        client.extend(update(0, 1000)); // the wire's
        client.extend(update(1, 500)); // the wire's
        let mut tail = frame(DATA, 1, &[5; 5000]);
        tail.extend(update(1, 0)); // a protocol error: h2's
        tail.extend(frame(6, 0, &[0; 8])); // PING
        client.extend(&tail);
        passed.extend(&tail);
        for room in [1, 9, 16, 17, 30, 100, 4096, 70_000] {
            let (seen, wire) = read_through(&client, room);
            assert_eq!(seen, passed, "room {room}");
            assert_eq!(
                wire.windows(1),
                (65_535 + 1000, Some(65_535 + 500)),
                "room {room}"
            );
        }
    }

    #[test]
    fn a_round_s_frames_reach_the_socket_in_one_write_when_it_ends() {
        let (ledger, writes) = ledger_with_watches();
        let round = Round::default();
        let mut io = LedgerIo::new(
            Socket::open(),
            ledger.clone(),
            round.clone(),
            Wire::default(),
        );
        let mut cx = Context::from_waker(Waker::noop());
        round.open();
        write_frames(&mut io, &mut cx);
        // h2 flushed after every frame: nothing reached the socket, all still held.
        assert_eq!(io.io.writes, 0);
        assert_eq!(ledger.held(), 3117);
        round.close();
        assert!(matches!(
            Pin::new(&mut io).poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(io.io.writes, 1);
        assert_eq!(io.io.data, wire());
        assert_eq!(
            ledger.held(),
            0,
            "the DATA frames are credited once written"
        );
        assert_eq!(writes.get(), 1);
        // Nothing waits any more: the gathering buffer is let go, kept on the thread for the
        // next round's frames.
        assert_eq!(io.out.capacity(), 0);
        assert!(crate::serve::h2wire::spare::take().capacity() > 0);
    }

    #[test]
    fn writes_the_socket_takes_in_part_are_counted() {
        let short = StripedCounter::default();
        let (ledger, writes) = ledger_counting_short_writes(short.clone());
        let round = Round::default();
        let socket = Socket {
            room: 1000,
            ..Socket::default()
        };
        let mut io = LedgerIo::new(socket, ledger, round.clone(), Wire::default());
        let mut cx = Context::from_waker(Waker::noop());
        round.open();
        write_frames(&mut io, &mut cx);
        round.close();
        // 1,000 bytes of the round's write go, the rest waits for room.
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        assert_eq!((writes.get(), short.get()), (1, 1));
        io.io.room = usize::MAX;
        assert!(matches!(
            Pin::new(&mut io).poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(io.io.data, wire());
        assert_eq!((writes.get(), short.get()), (2, 1), "the rest taken whole");
    }

    #[test]
    fn outside_a_round_every_flush_passes_through() {
        let (ledger, _) = ledger_with_watches();
        let mut io = LedgerIo::new(Socket::open(), ledger, Round::default(), Wire::default());
        let mut cx = Context::from_waker(Waker::noop());
        write_frames(&mut io, &mut cx);
        assert_eq!(io.io.writes, 7, "one write per flushed frame");
        assert_eq!(io.io.data, wire());
    }

    #[test]
    fn a_round_passes_on_what_it_gathered_once_it_reaches_the_limit() {
        let (ledger, _) = ledger_with_watches();
        let round = Round::default();
        let mut io = LedgerIo::new(Socket::open(), ledger, round.clone(), Wire::default());
        let mut cx = Context::from_waker(Waker::noop());
        round.open();
        // Whole frames, as h2 writes them (the wire splices between frames).
        let chunk = frame(DATA, 9, &[0; 1000 - HEADER_LEN]);
        let mut total = 0;
        while total <= GATHER + 1000 {
            assert!(matches!(
                Pin::new(&mut io).poll_write(&mut cx, &chunk),
                Poll::Ready(Ok(1000))
            ));
            assert!(Pin::new(&mut io).poll_flush(&mut cx).is_ready());
            total += 1000;
        }
        assert_eq!(
            io.io.writes, 1,
            "the limit passed on what was gathered, in one write"
        );
        assert!(io.waiting() <= GATHER);
        // A write as large as the limit goes straight through once nothing waits.
        round.close();
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_ready());
        let big = frame(DATA, 11, &vec![1u8; GATHER - HEADER_LEN]);
        assert!(matches!(
            Pin::new(&mut io).poll_write(&mut cx, &big),
            Poll::Ready(Ok(n)) if n == GATHER
        ));
        assert_eq!(io.io.writes, 3);
        assert_eq!(io.io.data.len(), total + GATHER);
    }

    #[test]
    fn a_full_socket_keeps_what_was_gathered_and_holds_h2_back() {
        let (ledger, _) = ledger_with_watches();
        let round = Round::default();
        let mut io = LedgerIo::new(
            Socket::default(),
            ledger.clone(),
            round.clone(),
            Wire::default(),
        );
        let mut cx = Context::from_waker(Waker::noop());
        round.open();
        write_frames(&mut io, &mut cx);
        round.close();
        // The socket takes nothing: the flush waits, and so does a write past the limit.
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        let big = vec![0u8; GATHER];
        assert!(Pin::new(&mut io).poll_write(&mut cx, &big).is_pending());
        assert_eq!(ledger.held(), 3117);
        // Some room: part of it goes, each DATA frame credited as its header goes.
        io.io.room = 150;
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        assert_eq!(
            ledger.held(),
            3017,
            "stream 3's first frame went, stream 5's did not"
        );
        io.io.room = usize::MAX;
        assert!(matches!(
            Pin::new(&mut io).poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(io.io.data, wire());
        assert_eq!(ledger.held(), 0);
    }

    #[test]
    fn a_dropped_connection_gives_its_share_back() {
        let gauge = Gauge::default();
        let ledger = ledger_on(gauge.clone());
        let other = ledger.clone();
        ledger.hold(GAUGE_SLACK + 4096);
        drop(ledger);
        assert_eq!(gauge.get(), (GAUGE_SLACK + 4096) as i64);
        drop(other);
        assert_eq!(gauge.get(), 0);
    }

    #[test]
    fn the_gauge_lags_by_at_most_the_slack_and_is_exact_when_a_watch_ends() {
        let gauge = Gauge::default();
        let ledger = ledger_on(gauge.clone());
        let mut sent = 0;
        for _ in 0..200 {
            ledger.sent(3, 1000);
            sent += 1000;
            let lag = sent - gauge.get() as usize;
            assert!(lag <= GAUGE_SLACK, "{lag}");
        }
        assert!(gauge.get() > 0, "told on the way");
        // Writes credit the frames; the gauge follows within the slack.
        let mut r = FrameReader::default();
        for _ in 0..150 {
            r.credit(&[0, 0, 200, DATA, 0, 0, 0, 0, 3], &ledger, &Wire::default());
            r.credit(&[b'x'; 200], &ledger, &Wire::default());
            sent -= 200;
            let off = (gauge.get() - sent as i64).unsigned_abs() as usize;
            assert!(off <= GAUGE_SLACK, "{off}");
        }
        assert_eq!(ledger.held(), sent);
        ledger.end(3, 0);
        assert_eq!(gauge.get(), 0);
    }
}
