//! HTTP/1.1 connections, served here for as long as they carry GET requests without a body:
//! what clients list and watch with. The head is read and parsed (`httparse`) into a buffer
//! that is freed once the head is out of it, and the response is written straight from the
//! pipeline's body frames (a watch's are the cache's shared frames), gathered into one
//! vectored write per round and framed as chunks when their length is not known. So an idle
//! watch holds no read or write buffer, only its task and its watcher: hyper's connection
//! keeps a read buffer of up to 16 KiB and a head buffer of 8 KiB for the connection's life.
//!
//! Any other request (a write, a body, `HEAD`, an upgrade, `Expect`, HTTP/1.0, a head too
//! large or that does not parse) is handed to hyper with the bytes read so far, and hyper
//! serves the connection from there on (`server.rs`); its errors (400, 431) are hyper's.
//!
//! Kept as hyper keeps them: the header read timeout from a head's first byte, the idle
//! timeout (or the header read timeout, if shorter) between requests, pipelining (requests read while a response is written wait,
//! bounded by the head size limit), `connection: close` either way, closing at once on the
//! client's end of stream (no half-close), and at shutdown, ending after the response in
//! flight.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf as _, Bytes};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Body as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::sync::watch;

use crate::http::respond::Body;
use crate::security::authn::ConnIdentity;
use crate::serve::app::ServerState;
use crate::serve::bulk::is_list;
use crate::serve::conn_limits::CLOSE_GRACE;
use crate::serve::pipeline::{self, Caller, RequestBody};

/// The limits hyper's HTTP/1.1 builder is given, kept here too.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The largest request head; a longer one goes to hyper, which answers 431.
    pub max_head: usize,
    /// Most header fields; more go to hyper, which answers 431.
    pub max_headers: usize,
    /// From a head's first byte to its end.
    pub header_read_timeout: Duration,
    /// Between requests (or the header read timeout, if shorter).
    pub idle_timeout: Duration,
}

/// A connection with the bytes already read from it put back in front.
pub struct Prefixed<I> {
    pub head: Bytes,
    pub io: I,
}

/// Serves `io` (whose first bytes, `seen`, are already read) while its requests are GETs
/// without a body; `Some` hands the connection, with what was read of the next request, to
/// hyper. With `--list-niceness`, the connection moves to the bulk threads (`bulk.rs`) with
/// its first list, and stays there, reading its next heads too, for as long as it lists.
pub async fn serve<I>(
    io: I,
    seen: Vec<u8>,
    limits: &Limits,
    stop: watch::Receiver<bool>,
    app: Arc<ServerState>,
    ident: Arc<ConnIdentity>,
) -> Option<Prefixed<I>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = Conn {
        limits: limits.clone(),
        stop,
        app,
        ident,
    };
    let mut exit = serve_lane(io, seen, None, conn.clone(), Lane::Request).await;
    loop {
        let Exit::Switch { io, buf, next } = exit else {
            break;
        };
        let Some(bulk) = conn.app.bulk.as_ref() else {
            return None; // never switched without bulk threads
        };
        let task = bulk.spawn(serve_lane(io, buf, Some(next), conn.clone(), Lane::Bulk));
        exit = match task.await {
            Ok(Exit::Switch { io, buf, next }) => {
                serve_lane(io, buf, Some(next), conn.clone(), Lane::Request).await
            }
            Ok(other) => other,
            Err(e) => {
                tracing::warn!(error = %e, "a connection's task on the bulk threads ended");
                return None;
            }
        };
    }
    match exit {
        Exit::Hyper(prefixed) => Some(prefixed),
        Exit::End | Exit::Switch { .. } => None,
    }
}

/// What every request of a connection is served with.
#[derive(Clone)]
struct Conn {
    limits: Limits,
    stop: watch::Receiver<bool>,
    app: Arc<ServerState>,
    ident: Arc<ConnIdentity>,
}

/// Which threads a connection is served on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lane {
    /// The request threads.
    Request,
    /// The bulk threads, for lists.
    Bulk,
}

/// How serving a connection on one lane ended.
enum Exit<I> {
    /// Closed, or gone.
    End,
    /// To hyper.
    Hyper(Prefixed<I>),
    /// A request for the other lane: the connection, what follows the request's head, and the
    /// request.
    Switch {
        io: I,
        buf: Vec<u8>,
        next: Box<Parsed>,
    },
}

