//! The watches of one h2 connection that watch the same thing from the same place, served
//! from one registration: one queue, one wake-up and one drain per event for all of them,
//! whose frames are then framed once per stream (a DATA header and a copy each, under one
//! lock of the wire), as a raw socket server multiplexing its streams would write them.
//!
//! A watch starts on its own ([`WatchTask`]): its initial events, a resumed history, an error
//! are its alone. Once it has caught up and waits for its watcher, it joins the connection's
//! [`Group`] of its watch (the same cache, filter, media type and bookmarks,
//! `Watcher::share_key`), or becomes that group. The group takes it in only at its own place
//! (`Watcher::absorb`: the same events queued for both); a watch found elsewhere goes back
//! to its own set and tries again a second later.
//!
//! What stays a stream's own: its deadline (with its last bookmark), its end or reset by the
//! client, and its flow control. A stream whose window cannot take a batch keeps the frames
//! behind, shared, and catches up as its window opens; once more than [`BEHIND_LIMIT`] is
//! behind it leaves, with a registration of its own at the group's place
//! (`Watcher::fork`), and goes at its own pace, as every watch did before: so one slow
//! client never holds up the others, nor makes the group hold more than that per stream.
//! The connection's window is every stream's: when it cannot take the batch, the group
//! waits for the client to open it, with the events after the batch left in the ring, so a
//! client that reads slower than events come gets them in fewer, larger DATA frames.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use svc_core::watch::Watcher;

use super::*;
use crate::base::deadline::Deadline as _;
use crate::serve::h2wire::Each;

/// How long a watch that could not join its group waits before it tries again.
const JOIN_RETRY: Duration = Duration::from_secs(1);

/// What a stream of a group may have behind (its window too short to take the frames)
/// before it leaves the group: a batch's worth.
pub(super) const BEHIND_LIMIT: usize = MAX_BATCH_BYTES;

/// The most a group drains from its watcher at once. At a light load that is the one event
/// just queued. When events queued up meanwhile (the connection's budget or window held the
/// group, or its turn came late), each stream gets them in one DATA frame of up to this
/// size, where a share of a round per member ([`ROUND_BYTES`](crate::serve::h2wire::ROUND_BYTES)
/// over 100 members is less than one event) sent them one to a frame, each a read for the
/// client. Small enough for the windows clients open (64 KiB at the least) to take several.
const GROUP_BATCH_BYTES: usize = 16 * 1024;

/// A connection's groups, by the watch they serve.
#[derive(Default)]
pub(super) struct Groups(Mutex<HashMap<ShareKey, Arc<Inbox>>>);

impl Groups {
    /// Drops every group's joiners (the connection is gone).
    pub(super) fn clear(&self) {
        for (_, inbox) in self.0.lock().drain() {
            inbox.tasks.lock().clear();
        }
    }
}

/// Where watches wait to be taken into a group.
#[derive(Default)]
pub(super) struct Inbox {
    tasks: Mutex<Vec<WatchTask>>,
    /// Set with a task in `tasks`: the group looks there only then.
    waiting: AtomicBool,
    /// The group's waker, kept at its first poll (a task's waker stays good).
    waker: Mutex<Option<Waker>>,
}

/// Hands `task` (caught up, its watch `key`) to the connection's group of its watch, or makes
/// it that group when there is none yet.
pub(super) fn join(mut task: WatchTask, key: ShareKey) -> Option<Box<Group>> {
    let conn = task.conn.clone();
    let mut groups = conn.groups.0.lock();
    if let Some(inbox) = groups.get(&key) {
        inbox.tasks.lock().push(task);
        inbox.waiting.store(true, Ordering::Release);
        if let Some(w) = inbox.waker.lock().as_ref() {
            w.wake_by_ref();
        }
        return None;
    }
    let Some(leader) = task.stream.take_watcher() else {
        // No watcher to share after all: it goes on as it was.
        conn.strays.lock().push(task);
        return None;
    };
    let inbox = Arc::new(Inbox::default());
    groups.insert(key, inbox.clone());
    drop(groups);
    Some(Group::new(task, leader, key, inbox))
}

/// One stream of a group.
struct Member {
    send: SendStream<Bytes>,
    /// Its deadline and counts (its watcher is the group's).
    stream: WatchStream,
    /// Its id and the frames it has behind.
    held: Held,
    seen: Seen,
    /// The last batch it was given ([`Group::seq`]).
    got: u64,
    _guards: Guards,
}

