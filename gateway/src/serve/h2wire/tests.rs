//! The wire's flow control, read from the client's frames, and where framed bytes join h2's.
#![allow(clippy::arithmetic_side_effects, clippy::indexing_slicing)]

use super::*;
use std::sync::atomic::Ordering::SeqCst;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn window_update(stream: u32, inc: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, stream, &inc.to_be_bytes())
}

fn settings_initial(window: u32) -> Vec<u8> {
    let mut p = SETTINGS_INITIAL_WINDOW_SIZE.to_be_bytes().to_vec();
    p.extend_from_slice(&window.to_be_bytes());
    frame(SETTINGS, 0, 0, &p)
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Feeds `input` one byte at a time (the hardest split) and whole; both must agree.
fn feed_all(wire: &Wire, input: &[u8]) -> Vec<u8> {
    let mut inbound = Inbound::new(wire.clone());
    let mut out = Vec::new();
    for b in input {
        inbound.feed(std::slice::from_ref(b), &mut out);
    }
    out
}

fn open(wire: &Wire, id: u32) {
    let mut inbound = Inbound::new(wire.clone());
    let mut out = Vec::new();
    inbound.feed(PREFACE, &mut out);
    inbound.feed(&frame(HEADERS, END_HEADERS, id, &[0x82]), &mut out);
}

/// The wire's reader of a connection whose preface was already read.
fn past_preface(wire: &Wire) -> Inbound {
    let mut inbound = Inbound::new(wire.clone());
    inbound.preface = 0;
    inbound
}

fn head_written(wire: &Wire, id: u32) {
    Outbound::default().feed(&frame(HEADERS, END_HEADERS, id, &[0x88]), wire);
}

/// A wire whose client sent its preface, SETTINGS with an initial window of `window`, and a
/// request on each of `ids`, every response's HEADERS written; and its reader, to feed more.
fn heads_out(window: u32, ids: &[u32]) -> (Wire, Inbound) {
    let wire = Wire::default();
    let mut inbound = Inbound::new(wire.clone());
    let mut out = Vec::new();
    inbound.feed(PREFACE, &mut out);
    inbound.feed(&settings_initial(window), &mut out);
    for &id in ids {
        inbound.feed(&frame(HEADERS, END_HEADERS, id, &[0x82]), &mut out);
        head_written(&wire, id);
    }
    (wire, inbound)
}

#[test]
fn the_client_s_window_updates_are_the_wire_s_and_h2_sees_the_rest() {
    let wire = Wire::default();
    let mut input = PREFACE.to_vec();
    input.extend(settings_initial(1000));
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &[0x82, 0x84]));
    input.extend(window_update(0, 100_000));
    input.extend(window_update(1, 500));
    // A stream never opened, and an increment of 0: h2 must answer them.
    input.extend(window_update(7, 10));
    input.extend(window_update(1, 0));
    input.extend(frame(6, 0, 0, &[1; 8])); // PING
    let out = feed_all(&wire, &input);
    let mut expected = PREFACE.to_vec();
    expected.extend(settings_initial(1000));
    expected.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &[0x82, 0x84]));
    expected.extend(window_update(7, 10));
    expected.extend(window_update(1, 0));
    expected.extend(frame(6, 0, 0, &[1; 8]));
    assert_eq!(out, expected, "h2 sees every frame but the wire's updates");
    assert_eq!(wire.windows(1), (65_535 + 100_000, Some(1000 + 500)));
}

