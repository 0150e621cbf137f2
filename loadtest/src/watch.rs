//! Receivers: a few tasks each multiplex many watch streams (so the client's own CPU stays
//! low), decode events just enough to get the resourceVersion and the writer's timestamp,
//! and keep per-watcher ordering state (duplicates, out-of-order, counts for gaps).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::{Buf, Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::{SelectAll, Stream, StreamExt};
use memchr::memmem::Finder;
use tokio::sync::{mpsc, watch};

use crate::stats::{Live, now_nanos};

/// The annotation (Kubernetes) carrying the writer's wall-clock time in nanoseconds.
pub const TS_ANNOTATION: &str = "loadtest.svc/ts";

pub enum Item {
    Data(Bytes),
    Err(String),
    End,
}

pub type WStream = Pin<Box<dyn Stream<Item = (usize, Item)> + Send>>;

/// Wraps a byte stream so that its end is reported with the watcher's index.
pub fn tag<S, E>(idx: usize, s: S) -> WStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display,
{
    Box::pin(
        s.map(move |r| {
            (
                idx,
                match r {
                    Ok(b) => Item::Data(b),
                    Err(e) => Item::Err(e.to_string()),
                },
            )
        })
        .chain(futures::stream::once(async move { (idx, Item::End) })),
    )
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Format {
    /// Kubernetes watch, one JSON event per line.
    K8sJson,
    /// Kubernetes watch in protobuf: 4-byte big-endian length, then a WatchEvent.
    K8sProto,
    /// Raw frames of a fixed size: seq (u64 LE), timestamp (u64 LE), padding.
    Raw(usize),
}

/// What a reconnecting watcher needs: index and the last revision seen; returns a new stream
/// or an error (counted). `None` opener: watchers of that target do not reconnect.
pub type Opener =
    Arc<dyn Fn(usize, u64) -> BoxFuture<'static, anyhow::Result<WStream>> + Send + Sync>;

#[derive(Clone, Debug, Default)]
pub struct WState {
    pub rem: BytesMut,
    pub last_rv: u64,
    pub count: u64,
    /// Events whose revision was not above the previous one.
    pub dups: u64,
    /// Raw only: frames skipped (sequence numbers are dense there).
    pub gaps: u64,
    pub ended: bool,
    pub expired: bool,
    pub foreign: u64,
    /// The chunks of the body read (for h2, its DATA frames): how finely the server cut the
    /// stream, which is what a client pays per read.
    pub chunks: u64,
}

struct Finders {
    rv: Finder<'static>,
    ts: Finder<'static>,
    ty: Finder<'static>,
    code410: Finder<'static>,
    ts_proto: Finder<'static>,
}

impl Finders {
    fn new() -> Self {
        Finders {
            rv: Finder::new(b"\"resourceVersion\":\"").into_owned(),
            ts: Finder::new(format!("\"{TS_ANNOTATION}\":\"").as_bytes()).into_owned(),
            ty: Finder::new(b"\"type\":\"").into_owned(),
            code410: Finder::new(b"\"code\":410").into_owned(),
            ts_proto: Finder::new(TS_ANNOTATION.as_bytes()).into_owned(),
        }
    }
}

pub(crate) fn digits(b: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    let mut n = 0;
    for &c in b {
        if !c.is_ascii_digit() {
            break;
        }
        v = v.wrapping_mul(10).wrapping_add((c - b'0') as u64);
        n += 1;
    }
    (n > 0).then_some(v)
}

fn after<'a>(f: &Finder, hay: &'a [u8]) -> Option<&'a [u8]> {
    f.find(hay).map(|i| &hay[i + f.needle().len()..])
}

/// A group: one task driving many watch streams.
pub struct Group {
    pub states: Vec<WState>,
}

pub struct GroupCtx {
    pub live: Arc<Live>,
    pub format: Format,
    pub opener: Option<Opener>,
    pub stop: watch::Receiver<bool>,
}

