//! Encoding cost per media type, and what gzip costs and saves at each body size.
//!
//! Measures:
//! - `object/{json,yaml,protobuf,cbor}`: one typical ServiceAccount (~450 bytes of JSON);
//! - `object/unstructured_pod_protobuf`: proxy mode's protobuf of a built-in kind, a 2.5 KB
//!   pod's JSON written with the schema (`svc_core::watch::unstructured::protobuf`), paid once
//!   per event and per object for protobuf watchers and lists;
//! - `list10k/{json_splice,yaml,protobuf,cbor}`: a 10,000-item list body (JSON splices the
//!   cached canonical bytes; the others re-encode);
//! - `gzip/{1KiB,4KiB,16KiB,64KiB,1MiB}`: gzip level 1 (`flate2`, miniz_oxide) of list JSON
//!   of that size, including the encoder's setup, so the fixed cost shows at small sizes.
//!
//! Run: `cargo bench -p svc-benches --bench encode` (quick: `-- --warm-up-time 1
//! --measurement-time 3`).
//!
//! Last results (2-core shared VM, noisy; 2026-11-23, `--measurement-time 2`):
//! - object: json 0.33 µs, yaml 3.3 µs, protobuf 0.43 µs, cbor 0.34 µs; proxy mode's pod
//!   as protobuf 24.6 µs (2026-11-27, `--measurement-time 3`), of which reading the JSON into
//!   a `serde_json::Value` is 14.8 µs: paid once per event, whatever the watchers
//! - list of 10,000: json splice 0.64 ms, yaml 37 ms, protobuf 1.16 ms (items' messages
//!   cached after the first list), cbor 3.9 ms
//! - gzip level 1, setup included: 1 KiB 11.8 µs, 4 KiB 14.8 µs, 16 KiB 20.1 µs, 64 KiB
//!   41 µs, 1 MiB 0.60 ms (≈ 0.6 ms per MiB on this synthetic list, which shrinks 19.7×;
//!   real lists vary less and compress less, ~5–10×)
//!
//! The spec compresses every get and list whose client accepts gzip, whatever its size, and
//! so does the server by default. An operator who would rather spend no CPU on small bodies
//! sets `--response-compression-min-bytes` (gateway/src/config.rs); these figures say where:
//! the encoder has a fixed cost of ~11 µs (setting up its tables) whatever the size. At
//! 4 KiB it spends ~15 µs to save ~3.5 KiB, about 28 µs of a 1 Gbit/s link: a wash. At
//! 16 KiB it spends ~20 µs to save ~14 KiB, ~0.11 ms of the same link, and from there the
//! saving grows linearly while the cost per byte falls below 1 ns. So 16384 is a sensible
//! floor on a fast link (Kubernetes uses 128 KiB); on a slow link, keep the default 0.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io::Write;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use svc_benches::sa_kv;
use svc_core::ListMeta;
use svc_core::codec::{ProtoKind, cbor, encode_list_protobuf_raw, yaml};
use svc_core::kinds::ServiceAccount;
use svc_core::object::decode_from_store;
use svc_core::watch::{CachedObject, KindCodec, cached::ingest, frames};

fn objects(n: usize) -> Vec<Arc<CachedObject>> {
    (0..n)
        .map(|i| {
            Arc::new(
                ingest::<ServiceAccount>(&sa_kv("bench", &format!("sa-{i:06}"), 1, i as i64 + 1))
                    .unwrap(),
            )
        })
        .collect()
}

