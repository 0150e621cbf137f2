//! The single committer thread: group commit of every write, then publication to the feed.
//!
//! Writers never touch redb. They queue a request and await its answer. The committer drains
//! everything queued (up to `max_batch`), applies it in order inside ONE write transaction
//! with `Durability::Immediate`, commits (one fsync for the whole batch), and only then
//! publishes the batch to the live feed and answers each writer. A failed compare-and-swap
//! is an answer like any other and does not affect the rest of the batch; only a failing
//! commit fails every write of its batch, and then no revision of it is ever published.
//!
//! Expiry runs here too: writes with a time to live file their deadline in the `expiry`
//! table, the committer keeps the earliest deadline in memory (read from the table at start,
//! so deadlines survive a restart) and sleeps no longer than until it; when it passes, the due
//! entries become one batch of revisioned deletes through the same path as every other write,
//! so feeds see ordinary `Delete` events and history stays gap-free.
//!
//! A failing commit (a full disk, a failed fsync) answers every write of its batch with
//! `WriteFailed` and publishes nothing. redb latches the I/O error and refuses the file from
//! then on, reads included, so the committer closes it and opens it again at once: redb
//! repairs the file to its last durable commit and every checksum is verified before
//! anything is served again. If the reopened file holds the failed batch after all (the fsync
//! failed after the data reached the file), its revisions are adopted and watchers replay
//! them from the log; they were never acknowledged, which is what a failed write means. If it
//! is behind an acknowledged revision, writes stay refused: that is data loss, not a state to
//! build on. Until a commit succeeds again, `ready` reports the failure; every
//! `PROBE_INTERVAL` the committer tries a write of the failed batch's size (then removes it),
//! so the store recovers by itself once space returns, without waiting for a client write.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use redb::{Durability, ReadableTable, Table, WriteTransaction};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::EngineState;
use super::codec::{self, LogEntry, Record};
use super::compaction::Compactor;
use super::recovery;
use super::tables::{
    self, CURRENT, EXPIRY, HISTORY, LOG, META, META_REVISION, PROBE, backend, to_u64,
};
use crate::{Event, EventKind, KeyValue, Later, Revision, StoreError};

pub(crate) type Batch = Arc<Vec<Event>>;

pub(crate) enum Op {
    Create {
        key: Bytes,
        value: Bytes,
        ttl: Option<Duration>,
    },
    Update {
        key: Bytes,
        value: Bytes,
        expected: Revision,
        ttl: Option<Duration>,
    },
    Delete {
        key: Bytes,
        expected: Option<Revision>,
    },
    /// The `expiry` entry (`deadline`, `key`) is due: deletes the key if `written` is still
    /// its latest write, and drops the entry either way.
    Expire {
        deadline: u64,
        key: Bytes,
        written: Revision,
    },
    /// Stores `raw` verbatim as the key's current record (tests of corrupt-object handling).
    PutRaw {
        key: Bytes,
        raw: Bytes,
    },
    Compact {
        revision: Revision,
    },
}

/// Advances the revision counter: running out of revisions (2^63) fails the batch rather
/// than reusing one.
fn next_revision(revision: &mut Revision) -> Result<Revision, StoreError> {
    *revision = revision
        .checked_add(1)
        .ok_or_else(|| StoreError::WriteFailed("the revision counter is exhausted".to_string()))?;
    Ok(*revision)
}

impl Op {
    /// Approximate bytes the op adds to a transaction (bounds a batch's size).
    fn size(&self) -> usize {
        match self {
            Op::Create { key, value, .. } | Op::Update { key, value, .. } => {
                key.len().saturating_add(value.len()).saturating_mul(2)
            }
            Op::PutRaw { key, raw } => key.len().saturating_add(raw.len()),
            Op::Delete { key, .. } | Op::Expire { key, .. } => key.len(),
            Op::Compact { .. } => 0,
        }
    }
}

pub(crate) enum Reply {
    Kv(KeyValue),
    Deleted(KeyValue, Revision),
    Done,
}