/// Runs until `stop` turns true; returns the per-watcher states (indices base..base+n).
pub async fn run_group(ctx: GroupCtx, base: usize, streams: Vec<WStream>, n: usize) -> Group {
    let GroupCtx {
        live,
        format,
        opener,
        mut stop,
    } = ctx;
    let f = Finders::new();
    let mut states = vec![WState::default(); n];
    let mut all: SelectAll<WStream> = SelectAll::new();
    for s in streams {
        all.push(s);
    }
    let (re_tx, mut re_rx) = mpsc::unbounded_channel::<WStream>();
    let mut lat: Vec<u64> = Vec::with_capacity(4096);
    loop {
        if *stop.borrow() {
            break;
        }
        tokio::select! {
            Some((idx, item)) = all.next() => {
                let st = &mut states[idx - base];
                match item {
                    Item::Data(b) => {
                        let now = now_nanos();
                        let before = st.count;
                        st.chunks += 1;
                        lat.clear();
                        parse(&f, format, st, b, now, &mut lat, &live);
                        live.delivered.fetch_add(st.count - before, Relaxed);
                        if !lat.is_empty()
                            && let Some(h) = live.interval.lock().as_mut()
                        {
                            for &l in &lat {
                                h.saturating_record(l.max(1));
                            }
                        }
                    }
                    Item::Err(e) => {
                        if !live.stopping.load(Relaxed) {
                            live.watch_errors.fetch_add(1, Relaxed);
                            live.note_error(format!("watch stream: {e}"));
                        }
                    }
                    Item::End => {
                        if live.stopping.load(Relaxed) {
                            st.ended = true;
                            continue;
                        }
                        match &opener {
                            Some(open) => {
                                live.reconnects.fetch_add(1, Relaxed);
                                let fut = open(idx, st.last_rv);
                                let tx = re_tx.clone();
                                let live = live.clone();
                                tokio::spawn(async move {
                                    match fut.await {
                                        Ok(s) => { let _ = tx.send(s); }
                                        Err(e) => {
                                            live.watch_errors.fetch_add(1, Relaxed);
                                            live.note_error(format!("reconnect: {e:#}"));
                                        }
                                    }
                                });
                            }
                            None => {
                                st.ended = true;
                                live.watch_errors.fetch_add(1, Relaxed);
                                live.note_error("watch ended early".into());
                            }
                        }
                    }
                }
            }
            Some(s) = re_rx.recv() => all.push(s),
            r = stop.changed() => if r.is_err() { break },
        }
    }
    Group { states }
}

pub(crate) fn on_event(
    st: &mut WState,
    lat: &mut Vec<u64>,
    now: u64,
    rv: Option<u64>,
    ts: Option<u64>,
) {
    let Some(ts) = ts else {
        // Not written by this run (e.g. a controller's object): not counted.
        st.foreign += 1;
        return;
    };
    if let Some(rv) = rv {
        if rv <= st.last_rv {
            st.dups += 1;
        }
        st.last_rv = st.last_rv.max(rv);
    }
    st.count += 1;
    lat.push(now.saturating_sub(ts) / 1000);
}

/// Calls `each` with every complete line (without its newline) of `rem` followed by `chunk`,
/// read where it lies: only a line cut by the end of a chunk is copied, into `rem`, until its
/// newline arrives.
pub(crate) fn complete_lines(rem: &mut BytesMut, chunk: &[u8], mut each: impl FnMut(&[u8])) {
    let mut rest = chunk;
    if !rem.is_empty() {
        let Some(nl) = memchr::memchr(b'\n', rest) else {
            rem.extend_from_slice(rest);
            return;
        };
        rem.extend_from_slice(&rest[..nl]);
        each(rem);
        rem.clear();
        rest = &rest[nl + 1..];
    }
    while let Some(nl) = memchr::memchr(b'\n', rest) {
        each(&rest[..nl]);
        rest = &rest[nl + 1..];
    }
    rem.extend_from_slice(rest);
}

/// The length a protobuf watch frame's 4-byte prefix gives, once the prefix is there.
fn proto_len(b: &[u8]) -> Option<usize> {
    let head: [u8; 4] = b.get(..4)?.try_into().ok()?;
    Some(u32::from_be_bytes(head) as usize)
}