/// The lane a request is served on: lists on the bulk threads when there are some.
fn lane_of(app: &ServerState, req: &Request<RequestBody>) -> Lane {
    if app.bulk.is_some() && is_list(req.method(), req.uri()) {
        Lane::Bulk
    } else {
        Lane::Request
    }
}

/// Serves the connection's requests (`first`, then what it reads) on `lane`, until one
/// belongs to the other lane.
async fn serve_lane<I>(
    mut io: I,
    mut buf: Vec<u8>,
    mut first: Option<Box<Parsed>>,
    mut conn: Conn,
    lane: Lane,
) -> Exit<I>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let parsed = match first.take() {
            Some(p) => p,
            None => match read_head(&mut io, &mut buf, &conn.limits, &mut conn.stop).await {
                HeadRead::Ours(p) => {
                    // What follows the head (pipelined requests) stays; an empty buffer is
                    // freed, so a watch holds none.
                    buf.drain(..p.len.min(buf.len()));
                    if buf.is_empty() {
                        buf = Vec::new();
                    }
                    p
                }
                HeadRead::Hyper => {
                    return Exit::Hyper(Prefixed {
                        head: Bytes::from(buf),
                        io,
                    });
                }
                HeadRead::End => return Exit::End,
            },
        };
        if lane_of(&conn.app, &parsed.req) != lane {
            return Exit::Switch {
                io,
                buf,
                next: parsed,
            };
        }
        let caller = Caller::Connection(conn.ident.clone());
        // Boxed: the pipeline's future is large, and only needed until the response is made.
        let resp = Box::pin(pipeline::handle(conn.app.clone(), caller, parsed.req)).await;
        let (head, body, close) = response_head(resp, parsed.close || *conn.stop.borrow());
        let mut out = Out::new(head, body);
        let mut closing = false;
        let sent = {
            let max_spare = conn.limits.max_head;
            let mut send = std::pin::pin!(std::future::poll_fn(
                |cx| out.poll_send(&mut io, cx, &mut buf, max_spare)
            ));
            loop {
                tokio::select! {
                    r = &mut send => break r,
                    // At shutdown the response in flight is finished (a watch ends itself).
                    _ = crate::base::lifecycle::until_set(&mut conn.stop), if !closing => closing = true,
                }
            }
        };
        match sent {
            Ok(Sent::Complete) if !close && !closing && !*conn.stop.borrow() => {}
            Ok(Sent::Complete) => {
                let _ = tokio::time::timeout(CLOSE_GRACE, io.shutdown()).await;
                return Exit::End;
            }
            Ok(Sent::Gone) => return Exit::End,
            Err(e) => {
                tracing::debug!(error = %e, "connection ended while writing a response");
                return Exit::End;
            }
        }
    }
}

enum HeadRead {
    Ours(Box<Parsed>),
    Hyper,
    End,
}

/// Reads until `buf` holds a whole head: within the idle (or header read) timeout for its
/// first byte, then the header read timeout for the rest. `End`: the client left, a timeout, or shutdown.
async fn read_head<I>(
    io: &mut I,
    buf: &mut Vec<u8>,
    limits: &Limits,
    stop: &mut watch::Receiver<bool>,
) -> HeadRead
where
    I: AsyncRead + Unpin,
{
    if buf.is_empty() {
        // Waiting for the next request counts against the header read timeout too, as in
        // hyper (and the README's `--http-header-read-timeout`).
        let wait = limits.idle_timeout.min(limits.header_read_timeout);
        tokio::select! {
            r = read_more(io, buf, limits.max_head) => if !matches!(r, Ok(n) if n > 0) {
                return HeadRead::End;
            },
            _ = tokio::time::sleep(wait) => {
                tracing::debug!("closing an idle connection");
                return HeadRead::End;
            }
            _ = crate::base::lifecycle::until_set(stop) => return HeadRead::End,
        }
    }
    let timer = tokio::time::sleep(limits.header_read_timeout);
    tokio::pin!(timer);
    // A head begun as shutdown began is still read (its request is answered, with
    // `Connection: close`), for a short while.
    let grace = crate::base::lifecycle::grace_after(stop, CLOSE_GRACE);
    tokio::pin!(grace);
    loop {
        match parse(buf, limits.max_headers) {
            Parse::Ours(p) => return HeadRead::Ours(p),
            Parse::Other => return HeadRead::Hyper,
            Parse::Partial if buf.len() >= limits.max_head => return HeadRead::Hyper,
            Parse::Partial => {}
        }
        tokio::select! {
            r = read_more(io, buf, limits.max_head) => if !matches!(r, Ok(n) if n > 0) {
                return HeadRead::End;
            },
            _ = &mut timer => {
                tracing::debug!("request head not read within the header read timeout");
                return HeadRead::End;
            }
            () = &mut grace => return HeadRead::End,
        }
    }
}

