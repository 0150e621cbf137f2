//! The watch guarantees, checked the way etcd's robustness tests check them: a recorded history
//! (every stream of every watcher, every write with its outcome) is validated for ordered,
//! unique, atomic, bookmarkable, reliable and resumable delivery, and each failure names the
//! watcher, the stream, the property and the events at fault.
//!
//! Writes are identified by an id the writer puts on the object (an annotation), so an event
//! names the write it delivers; a DELETED event carries the last state instead, and is the
//! delete of its key (tests delete a key at most once and never reuse it). A write whose
//! answer was lost has an unknown outcome: it may or may not have been committed. Once any
//! watcher delivers it, its revision is known and every watcher covering that revision must
//! deliver it too; if none does, nothing is required (as etcd's robustness validation treats
//! failed requests).
//!
//! Streams are read as lines, so "atomic" is checked per stream (a revision's events all in
//! the stream that delivers any of them); a bookmark inside a revision breaks "bookmarkable".

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Create,
    Update,
    Delete,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ADDED" => Some(EventType::Added),
            "MODIFIED" => Some(EventType::Modified),
            "DELETED" => Some(EventType::Deleted),
            _ => None,
        }
    }

    fn of(op: Op) -> Self {
        match op {
            Op::Create => EventType::Added,
            Op::Update => EventType::Modified,
            Op::Delete => EventType::Deleted,
        }
    }
}

/// What the writer learnt of one write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged, with the revision the answer gave (None for deletes: the answer is the
    /// state before the delete).
    Acked(Option<i64>),
    /// No answer, an error answer or a timeout: committed or not, nobody knows.
    Unknown,
}

#[derive(Clone, Debug)]
pub struct Write {
    pub id: String,
    pub key: String,
    pub op: Op,
    /// The object's labels (labels never change in these tests, so a delete has the labels
    /// of its key).
    pub labels: BTreeMap<String, String>,
    pub outcome: Outcome,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Event {
        kind: EventType,
        key: String,
        rv: i64,
        /// The write id the object carries (for DELETED: that of the last state).
        write: Option<String>,
    },
    Bookmark(i64),
}

/// How a stream began.
#[derive(Clone, Debug)]
pub enum Start {
    /// A fresh start after a list at `rv` that returned `items` (key, resourceVersion).
    Relist { rv: i64, items: Vec<(String, i64)> },
    /// A fresh start from `rv` without a list.
    Watch(i64),
    /// A restart from the last revision seen, after the previous stream ended.
    Resume(i64),
}

/// How a stream ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// The server ended it (timeout, shutdown, lost connection).
    Closed,
    /// An `ERROR` event with code 410, or a 410 answer to the watch request.
    Gone,
    /// The test stopped reading.
    Stopped,
}

#[derive(Clone, Debug)]
pub struct Stream {
    pub start: Start,
    pub items: Vec<Item>,
    pub end: End,
}

#[derive(Clone, Debug)]
pub struct WatcherLog {
    pub name: String,
    /// An equality label selector (`key=value`), or every object.
    pub selector: Option<(String, String)>,
    pub streams: Vec<Stream>,
}

impl WatcherLog {
    pub fn new(name: impl Into<String>, selector: Option<(&str, &str)>) -> Self {
        WatcherLog {
            name: name.into(),
            selector: selector.map(|(k, v)| (k.to_string(), v.to_string())),
            streams: Vec::new(),
        }
    }

    fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector
            .as_ref()
            .is_none_or(|(k, v)| labels.get(k) == Some(v))
    }
}

/// A list taken outside any watcher: what it was, its revision, its items (name,
/// resourceVersion).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub what: String,
    pub rv: i64,
    pub items: Vec<(String, i64)>,
}

/// Everything recorded in one test.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub writes: Vec<Write>,
    pub watchers: Vec<WatcherLog>,
    /// Lists taken outside any watcher (e.g. the final contents).
    pub snapshots: Vec<Snapshot>,
    /// The revision of a write acknowledged after every other write: each watcher must have
    /// got that far, so everything acknowledged must have reached it.
    pub final_rv: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Property {
    Ordered,
    Unique,
    Atomic,
    Bookmarkable,
    Reliable,
    Resumable,
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Property::Ordered => "ordered",
            Property::Unique => "unique",
            Property::Atomic => "atomic",
            Property::Bookmarkable => "bookmarkable",
            Property::Reliable => "reliable",
            Property::Resumable => "resumable",
        };
        f.write_str(s)
    }
}

