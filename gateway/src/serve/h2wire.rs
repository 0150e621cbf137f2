//! An h2 connection's response bodies, framed by the server itself.
//!
//! The `h2` crate reads the client's frames (HPACK, request bodies and their flow control,
//! SETTINGS, PING, RST_STREAM, GOAWAY, the stream limits) and writes every frame but DATA
//! with a payload: response HEADERS, the empty DATA frame that ends a stream, resets,
//! SETTINGS acknowledgements, pings and GOAWAY. Response payloads never pass through it. A
//! writer (a watch on the connection's task, or a response body on its request's task) asks
//! the [`Wire`] for room on its stream, and frames its bytes straight into one buffer the
//! connection shares: a DATA header and a copy of the payload, as a raw socket server would
//! write them. A round of the connection's task so writes one change for every watch of the
//! connection, without a per-stream queue, lock or wake-up in h2.
//!
//! The send side's flow control is therefore kept here, from the client's own frames:
//! [`Inbound`] reads what the client sends before h2 does, takes every WINDOW_UPDATE (the
//! connection's and those of the streams it knows; h2 sees none, so its own send windows
//! never grow and it never has room to send a payload of its own) and follows
//! SETTINGS_INITIAL_WINDOW_SIZE. A WINDOW_UPDATE h2 must judge (an increment of 0, a stream
//! that is not open) is passed on for it to answer with the error the protocol requires; a
//! window pushed past 2^31-1 is answered here, with FLOW_CONTROL_ERROR.
//!
//! [`Outbound`] follows the frames h2 writes, so that framed payloads go into the output
//! only between two of h2's frames (never inside a header block), only after the HEADERS of
//! their stream, and always before h2's END_STREAM or RST_STREAM for it: a writer's bytes
//! framed before it asks h2 to end the stream are spliced in before h2's next frame.
//!
//! Frames are at most 16,384 bytes: the smallest SETTINGS_MAX_FRAME_SIZE, which every client
//! accepts.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use h2::Reason;
use parking_lot::Mutex;

/// The largest DATA payload framed: the floor of SETTINGS_MAX_FRAME_SIZE.
pub const MAX_FRAME: usize = 16 * 1024;

/// What plain response bodies may have framed and not yet written on one connection before
/// their writers wait: with the watches' budget (`h2ledger::WATCH_BUDGET`), what bounds the
/// connection's output buffer.
pub const WRITE_BUDGET: usize = 512 * 1024;

/// The largest payload [`Wire::frame_each`] reports as waiting for the connection's window
/// ([`Each::Conn`]), to be framed whole once it has room. A client's window for the
/// connection is at least h2's initial 65,535 bytes, and a client that has read everything
/// leaves less than half of it unreleased (every client sends its WINDOW_UPDATE by then), so
/// the window always comes back to at least this much; a larger payload might wait forever.
/// (A group's batch, 16 KiB and the event that crossed it, fits.)
pub const CONN_WAIT_MAX: usize = 32 * 1024;

/// What the connection task's watches frame in one round before they let it write: about one
/// socket write (`h2ledger::GATHER`). Past it a watch yields (the round ends, its bytes go to
/// the socket, and the task comes back after the runtime's other tasks, writes among them),
/// so a connection with many busy streams neither writes in small pieces nor holds a worker
/// for all of them at once.
pub const ROUND_BYTES: usize = 64 * 1024;

/// An h2 frame header: 24-bit length, type, flags, 31-bit stream id.
pub const HEADER_LEN: usize = 9;
/// The largest flow-control window (RFC 9113 6.9.1).
const MAX_WINDOW: i64 = (1 << 31) - 1;
/// Every window's size until SETTINGS or WINDOW_UPDATE change it.
const DEFAULT_WINDOW: i64 = 65_535;
/// SETTINGS payloads larger than this are not read (h2 refuses frames this large anyway).
const MAX_SETTINGS: usize = 16 * 1024;
/// The client's connection preface.
const PREFACE_LEN: usize = 24;

/// DATA, in a frame header's type octet.
pub const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const WINDOW_UPDATE: u8 = 8;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 4;

/// Hashes h2 stream ids (odd, increasing, chosen by the client) with one multiplication:
/// the connection's maps of streams are looked up per frame, and SipHash's resistance to
/// chosen keys buys nothing for a map that only the connection's own streams, at most its
/// stream limit, fill.
#[derive(Clone, Copy, Default)]
pub(crate) struct StreamIds;

impl std::hash::BuildHasher for StreamIds {
    type Hasher = StreamIdHasher;

