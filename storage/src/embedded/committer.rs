//! The single committer thread: group commit of every write, then publication to the feed.
//!
//! Writers never touch redb. They queue a request and await its answer. The committer drains
//! everything queued (up to `max_batch`), applies it in order inside ONE write transaction
//! with `Durability::Immediate`, commits (one fsync for the whole batch), and only then
//! publishes the batch to the live feed and answers each writer. A failed compare-and-swap
//! is an answer like any other and does not affect the rest of the batch; only a failing
//! commit fails every write of its batch, and then no revision of it is ever published.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use redb::{Durability, ReadableTable, Table, WriteTransaction};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::Shared;
use super::codec::{self, LogEntry, Record};
use super::compaction::Compactor;
use super::tables::{self, CURRENT, HISTORY, LOG, META, META_REVISION, backend, to_u64};
use crate::{Event, EventKind, KeyValue, Revision, StoreError};

pub(crate) type Batch = Arc<Vec<Event>>;

pub(crate) enum Op {
    Create {
        key: Bytes,
        value: Bytes,
    },
    Update {
        key: Bytes,
        value: Bytes,
        expected: Revision,
    },
    Delete {
        key: Bytes,
        expected: Option<Revision>,
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

impl Op {
    /// Approximate bytes the op adds to a transaction (bounds a batch's size).
    fn size(&self) -> usize {
        match self {
            Op::Create { key, value } | Op::Update { key, value, .. } => {
                2 * (key.len() + value.len())
            }
            Op::PutRaw { key, raw } => key.len() + raw.len(),
            Op::Delete { key, .. } => key.len(),
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
    shared: Arc<Shared>,
    feed: broadcast::Sender<Batch>,
    requests: mpsc::Receiver<Request>,
    shutdown: oneshot::Receiver<()>,
    revision: Revision,
    compactor: Compactor,
}

struct MarkClosed(Arc<Shared>);

impl Drop for MarkClosed {
    fn drop(&mut self) {
        self.0.published.closed.store(true, Ordering::Release);
    }
}

/// What the batch loop hands back: a per-request answer, or a failure of the whole batch.
type Outcome = Result<Reply, StoreError>;

impl Committer {
    pub(crate) fn new(
        shared: Arc<Shared>,
        feed: broadcast::Sender<Batch>,
        requests: mpsc::Receiver<Request>,
        shutdown: oneshot::Receiver<()>,
    ) -> Self {
        let revision = shared.published.revision.load(Ordering::Acquire);
        let compacted = shared.published.compacted.load(Ordering::Acquire);
        let compactor = Compactor::new(&shared.config, revision, compacted);
        Committer {
            shared,
            feed,
            requests,
            shutdown,
            revision,
            compactor,
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
            self.compactor.tick(self.revision);
            self.compactor
                .step(&self.shared.db, &self.shared.published.compacted);
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
                    bytes += request.op.size();
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
        if self.compactor.busy() {
            // Compaction proceeds a chunk at a time, between batches of writes.
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
        let wake = self
            .compactor
            .wake_interval()
            .unwrap_or(Duration::from_secs(3600));
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

    fn commit(&mut self, writes: Vec<Request>) {
        let mut events = Vec::new();
        let result = self.apply_batch(&writes, &mut events);
        match result {
            Ok((outcomes, revision)) => {
                self.revision = revision;
                let published = &self.shared.published;
                published.batches.fetch_add(1, Ordering::Relaxed);
                // Publish to the feed BEFORE the revision counter: a watcher that reads the
                // counter and then finds its queue empty knows it has seen everything up to it.
                if !events.is_empty() {
                    let _ = self.feed.send(Arc::new(events));
                }
                published.revision.store(revision, Ordering::Release);
                for (request, outcome) in writes.into_iter().zip(outcomes) {
                    let _ = request.reply.send(outcome);
                }
            }
            Err(err) => {
                tracing::error!(%err, writes = writes.len(), "storage commit failed");
                let detail = err.to_string();
                for request in writes {
                    let err = StoreError::Unavailable(format!("commit failed: {detail}"));
                    let _ = request.reply.send(Err(err));
                }
            }
        }
    }

    /// Applies every write of the batch in one transaction and commits it. Returns each
    /// request's outcome and the new revision; an `Err` means nothing was committed.
    fn apply_batch(
        &self,
        writes: &[Request],
        events: &mut Vec<Event>,
    ) -> Result<(Vec<Outcome>, Revision), StoreError> {
        let mut txn = self.shared.db.begin_write().map_err(backend)?;
        txn.set_durability(Durability::Immediate).map_err(backend)?;
        let mut outcomes = Vec::with_capacity(writes.len());
        let mut revision = self.revision;
        let mut dirty = false;
        {
            let mut t = WriteTables::open(&txn)?;
            for request in writes {
                let before = revision;
                let outcome = t.apply(&request.op, &mut revision, events)?;
                dirty |= revision != before || matches!(request.op, Op::PutRaw { .. });
                outcomes.push(outcome);
            }
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
        Ok((outcomes, revision))
    }
}

type BytesTable<'txn> = Table<'txn, &'static [u8], &'static [u8]>;

struct WriteTables<'txn> {
    current: BytesTable<'txn>,
    history: Table<'txn, (&'static [u8], u64), &'static [u8]>,
    log: Table<'txn, u64, &'static [u8]>,
    meta: Table<'txn, &'static str, &'static [u8]>,
}

/// The key's current record: `Ok(None)` if absent, `Ok(Some(Err))` if present but corrupt.
type CurrentLookup = Option<Result<KeyValue, StoreError>>;

impl<'txn> WriteTables<'txn> {
    fn open(txn: &'txn WriteTransaction) -> Result<Self, StoreError> {
        Ok(WriteTables {
            current: txn.open_table(CURRENT).map_err(backend)?,
            history: txn.open_table(HISTORY).map_err(backend)?,
            log: txn.open_table(LOG).map_err(backend)?,
            meta: txn.open_table(META).map_err(backend)?,
        })
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
            Op::Create { key, value } => {
                match self.lookup(key)? {
                    Some(Ok(current)) => {
                        return Ok(Err(StoreError::AlreadyExists {
                            current: Box::new(current),
                        }));
                    }
                    Some(Err(corrupt)) => return Ok(Err(corrupt)),
                    None => {}
                }
                *revision += 1;
                let kv = KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: *revision,
                    mod_revision: *revision,
                    version: 1,
                };
                self.write_put(&kv)?;
                events.push(Event {
                    kind: EventKind::Put,
                    kv: kv.clone(),
                    prev_kv: None,
                });
                Ok(Ok(Reply::Kv(kv)))
            }
            Op::Update {
                key,
                value,
                expected,
            } => {
                let current = match self.lookup(key)? {
                    None => return Ok(Err(StoreError::NotFound)),
                    Some(Err(corrupt)) => return Ok(Err(corrupt)),
                    Some(Ok(current)) => current,
                };
                if current.mod_revision != *expected {
                    return Ok(Err(StoreError::Conflict {
                        current: Box::new(current),
                    }));
                }
                *revision += 1;
                let kv = KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: current.create_revision,
                    mod_revision: *revision,
                    version: current.version + 1,
                };
                self.write_put(&kv)?;
                events.push(Event {
                    kind: EventKind::Put,
                    kv: kv.clone(),
                    prev_kv: Some(current),
                });
                Ok(Ok(Reply::Kv(kv)))
            }
            Op::Delete { key, expected } => {
                let prev = match (self.lookup(key)?, expected) {
                    (None, _) => return Ok(Err(StoreError::NotFound)),
                    (Some(Ok(current)), Some(expected)) if current.mod_revision != *expected => {
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
                *revision += 1;
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
            Op::PutRaw { key, raw } => {
                self.current.insert(&key[..], &raw[..]).map_err(backend)?;
                Ok(Ok(Reply::Done))
            }
            Op::Compact { .. } => Ok(Err(StoreError::Unavailable(
                "compaction is not a batched write".to_string(),
            ))),
        }
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
