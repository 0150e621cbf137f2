//! Opening a data directory: first-time initialization, and the checks that run before the
//! store serves anything.
//!
//! A new data file is built under a temporary name and renamed into place only once its
//! tables and meta are committed, so an existing `store.redb` is always a fully initialized
//! store: an empty or truncated one is reported, never silently re-initialized as empty.
//!
//! On every open: redb verifies its page checksums (with `verify_file_on_open`, and always
//! after a crash), then we check our meta records, that the revision counter equals the last
//! revision in the event log, that the log starts at the compaction point, and the newest
//! `verify_tail` log entries (contiguous, checksums valid, each with its history record).

use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;

use redb::{Database, DatabaseError, Durability, ReadableDatabase, ReadableTable};

use super::EmbeddedConfig;
use super::codec::{self, corrupt};
use super::file::{DataFile, Faults};
use super::tables::{
    self, CURRENT, EXPIRY, FORMAT_VERSION, HISTORY, LOG, META, META_COMPACTED, META_FORMAT,
    META_REVISION, backend, to_rev, to_u64,
};
use crate::{Revision, StoreError};

/// Name of the data file inside the data directory.
pub const DATA_FILE: &str = "store.redb";
const INIT_FILE: &str = "store.redb.init";

/// Opens (creating if needed) the data file in `dir` and verifies it.
/// Returns the database and its (revision, compacted revision).
pub(crate) fn open(
    dir: &Path,
    config: &EmbeddedConfig,
    faults: &Arc<Faults>,
) -> Result<(Database, Revision, Revision), StoreError> {
    create_private_dir(dir)?;
    let path = dir.join(DATA_FILE);
    if !path.exists() {
        initialize(dir)?;
    }
    let db = open_file(&path, config, faults)?;
    let (revision, compacted) = verify(&db, config.verify_tail)?;
    add_missing_tables(&db)?;
    Ok((db, revision, compacted))
}

/// Opens the data file again after a failed commit (the old handle must be closed first):
/// redb repairs what the failed transaction left, every page checksum is verified, then our
/// own checks run as at start.
pub(crate) fn reopen(
    dir: &Path,
    config: &EmbeddedConfig,
    faults: &Arc<Faults>,
) -> Result<(Database, Revision, Revision), StoreError> {
    let config = EmbeddedConfig {
        verify_file_on_open: true,
        ..config.clone()
    };
    let db = open_file(&dir.join(DATA_FILE), &config, faults)?;
    let (revision, compacted) = verify(&db, config.verify_tail)?;
    Ok((db, revision, compacted))
}

/// Creates the data directory (and missing parents) readable by its owner only, and narrows
/// an existing one to 0700: the data holds every Secret in clear.
fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(StoreError::Io)?;
        let mode = fs::metadata(dir)
            .map_err(StoreError::Io)?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(StoreError::Io)?;
        }
    }
    #[cfg(not(unix))]
    fs::create_dir_all(dir).map_err(StoreError::Io)?;
    Ok(())
}

fn redb_builder(config: &EmbeddedConfig) -> redb::Builder {
    let mut builder = redb::Builder::new();
    builder.set_cache_size(config.cache_size);
    builder.set_check_integrity_on_open(config.verify_file_on_open);
    builder
}

fn open_file(
    path: &Path,
    config: &EmbeddedConfig,
    faults: &Arc<Faults>,
) -> Result<Database, StoreError> {
    let location = path.display().to_string();
    if fs::metadata(path).map_err(StoreError::Io)?.len() == 0 {
        return Err(corrupt(
            location,
            "data file is empty (truncated?)".to_string(),
        ));
    }
    let builder = redb_builder(config);
    // redb documents that a plain open of a file damaged outside redb "may panic"; a panic
    // here must become a clear error, not take the process down.
    let file = DataFile::open(path, faults.clone()).map_err(StoreError::Io)?;
    match catch_unwind(AssertUnwindSafe(|| builder.create_with_backend(file))) {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(DatabaseError::DatabaseAlreadyOpen)) => Err(StoreError::Unavailable(format!(
            "{location} is already open (by this or another process)"
        ))),
        Ok(Err(DatabaseError::Storage(redb::StorageError::Corrupted(detail)))) => {
            Err(corrupt(location, detail))
        }
        Ok(Err(err)) => Err(backend(err)),
        Err(panic) => {
            let detail = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(corrupt(
                location,
                format!("data file is unreadable: {detail}"),
            ))
        }
    }
}

