//! What the embedded store's tests share: a configuration that reports progress quickly and
//! never compacts on its own (so each test decides when history goes), and keys from text.

#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use bytes::Bytes;
use svc_storage::{AutoCompaction, EmbeddedConfig};

pub fn config() -> EmbeddedConfig {
    EmbeddedConfig {
        progress_interval: Duration::from_millis(50),
        auto_compaction: AutoCompaction::Disabled,
        ..EmbeddedConfig::default()
    }
}

pub fn key(s: &str) -> Bytes {
    Bytes::from(s.to_string())
}