    fn build_hasher(&self) -> StreamIdHasher {
        StreamIdHasher(0)
    }
}

pub(crate) struct StreamIdHasher(u64);

impl std::hash::Hasher for StreamIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, id: u32) {
        // Fibonacci hashing: hashbrown takes its buckets from the top bits and its tags
        // from the top seven, which the multiplication fills from every bit of the id.
        self.0 = u64::from(id).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// What a writer waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Its HEADERS, or its stream's window.
    Stream,
    /// The connection's window.
    Conn,
    /// The connection's unwritten bytes to fall under the budget.
    Budget,
}

/// One stream the client opened, as its writer sees it: 24 bytes, one of a connection's
/// thousand (a table of 2,048 entries of 32 bytes with the id, where 56-byte entries and a
/// flag allocated per stream cost 150 B a watch at 1,000,000 watches).
#[derive(Default)]
struct Stream {
    /// The writer's waker: woken when it may have room, or the stream ended.
    waker: Option<Waker>,
    /// Send credit: the client's initial window, its WINDOW_UPDATEs, less what was framed.
    /// Within ±(2^31-1): a window pushed past the maximum breaks the stream (`broken`) or
    /// the connection, and is kept at the maximum.
    window: i32,
    /// h2 wrote the response's HEADERS: DATA may follow.
    head_out: bool,
    /// What the writer waits for, if anything.
    wait: Option<Wait>,
    /// The client's WINDOW_UPDATEs took the window past the maximum: the writer resets the
    /// stream with FLOW_CONTROL_ERROR.
    broken: bool,
}

impl Stream {
    fn window(&self) -> i64 {
        i64::from(self.window)
    }

    /// Moves the window by `by`, kept within ±(2^31-1); false when it went past the maximum.
    fn add_window(&mut self, by: i64) -> bool {
        let w = self.window().saturating_add(by);
        self.window = i32::try_from(w.clamp(-MAX_WINDOW, MAX_WINDOW)).unwrap_or(i32::MAX);
        w <= MAX_WINDOW
    }
}

struct State {
    /// The connection's send credit, less what was framed.
    conn: i64,
    /// Writers of several streams waiting for the connection's window ([`Wire::wait_conn`]),
    /// woken when it grows: filed here, not on one of their streams, whose own waits would
    /// take its place.
    conn_watchers: Vec<Waker>,
    /// The client's SETTINGS_INITIAL_WINDOW_SIZE.
    initial: i64,
    streams: HashMap<u32, Stream, StreamIds>,
    /// The highest stream id the client opened.
    last_opened: u32,
    /// DATA frames framed and not yet spliced into h2's output.
    framed: Vec<u8>,
    /// Payload bytes framed and not yet written to the socket.
    unwritten: usize,
    /// Bytes framed since the connection task's round opened ([`Wire::open_round`]).
    round: usize,
    /// Writers waiting for the connection's credit, and for [`WRITE_BUDGET`].
    conn_waiting: usize,
    budget_waiting: usize,
    /// The connection task's waker: woken when another task framed bytes.
    driver: Option<Waker>,
    /// A connection error found in the client's frames, for the connection task to answer.
    error: Option<Reason>,
}

impl Default for State {
    fn default() -> Self {
        State {
            conn: DEFAULT_WINDOW,
            conn_watchers: Vec::new(),
            initial: DEFAULT_WINDOW,
            streams: HashMap::default(),
            last_opened: 0,
            framed: Vec::new(),
            unwritten: 0,
            round: 0,
            conn_waiting: 0,
            budget_waiting: 0,
            driver: None,
            error: None,
        }
    }
}

impl State {
    fn keep_driver(&mut self, driver: &Waker) {
        if !self.driver.as_ref().is_some_and(|d| d.will_wake(driver)) {
            self.driver = Some(driver.clone());
        }
    }

    /// The connection's window grew by `by` (the client's WINDOW_UPDATE, or room a writer
    /// gave back): every writer waiting for it is woken.
    fn open_conn(&mut self, by: i64) {
        self.conn = self.conn.saturating_add(by);
        for w in self.conn_watchers.drain(..) {
            w.wake();
        }
        if self.conn > 0 && self.conn_waiting > 0 {
            self.wake_all(Wait::Conn);
        }
    }

    /// The connection error is the connection task's to answer: it is woken for it.
    fn fail(&mut self, reason: Reason) {
        self.error = Some(reason);
        if let Some(d) = &self.driver {
            d.wake_by_ref();
        }
    }

