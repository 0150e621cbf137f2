//! Write throughput of a store: N concurrent writers doing compare-and-swap updates of their
//! own key for D seconds; prints acknowledged writes/s, latency percentiles and, for the
//! embedded engine, how many commits (fsyncs) the group commit needed.
//!
//! ```text
//! cargo run -p svc-storage --release --example write_throughput -- \
//!     [--writers 64] [--seconds 5] [--value-size 256] [--dir PATH] [--etcd URL[,URL...]]
//! ```
//!
//! Without `--dir` the embedded engine writes into a fresh temporary directory (on the same
//! disk as `/tmp`). With `--etcd` the same load goes to that etcd cluster instead.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use svc_storage::{AutoCompaction, EmbeddedConfig, EmbeddedStore, EtcdConfig, EtcdStore, Store};

struct Args {
    writers: usize,
    seconds: u64,
    value_size: usize,
    dir: Option<PathBuf>,
    etcd: Option<Vec<String>>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        writers: 64,
        seconds: 5,
        value_size: 256,
        dir: None,
        etcd: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--writers" => {
                args.writers = value()?.parse().map_err(|e| format!("--writers: {e}"))?
            }
            "--seconds" => {
                args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?
            }
            "--value-size" => {
                args.value_size = value()?.parse().map_err(|e| format!("--value-size: {e}"))?
            }
            "--dir" => args.dir = Some(PathBuf::from(value()?)),
            "--etcd" => args.etcd = Some(value()?.split(',').map(str::to_string).collect()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let temp = tempfile::tempdir()?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    let (store, embedded): (Arc<dyn Store>, Option<Arc<EmbeddedStore>>) = match &args.etcd {
        Some(endpoints) => {
            let config = EtcdConfig {
                endpoints: endpoints.clone(),
                ..Default::default()
            };
            (EtcdStore::connect(config).await?, None)
        }
        None => {
            let config = EmbeddedConfig {
                auto_compaction: AutoCompaction::Disabled,
                ..Default::default()
            };
            let store = EmbeddedStore::open(&dir, config)?;
            (store.clone(), Some(store))
        }
    };
    let value = Bytes::from(vec![b'x'; args.value_size]);
    let commits_before = embedded.as_ref().map_or(0, |e| e.stats().commits);

    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        let store = store.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let key = Bytes::from(format!("/bench/{}/{w:04}", std::process::id()));
            let mut latencies = Vec::new();
            let t = Instant::now();
            let mut kv = store.create(key.clone(), value.clone()).await?;
            latencies.push(t.elapsed());
            while Instant::now() < deadline {
                let t = Instant::now();
                kv = store
                    .update(key.clone(), value.clone(), kv.mod_revision)
                    .await?;
                latencies.push(t.elapsed());
            }
            Ok::<_, svc_storage::StoreError>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed();
    let commits = embedded
        .as_ref()
        .map(|e| e.stats().commits - commits_before);
    latencies.sort();

    let writes = latencies.len();
    let rate = writes as f64 / elapsed.as_secs_f64();
    println!(
        "writers: {}, value size: {} B, duration: {elapsed:.2?}",
        args.writers, args.value_size
    );
    println!("acknowledged writes: {writes} ({rate:.0} writes/s)");
    println!(
        "latency: p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default()
    );
    if let Some(commits) = commits {
        println!(
            "commits (fsyncs): {commits} ({:.1} writes per fsync, {:.0} fsyncs/s)",
            writes as f64 / commits.max(1) as f64,
            commits as f64 / elapsed.as_secs_f64()
        );
    }
    Ok(())
}
