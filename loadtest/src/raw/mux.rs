//! raw-mux: the raw baseline with many logical streams over few TCP connections, framed as
//! simply as raw's, so a raw row can stand beside every h2 row (50,000 watchers over 500
//! connections, up to a million streams under an open-file limit of 20,000).
//!
//! A multiplexed reader's first bytes are `M` and the number of logical streams it carries
//! (u32 LE); the server answers `K` once it is subscribed. For every event batch the server
//! then writes, for each stream of the connection in turn, a chunk: an 8-byte header (stream
//! id u32 LE, payload length u32 LE) and that stream's copy of the batch's frames, the way an
//! h2 server writes a DATA frame header and a stream's events for every stream it wakes. The
//! chunks of all streams are coalesced into socket writes of 64 KiB (one syscall per 64 KiB,
//! not per stream). The reader demultiplexes the chunks back into per-stream byte streams
//! ([`Demux`], [`DemuxStream`]), each counted like any watcher.
//!
//! Slow connections: as for raw readers, the server stops reading the writer while the
//! slowest connection is more than 64 batches behind, so a slow connection slows every
//! stream down to its pace (the run reports the write rate it achieved) instead of losing
//! frames; a connection that still falls 256 batches behind skips them, and its streams count
//! the gap.

use std::ops::Range;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::broadcast;

use super::MAX_WRITE;
use crate::watch::Item;

/// A chunk's header: stream id (u32 LE) and payload length (u32 LE).
pub const HEADER: usize = 8;
/// Most logical streams one connection may carry.
pub const MAX_STREAMS: u32 = 1 << 20;

/// One event batch written to every stream of a connection: per stream a header and the
/// stream's copy of the batch, cut into writes of at most `MAX_WRITE` bytes.
pub struct Fanout<'a> {
    /// The batch, as the broadcast pieces it was gathered from.
    pieces: &'a [Bytes],
    len: u32,
    streams: u32,
    /// The stream being written, and where in its chunk: piece 0 is the header, piece `i`
    /// is `pieces[i - 1]`; `off` bytes of it are written.
    stream: u32,
    piece: usize,
    off: usize,
}

impl<'a> Fanout<'a> {
    pub fn new(pieces: &'a [Bytes], streams: u32) -> Self {
        let len = pieces.iter().map(Bytes::len).sum::<usize>();
        Fanout {
            pieces,
            len: u32::try_from(len).unwrap_or(u32::MAX),
            streams,
            stream: 0,
            piece: 0,
            off: 0,
        }
    }

    /// Appends the next bytes to `out` until it holds `MAX_WRITE` bytes or every stream's
    /// chunk is in; true while bytes remain after that.
    pub fn fill(&mut self, out: &mut BytesMut) -> bool {
        while self.stream < self.streams {
            let room = MAX_WRITE.saturating_sub(out.len());
            if room == 0 {
                return true;
            }
            let header;
            let bytes: &[u8] = match self.piece.checked_sub(1) {
                None => {
                    header = chunk_header(self.stream, self.len);
                    &header
                }
                Some(i) => self.pieces.get(i).map_or(&[], |b| b),
            };
            let rest = bytes.get(self.off..).unwrap_or_default();
            let take = room.min(rest.len());
            out.extend_from_slice(&rest[..take]);
            self.off += take;
            if self.off == bytes.len() {
                self.off = 0;
                self.piece += 1;
                if self.piece > self.pieces.len() {
                    self.piece = 0;
                    self.stream += 1;
                }
            }
        }
        false
    }
}

fn chunk_header(stream: u32, len: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&stream.to_le_bytes());
    h[4..].copy_from_slice(&len.to_le_bytes());
    h
}