/// Builds an empty store under a temporary name, then renames it into place.
fn initialize(dir: &Path) -> Result<(), StoreError> {
    let init = dir.join(INIT_FILE);
    match fs::remove_file(&init) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(StoreError::Io(err)),
    }
    {
        let db = redb::Builder::new().create(&init).map_err(backend)?;
        let mut txn = db.begin_write().map_err(backend)?;
        txn.set_durability(Durability::Immediate).map_err(backend)?;
        {
            txn.open_table(CURRENT).map_err(backend)?;
            txn.open_table(HISTORY).map_err(backend)?;
            txn.open_table(LOG).map_err(backend)?;
            txn.open_table(EXPIRY).map_err(backend)?;
            let mut meta = txn.open_table(META).map_err(backend)?;
            for (name, value) in [
                (META_FORMAT, FORMAT_VERSION),
                (META_REVISION, 0),
                (META_COMPACTED, 0),
            ] {
                meta.insert(name, codec::encode_meta(name, value).as_slice())
                    .map_err(backend)?;
            }
        }
        txn.commit().map_err(backend)?;
    }
    fs::rename(&init, dir.join(DATA_FILE)).map_err(StoreError::Io)?;
    // Make the rename itself durable.
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(StoreError::Io)?;
    Ok(())
}

/// Creates the tables a store made before they existed lacks (`expiry`: such a store has no
/// expiring keys, so an empty table is its exact state; the layout version stays the same).
fn add_missing_tables(db: &Database) -> Result<(), StoreError> {
    let missing = {
        let txn = db.begin_read().map_err(backend)?;
        match txn.open_table(EXPIRY) {
            Ok(_) => false,
            Err(redb::TableError::TableDoesNotExist(_)) => true,
            Err(err) => return Err(backend(err)),
        }
    };
    if missing {
        let mut txn = db.begin_write().map_err(backend)?;
        txn.set_durability(Durability::Immediate).map_err(backend)?;
        txn.open_table(EXPIRY).map_err(backend)?;
        txn.commit().map_err(backend)?;
        tracing::info!("embedded store: added the expiry table");
    }
    Ok(())
}

fn verify(db: &Database, tail: u64) -> Result<(Revision, Revision), StoreError> {
    let txn = db.begin_read().map_err(backend)?;
    let meta = txn.open_table(META).map_err(backend)?;
    let missing = |name: &str| corrupt(format!("meta/{name}"), "missing".to_string());
    let format = tables::read_meta(&meta, META_FORMAT)?.ok_or_else(|| missing(META_FORMAT))?;
    if format != FORMAT_VERSION {
        return Err(corrupt(
            "meta/format".to_string(),
            format!(
                "data directory has layout version {format}, this build reads {FORMAT_VERSION}"
            ),
        ));
    }
    let revision =
        tables::read_meta(&meta, META_REVISION)?.ok_or_else(|| missing(META_REVISION))?;
    let compacted =
        tables::read_meta(&meta, META_COMPACTED)?.ok_or_else(|| missing(META_COMPACTED))?;
    if compacted < 0 || compacted > revision {
        return Err(corrupt(
            "meta".to_string(),
            format!("compacted revision {compacted} is outside [0, revision {revision}]"),
        ));
    }

    let log = txn.open_table(LOG).map_err(backend)?;
    let history = txn.open_table(HISTORY).map_err(backend)?;
    let first = log.first().map_err(backend)?.map(|(k, _)| k.value());
    let last = log.last().map_err(backend)?.map(|(k, _)| k.value());
    let expected_first = to_u64(compacted.max(1));
    match (first, last) {
        (None, None) if revision == 0 => return Ok((0, 0)),
        (Some(first), Some(last)) if last == to_u64(revision) && first == expected_first => {}
        (first, last) => {
            return Err(corrupt(
                "log".to_string(),
                format!(
                    "revision counter is {revision} (compacted {compacted}) but the event log \
                     spans {first:?}..={last:?}: the log or the meta record is damaged"
                ),
            ));
        }
    }

    let start = to_u64(revision)
        .saturating_sub(tail.saturating_sub(1))
        .max(expected_first);
    for (expected, entry) in (start..).zip(log.range(start..).map_err(backend)?) {
        let (k, v) = entry.map_err(backend)?;
        let rev = k.value();
        if rev != expected {
            return Err(corrupt(
                format!("log/{expected}"),
                format!("missing (next is {rev})"),
            ));
        }
        let entry = codec::decode_log(v.value(), rev)?;
        // At the compaction point the log entry may outlive its (compacted) history record.
        if to_rev(rev) <= compacted {
            continue;
        }
        let Some(raw) = history.get((&entry.key[..], rev)).map_err(backend)? else {
            return Err(corrupt(
                tables::history_location(&entry.key, rev),
                "logged write has no history record".to_string(),
            ));
        };
        let record = tables::decode_history(raw.value(), &entry.key, rev)?;
        if matches!(record, codec::Record::Tombstone { .. }) != entry.deleted {
            return Err(corrupt(
                tables::history_location(&entry.key, rev),
                "history record disagrees with the event log".to_string(),
            ));
        }
    }
    tracing::info!(revision, compacted, "embedded store verified");
    Ok((revision, compacted))
}
