//! A frame-level h2 watch client (`--h2-frames`): one reader per connection demultiplexes the
//! DATA frames of all its watch streams by stream id, as Go's h2 client reads a connection in
//! one loop and raw-mux's reader does its chunks, instead of hyper's client with a task,
//! queue and wake-up per stream. It writes the preface, SETTINGS (1 MiB stream windows, no
//! push) and a 16 MiB connection window, one GET per stream (HPACK: static entries and
//! literals, never the dynamic table), then only SETTINGS and PING acknowledgements and the
//! WINDOW_UPDATEs of what it read (a stream's at 512 KiB read, the connection's at 8 MiB).
//! A response is accepted only with `:status` 200 as the first field, in the static table's
//! one-octet form every encoder uses for it; nothing else of the response head is decoded.
//! Its watchers do not reconnect.
//!
//! Why: at 50,000 watchers the hyper client took 1.2 to 1.9 cores of this 2-core machine
//! where raw-mux's reader took 0.45, so the gateway's latency was the load generator's
//! queue as much as the server's.

use std::collections::VecDeque;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use anyhow::{Context as _, Result, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::raw::mux::streams_on;
use crate::target::Endpoint;
use crate::watch::{Item, WStream};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADER_LEN: usize = 9;

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const WINDOW_UPDATE: u8 = 8;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;

/// Every stream's receive window, and when its reads are given back.
const STREAM_WINDOW: u32 = 1 << 20;
const STREAM_REFRESH: u32 = STREAM_WINDOW / 2;
/// The connection's receive window, and when its reads are given back.
const CONN_WINDOW: u32 = 16 << 20;
const CONN_REFRESH: u32 = CONN_WINDOW / 2;
/// `:status: 200`, indexed in HPACK's static table.
const STATUS_200: u8 = 0x88;

/// Opens `watchers` watch streams of `path_of(i)` spread over `connections` connections
/// (contiguous ranges of watcher indices per connection); one receiving stream per
/// connection, with the number of watchers it carries.
pub async fn open(
    ep: &Endpoint,
    watchers: usize,
    connections: usize,
    accept: &str,
    path_of: impl Fn(usize) -> String,
) -> Result<Vec<(WStream, usize)>> {
    if ep.exec.is_some() {
        bail!("--h2-frames does not run exec credential plugins");
    }
    let connections = connections.clamp(1, watchers.max(1));
    let mut heads = Vec::new();
    let mut widths = Vec::new();
    let mut base = 0;
    for c in 0..connections {
        let n = streams_on(watchers, connections, c);
        if n == 0 {
            continue;
        }
        let paths: Vec<String> = (base..base + n).map(&path_of).collect();
        heads.push(connect(ep, &paths, accept).await?);
        widths.push(n);
        base += n;
    }
    // Open means answered: the server has its watches once every response head is in, as
    // the hyper client's watchers are open once their response is, and raw-mux's readers
    // once subscribed. Writes that began before would be timed with the server's work of
    // opening the watches (at 50,000 watches about a second of both cores).
    let opened = tokio::time::timeout(HEADS_WITHIN, futures::future::try_join_all(heads))
        .await
        .map_err(|_| {
            anyhow::anyhow!("the server did not answer every watch within {HEADS_WITHIN:?}")
        })??;
    Ok(opened.into_iter().zip(widths).collect())
}

/// How long the server may take to answer every watch of a run.
const HEADS_WITHIN: std::time::Duration = std::time::Duration::from_secs(300);

/// A connection's receiving stream once the server answered each of its watches.
type Heads = Pin<Box<dyn std::future::Future<Output = Result<WStream>> + Send>>;

/// Sends the watches of one connection; the future returned yields its receiving stream once
/// every one of them has its response head (or ended without one).
async fn connect(ep: &Endpoint, paths: &[String], accept: &str) -> Result<Heads> {
    let tcp = TcpStream::connect(ep.addr)
        .await
        .with_context(|| format!("connecting to {}", ep.addr))?;
    tcp.set_nodelay(true)?;
    let authority = ep
        .url
        .split("://")
        .nth(1)
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let mut hello = BytesMut::new();
    handshake(&mut hello);
    let https = ep.tls.is_some();
    for (i, path) in paths.iter().enumerate() {
        let id = stream_id(i);
        let block = request_block(https, &authority, path, accept, ep.bearer.as_deref());
        put_frame(&mut hello, HEADERS, END_HEADERS | END_STREAM, id, &block);
    }
    match &ep.tls {
        None => {
            let mut tcp = tcp;
            tcp.write_all(&hello).await?;
            Ok(answered(FrameStream::new(tcp, paths.len())))
        }
        Some(t) => {
            let mut tls = tokio_rustls::TlsConnector::from(t.h2.clone())
                .connect(t.name.clone(), tcp)
                .await?;
            tls.write_all(&hello).await?;
            tls.flush().await?;
            Ok(answered(FrameStream::new(tls, paths.len())))
        }
    }
}

/// `s` as a receiving stream, once every one of its watches has its response head.
fn answered<S>(mut s: FrameStream<S>) -> Heads
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    Box::pin(async move {
        std::future::poll_fn(|cx| s.poll_heads(cx))
            .await
            .map_err(anyhow::Error::msg)?;
        Ok(Box::pin(s) as WStream)
    })
}