/// Bytes read per call while a head is incomplete.
const READ_STEP: usize = 4096;

async fn read_more<I: AsyncRead + Unpin>(
    io: &mut I,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    let want = max.saturating_sub(buf.len()).clamp(1, READ_STEP);
    buf.reserve(want);
    io.read_buf(buf).await
}

/// A request head this module serves.
struct Parsed {
    req: Request<RequestBody>,
    /// The head's length in the buffer.
    len: usize,
    /// The client asked to close after the response.
    close: bool,
}

enum Parse {
    Partial,
    Ours(Box<Parsed>),
    /// Not a bodiless HTTP/1.1 GET, or not one to parse here: hyper's.
    Other,
}

/// Header fields tried first; a head with more is parsed again with room for `max_headers`.
const FEW_HEADERS: usize = 64;

fn parse(buf: &[u8], max_headers: usize) -> Parse {
    match parse_with(buf, FEW_HEADERS) {
        Err(httparse::Error::TooManyHeaders) if max_headers > FEW_HEADERS => {
            parse_with(buf, max_headers).unwrap_or(Parse::Other)
        }
        r => r.unwrap_or(Parse::Other),
    }
}

fn parse_with(buf: &[u8], fields: usize) -> Result<Parse, httparse::Error> {
    let mut headers = vec![httparse::EMPTY_HEADER; fields];
    let mut head = httparse::Request::new(&mut headers);
    let len = match head.parse(buf)? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(Parse::Partial),
    };
    if head.method != Some("GET") || head.version != Some(1) {
        return Ok(Parse::Other);
    }
    let Some(Ok(uri)) = head.path.map(http::Uri::try_from) else {
        return Ok(Parse::Other);
    };
    let mut map = HeaderMap::with_capacity(head.headers.len());
    let mut close = false;
    for h in head.headers.iter() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) else {
            return Ok(Parse::Other);
        };
        let tokens = || {
            value
                .to_str()
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .collect::<Vec<_>>()
        };
        // A body, a wait for 100-continue or an upgrade: hyper's to serve.
        if name == header::TRANSFER_ENCODING || name == header::EXPECT || name == header::UPGRADE {
            return Ok(Parse::Other);
        }
        if name == header::CONTENT_LENGTH && value.as_bytes().trim_ascii() != b"0" {
            return Ok(Parse::Other);
        }
        if name == header::CONNECTION {
            let tokens = tokens();
            if tokens.iter().any(|t| t.eq_ignore_ascii_case("upgrade")) {
                return Ok(Parse::Other);
            }
            close |= tokens.iter().any(|t| t.eq_ignore_ascii_case("close"));
        }
        map.append(name, value);
    }
    let mut req = Request::new(RequestBody::Full(Bytes::new()));
    *req.method_mut() = Method::GET;
    *req.uri_mut() = uri;
    *req.version_mut() = http::Version::HTTP_11;
    *req.headers_mut() = map;
    Ok(Parse::Ours(Box::new(Parsed { req, len, close })))
}

/// How a response's body is framed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Framing {
    /// No body (`1xx`, 204, 304).
    None,
    Length,
    Chunked,
}

