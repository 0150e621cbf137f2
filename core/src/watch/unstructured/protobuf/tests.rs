//! The encoder against Kubernetes' published `.proto` messages (the `k8s-pb` crate, compiled
//! from them by others): each object written from JSON decodes there to the same values.

#![allow(clippy::arithmetic_side_effects)]

use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message;
use serde_json::json;

use super::*;

fn encode_value(v: serde_json::Value) -> Vec<u8> {
    encode(&serde_json::to_vec(&v).unwrap()).unwrap()
}

#[test]
fn the_schema_parses_and_knows_the_common_kinds() {
    let schema = SCHEMA.as_ref().unwrap();
    assert!(schema.messages.len() > 500, "{}", schema.messages.len());
    for (v, k) in [
        ("v1", "Pod"),
        ("v1", "ConfigMap"),
        ("v1", "Node"),
        ("apps/v1", "Deployment"),
        ("events.k8s.io/v1", "Event"),
        ("certificates.k8s.io/v1", "CertificateSigningRequest"),
        ("discovery.k8s.io/v1", "EndpointSlice"),
    ] {
        assert!(has_kind(v, k), "{v} {k}");
    }
    assert!(!has_kind("v1", "PodList"));
    assert!(!has_kind("stable.example.com/v1", "CronTab"));
}