#[derive(Clone, Debug)]
pub struct Violation {
    pub property: Property,
    /// The watcher (or snapshot) name.
    pub watcher: String,
    /// The stream's index in the watcher's log, when one stream is at fault.
    pub stream: Option<usize>,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.stream {
            Some(i) => write!(
                f,
                "{}: watcher {} stream {i}: {}",
                self.property, self.watcher, self.detail
            ),
            None => write!(f, "{}: {}: {}", self.property, self.watcher, self.detail),
        }
    }
}

impl History {
    /// Every violation of the six properties, in the order found.
    pub fn validate(&self) -> Vec<Violation> {
        Checker::new(self).run()
    }

    /// Panics listing the violations, if any.
    pub fn assert_valid(&self) {
        let v = self.validate();
        if !v.is_empty() {
            let shown: Vec<String> = v.iter().take(30).map(ToString::to_string).collect();
            panic!(
                "{} watch guarantee violation(s):\n{}",
                v.len(),
                shown.join("\n")
            );
        }
    }

    /// What was recorded, for the test's report.
    pub fn counts(&self) -> Counts {
        let streams = || self.watchers.iter().flat_map(|w| &w.streams);
        let delivered: HashSet<&str> = streams()
            .flat_map(|s| &s.items)
            .filter_map(|i| match i {
                Item::Event { write, .. } => write.as_deref(),
                Item::Bookmark(_) => None,
            })
            .collect();
        let unknown = || self.writes.iter().filter(|w| w.outcome == Outcome::Unknown);
        Counts {
            streams: streams().count(),
            gone: streams().filter(|s| s.end == End::Gone).count(),
            events: streams()
                .flat_map(|s| &s.items)
                .filter(|i| matches!(i, Item::Event { .. }))
                .count(),
            unknown: unknown().count(),
            unknown_delivered: unknown()
                .filter(|w| delivered.contains(w.id.as_str()))
                .count(),
        }
    }
}

/// What a history holds: streams (those that ended with 410), events delivered, writes of
/// unknown outcome (those some watcher delivered, so committed; deletes are not counted
/// there: their events name the state before).
pub struct Counts {
    pub streams: usize,
    pub gone: usize,
    pub events: usize,
    pub unknown: usize,
    pub unknown_delivered: usize,
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} streams ({} ended 410), {} events; {} writes of unknown outcome, {} of them delivered",
            self.streams, self.gone, self.events, self.unknown, self.unknown_delivered
        )
    }
}

struct Checker<'a> {
    h: &'a History,
    by_id: HashMap<&'a str, usize>,
    delete_of: HashMap<&'a str, usize>,
    /// Each write's committed revision, where known (acknowledged or delivered).
    rev: HashMap<usize, i64>,
    /// Committed writes by revision.
    at: BTreeMap<i64, Vec<usize>>,
    out: Vec<Violation>,
}

/// What one epoch (a fresh start and its resumptions) of a watcher covered.
struct Epoch {
    start: i64,
    progress: i64,
    delivered: HashSet<(i64, String)>,
    /// (stream index, start, first event rv, progress at its end, resumed)
    streams: Vec<(usize, i64, Option<i64>, i64, bool)>,
}

impl<'a> Checker<'a> {
    fn new(h: &'a History) -> Self {
        let mut by_id = HashMap::new();
        let mut delete_of = HashMap::new();
        for (i, w) in h.writes.iter().enumerate() {
            by_id.insert(w.id.as_str(), i);
            if w.op == Op::Delete {
                delete_of.insert(w.key.as_str(), i);
            }
        }
        Checker {
            h,
            by_id,
            delete_of,
            rev: HashMap::new(),
            at: BTreeMap::new(),
            out: Vec::new(),
        }
    }

    fn fail(&mut self, p: Property, watcher: &str, stream: Option<usize>, detail: String) {
        self.out.push(Violation {
            property: p,
            watcher: watcher.to_string(),
            stream,
            detail,
        });
    }

    /// The write an event delivers, if it names one that matches it.
    fn write_of(&self, kind: EventType, key: &str, write: Option<&str>) -> Option<usize> {
        match kind {
            EventType::Deleted => self.delete_of.get(key).copied(),
            _ => write.and_then(|id| self.by_id.get(id).copied()),
        }
    }