    /// The writer of `stream` waits for `wait`, with `waker`.
    fn park(&mut self, id: u32, wait: Wait, waker: &Waker) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if !stream.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            stream.waker = Some(waker.clone());
        }
        let was = stream.wait.replace(wait);
        self.count(was, false);
        self.count(Some(wait), true);
    }

    fn count(&mut self, wait: Option<Wait>, up: bool) {
        let n = match wait {
            Some(Wait::Conn) => &mut self.conn_waiting,
            Some(Wait::Budget) => &mut self.budget_waiting,
            Some(Wait::Stream) | None => return,
        };
        *n = if up {
            n.saturating_add(1)
        } else {
            n.saturating_sub(1)
        };
    }

    /// Wakes the writer of `id`, whatever it waits for (or, idle, whether its stream ended).
    fn wake(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        let was = stream.wait.take();
        if let Some(w) = &stream.waker {
            w.wake_by_ref();
        }
        self.count(was, false);
    }

    /// Wakes every writer waiting for `wait`.
    fn wake_all(&mut self, wait: Wait) {
        let mut woken = 0usize;
        for stream in self.streams.values_mut() {
            if stream.wait == Some(wait) {
                stream.wait = None;
                woken = woken.saturating_add(1);
                if let Some(w) = &stream.waker {
                    w.wake_by_ref();
                }
            }
        }
        for _ in 0..woken {
            self.count(Some(wait), false);
        }
    }

    /// The stream ended (END_STREAM or RST_STREAM either way): its writer learns it is gone.
    fn remove(&mut self, id: u32, ends: &AtomicU64) {
        if let Some(stream) = self.streams.remove(&id) {
            self.count(stream.wait, false);
            ends.fetch_add(1, Ordering::Release);
            if let Some(w) = stream.waker {
                w.wake();
            }
        }
    }
}

/// The framed output and send-side flow control of one h2 connection.
#[derive(Clone, Default)]
pub struct Wire(Arc<Shared>);

/// What a writer last saw of its connection's stream ends ([`Wire::over`]).
#[derive(Clone, Copy, Default)]
pub struct Seen(Option<u64>);

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// How many of the connection's streams ended or broke their flow control: a writer
    /// compares it with what it saw last on every poll, without the lock, and looks for its
    /// own stream only when it moved ([`Wire::over`]). One counter for the connection, where
    /// a flag a stream cost an allocation each.
    ends: AtomicU64,
}

impl Wire {
    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.0.state.lock()
    }

    fn remove(&self, id: u32) {
        self.lock().remove(id, &self.0.ends);
    }
}

/// What else bounds a writer's room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// A watch on the connection's task: it yields once the round framed [`ROUND_BYTES`].
    Round,
    /// A response body on its own task: it waits while this many bytes are framed and not
    /// yet written.
    Unwritten(usize),
}

/// What [`Wire::frame_each`] did on one stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Each {
    /// Every byte is framed.
    Framed,
    /// Nothing is: the stream's window is shorter (or its HEADERS are not out yet).
    Short,
    /// Nothing is: the connection's window is shorter, for this stream and every one after
    /// it ([`Wire::wait_conn`]). Only for payloads of at most [`CONN_WAIT_MAX`]; a larger one
    /// is `Short`, its writer taking the window's room piece by piece.
    Conn,
    /// The stream ended.
    Gone,
    /// The client broke its flow control: reset it with FLOW_CONTROL_ERROR.
    Broken,
}

/// What a writer may do on its stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Room {
    /// The round is full: come back after the connection wrote it (wake yourself, return
    /// Pending).
    Yield,
    /// This many bytes are reserved for it: frame at most these, the rest is given back.
    Bytes(usize),
    /// The stream ended (reset by the client, or the connection is going).
    Gone,
    /// The client broke the stream's flow control: reset it with this.
    Reset(Reason),
}