pub(crate) type ReplyTx = oneshot::Sender<Result<Reply, StoreError>>;

pub(crate) struct Request {
    pub(crate) op: Op,
    pub(crate) reply: ReplyTx,
}

pub(crate) struct Committer {
    shared: Arc<EngineState>,
    feed: broadcast::Sender<Batch>,
    requests: mpsc::Receiver<Request>,
    shutdown: oneshot::Receiver<()>,
    revision: Revision,
    compactor: Compactor,
    /// The earliest deadline in the `expiry` table (None: no entry), in Unix milliseconds.
    next_expiry: Option<u64>,
    /// Set by a failed commit, cleared by the next successful one.
    failed: Option<Failed>,
}

/// What a failed commit left to do.
struct Failed {
    /// The data file must be closed and opened again before anything else uses it.
    reopen: bool,
    /// Bytes the probe writes: the failed batch's size, within `PROBE_BYTES`.
    probe_bytes: usize,
    next_probe: Instant,
    /// The reopened file is behind an acknowledged revision: never write again.
    lost: bool,
}

/// How often a failed store probes whether writes work again.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Bounds of the probe write.
const PROBE_BYTES: std::ops::RangeInclusive<usize> = 4096..=4 * 1024 * 1024;
/// How long a reopen waits for readers to let go of the old handle.
const REOPEN_WAIT: Duration = Duration::from_secs(5);

/// Wall-clock time in Unix milliseconds: deadlines must survive a restart, so they are not
/// `Instant`s.
pub(crate) fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Retry delay after expiry could not read or commit (the store is failing anyway).
const EXPIRY_RETRY_MS: u64 = 1000;

struct MarkClosed(Arc<EngineState>);

impl Drop for MarkClosed {
    fn drop(&mut self) {
        self.0.published.closed.store(true, Ordering::Release);
    }
}

/// What the batch loop hands back: a per-request answer, or a failure of the whole batch.
type Outcome = Result<Reply, StoreError>;

impl Committer {
    pub(crate) fn new(
        shared: Arc<EngineState>,
        feed: broadcast::Sender<Batch>,
        requests: mpsc::Receiver<Request>,
        shutdown: oneshot::Receiver<()>,
    ) -> Self {
        let revision = shared.published.revision.load(Ordering::Acquire);
        let compacted = shared.published.compacted.load(Ordering::Acquire);
        let compactor = Compactor::new(&shared.config, revision, compacted);
        let next_expiry = earliest_deadline(&shared).unwrap_or_else(|err| {
            tracing::error!(%err, "reading the expiry table failed; retrying");
            Some(unix_millis())
        });
        Committer {
            shared,
            feed,
            requests,
            shutdown,
            revision,
            compactor,
            next_expiry,
            failed: None,
        }
    }

