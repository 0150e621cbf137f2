//! The data file as redb sees it: redb's own `FileBackend`, with a switch that makes the next
//! fsyncs fail, so the failure path of group commit is tested against redb itself.
//!
//! Every call is forwarded unchanged (locks included, so a second open of the same file is
//! still refused). The switch is only reachable through `EmbeddedStore::inject_sync_failures`
//! with the `fault-injection` feature; otherwise it stays at zero and costs one atomic load
//! per fsync.

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// Faults to inject into the data file, shared by every open of it.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// How many of the next `sync_data` calls fail (with `EIO`, as a failing disk reports).
    fail_syncs: AtomicU32,
}

impl Faults {
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub(crate) fn fail_next_syncs(&self, n: u32) {
        self.fail_syncs.store(n, Ordering::Release);
    }

    fn take_sync_failure(&self) -> bool {
        self.fail_syncs
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }
}

#[derive(Debug)]
pub(crate) struct DataFile {
    inner: FileBackend,
    faults: Arc<Faults>,
}

impl DataFile {
    /// Opens an existing data file for reading and writing.
    pub(crate) fn open(path: &Path, faults: Arc<Faults>) -> io::Result<Self> {
        let file: File = OpenOptions::new().read(true).write(true).open(path)?;
        let inner = FileBackend::new(file).map_err(io::Error::other)?;
        Ok(DataFile { inner, faults })
    }
}

impl StorageBackend for DataFile {
    fn len(&self) -> Result<u64, io::Error> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        if self.faults.take_sync_failure() {
            return Err(io::Error::from_raw_os_error(5)); // EIO
        }
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.inner.write(offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
