//! HTTP/2 conformance (RFC 9113) of what the server sends, frame by frame: a raw-frame client
//! sees every frame as the server wrote it and checks each one as it arrives ([`Raw::check`]):
//! no frame past SETTINGS_MAX_FRAME_SIZE, a stream's first frame is its HEADERS, a header
//! block's CONTINUATIONs follow it with no other frame between, nothing comes on a stream
//! after its END_STREAM or the server's RST_STREAM, and DATA stays within the stream's and the
//! connection's flow-control windows (SETTINGS_INITIAL_WINDOW_SIZE, changed mid-stream too,
//! plus the WINDOW_UPDATEs the client sent). The tests add their own assertions to those:
//! windows smaller than an event, the connection window shared by all streams, the initial
//! window lowered and raised while a watch is open, split response heads beside streaming
//! watches, a reset watch, and the errors invalid WINDOW_UPDATEs must get.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::BytesMut;
use http::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;

use crate::support::client::{Client, TestServer, create_namespace};
use crate::support::h2raw::*;

/// SETTINGS_MAX_FRAME_SIZE's default, which this client never raises.
const MAX_FRAME: usize = 16_384;
/// Every window's size before SETTINGS or WINDOW_UPDATE change it (RFC 9113 §6.9.2).
const DEFAULT_WINDOW: i64 = 65_535;
/// The largest a flow-control window may be: 2^31-1.
const MAX_WINDOW: u32 = 0x7fff_ffff;

/// Every wait for the server ends within this.
const BOUND: Duration = Duration::from_secs(10);
/// How long nothing must arrive for the server to count as done sending (for now).
const QUIET: Duration = Duration::from_millis(300);

fn kind_name(kind: u8) -> String {
    let name = match kind {
        DATA => "DATA",
        HEADERS => "HEADERS",
        PRIORITY => "PRIORITY",
        RST_STREAM => "RST_STREAM",
        SETTINGS => "SETTINGS",
        PUSH_PROMISE => "PUSH_PROMISE",
        PING => "PING",
        GOAWAY => "GOAWAY",
        WINDOW_UPDATE => "WINDOW_UPDATE",
        CONTINUATION => "CONTINUATION",
        other => return format!("type {other:#x}"),
    };
    name.to_string()
}

/// An HPACK integer with an `n`-bit prefix, the prefix's other bits `first` (RFC 7541 §5.1).
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// A GET's header block: each field a literal without indexing, with a new name and no
/// Huffman coding (RFC 7541 §6.2.2), so no table is involved.
fn request_block(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let fields = [
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", "localhost"),
        (":path", path),
        ("accept", "application/json"),
    ];
    let mut b = Vec::new();
    for (name, value) in fields.iter().chain(extra) {
        b.push(0x00);
        for s in [name, value] {
            hpack_int(&mut b, 0x00, 7, s.len());
            b.extend_from_slice(s.as_bytes());
        }
    }
    b
}

/// The `:status` of a response's header block when its first field is one of the static
/// table's statuses (as the h2 crate encodes them); None for any other encoding.
fn status(block: &[u8]) -> Option<u16> {
    let i = usize::from(*block.first()? & 0x7f);
    let statuses = [200, 204, 206, 304, 400, 404, 500];
    (block.first()? & 0x80 != 0 && (8..=14).contains(&i)).then(|| statuses[i - 8])
}

/// What the client knows of one stream it opened.
#[derive(Default)]
struct Stream {
    /// The header blocks received, each whole (HEADERS with its CONTINUATIONs).
    blocks: Vec<Vec<u8>>,
    /// The response head is whole: DATA may come.
    head: bool,
    /// Flow-controlled bytes received: whole DATA payloads, padding included.
    received: i64,
    /// The increments of the stream WINDOW_UPDATEs the client sent.
    credit: i64,
    /// The DATA without padding.
    body: Vec<u8>,
    data_frames: usize,
    /// The server's END_STREAM came.
    ended: bool,
    /// The server's RST_STREAM came, with this code.
    reset: Option<u32>,
}

impl Stream {
    fn status(&self) -> Option<u16> {
        status(self.blocks.first()?)
    }

    /// The whole lines of the body so far, as JSON (watch events).
    fn events(&self) -> Vec<Value> {
        let end = self
            .body
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1);
        self.body[..end]
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                serde_json::from_slice(l).unwrap_or_else(|e| {
                    panic!(
                        "a watch line is not JSON ({e}): {}",
                        String::from_utf8_lossy(l)
                    )
                })
            })
            .collect()
    }

    /// The names of the objects of the events so far.
    fn names(&self) -> Vec<String> {
        self.events()
            .iter()
            .filter_map(|ev| Some(ev["object"]["metadata"]["name"].as_str()?.to_string()))
            .collect()
    }

    fn has(&self, name: &str) -> bool {
        self.names().iter().any(|n| n == name)
    }
}

enum Next {
    Frame,
    /// Nothing arrived within the time given.
    Quiet,
    /// The server closed the connection.
    Closed,
}