    /// The thread body. Returns when the store is closed (or dropped) and the queue drained.
    pub(crate) fn run(mut self) {
        // Marks the store closed however this thread ends, panics included, so that
        // `health` reports it.
        let _closed = MarkClosed(self.shared.clone());
        // A tiny private runtime gives the committer timed waits on the async queue and on the
        // shutdown signal without depending on whatever runtime the callers use.
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(runtime) => runtime,
            Err(err) => {
                tracing::error!(%err, "storage committer cannot start; store is unavailable");
                return;
            }
        };
        while let Some(first) = self.next_request(&runtime) {
            let batch = self.fill_batch(first);
            self.process(batch);
            if self.failed.is_some() {
                // Nothing else writes until a probe or a client write gets through.
                self.probe_if_due();
                continue;
            }
            self.expire_due();
            self.compactor.tick(self.revision);
            if let Err(detail) = self
                .compactor
                .step(self.shared.db(), &self.shared.published.compacted)
            {
                self.fail(format!("compaction failed: {detail}"), 0);
            }
        }
        // Refuse new requests, then answer everything already queued.
        self.requests.close();
        while let Ok(first) = self.requests.try_recv() {
            let batch = self.fill_batch(Some(first));
            self.process(batch);
        }
    }

    /// Takes whatever else is queued behind `first`, up to the batch limits.
    fn fill_batch(&mut self, first: Option<Request>) -> Vec<Request> {
        let Some(first) = first else {
            return Vec::new();
        };
        let config = &self.shared.config;
        let mut bytes = first.op.size();
        let mut batch = vec![first];
        while batch.len() < config.max_batch && bytes < config.max_batch_bytes {
            match self.requests.try_recv() {
                Ok(request) => {
                    bytes = bytes.saturating_add(request.op.size());
                    batch.push(request);
                }
                Err(_) => break,
            }
        }
        batch
    }

    /// Waits for the next request. `None` = shut down; `Some(None)` = woke up with nothing
    /// (time to run background compaction).
    fn next_request(&mut self, runtime: &tokio::runtime::Runtime) -> Option<Option<Request>> {
        if self.compactor.busy() && self.failed.is_none() {
            // Compaction proceeds a chunk at a time, between batches of writes (not while
            // commits fail: then only the probe's timer wakes the committer).
            return match self.requests.try_recv() {
                Ok(request) => Some(Some(request)),
                Err(mpsc::error::TryRecvError::Empty) => {
                    if self.shutdown_requested() {
                        None
                    } else {
                        Some(None)
                    }
                }
                Err(mpsc::error::TryRecvError::Disconnected) => None,
            };
        }
        let mut wake = self
            .compactor
            .wake_interval()
            .unwrap_or(Duration::from_secs(3600));
        if let Some(failed) = &self.failed {
            wake = wake.min(failed.next_probe.saturating_duration_since(Instant::now()));
        }
        if let Some(deadline) = self.next_expiry {
            wake = wake.min(Duration::from_millis(
                deadline.saturating_sub(unix_millis()),
            ));
        }
        let requests = &mut self.requests;
        let shutdown = &mut self.shutdown;
        runtime.block_on(async {
            tokio::select! {
                biased;
                _ = shutdown => None,
                next = tokio::time::timeout(wake, requests.recv()) => match next {
                    Ok(Some(request)) => Some(Some(request)),
                    Ok(None) => None,
                    Err(_) => Some(None),
                },
            }
        })
    }

    fn shutdown_requested(&mut self) -> bool {
        !matches!(
            self.shutdown.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        )
    }

    fn process(&mut self, batch: Vec<Request>) {
        let mut writes = Vec::with_capacity(batch.len());
        for request in batch {
            match request.op {
                Op::Compact { revision } => {
                    if revision > self.revision {
                        let err = StoreError::FutureRevision {
                            requested: revision,
                            current: self.revision,
                        };
                        let _ = request.reply.send(Err(err));
                    } else {
                        self.compactor.request(revision, Some(request.reply));
                    }
                }
                _ => writes.push(request),
            }
        }
        if !writes.is_empty() {
            self.commit(writes);
        }
    }

    /// Commits `writes` as one transaction; false if the commit failed.
    fn commit(&mut self, writes: Vec<Request>) -> bool {
        if let Err(detail) = self.writable() {
            for request in writes {
                let _ = request
                    .reply
                    .send(Err(StoreError::WriteFailed(detail.clone())));
            }
            return false;
        }
        let mut events = Vec::new();
        let result = self.apply_batch(&writes, &mut events);
        match result {
            Ok((outcomes, revision, new_deadline)) => {
                self.revision = revision;
                if let Some(deadline) = new_deadline {
                    self.next_expiry = Some(self.next_expiry.map_or(deadline, |d| d.min(deadline)));
                }
                let published = &self.shared.published;
                published.batches.fetch_add(1, Ordering::Relaxed);
                // Publish to the feed BEFORE the revision counter: a watcher that reads the
                // counter and then finds its queue empty knows it has seen everything up to it.
                if !events.is_empty() {
                    let _ = self.feed.send(Arc::new(events));
                }
                published.revision.store(revision, Ordering::Release);
                // Before the answers, so a caller told "done" finds the store ready.
                self.recovered();
                for (request, outcome) in writes.into_iter().zip(outcomes) {
                    let _ = request.reply.send(outcome);
                }
                true
            }
            Err(err) => {
                tracing::error!(%err, writes = writes.len(), "storage commit failed");
                let detail = format!("commit failed, nothing of it was acknowledged: {err}");
                // Record the failure before anyone hears of it, so that `ready` already
                // reports it to a caller who just got the error; reopen after answering.
                let bytes = writes.iter().map(|w| w.op.size()).sum();
                self.record_failure(detail.clone(), bytes);
                for request in writes {
                    let _ = request
                        .reply
                        .send(Err(StoreError::WriteFailed(detail.clone())));
                }
                self.reopen_after_failure();
                false
            }
        }
    }

    /// Records a failed transaction and reopens the data file at once, so reads go on.
    fn fail(&mut self, detail: String, bytes: usize) {
        self.record_failure(detail, bytes);
        self.reopen_after_failure();
    }

    fn reopen_after_failure(&mut self) {
        if let Err(err) = self.reopen() {
            tracing::error!(%err, "reopening the data file failed; retrying");
        }
    }

    fn record_failure(&mut self, detail: String, bytes: usize) {
        *self.shared.published.write_failure.lock() = Some(detail);
        let lost = self.failed.as_ref().is_some_and(|f| f.lost);
        self.failed = Some(Failed {
            reopen: true,
            probe_bytes: bytes.clamp(*PROBE_BYTES.start(), *PROBE_BYTES.end()),
            next_probe: Instant::now().later(PROBE_INTERVAL),
            lost,
        });
    }

    fn recovered(&mut self) {
        if self.failed.take().is_some() {
            *self.shared.published.write_failure.lock() = None;
            tracing::info!("storage writes work again");
        }
    }

    /// `Err` (the reason) while writes must be refused; reopens the file if still needed.
    fn writable(&mut self) -> Result<(), String> {
        let Some(failed) = &self.failed else {
            return Ok(());
        };
        if failed.lost {
            return Err(self.failure_detail());
        }
        if failed.reopen {
            self.reopen()
                .map_err(|err| format!("the data file cannot be reopened: {err}"))?;
        }
        Ok(())
    }

    fn failure_detail(&self) -> String {
        self.shared
            .published
            .write_failure
            .lock()
            .clone()
            .unwrap_or_else(|| "a previous commit failed".to_string())
    }

    /// Closes the data file and opens it again, verified. Readers wait on the handle's lock
    /// meanwhile; those already holding a read transaction of the old file get an error.
    fn reopen(&mut self) -> Result<(), StoreError> {
        let shared = self.shared.clone();
        let mut slot = shared.db.write();
        if let Some(old) = slot.take() {
            // Readers clone the handle only for the time it takes to begin a transaction.
            let deadline = Instant::now().later(REOPEN_WAIT);
            while Arc::strong_count(&old) > 1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            match Arc::try_unwrap(old) {
                Ok(db) => {
                    if let Err(err) = db.close() {
                        tracing::warn!(%err, "closing the failed data file");
                    }
                }
                Err(_) => tracing::warn!("a reader still holds the failed data file"),
            }
        }
        let (db, revision, compacted) =
            recovery::reopen(&shared.dir, &shared.config, &shared.faults)?;
        *slot = Some(Arc::new(db));
        drop(slot);
        let failed = self.failed.as_mut();
        if let Some(failed) = failed {
            failed.reopen = false;
        }
        if revision < self.revision {
            tracing::error!(
                revision,
                acknowledged = self.revision,
                "the reopened data file lost acknowledged writes; refusing writes"
            );
            if let Some(failed) = self.failed.as_mut() {
                failed.lost = true;
            }
            *shared.published.write_failure.lock() = Some(format!(
                "the data file is at revision {revision} after reopening, behind the \
                 acknowledged revision {}: refusing writes (restart to recover)",
                self.revision
            ));
            return Ok(());
        }
        if revision > self.revision {
            // The failed batch reached the file after all. Watchers see a gap and replay it.
            tracing::warn!(
                revision,
                was = self.revision,
                "the failed commit is in the data file after all; adopting its revisions"
            );
            self.revision = revision;
            shared.published.revision.store(revision, Ordering::Release);
        }
        let published = shared.published.compacted.load(Ordering::Acquire);
        if compacted > published {
            shared
                .published
                .compacted
                .store(compacted, Ordering::Release);
        }
        self.next_expiry = earliest_deadline(&shared).unwrap_or(Some(unix_millis()));
        tracing::info!(revision, "data file reopened and verified");
        Ok(())
    }

    /// While failed: once per `PROBE_INTERVAL`, a durable write of the failed batch's size
    /// (removed again), so `ready` turns good once writes of that size work.
    fn probe_if_due(&mut self) {
        let Some(failed) = &self.failed else {
            return;
        };
        if failed.lost || Instant::now() < failed.next_probe {
            return;
        }
        let bytes = failed.probe_bytes;
        let result = self
            .writable()
            .map_err(StoreError::WriteFailed)
            .and_then(|()| self.probe(bytes));
        match result {
            Ok(()) => self.recovered(),
            Err(err) => {
                tracing::debug!(%err, "storage write probe failed");
                let reopen = !matches!(err, StoreError::WriteFailed(_));
                if let Some(failed) = self.failed.as_mut() {
                    failed.next_probe = Instant::now().later(PROBE_INTERVAL);
                    failed.reopen |= reopen;
                }
                if reopen && let Err(err) = self.reopen() {
                    tracing::error!(%err, "reopening the data file failed; retrying");
                }
            }
        }
    }

    fn probe(&self, bytes: usize) -> Result<(), StoreError> {
        let db = self.shared.db()?;
        let filler = vec![0u8; bytes];
        for insert in [true, false] {
            let mut txn = db.begin_write().map_err(backend)?;
            txn.set_durability(Durability::Immediate).map_err(backend)?;
            {
                let mut probe = txn.open_table(PROBE).map_err(backend)?;
                if insert {
                    probe.insert(0u8, filler.as_slice()).map_err(backend)?;
                } else {
                    probe.remove(0u8).map_err(backend)?;
                }
            }
            txn.commit().map_err(backend)?;
        }
        Ok(())
    }

    /// Deletes the keys whose deadline has passed (at most `max_batch` per call; the committer
    /// comes back at once while more are due, so writes still run in between).
    fn expire_due(&mut self) {
        let now = unix_millis();
        if self.next_expiry.is_none_or(|deadline| deadline > now) {
            return;
        }
        let limit = self.shared.config.max_batch;
        let due = match due_entries(&self.shared, now, limit) {
            Ok(due) => due,
            Err(err) => {
                tracing::error!(%err, "reading due expiry entries failed; retrying");
                self.next_expiry = Some(now.saturating_add(EXPIRY_RETRY_MS));
                return;
            }
        };
        let writes: Vec<Request> = due
            .into_iter()
            .map(|(deadline, key, written)| Request {
                op: Op::Expire {
                    deadline,
                    key,
                    written,
                },
                // Nobody waits for the answer.
                reply: oneshot::channel().0,
            })
            .collect();
        if !writes.is_empty() && !self.commit(writes) {
            self.next_expiry = Some(now.saturating_add(EXPIRY_RETRY_MS));
            return;
        }
        self.next_expiry = earliest_deadline(&self.shared).unwrap_or_else(|err| {
            tracing::error!(%err, "reading the expiry table failed; retrying");
            Some(now.saturating_add(EXPIRY_RETRY_MS))
        });
    }

    /// Applies every write of the batch in one transaction and commits it. Returns each
    /// request's outcome, the new revision and the earliest deadline the batch filed; an `Err`
    /// means nothing was committed.
    fn apply_batch(
        &self,
        writes: &[Request],
        events: &mut Vec<Event>,
    ) -> Result<(Vec<Outcome>, Revision, Option<u64>), StoreError> {
        let db = self.shared.db()?;
        let mut txn = db.begin_write().map_err(backend)?;
        txn.set_durability(Durability::Immediate).map_err(backend)?;
        let mut outcomes = Vec::with_capacity(writes.len());
        let mut revision = self.revision;
        let mut dirty = false;
        let earliest;
        {
            let mut t = WriteTables::open(&txn, unix_millis())?;
            for request in writes {
                let before = revision;
                let outcome = t.apply(&request.op, &mut revision, events)?;
                dirty |= revision != before
                    || matches!(request.op, Op::PutRaw { .. } | Op::Expire { .. });
                outcomes.push(outcome);
            }
            earliest = t.earliest_new_deadline;
            if revision != self.revision {
                t.meta
                    .insert(
                        META_REVISION,
                        codec::encode_meta(META_REVISION, revision).as_slice(),
                    )
                    .map_err(backend)?;
            }
        }
        if dirty {
            txn.commit().map_err(backend)?;
        } else {
            // Every request failed its precondition: nothing to make durable, skip the fsync.
            txn.abort().map_err(backend)?;
        }
        Ok((outcomes, revision, earliest))
    }
}

