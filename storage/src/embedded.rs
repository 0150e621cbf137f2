//! The embedded engine: the default `Store`, one data directory on redb, no other process.
//!
//! - **Durability**: a write is acknowledged only after the redb transaction holding it was
//!   committed with `Durability::Immediate` (fsync). Writes go through one committer thread
//!   that commits everything queued in one transaction (group commit), so concurrent writers
//!   share an fsync (`committer`).
//! - **Integrity**: every record carries a CRC32 checked on read (`codec`); open checks the
//!   meta records and the tail of the event log before serving (`recovery`).
//! - **History**: reads at past revisions and feed replay come from the `history` and `log`
//!   tables (`tables`), trimmed by compaction (`compaction`).
//! - **Feed**: live batches from the committer plus replay from the log (`feed`).
//! - **Failed commits**: a commit that fails (a full disk, a failed fsync) fails every write of
//!   its batch with `WriteFailed` and acknowledges none. redb then refuses the file until it
//!   is reopened, so the committer closes and reopens it at once (redb repairs, every page
//!   checksum and our own checks are verified), and reads and watches carry on. `ready`
//!   reports the failure until a commit succeeds again: the committer probes with a write of
//!   the failed batch's size every second, so it recovers by itself once space returns
//!   (`committer`).
//! - **Expiry**: keys written with a time to live have their deadline in the `expiry` table
//!   (`tables`); the committer deletes them when it passes (`committer`), after a restart too.

mod codec;
mod committer;
mod compaction;
mod feed;
mod file;
mod recovery;
mod tables;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{broadcast, mpsc, oneshot};

use self::committer::{Batch, Committer, Op, Reply, Request};
use self::file::Faults;
use self::tables::Snapshot;
use crate::{FeedStream, KeyRange, KeyValue, RangeResult, Revision, Store, StoreError};

pub use self::recovery::DATA_FILE;

/// Background compaction policy of the embedded engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoCompaction {
    /// History is only discarded by explicit `compact` calls.
    Disabled,
    /// Keep the history of the last `Duration` (measured from commit times in this process;
    /// history written before a restart counts as written at the restart).
    Retention(Duration),
    /// Keep the last `n` revisions of history.
    Revisions(u64),
}

/// Tuning of the embedded engine. `Default` is what the server uses.
#[derive(Clone, Debug)]
pub struct EmbeddedConfig {
    /// A watcher that delivered nothing for this long gets a `Progress` item. Default 1 s.
    pub progress_interval: Duration,
    /// Background compaction. Default: `Retention(10 minutes)`.
    pub auto_compaction: AutoCompaction,
    /// How often the background policy is evaluated. Default 10 s.
    pub compaction_check_interval: Duration,
    /// Most write requests committed in one transaction (one fsync). Default 1024.
    pub max_batch: usize,
    /// A batch stops growing once its keys and values reach this many bytes (a single
    /// larger write still goes through, alone). Default 64 MiB.
    pub max_batch_bytes: usize,
    /// Bound of the queue of writes waiting for the committer. Default 4096.
    pub queue_capacity: usize,
    /// Committed batches buffered for live watchers; a watcher further behind than this
    /// replays from the log instead. Default 256.
    pub feed_capacity: usize,
    /// Most revisions a watcher reads from the log per step when replaying. Default 1024.
    pub replay_chunk: u64,
    /// Most revisions compacted per transaction (writes run between chunks). Default 4096.
    pub compaction_chunk: u64,
    /// Number of newest event-log entries verified at open. Default 1024.
    pub verify_tail: u64,
    /// Verify every redb page checksum at open (reads the whole file once). redb always
    /// does so after an unclean shutdown; this also catches damage done while closed.
    /// Default true.
    pub verify_file_on_open: bool,
    /// redb page cache, in bytes. Default 256 MiB.
    pub cache_size: usize,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        EmbeddedConfig {
            progress_interval: Duration::from_secs(1),
            auto_compaction: AutoCompaction::Retention(Duration::from_secs(600)),
            compaction_check_interval: Duration::from_secs(10),
            max_batch: 1024,
            max_batch_bytes: 64 * 1024 * 1024,
            queue_capacity: 4096,
            feed_capacity: 256,
            replay_chunk: 1024,
            compaction_chunk: 4096,
            verify_tail: 1024,
            verify_file_on_open: true,
            cache_size: 256 * 1024 * 1024,
        }
    }
}

/// Counters of an open store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbeddedStats {
    pub revision: Revision,
    pub compacted: Revision,
    /// Write transactions committed (each one fsync) since open.
    pub commits: u64,
}