impl Member {
    fn id(&self) -> u32 {
        self.held.id
    }

    fn keep_behind(&mut self, frames: &[Bytes], bytes: usize) {
        self.held.behind.extend(frames.iter().cloned());
        self.held.behind_bytes = self.held.behind_bytes.saturating_add(bytes);
        self.held.ledger.hold(bytes);
    }
}

/// The streams of one watch on a connection, served from one watcher.
pub(super) struct Group {
    key: ShareKey,
    inbox: Arc<Inbox>,
    conn: Arc<ConnState>,
    leader: Watcher,
    members: Vec<Member>,
    /// The earliest deadline of a member.
    next_deadline: Instant,
    /// The wake-up filed in the connection's timers.
    armed: Option<Instant>,
    /// Where the group's waker waits for the budget (`Ledger::spent`).
    parked: Option<u64>,
    /// The connection's count of stream ends when the members were last looked at.
    ends_seen: Option<u64>,
    waker_kept: bool,
    /// The batch being given to the members, shared (not counted against the budget: one
    /// batch may pass it, as for a watch of its own), its bytes and its number; members take
    /// it as far as the connection's budget lets them.
    batch: Vec<Bytes>,
    batch_bytes: usize,
    seq: u64,
    /// The batch ends the watch (its ERROR): once every member has it, the streams end.
    finished: bool,
    /// Some member may have frames behind.
    any_behind: bool,
    /// Kept from batch to batch: the members framed together, and what became of each.
    ids: Vec<u32>,
    each: Vec<Each>,
}

impl Group {
    fn new(task: WatchTask, leader: Watcher, key: ShareKey, inbox: Arc<Inbox>) -> Box<Group> {
        let conn = task.conn.clone();
        let mut group = Box::new(Group {
            key,
            inbox,
            conn,
            leader,
            members: Vec::new(),
            next_deadline: task.stream.deadline(),
            armed: None,
            parked: None,
            ends_seen: None,
            waker_kept: false,
            batch: Vec::new(),
            batch_bytes: 0,
            seq: 0,
            finished: false,
            any_behind: false,
            ids: Vec::new(),
            each: Vec::new(),
        });
        group.admit(task);
        group
    }

    fn admit(&mut self, task: WatchTask) {
        let WatchTask {
            stream,
            send,
            held,
            _guards,
            ..
        } = task;
        self.next_deadline = self.next_deadline.min(stream.deadline());
        self.members.push(Member {
            send,
            stream,
            held,
            seen: Seen::default(),
            // At the leader's place: past the batch being given.
            got: self.seq,
            _guards,
        });
        // Its stream's end is looked for at the next poll (and its waker filed there).
        self.ends_seen = None;
    }

    /// Ends every stream cleanly (at shutdown), its joiners' too.
    pub(super) fn finish(&mut self) {
        for m in &mut self.members {
            let _ = m.send.send_data(Bytes::new(), true);
        }
        self.members.clear();
        for mut t in std::mem::take(&mut *self.inbox.tasks.lock()) {
            t.finish();
        }
    }