/// The earliest deadline in the `expiry` table.
fn earliest_deadline(shared: &EngineState) -> Result<Option<u64>, StoreError> {
    use redb::ReadableDatabase;
    let txn = shared.db()?.begin_read().map_err(backend)?;
    let expiry = txn.open_table(EXPIRY).map_err(backend)?;
    Ok(expiry.first().map_err(backend)?.map(|(k, _)| k.value().0))
}

/// Up to `limit` `expiry` entries with deadline <= `now`: (deadline, key, revision written).
/// An entry that fails its checksum is returned with revision 0, which no write has: it is
/// dropped without deleting anything.
fn due_entries(
    shared: &EngineState,
    now: u64,
    limit: usize,
) -> Result<Vec<(u64, Bytes, Revision)>, StoreError> {
    use redb::ReadableDatabase;
    let txn = shared.db()?.begin_read().map_err(backend)?;
    let expiry = txn.open_table(EXPIRY).map_err(backend)?;
    let empty: &[u8] = &[];
    let mut due = Vec::new();
    for entry in expiry
        .range((0u64, empty)..(now.saturating_add(1), empty))
        .map_err(backend)?
        .take(limit.max(1))
    {
        let (k, v) = entry.map_err(backend)?;
        let (deadline, key) = k.value();
        let written = codec::decode_expiry(v.value(), deadline, key).unwrap_or_else(|err| {
            tracing::warn!(%err, "dropping a corrupt expiry entry");
            0
        });
        due.push((deadline, Bytes::copy_from_slice(key), written));
    }
    Ok(due)
}