/// A hand-rolled h2 client: it writes frames as a test asks and checks every frame it reads.
struct Raw {
    io: TlsStream<TcpStream>,
    buf: BytesMut,
    next_id: u32,
    streams: BTreeMap<u32, Stream>,
    /// SETTINGS_INITIAL_WINDOW_SIZE as last acknowledged by the server...
    initial: i64,
    /// ...and the SETTINGS sent and not acknowledged yet (with their value for it, if any).
    unacked: VecDeque<Option<i64>>,
    /// 65,535 plus the connection WINDOW_UPDATEs sent, and the DATA received on all streams.
    conn_credit: i64,
    conn_received: i64,
    /// A header block is open on this stream: only its CONTINUATIONs may come.
    continuing: Option<u32>,
    server_settings: bool,
    /// The last GOAWAY's last stream id and error code.
    goaway: Option<(u32, u32)>,
    closed: bool,
    continuations: usize,
    largest_frame: usize,
    /// The last frames read, for the messages of failed checks.
    log: VecDeque<String>,
}

impl Raw {
    /// A connection with the admin certificate whose SETTINGS ask for `initial_window` (and no
    /// push), with a connection WINDOW_UPDATE of `conn_increment` unless 0; once the server's
    /// SETTINGS came and it acknowledged the client's.
    async fn connect(srv: &TestServer, initial_window: u32, conn_increment: u32) -> Raw {
        let io = srv.admin_tls(b"h2").await;
        assert_eq!(
            io.get_ref().1.alpn_protocol(),
            Some(b"h2".as_slice()),
            "the server speaks h2"
        );
        let mut h2 = Raw {
            io,
            buf: BytesMut::new(),
            next_id: 1,
            streams: BTreeMap::new(),
            initial: DEFAULT_WINDOW,
            unacked: VecDeque::new(),
            conn_credit: DEFAULT_WINDOW,
            conn_received: 0,
            continuing: None,
            server_settings: false,
            goaway: None,
            closed: false,
            continuations: 0,
            largest_frame: 0,
            log: VecDeque::new(),
        };
        let mut hello = PREFACE.to_vec();
        hello.extend(h2.settings_frame(&[(ENABLE_PUSH, 0), (INITIAL_WINDOW_SIZE, initial_window)]));
        if conn_increment > 0 {
            hello.extend(frame(WINDOW_UPDATE, 0, 0, &conn_increment.to_be_bytes()));
            h2.conn_credit += i64::from(conn_increment);
        }
        h2.write(&hello).await;
        h2.until("the server's SETTINGS and its ACK of the client's", |h| {
            h.server_settings && h.unacked.is_empty()
        })
        .await;
        h2
    }

    async fn write(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.expect("write to the server");
        self.io.flush().await.expect("write to the server");
    }

