//! Compaction: explicit `compact(rev)` requests and the background retention policy.
//!
//! Compaction runs on the committer thread, a chunk of revisions per write transaction, so a
//! large compaction never stalls writers for long: batches of writes run between chunks.
//! After each chunk `compacted` moves up to the chunk's end, and the tables stay consistent
//! with it: every key's state as of `compacted` survives, everything older is gone.
//!
//! The background policy ([`AutoCompaction`]) is checked every `compaction_check_interval`.
//! With `Retention(d)` the committer samples (time, revision) pairs as it commits and
//! compacts up to the newest revision that was already current `d` ago; history that was
//! written before a restart is therefore compacted `d` after the restart.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use redb::{Database, Durability, ReadableTable};

use super::codec;
use super::committer::{Reply, ReplyTx};
use super::tables::{HISTORY, LOG, META, META_COMPACTED, backend, to_u64};
use super::{AutoCompaction, EmbeddedConfig};
use crate::{Revision, StoreError};

/// Bound on the (time, revision) samples kept for the retention policy.
const MAX_SAMPLES: usize = 1024;

struct Pending {
    target: Revision,
    waiters: Vec<ReplyTx>,
}

pub(crate) struct Compactor {
    policy: AutoCompaction,
    check_interval: Duration,
    chunk: i64,
    compacted: Revision,
    pending: Option<Pending>,
    samples: VecDeque<(Instant, Revision)>,
    sample_every: Duration,
    last_check: Instant,
}

impl Compactor {
    pub(crate) fn new(config: &EmbeddedConfig, revision: Revision, compacted: Revision) -> Self {
        let now = Instant::now();
        let sample_every = match config.auto_compaction {
            AutoCompaction::Retention(retention) => retention.checked_div(256).unwrap_or_default(),
            _ => Duration::ZERO,
        };
        Compactor {
            policy: config.auto_compaction,
            check_interval: config
                .compaction_check_interval
                .max(Duration::from_millis(1)),
            chunk: i64::try_from(config.compaction_chunk.max(1)).unwrap_or(i64::MAX),
            compacted,
            pending: None,
            samples: VecDeque::from([(now, revision)]),
            sample_every,
            last_check: now,
        }
    }

    /// True while a compaction is in progress (the committer then polls instead of sleeping).
    pub(crate) fn busy(&self) -> bool {
        self.pending.is_some()
    }

    /// How long the committer may sleep before the policy needs another look.
    pub(crate) fn wake_interval(&self) -> Option<Duration> {
        match self.policy {
            AutoCompaction::Disabled => None,
            _ => Some(self.check_interval),
        }
    }

    /// Queues a compaction up to `revision` (already checked to be <= the current revision).
    pub(crate) fn request(&mut self, revision: Revision, reply: Option<ReplyTx>) {
        let covered = self.pending.as_ref().map_or(self.compacted, |p| p.target);
        if revision <= self.compacted {
            // Already compacted at least this far: nothing to do.
            if let Some(reply) = reply {
                let _ = reply.send(Ok(Reply::Done));
            }
            return;
        }
        let pending = self.pending.get_or_insert_with(|| Pending {
            target: covered,
            waiters: Vec::new(),
        });
        pending.target = pending.target.max(revision);
        pending.waiters.extend(reply);
    }

    /// Records the revision reached and, when due, applies the background policy.
    pub(crate) fn tick(&mut self, revision: Revision) {
        let now = Instant::now();
        if let AutoCompaction::Retention(_) = self.policy {
            let newer = self.samples.back().is_none_or(|&(at, rev)| {
                rev != revision && now.duration_since(at) >= self.sample_every
            });
            if newer && self.samples.len() < MAX_SAMPLES {
                self.samples.push_back((now, revision));
            }
        }
        if now.duration_since(self.last_check) < self.check_interval {
            return;
        }
        self.last_check = now;
        let target = match self.policy {
            AutoCompaction::Disabled => return,
            AutoCompaction::Revisions(keep) => {
                revision.saturating_sub(i64::try_from(keep).unwrap_or(i64::MAX))
            }
            AutoCompaction::Retention(retention) => {
                let Some(cutoff) = now.checked_sub(retention) else {
                    return;
                };
                let mut target = self.compacted;
                while let Some(&(at, rev)) = self.samples.front() {
                    if at > cutoff {
                        break;
                    }
                    target = rev;
                    self.samples.pop_front();
                }
                target
            }
        };
        if target > self.compacted && self.pending.is_none() {
            tracing::debug!(target, "background compaction");
            self.request(target, None);
        }
    }

    /// Runs one chunk of the pending compaction, publishing the new compaction point (before
    /// answering anyone waiting for it). An `Err` is a failed transaction, whose text names
    /// the cause; the committer then reopens the data file as after any failed commit.
    pub(crate) fn step(
        &mut self,
        db: Result<Arc<Database>, StoreError>,
        published: &AtomicI64,
    ) -> Result<(), String> {
        let Some(target) = self.pending.as_ref().map(|p| p.target) else {
            return Ok(());
        };
        let low = self.compacted;
        let high = target.min(low.saturating_add(self.chunk));
        match db.and_then(|db| compact_chunk(&db, low, high)) {
            Ok(()) => {
                self.compacted = high;
                published.store(high, Ordering::Release);
                if high >= target {
                    for waiter in self.pending.take().map(|p| p.waiters).unwrap_or_default() {
                        let _ = waiter.send(Ok(Reply::Done));
                    }
                }
                Ok(())
            }
            Err(err) => {
                tracing::error!(%err, low, high, "compaction failed");
                let detail = err.to_string();
                for waiter in self.pending.take().map(|p| p.waiters).unwrap_or_default() {
                    let err = StoreError::Unavailable(format!("compaction failed: {detail}"));
                    let _ = waiter.send(Err(err));
                }
                Err(detail)
            }
        }
    }
}

/// Compacts `[low, high)` in one transaction and moves `compacted` to `high`.
///
/// For every logged write at a revision r <= high, the key's older versions are superseded
/// by it (as of `high`), so they go; a delete at r <= high also takes its tombstone, since
/// "absent" needs no record. The log keeps `high` itself so the log's last entry is always
/// the current revision.
fn compact_chunk(db: &Database, low: Revision, high: Revision) -> Result<(), StoreError> {
    let mut txn = db.begin_write().map_err(backend)?;
    txn.set_durability(Durability::Immediate).map_err(backend)?;
    {
        let mut log = txn.open_table(LOG).map_err(backend)?;
        let mut history = txn.open_table(HISTORY).map_err(backend)?;
        let mut meta = txn.open_table(META).map_err(backend)?;
        let mut entries = Vec::new();
        for entry in log.range(to_u64(low)..=to_u64(high)).map_err(backend)? {
            let (k, v) = entry.map_err(backend)?;
            entries.push((k.value(), codec::decode_log(v.value(), k.value())?));
        }
        for (revision, entry) in &entries {
            let key: &[u8] = &entry.key;
            if entry.deleted {
                history.retain_in((key, 0u64)..=(key, *revision), |_, _| false)
            } else {
                history.retain_in((key, 0u64)..(key, *revision), |_, _| false)
            }
            .map_err(backend)?;
        }
        log.retain_in(to_u64(low)..to_u64(high), |_, _| false)
            .map_err(backend)?;
        let encoded = codec::encode_meta(META_COMPACTED, high);
        meta.insert(META_COMPACTED, encoded.as_slice())
            .map_err(backend)?;
    }
    txn.commit().map_err(backend)?;
    Ok(())
}