/// A scheduled pod of about 2.5 KB, shaped as kube-apiserver writes one.
fn pod_json() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": "web-7d4b9c-x2x9q", "generateName": "web-7d4b9c-", "namespace": "prod",
            "uid": "0f6c2a40-5b8e-4c1e-9f57-3f1f0f6e2b11", "resourceVersion": "123456",
            "creationTimestamp": "2026-11-27T06:30:00Z",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c",
                "uid": "6a1c1f4e-8a55-4f0e-9a3b-5c3e7d1e2f00", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                "apiVersion": "v1", "time": "2026-11-27T06:30:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {}}}}}}]},
        "spec": {"volumes": [{"name": "kube-api-access-abcde", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}],
                "defaultMode": 420}}],
            "containers": [{"name": "app", "image": "registry.example.com/web:1.2.3",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
                    "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
                "volumeMounts": [{"name": "kube-api-access-abcde", "readOnly": true,
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "nodeName": "node-0042",
            "securityContext": {}, "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"},
        "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-27T06:30:09Z"}],
            "hostIP": "10.0.0.42", "podIP": "10.244.3.17", "podIPs": [{"ip": "10.244.3.17"}],
            "startTime": "2026-11-27T06:30:00Z", "qosClass": "Burstable",
            "containerStatuses": [{"name": "app", "state": {"running": {"startedAt": "2026-11-27T06:30:05Z"}},
                "ready": true, "restartCount": 0, "image": "registry.example.com/web:1.2.3",
                "imageID": "registry.example.com/web@sha256:0123", "containerID": "containerd://abc", "started": true}]}
    }))
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let kv = sa_kv("bench", "one", 1, 42);
    let sa: ServiceAccount = decode_from_store(&kv).unwrap();
    let mut g = c.benchmark_group("object");
    g.bench_function("json", |b| b.iter(|| serde_json::to_vec(&sa).unwrap()));
    g.bench_function("yaml", |b| b.iter(|| yaml::encode(&sa).unwrap()));
    g.bench_function("protobuf", |b| b.iter(|| sa.to_proto_bytes()));
    g.bench_function("cbor", |b| b.iter(|| cbor::encode(&sa).unwrap()));
    // Proxy mode: a pod as kube-apiserver sends it, written as protobuf by the schema.
    let pod = pod_json();
    g.bench_function("unstructured_pod_protobuf", |b| {
        b.iter(|| svc_core::watch::unstructured::protobuf::encode(&pod).unwrap())
    });
    g.finish();

    let items = objects(10_000);
    let meta = ListMeta {
        resource_version: "10000".into(),
        ..Default::default()
    };
    let codec = KindCodec::with_protobuf::<ServiceAccount>();
    let mut g = c.benchmark_group("list10k");
    g.sample_size(10);
    g.bench_function("json_splice", |b| {
        b.iter(|| frames::list_json("v1", "ServiceAccountList", &meta, &items, false).unwrap())
    });
    let whole: serde_json::Value = serde_json::from_slice(
        &frames::list_json("v1", "ServiceAccountList", &meta, &items, false).unwrap(),
    )
    .unwrap();
    g.bench_function("yaml", |b| b.iter(|| yaml::encode(&whole).unwrap()));
    g.bench_function("protobuf", |b| {
        b.iter(|| {
            let raws: Vec<bytes::Bytes> =
                items.iter().map(|o| o.protobuf(&codec).unwrap()).collect();
            encode_list_protobuf_raw("v1", "ServiceAccountList", &meta, raws)
        })
    });
    g.bench_function("cbor", |b| b.iter(|| cbor::encode(&whole).unwrap()));
    g.finish();

    let body = frames::list_json("v1", "ServiceAccountList", &meta, &items, false).unwrap();
    let mut g = c.benchmark_group("gzip");
    for (label, size) in [
        ("1KiB", 1 << 10),
        ("4KiB", 4 << 10),
        ("16KiB", 16 << 10),
        ("64KiB", 64 << 10),
        ("1MiB", 1 << 20),
    ] {
        let input = &body[..size.min(body.len())];
        g.bench_with_input(BenchmarkId::from_parameter(label), input, |b, input| {
            b.iter(|| {
                let mut enc = flate2::write::GzEncoder::new(
                    Vec::with_capacity(input.len() / 4),
                    flate2::Compression::fast(),
                );
                enc.write_all(input).unwrap();
                enc.finish().unwrap()
            })
        });
    }
    g.finish();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&body[..1 << 20]).unwrap();
    let gz = enc.finish().unwrap();
    eprintln!(
        "gzip level 1: 1 MiB of list JSON -> {} bytes ({:.1}x)",
        gz.len(),
        (1 << 20) as f64 / gz.len() as f64
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