impl Wire {
    /// Room for up to `want` bytes on stream `id`, reserved from its window and the
    /// connection's. Pending registers the waker, woken when there may be room (or the stream
    /// ended). `limit` says what else bounds it ([`Limit`]).
    pub fn poll_room(&self, cx: &Context<'_>, id: u32, want: usize, limit: Limit) -> Poll<Room> {
        let mut s = self.lock();
        let s = &mut *s;
        let Some(stream) = s.streams.get_mut(&id) else {
            return Poll::Ready(Room::Gone);
        };
        if stream.broken {
            s.remove(id, &self.0.ends);
            return Poll::Ready(Room::Reset(Reason::FLOW_CONTROL_ERROR));
        }
        let wait = if !stream.head_out || stream.window <= 0 {
            Some(Wait::Stream)
        } else if matches!(limit, Limit::Unwritten(b) if s.unwritten >= b) {
            Some(Wait::Budget)
        } else if s.conn <= 0 {
            Some(Wait::Conn)
        } else {
            None
        };
        if let Some(wait) = wait {
            s.park(id, wait, cx.waker());
            return Poll::Pending;
        }
        if limit == Limit::Round && s.round >= ROUND_BYTES {
            return Poll::Ready(Room::Yield);
        }
        let Some(stream) = s.streams.get_mut(&id) else {
            return Poll::Ready(Room::Gone);
        };
        let n = i64::try_from(want)
            .unwrap_or(i64::MAX)
            .min(stream.window())
            .min(s.conn);
        stream.add_window(n.saturating_neg());
        s.conn = s.conn.saturating_sub(n);
        Poll::Ready(Room::Bytes(usize::try_from(n).unwrap_or(0)))
    }

    /// Frames `parts` (together at most the `reserved` room) as DATA on stream `id`, and
    /// gives back the room not used. `wake` wakes the connection's task to write them (a
    /// writer on another task than the connection's).
    pub fn frame(&self, id: u32, parts: &[Bytes], reserved: usize, wake: bool) -> usize {
        let total = parts.iter().fold(0usize, |n, p| n.saturating_add(p.len()));
        let mut s = self.lock();
        let s = &mut *s;
        give_back(s, id, reserved.saturating_sub(total));
        if total == 0 {
            return 0;
        }
        frame_into(&mut s.framed, id, parts, total);
        s.unwritten = s.unwritten.saturating_add(total);
        s.round = s.round.saturating_add(total);
        if wake && let Some(d) = &s.driver {
            d.wake_by_ref();
        }
        total
    }

    /// Frames `parts` (`total` bytes, at least one) as DATA on each stream of `ids` whose
    /// window and the connection's hold all of them, under one lock: one event for every
    /// stream of a connection served from one registration. `out` gets what became of each
    /// stream, in order ([`Each`]); a stream the client broke is removed (reset it). True
    /// when the round is full.
    pub fn frame_each(
        &self,
        ids: &[u32],
        parts: &[Bytes],
        total: usize,
        out: &mut Vec<Each>,
    ) -> bool {
        out.clear();
        let n = i64::try_from(total).unwrap_or(i64::MAX);
        let mut s = self.lock();
        let s = &mut *s;
        let mut framed = 0usize;
        for &id in ids {
            let each = match s.streams.get_mut(&id) {
                None => Each::Gone,
                Some(st) if st.broken => Each::Broken,
                Some(st) if !st.head_out || st.window() < n => Each::Short,
                Some(_) if s.conn < n && total <= CONN_WAIT_MAX => Each::Conn,
                Some(_) if s.conn < n => Each::Short,
                Some(st) => {
                    st.add_window(n.saturating_neg());
                    s.conn = s.conn.saturating_sub(n);
                    frame_into(&mut s.framed, id, parts, total);
                    framed = framed.saturating_add(total);
                    Each::Framed
                }
            };
            if each == Each::Broken {
                s.remove(id, &self.0.ends);
            }
            out.push(each);
        }
        s.unwritten = s.unwritten.saturating_add(framed);
        s.round = s.round.saturating_add(framed);
        s.round >= ROUND_BYTES
    }

    /// Whether the connection's window is shorter than `n`: then `cx`'s waker waits for it
    /// to grow (the client opens it, or a writer gives back room it did not use). False: it
    /// takes `n` now.
    pub fn wait_conn(&self, cx: &Context<'_>, n: usize) -> bool {
        let mut s = self.lock();
        if s.conn >= i64::try_from(n).unwrap_or(i64::MAX) {
            return false;
        }
        if !s.conn_watchers.iter().any(|w| w.will_wake(cx.waker())) {
            s.conn_watchers.push(cx.waker().clone());
        }
        true
    }

    /// The connection task opens a round: its watches may frame [`ROUND_BYTES`] in it. (A
    /// round counts what was framed in it, not what waits to be spliced, so watches that
    /// yielded do not spin while h2 holds a frame the socket took only part of: the next
    /// round lets them frame again, as far as the connection's budget.)
    pub fn open_round(&self) {
        self.lock().round = 0;
    }