#[test]
fn a_pod_decodes_to_the_same_values() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "web-0", "namespace": "prod", "uid": "1f0e", "resourceVersion": "42",
            "generation": 3, "creationTimestamp": "2026-11-27T06:30:00Z",
            "deletionTimestamp": "2026-11-27T06:31:05Z", "deletionGracePeriodSeconds": 0,
            "labels": {"b": "2", "a": "1"}, "annotations": {"note": "x"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                "uid": "99", "controller": true}],
            "finalizers": ["example.com/keep"],
            "managedFields": [{"manager": "kubectl", "operation": "Apply",
                "apiVersion": "v1", "time": "2026-11-27T06:30:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {}}}}]
        },
        "spec": {
            "nodeName": "node-7", "priority": -5, "hostNetwork": false,
            "containers": [{
                "name": "app", "image": "nginx", "args": ["-g", "daemon off;"],
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                    "periodSeconds": 5},
                "livenessProbe": {"tcpSocket": {"port": 8080}}
            }],
            "volumes": [{"name": "cfg", "configMap": {"name": "web-config", "defaultMode": 420}}],
            "tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 300}]
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True",
            "lastTransitionTime": "2026-11-27T06:30:09Z"}]}
    });
    let bytes = encode_value(pod);
    let p = core::Pod::decode(bytes.as_slice()).unwrap();
    let m = p.metadata.unwrap();
    assert_eq!(m.name.as_deref(), Some("web-0"));
    assert_eq!(m.namespace.as_deref(), Some("prod"));
    assert_eq!(m.resource_version.as_deref(), Some("42"));
    assert_eq!(m.generation, Some(3));
    assert_eq!(m.creation_timestamp.unwrap().seconds, Some(1_795_761_000));
    assert_eq!(m.deletion_timestamp.unwrap().seconds, Some(1_795_761_065));
    assert_eq!(m.deletion_grace_period_seconds, Some(0));
    assert_eq!(m.labels.get("a").map(String::as_str), Some("1"));
    assert_eq!(m.labels.len(), 2);
    assert_eq!(m.annotations.get("note").map(String::as_str), Some("x"));
    assert_eq!(m.owner_references[0].controller, Some(true));
    assert_eq!(m.finalizers, ["example.com/keep"]);
    let mf = &m.managed_fields[0];
    assert_eq!(mf.manager.as_deref(), Some("kubectl"));
    let raw = mf.fields_v1.as_ref().unwrap().raw.as_deref().unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(raw).unwrap(),
        json!({"f:metadata": {"f:labels": {}}})
    );
    let spec = p.spec.unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("node-7"));
    assert_eq!(spec.priority, Some(-5));
    assert_eq!(spec.host_network, Some(false));
    let c = &spec.containers[0];
    assert_eq!(c.args, ["-g", "daemon off;"]);
    assert_eq!(c.ports[0].container_port, Some(8080));
    let limits = &c.resources.as_ref().unwrap().limits;
    assert_eq!(limits.get("cpu").unwrap().string.as_deref(), Some("500m"));
    assert_eq!(
        limits.get("memory").unwrap().string.as_deref(),
        Some("128Mi")
    );
    // ProbeHandler is inlined in the JSON and a message of its own on the wire.
    let ready = c.readiness_probe.as_ref().unwrap();
    assert_eq!(ready.period_seconds, Some(5));
    let get = ready.handler.as_ref().unwrap().http_get.as_ref().unwrap();
    assert_eq!(get.path.as_deref(), Some("/healthz"));
    let port = get.port.as_ref().unwrap();
    assert_eq!(
        (port.r#type, port.str_val.as_deref()),
        (Some(1), Some("http"))
    );
    let live = c.liveness_probe.as_ref().unwrap().handler.as_ref().unwrap();
    let port = live.tcp_socket.as_ref().unwrap().port.as_ref().unwrap();
    assert_eq!((port.r#type, port.int_val), (Some(0), Some(8080)));
    let vol = &spec.volumes[0];
    let cm = vol
        .volume_source
        .as_ref()
        .unwrap()
        .config_map
        .as_ref()
        .unwrap();
    assert_eq!(cm.default_mode, Some(420));
    let name = cm.local_object_reference.as_ref().unwrap().name.as_deref();
    assert_eq!(name, Some("web-config"));
    assert_eq!(spec.tolerations[0].toleration_seconds, Some(300));
    let status = p.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let t = status.conditions[0].last_transition_time.as_ref().unwrap();
    assert_eq!(t.seconds, Some(1_795_761_009));
}

#[test]
fn fields_come_in_number_order_and_go_values_are_written_when_absent() {
    let bytes = encode_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c"}, "data": {"z": "1", "a": "2"}}));
    let keys = top_level_keys(&bytes);
    assert_eq!(keys, [1, 2, 2], "metadata, then data's two entries");
    let cm = core::ConfigMap::decode(bytes.as_slice()).unwrap();
    assert_eq!(cm.immutable, None, "a pointer absent stays absent");
    let m = cm.metadata.unwrap();
    // ObjectMeta's value fields (namespace, uid, ...) are there, empty, as Go writes them.
    assert_eq!(m.namespace.as_deref(), Some(""));
    assert_eq!(m.generation, Some(0));
    // A zero Time is an empty message: seconds unset, which Go reads as the zero time.
    assert_eq!(m.creation_timestamp, Some(meta::Time::default()));
    let data: Vec<_> = cm.data.into_iter().collect();
    assert_eq!(data.len(), 2);
    // Entries are written sorted by key, whatever the JSON's order.
    assert_eq!(first_map_key(&bytes), "a");
}

#[test]
fn bytes_microtime_and_wrapped_lists() {
    let cm = encode_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c"}, "binaryData": {"bin": "AAEC/w=="}}));
    let cm = core::ConfigMap::decode(cm.as_slice()).unwrap();
    assert_eq!(cm.binary_data.get("bin").unwrap(), &[0, 1, 2, 255]);

    let ev = encode_value(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e"}, "eventTime": "2026-11-27T06:30:00.123456Z",
        "series": {"count": 2, "lastObservedTime": "2026-11-27T06:30:01.000001Z"},
        "reportingController": "c", "reportingInstance": "i", "action": "A", "reason": "R",
        "regarding": {"kind": "Pod", "name": "p", "namespace": "n"}}));
    let ev = k8s_pb::api::events::v1::Event::decode(ev.as_slice()).unwrap();
    let t = ev.event_time.unwrap();
    assert_eq!(
        (t.seconds, t.nanos),
        (Some(1_795_761_000), Some(123_456_000))
    );
    assert_eq!(ev.series.unwrap().count, Some(2));
    assert_eq!(ev.regarding.unwrap().namespace.as_deref(), Some("n"));

    let csr = encode_value(json!({"apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest", "metadata": {"name": "csr"},
        "spec": {"request": "LS0t", "signerName": "example.com/s", "usages": ["client auth"],
            "extra": {"scopes": ["a", "b"]}, "expirationSeconds": 600}}));
    let csr = k8s_pb::api::certificates::v1::CertificateSigningRequest::decode(csr.as_slice());
    let spec = csr.unwrap().spec.unwrap();
    assert_eq!(spec.request.as_deref(), Some(&b"---"[..]));
    assert_eq!(spec.extra.get("scopes").unwrap().items, ["a", "b"]);
    assert_eq!(spec.expiration_seconds, Some(600));
}

