//! On-disk encodings of the embedded engine's records, each guarded by a CRC32.
//!
//! redb checksums its pages, but a page checksum only says the page is what redb wrote; it
//! cannot catch a record written under the wrong key, a bug of ours that wrote garbage, or a
//! value planted by an operator. So every record carries its own CRC32, computed over the
//! record's table key *and* its payload, and every read verifies it. A mismatch is a
//! `StoreError::Corrupt` naming the table and key, never a silently served value.

use bytes::Bytes;

use crate::{KeyValue, Revision, StoreError};

/// Layout version of records; bumped if the layout changes so old files fail loudly.
const RECORD_FORMAT: u8 = 1;

const TAG_PUT: u8 = 1;
const TAG_TOMBSTONE: u8 = 2;

/// crc(4) + format(1) + tag(1) + create(8) + mod(8) + version(8).
const RECORD_HEADER: usize = 4 + 1 + 1 + 8 + 8 + 8;

/// A key's state at one revision, as stored in the `current` and `history` tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    Put {
        create_revision: Revision,
        mod_revision: Revision,
        version: i64,
        value: Bytes,
    },
    /// The key was deleted at `mod_revision`.
    Tombstone { mod_revision: Revision },
}

impl Record {
    pub(crate) fn from_kv(kv: &KeyValue) -> Self {
        Record::Put {
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            value: kv.value.clone(),
        }
    }

    /// The key-value this record describes, if it is a live value.
    pub(crate) fn into_kv(self, key: &[u8]) -> Option<KeyValue> {
        match self {
            Record::Put {
                create_revision,
                mod_revision,
                version,
                value,
            } => Some(KeyValue {
                key: Bytes::copy_from_slice(key),
                value,
                create_revision,
                mod_revision,
                version,
            }),
            Record::Tombstone { .. } => None,
        }
    }
}

fn crc_of(table_key: &[u8], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(table_key);
    hasher.update(payload);
    hasher.finalize()
}

/// Splits `raw` into its checksum and payload and verifies the checksum against `table_key`.
fn checked_payload<'a>(
    raw: &'a [u8],
    table_key: &[u8],
    location: &dyn Fn() -> String,
) -> Result<&'a [u8], StoreError> {
    let Some((crc_bytes, payload)) = raw.split_first_chunk::<4>() else {
        return Err(corrupt(
            location(),
            format!("record is {} bytes, too short", raw.len()),
        ));
    };
    let stored = u32::from_le_bytes(*crc_bytes);
    let actual = crc_of(table_key, payload);
    if stored != actual {
        return Err(corrupt(
            location(),
            format!("checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"),
        ));
    }
    Ok(payload)
}

fn seal(table_key: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len().saturating_add(4));
    out.extend_from_slice(&crc_of(table_key, payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

pub(crate) fn corrupt(location: String, detail: String) -> StoreError {
    StoreError::Corrupt { location, detail }
}

/// A printable rendering of a key for error messages (keys are usually UTF-8 paths).
pub(crate) fn show_key(key: &[u8]) -> String {
    String::from_utf8_lossy(key).escape_debug().to_string()
}

/// Splits a little-endian `i64` off the front of `bytes`.
fn take_i64(bytes: &[u8]) -> Option<(i64, &[u8])> {
    let (head, rest) = bytes.split_first_chunk::<8>()?;
    Some((i64::from_le_bytes(*head), rest))
}

/// Encodes a record; `table_key` is what the record is stored under (part of the checksum).
pub(crate) fn encode_record(table_key: &[u8], record: &Record) -> Vec<u8> {
    let (tag, create, modr, version, value): (u8, i64, i64, i64, &[u8]) = match record {
        Record::Put {
            create_revision,
            mod_revision,
            version,
            value,
        } => (TAG_PUT, *create_revision, *mod_revision, *version, value),
        Record::Tombstone { mod_revision } => (TAG_TOMBSTONE, 0, *mod_revision, 0, &[]),
    };
    let mut payload = Vec::with_capacity(value.len().saturating_add(RECORD_HEADER - 4));
    payload.push(RECORD_FORMAT);
    payload.push(tag);
    payload.extend_from_slice(&create.to_le_bytes());
    payload.extend_from_slice(&modr.to_le_bytes());
    payload.extend_from_slice(&version.to_le_bytes());
    payload.extend_from_slice(value);
    seal(table_key, &payload)
}

/// Decodes and verifies a record stored under `table_key`.
pub(crate) fn decode_record(
    raw: &[u8],
    table_key: &[u8],
    location: &dyn Fn() -> String,
) -> Result<Record, StoreError> {
    let payload = checked_payload(raw, table_key, location)?;
    let header = payload
        .split_first_chunk::<2>()
        .and_then(|(&[format, tag], rest)| {
            let (create_revision, rest) = take_i64(rest)?;
            let (mod_revision, rest) = take_i64(rest)?;
            let (version, value) = take_i64(rest)?;
            Some((format, tag, create_revision, mod_revision, version, value))
        });
    let Some((format, tag, create_revision, mod_revision, version, value)) = header else {
        return Err(corrupt(
            location(),
            format!("record header truncated ({} bytes)", raw.len()),
        ));
    };
    if format != RECORD_FORMAT {
        return Err(corrupt(
            location(),
            format!("unknown record format {format}"),
        ));
    }
    match tag {
        TAG_PUT => Ok(Record::Put {
            create_revision,
            mod_revision,
            version,
            value: Bytes::copy_from_slice(value),
        }),
        TAG_TOMBSTONE => Ok(Record::Tombstone { mod_revision }),
        other => Err(corrupt(location(), format!("unknown record tag {other}"))),
    }
}

/// The table key of a history record: the user key followed by the revision, so that
/// a record checksum also binds the revision it is filed under.
pub(crate) fn history_crc_key(key: &[u8], revision: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len().saturating_add(8));
    out.extend_from_slice(key);
    out.extend_from_slice(&revision.to_le_bytes());
    out
}

/// One entry of the event log: which key changed at a revision, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LogEntry {
    pub(crate) deleted: bool,
    pub(crate) key: Bytes,
}