    /// Gives back room reserved and not used.
    pub fn give_back(&self, id: u32, n: usize) {
        if n > 0 {
            give_back(&mut self.lock(), id, n);
        }
    }

    /// True when stream `id` ended or its flow control broke ([`Wire::broken`] says
    /// which). Otherwise `cx`'s waker is the writer's, woken when either happens while the
    /// writer is idle, not waiting for room. `seen` is the writer's own record, starting at
    /// [`Seen::default`]: while no stream of the connection ended since, the answer is false
    /// without the lock.
    pub fn over(&self, cx: &Context<'_>, id: u32, seen: &mut Seen) -> bool {
        let ends = self.ends();
        if seen.0 == Some(ends) {
            return false;
        }
        // The count is raised under the lock, before the waker is woken: one that moves after
        // this reading is seen at the writer's next poll.
        let mut s = self.lock();
        match s.streams.get_mut(&id) {
            Some(stream) if !stream.broken => {
                if !stream
                    .waker
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()))
                {
                    stream.waker = Some(cx.waker().clone());
                }
                seen.0 = Some(ends);
                false
            }
            _ => true,
        }
    }

    /// How many of the connection's streams ended or broke so far: while it stays the same,
    /// [`Wire::over`] is false for every writer that saw it.
    pub fn ends(&self) -> u64 {
        self.0.ends.load(Ordering::Acquire)
    }

    /// Why a writer's stream is over, once [`Wire::over`] said so: the reason to reset it
    /// with when the client broke its flow control, `None` when it ended.
    pub fn broken(&self, id: u32) -> Option<Reason> {
        let mut s = self.lock();
        let broken = s.streams.get(&id).is_some_and(|st| st.broken);
        if broken {
            s.remove(id, &self.0.ends);
        }
        broken.then_some(Reason::FLOW_CONTROL_ERROR)
    }

    /// The connection error found in the client's frames, once.
    pub fn take_error(&self) -> Option<Reason> {
        self.lock().error.take()
    }

    /// Payload bytes of DATA frames went to the socket.
    pub fn written(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut s = self.lock();
        s.unwritten = s.unwritten.saturating_sub(n);
        if s.budget_waiting > 0 && s.unwritten <= WRITE_BUDGET / 2 {
            s.wake_all(Wait::Budget);
        }
    }

    /// Moves what was framed to the end of `out` (h2's output is between two frames), and
    /// keeps the connection task's waker.
    pub fn splice(&self, out: &mut Vec<u8>, driver: &Waker) {
        let mut s = self.lock();
        s.keep_driver(driver);
        if s.framed.is_empty() {
            return;
        }
        if out.is_empty() {
            std::mem::swap(out, &mut s.framed);
        } else {
            out.extend_from_slice(&s.framed);
            s.framed.clear();
        }
    }

    /// Keeps the connection task's waker without splicing (h2 is inside a frame).
    pub fn note_driver(&self, driver: &Waker) {
        self.lock().keep_driver(driver);
    }

    #[cfg(test)]
    pub(crate) fn windows(&self, id: u32) -> (i64, Option<i64>) {
        let s = self.lock();
        (s.conn, s.streams.get(&id).map(Stream::window))
    }
}

fn give_back(s: &mut State, id: u32, n: usize) {
    if n == 0 {
        return;
    }
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    if let Some(stream) = s.streams.get_mut(&id) {
        stream.add_window(n);
    }
    s.open_conn(n);
}

/// Appends `parts` (`total` bytes) to `out` as DATA frames of stream `id`, each at most
/// [`MAX_FRAME`].
fn frame_into(out: &mut Vec<u8>, id: u32, parts: &[Bytes], total: usize) {
    spare::furnish(out);
    let frames = total.div_ceil(MAX_FRAME);
    out.reserve(total.saturating_add(frames.saturating_mul(HEADER_LEN)));
    let mut left = total;
    let mut in_frame = 0usize;
    for part in parts {
        let mut rest: &[u8] = part;
        while !rest.is_empty() {
            if in_frame == 0 {
                let len = left.min(MAX_FRAME);
                out.extend_from_slice(&data_header(id, len));
                in_frame = len;
            }
            let take = in_frame.min(rest.len());
            let (now, later) = rest.split_at(take);
            out.extend_from_slice(now);
            rest = later;
            in_frame = in_frame.saturating_sub(take);
            left = left.saturating_sub(take);
        }
    }
}

