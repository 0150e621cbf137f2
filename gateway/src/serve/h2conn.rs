//! h2 connections, served with the `h2` crate: each request runs the pipeline in a task of its
//! own, but once a watch's response head is out its stream is driven by the connection's task.
//! Response payloads do not pass through h2: they are framed on the connection's [`Wire`]
//! (`h2wire.rs`), which keeps the send side's flow control from the client's own frames.
//!
//! The connection task keeps its watches in one `FuturesUnordered` (only woken members are
//! polled) and, per wake-up, frames every ready watcher's events (copied once from the
//! cache's shared frames) on the wire as far as the stream's and the connection's windows
//! allow, then lets the connection write them all: one write per connection, not one per
//! stream. A watch wakes for its watcher, its timer, its window or its end, never for h2's
//! bookkeeping, so one pass of the set covers every stream an event woke, up to 64 KiB
//! framed (`h2wire::ROUND_BYTES`): then the watches yield, the round is written, and the
//! runtime's other tasks (writes among them) run before the rest. What the
//! connection's watches hold outside the cache's ring (framed bytes the socket has not
//! taken, and the part of an event larger than its window's room) is bounded per
//! connection by the [`Ledger`]'s budget: past it they stop draining, so a client that does
//! not read keeps its events in the ring, shared, and its watchers fall behind there and end
//! with their `ERROR` (410) as over HTTP/1.1. Timers are per connection too: one sleep aimed
//! at the earliest bookmark or deadline of its watches, one shutdown signal.
//!
//! The limits hyper's builder set are kept: concurrent streams, header list size, rapid-reset
//! bounds, a keepalive ping every 30 s while requests are in flight, the idle timeout (counted
//! by [`Activity`]) and GOAWAY at shutdown.

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderValue, Method, Request, Response, header};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, Sleep};

use svc_core::watch::ShareKey;

use crate::base::lifecycle::Farewell;
use crate::http::respond::Body;
use crate::http::stream::{MAX_BATCH_BYTES, WatchHandoff, WatchStream};
use crate::security::authn::ConnIdentity;
use crate::serve::app::ServerState;
use crate::serve::bulk::is_list;
use crate::serve::conn_limits::{Activity, Busy, CLOSE_GRACE};
use crate::serve::h2ledger::{Ledger, LedgerIo, Round};
use crate::serve::h2wire::{Limit, Room, Seen, WRITE_BUDGET, Wire};
use crate::serve::pipeline::{self, Caller, H2Body, RequestBody};

mod share;

/// Rapid reset (CVE-2023-44487): streams a client may open and reset before the server has
/// accepted them; past it, GOAWAY (`ENHANCE_YOUR_CALM`). h2's default, made explicit.
const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;

/// Streams the server may reset for a client's protocol errors before it ends the connection
/// (the "MadeYouReset" variant of rapid reset). h2's default, made explicit.
const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;

/// Flow-control windows and buffers as hyper set them.
const STREAM_WINDOW: u32 = 1024 * 1024;
const CONN_WINDOW: u32 = 1024 * 1024;
const MAX_FRAME_SIZE: u32 = 16 * 1024;
const MAX_SEND_BUFFER: usize = 400 * 1024;

/// A keepalive ping while requests are in flight, and how long its answer may take.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// The limits of one h2 connection, from the flags.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_concurrent_streams: u32,
    pub max_header_list_size: u32,
    pub idle_timeout: Duration,
}

fn builder(limits: &Limits) -> h2::server::Builder {
    let mut b = h2::server::Builder::new();
    b.max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_header_list_size)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESET_STREAMS))
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONN_WINDOW)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_send_buffer_size(MAX_SEND_BUFFER);
    b
}

/// Wake-up times of a connection's watches: each pending watch files its waker under the
/// time it must be polled again; the connection's one sleep aims at the earliest. Entries
/// left behind by a watch that moved on or ended only cause one spurious poll.
#[derive(Default)]
struct Timers {
    due: BTreeMap<(Instant, u64), Waker>,
    seq: u64,
    /// The earliest entry's time, kept beside the map: read on every wake-up of the
    /// connection, where a walk down the map's cold nodes showed in profiles.
    first: Option<Instant>,
}