    fn run(mut self) -> Vec<Violation> {
        self.learn_revisions();
        for w in &self.h.watchers {
            self.check_watcher(w);
        }
        for snap in &self.h.snapshots {
            self.check_snapshot(&snap.what, None, snap.rv, &snap.items, None);
        }
        self.out
    }

    /// Every write's revision: from its acknowledgement, else from the first watcher that
    /// delivered it; every event must be a write that was made, delivered as it was committed.
    fn learn_revisions(&mut self) {
        for (i, w) in self.h.writes.iter().enumerate() {
            if let Outcome::Acked(Some(rv)) = w.outcome {
                self.rev.insert(i, rv);
            }
        }
        let h = self.h;
        for wl in &h.watchers {
            for (si, s) in wl.streams.iter().enumerate() {
                for item in &s.items {
                    let Item::Event {
                        kind,
                        key,
                        rv,
                        write,
                    } = item
                    else {
                        continue;
                    };
                    let Some(wi) = self.write_of(*kind, key, write.as_deref()) else {
                        self.fail(
                            Property::Reliable,
                            &wl.name,
                            Some(si),
                            format!(
                                "{kind:?} {key}@{rv} (write {write:?}) delivers a change that was never written"
                            ),
                        );
                        continue;
                    };
                    let w = &h.writes[wi];
                    if w.key != *key || EventType::of(w.op) != *kind {
                        self.fail(
                            Property::Reliable,
                            &wl.name,
                            Some(si),
                            format!(
                                "{kind:?} {key}@{rv} delivers write {} which was a {:?} of {}",
                                w.id, w.op, w.key
                            ),
                        );
                        continue;
                    }
                    if *kind == EventType::Deleted
                        && let Some(last) = self.last_state_before(key, *rv)
                        && write.as_deref() != Some(last)
                    {
                        self.fail(
                            Property::Reliable,
                            &wl.name,
                            Some(si),
                            format!(
                                "DELETED {key}@{rv} carries the state of write {write:?}, not the last one ({last})"
                            ),
                        );
                    }
                    match self.rev.get(&wi) {
                        Some(known) if known != rv => {
                            let known = *known;
                            self.fail(
                                Property::Reliable,
                                &wl.name,
                                Some(si),
                                format!(
                                    "{kind:?} {key}@{rv} delivers write {} committed at {known}",
                                    w.id
                                ),
                            );
                        }
                        Some(_) => {}
                        None => {
                            self.rev.insert(wi, *rv);
                        }
                    }
                }
            }
        }
        for (wi, rv) in &self.rev {
            self.at.entry(*rv).or_default().push(*wi);
        }
    }

    /// The write that made `key`'s last state before revision `rv`, when every earlier write
    /// of the key is acknowledged with its revision (a delete's event carries that state).
    fn last_state_before(&self, key: &str, rv: i64) -> Option<&'a str> {
        let h = self.h;
        let mut last: Option<(i64, &'a str)> = None;
        for w in h
            .writes
            .iter()
            .filter(|w| w.key == key && w.op != Op::Delete)
        {
            let Outcome::Acked(Some(r)) = w.outcome else {
                return None;
            };
            if r < rv && last.is_none_or(|(l, _)| r > l) {
                last = Some((r, w.id.as_str()));
            }
        }
        last.map(|(_, id)| id)
    }

    fn check_watcher(&mut self, wl: &'a WatcherLog) {
        let mut epoch: Option<Epoch> = None;
        for (si, s) in wl.streams.iter().enumerate() {
            let (start, resumed) = match &s.start {
                Start::Relist { rv, items } => {
                    if let Some(e) = epoch.take() {
                        self.finish_epoch(wl, e, false);
                    }
                    self.check_snapshot(&wl.name, Some(si), *rv, items, Some(wl));
                    (*rv, false)
                }
                Start::Watch(rv) => {
                    if let Some(e) = epoch.take() {
                        self.finish_epoch(wl, e, false);
                    }
                    (*rv, false)
                }
                Start::Resume(rv) => {
                    match &epoch {
                        None => self.fail(
                            Property::Resumable,
                            &wl.name,
                            Some(si),
                            format!("resumed from {rv} without a stream before"),
                        ),
                        Some(e) if e.progress != *rv => {
                            let p = e.progress;
                            self.fail(
                                Property::Resumable,
                                &wl.name,
                                Some(si),
                                format!("resumed from {rv}, but the last revision seen was {p}"),
                            );
                        }
                        Some(_) => {}
                    }
                    (*rv, true)
                }
            };
            let e = epoch.get_or_insert_with(|| Epoch {
                start,
                progress: start,
                delivered: HashSet::new(),
                streams: Vec::new(),
            });
            let (first, progress) = self.check_stream(wl, si, s, start, resumed, e);
            e.progress = e.progress.max(progress);
            let end = e.progress;
            e.streams.push((si, start, first, end, resumed));
        }
        if let Some(e) = epoch {
            self.finish_epoch(wl, e, true);
        }
    }