#[test]
fn a_new_initial_window_moves_every_open_stream_s() {
    let wire = Wire::default();
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS, 1, &[0x82]));
    input.extend(frame(HEADERS, END_HEADERS, 3, &[0x82]));
    input.extend(settings_initial(100));
    feed_all(&wire, &input);
    assert_eq!(wire.windows(1).1, Some(100));
    assert_eq!(wire.windows(3).1, Some(100));
    // Streams opened later start from the new value; lowering it can take a window below 0.
    let mut inbound = past_preface(&wire);
    let mut out = Vec::new();
    inbound.feed(&frame(HEADERS, END_HEADERS, 5, &[0x82]), &mut out);
    assert_eq!(wire.windows(5).1, Some(100));
    head_written(&wire, 1);
    let (_, waker) = counting_waker();
    let cx = Context::from_waker(&waker);
    assert_eq!(
        wire.poll_room(&cx, 1, 80, Limit::Round),
        Poll::Ready(Room::Bytes(80))
    );
    inbound.feed(&settings_initial(0), &mut out);
    assert_eq!(wire.windows(1).1, Some(-80));
    assert!(wire.poll_room(&cx, 1, 10, Limit::Round).is_pending());
}

#[test]
fn room_waits_for_the_head_then_for_the_smaller_window() {
    let wire = Wire::default();
    open(&wire, 1);
    let (woken, waker) = counting_waker();
    let cx = Context::from_waker(&waker);
    assert!(
        wire.poll_room(&cx, 1, 10, Limit::Round).is_pending(),
        "no DATA before the response's HEADERS"
    );
    head_written(&wire, 1);
    assert_eq!(woken.load(SeqCst), 1, "the HEADERS wake the writer");
    assert_eq!(
        wire.poll_room(&cx, 1, 100_000, Limit::Round),
        Poll::Ready(Room::Bytes(65_535))
    );
    assert!(wire.poll_room(&cx, 1, 1, Limit::Round).is_pending());
    // Room reserved and not used is given back, to the stream and the connection.
    let n = wire.frame(1, &[Bytes::from_static(&[7; 35])], 65_535, false);
    assert_eq!(n, 35);
    assert_eq!(wire.windows(1), (65_500, Some(65_500)));
}

#[test]
fn a_spent_connection_window_waits_for_the_client_s_update() {
    let (wire, mut inbound) = heads_out(1 << 20, &[1, 3]);
    let mut out = Vec::new();
    let (woken, waker) = counting_waker();
    let cx = Context::from_waker(&waker);
    let Poll::Ready(Room::Bytes(n)) = wire.poll_room(&cx, 1, 1 << 20, Limit::Round) else {
        panic!("room");
    };
    assert_eq!(n, 65_535, "the connection's window bounds every stream");
    wire.frame(1, &[Bytes::from(vec![0; n])], n, false);
    assert!(wire.poll_room(&cx, 3, 10, Limit::Round).is_pending());
    assert_eq!(woken.load(SeqCst), 0);
    inbound.feed(&window_update(0, 1000), &mut out);
    assert_eq!(
        woken.load(SeqCst),
        1,
        "the connection's update wakes the waiting writer"
    );
    assert_eq!(
        wire.poll_room(&cx, 3, 5000, Limit::Round),
        Poll::Ready(Room::Bytes(1000))
    );
}

#[test]
fn windows_past_the_maximum_are_flow_control_errors() {
    let wire = Wire::default();
    let mut inbound = Inbound::new(wire.clone());
    let mut out = Vec::new();
    inbound.feed(PREFACE, &mut out);
    inbound.feed(&frame(HEADERS, END_HEADERS, 1, &[0x82]), &mut out);
    inbound.feed(&window_update(1, 0x7fff_ffff), &mut out);
    let (_, waker) = counting_waker();
    let cx = Context::from_waker(&waker);
    assert_eq!(
        wire.poll_room(&cx, 1, 1, Limit::Round),
        Poll::Ready(Room::Reset(Reason::FLOW_CONTROL_ERROR)),
        "the stream is reset"
    );
    assert_eq!(wire.take_error(), None);
    inbound.feed(&window_update(0, 0x7fff_ffff), &mut out);
    assert_eq!(wire.take_error(), Some(Reason::FLOW_CONTROL_ERROR));
    assert_eq!(wire.take_error(), None, "once");
}