impl Timers {
    fn add(&mut self, at: Instant, waker: Waker) {
        // Only tells equal deadlines apart: wrapping after 2^64 timers is harmless.
        self.seq = self.seq.wrapping_add(1);
        self.due.insert((at, self.seq), waker);
        self.first = Some(self.first.map_or(at, |f| f.min(at)));
    }

    fn first(&self) -> Option<Instant> {
        self.first
    }

    /// Wakes every watch due by `now`.
    fn fire(&mut self, now: Instant) {
        while let Some(entry) = self.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            entry.remove().wake();
        }
        self.first = self.due.keys().next().map(|(at, _)| *at);
    }
}

/// What ends with a watch stream: the response body (its audit `ResponseComplete` guard and
/// watch place) and the request's place in the connection's activity.
struct Guards {
    _body: Body,
    _busy: Busy,
}

/// What a watch stream holds in the connection's [`Ledger`] beyond what h2 was handed: freed
/// there when it is dropped, however the stream ends.
struct Held {
    ledger: Ledger,
    /// The stream's id, in the ledger and on the wire.
    id: u32,
    /// The part of the last chunk the stream's window has not let out yet (a watch of its
    /// own).
    pending: Bytes,
    /// Frames the stream's window has not let out yet (a watch served from its group's
    /// frames, `share.rs`), and their bytes.
    behind: VecDeque<Bytes>,
    behind_bytes: usize,
}

impl Held {
    fn new(ledger: Ledger, id: u32) -> Self {
        Held {
            ledger,
            id,
            pending: Bytes::new(),
            behind: VecDeque::new(),
            behind_bytes: 0,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let held = self.pending.len().saturating_add(self.behind_bytes);
        self.ledger.end(self.id, held);
    }
}

/// One watch stream on the connection, served from its own watcher: polled by the
/// connection task only. Its frames go to the connection's [`Wire`], not through h2: h2
/// only ends or resets the stream. Once caught up it joins the connection's group of the
/// same watch (`share.rs`).
struct WatchTask {
    stream: WatchStream,
    send: SendStream<Bytes>,
    /// Its id and what it holds in the connection's budget.
    held: Held,
    /// The wake-up filed in the connection's [`Timers`] for this watch.
    armed: Option<Instant>,
    /// Where this watch's waker waits for the budget (`Ledger::spent`).
    parked: Option<u64>,
    /// What this watch last saw of the connection's stream ends: the wire wakes it when
    /// its stream ends (the client reset it) or its flow control broke.
    seen: Seen,
    /// When it may next try to join its group (after a try that found it elsewhere).
    join_at: Instant,
    /// Its connection's wire, timers and groups.
    conn: Arc<ConnState>,
    _guards: Guards,
}

impl WatchTask {
    /// Ends the stream cleanly (at shutdown), dropping what the window held back.
    fn finish(&mut self) {
        let _ = self.send.send_data(Bytes::new(), true);
    }

    /// Waits for the watcher, its next bookmark, its deadline, or the time it may try to
    /// join its group again (it may wait for the watcher a long time, caught up).
    fn idle(&mut self, cx: &Context<'_>) {
        let mut at = self.stream.wake_at();
        if self.join_at > PassClock::now() {
            at = at.min(self.join_at);
        }
        self.arm(at, cx);
    }

    fn arm(&mut self, at: Instant, cx: &Context<'_>) {
        if self.armed != Some(at) {
            self.armed = Some(at);
            self.conn.timers.lock().add(at, cx.waker().clone());
        }
    }

    /// Frames `parts` (within `room`) on the wire and counts them in the ledger.
    fn frame(&mut self, parts: &[Bytes], room: usize) {
        let n = self.conn.wire.frame(self.held.id, parts, room, false);
        self.held.ledger.sent(self.held.id, n);
    }

    /// Frames `part` (within `room`) of a chunk the ledger already holds.
    fn frame_held(&mut self, part: Bytes, room: usize) {
        let n = self.conn.wire.frame(self.held.id, &[part], room, false);
        self.held.ledger.handed(self.held.id, n);
    }

    /// The watch to join a group of, when it may try now: caught up (the caller waits for
    /// its watcher), nothing of its own left to send, not tried in the last second.
    fn share_key(&self, now: Instant) -> Option<ShareKey> {
        if now < self.join_at || !self.held.pending.is_empty() {
            return None;
        }
        self.stream.share_key()
    }

    /// Moved to another place in the connection's set (its group's, or back from it): its
    /// wakers, filed for the old place, are filed again at its next poll.
    fn moved(&mut self) {
        self.armed = None;
        self.parked = None;
        self.seen = Seen::default();
    }

