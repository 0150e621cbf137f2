//! raw-mux's framing: every logical stream of a connection gets every frame of every batch,
//! in order, whatever the cuts between socket writes and reads; writes are 64 KiB at most.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;

use super::*;
use crate::watch::Item;

/// `n` frames of `size` bytes from `seq` on: seq (u64 LE), a timestamp, padding.
fn frames(seq: u64, n: u64, size: usize) -> Bytes {
    let mut b = BytesMut::new();
    for s in seq..seq + n {
        b.put_u64_le(s);
        b.put_u64_le(7);
        b.put_bytes(b'x', size - 16);
    }
    b.freeze()
}

/// A batch's writes for `streams` streams, as `serve` makes them.
fn writes(pieces: &[Bytes], streams: u32) -> Vec<Vec<u8>> {
    let mut batch = Fanout::new(pieces, streams);
    let mut out = BytesMut::with_capacity(MAX_WRITE);
    let mut w = Vec::new();
    loop {
        let more = batch.fill(&mut out);
        if !out.is_empty() {
            w.push(out.to_vec());
            out.clear();
        }
        if !more {
            return w;
        }
    }
}

/// Feeds `wire` to a `Demux` in reads of the sizes `cuts` cycles through; every stream's
/// bytes, in the order they came.
fn demux(wire: &[u8], streams: u32, cuts: &[usize]) -> BTreeMap<u32, Vec<u8>> {
    let mut d = Demux::new(streams);
    let mut buf = BytesMut::new();
    let mut got: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut at = 0;
    for &cut in cuts.iter().cycle() {
        if at == wire.len() {
            break;
        }
        let end = (at + cut).min(wire.len());
        buf.extend_from_slice(&wire[at..end]);
        at = end;
        while let Some((id, b)) = d.next(&mut buf).unwrap() {
            assert!(!b.is_empty());
            got.entry(id).or_default().extend_from_slice(&b);
        }
    }
    assert!(buf.is_empty(), "{} bytes left over", buf.len());
    got
}

/// The sequence numbers of a stream's fixed-size frames.
fn seqs(bytes: &[u8], size: usize) -> Vec<u64> {
    assert!(bytes.len().is_multiple_of(size));
    bytes
        .chunks(size)
        .map(|f| u64::from_le_bytes(f[..8].try_into().unwrap()))
        .collect()
}

#[test]
fn every_stream_gets_every_frame_in_order() {
    let size = 400;
    let streams = 300;
    // One batch of one frame, one of several pieces (batches gathered behind the first),
    // and one larger than a write.
    let batches = [
        vec![frames(0, 1, size)],
        vec![frames(1, 3, size), frames(4, 1, size), frames(5, 2, size)],
        vec![frames(7, 200, size)],
    ];
    let mut wire = Vec::new();
    for pieces in &batches {
        let w = writes(pieces, streams);
        // Full 64 KiB writes but for the last: no write per stream.
        let (last, full) = w.split_last().unwrap();
        assert!(full.iter().all(|w| w.len() == MAX_WRITE));
        assert!(!last.is_empty() && last.len() <= MAX_WRITE);
        let len: usize = pieces.iter().map(Bytes::len).sum();
        assert_eq!(
            w.iter().map(Vec::len).sum::<usize>(),
            streams as usize * (HEADER + len)
        );
        wire.extend(w.concat());
    }
    let want: Vec<u64> = (0..207).collect();
    for cuts in [
        &[MAX_WRITE][..],
        &[1],
        &[7, 4096, 3, 401, 65_537],
        &[8, 400],
    ] {
        let got = demux(&wire, streams, cuts);
        assert_eq!(got.len(), streams as usize, "cuts {cuts:?}");
        for (id, bytes) in &got {
            assert_eq!(seqs(bytes, size), want, "stream {id}, cuts {cuts:?}");
        }
    }
}

#[test]
fn a_chunk_is_a_header_then_the_streams_copy() {
    let batch = [Bytes::from_static(b"abc"), Bytes::from_static(b"de")];
    let w = writes(&batch, 2).concat();
    assert_eq!(
        w,
        [
            &0u32.to_le_bytes()[..],
            &5u32.to_le_bytes(),
            b"abcde",
            &1u32.to_le_bytes(),
            &5u32.to_le_bytes(),
            b"abcde",
        ]
        .concat()
    );
}

#[test]
fn demux_skips_empty_chunks_and_refuses_a_stream_it_does_not_carry() {
    let mut d = Demux::new(2);
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    buf.extend_from_slice(&[0, 0, 0, 0, 2, 0, 0, 0]);
    buf.extend_from_slice(b"hi");
    assert_eq!(
        d.next(&mut buf).unwrap(),
        Some((0, Bytes::from_static(b"hi")))
    );
    assert_eq!(d.next(&mut buf).unwrap(), None);
    buf.extend_from_slice(&[2, 0, 0, 0, 1, 0, 0, 0, b'x']);
    assert!(d.next(&mut buf).unwrap_err().contains("stream 2"));
}

#[test]
fn streams_spread_round_robin() {
    let on = |w, c| (0..c).map(|i| streams_on(w, c, i)).collect::<Vec<_>>();
    assert_eq!(on(10, 3), [4, 3, 3]);
    assert_eq!(on(2, 4), [1, 1, 0, 0]);
    assert_eq!(on(50_000, 500).iter().sum::<usize>(), 50_000);
    assert!(on(50_000, 500).iter().all(|n| *n == 100));
}

/// The server's connection task and the client's stream over an in-memory pipe: batches
/// sent while the reader is slower than the writer still reach every stream, in order, and
/// the end of the connection ends every stream.
#[tokio::test]
async fn serve_and_demux_stream_deliver_every_frame_to_every_stream() {
    let (tx, rx) = tokio::sync::broadcast::channel::<Bytes>(256);
    let (server, client) = tokio::io::duplex(4096);
    let streams = 5u32;
    let task = tokio::spawn(serve(server, rx, streams));
    let size = 32;
    let mut seq = 0;
    for n in [1u64, 2, 60, 1, 3000] {
        tx.send(frames(seq, n, size)).unwrap();
        seq += n;
    }
    drop(tx);
    let mut s = DemuxStream::new(client, 10, streams);
    let mut got: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
    let mut ended = Vec::new();
    while let Some((idx, item)) = s.next().await {
        match item {
            Item::Data(b) => got.entry(idx).or_default().extend_from_slice(&b),
            Item::End => ended.push(idx),
            Item::Err(e) => panic!("{e}"),
        }
    }
    task.await.unwrap();
    let want: Vec<u64> = (0..seq).collect();
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        (10..15).collect::<Vec<_>>()
    );
    for (idx, bytes) in &got {
        assert_eq!(seqs(bytes, size), want, "stream {idx}");
    }
    assert_eq!(ended, (10..15).collect::<Vec<_>>());
}
