//! The embedded engine's redb tables and the read paths over one consistent snapshot.
//!
//! - `current`: key -> record of the key's live value (fast CAS checks and current reads);
//! - `history`: (key, revision) -> record of every write (puts and tombstones) not yet
//!   compacted, plus each key's state as of the compaction point (reads at past revisions,
//!   `prev_kv` of replayed events);
//! - `log`: revision -> (key, put or delete), the change feed's replay source; it holds
//!   every revision from the compaction point to the current revision, with no gaps;
//! - `expiry`: (deadline in Unix milliseconds, key) -> revision of the write that gave the key
//!   that deadline (`create_with_ttl`, `update_with_ttl`); the committer deletes the key when
//!   the deadline passes if that write is still the key's latest (a later write or delete
//!   leaves the entry stale, and it is dropped when reached). Ordered by deadline, so finding
//!   what is due reads only the due entries;
//! - `meta`: `revision` (last committed) and `compacted`;
//! - `probe`: empty, but for the moment a failed store tests whether writes work again.
//!
//! Every value carries a CRC32 (see `codec`); a read that fails it returns `Corrupt`.

use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, TableDefinition};

use super::codec::{self, Record, show_key};
use crate::{Event, EventKind, KeyRange, KeyValue, RangeResult, Revision, StoreError};

pub(crate) const CURRENT: TableDefinition<&[u8], &[u8]> = TableDefinition::new("current");
pub(crate) const HISTORY: TableDefinition<(&[u8], u64), &[u8]> = TableDefinition::new("history");
pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
pub(crate) const EXPIRY: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("expiry");
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// Scratch space of the write probe after a failed commit (see `committer`); empty otherwise.
pub(crate) const PROBE: TableDefinition<u8, &[u8]> = TableDefinition::new("probe");

pub(crate) const META_REVISION: &str = "revision";
pub(crate) const META_COMPACTED: &str = "compacted";
/// Layout version of the whole directory; a file from a future layout is refused at open.
pub(crate) const META_FORMAT: &str = "format";
pub(crate) const FORMAT_VERSION: i64 = 1;

/// Maps any redb error onto the storage boundary.
pub(crate) fn backend(err: impl Into<redb::Error>) -> StoreError {
    match err.into() {
        redb::Error::Corrupted(detail) => StoreError::Corrupt {
            location: "redb data file".to_string(),
            detail,
        },
        redb::Error::Io(io) => StoreError::Io(io),
        other => StoreError::Backend(Box::new(other)),
    }
}

/// Revisions are stored as u64 so that table order is numeric order; they are never negative.
pub(crate) fn to_u64(revision: Revision) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

pub(crate) fn to_rev(revision: u64) -> Revision {
    Revision::try_from(revision).unwrap_or(Revision::MAX)
}

pub(crate) fn current_location(key: &[u8]) -> String {
    format!("current/{}", show_key(key))
}

pub(crate) fn history_location(key: &[u8], revision: u64) -> String {
    format!("history/{}@{revision}", show_key(key))
}

pub(crate) fn decode_current(raw: &[u8], key: &[u8]) -> Result<Record, StoreError> {
    codec::decode_record(raw, key, &|| current_location(key))
}

pub(crate) fn decode_history(raw: &[u8], key: &[u8], revision: u64) -> Result<Record, StoreError> {
    let crc_key = codec::history_crc_key(key, revision);
    codec::decode_record(raw, &crc_key, &|| history_location(key, revision))
}

pub(crate) fn read_meta(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
    name: &str,
) -> Result<Option<i64>, StoreError> {
    match meta.get(name).map_err(backend)? {
        Some(raw) => codec::decode_meta(raw.value(), name).map(Some),
        None => Ok(None),
    }
}