    /// The room the wire gave, or how the poll ends without any: the round is full (come
    /// back after it is written), the stream is gone, or it is reset for its flow control.
    fn room(&mut self, room: Room, cx: &Context<'_>) -> Result<usize, Poll<()>> {
        match room {
            Room::Bytes(n) => Ok(n),
            Room::Yield => Err(yield_round(cx)),
            Room::Gone => Err(Poll::Ready(())),
            Room::Reset(reason) => {
                self.send.send_reset(reason);
                Err(Poll::Ready(()))
            }
        }
    }

    /// Serves the stream until it ends (`Ready(None)`), or until it is caught up and may join
    /// its group (`Ready(Some(key))`, its watcher's waker left filed: a stale wake-up of this
    /// place costs one empty poll).
    fn poll_task(&mut self, cx: &mut Context<'_>) -> Poll<Option<ShareKey>> {
        // The pass's clock reading, read once for all the connection's watches.
        let now = PassClock::now();
        if self.conn.wire.over(cx, self.held.id, &mut self.seen) {
            // Gone, or reset for its flow control.
            if let Some(reason) = self.conn.wire.broken(self.held.id) {
                self.send.send_reset(reason);
            }
            return Poll::Ready(None);
        }
        loop {
            if !self.held.pending.is_empty() {
                let room = match self.conn.wire.poll_room(
                    cx,
                    self.held.id,
                    self.held.pending.len(),
                    Limit::Round,
                ) {
                    Poll::Ready(room) => match self.room(room, cx) {
                        Ok(n) => n,
                        Err(end) => return end.map(|()| None),
                    },
                    Poll::Pending => {
                        // A client that does not read holds a chunk only until the
                        // deadline: then the stream is reset.
                        let deadline = self.stream.deadline();
                        if now >= deadline {
                            self.send.send_reset(Reason::CANCEL);
                            return Poll::Ready(None);
                        }
                        self.arm(deadline, cx);
                        return Poll::Pending;
                    }
                };
                let part = self
                    .held
                    .pending
                    .split_to(room.min(self.held.pending.len()));
                self.frame_held(part, room);
                continue;
            }
            let deadline = self.stream.deadline();
            let past = now >= deadline;
            if !past {
                if self.held.ledger.spent(cx, &mut self.parked) {
                    // The connection holds its budget: the events wait in the ring.
                    self.arm(deadline, cx);
                    return Poll::Pending;
                }
                if self.stream.poll_ready(cx, now).is_pending() {
                    if let Some(key) = self.share_key(now) {
                        return Poll::Ready(Some(key));
                    }
                    self.idle(cx);
                    return Poll::Pending;
                }
            }
            // Something to send: room in the stream's window is asked for only now, and
            // nothing is drained until there is some, so a stream whose client leaves its
            // window shut keeps its events in the ring, not in a batch of its own. Past the
            // deadline only the last bookmark is left to send.
            let want = MAX_BATCH_BYTES;
            let room = match self
                .conn
                .wire
                .poll_room(cx, self.held.id, want, Limit::Round)
            {
                Poll::Ready(room) => match self.room(room, cx) {
                    Ok(n) => n,
                    Err(end) => return end.map(|()| None),
                },
                Poll::Pending if past => {
                    // No room for the last bookmark: the stream ends without it.
                    let _ = self.send.send_data(Bytes::new(), true);
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    self.arm(deadline, cx);
                    return Poll::Pending;
                }
            };
            match self.stream.poll_batch_within(cx, room, now) {
                Poll::Ready(Some(batch)) => {
                    let bytes = batch.iter().fold(0usize, |n, b| n.saturating_add(b.len()));
                    if bytes <= room {
                        self.frame(&batch, room);
                    } else {
                        // One event larger than the room: what fits now, the rest when
                        // the window opens.
                        let mut chunk = crate::http::stream::coalesce(batch, bytes);
                        self.held.ledger.hold(chunk.len());
                        let part = chunk.split_to(room);
                        self.frame_held(part, room);
                        self.held.pending = chunk;
                    }
                }
                Poll::Ready(None) => {
                    self.conn.wire.give_back(self.held.id, room);
                    let _ = self.send.send_data(Bytes::new(), true);
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    self.conn.wire.give_back(self.held.id, room);
                    if let Some(key) = self.share_key(now) {
                        return Poll::Ready(Some(key));
                    }
                    self.idle(cx);
                    return Poll::Pending;
                }
            }
        }
    }
}

thread_local! {
    /// The clock as read at the start of the pass of a connection's watches running on this
    /// thread (`Driver::poll_watches`), if one is running.
    static PASS_NOW: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// One clock reading for a pass over a connection's woken watches: a reading per watch was
/// 3 % of the gateway's time at 5,000 watchers × 100 writes/s (`scripts/profile-fanout.sh`).
/// A pass frames at most a round, so its watches see a clock at most that old, which their
/// deadlines and bookmarks (seconds) do not notice.
struct PassClock;

impl PassClock {
    /// Reads the clock for the pass now starting on this thread, until the guard drops.
    fn start() -> PassClock {
        PASS_NOW.set(Some(Instant::now()));
        PassClock
    }

    /// The pass's reading, or the clock's if no pass is running (a watch polled outside one).
    fn now() -> Instant {
        PASS_NOW.get().unwrap_or_else(Instant::now)
    }
}

impl Drop for PassClock {
    fn drop(&mut self) {
        PASS_NOW.set(None);
    }
}

/// A watch on the connection's task: a stream served from its own watcher, or the streams of
/// one watch served from one (`share.rs`). A stream of its own is the common place and
/// stays unboxed (an allocation more per watch otherwise); a group is one per watch.
#[allow(clippy::large_enum_variant)]
enum ConnWatch {
    One(WatchTask),
    Shared(Box<share::Group>),
    /// Handed to its group (the place's poll then ends).
    Moved,
}

impl ConnWatch {
    /// Ends its streams cleanly (at shutdown).
    fn finish(&mut self) {
        match self {
            ConnWatch::One(t) => t.finish(),
            ConnWatch::Shared(g) => g.finish(),
            ConnWatch::Moved => {}
        }
    }
}

impl Future for ConnWatch {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        loop {
            match this {
                ConnWatch::One(t) => {
                    let Some(key) = std::task::ready!(t.poll_task(cx)) else {
                        return Poll::Ready(());
                    };
                    let ConnWatch::One(task) = std::mem::replace(this, ConnWatch::Moved) else {
                        return Poll::Ready(());
                    };
                    // The first of its watch on the connection becomes its group, in place;
                    // a later one is handed to the group there is.
                    match share::join(task, key) {
                        Some(group) => *this = ConnWatch::Shared(group),
                        None => return Poll::Ready(()),
                    }
                }
                ConnWatch::Shared(g) => return g.poll(cx),
                ConnWatch::Moved => return Poll::Ready(()),
            }
        }
    }
}

/// A watch whose round is full: it comes back once the connection task wrote the round
/// (it wakes itself; the connection's set of watches then ends its pass).
fn yield_round(cx: &Context<'_>) -> Poll<()> {
    cx.waker().wake_by_ref();
    Poll::Pending
}

/// What every request task of a connection shares.
struct ConnState {
    /// This connection's wake group: its watchers are woken together (`WakeGate`).
    id: u64,
    app: Arc<ServerState>,
    ident: Arc<ConnIdentity>,
    activity: Arc<Activity>,
    timers: Arc<Mutex<Timers>>,
    watches: mpsc::Sender<WatchTask>,
    ledger: Ledger,
    wire: Wire,
    /// The groups of the connection's watches, by the watch they serve (`share.rs`).
    groups: share::Groups,
    /// Watches a group let go (they left it, or could not join it): the connection task
    /// puts them back in its set.
    strays: Mutex<Vec<WatchTask>>,
}

/// Connection ids for wake groups; from 1, as 0 is no group. Wrapping after 2^64 would
/// only merge two connections' groups.
static NEXT_CONN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

type Signal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A server-wide flag, waited for by every connection. Its future is polled only until it
/// has registered the connection's waker, and then again only once the flag's channel
/// changed: polling it registers the waker anew under a lock that every connection's task
/// shares, and a connection's task wakes for every event its watches carry.
struct Flag {
    fut: Signal,
    rx: watch::Receiver<bool>,
    /// The waker the future registered when last polled.
    registered: Option<Waker>,
}

impl Flag {
    fn poll_set(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        // A task's waker does not change, so the one registered stays good; a poll with
        // another waker registers it.
        if self
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
            && matches!(self.rx.has_changed(), Ok(false))
        {
            return Poll::Pending;
        }
        self.registered = Some(cx.waker().clone());
        self.fut.as_mut().poll(cx)
    }
}

impl Future for Flag {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().poll_set(cx)
    }
}