/// What the committer publishes for everyone else to read without touching redb.
pub(crate) struct Published {
    pub(crate) revision: AtomicI64,
    pub(crate) compacted: AtomicI64,
    pub(crate) batches: AtomicU64,
    pub(crate) closed: AtomicBool,
    /// Why the last commit failed, until one succeeds again (`ready` reports it).
    pub(crate) write_failure: Mutex<Option<String>>,
}

/// State shared by the store handle, the committer and (weakly) the watchers.
pub(crate) struct EngineState {
    /// The open data file; `None` only while the committer reopens it after a failed commit
    /// (and for as long as that reopen keeps failing).
    db: RwLock<Option<Arc<redb::Database>>>,
    pub(crate) config: EmbeddedConfig,
    pub(crate) published: Published,
    pub(crate) dir: PathBuf,
    pub(crate) faults: Arc<Faults>,
}

impl EngineState {
    /// The open database, for one read or one write transaction. Callers must not keep it
    /// longer: the committer waits for these handles to go before it reopens the file.
    pub(crate) fn db(&self) -> Result<Arc<redb::Database>, StoreError> {
        self.db.read().clone().ok_or_else(|| {
            StoreError::Unavailable(
                "the data file is being reopened after a failed commit".to_string(),
            )
        })
    }
}