#[test]
fn a_stream_the_client_resets_is_gone_for_its_writer() {
    let wire = Wire::default();
    open(&wire, 1);
    open(&wire, 3);
    let (woken, waker) = counting_waker();
    let cx = Context::from_waker(&waker);
    let (mut one, mut three) = (Seen::default(), Seen::default());
    assert!(!wire.over(&cx, 1, &mut one));
    assert!(!wire.over(&cx, 3, &mut three));
    let mut inbound = past_preface(&wire);
    let mut out = Vec::new();
    inbound.feed(&frame(RST_STREAM, 0, 1, &8u32.to_be_bytes()), &mut out);
    assert_eq!(woken.load(SeqCst), 1, "the idle writer learns of the reset");
    assert!(wire.over(&cx, 1, &mut one));
    assert_eq!(wire.broken(1), None, "ended, not broken");
    assert!(
        !wire.over(&cx, 3, &mut three),
        "another stream's end is not this one's"
    );
    assert_eq!(
        wire.poll_room(&cx, 1, 1, Limit::Round),
        Poll::Ready(Room::Gone)
    );
    assert!(
        wire.over(&cx, 1, &mut Seen::default()),
        "a stream already gone is over at once"
    );
}

#[test]
fn a_stream_whose_window_overflows_is_over_and_broken_for_its_idle_writer() {
    let wire = Wire::default();
    open(&wire, 1);
    let (woken, waker) = counting_waker();
    let cx = Context::from_waker(&waker);
    let mut seen = Seen::default();
    assert!(!wire.over(&cx, 1, &mut seen));
    let mut inbound = past_preface(&wire);
    let mut out = Vec::new();
    inbound.feed(&window_update(1, 0x7fff_ffff), &mut out);
    assert!(out.is_empty(), "the wire answers it, not h2");
    assert_eq!(woken.load(SeqCst), 1);
    assert!(wire.over(&cx, 1, &mut seen));
    assert_eq!(wire.broken(1), Some(Reason::FLOW_CONTROL_ERROR));
    assert_eq!(
        wire.poll_room(&cx, 1, 1, Limit::Round),
        Poll::Ready(Room::Gone),
        "reset once, then gone"
    );
}

#[test]
fn a_stream_costs_the_wire_little() {
    // A connection of 1,000 watches keeps a table of 2,048 of these.
    assert!(
        std::mem::size_of::<Stream>() <= 24,
        "{}",
        std::mem::size_of::<Stream>()
    );
}

#[test]
fn payloads_are_framed_at_most_max_frame_bytes_a_frame() {
    let mut out = Vec::new();
    let parts = [Bytes::from(vec![1; 10_000]), Bytes::from(vec![2; 30_000])];
    frame_into(&mut out, 5, &parts, 40_000);
    let mut at = 0;
    let mut payload = Vec::new();
    let mut lens = Vec::new();
    while at < out.len() {
        let h = parse(out[at..at + HEADER_LEN].try_into().unwrap());
        assert_eq!((h.kind, h.flags, h.stream), (DATA, 0, 5));
        lens.push(h.len);
        payload.extend_from_slice(&out[at + HEADER_LEN..at + HEADER_LEN + h.len]);
        at += HEADER_LEN + h.len;
    }
    assert_eq!(lens, vec![MAX_FRAME, MAX_FRAME, 40_000 - 2 * MAX_FRAME]);
    let expected: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    assert_eq!(payload, expected);
}

#[test]
fn framed_bytes_go_in_between_h2_s_frames_and_never_inside_a_header_block() {
    let wire = Wire::default();
    open(&wire, 1);
    let mut outbound = Outbound::default();
    assert!(outbound.at_boundary());
    let headers = frame(HEADERS, 0, 3, &[0x88; 20]);
    outbound.feed(&headers[..4], &wire);
    assert!(!outbound.at_boundary(), "inside a frame header");
    assert_eq!(outbound.to_frame_end(), 5);
    outbound.feed(&headers[4..12], &wire);
    assert_eq!(outbound.to_frame_end(), 17, "the rest of the payload");
    outbound.feed(&headers[12..], &wire);
    assert!(
        !outbound.at_boundary(),
        "a header block goes on in CONTINUATION"
    );
    outbound.feed(&frame(CONTINUATION, END_HEADERS, 3, &[0x88; 4]), &wire);
    assert!(outbound.at_boundary());
    // The stream's END_STREAM ends it for its writer.
    head_written(&wire, 1);
    let (_, waker) = counting_waker();
    let cx = Context::from_waker(&waker);
    assert!(matches!(
        wire.poll_room(&cx, 1, 10, Limit::Round),
        Poll::Ready(Room::Bytes(10))
    ));
    outbound.feed(&frame(DATA, END_STREAM, 1, &[]), &wire);
    assert_eq!(
        wire.poll_room(&cx, 1, 10, Limit::Round),
        Poll::Ready(Room::Gone)
    );
}