fn signal(rx: &watch::Receiver<bool>) -> Flag {
    let mut waited = rx.clone();
    Flag {
        fut: Box::pin(async move { crate::base::lifecycle::until_set(&mut waited).await }),
        rx: rx.clone(),
        registered: None,
    }
}

fn idle(activity: &Arc<Activity>, after: Duration) -> Signal {
    let activity = activity.clone();
    Box::pin(async move { activity.idle_for(after).await })
}

/// Serves one h2 connection until it ends: closed by the client, with GOAWAY once `stop` is
/// set (watches end when the server's watch stop is set) or after the idle timeout.
pub async fn serve<I>(
    io: I,
    app: Arc<ServerState>,
    ident: Arc<ConnIdentity>,
    limits: Limits,
    stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Activity::new();
    let ledger = Ledger::new(
        app.h2_watch_held.clone(),
        app.h2_writes.clone(),
        app.h2_short_writes.clone(),
    );
    let round = Round::default();
    let wire = Wire::default();
    let io = LedgerIo::new(io, ledger.clone(), round.clone(), wire.clone());
    let stop_accepting = signal(&stop);
    let mut idle_fut = idle(&activity, limits.idle_timeout);
    let handshake = builder(&limits).handshake::<_, Bytes>(io);
    // A connection opened as shutdown began still completes its handshake: it then says
    // GOAWAY at once, and serves the streams its client sent before hearing it.
    let mut late = stop.clone();
    let mut conn = tokio::select! {
        r = handshake => match r {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "h2 handshake failed");
                return;
            }
        },
        () = crate::base::lifecycle::grace_after(&mut late, CLOSE_GRACE) => return,
        () = &mut idle_fut => return,
    };
    let keepalive = Keepalive {
        ping: conn.ping_pong(),
        timer: Box::pin(tokio::time::sleep(PING_INTERVAL)),
        awaiting_pong: false,
    };
    let (watch_tx, watch_rx) =
        mpsc::channel::<WatchTask>(limits.max_concurrent_streams.clamp(1, 4096) as usize);
    let shared = Arc::new(ConnState {
        id: NEXT_CONN.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        app: app.clone(),
        ident,
        activity: activity.clone(),
        timers: Arc::new(Mutex::new(Timers::default())),
        watches: watch_tx,
        ledger,
        wire,
        groups: share::Groups::default(),
        strays: Mutex::new(Vec::new()),
    });
    let mut driver = Driver {
        conn,
        stop_watches: signal(&app.api.stop_watches),
        shared,
        activity,
        stop_accepting,
        idle_fut,
        idle_seen: None,
        closing: false,
        watches_stopped: false,
        watch_rx,
        watches: FuturesUnordered::new(),
        timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        timer_at: None,
        keepalive,
        round,
        farewell: Some(app.farewells.owe()),
    };
    let result = std::future::poll_fn(|cx| {
        let r = driver.poll(cx);
        // A poll that closed the connection passed its GOAWAY to the socket.
        if driver.closing {
            driver.farewell = None;
        }
        r
    })
    .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "h2 connection ended with an error");
    }
}