    /// Checks one stream's order, uniqueness, atomicity and bookmarks; returns its first event
    /// revision and the last revision it reached.
    fn check_stream(
        &mut self,
        wl: &WatcherLog,
        si: usize,
        s: &Stream,
        start: i64,
        resumed: bool,
        e: &mut Epoch,
    ) -> (Option<i64>, i64) {
        let name = wl.name.as_str();
        let mut first = None;
        let mut last_event: Option<(i64, &str)> = None;
        let mut max_event = start;
        let mut bookmark: Option<i64> = None;
        let mut progress = start;
        let mut in_stream: BTreeMap<i64, HashSet<&str>> = BTreeMap::new();
        for item in &s.items {
            match item {
                Item::Bookmark(b) => {
                    if *b < max_event {
                        self.fail(
                            Property::Bookmarkable,
                            name,
                            Some(si),
                            format!("bookmark at {b} after an event at {max_event}"),
                        );
                    }
                    bookmark = Some(bookmark.map_or(*b, |x| x.max(*b)));
                    progress = progress.max(*b);
                }
                Item::Event { kind, key, rv, .. } => {
                    first.get_or_insert(*rv);
                    if *rv <= start {
                        if resumed {
                            self.fail(
                                Property::Resumable,
                                name,
                                Some(si),
                                format!(
                                    "{kind:?} {key}@{rv} delivered again after resuming from {start}"
                                ),
                            );
                        } else {
                            self.fail(
                                Property::Ordered,
                                name,
                                Some(si),
                                format!(
                                    "{kind:?} {key}@{rv} at or before the start revision {start}"
                                ),
                            );
                        }
                    } else if let Some((prev, prev_key)) = last_event
                        && *rv < prev
                    {
                        self.fail(
                            Property::Ordered,
                            name,
                            Some(si),
                            format!("{kind:?} {key}@{rv} after {prev_key}@{prev}"),
                        );
                    }
                    if let Some(b) = bookmark
                        && *rv <= b
                    {
                        self.fail(
                            Property::Bookmarkable,
                            name,
                            Some(si),
                            format!("{kind:?} {key}@{rv} after a bookmark at {b}"),
                        );
                    }
                    let fresh = e.delivered.insert((*rv, key.clone()));
                    // A repeat after resuming was reported as not resumable.
                    let repeated_after_resume = resumed && *rv <= start;
                    if !(fresh || repeated_after_resume) {
                        self.fail(
                            Property::Unique,
                            name,
                            Some(si),
                            format!("{kind:?} {key}@{rv} delivered twice"),
                        );
                    }
                    if let Some(wi) = self
                        .at
                        .get(rv)
                        .and_then(|ws| ws.iter().find(|wi| self.h.writes[**wi].key == *key))
                        && !wl.selects(&self.h.writes[*wi].labels)
                    {
                        self.fail(
                            Property::Reliable,
                            name,
                            Some(si),
                            format!("{kind:?} {key}@{rv} is not selected by the watch"),
                        );
                    }
                    in_stream.entry(*rv).or_default().insert(key);
                    last_event = Some((*rv, key));
                    max_event = max_event.max(*rv);
                    progress = progress.max(*rv);
                }
            }
        }
        // Atomic: a revision delivered in this stream is delivered whole in it.
        for (rv, keys) in &in_stream {
            let Some(writes) = self.at.get(rv) else {
                continue;
            };
            let missing: Vec<&str> = writes
                .iter()
                .map(|wi| &self.h.writes[*wi])
                .filter(|w| wl.selects(&w.labels) && !keys.contains(w.key.as_str()))
                .map(|w| w.key.as_str())
                .collect();
            if !missing.is_empty() {
                self.fail(
                    Property::Atomic,
                    name,
                    Some(si),
                    format!("revision {rv} delivered {keys:?} without {missing:?}"),
                );
            }
        }
        (first, progress)
    }

    fn rev_of(&self, w: &Write) -> Option<i64> {
        self.by_id
            .get(w.id.as_str())
            .and_then(|i| self.rev.get(i))
            .copied()
    }

