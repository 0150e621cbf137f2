//! The validator on hand-made histories: a clean one passes, and each property violated once
//! is reported, naming that property, the watcher and the stream.

use super::*;

fn labels(group: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("group".to_string(), group.to_string())])
}

fn write(id: &str, key: &str, op: Op, group: &str, outcome: Outcome) -> Write {
    Write {
        id: id.to_string(),
        key: key.to_string(),
        op,
        labels: labels(group),
        outcome,
    }
}

fn ev(kind: EventType, key: &str, rv: i64, write: &str) -> Item {
    Item::Event {
        kind,
        key: key.to_string(),
        rv,
        write: Some(write.to_string()),
    }
}

fn added(key: &str, rv: i64, write: &str) -> Item {
    ev(EventType::Added, key, rv, write)
}

fn stream(start: Start, items: Vec<Item>, end: End) -> Stream {
    Stream { start, items, end }
}

/// Writes a@11, b@12 (group y), a updated @13, c (unknown outcome, committed @14), a deleted
/// (acknowledged, revision unknown from the answer, delivered @15), final@16; d's create was
/// lost (unknown, never committed).
fn writes() -> Vec<Write> {
    vec![
        write("w1", "a", Op::Create, "x", Outcome::Acked(Some(11))),
        write("w2", "b", Op::Create, "y", Outcome::Acked(Some(12))),
        write("w3", "a", Op::Update, "x", Outcome::Acked(Some(13))),
        write("w4", "c", Op::Create, "x", Outcome::Unknown),
        write("w5", "a", Op::Delete, "x", Outcome::Acked(None)),
        write("w6", "d", Op::Create, "x", Outcome::Unknown),
        write("w7", "final", Op::Create, "x", Outcome::Acked(Some(16))),
    ]
}

/// The full stream from revision 10, cut after `cut` items and resumed.
fn good_items() -> Vec<Item> {
    vec![
        added("a", 11, "w1"),
        added("b", 12, "w2"),
        Item::Bookmark(12),
        ev(EventType::Modified, "a", 13, "w3"),
        added("c", 14, "w4"),
        ev(EventType::Deleted, "a", 15, "w3"),
        added("final", 16, "w7"),
        Item::Bookmark(16),
    ]
}

fn history(watchers: Vec<WatcherLog>) -> History {
    History {
        writes: writes(),
        watchers,
        snapshots: vec![Snapshot {
            what: "final list".to_string(),
            rv: 16,
            items: vec![
                ("b".to_string(), 12),
                ("c".to_string(), 14),
                ("final".to_string(), 16),
            ],
        }],
        final_rv: Some(16),
    }
}

fn watcher(streams: Vec<Stream>) -> WatcherLog {
    let mut w = WatcherLog::new("w-all", None);
    w.streams = streams;
    w
}

/// One watcher whose stream from 10 carries `items`.
fn one(items: Vec<Item>) -> History {
    history(vec![watcher(vec![stream(
        Start::Watch(10),
        items,
        End::Stopped,
    )])])
}

/// Asserts exactly the violations of `property` are found, at least one, naming the watcher.
fn expect(h: &History, property: Property) {
    let v = h.validate();
    assert!(!v.is_empty(), "no violation found, {property} expected");
    for x in &v {
        assert_eq!(x.property, property, "unexpected: {x} (all: {v:#?})");
        assert!(x.to_string().contains(&x.watcher), "{x}");
    }
}

#[test]
fn a_clean_history_passes_including_resumes_relists_and_selectors() {
    let items = good_items();
    let resumed = watcher(vec![
        stream(Start::Watch(10), items[..3].to_vec(), End::Closed),
        stream(Start::Resume(12), items[3..].to_vec(), End::Stopped),
    ]);
    // Gone after 12, relisted at 14 (a at 13, b, c), then the rest.
    let relisted = {
        let mut w = WatcherLog::new("w-relist", None);
        w.streams = vec![
            stream(Start::Watch(10), items[..2].to_vec(), End::Gone),
            stream(
                Start::Relist {
                    rv: 14,
                    items: vec![
                        ("a".to_string(), 13),
                        ("b".to_string(), 12),
                        ("c".to_string(), 14),
                    ],
                },
                items[5..].to_vec(),
                End::Stopped,
            ),
        ];
        w
    };
    let selected = {
        let mut w = WatcherLog::new("w-y", Some(("group", "y")));
        w.streams = vec![stream(
            Start::Watch(10),
            vec![added("b", 12, "w2"), Item::Bookmark(16)],
            End::Stopped,
        )];
        w
    };
    // Gone at once (no event), relisted at the end.
    let emptied = {
        let mut w = WatcherLog::new("w-empty", None);
        w.streams = vec![
            stream(Start::Watch(10), vec![], End::Gone),
            stream(
                Start::Relist {
                    rv: 16,
                    items: vec![
                        ("b".to_string(), 12),
                        ("c".to_string(), 14),
                        ("final".to_string(), 16),
                    ],
                },
                vec![Item::Bookmark(16)],
                End::Stopped,
            ),
        ];
        w
    };
    let h = history(vec![
        watcher(vec![stream(Start::Watch(10), items, End::Stopped)]),
        emptied,
        resumed,
        relisted,
        selected,
    ]);
    let v = h.validate();
    assert!(v.is_empty(), "{v:#?}");
    // An unknown-outcome write nobody delivered (d) is not required; c, delivered by one,
    // is required of all: a watcher without it fails.
    let mut items = good_items();
    items.remove(4);
    let h = history(vec![
        watcher(vec![stream(Start::Watch(10), good_items(), End::Stopped)]),
        watcher(vec![stream(Start::Watch(10), items.clone(), End::Stopped)]),
    ]);
    expect(&h, Property::Reliable);
    // Alone, that watcher is fine: nobody saw c committed.
    assert!(one(items).validate().is_empty());
}