/// The latest record of `key` with revision <= `at`, if any survives in history.
pub(crate) fn latest_at(
    history: &impl ReadableTable<(&'static [u8], u64), &'static [u8]>,
    key: &[u8],
    at: u64,
) -> Result<Option<(u64, Record)>, StoreError> {
    let mut range = history.range((key, 0u64)..=(key, at)).map_err(backend)?;
    match range.next_back() {
        Some(entry) => {
            let (k, v) = entry.map_err(backend)?;
            let revision = k.value().1;
            Ok(Some((revision, decode_history(v.value(), key, revision)?)))
        }
        None => Ok(None),
    }
}

/// True when `[start, end)` cannot contain anything (redb wants ordered bounds).
fn is_empty_range(range: &KeyRange) -> bool {
    !range.end.is_empty() && range.start >= range.end
}

/// One consistent read view: a redb read transaction plus the meta it saw.
pub(crate) struct Snapshot {
    _txn: ReadTransaction,
    current: ReadOnlyTable<&'static [u8], &'static [u8]>,
    history: ReadOnlyTable<(&'static [u8], u64), &'static [u8]>,
    log: ReadOnlyTable<u64, &'static [u8]>,
    pub(crate) revision: Revision,
    pub(crate) compacted: Revision,
}

impl Snapshot {
    pub(crate) fn open(db: &redb::Database) -> Result<Self, StoreError> {
        use redb::ReadableDatabase;
        let txn = db.begin_read().map_err(backend)?;
        let meta = txn.open_table(META).map_err(backend)?;
        let revision = read_meta(&meta, META_REVISION)?.unwrap_or(0);
        let compacted = read_meta(&meta, META_COMPACTED)?.unwrap_or(0);
        Ok(Snapshot {
            current: txn.open_table(CURRENT).map_err(backend)?,
            history: txn.open_table(HISTORY).map_err(backend)?,
            log: txn.open_table(LOG).map_err(backend)?,
            _txn: txn,
            revision,
            compacted,
        })
    }

    /// Resolves a requested read revision against this snapshot.
    pub(crate) fn resolve(&self, at: Option<Revision>) -> Result<Revision, StoreError> {
        match at {
            None => Ok(self.revision),
            Some(at) if at > self.revision => Err(StoreError::FutureRevision {
                requested: at,
                current: self.revision,
            }),
            Some(at) if at < self.compacted => Err(StoreError::Compacted {
                requested: at,
                compacted: self.compacted,
            }),
            Some(at) => Ok(at),
        }
    }

    pub(crate) fn get(
        &self,
        key: &[u8],
        at: Option<Revision>,
    ) -> Result<Option<KeyValue>, StoreError> {
        let at = self.resolve(at)?;
        if at == self.revision {
            return match self.current.get(key).map_err(backend)? {
                Some(raw) => Ok(decode_current(raw.value(), key)?.into_kv(key)),
                None => Ok(None),
            };
        }
        Ok(latest_at(&self.history, key, to_u64(at))?.and_then(|(_, record)| record.into_kv(key)))
    }

    pub(crate) fn current_raw(&self, key: &[u8]) -> Result<Option<bytes::Bytes>, StoreError> {
        let raw = self.current.get(key).map_err(backend)?;
        Ok(raw.map(|raw| bytes::Bytes::copy_from_slice(raw.value())))
    }

    pub(crate) fn range(
        &self,
        range: &KeyRange,
        at: Option<Revision>,
        limit: usize,
    ) -> Result<RangeResult, StoreError> {
        let at = self.resolve(at)?;
        let mut result = RangeResult {
            kvs: Vec::new(),
            revision: at,
            more: false,
        };
        if is_empty_range(range) {
            return Ok(result);
        }
        if at == self.revision {
            self.range_current(range, limit, &mut result)?;
        } else {
            self.range_history(range, to_u64(at), limit, &mut result)?;
        }
        Ok(result)
    }

    fn range_current(
        &self,
        range: &KeyRange,
        limit: usize,
        result: &mut RangeResult,
    ) -> Result<(), StoreError> {
        let start: &[u8] = &range.start;
        let iter = if range.end.is_empty() {
            self.current.range(start..).map_err(backend)?
        } else {
            self.current.range(start..&range.end[..]).map_err(backend)?
        };
        for entry in iter {
            let (k, v) = entry.map_err(backend)?;
            if limit > 0 && result.kvs.len() == limit {
                result.more = true;
                break;
            }
            let key = k.value();
            if let Some(kv) = decode_current(v.value(), key)?.into_kv(key) {
                result.kvs.push(kv);
            }
        }
        Ok(())
    }

    /// Scans every surviving version of the keys in `range` and keeps, per key, the latest
    /// one at or before `at`. History is bounded by compaction, so the scan is too.
    fn range_history(
        &self,
        range: &KeyRange,
        at: u64,
        limit: usize,
        result: &mut RangeResult,
    ) -> Result<(), StoreError> {
        let start: (&[u8], u64) = (&range.start, 0);
        let iter = if range.end.is_empty() {
            self.history.range(start..).map_err(backend)?
        } else {
            self.history
                .range(start..(&range.end[..], 0u64))
                .map_err(backend)?
        };
        // (key, revision, raw record) of the best candidate for the key being scanned.
        let mut pending: Option<(Vec<u8>, u64, Vec<u8>)> = None;
        for entry in iter {
            let (k, v) = entry.map_err(backend)?;
            let (key, revision) = k.value();
            if pending
                .as_ref()
                .is_some_and(|(pk, _, _)| pk.as_slice() != key)
                && let Some(done) = pending.take()
                && !self.push_candidate(done, limit, result)?
            {
                return Ok(());
            }
            if revision <= at {
                pending = Some((key.to_vec(), revision, v.value().to_vec()));
            }
        }
        if let Some(done) = pending.take() {
            self.push_candidate(done, limit, result)?;
        }
        Ok(())
    }

    /// Adds a key's version to the result; false once the limit is exceeded.
    fn push_candidate(
        &self,
        (key, revision, raw): (Vec<u8>, u64, Vec<u8>),
        limit: usize,
        result: &mut RangeResult,
    ) -> Result<bool, StoreError> {
        let Some(kv) = decode_history(&raw, &key, revision)?.into_kv(&key) else {
            return Ok(true);
        };
        if limit > 0 && result.kvs.len() == limit {
            result.more = true;
            return Ok(false);
        }
        result.kvs.push(kv);
        Ok(true)
    }

    /// Replays committed events with revision in `(after, after + max_revisions]` (capped at
    /// this snapshot's revision) whose key is in `range`. Returns them and the last revision
    /// scanned, so the caller can continue from there whether or not anything matched.
    pub(crate) fn events_after(
        &self,
        after: Revision,
        range: &KeyRange,
        max_revisions: u64,
    ) -> Result<(Vec<Event>, Revision), StoreError> {
        if after < self.compacted {
            return Err(StoreError::Compacted {
                requested: after,
                compacted: self.compacted,
            });
        }
        if after >= self.revision {
            return Ok((Vec::new(), after));
        }
        // `after < self.revision`, so neither bound overflows.
        let first = to_u64(after).saturating_add(1);
        let last = to_u64(self.revision).min(first.saturating_add(max_revisions.saturating_sub(1)));
        let mut events = Vec::new();
        let mut expected = first;
        for entry in self.log.range(first..=last).map_err(backend)? {
            let (k, v) = entry.map_err(backend)?;
            let revision = k.value();
            if revision != expected {
                return Err(codec::corrupt(
                    format!("log/{expected}"),
                    format!("event log has a gap: next entry is revision {revision}"),
                ));
            }
            expected = expected.saturating_add(1);
            let entry = codec::decode_log(v.value(), revision)?;
            if range.contains(&entry.key) {
                events.push(self.event_at(&entry.key, revision, entry.deleted)?);
            }
        }
        if expected != last.saturating_add(1) {
            return Err(codec::corrupt(
                format!("log/{expected}"),
                format!("event log ends before revision {last}"),
            ));
        }
        Ok((events, to_rev(last)))
    }

    fn event_at(&self, key: &[u8], revision: u64, deleted: bool) -> Result<Event, StoreError> {
        let record = match self.history.get((key, revision)).map_err(backend)? {
            Some(raw) => decode_history(raw.value(), key, revision)?,
            None => {
                return Err(codec::corrupt(
                    history_location(key, revision),
                    "event log entry has no history record".to_string(),
                ));
            }
        };
        // A corrupt previous version must not block the feed: the event itself is intact,
        // so it is delivered without `prev_kv` and the corruption is reported in the logs.
        let prev_kv = match latest_at(&self.history, key, revision.saturating_sub(1)) {
            Ok(prev) => prev.and_then(|(_, r)| r.into_kv(key)),
            Err(err) => {
                tracing::warn!(%err, "previous version unreadable; event sent without prev_kv");
                None
            }
        };
        let rev = to_rev(revision);
        let event = match (record, deleted) {
            (record @ Record::Put { mod_revision, .. }, false) if mod_revision == rev => {
                record.into_kv(key).map(|kv| (EventKind::Put, kv))
            }
            (Record::Tombstone { mod_revision }, true) if mod_revision == rev => {
                Some((EventKind::Delete, tombstone_kv(key, rev)))
            }
            _ => None,
        };
        let Some((kind, kv)) = event else {
            return Err(codec::corrupt(
                history_location(key, revision),
                "history record disagrees with the event log".to_string(),
            ));
        };
        Ok(Event { kind, kv, prev_kv })
    }
}

/// The `kv` of a delete event: the key, an empty value, the delete's revision.
pub(crate) fn tombstone_kv(key: &[u8], revision: Revision) -> KeyValue {
    KeyValue {
        key: bytes::Bytes::copy_from_slice(key),
        value: bytes::Bytes::new(),
        create_revision: 0,
        mod_revision: revision,
        version: 0,
    }
}