    /// Reliable (and resumable): every committed change the watch selects after the epoch's
    /// start and up to where it got was delivered.
    fn finish_epoch(&mut self, wl: &WatcherLog, e: Epoch, last: bool) {
        let name = wl.name.as_str();
        let h = self.h;
        let mut missing = Vec::new();
        let covered = if e.progress > e.start {
            self.at.range(e.start + 1..=e.progress)
        } else {
            self.at.range(0..0)
        };
        for (rv, writes) in covered {
            for wi in writes {
                let w = &h.writes[*wi];
                // A revision delivered in part was reported as not atomic.
                let partly = e.delivered.iter().any(|(r, _)| r == rv);
                if wl.selects(&w.labels) && !partly && !e.delivered.contains(&(*rv, w.key.clone()))
                {
                    missing.push((*rv, w));
                }
            }
        }
        for (rv, w) in missing {
            let stream = e
                .streams
                .iter()
                .find(|(_, start, _, end, _)| *start < rv && rv <= *end);
            let what = format!("{:?} {}@{rv} (write {}) never delivered", w.op, w.key, w.id);
            match stream {
                Some((si, start, first, _, true)) if first.is_none_or(|f| rv < f) => self.fail(
                    Property::Resumable,
                    name,
                    Some(*si),
                    format!("{what}: a gap after resuming from {start}"),
                ),
                Some((si, ..)) => self.fail(Property::Reliable, name, Some(*si), what),
                None => self.fail(
                    Property::Resumable,
                    name,
                    None,
                    format!("{what}: no stream covered it"),
                ),
            }
        }
        if !last {
            return;
        }
        let Some(final_rv) = h.final_rv else {
            return;
        };
        if e.progress < final_rv {
            self.fail(
                Property::Reliable,
                name,
                None,
                format!(
                    "stopped at revision {} before the final write at {final_rv}",
                    e.progress
                ),
            );
            return;
        }
        // An acknowledged delete nobody delivered: its revision is unknown, but it came after
        // the key's other writes and before the final write.
        for (wi, w) in h.writes.iter().enumerate() {
            if w.op != Op::Delete
                || !matches!(w.outcome, Outcome::Acked(_))
                || self.rev.contains_key(&wi)
                || !wl.selects(&w.labels)
            {
                continue;
            }
            let after = h
                .writes
                .iter()
                .filter(|o| o.key == w.key && o.op != Op::Delete)
                .filter_map(|o| self.rev_of(o))
                .max();
            if after.is_some_and(|a| e.start < a) {
                self.fail(
                    Property::Reliable,
                    name,
                    None,
                    format!(
                        "acknowledged delete of {} (write {}) never delivered",
                        w.key, w.id
                    ),
                );
            }
        }
    }

    /// A list at `rv` holds exactly the state the committed writes make at `rv` (keys with a
    /// write of unknown revision are skipped: their state cannot be told).
    fn check_snapshot(
        &mut self,
        what: &str,
        stream: Option<usize>,
        rv: i64,
        items: &[(String, i64)],
        wl: Option<&WatcherLog>,
    ) {
        let h = self.h;
        let listed: HashMap<&str, i64> = items.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let mut keys: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, w) in h.writes.iter().enumerate() {
            keys.entry(w.key.as_str()).or_default().push(i);
        }
        let property = if wl.is_some() {
            Property::Resumable
        } else {
            Property::Reliable
        };
        for (key, writes) in keys {
            if writes.iter().any(|i| !self.rev.contains_key(i)) {
                continue;
            }
            if let Some(wl) = wl
                && !wl.selects(&h.writes[writes[0]].labels)
            {
                continue;
            }
            let last = writes
                .iter()
                .map(|i| (self.rev[i], h.writes[*i].op))
                .filter(|(r, _)| *r <= rv)
                .max_by_key(|(r, _)| *r);
            let want = match last {
                Some((r, Op::Create | Op::Update)) => Some(r),
                _ => None,
            };
            let got = listed.get(key).copied();
            if want != got {
                self.out.push(Violation {
                    property,
                    watcher: what.to_string(),
                    stream,
                    detail: format!(
                        "list at {rv}: {key} is {} but the writes make it {}",
                        got.map_or("absent".to_string(), |r| format!("at {r}")),
                        want.map_or("absent".to_string(), |r| format!("at {r}")),
                    ),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