pub(crate) fn encode_log(revision: u64, entry: &LogEntry) -> Vec<u8> {
    let mut payload = Vec::with_capacity(entry.key.len().saturating_add(2));
    payload.push(RECORD_FORMAT);
    payload.push(if entry.deleted {
        TAG_TOMBSTONE
    } else {
        TAG_PUT
    });
    payload.extend_from_slice(&entry.key);
    seal(&revision.to_le_bytes(), &payload)
}

pub(crate) fn decode_log(raw: &[u8], revision: u64) -> Result<LogEntry, StoreError> {
    let location = || format!("log/{revision}");
    let payload = checked_payload(raw, &revision.to_le_bytes(), &location)?;
    let Some((&[RECORD_FORMAT, tag], key)) = payload.split_first_chunk::<2>() else {
        return Err(corrupt(location(), "bad log entry header".to_string()));
    };
    let deleted = match tag {
        TAG_PUT => false,
        TAG_TOMBSTONE => true,
        other => {
            return Err(corrupt(
                location(),
                format!("unknown log entry tag {other}"),
            ));
        }
    };
    Ok(LogEntry {
        deleted,
        key: Bytes::copy_from_slice(key),
    })
}

/// The table key an `expiry` entry's checksum binds: deadline (big-endian) then the key.
fn expiry_crc_key(deadline: u64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len().saturating_add(8));
    out.extend_from_slice(&deadline.to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// An `expiry` entry's value: the revision of the write that set the deadline.
pub(crate) fn encode_expiry(deadline: u64, key: &[u8], revision: Revision) -> Vec<u8> {
    seal(&expiry_crc_key(deadline, key), &revision.to_le_bytes())
}

pub(crate) fn decode_expiry(raw: &[u8], deadline: u64, key: &[u8]) -> Result<Revision, StoreError> {
    let location = || format!("expiry/{deadline}/{}", show_key(key));
    let payload = checked_payload(raw, &expiry_crc_key(deadline, key), &location)?;
    let Ok(bytes) = <[u8; 8]>::try_from(payload) else {
        return Err(corrupt(
            location(),
            format!("expiry value is {} bytes", payload.len()),
        ));
    };
    Ok(i64::from_le_bytes(bytes))
}

pub(crate) fn encode_meta(name: &str, value: i64) -> Vec<u8> {
    seal(name.as_bytes(), &value.to_le_bytes())
}

pub(crate) fn decode_meta(raw: &[u8], name: &str) -> Result<i64, StoreError> {
    let location = || format!("meta/{name}");
    let payload = checked_payload(raw, name.as_bytes(), &location)?;
    let Ok(bytes) = <[u8; 8]>::try_from(payload) else {
        return Err(corrupt(
            location(),
            format!("meta value is {} bytes", payload.len()),
        ));
    };
    Ok(i64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc() -> String {
        "test".to_string()
    }

    #[test]
    fn records_round_trip() {
        let put = Record::Put {
            create_revision: 3,
            mod_revision: 7,
            version: 2,
            value: Bytes::from_static(b"hello"),
        };
        let raw = encode_record(b"/k", &put);
        assert_eq!(decode_record(&raw, b"/k", &loc).unwrap(), put);
        let tomb = Record::Tombstone { mod_revision: 9 };
        let raw = encode_record(b"/k", &tomb);
        assert_eq!(decode_record(&raw, b"/k", &loc).unwrap(), tomb);
    }

    #[test]
    fn any_flipped_bit_or_wrong_key_is_detected() {
        let put = Record::Put {
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            value: Bytes::from_static(b"v"),
        };
        let raw = encode_record(b"/k", &put);
        for i in 0..raw.len() {
            for bit in 0..8 {
                let mut bad = raw.clone();
                bad[i] ^= 1 << bit;
                assert!(matches!(
                    decode_record(&bad, b"/k", &loc),
                    Err(StoreError::Corrupt { .. })
                ));
            }
        }
        assert!(decode_record(&raw, b"/other", &loc).is_err());
        for len in 0..raw.len() {
            assert!(decode_record(&raw[..len], b"/k", &loc).is_err());
        }
    }

    #[test]
    fn log_and_meta_round_trip() {
        let entry = LogEntry {
            deleted: true,
            key: Bytes::from_static(b"/a/b"),
        };
        let raw = encode_log(42, &entry);
        assert_eq!(decode_log(&raw, 42).unwrap(), entry);
        assert!(decode_log(&raw, 43).is_err());
        let raw = encode_meta("revision", 99);
        assert_eq!(decode_meta(&raw, "revision").unwrap(), 99);
        assert!(decode_meta(&raw, "compacted").is_err());
        let raw = encode_expiry(1_700_000_000_000, b"/e/k", 12);
        assert_eq!(decode_expiry(&raw, 1_700_000_000_000, b"/e/k").unwrap(), 12);
        assert!(decode_expiry(&raw, 1_700_000_000_001, b"/e/k").is_err());
        assert!(decode_expiry(&raw, 1_700_000_000_000, b"/e/x").is_err());
    }
}