/// Output buffers of written rounds, kept on their thread for the next round's frames.
///
/// A round's output is written and let go at its end (`h2ledger`). Framed from nothing, a
/// round of 100 events of 800 bytes grew its buffer by doubling six times (copying what was
/// framed each time) and took fresh pages from the allocator, which the kernel zeroed: 4 %
/// of the gateway's time at 5,000 watchers × 100 writes/s. A few buffers a thread are kept
/// instead: a busy thread's rounds reuse them, and what one thread keeps is bounded.
pub mod spare {
    use std::cell::RefCell;

    use super::ROUND_BYTES;

    /// Buffers kept on one thread, at most.
    pub const KEEP: usize = 4;
    /// The largest buffer kept: one that grew past it goes back to the allocator.
    pub const MAX_KEPT: usize = 4 * ROUND_BYTES;

    thread_local! {
        static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    }

    /// An empty buffer, with the capacity of one kept on this thread if there is one.
    pub fn take() -> Vec<u8> {
        SPARE
            .try_with(|s| s.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Gives `out` a kept buffer if it has no room of its own yet (it is about to grow).
    pub fn furnish(out: &mut Vec<u8>) {
        if out.capacity() == 0 {
            *out = take();
        }
    }

    /// Keeps `buf`'s capacity for this thread's next [`take`], if it is worth keeping and
    /// the thread keeps fewer than [`KEEP`].
    pub fn give(mut buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > MAX_KEPT {
            return;
        }
        buf.clear();
        let _ = SPARE.try_with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < KEEP {
                s.push(buf);
            }
        });
    }
}

fn data_header(id: u32, len: usize) -> [u8; HEADER_LEN] {
    let l = u32::try_from(len).unwrap_or(0).to_be_bytes();
    let s = (id & 0x7fff_ffff).to_be_bytes();
    [l[1], l[2], l[3], DATA, 0, s[0], s[1], s[2], s[3]]
}

/// A frame header's fields.
#[derive(Clone, Copy)]
pub struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

fn parse(h: &[u8; HEADER_LEN]) -> Head {
    let [l0, l1, l2, kind, flags, s0, s1, s2, s3] = *h;
    Head {
        len: usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2),
        kind,
        flags,
        stream: u32::from_be_bytes([s0 & 0x7f, s1, s2, s3]),
    }
}

/// Where [`Inbound`] is in the client's byte stream.
enum In {
    /// Reading a frame header.
    Header,
    /// Passing a payload on.
    Pass(usize),
    /// Passing a SETTINGS payload on, and reading it.
    Settings { left: usize, read: Vec<u8> },
    /// Holding a WINDOW_UPDATE until its increment is in.
    Update { have: usize },
}

/// The most bytes [`Inbound::feed`] may give out beyond its input: a frame header held back
/// (8 bytes of 9) or a WINDOW_UPDATE held back until its increment was in (12 of 13).
pub const INBOUND_CARRY: usize = 16;

/// Where [`Inbound::feed`] puts what h2 is to see.
pub trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Reads the client's frames before h2 does, takes the WINDOW_UPDATEs that are the wire's,
/// and follows the streams the client opens and resets and its initial window.
pub struct Inbound {
    wire: Wire,
    preface: usize,
    head: [u8; HEADER_LEN],
    have: usize,
    at: In,
    update: [u8; 4],
}

impl Inbound {
    pub fn new(wire: Wire) -> Self {
        Inbound {
            wire,
            preface: PREFACE_LEN,
            head: [0; HEADER_LEN],
            have: 0,
            at: In::Header,
            update: [0; 4],
        }
    }