/// One protobuf watch frame (without its length prefix).
fn proto_frame(f: &Finders, st: &mut WState, frame: &[u8], now: u64, lat: &mut Vec<u64>) {
    // A map entry: key bytes, then field 2 (0x12), a length, the value's digits.
    let ts = after(&f.ts_proto, frame)
        .filter(|r| r.len() > 2 && r[0] == 0x12)
        .and_then(|r| digits(&r[2..]));
    if ts.is_none() && f.code410.find(frame).is_none() && frame.len() < 64 {
        return;
    }
    // Protobuf events carry no resourceVersion marker we can find without a schema:
    // ordering is checked by counts only.
    on_event(st, lat, now, None, ts);
}

/// One line of a JSON watch stream (without its newline).
fn json_line(f: &Finders, st: &mut WState, line: &[u8], now: u64, lat: &mut Vec<u64>, live: &Live) {
    if line.iter().all(|c| c.is_ascii_whitespace()) {
        return;
    }
    let ty = after(&f.ty, line).unwrap_or_default();
    if ty.starts_with(b"BOOKMARK") {
        return;
    }
    if ty.starts_with(b"ERROR") {
        if f.code410.find(line).is_some() {
            st.expired = true;
        } else {
            live.watch_errors.fetch_add(1, Relaxed);
            live.note_error(format!(
                "watch ERROR event: {}",
                String::from_utf8_lossy(&line[..line.len().min(300)])
            ));
        }
        return;
    }
    let rv = after(&f.rv, line).and_then(digits);
    let ts = after(&f.ts, line).and_then(digits);
    on_event(st, lat, now, rv, ts);
}