    /// A SETTINGS frame, recorded as waiting for its ACK.
    fn settings_frame(&mut self, entries: &[(u16, u32)]) -> Vec<u8> {
        let mut payload = Vec::new();
        for (id, value) in entries {
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&value.to_be_bytes());
        }
        let initial = entries
            .iter()
            .find(|(id, _)| *id == INITIAL_WINDOW_SIZE)
            .map(|(_, v)| i64::from(*v));
        self.unacked.push_back(initial);
        frame(SETTINGS, 0, 0, &payload)
    }

    /// Changes SETTINGS_INITIAL_WINDOW_SIZE; returns once the server acknowledged it.
    async fn set_initial_window(&mut self, value: u32) {
        let f = self.settings_frame(&[(INITIAL_WINDOW_SIZE, value)]);
        self.write(&f).await;
        self.until("the server's SETTINGS ACK", |h| h.unacked.is_empty())
            .await;
    }

    /// A valid WINDOW_UPDATE (stream 0: the connection's), counted as credit.
    async fn window_update(&mut self, stream: u32, increment: u32) {
        assert!((1..=MAX_WINDOW).contains(&increment));
        if stream == 0 {
            self.conn_credit += i64::from(increment);
        } else {
            self.stream_mut(stream).credit += i64::from(increment);
        }
        self.write(&frame(WINDOW_UPDATE, 0, stream, &increment.to_be_bytes()))
            .await;
    }

    /// Sends a GET (header block split into HEADERS and CONTINUATIONs when it needs more than
    /// one frame); its stream id.
    async fn get(&mut self, path: &str, extra: &[(&str, &str)]) -> u32 {
        let id = self.next_id;
        self.next_id += 2;
        self.streams.insert(id, Stream::default());
        let block = request_block(path, extra);
        let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME).collect();
        let mut out = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = if i + 1 == chunks.len() {
                END_HEADERS
            } else {
                0
            };
            out.extend(if i == 0 {
                frame(HEADERS, END_STREAM | last, id, chunk)
            } else {
                frame(CONTINUATION, last, id, chunk)
            });
        }
        self.write(&out).await;
        id
    }

    async fn reset(&mut self, stream: u32, code: u32) {
        self.write(&frame(RST_STREAM, 0, stream, &code.to_be_bytes()))
            .await;
    }

    fn stream(&self, id: u32) -> &Stream {
        self.streams
            .get(&id)
            .unwrap_or_else(|| panic!("stream {id} was never opened"))
    }

    fn stream_mut(&mut self, id: u32) -> &mut Stream {
        self.streams
            .get_mut(&id)
            .unwrap_or_else(|| panic!("stream {id} was never opened"))
    }

    /// Reads one frame within `limit`, checks it and answers it (PING, SETTINGS).
    async fn read(&mut self, limit: Duration) -> Next {
        loop {
            if let Some(f) = self.take_frame() {
                if let Some(reply) = self.check(&f) {
                    // The server may be gone already (after a GOAWAY).
                    let _ = self.io.write_all(&reply).await;
                    let _ = self.io.flush().await;
                }
                return Next::Frame;
            }
            if self.closed {
                return Next::Closed;
            }
            self.buf.reserve(64 * 1024);
            match tokio::time::timeout(limit, self.io.read_buf(&mut self.buf)).await {
                Err(_) => return Next::Quiet,
                Ok(Ok(0) | Err(_)) => self.closed = true,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Reads until `done` holds; panics after [`BOUND`], or if the server closes first.
    async fn until(&mut self, what: &str, done: impl Fn(&Raw) -> bool) {
        let deadline = Instant::now() + BOUND;
        while !done(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read(left).await {
                Next::Frame => {}
                Next::Quiet => panic!(
                    "timed out after {BOUND:?} waiting for {what}\n{}",
                    self.recent()
                ),
                Next::Closed => panic!(
                    "the server closed the connection while the client waited for {what}\n{}",
                    self.recent()
                ),
            }
        }
    }

    /// Reads (and checks) what comes until nothing has for [`QUIET`] (or for [`BOUND`] in all).
    async fn settle(&mut self) {
        self.settle_for(QUIET).await;
    }

    async fn settle_for(&mut self, quiet: Duration) {
        let deadline = Instant::now() + BOUND;
        while Instant::now() < deadline {
            if !matches!(self.read(quiet).await, Next::Frame) {
                return;
            }
        }
    }

    /// The next whole frame in the buffer; a frame past the size limit fails at its header.
    fn take_frame(&mut self) -> Option<Frame> {
        if self.buf.len() < 9 {
            return None;
        }
        let len = (usize::from(self.buf[0]) << 16)
            | (usize::from(self.buf[1]) << 8)
            | usize::from(self.buf[2]);
        if len > MAX_FRAME {
            self.violation(&format!(
                "a {} frame of {len} bytes on stream {}, past SETTINGS_MAX_FRAME_SIZE \
                 ({MAX_FRAME}, the default: the client never raised it)",
                kind_name(self.buf[3]),
                u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]])
            ));
        }
        if self.buf.len() < 9 + len {
            return None;
        }
        let head = self.buf.split_to(9);
        let payload = self.buf.split_to(len).to_vec();
        Some(Frame {
            kind: head[3],
            flags: head[4],
            // The reserved bit is ignored.
            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & MAX_WINDOW,
            payload,
        })
    }

    fn recent(&self) -> String {
        let frames: Vec<&str> = self.log.iter().map(String::as_str).collect();
        format!(
            "last frames read (oldest first):\n  {}",
            frames.join("\n  ")
        )
    }

    fn violation(&self, what: &str) -> ! {
        panic!("HTTP/2 violation by the server: {what}\n{}", self.recent())
    }

    /// The SETTINGS_INITIAL_WINDOW_SIZE the server may be sending under: the acknowledged one,
    /// or a larger one it may have applied already.
    fn initial_bound(&self) -> i64 {
        self.unacked
            .iter()
            .flatten()
            .fold(self.initial, |a, b| a.max(*b))
    }

    /// Checks one frame against RFC 9113 and the windows the client gave; what to answer.
    fn check(&mut self, f: &Frame) -> Option<Vec<u8>> {
        let id = f.stream;
        let len = f.payload.len();
        self.largest_frame = self.largest_frame.max(len);
        if self.log.len() == 24 {
            self.log.pop_front();
        }
        self.log.push_back(format!(
            "{} stream={id} flags={:#04x} len={len}",
            kind_name(f.kind),
            f.flags
        ));
        // §6.10: a header block is a contiguous sequence of frames.
        if let Some(open) = self.continuing
            && (f.kind != CONTINUATION || id != open)
        {
            self.violation(&format!(
                "a {} frame on stream {id} inside stream {open}'s header block (HEADERS \
                 without END_HEADERS must be followed by its CONTINUATIONs only)",
                kind_name(f.kind)
            ));
        }
        let stream_frame = matches!(f.kind, DATA | HEADERS | RST_STREAM | CONTINUATION);
        if stream_frame && !self.streams.contains_key(&id) {
            self.violation(&format!(
                "{} on stream {id}, which the client never opened",
                kind_name(f.kind)
            ));
        }
        if matches!(f.kind, SETTINGS | PING | GOAWAY) && id != 0 {
            self.violation(&format!("{} on stream {id}, not 0", kind_name(f.kind)));
        }
        match f.kind {
            DATA => self.check_data(f),
            HEADERS => {
                let s = &self.streams[&id];
                if s.ended || s.reset.is_some() {
                    self.violation(&format!("HEADERS on stream {id} after it ended"));
                }
                if s.head && f.flags & END_STREAM == 0 {
                    self.violation(&format!(
                        "a second header block on stream {id} without END_STREAM (only \
                         trailers may follow the response head)"
                    ));
                }
                let mut fragment = f.payload.as_slice();
                if f.flags & PADDED != 0 {
                    fragment = self.unpad(fragment);
                }
                if f.flags & PRIORITY_FLAG != 0 {
                    fragment = fragment.get(5..).unwrap_or_else(|| {
                        self.violation("HEADERS with PRIORITY shorter than 5 bytes")
                    });
                }
                let fragment = fragment.to_vec();
                let s = self.stream_mut(id);
                s.blocks.push(fragment);
                if f.flags & END_STREAM != 0 {
                    s.ended = true;
                }
                if f.flags & END_HEADERS != 0 {
                    s.head = true;
                } else {
                    self.continuing = Some(id);
                }
            }
            CONTINUATION => {
                if self.continuing != Some(id) {
                    self.violation(&format!(
                        "CONTINUATION on stream {id} with no header block open"
                    ));
                }
                self.continuations += 1;
                let s = self.stream_mut(id);
                s.blocks
                    .last_mut()
                    .expect("a block is open")
                    .extend_from_slice(&f.payload);
                if f.flags & END_HEADERS != 0 {
                    s.head = true;
                    self.continuing = None;
                }
            }
            RST_STREAM => {
                let s = &self.streams[&id];
                if len != 4 {
                    self.violation(&format!("RST_STREAM of {len} bytes"));
                }
                if s.ended || s.reset.is_some() {
                    self.violation(&format!("RST_STREAM on stream {id} after it ended"));
                }
                let code =
                    u32::from_be_bytes([f.payload[0], f.payload[1], f.payload[2], f.payload[3]]);
                self.stream_mut(id).reset = Some(code);
            }
            SETTINGS if f.flags & ACK != 0 => {
                if len != 0 {
                    self.violation(&format!("a SETTINGS ACK of {len} bytes"));
                }
                let Some(acked) = self.unacked.pop_front() else {
                    self.violation("a SETTINGS ACK for no SETTINGS of the client's");
                };
                if let Some(v) = acked {
                    self.initial = v;
                }
            }
            SETTINGS => {
                if !len.is_multiple_of(6) {
                    self.violation(&format!("SETTINGS of {len} bytes"));
                }
                self.server_settings = true;
                return Some(frame(SETTINGS, ACK, 0, &[]));
            }
            PING if f.flags & ACK == 0 => {
                if len != 8 {
                    self.violation(&format!("PING of {len} bytes"));
                }
                return Some(frame(PING, ACK, 0, &f.payload));
            }
            GOAWAY => {
                if len < 8 {
                    self.violation(&format!("GOAWAY of {len} bytes"));
                }
                let word = |i: usize| {
                    u32::from_be_bytes([
                        f.payload[i],
                        f.payload[i + 1],
                        f.payload[i + 2],
                        f.payload[i + 3],
                    ])
                };
                self.goaway = Some((word(0) & MAX_WINDOW, word(4)));
            }
            PUSH_PROMISE => {
                self.violation("PUSH_PROMISE, though the client's SETTINGS_ENABLE_PUSH is 0")
            }
            // WINDOW_UPDATEs for the client's sending (ignored: it sends no bodies), PING
            // ACKs, PRIORITY and unknown types (§4.1: ignored).
            _ => {}
        }
        None
    }

    /// DATA: after the stream's head, before its end, within both windows.
    fn check_data(&mut self, f: &Frame) {
        let id = f.stream;
        let len = i64::try_from(f.payload.len()).unwrap();
        let bound = self.initial_bound();
        let s = &self.streams[&id];
        if !s.head {
            self.violation(&format!("DATA on stream {id} before its response HEADERS"));
        }
        if s.ended || s.reset.is_some() {
            self.violation(&format!(
                "DATA on stream {id} after it ended (END_STREAM: {}, RST_STREAM: {:?})",
                s.ended, s.reset
            ));
        }
        let received = s.received + len;
        let window = bound + s.credit;
        if received > window {
            self.violation(&format!(
                "stream {id} got {received} flow-controlled bytes in all, past its window of \
                 {window} (SETTINGS_INITIAL_WINDOW_SIZE {bound} + {} of WINDOW_UPDATEs)",
                s.credit
            ));
        }
        self.conn_received += len;
        if self.conn_received > self.conn_credit {
            self.violation(&format!(
                "the connection got {} flow-controlled bytes in all, past its window of {} \
                 (65,535 + {} of WINDOW_UPDATEs)",
                self.conn_received,
                self.conn_credit,
                self.conn_credit - DEFAULT_WINDOW
            ));
        }
        let body = if f.flags & PADDED != 0 {
            self.unpad(&f.payload).to_vec()
        } else {
            f.payload.clone()
        };
        let s = self.stream_mut(id);
        s.received = received;
        s.data_frames += 1;
        s.body.extend_from_slice(&body);
        if f.flags & END_STREAM != 0 {
            s.ended = true;
        }
    }

    /// A padded payload's content (§6.1).
    fn unpad<'a>(&self, payload: &'a [u8]) -> &'a [u8] {
        let Some((&pad, rest)) = payload.split_first() else {
            self.violation("a PADDED frame without its Pad Length");
        };
        let keep = rest
            .len()
            .checked_sub(usize::from(pad))
            .unwrap_or_else(|| self.violation("padding longer than the frame"));
        &rest[..keep]
    }
}