    /// Serves the group's streams until the last has ended.
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let now = PassClock::now();
        if !self.waker_kept {
            *self.inbox.waker.lock() = Some(cx.waker().clone());
            self.waker_kept = true;
        }
        if self.inbox.waiting.load(Ordering::Acquire) {
            self.take_in(now);
        }
        self.drop_ended(cx);
        if now >= self.next_deadline {
            self.end_due(cx, now);
        }
        // A drain that found nothing is not tried again for a bookmark in this poll.
        let mut drained_nothing = false;
        loop {
            if self.members.is_empty() {
                return Poll::Ready(());
            }
            if self.any_behind && self.push_behind(cx, now) {
                return yield_round(cx);
            }
            if !self.batch.is_empty() {
                match self.deliver(cx) {
                    Deliver::Done => {
                        self.batch.clear();
                        if self.finished {
                            // An ERROR ended the watch (410: the ring moved past it).
                            self.end_all();
                            return Poll::Ready(());
                        }
                    }
                    Deliver::Spent => {
                        // The connection holds its budget: the rest waits for the socket.
                        self.arm(cx);
                        return Poll::Pending;
                    }
                    Deliver::Full => return yield_round(cx),
                    Deliver::Window => {
                        // The client has not read what it has: the rest waits for its
                        // window, and the events after it in the ring, to go in one
                        // batch once it opens.
                        self.arm(cx);
                        return Poll::Pending;
                    }
                }
                continue;
            }
            if self.conn.ledger.spent(cx, &mut self.parked) {
                // The events wait in the ring.
                self.arm(cx);
                return Poll::Pending;
            }
            let std_now = now.into_std();
            let due =
                !drained_nothing && self.leader.next_bookmark_at().is_some_and(|b| b <= std_now);
            if !due && self.leader.poll_ready(cx).is_pending() {
                self.arm(cx);
                return Poll::Pending;
            }
            // What is queued, up to a batch (at least one event): the round is bounded by
            // the members given it per call (`deliver`), not by the batch's size.
            let drained = self.leader.drain(GROUP_BATCH_BYTES, std_now);
            self.finished = drained.finished;
            if drained.frames.is_empty() {
                if self.finished {
                    self.end_all();
                    return Poll::Ready(());
                }
                drained_nothing = true;
                continue;
            }
            self.batch = drained.frames;
            self.batch_bytes = drained.bytes;
            self.seq = self.seq.wrapping_add(1);
        }
    }

    /// Takes in the watches waiting in the inbox that are at the group's place; the others
    /// go back to the connection's set, to try again later.
    fn take_in(&mut self, now: Instant) {
        self.inbox.waiting.store(false, Ordering::Release);
        let tasks = std::mem::take(&mut *self.inbox.tasks.lock());
        for mut task in tasks {
            let Some(watcher) = task.stream.take_watcher() else {
                self.conn.strays.lock().push(task);
                continue;
            };
            match self.leader.absorb(watcher) {
                Ok(()) => self.admit(task),
                Err(watcher) => {
                    task.stream.put_watcher(watcher);
                    task.join_at = now.later(JOIN_RETRY);
                    self.conn.strays.lock().push(task);
                }
            }
        }
    }

    /// Drops the members whose stream ended (the client reset it) or broke its flow control
    /// (reset here), looked for only when a stream of the connection ended since.
    fn drop_ended(&mut self, cx: &Context<'_>) {
        let ends = self.conn.wire.ends();
        if self.ends_seen == Some(ends) {
            return;
        }
        self.ends_seen = Some(ends);
        let wire = &self.conn.wire;
        let before = self.members.len();
        self.members.retain_mut(|m| {
            if !wire.over(cx, m.held.id, &mut m.seen) {
                return true;
            }
            if let Some(reason) = wire.broken(m.held.id) {
                m.send.send_reset(reason);
            }
            false
        });
        if self.members.len() != before {
            self.next_deadline = self.earliest_deadline();
        }
    }

    /// Ends the members past their deadline: a last bookmark if the stream has room for it
    /// and nothing behind (then the client knows how far it got), then END_STREAM. A stream
    /// still holding frames its client did not let out is reset, as a watch of its own is.
    fn end_due(&mut self, cx: &Context<'_>, now: Instant) {
        let mut last: Option<Option<Bytes>> = None;
        let mut i = 0;
        while let Some(m) = self.members.get(i) {
            if m.stream.deadline() > now {
                i = i.saturating_add(1);
                continue;
            }
            let mut m = self.members.swap_remove(i);
            if m.held.behind_bytes > 0 {
                m.send.send_reset(Reason::CANCEL);
                continue;
            }
            let bookmark = last.get_or_insert_with(|| self.leader.final_bookmark());
            if let Some(b) = bookmark.clone() {
                let wire = &self.conn.wire;
                let id = m.id();
                let limit = Limit::Unwritten(usize::MAX);
                if let Poll::Ready(Room::Bytes(room)) = wire.poll_room(cx, id, b.len(), limit) {
                    if room >= b.len() {
                        let n = wire.frame(id, std::slice::from_ref(&b), room, false);
                        self.conn.ledger.sent(id, n);
                        m.stream.record_shared(std::slice::from_ref(&b), 1);
                    } else {
                        wire.give_back(id, room);
                    }
                }
            }
            let _ = m.send.send_data(Bytes::new(), true);
        }
        self.next_deadline = self.earliest_deadline();
    }

    fn earliest_deadline(&self) -> Instant {
        self.members
            .iter()
            .map(|m| m.stream.deadline())
            .min()
            .unwrap_or_else(|| Instant::now().later(Duration::from_secs(3600)))
    }

    /// Frames what the members' windows let out of what they have behind; a member past
    /// [`BEHIND_LIMIT`] leaves. True when the round is full.
    fn push_behind(&mut self, cx: &Context<'_>, now: Instant) -> bool {
        let mut i = 0;
        let mut full = false;
        self.any_behind = false;
        while let Some(m) = self.members.get_mut(i) {
            if m.held.behind_bytes == 0 {
                i = i.saturating_add(1);
                continue;
            }
            let caught = catch_up(&self.conn.wire, m, cx);
            let (still, over) = (m.held.behind_bytes > 0, m.held.behind_bytes > BEHIND_LIMIT);
            match caught {
                Catch::Kept => self.any_behind |= still,
                Catch::Full => full = true,
                Catch::Ended(reason) => {
                    let mut m = self.members.swap_remove(i);
                    if let Some(reason) = reason {
                        m.send.send_reset(reason);
                    }
                    self.next_deadline = self.earliest_deadline();
                    continue;
                }
            }
            if over {
                let m = self.members.swap_remove(i);
                self.leave(m, now);
                self.next_deadline = self.earliest_deadline();
                continue;
            }
            if full {
                // The rest are looked at after the round.
                self.any_behind = true;
                break;
            }
            i = i.saturating_add(1);
        }
        full
    }

    /// A member too far behind goes at its own pace: with a registration of its own at the
    /// group's place, after the frames it has behind. If the cache will not register one
    /// (full, or the ring moved on), it sends what it has behind and ends; its client
    /// resumes from there.
    fn leave(&self, m: Member, now: Instant) {
        let watcher = self.leader.fork(now.into_std()).ok();
        if let Some(w) = &watcher {
            w.set_wake_group(self.conn.id);
        }
        self.alone(m, watcher, now.later(JOIN_RETRY));
    }

    /// Puts `m` back in the connection's set as a watch of its own, served from `watcher`
    /// after its frames behind (without one, it ends once they are out).
    fn alone(&self, m: Member, watcher: Option<Watcher>, join_at: Instant) {
        let Member {
            send,
            mut stream,
            mut held,
            seen,
            _guards,
            ..
        } = m;
        if let Some(w) = watcher {
            stream.put_watcher(w);
        }
        let behind = std::mem::take(&mut held.behind);
        let bytes = std::mem::replace(&mut held.behind_bytes, 0);
        held.pending = crate::http::stream::coalesce(behind.into_iter().collect(), bytes);
        self.conn.strays.lock().push(WatchTask {
            stream,
            send,
            held,
            armed: None,
            parked: None,
            seen,
            join_at,
            conn: self.conn.clone(),
            _guards,
        });
    }

    /// Gives the batch to the members that do not have it yet: framed at once for those
    /// with nothing behind whose windows take it, as many as the connection's budget lets;
    /// kept behind for those whose stream's window does not. When the connection's window
    /// does not, the rest wait for it (it is every stream's: nobody is behind).
    fn deliver(&mut self, cx: &Context<'_>) -> Deliver {
        let (seq, bytes) = (self.seq, self.batch_bytes);
        loop {
            if self.conn.ledger.spent(cx, &mut self.parked) {
                return Deliver::Spent;
            }
            let fit = self
                .conn
                .ledger
                .room()
                .checked_div(bytes)
                .unwrap_or(usize::MAX)
                .max(1);
            self.ids.clear();
            let mut given = 0usize;
            for m in &mut self.members {
                if m.got == seq {
                    continue;
                }
                if m.held.behind_bytes > 0 {
                    // Behind already: the batch joins what it has.
                    m.keep_behind(&self.batch, bytes);
                    m.got = seq;
                    given = given.saturating_add(1);
                    self.any_behind = true;
                } else if self.ids.len() < fit {
                    self.ids.push(m.held.id);
                }
            }
            if self.ids.is_empty() {
                self.record(given);
                return Deliver::Done;
            }
            let full = self
                .conn
                .wire
                .frame_each(&self.ids, &self.batch, bytes, &mut self.each);
            self.conn.ledger.sent_each(
                self.ids
                    .iter()
                    .zip(&self.each)
                    .filter(|(_, e)| **e == Each::Framed)
                    .map(|(id, _)| *id),
                bytes,
            );
            let mut k = 0usize;
            let mut ended = false;
            // A stream the connection's window could not take: the group waits for the
            // window.
            let mut conn_short = false;
            for m in &mut self.members {
                if m.got == seq || self.ids.get(k) != Some(&m.held.id) {
                    continue;
                }
                let each = self.each.get(k).copied();
                k = k.saturating_add(1);
                match each {
                    Some(Each::Conn) => {
                        // Not given: the batch waits, and the events after it in the ring.
                        conn_short = true;
                        continue;
                    }
                    Some(Each::Framed) => {}
                    Some(Each::Gone) => ended = true,
                    Some(Each::Broken) => {
                        m.send.send_reset(Reason::FLOW_CONTROL_ERROR);
                        ended = true;
                    }
                    Some(Each::Short) | None => {
                        m.keep_behind(&self.batch, bytes);
                        self.any_behind = true;
                    }
                }
                m.got = seq;
                given = given.saturating_add(1);
            }
            self.record(given);
            if ended {
                // Those the wire no longer knows (ended, or reset just now) are dropped at
                // the next poll, which their end woke.
                self.ends_seen = None;
            }
            if conn_short && self.conn.wire.wait_conn(cx, bytes) {
                return Deliver::Window;
            }
            if full {
                return Deliver::Full;
            }
        }
    }

    /// Counts the batch as written to `given` more streams.
    fn record(&self, given: usize) {
        if let Some(m) = self.members.first() {
            m.stream.record_shared(&self.batch, given);
        }
    }

    /// Ends every member's stream (its watch ended with an ERROR, framed already).
    fn end_all(&mut self) {
        for mut m in std::mem::take(&mut self.members) {
            if m.held.behind_bytes > 0 {
                // Its ERROR is behind: it finishes on its own, then ends (it has no
                // watcher left, so it never joins again).
                self.alone(m, None, Instant::now());
                continue;
            }
            let _ = m.send.send_data(Bytes::new(), true);
        }
    }

    /// Files the group's wake-up: the leader's next bookmark or the earliest deadline.
    fn arm(&mut self, cx: &Context<'_>) {
        let mut at = self.next_deadline;
        if let Some(b) = self.leader.next_bookmark_at() {
            at = at.min(Instant::from_std(b));
        }
        if self.armed != Some(at) {
            self.armed = Some(at);
            self.conn.timers.lock().add(at, cx.waker().clone());
        }
    }
}