#[test]
fn splicing_moves_what_was_framed_behind_what_h2_wrote() {
    let wire = Wire::default();
    open(&wire, 1);
    head_written(&wire, 1);
    let (_, waker) = counting_waker();
    let cx = Context::from_waker(&waker);
    let Poll::Ready(Room::Bytes(n)) = wire.poll_room(&cx, 1, 3, Limit::Round) else {
        panic!("room");
    };
    wire.frame(1, &[Bytes::from_static(b"abc")], n, false);
    let mut out = b"h2".to_vec();
    wire.splice(&mut out, &waker);
    let mut expected = b"h2".to_vec();
    expected.extend(frame(DATA, 0, 1, b"abc"));
    assert_eq!(out, expected);
    let mut again = Vec::new();
    wire.splice(&mut again, &waker);
    assert!(again.is_empty(), "spliced once");
}

#[test]
fn a_watch_yields_once_its_round_framed_a_write_s_worth() {
    let (wire, mut inbound) = heads_out(1 << 20, &[1]);
    inbound.feed(&window_update(0, 1 << 24), &mut Vec::new());
    let (_, waker) = counting_waker();
    let cx = Context::from_waker(&waker);
    wire.open_round();
    let Poll::Ready(Room::Bytes(n)) = wire.poll_room(&cx, 1, ROUND_BYTES, Limit::Round) else {
        panic!("room");
    };
    wire.frame(1, &[Bytes::from(vec![0; n])], n, false);
    assert_eq!(
        wire.poll_room(&cx, 1, 10, Limit::Round),
        Poll::Ready(Room::Yield),
        "the round is full"
    );
    assert!(
        matches!(
            wire.poll_room(&cx, 1, 10, Limit::Unwritten(usize::MAX)),
            Poll::Ready(Room::Bytes(10))
        ),
        "a response body does not count rounds"
    );
    wire.give_back(1, 10);
    // Nothing was spliced (h2 inside a frame): the next round still lets the watch frame.
    wire.open_round();
    assert!(matches!(
        wire.poll_room(&cx, 1, 10, Limit::Round),
        Poll::Ready(Room::Bytes(10))
    ));
}

#[test]
fn a_written_rounds_buffer_is_framed_into_again_on_its_thread() {
    // From a thread with nothing kept (tests may share one).
    while spare::take().capacity() > 0 {}
    let mut written = Vec::with_capacity(ROUND_BYTES);
    written.extend_from_slice(&[1; 100]);
    let at = written.as_ptr();
    spare::give(written);
    // The next round's frames go into it, emptied, without growing it.
    let mut out = Vec::new();
    frame_into(&mut out, 1, &[Bytes::from_static(b"event")], 5);
    assert_eq!(out.as_ptr(), at);
    assert_eq!(out.len(), HEADER_LEN + 5);
    assert_eq!(out.capacity(), ROUND_BYTES);
    // Bounded: KEEP buffers at most, none larger than MAX_KEPT, none without capacity.
    for _ in 0..spare::KEEP + 2 {
        spare::give(Vec::with_capacity(4096));
    }
    spare::give(Vec::with_capacity(spare::MAX_KEPT + 1));
    spare::give(Vec::new());
    let kept: Vec<_> = std::iter::from_fn(|| Some(spare::take()))
        .take_while(|b| b.capacity() > 0)
        .collect();
    assert_eq!(kept.len(), spare::KEEP);
    assert!(kept.iter().all(|b| b.capacity() == 4096 && b.is_empty()));
}