/// Serves a multiplexed reader connection of `streams` logical streams: every batch (with
/// the batches already waiting behind it, up to 64 KiB) goes to each stream as one chunk.
pub async fn serve<W: AsyncWrite + Unpin>(
    mut sock: W,
    mut rx: broadcast::Receiver<Bytes>,
    streams: u32,
) {
    let mut out = BytesMut::with_capacity(MAX_WRITE);
    let mut pieces: Vec<Bytes> = Vec::new();
    loop {
        let first = match rx.recv().await {
            Ok(b) => b,
            // A lagging connection loses frames: every stream's receiver counts the gap.
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let mut len = first.len();
        pieces.clear();
        pieces.push(first);
        while len < MAX_WRITE {
            match rx.try_recv() {
                Ok(b) => {
                    len += b.len();
                    pieces.push(b);
                }
                Err(_) => break,
            }
        }
        let mut batch = Fanout::new(&pieces, streams);
        loop {
            let more = batch.fill(&mut out);
            if !out.is_empty() {
                if sock.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
            }
            if !more {
                break;
            }
        }
    }
}

/// Splits a connection's bytes back into its streams' payloads.
#[derive(Debug)]
pub struct Demux {
    streams: u32,
    /// The stream whose chunk is being read, and how many of its payload bytes are to come.
    cur: u32,
    left: usize,
}

impl Demux {
    pub fn new(streams: u32) -> Self {
        Demux {
            streams,
            cur: 0,
            left: 0,
        }
    }

    /// The next piece of payload in `buf` with its stream id (a chunk cut by a read comes in
    /// several pieces); `None` until more bytes arrive; an error for a stream id the
    /// connection does not carry.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<(u32, Bytes)>, String> {
        while self.left == 0 {
            if buf.len() < HEADER {
                return Ok(None);
            }
            let id = buf.get_u32_le();
            let len = buf.get_u32_le();
            if id >= self.streams {
                return Err(format!(
                    "raw-mux: a chunk for stream {id} on a connection of {} streams",
                    self.streams
                ));
            }
            self.cur = id;
            self.left = len as usize;
        }
        if buf.is_empty() {
            return Ok(None);
        }
        let n = self.left.min(buf.len());
        self.left -= n;
        Ok(Some((self.cur, buf.split_to(n).freeze())))
    }
}

/// A multiplexed connection as a receiver group's stream: each payload piece tagged with
/// `base` + its stream id; when the connection ends (or breaks), an `End` for every stream.
pub struct DemuxStream<R> {
    sock: Option<R>,
    buf: BytesMut,
    demux: Demux,
    base: usize,
    ending: Range<usize>,
}

impl<R: AsyncRead + Unpin> DemuxStream<R> {
    pub fn new(sock: R, base: usize, streams: u32) -> Self {
        DemuxStream {
            sock: Some(sock),
            buf: BytesMut::with_capacity(MAX_WRITE),
            demux: Demux::new(streams),
            base,
            ending: base..base + streams as usize,
        }
    }
}

impl<R: AsyncRead + Unpin> Stream for DemuxStream<R> {
    type Item = (usize, Item);

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let Some(sock) = this.sock.as_mut() else {
                return Poll::Ready(this.ending.next().map(|i| (i, Item::End)));
            };
            match this.demux.next(&mut this.buf) {
                Ok(Some((id, b))) => {
                    return Poll::Ready(Some((this.base + id as usize, Item::Data(b))));
                }
                Ok(None) => {}
                Err(e) => {
                    this.sock = None;
                    return Poll::Ready(Some((this.base, Item::Err(e))));
                }
            }
            if this.buf.capacity() - this.buf.len() < MAX_WRITE / 4 {
                this.buf.reserve(MAX_WRITE);
            }
            match ready!(tokio_util::io::poll_read_buf(
                Pin::new(sock),
                cx,
                &mut this.buf
            )) {
                Ok(0) => this.sock = None,
                Ok(_) => {}
                Err(e) => {
                    this.sock = None;
                    return Poll::Ready(Some((this.base, Item::Err(e.to_string()))));
                }
            }
        }
    }
}

/// How many of `watchers` streams spread round-robin over `connections` connections the
/// connection `c` carries (as h2 streams are spread by `--h2-connections`).
pub fn streams_on(watchers: usize, connections: usize, c: usize) -> usize {
    watchers.saturating_sub(c).div_ceil(connections.max(1))
}

#[cfg(test)]
mod tests;