impl<I> Drop for Driver<I> {
    fn drop(&mut self) {
        // Watches (and groups' joiners) hold the connection's state: dropped here, not left
        // in it.
        self.watches.clear();
        self.shared.strays.lock().clear();
        self.shared.groups.clear();
    }
}

/// One connection's task between wake-ups: its signals, its watches with their one timer, its
/// keepalive, and the connection itself.
struct Driver<I> {
    conn: h2::server::Connection<I, Bytes>,
    shared: Arc<ConnState>,
    activity: Arc<Activity>,
    /// The server stops accepting: GOAWAY.
    stop_accepting: Flag,
    /// Idle past `--http-idle-timeout` (or past the grace once closing).
    idle_fut: Signal,
    /// `Activity::changes` when `idle_fut` was last polled while requests were in flight
    /// (then it waits for a change of that count, and the waker it was polled with is
    /// registered).
    idle_seen: Option<(u64, Waker)>,
    closing: bool,
    /// The server ends its watches.
    stop_watches: Flag,
    watches_stopped: bool,
    watch_rx: mpsc::Receiver<WatchTask>,
    watches: FuturesUnordered<ConnWatch>,
    timer: Pin<Box<Sleep>>,
    timer_at: Option<Instant>,
    keepalive: Keepalive,
    /// Open while a round moves frames into h2: its writes are gathered into one.
    round: Round,
    /// Owed until the poll that starts the graceful close (shutdown waits for every one).
    farewell: Option<Farewell>,
}