    /// Reads `input`, the next bytes from the client, and appends what h2 is to see to
    /// `out`: at most [`INBOUND_CARRY`] bytes more than `input` (a frame header, or a
    /// WINDOW_UPDATE, held back from earlier input).
    pub fn feed(&mut self, mut input: &[u8], out: &mut impl Sink) {
        while !input.is_empty() {
            if self.preface > 0 {
                let take = self.preface.min(input.len());
                let (now, rest) = input.split_at(take);
                out.put(now);
                self.preface = self.preface.saturating_sub(take);
                input = rest;
                continue;
            }
            match &mut self.at {
                In::Header => {
                    let take = HEADER_LEN.saturating_sub(self.have).min(input.len());
                    let (now, rest) = input.split_at(take);
                    if let Some(dst) = self.head.get_mut(self.have..self.have.saturating_add(take))
                    {
                        dst.copy_from_slice(now);
                    }
                    self.have = self.have.saturating_add(take);
                    input = rest;
                    if self.have == HEADER_LEN {
                        self.have = 0;
                        self.header(out);
                    }
                }
                In::Pass(left) => {
                    let take = (*left).min(input.len());
                    let (now, rest) = input.split_at(take);
                    out.put(now);
                    *left = left.saturating_sub(take);
                    input = rest;
                    if *left == 0 {
                        self.at = In::Header;
                    }
                }
                In::Settings { left, read } => {
                    let take = (*left).min(input.len());
                    let (now, rest) = input.split_at(take);
                    out.put(now);
                    read.extend_from_slice(now);
                    *left = left.saturating_sub(take);
                    input = rest;
                    if *left == 0 {
                        let read = std::mem::take(read);
                        self.at = In::Header;
                        self.settings(&read);
                    }
                }
                In::Update { have } => {
                    let take = 4usize.saturating_sub(*have).min(input.len());
                    let (now, rest) = input.split_at(take);
                    if let Some(dst) = self.update.get_mut(*have..have.saturating_add(take)) {
                        dst.copy_from_slice(now);
                    }
                    *have = have.saturating_add(take);
                    input = rest;
                    if *have == 4 {
                        self.at = In::Header;
                        if !self.window_update() {
                            out.put(&self.head);
                            out.put(&self.update);
                        }
                    }
                }
            }
        }
    }

    /// A frame header is in: decides what to do with the frame.
    fn header(&mut self, out: &mut impl Sink) {
        let h = parse(&self.head);
        if h.kind == WINDOW_UPDATE && h.len == 4 {
            self.at = In::Update { have: 0 };
            return;
        }
        out.put(&self.head);
        match h.kind {
            HEADERS if h.stream % 2 == 1 => {
                let mut s = self.wire.lock();
                if h.stream > s.last_opened {
                    s.last_opened = h.stream;
                    let mut stream = Stream::default();
                    stream.add_window(s.initial);
                    s.streams.insert(h.stream, stream);
                }
            }
            RST_STREAM => self.wire.remove(h.stream),
            _ => {}
        }
        self.at = match h.kind {
            _ if h.len == 0 => In::Header,
            SETTINGS
                if h.flags & ACK == 0
                    && h.stream == 0
                    && h.len.is_multiple_of(6)
                    && h.len <= MAX_SETTINGS =>
            {
                In::Settings {
                    left: h.len,
                    read: Vec::with_capacity(h.len),
                }
            }
            _ => In::Pass(h.len),
        };
    }

    /// A WINDOW_UPDATE is in: true when the wire took it, false when h2 must see it.
    fn window_update(&mut self) -> bool {
        let h = parse(&self.head);
        let [a, b, c, d] = self.update;
        let inc = i64::from(u32::from_be_bytes([a & 0x7f, b, c, d]));
        if inc == 0 {
            // A protocol error, h2's to answer (a stream's or the connection's).
            return false;
        }
        let mut s = self.wire.lock();
        let s = &mut *s;
        if h.stream == 0 {
            s.open_conn(inc);
            if s.conn > MAX_WINDOW {
                s.fail(Reason::FLOW_CONTROL_ERROR);
            }
            return true;
        }
        let Some(stream) = s.streams.get_mut(&h.stream) else {
            // Not a stream the wire knows: idle (h2 answers the protocol error) or closed
            // (h2 ignores it).
            return false;
        };
        if !stream.add_window(inc) && !stream.broken {
            stream.broken = true;
            self.wire.0.ends.fetch_add(1, Ordering::Release);
        }
        if stream.broken || (stream.window > 0 && stream.wait == Some(Wait::Stream)) {
            s.wake(h.stream);
        }
        true
    }

    /// A SETTINGS frame passed: a new initial window changes every open stream's.
    fn settings(&mut self, payload: &[u8]) {
        let mut s = self.wire.lock();
        for entry in payload.chunks_exact(6) {
            let [i0, i1, v0, v1, v2, v3] = [0, 1, 2, 3, 4, 5].map(|i| entry.get(i).copied());
            let (Some(i0), Some(i1), Some(v0), Some(v1), Some(v2), Some(v3)) =
                (i0, i1, v0, v1, v2, v3)
            else {
                continue;
            };
            if u16::from_be_bytes([i0, i1]) != SETTINGS_INITIAL_WINDOW_SIZE {
                continue;
            }
            let value = i64::from(u32::from_be_bytes([v0, v1, v2, v3]));
            if value > MAX_WINDOW {
                // h2 answers it (FLOW_CONTROL_ERROR).
                continue;
            }
            let delta = value.saturating_sub(s.initial);
            s.initial = value;
            let mut overflow = false;
            for stream in s.streams.values_mut() {
                overflow |= !stream.add_window(delta);
            }
            if delta > 0 {
                s.wake_all(Wait::Stream);
            }
            if overflow {
                s.fail(Reason::FLOW_CONTROL_ERROR);
            }
        }
    }
}

