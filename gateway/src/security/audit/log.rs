//! The log backend (`--audit-log-path`): one JSON line per event, to a file or stdout (`-`).
//! The file is rotated as Kubernetes' lumberjack logger rotates it: past `--audit-log-maxsize`
//! megabytes the file is renamed to `<name>-<UTC time 2006-01-02T15-04-05.000><ext>` and a new
//! one opened; then backups beyond `--audit-log-maxbackup` (newest kept) and older than
//! `--audit-log-maxage` days are deleted.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use svc_config::audit::Event;

use super::Sink;

/// lumberjack's size when `--audit-log-maxsize` is 0.
const DEFAULT_MAX_BYTES: u64 = 100 * 1024 * 1024;

/// Where and when to rotate.
#[derive(Clone, Debug)]
pub struct Rotation {
    /// Rotate before a write would take the file past this (0: 100 MiB, as lumberjack).
    pub max_bytes: u64,
    /// Backups kept (0: all).
    pub max_backups: usize,
    /// Backups older than this are deleted (zero: never).
    pub max_age: Duration,
}

enum Out {
    Stdout,
    File {
        path: PathBuf,
        file: Option<File>,
        size: u64,
        rotation: Rotation,
        /// Only regular files rotate (never `/dev/stdout`, a pipe or a device).
        regular: bool,
    },
}

/// A writer of lines that rotates its file.
pub struct LogWriter {
    out: parking_lot::Mutex<Out>,
}

impl LogWriter {
    pub fn stdout() -> Self {
        LogWriter {
            out: parking_lot::Mutex::new(Out::Stdout),
        }
    }

    /// Opens (creating its directory) `path` for appending; the file must be writable now.
    pub fn file(path: &Path, rotation: Rotation) -> std::io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let meta = file.metadata()?;
        Ok(LogWriter {
            out: parking_lot::Mutex::new(Out::File {
                path: path.to_path_buf(),
                file: Some(file),
                size: meta.len(),
                rotation,
                regular: meta.is_file(),
            }),
        })
    }

    /// Writes `line` (which ends in a newline) whole, rotating first if it would not fit.
    pub fn write_line(&self, line: &[u8]) -> std::io::Result<()> {
        let mut out = self.out.lock();
        match &mut *out {
            Out::Stdout => std::io::stdout().lock().write_all(line),
            Out::File {
                path,
                file,
                size,
                rotation,
                regular,
            } => {
                let max = if rotation.max_bytes == 0 {
                    DEFAULT_MAX_BYTES
                } else {
                    rotation.max_bytes
                };
                let len = line.len() as u64;
                if !*regular {
                    let f = file
                        .as_mut()
                        .ok_or_else(|| std::io::Error::other("no file"))?;
                    return f.write_all(line);
                }
                if len > max {
                    return Err(std::io::Error::other(format!(
                        "write length {len} exceeds maximum file size {max}"
                    )));
                }
                if file.is_none() || size.saturating_add(len) > max {
                    *file = None;
                    rotate(path, rotation)?;
                    *file = Some(OpenOptions::new().create(true).append(true).open(&*path)?);
                    *size = 0;
                }
                let f = file
                    .as_mut()
                    .ok_or_else(|| std::io::Error::other("no file"))?;
                f.write_all(line)?;
                *size = size.saturating_add(len);
                Ok(())
            }
        }
    }
}

/// Renames the current file to its backup name and prunes old backups.
fn rotate(path: &Path, rotation: &Rotation) -> std::io::Result<()> {
    if path.exists() {
        let mut backup = backup_name(path, SystemTime::now());
        // Two rotations in one millisecond: keep both rather than overwrite.
        let mut n = 1u64;
        while backup.exists() {
            let mut s = backup_name(path, SystemTime::now()).into_os_string();
            s.push(format!(".{n}"));
            backup = s.into();
            n = n.saturating_add(1);
        }
        std::fs::rename(path, &backup)?;
    }
    prune(path, rotation);
    Ok(())
}

/// `dir/audit.log` rotated at `t` is `dir/audit-2026-11-23T17-00-00.000.log` (UTC).
pub fn backup_name(path: &Path, t: SystemTime) -> PathBuf {
    let (prefix, ext) = name_parts(path);
    let t = time::OffsetDateTime::from(t);
    let stamp = format!(
        "{:04}-{:02}-{:02}T{:02}-{:02}-{:02}.{:03}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    );
    path.with_file_name(format!("{prefix}{stamp}{ext}"))
}

/// (`audit-`, `.log`) for `audit.log`.
fn name_parts(path: &Path) -> (String, String) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let stem = name.strip_suffix(ext.as_str()).unwrap_or(&name);
    (format!("{stem}-"), ext)
}