type BytesTable<'txn> = Table<'txn, &'static [u8], &'static [u8]>;

struct WriteTables<'txn> {
    current: BytesTable<'txn>,
    history: Table<'txn, (&'static [u8], u64), &'static [u8]>,
    log: Table<'txn, u64, &'static [u8]>,
    meta: Table<'txn, &'static str, &'static [u8]>,
    expiry: Table<'txn, (u64, &'static [u8]), &'static [u8]>,
    /// The batch's clock (Unix milliseconds): deadlines count from it.
    now: u64,
    /// The earliest deadline this batch filed.
    earliest_new_deadline: Option<u64>,
}

/// The key's current record: `Ok(None)` if absent, `Ok(Some(Err))` if present but corrupt.
type CurrentLookup = Option<Result<KeyValue, StoreError>>;

impl<'txn> WriteTables<'txn> {
    fn open(txn: &'txn WriteTransaction, now: u64) -> Result<Self, StoreError> {
        Ok(WriteTables {
            current: txn.open_table(CURRENT).map_err(backend)?,
            history: txn.open_table(HISTORY).map_err(backend)?,
            log: txn.open_table(LOG).map_err(backend)?,
            meta: txn.open_table(META).map_err(backend)?,
            expiry: txn.open_table(EXPIRY).map_err(backend)?,
            now,
            earliest_new_deadline: None,
        })
    }