/// Follows a stream of frames split anywhere: their headers, and where each frame ends.
#[derive(Default)]
pub struct FrameHeads {
    head: [u8; HEADER_LEN],
    /// Header bytes read so far.
    have: usize,
    /// Payload bytes of the current frame still to come.
    left: usize,
}

impl FrameHeads {
    /// Reads `bytes`, the next bytes of the stream; calls `each` with every header that
    /// completes.
    pub fn feed(&mut self, mut bytes: &[u8], mut each: impl FnMut(Head)) {
        while !bytes.is_empty() {
            if self.left > 0 {
                let skip = self.left.min(bytes.len());
                self.left = self.left.saturating_sub(skip);
                bytes = bytes.get(skip..).unwrap_or_default();
                continue;
            }
            let take = HEADER_LEN.saturating_sub(self.have).min(bytes.len());
            let (now, rest) = bytes.split_at(take);
            if let Some(dst) = self.head.get_mut(self.have..self.have.saturating_add(take)) {
                dst.copy_from_slice(now);
            }
            self.have = self.have.saturating_add(take);
            bytes = rest;
            if self.have == HEADER_LEN {
                self.have = 0;
                let h = parse(&self.head);
                self.left = h.len;
                each(h);
            }
        }
    }

    /// True between two frames.
    fn between(&self) -> bool {
        self.have == 0 && self.left == 0
    }

    /// How many bytes are left of the frame being read (unbounded between frames).
    fn to_frame_end(&self) -> usize {
        if self.have > 0 {
            HEADER_LEN.saturating_sub(self.have)
        } else if self.left > 0 {
            self.left
        } else {
            usize::MAX
        }
    }
}

/// Follows the frames h2 writes: where they begin and end, which responses' HEADERS went
/// out, which streams ended.
#[derive(Default)]
pub struct Outbound {
    heads: FrameHeads,
    /// Inside a header block (HEADERS without END_HEADERS, until its last CONTINUATION):
    /// its stream, and whether it ends the stream.
    block: Option<(u32, bool)>,
}

impl Outbound {
    /// True between two frames, outside a header block: framed DATA may go in here.
    pub fn at_boundary(&self) -> bool {
        self.heads.between() && self.block.is_none()
    }

    /// How many bytes h2 may still write before the end of the frame it is in (unbounded
    /// between frames).
    pub fn to_frame_end(&self) -> usize {
        self.heads.to_frame_end()
    }

    /// Reads `bytes`, the next bytes h2 wrote.
    pub fn feed(&mut self, bytes: &[u8], wire: &Wire) {
        let block = &mut self.block;
        self.heads.feed(bytes, |h| frame_written(block, h, wire));
    }
}

/// h2 wrote the header `h`: a response head went out, or a stream ended.
fn frame_written(block: &mut Option<(u32, bool)>, h: Head, wire: &Wire) {
    let ends = h.flags & END_STREAM != 0;
    match h.kind {
        HEADERS if h.flags & END_HEADERS != 0 => head_out(wire, h.stream, ends),
        HEADERS => *block = Some((h.stream, ends)),
        CONTINUATION if h.flags & END_HEADERS != 0 => {
            if let Some((stream, ends)) = block.take() {
                head_out(wire, stream, ends);
            }
        }
        DATA if ends => wire.remove(h.stream),
        RST_STREAM => wire.remove(h.stream),
        _ => {}
    }
}

fn head_out(wire: &Wire, id: u32, ends: bool) {
    let mut s = wire.lock();
    if ends {
        s.remove(id, &wire.0.ends);
    } else if let Some(stream) = s.streams.get_mut(&id) {
        stream.head_out = true;
        if stream.wait == Some(Wait::Stream) {
            s.wake(id);
        }
    }
}

/// A waker that counts its wake-ups, for the serve layer's unit tests.
#[cfg(test)]
pub(crate) fn counting_waker() -> (Arc<std::sync::atomic::AtomicUsize>, Waker) {
    struct Count(Arc<std::sync::atomic::AtomicUsize>);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    (woken.clone(), Waker::from(Arc::new(Count(woken))))
}

#[cfg(test)]
mod tests;