/// The response's head, encoded, with its body and whether the connection closes after it: as
/// hyper writes it, with `content-length` when the body's size is known, else chunked, a
/// `date`, and `connection: close` when either side asked for it.
fn response_head(
    resp: Response<Body>,
    close_asked: bool,
) -> (Bytes, Option<(Body, Framing)>, bool) {
    let (mut parts, body) = resp.into_parts();
    let headers = &mut parts.headers;
    let close = close_asked
        || headers.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
        });
    let status = parts.status;
    let framing = if status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        headers.remove(header::TRANSFER_ENCODING);
        Framing::None
    } else if headers.contains_key(header::CONTENT_LENGTH) {
        headers.remove(header::TRANSFER_ENCODING);
        Framing::Length
    } else if let Some(len) = body.size_hint().exact() {
        headers.remove(header::TRANSFER_ENCODING);
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        Framing::Length
    } else {
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        Framing::Chunked
    };
    if close && !headers.contains_key(header::CONNECTION) {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    crate::http::respond::ensure_date(headers);
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in headers.iter() {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    let body = (framing != Framing::None).then_some((body, framing));
    (Bytes::from(head), body, close)
}

/// A piece of what is to be written.
enum Piece {
    Data(Bytes),
    Static(&'static [u8]),
    /// A chunk's size line, right-aligned in `digits` from `at`.
    Size {
        digits: [u8; 18],
        at: usize,
    },
}

impl Piece {
    fn size(len: usize) -> Piece {
        let mut digits = [0u8; 18];
        let mut at = digits.len().saturating_sub(2);
        if let Some(end) = digits.get_mut(at..) {
            end.copy_from_slice(b"\r\n");
        }
        let mut n = len;
        loop {
            at = at.saturating_sub(1);
            if let Some(d) = digits.get_mut(at) {
                *d = b"0123456789abcdef".get(n % 16).copied().unwrap_or(b'0');
            }
            n /= 16;
            if n == 0 || at == 0 {
                break;
            }
        }
        Piece::Size { digits, at }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Data(b) => b,
            Piece::Static(s) => s,
            Piece::Size { digits, at } => digits.get(*at..).unwrap_or_default(),
        }
    }

    fn advance(&mut self, n: usize) {
        match self {
            Piece::Data(b) => b.advance(n.min(b.len())),
            Piece::Static(s) => *s = s.get(n..).unwrap_or_default(),
            Piece::Size { at, .. } => *at = at.saturating_add(n),
        }
    }
}

/// Bytes queued before the body is asked for more: what one vectored write carries at most.
const HIGH_WATER: usize = 64 * 1024;

/// Slices per vectored write.
const MAX_SLICES: usize = 64;

/// Pieces a finished round's queue keeps room for; a larger queue is given back.
const KEPT_PIECES: usize = 8;

/// Stack room for bytes a client sends while its response is written.
const READ_WHILE_WRITING: usize = 1024;

/// What became of a response.
#[derive(Debug, PartialEq)]
enum Sent {
    Complete,
    /// The client closed the connection first.
    Gone,
}

/// One response being written: its queued pieces and the body still to read.
struct Out {
    pieces: VecDeque<Piece>,
    queued: usize,
    body: Option<(Body, Framing)>,
    /// Written since the last flush.
    unflushed: bool,
}

impl Out {
    fn new(head: Bytes, body: Option<(Body, Framing)>) -> Self {
        let mut pieces = VecDeque::with_capacity(4);
        let queued = head.len();
        pieces.push_back(Piece::Data(head));
        Out {
            pieces,
            queued,
            body,
            unflushed: false,
        }
    }

    fn push(&mut self, piece: Piece) {
        self.queued = self.queued.saturating_add(piece.bytes().len());
        self.pieces.push_back(piece);
    }

    /// Takes what the body has ready, up to [`HIGH_WATER`] queued. `Err` ends the connection
    /// without completing the response, so the client sees it cut short (as hyper does).
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Result<(), std::io::Error> {
        while self.queued < HIGH_WATER {
            let Some((body, framing)) = self.body.as_mut() else {
                return Ok(());
            };
            let chunked = *framing == Framing::Chunked;
            match Pin::new(body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        continue; // trailers: none are sent over HTTP/1.1
                    };
                    if data.is_empty() {
                        continue;
                    }
                    if chunked {
                        self.push(Piece::size(data.len()));
                        self.push(Piece::Data(data));
                        self.push(Piece::Static(b"\r\n"));
                    } else {
                        self.push(Piece::Data(data));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Err(e),
                Poll::Ready(None) => {
                    if chunked {
                        self.push(Piece::Static(b"0\r\n\r\n"));
                    }
                    self.body = None;
                }
                Poll::Pending => return Ok(()),
            }
        }
        Ok(())
    }

    fn advance(&mut self, mut n: usize) {
        self.queued = self.queued.saturating_sub(n);
        while n > 0 {
            let Some(front) = self.pieces.front_mut() else {
                return;
            };
            let len = front.bytes().len();
            if n < len {
                front.advance(n);
                return;
            }
            n = n.saturating_sub(len);
            self.pieces.pop_front();
        }
        while self.pieces.front().is_some_and(|p| p.bytes().is_empty()) {
            self.pieces.pop_front();
        }
    }

    /// Writes the response to its end, reading what the client sends meanwhile into `spare`
    /// (up to `max_spare` bytes) so that its closing is seen.
    fn poll_send<I>(
        &mut self,
        io: &mut I,
        cx: &mut Context<'_>,
        spare: &mut Vec<u8>,
        max_spare: usize,
    ) -> Poll<Result<Sent, std::io::Error>>
    where
        I: AsyncRead + AsyncWrite + Unpin,
    {
        loop {
            self.poll_body(cx)?;
            if !self.pieces.is_empty() {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let used = slices
                    .iter_mut()
                    .zip(self.pieces.iter())
                    .map(|(slot, piece)| *slot = IoSlice::new(piece.bytes()))
                    .count();
                let slices = slices.get(..used).unwrap_or_default();
                match Pin::new(&mut *io).poll_write_vectored(cx, slices) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                    }
                    Poll::Ready(Ok(n)) => {
                        self.advance(n);
                        self.unflushed = true;
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {}
                }
            } else {
                if self.pieces.capacity() > KEPT_PIECES {
                    self.pieces = VecDeque::new();
                }
                if self.unflushed {
                    match Pin::new(&mut *io).poll_flush(cx) {
                        Poll::Ready(Ok(())) => self.unflushed = false,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => {}
                    }
                }
                if self.body.is_none() && !self.unflushed {
                    return Poll::Ready(Ok(Sent::Complete));
                }
            }
            // Everything that can go on waits: the client's bytes (or its end) are the one
            // thing left to look at.
            if spare.len() >= max_spare {
                return Poll::Pending;
            }
            let mut room = [0u8; READ_WHILE_WRITING];
            let mut rb = ReadBuf::new(&mut room);
            match Pin::new(&mut *io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                    return Poll::Ready(Ok(Sent::Gone));
                }
                Poll::Ready(Ok(())) => spare.extend_from_slice(rb.filled()),
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(Sent::Gone)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.head.is_empty() {
            let n = self.head.len().min(buf.remaining());
            let part = self.head.split_to(n);
            buf.put_slice(&part);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::arithmetic_side_effects)]
    use super::*;
    use http_body_util::{BodyExt as _, Full, StreamBody};
    use hyper::body::Frame;

    fn ours(buf: &[u8]) -> Box<Parsed> {
        match parse(buf, 1024) {
            Parse::Ours(p) => p,
            Parse::Partial => panic!("partial: {}", String::from_utf8_lossy(buf)),
            Parse::Other => panic!("not ours: {}", String::from_utf8_lossy(buf)),
        }
    }

    fn is_other(buf: &[u8]) -> bool {
        matches!(parse(buf, 1024), Parse::Other)
    }

    #[test]
    fn a_bodiless_get_is_parsed_with_its_headers_and_the_rest_left_alone() {
        let head = b"GET /api/v1/pods?watch=1&resourceVersion=5 HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\nAccept: */*\r\nContent-Length: 0\r\n\r\n";
        let mut buf = head.to_vec();
        buf.extend_from_slice(b"GET /next HTTP/1.1\r\n");
        let p = ours(&buf);
        assert_eq!(p.len, head.len());
        assert!(!p.close);
        assert_eq!(p.req.method(), Method::GET);
        assert_eq!(p.req.version(), http::Version::HTTP_11);
        assert_eq!(p.req.uri().path(), "/api/v1/pods");
        assert_eq!(p.req.uri().query(), Some("watch=1&resourceVersion=5"));
        assert_eq!(p.req.headers().get_all(header::ACCEPT).iter().count(), 2);
        assert_eq!(p.req.headers()["host"], "x");
        let p = ours(b"GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n");
        assert!(p.close);
    }

    #[test]
    fn anything_but_a_bodiless_http11_get_is_left_to_hyper() {
        assert!(matches!(
            parse(b"GET /api HTTP/1.1\r\nHost: x\r\n", 1024),
            Parse::Partial
        ));
        for head in [
            &b"POST /api HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"[..],
            b"HEAD /api HTTP/1.1\r\n\r\n",
            b"GET /api HTTP/1.0\r\n\r\n",
            b"GET /api HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd",
            b"GET /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET /api HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            b"GET /api HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            b"GET /api HTTP/1.1\r\nUpgrade: SPDY/3.1\r\n\r\n",
            b"GET /api HTTP/1.1\r\nBad Header: x\r\n\r\n",
            b"GARBAGE\r\n\r\n",
        ] {
            assert!(is_other(head), "{}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn many_header_fields_are_parsed_up_to_the_limit() {
        let head = |n: usize| {
            let mut h = b"GET / HTTP/1.1\r\n".to_vec();
            for i in 0..n {
                h.extend_from_slice(format!("x-h{i}: v\r\n").as_bytes());
            }
            h.extend_from_slice(b"\r\n");
            h
        };
        assert_eq!(ours(&head(200)).req.headers().len(), 200);
        assert!(matches!(parse(&head(200), 100), Parse::Other));
    }

    #[test]
    fn chunk_sizes_are_hex_lines() {
        for (n, want) in [
            (0, "0\r\n"),
            (9, "9\r\n"),
            (255, "ff\r\n"),
            (65536, "10000\r\n"),
            (usize::MAX, "ffffffffffffffff\r\n"),
        ] {
            assert_eq!(Piece::size(n).bytes(), want.as_bytes());
        }
        let mut p = Piece::size(4096);
        p.advance(2);
        assert_eq!(p.bytes(), b"00\r\n");
    }

    fn streaming(frames: &[&'static str]) -> Body {
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = frames
            .iter()
            .map(|f| Ok(Frame::data(Bytes::from_static(f.as_bytes()))))
            .collect();
        StreamBody::new(futures::stream::iter(frames)).boxed()
    }

    fn head_text(resp: Response<Body>, close: bool) -> (String, Option<(Body, Framing)>, bool) {
        let (head, body, close) = response_head(resp, close);
        (String::from_utf8(head.to_vec()).unwrap(), body, close)
    }

    #[test]
    fn heads_say_how_the_body_is_framed() {
        let (h, body, close) = head_text(
            Response::new(Full::new(Bytes::from("{}")).map_err(|e| match e {}).boxed()),
            false,
        );
        assert!(h.starts_with("HTTP/1.1 200 OK\r\n"), "{h}");
        assert!(h.contains("content-length: 2\r\n"), "{h}");
        assert!(h.contains("date: "), "{h}");
        assert!(h.ends_with("\r\n\r\n"), "{h}");
        assert!(!h.contains("transfer-encoding"), "{h}");
        assert_eq!(body.map(|b| b.1), Some(Framing::Length));
        assert!(!close);

        let mut resp = Response::new(streaming(&["a"]));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let (h, body, close) = head_text(resp, true);
        assert!(h.contains("content-type: application/json\r\n"), "{h}");
        assert!(h.contains("transfer-encoding: chunked\r\n"), "{h}");
        assert!(h.contains("connection: close\r\n"), "{h}");
        assert!(!h.contains("content-length"), "{h}");
        assert_eq!(body.map(|b| b.1), Some(Framing::Chunked));
        assert!(close);

        let mut resp = Response::new(streaming(&[]));
        *resp.status_mut() = StatusCode::NO_CONTENT;
        let (h, body, _) = head_text(resp, false);
        assert!(h.starts_with("HTTP/1.1 204 No Content\r\n"), "{h}");
        assert!(body.is_none());

        let mut resp = Response::new(streaming(&[]));
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        assert!(
            head_text(resp, false).2,
            "a response that says close closes"
        );
    }

    /// A socket that takes at most `step` bytes per write, and whose client has sent `input`
    /// then either ended its side or stays open.
    struct Socket {
        written: Vec<u8>,
        step: usize,
        input: Vec<u8>,
        ended: bool,
    }

    impl AsyncRead for Socket {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if self.input.is_empty() {
                return if self.ended {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                };
            }
            let n = self.input.len().min(buf.remaining());
            let part: Vec<u8> = self.input.drain(..n).collect();
            buf.put_slice(&part);
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Socket {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.step);
            self.written.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.step - n);
                self.written.extend_from_slice(&b[..take]);
                n += take;
                if n == self.step {
                    break;
                }
            }
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn send(
        out: &mut Out,
        io: &mut Socket,
        spare: &mut Vec<u8>,
    ) -> Poll<Result<Sent, std::io::Error>> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        out.poll_send(io, &mut cx, spare, 16)
    }

    #[test]
    fn a_streamed_body_is_written_as_chunks_whatever_the_socket_takes_per_write() {
        for step in [1, 3, 7, 1000] {
            let mut io = Socket {
                written: Vec::new(),
                step,
                input: Vec::new(),
                ended: false,
            };
            let mut out = Out::new(
                Bytes::from_static(b"HEAD\r\n\r\n"),
                Some((
                    streaming(&["hello", "", "big enough frame"]),
                    Framing::Chunked,
                )),
            );
            let mut spare = Vec::new();
            assert_eq!(
                send(&mut out, &mut io, &mut spare).map(|r| r.ok()),
                Poll::Ready(Some(Sent::Complete))
            );
            assert_eq!(
                String::from_utf8(io.written).unwrap(),
                "HEAD\r\n\r\n5\r\nhello\r\n10\r\nbig enough frame\r\n0\r\n\r\n",
                "step {step}"
            );
        }
        let mut io = Socket {
            written: Vec::new(),
            step: 5,
            input: Vec::new(),
            ended: false,
        };
        let mut out = Out::new(
            Bytes::from_static(b"H\r\n\r\n"),
            Some((streaming(&["ab", "cd"]), Framing::Length)),
        );
        assert!(send(&mut out, &mut io, &mut Vec::new()).is_ready());
        assert_eq!(io.written, b"H\r\n\r\nabcd");
    }

    #[test]
    fn what_the_client_sends_meanwhile_is_kept_up_to_the_limit_and_its_end_ends_the_response() {
        // A watch that has nothing to send: the client's pipelined bytes are kept (16 at
        // most), then the stream waits.
        let pending = StreamBody::new(futures::stream::pending::<
            Result<Frame<Bytes>, std::io::Error>,
        >())
        .boxed();
        let mut io = Socket {
            written: Vec::new(),
            step: 1000,
            input: b"GET /a HTTP/1.1\r\nHost: y\r\n".to_vec(),
            ended: true,
        };
        let mut out = Out::new(
            Bytes::from_static(b"H\r\n\r\n"),
            Some((pending, Framing::Chunked)),
        );
        let mut spare = Vec::new();
        assert!(send(&mut out, &mut io, &mut spare).is_pending());
        assert_eq!(spare, b"GET /a HTTP/1.1\r\nHost: y\r\n");
        assert_eq!(io.written, b"H\r\n\r\n");
        // Once there is room again, the client's end is seen.
        spare.clear();
        assert_eq!(
            send(&mut out, &mut io, &mut spare).map(|r| r.ok()),
            Poll::Ready(Some(Sent::Gone))
        );
        // A body that fails cuts the response short.
        let failing = StreamBody::new(futures::stream::iter(vec![Err::<Frame<Bytes>, _>(
            std::io::Error::other("x"),
        )]))
        .boxed();
        let mut out = Out::new(
            Bytes::from_static(b"H\r\n\r\n"),
            Some((failing, Framing::Chunked)),
        );
        let mut io = Socket {
            written: Vec::new(),
            step: 1000,
            input: Vec::new(),
            ended: false,
        };
        assert!(matches!(
            send(&mut out, &mut io, &mut Vec::new()),
            Poll::Ready(Err(_))
        ));
    }
}