    /// Files `key`'s deadline, `ttl` from now, for the write at `written`.
    fn set_expiry(
        &mut self,
        key: &[u8],
        written: Revision,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let ttl_ms = u64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        let deadline = self.now.saturating_add(ttl_ms);
        let value = codec::encode_expiry(deadline, key, written);
        self.expiry
            .insert((deadline, key), value.as_slice())
            .map_err(backend)?;
        self.earliest_new_deadline = Some(
            self.earliest_new_deadline
                .map_or(deadline, |d| d.min(deadline)),
        );
        Ok(())
    }

    fn lookup(&self, key: &[u8]) -> Result<CurrentLookup, StoreError> {
        let Some(raw) = self.current.get(key).map_err(backend)? else {
            return Ok(None);
        };
        Ok(match tables::decode_current(raw.value(), key) {
            Ok(record) => record.into_kv(key).map(Ok),
            Err(err) => Some(Err(err)),
        })
    }

    /// Applies one write. The outer `Err` is a storage failure that aborts the whole batch;
    /// the inner result is this request's own answer (e.g. `Conflict`).
    fn apply(
        &mut self,
        op: &Op,
        revision: &mut Revision,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, StoreError> {
        match op {
            Op::Create { key, value, ttl } => self.create(key, value, *ttl, revision, events),
            Op::Update {
                key,
                value,
                expected,
                ttl,
            } => self.update(key, value, *expected, *ttl, revision, events),
            Op::Delete { key, expected } => self.delete(key, *expected, revision, events),
            Op::Expire {
                deadline,
                key,
                written,
            } => self.expire(*deadline, key, *written, revision, events),
            Op::PutRaw { key, raw } => {
                self.current.insert(&key[..], &raw[..]).map_err(backend)?;
                Ok(Ok(Reply::Done))
            }
            Op::Compact { .. } => Ok(Err(StoreError::Unavailable(
                "compaction is not a batched write".to_string(),
            ))),
        }
    }

    /// Creates `key`, which must not exist.
    fn create(
        &mut self,
        key: &Bytes,
        value: &Bytes,
        ttl: Option<Duration>,
        revision: &mut Revision,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, StoreError> {
        match self.lookup(key)? {
            Some(Ok(current)) => {
                return Ok(Err(StoreError::AlreadyExists {
                    current: Box::new(current),
                }));
            }
            Some(Err(corrupt)) => return Ok(Err(corrupt)),
            None => {}
        }
        next_revision(revision)?;
        let kv = KeyValue {
            key: key.clone(),
            value: value.clone(),
            create_revision: *revision,
            mod_revision: *revision,
            version: 1,
        };
        self.put(kv, ttl, None, events)
    }

    /// Replaces `key`'s value if its latest write is still `expected`.
    fn update(
        &mut self,
        key: &Bytes,
        value: &Bytes,
        expected: Revision,
        ttl: Option<Duration>,
        revision: &mut Revision,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, StoreError> {
        let current = match self.lookup(key)? {
            None => return Ok(Err(StoreError::NotFound)),
            Some(Err(corrupt)) => return Ok(Err(corrupt)),
            Some(Ok(current)) => current,
        };
        if current.mod_revision != expected {
            return Ok(Err(StoreError::Conflict {
                current: Box::new(current),
            }));
        }
        next_revision(revision)?;
        let kv = KeyValue {
            key: key.clone(),
            value: value.clone(),
            create_revision: current.create_revision,
            mod_revision: *revision,
            version: current.version.saturating_add(1),
        };
        self.put(kv, ttl, Some(current), events)
    }

    /// Writes `kv` (already at its new revision), files its deadline and records the event.
    fn put(
        &mut self,
        kv: KeyValue,
        ttl: Option<Duration>,
        prev_kv: Option<KeyValue>,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, StoreError> {
        self.write_put(&kv)?;
        if let Some(ttl) = ttl {
            self.set_expiry(&kv.key, kv.mod_revision, ttl)?;
        }
        events.push(Event {
            kind: EventKind::Put,
            kv: kv.clone(),
            prev_kv,
        });
        Ok(Ok(Reply::Kv(kv)))
    }

    /// Deletes `key`, if its latest write is still `expected` when one is given.
    fn delete(
        &mut self,
        key: &Bytes,
        expected: Option<Revision>,
        revision: &mut Revision,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, StoreError> {
        let prev = match (self.lookup(key)?, expected) {
            (None, _) => return Ok(Err(StoreError::NotFound)),
            (Some(Ok(current)), Some(expected)) if current.mod_revision != expected => {
                return Ok(Err(StoreError::Conflict {
                    current: Box::new(current),
                }));
            }
            (Some(Ok(current)), _) => Some(current),
            // A conditional delete cannot be checked against an unreadable record.
            (Some(Err(corrupt)), Some(_)) => return Ok(Err(corrupt)),
            // Unconditional delete of an unreadable record: the force-delete path.
            // The previous value is then the newest intact history record, as a
            // replay of this delete would report it.
            (Some(Err(corrupt)), None) => {
                tracing::warn!(%corrupt, "force-deleting a corrupt record");
                tables::latest_at(&self.history, key, u64::MAX)
                    .ok()
                    .flatten()
                    .and_then(|(_, record)| record.into_kv(key))
            }
        };
        next_revision(revision)?;
        self.write_delete(key, *revision)?;
        let tombstone = tables::tombstone_kv(key, *revision);
        events.push(Event {
            kind: EventKind::Delete,
            kv: tombstone,
            prev_kv: prev.clone(),
        });
        // A corrupt record has no readable previous value: report the bare key.
        let deleted = prev.unwrap_or_else(|| tables::tombstone_kv(key, 0));
        Ok(Ok(Reply::Deleted(deleted, *revision)))
    }

    /// A due deadline: drops the `expiry` entry and deletes `key` if `written` is still its
    /// latest write.
    fn expire(
        &mut self,
        deadline: u64,
        key: &Bytes,
        written: Revision,
        revision: &mut Revision,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, StoreError> {
        self.expiry.remove((deadline, &key[..])).map_err(backend)?;
        // Rewritten or deleted since the deadline was filed: the entry is stale. An
        // unreadable record is left to the force-delete path.
        let current = match self.lookup(key)? {
            Some(Ok(current)) if current.mod_revision == written => current,
            _ => return Ok(Ok(Reply::Done)),
        };
        next_revision(revision)?;
        self.write_delete(key, *revision)?;
        events.push(Event {
            kind: EventKind::Delete,
            kv: tables::tombstone_kv(key, *revision),
            prev_kv: Some(current.clone()),
        });
        Ok(Ok(Reply::Deleted(current, *revision)))
    }

    fn write_put(&mut self, kv: &KeyValue) -> Result<(), StoreError> {
        let rev = to_u64(kv.mod_revision);
        let record = Record::from_kv(kv);
        let key: &[u8] = &kv.key;
        let current = codec::encode_record(key, &record);
        let history = codec::encode_record(&codec::history_crc_key(key, rev), &record);
        let log = codec::encode_log(
            rev,
            &LogEntry {
                deleted: false,
                key: kv.key.clone(),
            },
        );
        self.current
            .insert(key, current.as_slice())
            .map_err(backend)?;
        self.history
            .insert((key, rev), history.as_slice())
            .map_err(backend)?;
        self.log.insert(rev, log.as_slice()).map_err(backend)?;
        Ok(())
    }

    fn write_delete(&mut self, key: &Bytes, revision: Revision) -> Result<(), StoreError> {
        let rev = to_u64(revision);
        let record = Record::Tombstone {
            mod_revision: revision,
        };
        let history = codec::encode_record(&codec::history_crc_key(key, rev), &record);
        let log = codec::encode_log(
            rev,
            &LogEntry {
                deleted: true,
                key: key.clone(),
            },
        );
        self.current.remove(&key[..]).map_err(backend)?;
        self.history
            .insert((&key[..], rev), history.as_slice())
            .map_err(backend)?;
        self.log.insert(rev, log.as_slice()).map_err(backend)?;
        Ok(())
    }
}