#[test]
fn intorstring_quantity_and_negative_numbers() {
    let d = encode_value(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"replicas": 3, "strategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"spec": {"containers": [{"name": "c",
                "resources": {"requests": {"cpu": 1}}}]}}}}));
    let d = k8s_pb::api::apps::v1::Deployment::decode(d.as_slice()).unwrap();
    let spec = d.spec.unwrap();
    assert_eq!(spec.replicas, Some(3));
    let ru = spec.strategy.unwrap().rolling_update.unwrap();
    assert_eq!(ru.max_surge.unwrap().str_val.as_deref(), Some("25%"));
    let mu = ru.max_unavailable.unwrap();
    assert_eq!((mu.r#type, mu.int_val), (Some(0), Some(0)));
    let c = &spec.template.unwrap().spec.unwrap().containers[0];
    let cpu = c.resources.as_ref().unwrap().requests.get("cpu").unwrap();
    assert_eq!(cpu.string.as_deref(), Some("1"));
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    for bad in [
        &br#"{"apiVersion":"v1","kind":"Pod","metadata":{"creationTimestamp":"yesterday"}}"#[..],
        br#"{"apiVersion":"v1","kind":"ConfigMap","binaryData":{"x":"%%%"}}"#,
        br#"{"apiVersion":"example.com/v1","kind":"Widget"}"#,
        b"[1,2",
    ] {
        assert!(encode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
    // Values of the wrong JSON type are read as the zero value, not rejected.
    let p = encode(br#"{"apiVersion":"v1","kind":"Pod","spec":{"priority":"x","containers":{}}}"#);
    assert!(p.is_ok());
}

#[test]
fn go_durations() {
    assert_eq!(go_duration("0"), Some(0));
    assert_eq!(go_duration("1h2m3.5s"), Some(3_723_500_000_000));
    assert_eq!(go_duration("-40ms"), Some(-40_000_000));
    assert_eq!(go_duration("1.5µs"), Some(1_500));
    assert_eq!(go_duration("3"), None);
    assert_eq!(go_duration("3d"), None);
}

fn read_varint(b: &[u8], i: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let byte = b[*i];
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// The field numbers of a message's top level, in the order written (all length-delimited).
fn top_level_keys(b: &[u8]) -> Vec<u64> {
    let (mut i, mut keys) = (0, vec![]);
    while i < b.len() {
        let key = read_varint(b, &mut i);
        assert_eq!(key & 7, 2);
        let len = read_varint(b, &mut i) as usize;
        keys.push(key >> 3);
        i += len;
    }
    keys
}

/// The key of the first map entry (field 2) of a ConfigMap.
fn first_map_key(b: &[u8]) -> String {
    let mut i = 0;
    loop {
        let key = read_varint(b, &mut i);
        let len = read_varint(b, &mut i) as usize;
        if key >> 3 == 2 {
            let entry = &b[i..i + len];
            let mut j = 1;
            let klen = read_varint(entry, &mut j) as usize;
            return String::from_utf8(entry[j..j + klen].to_vec()).unwrap();
        }
        i += len;
    }
}
