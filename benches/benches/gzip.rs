//! gzip level 1 of real list bodies, to choose flate2's backend (miniz_oxide or zlib-rs).
//!
//! Measures `gzip/{1k,10k}`: the JSON body of a list of 1,000 and 10,000 ServiceAccounts
//! (~450 B each over 100 namespaces, spliced by `frames::list_json` as the server serves it)
//! compressed the way the gateway does it (`gateway/src/pipeline.rs`, `gzip`: a
//! `GzEncoder` at `Compression::fast()` into a buffer of a quarter of the input, setup
//! included). Throughput is of the uncompressed body. The backend is whatever flate2 links:
//! a crate links one, so run the bench twice, in one sitting:
//!
//! Run: `cargo bench -p svc-benches --bench gzip` (miniz_oxide, flate2's default), then
//! `cargo bench -p svc-benches --bench gzip --features gzip-zlib-rs` (zlib-rs). The bench
//! prints the backend and the compression ratio, and checks that the output decompresses.
//!
//! Results (2 shared cores, AMD EPYC KVM guest, noisy; 2026-11-23; sample size 10, 3 s per
//! size; the two commands alternated three times in one sitting; MB/s = 10^6 bytes of JSON
//! per second, criterion's median estimate of each round, then the median of the three):
//!
//! | list | body | miniz_oxide MB/s | zlib-rs MB/s | miniz_oxide out | zlib-rs out |
//! |---:|---:|---|---|---:|---:|
//! | 1,000 | 351 KB | 2133, 1802, 2358 → **2133** | 2221, 1994, 2340 → **2221** | 20.2 KB (17.4×) | 27.3 KB (12.9×) |
//! | 10,000 | 3.5 MB | 1773, 1797, 1954 → **1797** | 1909, 1460, 2345 → **1909** | 206 KB (17.1×) | 272 KB (13.0×) |
//!
//! zlib-rs is 4–6% faster on the medians, well inside the round-to-round spread (±15–30%
//! for the same binary), so the speed is a tie; and its level 1 (zlib-ng's quick strategy)
//! writes 32–35% more bytes. The gateway keeps flate2's default, miniz_oxide.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use svc_benches::{namespace_of, sa_kv};
use svc_core::ListMeta;
use svc_core::kinds::ServiceAccount;
use svc_core::watch::{CachedObject, cached::ingest, frames};

const BACKEND: &str = if cfg!(feature = "gzip-zlib-rs") {
    "zlib-rs"
} else {
    "miniz_oxide"
};

fn list_body(n: usize) -> Vec<u8> {
    let items: Vec<Arc<CachedObject>> = (0..n)
        .map(|i| {
            let kv = sa_kv(
                &namespace_of(i, 100),
                &format!("sa-{i:07}"),
                1,
                i as i64 + 1,
            );
            Arc::new(ingest::<ServiceAccount>(&kv).unwrap())
        })
        .collect();
    let meta = ListMeta {
        resource_version: (n + 1).to_string(),
        ..Default::default()
    };
    frames::list_json("v1", "ServiceAccountList", &meta, &items, false).unwrap()
}

/// What the gateway does to a body (`pipeline::gzip`).
fn gzip(plain: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(plain.len() / 4),
        flate2::Compression::fast(),
    );
    enc.write_all(plain).unwrap();
    enc.finish().unwrap()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("gzip");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (label, n) in [("1k", 1_000), ("10k", 10_000)] {
        let body = list_body(n);
        let gz = gzip(&body);
        let mut back = Vec::with_capacity(body.len());
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(
            back, body,
            "{BACKEND}: gzip of the {label} list does not round-trip"
        );
        eprintln!(
            "gzip level 1 ({BACKEND}): list of {n} = {} bytes -> {} bytes ({:.1}x)",
            body.len(),
            gz.len(),
            body.len() as f64 / gz.len() as f64
        );
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(BenchmarkId::new(BACKEND, label), &body, |b, body| {
            b.iter(|| gzip(body))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
