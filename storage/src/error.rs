//! The one error type of the storage boundary.

use crate::{KeyValue, Revision};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("key not found")]
    NotFound,
    #[error("key already exists")]
    AlreadyExists { current: Box<KeyValue> },
    #[error("revision conflict: key is at revision {}", current.mod_revision)]
    Conflict { current: Box<KeyValue> },
    #[error("required revision {requested} has been compacted (compacted at {compacted})")]
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    #[error("revision {requested} is newer than the current revision {current}")]
    FutureRevision {
        requested: Revision,
        current: Revision,
    },
    #[error("stored data is corrupt at {location}: {detail}")]
    Corrupt { location: String, detail: String },
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A commit failed (a full disk, a failed fsync): the write was not acknowledged. The
    /// text names the cause as the operating system reported it.
    #[error("storage write failed: {0}")]
    WriteFailed(String),
    #[error("store is closed")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[source] std::io::Error),
    #[error("backend error: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}
