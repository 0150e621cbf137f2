//! File plumbing for the PKI: the directory lock, atomic writes, and reads that treat a
//! missing file as `None`.

use std::fs::{self, DirBuilder, File, OpenOptions, TryLockError};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::PkiError;

/// Mode for private keys and the kubeconfig (which embeds one).
pub(super) const PRIVATE: u32 = 0o600;
/// Mode for certificates and public keys.
pub(super) const PUBLIC: u32 = 0o644;

const LOCK_FILE: &str = ".lock";
const TEMP_MARKER: &str = ".tmp-";

fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PkiError + 'a {
    move |source| PkiError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// Creates `dir` (and parents) readable only by us when it does not exist yet; an existing
/// directory keeps the mode its owner chose.
pub(super) fn create_private_dir(dir: &Path) -> Result<(), PkiError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_error("create directory", dir))
}

/// An exclusive `flock` on `<dir>/.lock`, released when dropped (closing the file releases
/// it, also when the process dies, so a crash never leaves the directory locked).
/// Flock locks belong to the open file, so threads of one process exclude each other too.
pub(super) struct DirLock {
    _file: File,
}

impl DirLock {
    pub(super) fn acquire(dir: &Path, timeout: Duration) -> Result<Self, PkiError> {
        let path = dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(PRIVATE)
            .open(&path)
            .map_err(io_error("open lock file", &path))?;
        let started = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if started.elapsed() < timeout => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(PkiError::LockTimeout {
                        path,
                        waited: started.elapsed(),
                    });
                }
                Err(TryLockError::Error(source)) => {
                    return Err(PkiError::Io {
                        action: "lock",
                        path,
                        source,
                    });
                }
            }
        }
        remove_stale_temp_files(dir);
        Ok(Self { _file: file })
    }
}

/// Temp files left by a writer that died mid-write. Only called with the lock held, when
/// no other writer can be using one. Best effort: leftovers are harmless, just untidy.
fn remove_stale_temp_files(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.')
            && name.contains(TEMP_MARKER)
            && let Err(error) = fs::remove_file(entry.path())
        {
            tracing::debug!(%error, file = %name, "could not remove a stale temp file");
        }
    }
}

/// The file's contents, or `None` when it does not exist.
pub(super) fn read_optional(path: &Path) -> Result<Option<String>, PkiError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PkiError::Io {
            action: "read",
            path: path.to_owned(),
            source,
        }),
    }
}

pub(super) fn exists(path: &Path) -> Result<bool, PkiError> {
    path.try_exists().map_err(io_error("check", path))
}

/// Writes `contents` to a temp file beside `path` with `mode`, syncs it, and renames it over
/// `path`, so readers see the old file or the new one, never a partial one.
pub(super) fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let file_name = path.file_name().ok_or_else(|| PkiError::Io {
        action: "write",
        path: path.to_owned(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"),
    })?;
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    create_private_dir(&dir)?;
    let temp = dir.join(format!(
        ".{}{TEMP_MARKER}{}-{}",
        file_name.to_string_lossy(),
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    let result = write_new(&temp, contents, mode)
        .and_then(|()| fs::rename(&temp, path).map_err(io_error("rename into place", path)));
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result?;
    // The rename is durable only once the directory entry is.
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("sync directory", &dir))
}

fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io_error("create", path))?;
    file.write_all(contents).map_err(io_error("write", path))?;
    file.sync_all().map_err(io_error("sync", path))
}