fn parse(
    f: &Finders,
    format: Format,
    st: &mut WState,
    b: Bytes,
    now: u64,
    lat: &mut Vec<u64>,
    live: &Live,
) {
    match format {
        Format::Raw(size) => {
            // Frames are fixed-size; a read may end mid-frame.
            let mut buf = if st.rem.is_empty() {
                BytesMut::from(b)
            } else {
                st.rem.extend_from_slice(&b);
                std::mem::take(&mut st.rem)
            };
            while buf.len() >= size {
                let seq = u64::from_le_bytes(buf[0..8].try_into().unwrap_or_default());
                let ts = u64::from_le_bytes(buf[8..16].try_into().unwrap_or_default());
                let expect = if st.count == 0 && st.gaps == 0 {
                    0
                } else {
                    st.last_rv + 1
                };
                if seq > expect {
                    st.gaps += seq - expect;
                }
                if seq < expect {
                    st.dups += 1;
                } else {
                    st.last_rv = seq;
                }
                st.count += 1;
                lat.push(now.saturating_sub(ts) / 1000);
                buf.advance(size);
            }
            st.rem = buf;
        }
        Format::K8sJson => {
            // `rem` is taken out while its lines are read, as `json_line` needs the state.
            let mut rem = std::mem::take(&mut st.rem);
            complete_lines(&mut rem, &b, |line| json_line(f, st, line, now, lat, live));
            st.rem = rem;
        }
        Format::K8sProto => {
            // Frames are read where they lie in the chunk, as JSON lines are; only a frame
            // split across chunks is copied, into `rem`, until it is whole.
            let mut rest: &[u8] = &b;
            while !st.rem.is_empty() && !rest.is_empty() {
                let want = proto_len(&st.rem).map_or(4, |len| len.saturating_add(4));
                let take = want.saturating_sub(st.rem.len()).min(rest.len());
                st.rem.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if proto_len(&st.rem).is_some_and(|len| st.rem.len() == len.saturating_add(4)) {
                    let mut frame = std::mem::take(&mut st.rem);
                    proto_frame(f, st, &frame[4..], now, lat);
                    frame.clear();
                    st.rem = frame;
                }
            }
            while let Some(len) = proto_len(rest) {
                let Some(frame) = rest.get(4..len.saturating_add(4)) else {
                    break;
                };
                proto_frame(f, st, frame, now, lat);
                rest = &rest[len.saturating_add(4)..];
            }
            st.rem.extend_from_slice(rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What reading `bytes` in the chunks `cuts` ends between leaves: the watcher's state
    /// and the latencies recorded (µs, the clock at 10 s).
    fn read_in_chunks(format: Format, bytes: &[u8], cuts: &[usize]) -> (WState, Vec<u64>) {
        let (f, live) = (Finders::new(), Live::new());
        let mut st = WState::default();
        let mut lat = Vec::new();
        let mut from = 0;
        for &to in cuts.iter().chain([bytes.len()].iter()) {
            let chunk = Bytes::copy_from_slice(&bytes[from..to]);
            parse(&f, format, &mut st, chunk, 10_000_000, &mut lat, &live);
            from = to;
        }
        (st, lat)
    }

    /// Every cut into two chunks, and many into three, reads as `whole`.
    fn every_cut_reads_as<T: PartialEq + std::fmt::Debug>(
        bytes: &[u8],
        whole: &T,
        run: impl Fn(&[usize]) -> T,
    ) {
        for a in 0..=bytes.len() {
            assert_eq!(&run(&[a]), whole, "cut at {a}");
            for b in (a..=bytes.len()).step_by(7) {
                assert_eq!(&run(&[a, b]), whole, "cuts at {a}, {b}");
            }
        }
    }

    fn event(rv: u64, ts: u64) -> String {
        format!(
            "{{\"type\":\"ADDED\",\"object\":{{\"metadata\":{{\"resourceVersion\":\"{rv}\",\
             \"annotations\":{{\"{TS_ANNOTATION}\":\"{ts}\"}}}}}}}}\n"
        )
    }

    /// Every way of cutting a stream into two or three chunks counts the same events, with
    /// the same latencies, as reading it whole.
    #[test]
    fn json_lines_split_anywhere_count_the_same() {
        let stream = format!(
            "{}{}\n{{\"type\":\"BOOKMARK\",\"object\":{{}}}}\n{}",
            event(5, 1_000),
            event(6, 2_000),
            event(6, 3_000)
        );
        let bytes = stream.as_bytes();
        let run = |cuts: &[usize]| {
            let (st, lat) = read_in_chunks(Format::K8sJson, bytes, cuts);
            (st.count, st.dups, st.last_rv, st.rem.len(), lat)
        };
        let whole = run(&[]);
        assert_eq!(whole, (3, 1, 6, 0, vec![9_999, 9_998, 9_997]));
        every_cut_reads_as(bytes, &whole, run);
        let (st, _) = read_in_chunks(Format::K8sJson, &bytes[..10], &[]);
        assert_eq!(
            (st.count, st.rem.len()),
            (0, 10),
            "a partial line waits in rem"
        );
    }

    /// The same for protobuf frames: a length prefix split anywhere, frames whole in one
    /// chunk or spread over three.
    #[test]
    fn proto_frames_split_anywhere_count_the_same() {
        let frame = |ts: u64, pad: usize| {
            let mut body = vec![b'x'; pad];
            body.extend_from_slice(TS_ANNOTATION.as_bytes());
            let value = ts.to_string();
            body.push(0x12);
            body.push(value.len() as u8);
            body.extend_from_slice(value.as_bytes());
            let mut out = (body.len() as u32).to_be_bytes().to_vec();
            out.extend_from_slice(&body);
            out
        };
        let mut bytes = frame(1_000, 80);
        bytes.extend_from_slice(&frame(2_000, 3));
        // A short frame with no timestamp (a bookmark, say) is not an event.
        bytes.extend_from_slice(&[0, 0, 0, 2, 1, 2]);
        bytes.extend_from_slice(&frame(3_000, 200));
        let run = |cuts: &[usize]| {
            let (st, lat) = read_in_chunks(Format::K8sProto, &bytes, cuts);
            (st.count, st.foreign, st.rem.len(), lat)
        };
        let whole = run(&[]);
        assert_eq!(whole, (3, 0, 0, vec![9_999, 9_998, 9_997]));
        every_cut_reads_as(&bytes, &whole, run);
    }
}