/// The connection's keepalive: a PING when requests are in flight and nothing was heard for
/// `PING_INTERVAL`; no PONG within `PING_TIMEOUT` ends the connection.
struct Keepalive {
    ping: Option<h2::PingPong>,
    timer: Pin<Box<Sleep>>,
    awaiting_pong: bool,
}

impl Keepalive {
    /// `Err` when a ping went unanswered.
    fn poll(&mut self, cx: &mut Context<'_>, in_flight: usize) -> Result<(), ()> {
        let Some(p) = self.ping.as_mut() else {
            return Ok(());
        };
        let after = |d| crate::base::deadline::Deadline::later(Instant::now(), d);
        if self.awaiting_pong && p.poll_pong(cx).is_ready() {
            self.awaiting_pong = false;
            self.timer.as_mut().reset(after(PING_INTERVAL));
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            if self.awaiting_pong {
                tracing::debug!("no answer to a keepalive ping: closing the connection");
                return Err(());
            }
            if in_flight > 0 && p.send_ping(h2::Ping::opaque()).is_ok() {
                self.awaiting_pong = true;
                self.timer.as_mut().reset(after(PING_TIMEOUT));
            } else {
                self.timer.as_mut().reset(after(PING_INTERVAL));
            }
            cx.waker().wake_by_ref();
        }
        Ok(())
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> Driver<I> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), h2::Error>> {
        if self.poll_signals(cx) {
            return Poll::Ready(Ok(()));
        }
        if let Some(reason) = self.shared.wire.take_error() {
            // The client broke the connection's flow control (the wire reads its
            // WINDOW_UPDATEs, h2 does not).
            self.conn.abrupt_shutdown(reason);
        }
        self.round.open();
        self.shared.wire.open_round();
        self.poll_watches(cx);
        if self.keepalive.poll(cx, self.activity.in_flight()).is_err() {
            return Poll::Ready(Ok(()));
        }
        // ...and the connection writes them all, then takes new requests. Its writes are
        // gathered while the round is open; once h2 has nothing more to do, the round closes
        // and h2 is polled once more, to pass what was gathered to the socket in one write.
        loop {
            match self.conn.poll_accept(cx) {
                Poll::Ready(Some(Ok((req, respond)))) => spawn_request(&self.shared, req, respond),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending if self.round.is_open() => self.round.close(),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The watch stop, the accept stop and the idle timeout; true when the connection must
    /// be dropped now.
    fn poll_signals(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.watches_stopped && self.stop_watches.poll_set(cx).is_ready() {
            self.watches_stopped = true;
            // GOAWAY first, so a client learns the connection is going before it sees its
            // watches end: it then opens the next watch elsewhere instead of on this
            // connection as it closes (which Go's client may report as a broken pipe, and
            // client-go's reflector answers with a full relist).
            self.close();
            for w in self.watches.iter_mut() {
                w.finish();
            }
            self.watches.clear();
            for mut w in std::mem::take(&mut *self.shared.strays.lock()) {
                w.finish();
            }
        }
        if !self.closing && self.stop_accepting.poll_set(cx).is_ready() {
            self.close();
        }
        if self.poll_idle(cx) {
            if self.closing {
                // Asked to close and still carrying nothing: drop it.
                tracing::debug!("dropping a connection that did not close when asked");
                return true;
            }
            tracing::debug!("closing an idle connection");
            self.close();
            if self.poll_idle(cx) {
                return true;
            }
        }
        false
    }

    /// Polls the idle timer, unless requests are in flight and their count has not changed
    /// since it was last polled (it then only waits for that change); true once idle.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> bool {
        let changes = self.activity.changes();
        if self
            .idle_seen
            .as_ref()
            .is_some_and(|(seen, w)| *seen == changes && w.will_wake(cx.waker()))
        {
            return false;
        }
        // Read before the poll: a change during it is seen at the next wake-up.
        let busy = self.activity.in_flight() > 0;
        if self.idle_fut.as_mut().poll(cx).is_ready() {
            return true;
        }
        self.idle_seen = busy.then(|| (changes, cx.waker().clone()));
        false
    }

    /// Starts a graceful close (GOAWAY), once: the connection is then dropped when it has
    /// carried nothing for [`CLOSE_GRACE`].
    fn close(&mut self) {
        if !self.closing {
            self.closing = true;
            self.conn.graceful_shutdown();
            self.idle_fut = idle(&self.activity, CLOSE_GRACE);
            self.idle_seen = None;
        }
    }

    /// New watches join the set; every woken watch moves its frames into its stream; the one
    /// timer wakes those whose bookmark or deadline is due.
    fn poll_watches(&mut self, cx: &mut Context<'_>) {
        while let Poll::Ready(Some(mut w)) = self.watch_rx.poll_recv(cx) {
            if self.watches_stopped {
                w.finish();
            } else {
                self.watches.push(ConnWatch::One(w));
            }
        }
        {
            let _pass = PassClock::start();
            loop {
                while let Poll::Ready(Some(())) = self.watches.poll_next_unpin(cx) {}
                let strays = std::mem::take(&mut *self.shared.strays.lock());
                if strays.is_empty() {
                    break;
                }
                for mut w in strays {
                    if self.watches_stopped {
                        w.finish();
                    } else {
                        w.moved();
                        self.watches.push(ConnWatch::One(w));
                    }
                }
            }
        }
        let next = self.shared.timers.lock().first();
        if let Some(at) = next {
            if self.timer_at != Some(at) {
                self.timer.as_mut().reset(at);
                self.timer_at = Some(at);
            }
            if self.timer.as_mut().poll(cx).is_ready() {
                self.timer_at = None;
                self.shared.timers.lock().fire(Instant::now());
                cx.waker().wake_by_ref();
            }
        }
    }
}

/// Runs one request through the pipeline in its own task; a watch's stream then goes to the
/// connection task, any other response is written from here.
fn spawn_request(shared: &Arc<ConnState>, req: Request<RecvStream>, respond: SendResponse<Bytes>) {
    let busy = shared.activity.begin();
    let shared = shared.clone();
    let bulk = shared
        .app
        .bulk
        .as_ref()
        .filter(|_| is_list(req.method(), req.uri()))
        .map(|b| b.handle().clone());
    let task = async move {
        let head_only = req.method() == Method::HEAD;
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let req = req.map(|recv| RequestBody::H2(H2Body::new(recv, declared)));
        let caller = Caller::Connection(shared.ident.clone());
        let resp = pipeline::handle(shared.app.clone(), caller, req).await;
        let stream = resp
            .extensions()
            .get::<WatchHandoff>()
            .and_then(WatchHandoff::take);
        match stream {
            Some(stream) => hand_over(shared.clone(), respond, resp, *stream, busy).await,
            None => {
                write_response(respond, resp, head_only, &shared.wire).await;
                drop(busy);
            }
        }
    };
    // A list's task runs on the bulk threads (`bulk.rs`).
    match bulk {
        Some(on) => drop(on.spawn(task)),
        None => drop(tokio::spawn(task)),
    }
}

/// The response head without what h2 forbids, with `content-length` when the body's size is
/// known and a `date`, as hyper wrote them.
fn head(parts: http::response::Parts, len: Option<u64>) -> Response<()> {
    let mut head = Response::from_parts(parts, ());
    let headers = head.headers_mut();
    for h in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(h);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    if let Some(len) = len
        && !headers.contains_key(header::CONTENT_LENGTH)
    {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
    crate::http::respond::ensure_date(headers);
    head.extensions_mut().clear();
    head
}

async fn hand_over(
    shared: Arc<ConnState>,
    mut respond: SendResponse<Bytes>,
    resp: Response<Body>,
    stream: WatchStream,
    busy: Busy,
) {
    let (parts, body) = resp.into_parts();
    let Ok(send) = respond.send_response(head(parts, None), false) else {
        return;
    };
    stream.set_wake_group(shared.id);
    let task = WatchTask {
        held: Held::new(shared.ledger.clone(), send.stream_id().as_u32()),
        stream,
        send,
        armed: None,
        parked: None,
        seen: Seen::default(),
        join_at: Instant::now(),
        conn: shared.clone(),
        _guards: Guards {
            _body: body,
            _busy: busy,
        },
    };
    // Bounded by the connection's stream limit; fails only once the connection is gone.
    let _ = shared.watches.send(task).await;
}

/// Writes a response body on the connection's [`Wire`], within the stream's and the
/// connection's flow-control windows and the wire's budget: never more than the client lets
/// out is framed, and a slow reader holds up its writer, not the connection's memory.
async fn write_response(
    mut respond: SendResponse<Bytes>,
    resp: Response<Body>,
    head_only: bool,
    wire: &Wire,
) {
    use hyper::body::Body as _;
    let (parts, mut body) = resp.into_parts();
    let len = body.size_hint().exact();
    let end = head_only || body.is_end_stream();
    let Ok(mut send) = respond.send_response(head(parts, len), end) else {
        return;
    };
    if end {
        return;
    }
    let id = send.stream_id().as_u32();
    let mut seen = Seen::default();
    loop {
        // A client that resets the stream (or drops the connection) ends the body at once,
        // not at its next frame: a watch passed through to proxy mode's upstream would
        // otherwise stay open there until the upstream next sends something.
        let next = std::future::poll_fn(|cx| {
            if wire.over(cx, id, &mut seen) || send.poll_reset(cx).is_ready() {
                return Poll::Ready(None);
            }
            std::pin::Pin::new(&mut body).poll_frame(cx).map(Some)
        })
        .await;
        let Some(next) = next else {
            // Reset by the client, or for its flow control (then said so).
            if let Some(reason) = wire.broken(id) {
                send.send_reset(reason);
            }
            return;
        };
        let Some(frame) = next else {
            break;
        };
        let Ok(frame) = frame else {
            send.send_reset(Reason::INTERNAL_ERROR);
            return;
        };
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        while !data.is_empty() {
            let room = std::future::poll_fn(|cx| {
                wire.poll_room(cx, id, data.len(), Limit::Unwritten(WRITE_BUDGET))
            })
            .await;
            let room = match room {
                Room::Bytes(n) => n,
                // Only a watch's round yields.
                Room::Yield => continue,
                Room::Gone => return,
                Room::Reset(reason) => {
                    send.send_reset(reason);
                    return;
                }
            };
            let part = data.split_to(room.min(data.len()));
            wire.frame(id, &[part], room, true);
        }
    }
    let _ = send.send_data(Bytes::new(), true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_wake_what_is_due_and_keep_the_rest() {
        let mut t = Timers::default();
        let now = Instant::now();
        let (woken, waker) = crate::serve::h2wire::counting_waker();
        t.add(now + Duration::from_secs(5), waker.clone());
        t.add(now, waker.clone());
        t.add(now, waker);
        assert_eq!(t.first(), Some(now));
        t.fire(now);
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(t.first(), Some(now + Duration::from_secs(5)));
    }

    #[test]
    fn a_flag_wakes_the_waker_it_was_last_polled_with_once_set() {
        use std::sync::atomic::Ordering::SeqCst;
        let (tx, rx) = watch::channel(false);
        let mut flag = signal(&rx);
        let (a_woken, a) = crate::serve::h2wire::counting_waker();
        let (b_woken, b) = crate::serve::h2wire::counting_waker();
        assert!(flag.poll_set(&mut Context::from_waker(&a)).is_pending());
        assert!(flag.poll_set(&mut Context::from_waker(&a)).is_pending());
        // Polled with another waker: that one is registered, not skipped.
        assert!(flag.poll_set(&mut Context::from_waker(&b)).is_pending());
        tx.send(true).unwrap();
        assert_eq!(b_woken.load(SeqCst), 1, "the last waker is woken");
        assert!(flag.poll_set(&mut Context::from_waker(&b)).is_ready());
        assert_eq!(a_woken.load(SeqCst), 0, "the waker replaced is not");
        // A flag set before its first poll is seen at once.
        let mut late = signal(&rx);
        assert!(late.poll_set(&mut Context::from_waker(&a)).is_ready());
    }

    #[test]
    fn a_watch_on_a_connection_stays_small() {
        // The per-stream state the connection task keeps (the h2 crate's own stream state
        // and the cache watcher come on top).
        assert!(
            std::mem::size_of::<WatchTask>() <= 512,
            "{}",
            std::mem::size_of::<WatchTask>()
        );
    }
}