#[test]
fn out_of_order_events_are_not_ordered() {
    let mut items = good_items();
    items.swap(3, 4); // c@14 before a@13
    expect(&one(items), Property::Ordered);
}

#[test]
fn an_event_delivered_twice_is_not_unique() {
    let mut items = good_items();
    items.insert(1, added("a", 11, "w1"));
    expect(&one(items), Property::Unique);
}

#[test]
fn a_revision_split_across_streams_is_not_atomic() {
    // Revision 12 wrote b and e together; the stream ended between them.
    let mut h = one(vec![]);
    h.writes
        .push(write("w8", "e", Op::Create, "y", Outcome::Acked(Some(12))));
    h.snapshots[0].items.push(("e".to_string(), 12));
    let mut items = good_items();
    items.insert(2, added("e", 12, "w8"));
    // Together: fine.
    h.watchers = vec![watcher(vec![stream(
        Start::Watch(10),
        items.clone(),
        End::Stopped,
    )])];
    assert!(h.validate().is_empty(), "{:#?}", h.validate());
    // Split by the end of a stream (the resume from 12 cannot get e back).
    h.watchers = vec![watcher(vec![
        stream(Start::Watch(10), items[..2].to_vec(), End::Closed),
        stream(Start::Resume(12), items[3..].to_vec(), End::Stopped),
    ])];
    expect(&h, Property::Atomic);
}

#[test]
fn a_bookmark_ahead_of_a_later_event_is_not_bookmarkable() {
    let mut items = good_items();
    items[2] = Item::Bookmark(13); // before a@13
    expect(&one(items), Property::Bookmarkable);
    let mut items = good_items();
    items[2] = Item::Bookmark(11); // after b@12
    expect(&one(items), Property::Bookmarkable);
}

#[test]
fn a_missed_acknowledged_write_is_not_reliable() {
    let mut items = good_items();
    items.remove(3); // a@13 acknowledged, never delivered
    expect(&one(items), Property::Reliable);
    // An acknowledged delete nobody delivered (its revision is unknown).
    let mut items = good_items();
    items.remove(5);
    expect(&one(items), Property::Reliable);
    // A watcher that stopped before the final write.
    let items = good_items()[..4].to_vec();
    expect(&one(items), Property::Reliable);
    // An event for something never written, and the final list disagreeing with the writes.
    let mut items = good_items();
    items.insert(7, added("zz", 16, "w99"));
    expect(&one(items), Property::Reliable);
    let mut h = one(good_items());
    h.snapshots[0].items.retain(|(k, _)| k != "b");
    expect(&h, Property::Reliable);
    // A DELETED event carrying an older state than the last one written.
    let mut items = good_items();
    items[5] = ev(EventType::Deleted, "a", 15, "w1");
    expect(&one(items), Property::Reliable);
}

#[test]
fn a_resume_with_a_gap_or_a_duplicate_is_not_resumable() {
    let items = good_items();
    // Resumed from 12, but the new stream skipped a@13.
    let h = history(vec![watcher(vec![
        stream(Start::Watch(10), items[..3].to_vec(), End::Closed),
        stream(Start::Resume(12), items[4..].to_vec(), End::Stopped),
    ])]);
    expect(&h, Property::Resumable);
    // Resumed from 12, and the new stream repeated b@12.
    let h = history(vec![watcher(vec![
        stream(Start::Watch(10), items[..3].to_vec(), End::Closed),
        stream(Start::Resume(12), items[1..].to_vec(), End::Stopped),
    ])]);
    expect(&h, Property::Resumable);
    // A relist whose list misses b.
    let h = history(vec![watcher(vec![
        stream(Start::Watch(10), items[..1].to_vec(), End::Gone),
        stream(
            Start::Relist {
                rv: 14,
                items: vec![("a".to_string(), 13), ("c".to_string(), 14)],
            },
            items[5..].to_vec(),
            End::Stopped,
        ),
    ])]);
    expect(&h, Property::Resumable);
}