/// Frames what the member's window lets out of its frames behind.
fn catch_up(wire: &Wire, m: &mut Member, cx: &Context<'_>) -> Catch {
    let id = m.id();
    while m.held.behind_bytes > 0 {
        let room = match wire.poll_room(cx, id, m.held.behind_bytes, Limit::Round) {
            Poll::Ready(Room::Bytes(n)) => n,
            Poll::Ready(Room::Yield) => return Catch::Full,
            Poll::Ready(Room::Gone) => return Catch::Ended(None),
            Poll::Ready(Room::Reset(reason)) => return Catch::Ended(Some(reason)),
            // Its waker is filed for the window.
            Poll::Pending => return Catch::Kept,
        };
        let mut parts = Vec::new();
        let mut left = room;
        while left > 0 {
            let Some(front) = m.held.behind.front_mut() else {
                break;
            };
            if front.len() <= left {
                left = left.saturating_sub(front.len());
                if let Some(f) = m.held.behind.pop_front() {
                    parts.push(f);
                }
            } else {
                parts.push(front.split_to(left));
                left = 0;
            }
        }
        let n = wire.frame(id, &parts, room, false);
        m.held.behind_bytes = m.held.behind_bytes.saturating_sub(n);
        m.held.ledger.handed(id, n);
    }
    Catch::Kept
}

/// How far a batch got.
enum Deliver {
    /// Every member has it.
    Done,
    /// The connection's budget is spent: the group waits for the socket.
    Spent,
    /// The round is full.
    Full,
    /// The connection's window is shorter than the batch: the group waits for the client
    /// to open it.
    Window,
}

/// What became of a member catching up.
enum Catch {
    /// Still a member (caught up, or waiting for its window).
    Kept,
    /// The round is full.
    Full,
    /// Its stream is over; reset it with the reason, if any.
    Ended(Option<Reason>),
}

impl Drop for Group {
    fn drop(&mut self) {
        let mut groups = self.conn.groups.0.lock();
        if groups
            .get(&self.key)
            .is_some_and(|i| Arc::ptr_eq(i, &self.inbox))
        {
            groups.remove(&self.key);
        }
        drop(groups);
        // Watches handed to it and not taken in yet go on on their own.
        let tasks = std::mem::take(&mut *self.inbox.tasks.lock());
        if !tasks.is_empty() {
            let now = Instant::now();
            let mut strays = self.conn.strays.lock();
            for mut t in tasks {
                t.join_at = now;
                strays.push(t);
            }
        }
    }
}