/// A ServiceAccount labelled `t=h2`, with an annotation of `pad` bytes.
async fn create_sa(c: &Client, ns: &str, name: &str, pad: usize) {
    let (s, v) = c
        .post(
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"metadata": {"name": name, "labels": {"t": "h2"},
                   "annotations": {"pad": "p".repeat(pad)}}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

async fn list_rv(c: &Client, ns: &str) -> String {
    let (status, list) = c
        .get(&format!("/api/v1/namespaces/{ns}/serviceaccounts"))
        .await;
    list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_else(|| panic!("{status}: {list}"))
        .to_string()
}

/// A watch of namespace `ns`'s ServiceAccounts labelled `t=h2` (none of the server's own)
/// after `rv`.
fn watch_path(ns: &str, rv: &str) -> String {
    format!(
        "/api/v1/namespaces/{ns}/serviceaccounts?watch=1&labelSelector=t%3Dh2&resourceVersion={rv}"
    )
}

/// Opens a watch and waits for its head, which must say 200.
async fn watch(h2: &mut Raw, path: &str, extra: &[(&str, &str)]) -> u32 {
    let id = h2.get(path, extra).await;
    h2.until("the watch's response head", |h| h.stream(id).head)
        .await;
    assert_eq!(h2.stream(id).status(), Some(200), "watch {path}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_window_smaller_than_an_event_is_never_overrun() {
    const WINDOW: u32 = 300;
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "tiny").await;
    let rv = list_rv(&admin, "tiny").await;
    // A tiny stream window, a large connection one: only the stream's window holds data back.
    let mut h2 = Raw::connect(&srv, WINDOW, 1 << 30).await;
    let id = watch(&mut h2, &watch_path("tiny", &rv), &[]).await;
    let names: Vec<String> = (0..5).map(|i| format!("tiny-{i}")).collect();
    for n in &names {
        create_sa(&admin, "tiny", n, 400).await;
    }
    h2.until("the first DATA of the watch", |h| h.stream(id).received > 0)
        .await;
    h2.settle().await;
    let first = h2.stream(id).received;
    assert!(
        first <= i64::from(WINDOW),
        "{first} bytes came within the first window of {WINDOW}"
    );
    // A window's worth at a time: each WINDOW_UPDATE lets more out, and no more than it.
    let mut updates = 0;
    while h2.stream(id).names() != names {
        updates += 1;
        assert!(
            updates <= 100,
            "the events never all came: {:?}",
            h2.stream(id).names()
        );
        let before = h2.stream(id).received;
        h2.window_update(id, WINDOW).await;
        h2.until("more DATA after a stream WINDOW_UPDATE", |h| {
            h.stream(id).received > before
        })
        .await;
        h2.settle().await;
        let s = h2.stream(id);
        assert!(
            s.received <= i64::from(WINDOW) * (updates + 1),
            "{} bytes came with {updates} WINDOW_UPDATEs of {WINDOW}",
            s.received
        );
    }
    let s = h2.stream(id);
    let lines: Vec<&[u8]> = s
        .body
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        lines.iter().all(|l| l.len() > WINDOW as usize),
        "each event is larger than a window, so each needed several: {:?}",
        lines.iter().map(|l| l.len()).collect::<Vec<_>>()
    );
    assert!(
        s.events().iter().all(|ev| ev["type"] == "ADDED"),
        "only ADDED events: {:?}",
        s.events()
    );
    assert!(s.data_frames > names.len(), "{} DATA frames", s.data_frames);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_window_bounds_all_streams_together() {
    const ITEMS: usize = 40;
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "shared").await;
    let names: Vec<String> = (0..ITEMS).map(|i| format!("shared-{i}")).collect();
    for n in &names {
        create_sa(&admin, "shared", n, 3000).await;
    }
    // Stream windows far larger than the lists, the connection's left at 65,535.
    let mut h2 = Raw::connect(&srv, 1 << 20, 0).await;
    let path = "/api/v1/namespaces/shared/serviceaccounts";
    let lists = [h2.get(path, &[]).await, h2.get(path, &[]).await];
    // The server uses all of the window (one that stopped short would have miscounted it),
    // whichever streams it gives it to.
    h2.until(
        "the server to fill the 65,535-byte connection window",
        |h| h.conn_received == DEFAULT_WINDOW,
    )
    .await;
    // Nothing more comes until the connection's window grows (`check` fails on any more).
    h2.settle_for(Duration::from_secs(1)).await;
    assert_eq!(h2.conn_received, DEFAULT_WINDOW);
    for id in lists {
        let s = h2.stream(id);
        assert_eq!(s.status(), Some(200), "list on stream {id}");
        // Each stream's own window (1 MiB) had room left: the connection's held it.
        assert!(
            !s.ended,
            "the window held stream {id}'s list back, not its end"
        );
    }
    h2.window_update(0, 1 << 24).await;
    h2.until("both lists to end once the window grew", |h| {
        lists.iter().all(|&id| h.stream(id).ended)
    })
    .await;
    for id in lists {
        let s = h2.stream(id);
        let list: Value = serde_json::from_slice(&s.body).expect("the list is JSON");
        let got: Vec<&str> = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str())
            .collect();
        for n in &names {
            assert!(got.contains(&n.as_str()), "stream {id}'s list has {n}");
        }
        assert!(
            s.body.len() > DEFAULT_WINDOW as usize,
            "each list alone is larger than the connection window: {}",
            s.body.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_initial_window_holds_a_stream_until_raised() {
    const WINDOW: u32 = 16_384;
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "resize").await;
    let rv = list_rv(&admin, "resize").await;
    let path = watch_path("resize", &rv);
    let mut h2 = Raw::connect(&srv, WINDOW, 1 << 30).await;
    let held = watch(&mut h2, &path, &[]).await;
    create_sa(&admin, "resize", "r0", 400).await;
    h2.until("the first event", |h| h.stream(held).has("r0"))
        .await;
    h2.settle().await;
    let got = h2.stream(held).received;
    assert!(
        (1..i64::from(WINDOW)).contains(&got),
        "the first event ({got} bytes) fits the window"
    );

    // Down to 0: the stream's window is now 0 - got, negative (§6.9.2), so nothing may come
    // on it; another stream given credit of its own shows the events do flow.
    h2.set_initial_window(0).await;
    let other = watch(&mut h2, &path, &[]).await;
    h2.window_update(other, 1 << 20).await;
    create_sa(&admin, "resize", "r1", 400).await;
    create_sa(&admin, "resize", "r2", 400).await;
    h2.until("the events on the stream with credit", |h| {
        h.stream(other).has("r2")
    })
    .await;
    h2.settle().await;
    assert_eq!(
        h2.stream(held).received,
        got,
        "no DATA on a stream whose window the lowered SETTINGS_INITIAL_WINDOW_SIZE made negative"
    );

    // Up to got + 300: a window of 300, so some DATA, and at most 300 bytes of it.
    let small = u32::try_from(got).unwrap() + 300;
    h2.set_initial_window(small).await;
    h2.until("DATA once the window is positive again", |h| {
        h.stream(held).received > got
    })
    .await;
    h2.settle().await;
    let now = h2.stream(held).received;
    assert!(
        now <= got + 300,
        "{now} bytes in all, with a window of {got} + 300"
    );

    // Up to 1 MiB: the rest comes, in order.
    h2.set_initial_window(1 << 20).await;
    h2.until("the held events once the window is large", |h| {
        h.stream(held).has("r2")
    })
    .await;
    assert_eq!(h2.stream(held).names(), ["r0", "r1", "r2"]);
    assert_eq!(h2.stream(other).names(), ["r0", "r1", "r2"]);
}

/// A server that echoes a request's `Audit-ID` header in its response (any audit policy
/// does, even one that records nothing): a long one makes the response head span HEADERS
/// and CONTINUATION frames.
async fn echoing_server() -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.svc.io/v1\nkind: Policy\nrules:\n- level: None\n",
    )
    .unwrap();
    let log = dir.path().join("audit.log");
    let srv = TestServer::start_with(move |o| {
        o.audit.audit_policy_file = Some(policy);
        o.audit.audit_log_path = Some(log);
    })
    .await;
    (srv, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_blocks_are_unbroken_and_frames_within_the_size_limit() {
    const ITEMS: usize = 8;
    const LIVE: usize = 10;
    let (srv, _dir) = echoing_server().await;
    let admin = srv.admin();
    create_namespace(&admin, "frames").await;
    let rv = list_rv(&admin, "frames").await;
    let mut names: Vec<String> = (0..ITEMS).map(|i| format!("old-{i}")).collect();
    for n in &names {
        create_sa(&admin, "frames", n, 3000).await;
    }
    let mut h2 = Raw::connect(&srv, 1 << 20, 1 << 30).await;
    // Response heads of ~25 KB (the ID Huffman-coded): a HEADERS frame and CONTINUATIONs.
    let id = "a".repeat(40_000);
    let long = [("audit-id", id.as_str())];
    // Watches from before the objects: their events are ready as soon as their heads are
    // out, and more come while the other streams' heads are written.
    let path = watch_path("frames", &rv);
    let watches = [h2.get(&path, &long).await, h2.get(&path, &long).await];
    let writer = {
        let admin = admin.clone();
        tokio::spawn(async move {
            for i in 0..LIVE {
                create_sa(&admin, "frames", &format!("live-{i}"), 3000).await;
            }
        })
    };
    let mut lists = Vec::new();
    for _ in 0..6 {
        lists.push(
            h2.get("/api/v1/namespaces/frames/serviceaccounts", &long)
                .await,
        );
    }
    names.extend((0..LIVE).map(|i| format!("live-{i}")));
    let last = names.last().unwrap().clone();
    h2.until("every list's end and every event on both watches", |h| {
        lists.iter().all(|&l| h.stream(l).ended) && watches.iter().all(|&w| h.stream(w).has(&last))
    })
    .await;
    writer.await.unwrap();
    h2.settle().await;

    assert!(
        h2.continuations >= lists.len() + watches.len(),
        "every response head needed CONTINUATION frames: {} of them",
        h2.continuations
    );
    assert!(
        h2.largest_frame <= MAX_FRAME,
        "largest frame {}",
        h2.largest_frame
    );
    for &w in &watches {
        let s = h2.stream(w);
        assert_eq!(s.status(), Some(200), "watch on stream {w}");
        assert!(s.blocks[0].len() > MAX_FRAME, "a head larger than a frame");
        assert_eq!(
            s.names(),
            names,
            "watch on stream {w}: every event, in order"
        );
    }
    for &l in &lists {
        let s = h2.stream(l);
        assert_eq!(s.status(), Some(200), "list on stream {l}");
        assert!(s.blocks[0].len() > MAX_FRAME, "a head larger than a frame");
        assert!(
            s.body.len() > MAX_FRAME && s.data_frames >= 2,
            "a body larger than a frame ({} bytes) comes in several ({})",
            s.body.len(),
            s.data_frames
        );
        let list: Value = serde_json::from_slice(&s.body).expect("the list is JSON");
        assert!(
            list["items"].as_array().unwrap().len() >= ITEMS,
            "stream {l}: {list}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reset_by_the_client_gets_no_more_data() {
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "cancel").await;
    let rv = list_rv(&admin, "cancel").await;
    let path = watch_path("cancel", &rv);
    let mut h2 = Raw::connect(&srv, 1 << 20, 1 << 30).await;
    let cancelled = watch(&mut h2, &path, &[]).await;
    let kept = watch(&mut h2, &path, &[]).await;
    create_sa(&admin, "cancel", "before", 400).await;
    h2.until("the first event on both watches", |h| {
        h.stream(cancelled).has("before") && h.stream(kept).has("before")
    })
    .await;
    h2.reset(cancelled, CANCEL).await;
    // What the server sent before it read the RST_STREAM may still come: one more event and
    // a pause let it arrive...
    create_sa(&admin, "cancel", "after-0", 400).await;
    h2.until("the next event on the kept watch", |h| {
        h.stream(kept).has("after-0")
    })
    .await;
    h2.settle().await;
    let mark = h2.stream(cancelled).received;
    // ...and from then on nothing: the watch ended with its stream.
    for i in 1..=3 {
        create_sa(&admin, "cancel", &format!("after-{i}"), 400).await;
    }
    h2.until("the later events on the kept watch", |h| {
        h.stream(kept).has("after-3")
    })
    .await;
    h2.settle_for(Duration::from_secs(2)).await;
    assert_eq!(
        h2.stream(cancelled).received,
        mark,
        "DATA on a stream the client reset, long after the reset"
    );
    assert_eq!(
        h2.stream(kept).names(),
        ["before", "after-0", "after-1", "after-2", "after-3"]
    );
}

/// A connection with a watch open (stream windows of 1 MiB, the connection's as given).
async fn with_watch(srv: &TestServer, ns: &str, conn_increment: u32) -> (Raw, u32) {
    let rv = list_rv(&srv.admin(), ns).await;
    let mut h2 = Raw::connect(srv, 1 << 20, conn_increment).await;
    let id = watch(&mut h2, &watch_path(ns, &rv), &[]).await;
    (h2, id)
}

/// Waits for a GOAWAY and the close that must follow it (§5.4.1); its error code.
async fn goaway_and_close(h2: &mut Raw, what: &str) -> u32 {
    h2.until(&format!("GOAWAY after {what}"), |h| h.goaway.is_some())
        .await;
    let deadline = Instant::now() + BOUND;
    while !h2.closed {
        assert!(
            Instant::now() < deadline,
            "the server closes the connection after its GOAWAY for {what}"
        );
        h2.read(BOUND).await;
    }
    h2.goaway.unwrap().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_window_updates_are_protocol_errors() {
    let srv = TestServer::start().await;
    create_namespace(&srv.admin(), "zero").await;

    // On a stream: a stream error PROTOCOL_ERROR (RFC 9113 §6.9), i.e. RST_STREAM; §5.4.1
    // lets an endpoint treat any stream error as a connection error, i.e. GOAWAY with the
    // same code, which is what the h2 crate (0.4.20) does: it rejects the frame as it
    // decodes it, before it looks at the stream.
    let (mut h2, id) = with_watch(&srv, "zero", 1 << 30).await;
    h2.write(&frame(WINDOW_UPDATE, 0, id, &0u32.to_be_bytes()))
        .await;
    h2.until("the answer to a stream WINDOW_UPDATE of 0", |h| {
        h.stream(id).reset.is_some() || h.goaway.is_some()
    })
    .await;
    if let Some(code) = h2.stream(id).reset {
        assert_eq!(code, PROTOCOL_ERROR, "RST_STREAM's code");
    } else {
        let code = goaway_and_close(&mut h2, "a stream WINDOW_UPDATE of 0").await;
        assert_eq!(code, PROTOCOL_ERROR, "GOAWAY's code");
    }

    // On the connection: a connection error PROTOCOL_ERROR (§6.9), i.e. GOAWAY.
    let (mut h2, _) = with_watch(&srv, "zero", 1 << 30).await;
    h2.write(&frame(WINDOW_UPDATE, 0, 0, &0u32.to_be_bytes()))
        .await;
    let code = goaway_and_close(&mut h2, "a connection WINDOW_UPDATE of 0").await;
    assert_eq!(code, PROTOCOL_ERROR, "GOAWAY's code");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_updates_past_2_31_are_flow_control_errors() {
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "overflow").await;

    // On a stream (its window 1 MiB, so 2^31-1 more overflows): RST_STREAM FLOW_CONTROL_ERROR
    // (§6.9.1), which the h2 crate sends; GOAWAY with that code is allowed too (§5.4.1).
    let (mut h2, id) = with_watch(&srv, "overflow", 1 << 30).await;
    h2.write(&frame(WINDOW_UPDATE, 0, id, &MAX_WINDOW.to_be_bytes()))
        .await;
    h2.until("the answer to a stream window past 2^31-1", |h| {
        h.stream(id).reset.is_some() || h.goaway.is_some()
    })
    .await;
    if let Some(code) = h2.stream(id).reset {
        assert_eq!(code, FLOW_CONTROL_ERROR, "RST_STREAM's code");
        // Only that stream ended: the connection serves a new watch, and the reset one gets
        // nothing more (`check` fails on DATA after the server's RST_STREAM).
        let rv = list_rv(&admin, "overflow").await;
        let next = watch(&mut h2, &watch_path("overflow", &rv), &[]).await;
        create_sa(&admin, "overflow", "after", 400).await;
        h2.until("an event on the next watch", |h| {
            h.stream(next).has("after")
        })
        .await;
        h2.settle().await;
    } else {
        let code = goaway_and_close(&mut h2, "a stream window past 2^31-1").await;
        assert_eq!(code, FLOW_CONTROL_ERROR, "GOAWAY's code");
    }

    // On the connection (its window 65,535 less what came): GOAWAY FLOW_CONTROL_ERROR.
    let (mut h2, _) = with_watch(&srv, "overflow", 0).await;
    assert!(h2.conn_received < DEFAULT_WINDOW);
    h2.write(&frame(WINDOW_UPDATE, 0, 0, &MAX_WINDOW.to_be_bytes()))
        .await;
    let code = goaway_and_close(&mut h2, "a connection window past 2^31-1").await;
    assert_eq!(code, FLOW_CONTROL_ERROR, "GOAWAY's code");
}

/// curl over h2 (nghttp2's client), with the admin certificate: a watch gets every event
/// and ends with its `timeoutSeconds`, and a list larger than curl's first windows arrives
/// whole, both on h2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_watches_and_lists_over_h2() {
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "curl").await;
    for i in 0..40 {
        create_sa(&admin, "curl", &format!("big-{i}"), 3000).await;
    }
    let rv = list_rv(&admin, "curl").await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = srv.handle().pki.admin_credentials();
    let (cert_path, key_path) = (dir.path().join("admin.crt"), dir.path().join("admin.key"));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    let base = format!("https://127.0.0.1:{}", srv.handle().addr.port());
    let curl = move |path: String| {
        let out = std::process::Command::new("curl")
            .args([
                "--http2",
                "-sSk",
                "-N",
                "--max-time",
                "20",
                "-w",
                "\n%{http_version}",
            ])
            .arg("--cert")
            .arg(&cert_path)
            .arg("--key")
            .arg(&key_path)
            .arg(format!("{base}{path}"))
            .output()
            .expect("curl");
        assert!(
            out.status.success(),
            "curl {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let watch = {
        let curl = curl.clone();
        let path = format!("{}&timeoutSeconds=3", watch_path("curl", &rv));
        tokio::task::spawn_blocking(move || curl(path))
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..5 {
        create_sa(&admin, "curl", &format!("w-{i}"), 500).await;
    }
    let out = watch.await.unwrap();
    let (body, version) = out.rsplit_once('\n').unwrap();
    assert_eq!(version, "2", "the watch went over h2");
    let names: Vec<String> = body
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "ADDED")
        .map(|e| {
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        names,
        ["w-0", "w-1", "w-2", "w-3", "w-4"],
        "every event, in order"
    );
    let out =
        tokio::task::spawn_blocking(move || curl("/api/v1/namespaces/curl/serviceaccounts".into()))
            .await
            .unwrap();
    let (body, version) = out.rsplit_once('\n').unwrap();
    assert_eq!(version, "2", "the list went over h2");
    assert!(body.len() > 100_000, "{} bytes", body.len());
    let list: Value = serde_json::from_str(body).unwrap();
    let items = list["items"].as_array().unwrap();
    assert!(items.len() >= 45, "{} items", items.len());
}