/// The backups of `path`, newest first (their names sort by time).
pub fn backups(path: &Path) -> Vec<PathBuf> {
    let (prefix, ext) = name_parts(path);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(&prefix)
                    && n.len() >= prefix.len().saturating_add(23)
                    && n.as_bytes().get(prefix.len().saturating_add(10)) == Some(&b'T')
                    && (n.ends_with(&ext) || n.contains(&format!("{ext}.")))
            })
        })
        .collect();
    found.sort();
    found.reverse();
    found
}

fn prune(path: &Path, rotation: &Rotation) {
    let all = backups(path);
    let mut doomed: Vec<&PathBuf> = Vec::new();
    if rotation.max_backups > 0 {
        doomed.extend(all.iter().skip(rotation.max_backups));
    }
    if !rotation.max_age.is_zero()
        && let Some(cutoff) = SystemTime::now().checked_sub(rotation.max_age)
    {
        for p in &all {
            let old = std::fs::metadata(p)
                .and_then(|m| m.modified())
                .is_ok_and(|m| m < cutoff);
            if old && !doomed.contains(&p) {
                doomed.push(p);
            }
        }
    }
    for p in doomed {
        if let Err(e) = std::fs::remove_file(p) {
            tracing::warn!(path = %p.display(), error = %e, "removing an old audit log");
        }
    }
}

/// The log backend: each event as one JSON line.
pub struct LogSink {
    writer: Arc<LogWriter>,
}

impl LogSink {
    pub fn new(writer: LogWriter) -> Self {
        LogSink {
            writer: Arc::new(writer),
        }
    }
}

impl Sink for LogSink {
    fn name(&self) -> &'static str {
        "log"
    }

    /// Writes in the caller: a line goes to the page cache, never waits for the disk.
    fn process<'a>(&'a self, events: &'a [Arc<Event>]) -> BoxFuture<'a, Result<(), String>> {
        let mut result = Ok(());
        for ev in events {
            let mut line = ev.to_json();
            line.push(b'\n');
            if let Err(e) = self.writer.write_line(&line) {
                result = Err(format!("writing the audit log: {e}"));
            }
        }
        Box::pin(std::future::ready(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("svc-audit-log-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn backup_names_are_lumberjacks() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_453_200_123);
        let name = backup_name(Path::new("/var/log/audit.log"), t);
        assert_eq!(
            name,
            Path::new("/var/log/audit-2026-11-23T17-00-00.123.log")
        );
        let bare = backup_name(Path::new("audit"), t);
        assert_eq!(bare, Path::new("audit-2026-11-23T17-00-00.123"));
    }

    #[test]
    fn size_starts_a_new_file_and_max_backup_prunes() {
        let d = dir();
        let path = d.join("audit.log");
        let w = LogWriter::file(
            &path,
            Rotation {
                max_bytes: 100,
                max_backups: 2,
                max_age: Duration::ZERO,
            },
        )
        .unwrap();
        let line = [b'x'; 39]
            .iter()
            .copied()
            .chain([b'\n'])
            .collect::<Vec<u8>>();
        // Two lines fit in 100 bytes; the third starts a new file.
        w.write_line(&line).unwrap();
        w.write_line(&line).unwrap();
        assert!(backups(&path).is_empty());
        w.write_line(&line).unwrap();
        assert_eq!(backups(&path).len(), 1);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 40);
        assert_eq!(std::fs::metadata(&backups(&path)[0]).unwrap().len(), 80);
        for _ in 0..8 {
            std::thread::sleep(Duration::from_millis(2));
            w.write_line(&line).unwrap();
            w.write_line(&line).unwrap();
        }
        let kept = backups(&path);
        assert_eq!(kept.len(), 2, "{kept:?}");
        // No line is lost or split: every file holds whole lines.
        for f in kept.iter().chain([&path]) {
            let text = std::fs::read_to_string(f).unwrap();
            assert!(text.lines().all(|l| l.len() == 39), "{}", f.display());
        }
        let too_long = vec![b'y'; 101];
        assert!(w.write_line(&too_long).is_err());
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn an_existing_file_is_appended_to_and_old_backups_expire() {
        let d = dir();
        let path = d.join("audit.log");
        std::fs::write(&path, "old\n").unwrap();
        let stale = d.join("audit-2020-01-01T00-00-00.000.log");
        std::fs::write(&stale, "stale\n").unwrap();
        let f = File::options().write(true).open(&stale).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(3 * 86400))
            .unwrap();
        let w = LogWriter::file(
            &path,
            Rotation {
                max_bytes: 10,
                max_backups: 0,
                max_age: Duration::from_secs(86400),
            },
        )
        .unwrap();
        w.write_line(b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\nnew\n");
        assert!(stale.exists(), "pruned only on rotation");
        w.write_line(b"more!\n").unwrap();
        assert!(!stale.exists(), "older than max age");
        let kept = backups(&path);
        assert_eq!(kept.len(), 1);
        assert_eq!(std::fs::read_to_string(&kept[0]).unwrap(), "old\nnew\n");
        std::fs::remove_dir_all(d).unwrap();
    }
}
