//! Where each cache was, kept across runs of the proxy (`DATA_DIR/proxy/resume-points`), so
//! that a proxy started again (after a crash, a SIGKILL, an upgrade) fills its caches with the
//! upstream's state at a revision its clients have already passed, and their watches resume
//! from its cache instead of passing through or listing everything again.
//!
//! Every [`EVERY`] each cache's revision is sampled, and the revision it had `lag` earlier
//! (the watch bookmark interval and a margin: a quiet resource's watcher is only as far as
//! its last bookmark) is written: a point every client still connected has passed. The file
//! is a hint and nothing more: written whole to a temporary file and renamed, never fsynced
//! (a point lost to a power cut costs the clients one relist); a missing, unreadable or
//! stale point fills that cache with the newest state, as on a first start. One line per
//! resource: `GROUP RESOURCE REVISION`, `-` for the core group.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use svc_storage::Revision;

/// How often the caches' revisions are sampled and the points written.
pub const EVERY: Duration = Duration::from_secs(5);

/// A resource: (group, plural).
pub type Key = (String, String);

/// The points read at start, taken once each, and the file they are written to.
pub struct ResumePoints {
    path: PathBuf,
    loaded: Mutex<HashMap<Key, Revision>>,
    /// How far behind the caches the points written are.
    lag: Duration,
    /// The revisions sampled over the last `lag`, oldest first.
    samples: Mutex<VecDeque<(Instant, HashMap<Key, Revision>)>>,
}

impl ResumePoints {
    /// The points kept in `dir` by a previous run (none when there are none); this run's are
    /// written `lag` behind its caches.
    pub fn open(dir: &Path, lag: Duration) -> Self {
        let path = dir.join("resume-points");
        let loaded = match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "resume points unreadable");
                HashMap::new()
            }
        };
        ResumePoints {
            path,
            loaded: Mutex::new(loaded),
            lag,
            samples: Mutex::new(VecDeque::new()),
        }
    }

    /// The revision the last run kept for `key`, once: a cache dropped and cached again later
    /// starts from the newest state.
    pub fn take(&self, key: &Key) -> Option<Revision> {
        self.loaded.lock().remove(key)
    }

    /// Records the revisions the caches have `now` (each with its floor: the revision of
    /// its last full list), and writes, for each of them, its revision in the oldest sample
    /// no older than `lag` that holds it (the oldest there is, while the proxy has run for
    /// less, or since the resource was first cached), or its floor where that is newer. A
    /// point before the floor is of no use: the upstream answered 410 to a watch from there,
    /// or its history began after (a restarted kube-apiserver's watch cache), and every
    /// client of the cache was bookmarked at the floor when it was resynced.
    pub fn tick(&self, now: Instant, revisions: HashMap<Key, (Revision, Revision)>) {
        let due: HashMap<Key, Revision> = {
            let mut samples = self.samples.lock();
            samples.push_back((
                now,
                revisions
                    .iter()
                    .map(|(k, (r, _))| (k.clone(), *r))
                    .collect(),
            ));
            while samples
                .get(1)
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= self.lag)
            {
                samples.pop_front();
            }
            let Some((_, newest)) = samples.back() else {
                return;
            };
            newest
                .keys()
                .filter_map(|key| {
                    let oldest = samples.iter().find_map(|(_, s)| s.get(key))?;
                    let floor = revisions.get(key).map_or(0, |(_, f)| *f);
                    Some((key.clone(), (*oldest).max(floor)))
                })
                .collect()
        };
        if due.is_empty() {
            return;
        }
        if let Err(e) = self.write(&due) {
            tracing::warn!(path = %self.path.display(), error = %e, "writing resume points failed");
        }
    }

    fn write(&self, points: &HashMap<Key, Revision>) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, format(points))?;
        std::fs::rename(&tmp, &self.path)
    }
}

fn format(points: &HashMap<Key, Revision>) -> String {
    let mut rows: Vec<_> = points.iter().collect();
    rows.sort();
    let mut out = String::new();
    for ((group, resource), rev) in rows {
        let group = if group.is_empty() { "-" } else { group };
        let _ = writeln!(out, "{group} {resource} {rev}");
    }
    out
}