/// The `i`th client stream's id: 1, 3, 5, ...
fn stream_id(i: usize) -> u32 {
    u32::try_from(i * 2 + 1).unwrap_or(u32::MAX)
}

/// The preface, SETTINGS and the connection's window.
fn handshake(out: &mut BytesMut) {
    out.put_slice(PREFACE);
    let mut s = BytesMut::new();
    s.put_u16(0x2); // ENABLE_PUSH
    s.put_u32(0);
    s.put_u16(0x4); // INITIAL_WINDOW_SIZE
    s.put_u32(STREAM_WINDOW);
    put_frame(out, SETTINGS, 0, 0, &s);
    put_frame(
        out,
        WINDOW_UPDATE,
        0,
        0,
        &(CONN_WINDOW - 65_535).to_be_bytes(),
    );
}

fn put_frame(out: &mut BytesMut, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.put_slice(&len.to_be_bytes()[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream & 0x7fff_ffff);
    out.put_slice(payload);
}

/// An HPACK integer with an `n`-bit prefix whose other bits are `first`.
fn put_int(out: &mut Vec<u8>, first: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_int(out, 0, 7, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// A GET's header block: static entries and literals without indexing.
fn request_block(
    https: bool,
    authority: &str,
    path: &str,
    accept: &str,
    bearer: Option<&str>,
) -> Vec<u8> {
    let mut b = vec![0x82, if https { 0x87 } else { 0x86 }];
    // Literal without indexing, name from the static table (:path 4, :authority 1).
    put_int(&mut b, 0, 4, 4);
    put_str(&mut b, path);
    put_int(&mut b, 0, 4, 1);
    put_str(&mut b, authority);
    for (name, value) in [("accept", Some(accept)), ("authorization", bearer)] {
        let Some(value) = value else { continue };
        b.push(0);
        put_str(&mut b, name);
        if name == "authorization" {
            put_str(&mut b, &format!("Bearer {value}"));
        } else {
            put_str(&mut b, value);
        }
    }
    b
}

/// One connection's watch streams as a receiver group's stream: each DATA payload tagged
/// with its watcher's index (from 0; the caller renumbers), `End` when a stream ends and for
/// every open stream when the connection does.
pub struct FrameStream<S> {
    io: Option<S>,
    rd: BytesMut,
    /// Acknowledgements and window updates not yet written.
    wr: BytesMut,
    out: VecDeque<(usize, Item)>,
    open: Vec<bool>,
    /// Whether each stream's response head came (or the stream ended without one), and how
    /// many did.
    headed: Vec<bool>,
    heads: usize,
    /// Bytes read and not yet given back, per stream and for the connection.
    unacked: Vec<u32>,
    unacked_conn: u32,
    ending: Range<usize>,
}

impl<S> FrameStream<S> {
    fn new(io: S, streams: usize) -> Self {
        FrameStream {
            io: Some(io),
            rd: BytesMut::with_capacity(64 * 1024),
            wr: BytesMut::new(),
            out: VecDeque::new(),
            open: vec![true; streams],
            headed: vec![false; streams],
            heads: 0,
            unacked: vec![0; streams],
            unacked_conn: 0,
            ending: 0..streams,
        }
    }

    /// The watcher index of stream `id`, if it is one of this connection's.
    fn index(&self, id: u32) -> Option<usize> {
        if id.is_multiple_of(2) {
            return None;
        }
        let i = (id as usize - 1) / 2;
        (i < self.open.len()).then_some(i)
    }

    /// Stream `i` has its response head, or will never have one.
    fn headed(&mut self, i: usize) {
        if let Some(h) = self.headed.get_mut(i)
            && !*h
        {
            *h = true;
            self.heads += 1;
        }
    }

    fn end(&mut self, i: usize, err: Option<String>) {
        self.headed(i);
        if self.open.get(i).copied().unwrap_or(false) {
            self.open[i] = false;
            if let Some(e) = err {
                self.out.push_back((i, Item::Err(e)));
            }
            self.out.push_back((i, Item::End));
        }
    }

    /// Handles one whole frame.
    fn frame(&mut self, kind: u8, flags: u8, id: u32, mut payload: Bytes) -> Result<(), String> {
        match kind {
            DATA => {
                let len = payload.len() as u32;
                self.unacked_conn += len;
                if self.unacked_conn >= CONN_REFRESH {
                    put_frame(
                        &mut self.wr,
                        WINDOW_UPDATE,
                        0,
                        0,
                        &self.unacked_conn.to_be_bytes(),
                    );
                    self.unacked_conn = 0;
                }
                let Some(i) = self.index(id) else {
                    return Err(format!("DATA on stream {id}, not one of this connection's"));
                };
                if flags & PADDED != 0 && !payload.is_empty() {
                    let pad = payload.get_u8() as usize;
                    payload.truncate(payload.len().saturating_sub(pad));
                }
                if !self.open[i] {
                    return Ok(());
                }
                self.unacked[i] += len;
                if self.unacked[i] >= STREAM_REFRESH && flags & END_STREAM == 0 {
                    put_frame(
                        &mut self.wr,
                        WINDOW_UPDATE,
                        0,
                        id,
                        &self.unacked[i].to_be_bytes(),
                    );
                    self.unacked[i] = 0;
                }
                if !payload.is_empty() {
                    self.out.push_back((i, Item::Data(payload)));
                }
                if flags & END_STREAM != 0 {
                    self.end(i, None);
                }
            }
            HEADERS => {
                let Some(i) = self.index(id) else {
                    return Err(format!(
                        "HEADERS on stream {id}, not one of this connection's"
                    ));
                };
                let mut skip = 0;
                if flags & PADDED != 0 {
                    skip += 1;
                }
                if flags & PRIORITY_FLAG != 0 {
                    skip += 5;
                }
                self.headed(i);
                let first = payload.get(skip).copied();
                if first != Some(STATUS_200) && self.unacked[i] == 0 {
                    self.end(i, Some(format!("watch: response head {first:?}, not 200")));
                } else if flags & END_STREAM != 0 {
                    self.end(i, None);
                }
            }
            RST_STREAM => {
                if let Some(i) = self.index(id) {
                    let code = payload
                        .get(..4)
                        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                    self.end(i, Some(format!("stream reset by the server ({code:?})")));
                }
            }
            SETTINGS if flags & ACK == 0 => put_frame(&mut self.wr, SETTINGS, ACK, 0, &[]),
            PING if flags & ACK == 0 => put_frame(&mut self.wr, PING, ACK, 0, &payload),
            _ => {}
        }
        Ok(())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> FrameStream<S> {
    /// Ready once every stream has its response head (or ended without one); what the
    /// streams were sent meanwhile waits for [`Stream::poll_next`]. An error if the connection
    /// ends first.
    fn poll_heads(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        loop {
            if self.heads >= self.open.len() {
                return Poll::Ready(Ok(()));
            }
            if self.io.is_none() {
                return Poll::Ready(Err(format!(
                    "the connection ended with {} of its {} watches unanswered",
                    self.open.len() - self.heads,
                    self.open.len()
                )));
            }
            self.write_acks(cx);
            while let Some((kind, flags, id, payload)) = self.next_frame() {
                self.frame(kind, flags, id, payload)?;
            }
            if self.heads >= self.open.len() {
                continue;
            }
            match self.poll_fill(cx) {
                Poll::Ready(Ok(0)) => self.io = None,
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.to_string())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Writes the acknowledgements and window updates waiting first: a server waits for
    /// window updates. A connection that can no longer be written drops them and is still
    /// read to its end.
    fn write_acks(&mut self, cx: &mut Context<'_>) {
        let Some(io) = self.io.as_mut() else {
            return;
        };
        while !self.wr.is_empty() {
            match Pin::new(&mut *io).poll_write(cx, &self.wr) {
                Poll::Ready(Ok(n)) if n > 0 => self.wr.advance(n),
                Poll::Ready(_) => self.wr.clear(),
                Poll::Pending => break,
            }
        }
    }

    /// Reads more of the connection into the read buffer: `Ok(0)` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.rd.capacity() - self.rd.len() < 16 * 1024 {
            self.rd.reserve(64 * 1024);
        }
        let Some(io) = self.io.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut self.rd)
    }
}

impl<S> FrameStream<S> {
    /// The next whole frame in the read buffer: type, flags, stream id and payload.
    fn next_frame(&mut self) -> Option<(u8, u8, u32, Bytes)> {
        if self.rd.len() < HEADER_LEN {
            return None;
        }
        let len = u32::from_be_bytes([0, self.rd[0], self.rd[1], self.rd[2]]) as usize;
        if self.rd.len() < HEADER_LEN + len {
            return None;
        }
        let head = self.rd.split_to(HEADER_LEN);
        let payload = self.rd.split_to(len).freeze();
        let id = u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]);
        Some((head[3], head[4], id, payload))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Stream for FrameStream<S> {
    type Item = (usize, Item);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(item) = this.out.pop_front() {
                return Poll::Ready(Some(item));
            }
            if this.io.is_none() {
                for i in this.ending.by_ref() {
                    if this.open[i] {
                        this.open[i] = false;
                        return Poll::Ready(Some((i, Item::End)));
                    }
                }
                return Poll::Ready(None);
            }
            this.write_acks(cx);
            // Whole frames in the buffer.
            while let Some((kind, flags, id, payload)) = this.next_frame() {
                if let Err(e) = this.frame(kind, flags, id, payload) {
                    this.io = None;
                    this.out.push_back((0, Item::Err(e)));
                    break;
                }
                if this.out.len() >= 64 {
                    break;
                }
            }
            if !this.out.is_empty() || this.io.is_none() {
                continue;
            }
            match this.poll_fill(cx) {
                Poll::Ready(Ok(0)) => this.io = None,
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    this.io = None;
                    return Poll::Ready(Some((0, Item::Err(e.to_string()))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpack_integers_take_their_prefix_then_seven_bits_an_octet() {
        let mut b = Vec::new();
        put_int(&mut b, 0, 5, 10);
        assert_eq!(b, [10]);
        b.clear();
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        put_int(&mut b, 0, 5, 1337);
        assert_eq!(b, [31, 154, 10]);
    }

    #[test]
    fn a_request_block_is_static_entries_and_literals() {
        let b = request_block(false, "h:1", "/p", "application/json", None);
        let mut expected = vec![
            0x82, 0x86, 0x04, 2, b'/', b'p', 0x01, 3, b'h', b':', b'1', 0,
        ];
        expected.push(6);
        expected.extend_from_slice(b"accept");
        expected.push(16);
        expected.extend_from_slice(b"application/json");
        assert_eq!(b, expected);
    }

    /// Everything a connection's stream yields to its end, one line an item.
    async fn items<S: AsyncRead + AsyncWrite + Unpin>(s: &mut FrameStream<S>) -> Vec<String> {
        use futures::StreamExt as _;
        let mut got = Vec::new();
        while let Some((i, item)) = s.next().await {
            got.push(match item {
                Item::Data(b) => format!("{i} data {}", b.len()),
                Item::Err(_) => format!("{i} err"),
                Item::End => format!("{i} end"),
            });
        }
        got
    }

    #[tokio::test]
    async fn a_connection_is_open_once_every_watch_is_answered() {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let mut s = FrameStream::new(client, 3);
        let mut w = BytesMut::new();
        put_frame(&mut w, SETTINGS, 0, 0, &[]);
        put_frame(&mut w, HEADERS, END_HEADERS, 1, &[STATUS_200]);
        put_frame(&mut w, DATA, 0, 1, b"early\n");
        put_frame(&mut w, RST_STREAM, 0, 5, &8u32.to_be_bytes());
        server.write_all(&w).await.unwrap();
        let mut heads = std::pin::pin!(std::future::poll_fn(|cx| s.poll_heads(cx)));
        // Stream 3 is not answered yet.
        assert!(futures::poll!(heads.as_mut()).is_pending());
        let mut w = BytesMut::new();
        put_frame(&mut w, HEADERS, END_HEADERS, 3, &[STATUS_200]);
        server.write_all(&w).await.unwrap();
        assert_eq!(heads.await, Ok(()));
        // What came before is kept for the watchers.
        drop(server);
        let got = items(&mut s).await;
        assert_eq!(got, ["0 data 6", "2 err", "2 end", "0 end", "1 end"]);
        // A connection that ends first is an error, not a wait.
        let (client, server) = tokio::io::duplex(1 << 10);
        let mut s = FrameStream::new(client, 1);
        drop(server);
        let err = std::future::poll_fn(|cx| s.poll_heads(cx))
            .await
            .unwrap_err();
        assert!(err.contains("1 of its 1 watches unanswered"), "{err}");
    }

    #[tokio::test]
    async fn data_reaches_its_watcher_and_reads_are_given_back() {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let mut s = FrameStream::new(client, 2);
        let mut w = BytesMut::new();
        put_frame(&mut w, SETTINGS, 0, 0, &[]);
        put_frame(&mut w, HEADERS, END_HEADERS, 3, &[STATUS_200]);
        put_frame(&mut w, DATA, 0, 3, b"hello\n");
        put_frame(&mut w, HEADERS, END_HEADERS, 1, &[0x8d]); // :status 404
        put_frame(&mut w, DATA, 0, 3, &vec![b'x'; STREAM_REFRESH as usize]);
        put_frame(&mut w, DATA, END_STREAM, 3, &[]);
        server.write_all(&w).await.unwrap();
        drop(server);
        let got = items(&mut s).await;
        assert_eq!(
            got,
            [
                "1 data 6",
                "0 err",
                "0 end",
                &format!("1 data {STREAM_REFRESH}"),
                "1 end"
            ]
        );
    }
}