/// The embedded `Store`. Dropping the last handle (or `close`) stops the committer after it
/// answered every queued write, and ends every change feed.
pub struct EmbeddedStore {
    shared: Arc<EngineState>,
    requests: mpsc::Sender<Request>,
    // Weak so that the committer holds the only sender: its exit closes every feed.
    feed: broadcast::WeakSender<Batch>,
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    committer: Mutex<Option<JoinHandle<()>>>,
    dir: PathBuf,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `dir`. Fails with `Corrupt` if the data does not pass
    /// the open-time checks, and `Unavailable` if the directory is already open.
    pub fn open(dir: &Path, mut config: EmbeddedConfig) -> Result<Arc<Self>, StoreError> {
        config.max_batch = config.max_batch.max(1);
        let faults = Arc::new(Faults::default());
        let (db, revision, compacted) = recovery::open(dir, &config, &faults)?;
        let shared = Arc::new(EngineState {
            db: RwLock::new(Some(Arc::new(db))),
            published: Published {
                revision: AtomicI64::new(revision),
                compacted: AtomicI64::new(compacted),
                batches: AtomicU64::new(0),
                closed: AtomicBool::new(false),
                write_failure: Mutex::new(None),
            },
            config,
            dir: dir.to_path_buf(),
            faults,
        });
        let (feed, _) = broadcast::channel(shared.config.feed_capacity.max(1));
        let weak_feed = feed.downgrade();
        let (requests, queue) = mpsc::channel(shared.config.queue_capacity.max(1));
        let (shutdown, shutdown_rx) = oneshot::channel();
        let committer = Committer::new(shared.clone(), feed, queue, shutdown_rx);
        let handle = std::thread::Builder::new()
            .name("svc-storage-committer".to_string())
            .spawn(move || committer.run())
            .map_err(StoreError::Io)?;
        Ok(Arc::new(EmbeddedStore {
            shared,
            requests,
            feed: weak_feed,
            shutdown: Mutex::new(Some(shutdown)),
            committer: Mutex::new(Some(handle)),
            dir: dir.to_path_buf(),
        }))
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stats(&self) -> EmbeddedStats {
        let published = &self.shared.published;
        EmbeddedStats {
            revision: published.revision.load(Ordering::Acquire),
            compacted: published.compacted.load(Ordering::Acquire),
            commits: published.batches.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting writes, waits until every queued write is answered, and ends the
    /// change feeds. Reads keep working until the last handle is dropped. Idempotent.
    pub fn close(&self) {
        if let Some(shutdown) = self.shutdown.lock().take() {
            let _ = shutdown.send(());
        }
        let handle = self.committer.lock().take();
        if let Some(handle) = handle
            && handle.join().is_err()
        {
            tracing::error!("storage committer thread panicked");
        }
    }

    /// FOR TESTS OF FAILED COMMITS: the next `n` fsyncs of the data file fail with `EIO`,
    /// inside redb, as a failing disk would make them.
    #[cfg(feature = "fault-injection")]
    pub fn inject_sync_failures(&self, n: u32) {
        self.shared.faults.fail_next_syncs(n);
    }

    /// FOR TESTS OF CORRUPT-OBJECT HANDLING: stores `raw` verbatim as `key`'s current record,
    /// bypassing encoding and checksums, without a revision or an event. Reads of the key
    /// then fail with `Corrupt` unless `raw` happens to be a valid record; an unconditional
    /// `delete` still removes it (the force-delete path). History is left untouched.
    pub async fn debug_put_raw(
        &self,
        key: impl Into<Bytes>,
        raw: impl Into<Bytes>,
    ) -> Result<(), StoreError> {
        self.submit(Op::PutRaw {
            key: key.into(),
            raw: raw.into(),
        })
        .await
        .map(|_| ())
    }

    /// FOR TESTS OF CORRUPT-OBJECT HANDLING: the stored bytes of `key`'s current record
    /// (checksum included), unverified, so a test can damage them and plant them back.
    pub async fn debug_get_raw(&self, key: impl Into<Bytes>) -> Result<Option<Bytes>, StoreError> {
        let key = key.into();
        self.read(move |snapshot| snapshot.current_raw(&key)).await
    }

    /// A create or update: answered with the key-value written.
    async fn put(&self, op: Op) -> Result<KeyValue, StoreError> {
        match self.submit(op).await? {
            Reply::Kv(kv) => Ok(kv),
            _ => Err(unexpected_reply()),
        }
    }

    async fn submit(&self, op: Op) -> Result<Reply, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request { op, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs a read on a blocking thread against one consistent snapshot.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Snapshot) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(&Snapshot::open(&*shared.db()?)?))
            .await
            .map_err(|err| StoreError::Unavailable(format!("read task failed: {err}")))?
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.close();
    }
}

fn unexpected_reply() -> StoreError {
    StoreError::Unavailable("committer gave an unexpected reply".to_string())
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn create(&self, key: Bytes, value: Bytes) -> Result<KeyValue, StoreError> {
        self.put(Op::Create {
            key,
            value,
            ttl: None,
        })
        .await
    }

    async fn update(
        &self,
        key: Bytes,
        value: Bytes,
        expected: Revision,
    ) -> Result<KeyValue, StoreError> {
        self.put(Op::Update {
            key,
            value,
            expected,
            ttl: None,
        })
        .await
    }

    async fn create_with_ttl(
        &self,
        key: Bytes,
        value: Bytes,
        ttl: Duration,
    ) -> Result<KeyValue, StoreError> {
        self.put(Op::Create {
            key,
            value,
            ttl: Some(ttl),
        })
        .await
    }

    async fn update_with_ttl(
        &self,
        key: Bytes,
        value: Bytes,
        expected: Revision,
        ttl: Duration,
    ) -> Result<KeyValue, StoreError> {
        self.put(Op::Update {
            key,
            value,
            expected,
            ttl: Some(ttl),
        })
        .await
    }

    /// An unconditional delete also removes a record that fails its checksum; the returned
    /// key-value then has only the key set (empty value, revisions 0), and the delete event
    /// carries no `prev_kv`.
    async fn delete(
        &self,
        key: Bytes,
        expected: Option<Revision>,
    ) -> Result<(KeyValue, Revision), StoreError> {
        match self.submit(Op::Delete { key, expected }).await? {
            Reply::Deleted(kv, revision) => Ok((kv, revision)),
            _ => Err(unexpected_reply()),
        }
    }

    async fn get(
        &self,
        key: Bytes,
        at: Option<Revision>,
    ) -> Result<(Option<KeyValue>, Revision), StoreError> {
        self.read(move |snapshot| {
            let kv = snapshot.get(&key, at)?;
            Ok((kv, at.unwrap_or(snapshot.revision)))
        })
        .await
    }

    async fn range(
        &self,
        range: KeyRange,
        at: Option<Revision>,
        limit: usize,
    ) -> Result<RangeResult, StoreError> {
        self.read(move |snapshot| snapshot.range(&range, at, limit))
            .await
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        Ok(self.shared.published.revision.load(Ordering::Acquire))
    }

    async fn compacted_revision(&self) -> Result<Revision, StoreError> {
        Ok(self.shared.published.compacted.load(Ordering::Acquire))
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        self.submit(Op::Compact { revision }).await.map(|_| ())
    }

    fn watch(&self, range: KeyRange, after: Revision) -> FeedStream {
        // Subscribe before the watcher reads the log: see `feed`.
        let live = self.feed.upgrade().map(|sender| sender.subscribe());
        feed::Watcher::start(&self.shared, live, range, after)
    }

    async fn health(&self) -> Result<(), StoreError> {
        if self.shared.published.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        self.read(|_| Ok(())).await
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.health().await?;
        match self.shared.published.write_failure.lock().clone() {
            Some(detail) => Err(StoreError::WriteFailed(detail)),
            None => Ok(()),
        }
    }
}