/// The lines that read as points; any other line is skipped.
fn parse(text: &str) -> HashMap<Key, Revision> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (group, resource, rev) = (words.next()?, words.next()?, words.next()?);
            let rev = rev.parse::<Revision>().ok().filter(|r| *r > 0)?;
            let group = if group == "-" { "" } else { group };
            words
                .next()
                .is_none()
                .then(|| ((group.to_string(), resource.to_string()), rev))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(g: &str, r: &str) -> Key {
        (g.to_string(), r.to_string())
    }

    #[test]
    fn points_are_written_lag_behind_and_read_back_once() {
        let dir = tempfile::tempdir().unwrap();
        let lag = Duration::from_secs(60);
        let points = ResumePoints::open(dir.path(), lag);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let read = || {
            let again = ResumePoints::open(dir.path(), lag);
            (
                again.take(&key("", "pods")),
                again.take(&key("apps", "deployments")),
            )
        };
        // Nothing cached yet at the first tick.
        points.tick(at(0), HashMap::new());
        assert!(!dir.path().join("resume-points").exists());
        points.tick(
            at(1),
            HashMap::from([
                (key("", "pods"), (10, 0)),
                (key("apps", "deployments"), (12, 0)),
            ]),
        );
        // Younger than the lag: the oldest sample there is.
        assert_eq!(read(), (Some(10), Some(12)));
        points.tick(
            at(30),
            HashMap::from([
                (key("", "pods"), (20, 0)),
                (key("apps", "deployments"), (22, 0)),
            ]),
        );
        assert_eq!(read(), (Some(10), Some(12)));
        points.tick(
            at(62),
            HashMap::from([
                (key("", "pods"), (30, 0)),
                (key("apps", "deployments"), (32, 0)),
            ]),
        );
        // The sample of 1 s is past the lag, and the one of 30 s not yet: still 1 s's.
        assert_eq!(read(), (Some(10), Some(12)));
        // A resource no longer cached is no longer written.
        points.tick(at(95), HashMap::from([(key("", "pods"), (40, 0))]));
        assert_eq!(read(), (Some(20), None));
        let again = ResumePoints::open(dir.path(), lag);
        assert_eq!(again.take(&key("", "pods")), Some(20));
        assert_eq!(again.take(&key("", "pods")), None, "taken once");
        assert_eq!(again.take(&key("", "secrets")), None);
    }

    #[test]
    fn a_point_is_never_older_than_the_last_full_list() {
        let dir = tempfile::tempdir().unwrap();
        let lag = Duration::from_secs(60);
        let points = ResumePoints::open(dir.path(), lag);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let read = || ResumePoints::open(dir.path(), lag).take(&key("", "pods"));
        points.tick(at(0), HashMap::from([(key("", "pods"), (10, 5))]));
        points.tick(at(30), HashMap::from([(key("", "pods"), (20, 5))]));
        assert_eq!(read(), Some(10));
        // Resynced at 40 (the upstream restarted): 10 is behind anything it serves.
        points.tick(at(45), HashMap::from([(key("", "pods"), (41, 40))]));
        assert_eq!(read(), Some(40));
        // Once the lag has passed the resync, the samples lead again.
        points.tick(at(110), HashMap::from([(key("", "pods"), (60, 40))]));
        assert_eq!(read(), Some(41));
    }

    #[test]
    fn lines_that_are_not_points_are_skipped() {
        let read = parse(
            "- pods 5\napps deployments x\n- secrets 0\nbad\n- nodes 7 extra\n\n- events 9\n",
        );
        assert_eq!(
            read,
            HashMap::from([(key("", "pods"), 5), (key("", "events"), 9)])
        );
    }

    #[test]
    fn a_missing_file_is_no_points() {
        let dir = tempfile::tempdir().unwrap();
        let points = ResumePoints::open(&dir.path().join("absent"), Duration::from_secs(1));
        assert_eq!(points.take(&key("", "pods")), None);
    }
}
