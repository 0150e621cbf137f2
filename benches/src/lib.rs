//! svc-benches: fixtures shared by the criterion benchmarks in `benches/` (realistic
//! ServiceAccount objects, filled watch caches).
// Harness code: fixture sizes and counters for the benchmarks may use plain arithmetic and
// indexing; it still neither unwraps nor panics.
#![allow(clippy::arithmetic_side_effects, clippy::indexing_slicing)]

use bytes::Bytes;
use svc_core::Resource;
use svc_core::kinds::{ObjectReference, ServiceAccount};
use svc_core::object::encode_for_store;
use svc_core::watch::{KindCodec, WatchCache, WatchCacheConfig};
use svc_storage::{Event, EventKind, KeyValue, Revision};

/// A stored ServiceAccount of about 450 bytes of JSON: uid, timestamp, labels, an
/// annotation and a secret, like the ones a cluster is full of.
pub fn sa_kv(ns: &str, name: &str, generation: u64, rev: Revision) -> KeyValue {
    let mut sa = ServiceAccount::default();
    sa.set_type_meta();
    let m = &mut sa.metadata;
    m.name = name.into();
    m.namespace = ns.into();
    m.uid = format!("6f1d3c0e-8a51-4c2b-9f7e-{rev:012}");
    m.labels = [
        ("app", "bench"),
        ("tier", if rev % 2 == 0 { "frontend" } else { "backend" }),
        ("team", "platform"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    m.annotations
        .insert("bench.svc.io/generation".into(), generation.to_string());
    sa.secrets.push(ObjectReference {
        name: format!("{name}-token"),
        ..Default::default()
    });
    sa.automount_service_account_token = Some(false);
    KeyValue {
        key: Bytes::from(ServiceAccount::INFO.key(ns, name)),
        value: Bytes::from(encode_for_store(&sa).unwrap_or_default()),
        create_revision: rev,
        mod_revision: rev,
        version: 1,
    }
}

pub fn put(ns: &str, name: &str, generation: u64, rev: Revision) -> Event {
    Event {
        kind: EventKind::Put,
        kv: sa_kv(ns, name, generation, rev),
        prev_kv: None,
    }
}

/// The namespace of object `i` when `n` objects are spread over `namespaces`.
pub fn namespace_of(i: usize, namespaces: usize) -> String {
    format!("ns-{:04}", i % namespaces.max(1))
}

/// A ServiceAccount cache filled with `objects` objects over `namespaces` namespaces, at
/// revision `objects + 1`.
pub fn filled_cache(
    config: WatchCacheConfig,
    objects: usize,
    namespaces: usize,
    now: std::time::Instant,
) -> (WatchCache, Revision) {
    let cache = WatchCache::new(KindCodec::with_protobuf::<ServiceAccount>(), config);
    let kvs: Vec<KeyValue> = (0..objects)
        .map(|i| {
            sa_kv(
                &namespace_of(i, namespaces),
                &format!("sa-{i:07}"),
                0,
                i as i64 + 1,
            )
        })
        .collect();
    let rev = objects as i64 + 1;
    cache.replace(&kvs, rev, now);
    (cache, rev)
}