#[test]
fn streams_the_connection_s_window_cannot_take_wait_for_it_apart_from_their_own() {
    let wire = Wire::default();
    let mut inbound = Inbound::new(wire.clone());
    let mut out = Vec::new();
    inbound.feed(PREFACE, &mut out);
    for id in [1, 3, 5, 7, 9, 11] {
        inbound.feed(&frame(HEADERS, END_HEADERS, id, &[0x82]), &mut out);
        head_written(&wire, id);
    }
    // Every stream's window is 20,000 but stream 7's, 10,000: it is short on its own account.
    inbound.feed(&settings_initial(10_000), &mut out);
    for id in [1, 3, 5, 9, 11] {
        inbound.feed(&window_update(id, 10_000), &mut out);
    }
    let batch = [Bytes::from(vec![7; 16_000])];
    let mut each = Vec::new();
    wire.frame_each(&[7, 1, 3, 5, 9, 11], &batch, 16_000, &mut each);
    // The connection's 65,535 take four of 16,000; the fifth waits for the connection.
    assert_eq!(
        each,
        [
            Each::Short,
            Each::Framed,
            Each::Framed,
            Each::Framed,
            Each::Framed,
            Each::Conn
        ]
    );
    assert_eq!(wire.windows(1), (1_535, Some(4_000)));

    let (woken, waker) = counting_waker();
    let cx = Context::from_waker(&waker);
    assert!(!wire.wait_conn(&cx, 1_000), "1,000 fit: no wait");
    assert!(wire.wait_conn(&cx, 16_000));
    assert!(wire.wait_conn(&cx, 16_000), "filed once");
    // A stream's own update does not open the connection's window.
    inbound.feed(&window_update(3, 1), &mut out);
    assert_eq!(woken.load(SeqCst), 0);
    inbound.feed(&window_update(0, 20_000), &mut out);
    assert_eq!(
        woken.load(SeqCst),
        1,
        "the connection's update wakes it, once"
    );
    assert!(!wire.wait_conn(&cx, 16_000));
    wire.frame_each(&[11], &batch, 16_000, &mut each);
    assert_eq!(each, [Each::Framed]);

    // Room another writer reserved and gave back wakes it too.
    assert!(wire.wait_conn(&cx, 16_000));
    let Poll::Ready(Room::Bytes(n)) = wire.poll_room(&cx, 3, 10, Limit::Unwritten(usize::MAX))
    else {
        panic!("room");
    };
    wire.give_back(3, n);
    assert_eq!(woken.load(SeqCst), 2);
}

#[test]
fn a_payload_larger_than_the_window_is_sure_to_reach_is_framed_in_pieces() {
    let (wire, _) = heads_out(1 << 20, &[1, 3]);
    // The connection keeps h2's initial 65,535: after 50,000 on stream 1, 15,535 are left.
    let mut each = Vec::new();
    wire.frame_each(&[1], &[Bytes::from(vec![1; 50_000])], 50_000, &mut each);
    assert_eq!(each, [Each::Framed]);
    // A client holding what it read until half its window is read may never open the
    // window to 40,000 more: stream 3 is short, and takes the room there is piece by piece.
    wire.frame_each(&[3], &[Bytes::from(vec![3; 40_000])], 40_000, &mut each);
    assert_eq!(each, [Each::Short]);
    let (_, waker) = counting_waker();
    let cx = Context::from_waker(&waker);
    assert_eq!(
        wire.poll_room(&cx, 3, 40_000, Limit::Unwritten(usize::MAX)),
        Poll::Ready(Room::Bytes(15_535))
    );
    // One of at most 32 KiB waits for the window whole.
    wire.give_back(3, 15_535);
    let batch = [Bytes::from(vec![3; CONN_WAIT_MAX])];
    wire.frame_each(&[3], &batch, CONN_WAIT_MAX, &mut each);
    assert_eq!(each, [Each::Conn]);
}
