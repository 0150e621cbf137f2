//! Every served kind through every codec, and our protobuf bytes read by an independent
//! decoder: Kubernetes' own published `.proto` messages, compiled (the `k8s-pb` crate).
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::BTreeMap;

use k8s_pb::api::core::v1 as k8s;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::Message;
use svc_core::codec::{PROTOBUF_MAGIC, ProtoKind, cbor, decode_protobuf, encode_protobuf, yaml};
use svc_core::kinds::{
    CertificateSigningRequest, CertificateSigningRequestCondition, Event, EventSeries, EventSource,
    LocalObjectReference, Namespace, ObjectReference, ServiceAccount,
};
use svc_core::meta::{ManagedFieldsEntry, MicroTime, OwnerReference, Time};
use svc_core::{ObjectMeta, Resource};

fn meta(name: &str, ns: &str) -> ObjectMeta {
    let t: Time = serde_json::from_str("\"2024-05-06T07:08:09Z\"").unwrap();
    ObjectMeta {
        name: name.into(),
        namespace: ns.into(),
        uid: "0b7c2c9e-1f7a-4c52-9d8f-2a3b4c5d6e7f".into(),
        resource_version: "42".into(),
        generation: Some(3),
        creation_timestamp: Some(t),
        labels: BTreeMap::from([("app".into(), "web".into()), ("tier".into(), "fe".into())]),
        annotations: BTreeMap::from([("svc.io/note".into(), "hello".into())]),
        finalizers: vec!["example.com/hold".into()],
        owner_references: vec![OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: "u-1".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }],
        managed_fields: vec![ManagedFieldsEntry {
            manager: "kubectl".into(),
            operation: "Apply".into(),
            api_version: "v1".into(),
            time: Some(t),
            fields_type: "FieldsV1".into(),
            fields_v1: Some(serde_json::json!({"f:metadata": {"f:labels": {"f:app": {}}}})),
            subresource: String::new(),
        }],
        ..Default::default()
    }
}

fn service_account() -> ServiceAccount {
    let mut sa = ServiceAccount {
        metadata: meta("builder", "ci"),
        secrets: vec![ObjectReference {
            name: "tok".into(),
            kind: "Secret".into(),
            ..Default::default()
        }],
        image_pull_secrets: vec![LocalObjectReference {
            name: "registry".into(),
        }],
        automount_service_account_token: Some(false),
        ..Default::default()
    };
    sa.set_type_meta();
    sa
}

fn namespace() -> Namespace {
    let mut ns = Namespace {
        metadata: meta("team-a", ""),
        ..Default::default()
    };
    ns.set_type_meta();
    ns.spec.finalizers = vec!["kubernetes".into()];
    ns.status.phase = "Active".into();
    ns
}

/// An event with every field set, the deprecated ones included (the codecs carry them even
/// though validation refuses them on create).
fn event() -> Event {
    let micro = |t: &str| -> MicroTime { serde_json::from_value(serde_json::json!(t)).unwrap() };
    let reference = |kind: &str, name: &str| ObjectReference {
        kind: kind.into(),
        namespace: "ci".into(),
        name: name.into(),
        uid: "u-9".into(),
        api_version: "v1".into(),
        resource_version: "7".into(),
        field_path: "spec.containers{web}".into(),
    };
    let mut e = Event {
        metadata: meta("web.17a", "ci"),
        event_time: Some(micro("2024-05-06T07:08:09.123456Z")),
        series: Some(EventSeries {
            count: 3,
            last_observed_time: Some(micro("2024-05-06T07:09:10.000001Z")),
        }),
        reporting_controller: "svc.io/scheduler".into(),
        reporting_instance: "scheduler-1".into(),
        action: "Binding".into(),
        reason: "Scheduled".into(),
        regarding: reference("Pod", "web"),
        related: Some(reference("Node", "node-1")),
        note: "assigned ci/web to node-1".into(),
        type_: "Normal".into(),
        deprecated_source: EventSource {
            component: "kubelet".into(),
            host: "node-1".into(),
        },
        deprecated_first_timestamp: Some(serde_json::from_str("\"2024-05-06T07:00:00Z\"").unwrap()),
        deprecated_last_timestamp: Some(serde_json::from_str("\"2024-05-06T07:05:00Z\"").unwrap()),
        deprecated_count: 4,
        ..Default::default()
    };
    e.set_type_meta();
    e
}

fn certificate_signing_request() -> CertificateSigningRequest {
    let t: Time = serde_json::from_str("\"2024-05-06T07:08:10Z\"").unwrap();
    let mut csr = CertificateSigningRequest {
        metadata: meta("jane-client", ""),
        ..Default::default()
    };
    csr.set_type_meta();
    let spec = &mut csr.spec;
    spec.request =
        b"-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n".to_vec();
    spec.signer_name = "svc.io/apiserver-client".into();
    spec.expiration_seconds = Some(86_400);
    spec.usages = vec!["digital signature".into(), "client auth".into()];
    spec.username = "jane".into();
    spec.uid = "u-7".into();
    spec.groups = vec!["dev".into(), "system:authenticated".into()];
    spec.extra = BTreeMap::from([("scopes".into(), vec!["a".into(), "b".into()])]);
    csr.status.conditions = vec![
        CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: "KubectlApprove".into(),
            message: "approved".into(),
            last_update_time: Some(t),
            last_transition_time: Some(t),
        },
        CertificateSigningRequestCondition {
            type_: "Reviewed".into(),
            status: "Unknown".into(),
            ..Default::default()
        },
    ];
    csr.status.certificate =
        b"-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n".to_vec();
    csr
}

/// One object through JSON, YAML, protobuf and CBOR, back to equal.
fn round_trip<T: Resource + ProtoKind + PartialEq + std::fmt::Debug>(obj: &T) {
    let json: T = serde_json::from_slice(&serde_json::to_vec(obj).unwrap()).unwrap();
    assert_eq!(&json, obj, "JSON");
    let y: T = yaml::decode(&yaml::encode(obj).unwrap()).unwrap();
    assert_eq!(&y, obj, "YAML");
    let p: T = decode_protobuf(&encode_protobuf(obj)).unwrap();
    assert_eq!(&p, obj, "protobuf");
    let c: T = cbor::decode(&cbor::encode(obj).unwrap()).unwrap();
    assert_eq!(&c, obj, "CBOR");
}

#[test]
fn every_kind_round_trips_through_every_codec() {
    round_trip(&service_account());
    round_trip(&namespace());
    round_trip(&certificate_signing_request());
    // Optional fields absent stay absent.
    let mut bare_csr = CertificateSigningRequest::default();
    bare_csr.set_type_meta();
    round_trip(&bare_csr);
    round_trip(&event());
    // A minimal event: unset times stay unset through every codec.
    let mut bare = Event {
        metadata: meta("bare", "ci"),
        ..Default::default()
    };
    bare.set_type_meta();
    round_trip(&bare);
}

#[test]
fn event_json_is_shaped_like_kubernetes() {
    let v = serde_json::to_value(event()).unwrap();
    assert_eq!(v["apiVersion"], "events.svc.io/v1");
    assert_eq!(v["eventTime"], "2024-05-06T07:08:09.123456Z");
    assert_eq!(
        v["series"]["lastObservedTime"],
        "2024-05-06T07:09:10.000001Z"
    );
    assert_eq!(v["type"], "Normal");
    // Go writes struct-valued fields and times always (`null`/`{}` when unset), pointers and
    // empty strings not at all.
    let mut bare = Event::default();
    bare.set_type_meta();
    let v = serde_json::to_value(bare).unwrap();
    assert_eq!(v["eventTime"], serde_json::Value::Null);
    assert!(v.as_object().unwrap().contains_key("eventTime"));
    assert_eq!(v["regarding"], serde_json::json!({}));
    assert_eq!(v["deprecatedSource"], serde_json::json!({}));
    assert!(
        v.as_object()
            .unwrap()
            .contains_key("deprecatedFirstTimestamp")
    );
    for absent in [
        "series",
        "related",
        "note",
        "type",
        "deprecatedCount",
        "action",
    ] {
        assert!(v.get(absent).is_none(), "{absent} in {v}");
    }
}

#[test]
fn kubernetes_protos_read_our_event() {
    use k8s_pb::api::events::v1 as events;
    let e = event();
    let body = encode_protobuf(&e);
    let unknown = Unknown::decode(&body[4..]).expect("an Unknown envelope");
    let tm = unknown.type_meta.unwrap();
    assert_eq!(
        (tm.api_version.as_deref(), tm.kind.as_deref()),
        (Some("events.svc.io/v1"), Some("Event"))
    );
    let theirs = events::Event::decode(&unknown.raw.unwrap()[..]).expect("k8s.io/api Event");
    assert_eq!(theirs.metadata.unwrap().name.as_deref(), Some("web.17a"));
    let event_time = theirs.event_time.unwrap();
    assert_eq!(
        (event_time.seconds, event_time.nanos),
        (Some(1_714_979_289), Some(123_456_000))
    );
    let series = theirs.series.unwrap();
    assert_eq!(series.count, Some(3));
    assert_eq!(series.last_observed_time.unwrap().nanos, Some(1_000));
    assert_eq!(
        theirs.reporting_controller.as_deref(),
        Some("svc.io/scheduler")
    );
    assert_eq!(theirs.reporting_instance.as_deref(), Some("scheduler-1"));
    assert_eq!(theirs.action.as_deref(), Some("Binding"));
    assert_eq!(theirs.reason.as_deref(), Some("Scheduled"));
    let regarding = theirs.regarding.unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("Pod"), Some("web"))
    );
    assert_eq!(
        regarding.field_path.as_deref(),
        Some("spec.containers{web}")
    );
    assert_eq!(theirs.related.unwrap().name.as_deref(), Some("node-1"));
    assert_eq!(theirs.note.as_deref(), Some("assigned ci/web to node-1"));
    assert_eq!(theirs.r#type.as_deref(), Some("Normal"));
    let source = theirs.deprecated_source.unwrap();
    assert_eq!(
        (source.component.as_deref(), source.host.as_deref()),
        (Some("kubelet"), Some("node-1"))
    );
    assert_eq!(
        theirs.deprecated_first_timestamp.unwrap().seconds,
        Some(1_714_978_800)
    );
    assert_eq!(theirs.deprecated_count, Some(4));

    // And the other way: what a Kubernetes client writes decodes into our type, with
    // sub-microsecond nanos dropped as Kubernetes drops them.
    let written = events::Event {
        metadata: Some(k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("from-go".into()),
            namespace: Some("ci".into()),
            ..Default::default()
        }),
        event_time: Some(k8s_pb::apimachinery::pkg::apis::meta::v1::MicroTime {
            seconds: Some(1_714_979_289),
            nanos: Some(123_456_789),
        }),
        reason: Some("Pulled".into()),
        r#type: Some("Warning".into()),
        ..Default::default()
    };
    let ours = Event::from_proto_bytes(&written.encode_to_vec()).unwrap();
    assert_eq!(ours.metadata.name, "from-go");
    assert_eq!(
        serde_json::to_value(ours.event_time).unwrap(),
        "2024-05-06T07:08:09.123456Z"
    );
    assert_eq!(
        (ours.reason.as_str(), ours.type_.as_str()),
        ("Pulled", "Warning")
    );
    assert_eq!(ours.series, None);
    assert_eq!(ours.deprecated_first_timestamp, None);
}

#[test]
fn kubernetes_protos_read_our_service_account() {
    let sa = service_account();
    let body = encode_protobuf(&sa);
    assert_eq!(&body[..4], &PROTOBUF_MAGIC);
    let unknown = Unknown::decode(&body[4..]).expect("an Unknown envelope");
    let tm = unknown.type_meta.unwrap();
    assert_eq!(
        (tm.api_version.as_deref(), tm.kind.as_deref()),
        (Some("v1"), Some("ServiceAccount"))
    );
    let theirs =
        k8s::ServiceAccount::decode(&unknown.raw.unwrap()[..]).expect("k8s.io/api ServiceAccount");
    let m = theirs.metadata.unwrap();
    assert_eq!(m.name.as_deref(), Some("builder"));
    assert_eq!(m.namespace.as_deref(), Some("ci"));
    assert_eq!(
        m.uid.as_deref(),
        Some("0b7c2c9e-1f7a-4c52-9d8f-2a3b4c5d6e7f")
    );
    assert_eq!(m.resource_version.as_deref(), Some("42"));
    assert_eq!(m.generation, Some(3));
    assert_eq!(m.creation_timestamp.unwrap().seconds, Some(1_714_979_289));
    assert_eq!(m.labels.get("tier").map(String::as_str), Some("fe"));
    assert_eq!(
        m.annotations.get("svc.io/note").map(String::as_str),
        Some("hello")
    );
    assert_eq!(m.finalizers, ["example.com/hold"]);
    assert_eq!(m.owner_references[0].uid.as_deref(), Some("u-1"));
    assert_eq!(m.owner_references[0].controller, Some(true));
    assert_eq!(m.managed_fields[0].manager.as_deref(), Some("kubectl"));
    let fields: serde_json::Value = serde_json::from_slice(
        m.managed_fields[0]
            .fields_v1
            .as_ref()
            .unwrap()
            .raw
            .as_ref()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        fields,
        serde_json::json!({"f:metadata": {"f:labels": {"f:app": {}}}})
    );
    assert_eq!(theirs.secrets[0].name.as_deref(), Some("tok"));
    assert_eq!(theirs.secrets[0].kind.as_deref(), Some("Secret"));
    assert_eq!(
        theirs.image_pull_secrets[0].name.as_deref(),
        Some("registry")
    );
    assert_eq!(theirs.automount_service_account_token, Some(false));

    // And the other way: bytes a Kubernetes client writes decode into our type.
    let ours = ServiceAccount::from_proto_bytes(&theirs_bytes(&sa)).unwrap();
    assert_eq!(ours.metadata.name, "builder");
}

fn theirs_bytes(sa: &ServiceAccount) -> Vec<u8> {
    let k = k8s::ServiceAccount {
        metadata: Some(k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(sa.metadata.name.clone()),
            namespace: Some(sa.metadata.namespace.clone()),
            ..Default::default()
        }),
        automount_service_account_token: Some(true),
        ..Default::default()
    };
    k.encode_to_vec()
}

#[test]
fn kubernetes_protos_read_our_namespace() {
    let ns = namespace();
    let body = encode_protobuf(&ns);
    let unknown = Unknown::decode(&body[4..]).unwrap();
    let theirs = k8s::Namespace::decode(&unknown.raw.unwrap()[..]).unwrap();
    assert_eq!(theirs.metadata.unwrap().name.as_deref(), Some("team-a"));
    assert_eq!(theirs.spec.unwrap().finalizers, ["kubernetes"]);
    assert_eq!(theirs.status.unwrap().phase.as_deref(), Some("Active"));
}

#[test]
fn kubernetes_protos_read_our_certificate_signing_request() {
    use k8s_pb::api::certificates::v1 as certs;
    let csr = certificate_signing_request();
    let body = encode_protobuf(&csr);
    let unknown = Unknown::decode(&body[4..]).unwrap();
    let tm = unknown.type_meta.unwrap();
    assert_eq!(
        (tm.api_version.as_deref(), tm.kind.as_deref()),
        (
            Some("certificates.svc.io/v1"),
            Some("CertificateSigningRequest")
        )
    );
    let theirs = certs::CertificateSigningRequest::decode(&unknown.raw.unwrap()[..]).unwrap();
    assert_eq!(
        theirs.metadata.unwrap().name.as_deref(),
        Some("jane-client")
    );
    let spec = theirs.spec.unwrap();
    assert_eq!(spec.request.as_deref(), Some(&csr.spec.request[..]));
    assert_eq!(spec.signer_name.as_deref(), Some("svc.io/apiserver-client"));
    assert_eq!(spec.expiration_seconds, Some(86_400));
    assert_eq!(spec.usages, csr.spec.usages);
    assert_eq!(spec.username.as_deref(), Some("jane"));
    assert_eq!(spec.uid.as_deref(), Some("u-7"));
    assert_eq!(spec.groups, csr.spec.groups);
    assert_eq!(spec.extra["scopes"].items, ["a", "b"]);
    let status = theirs.status.unwrap();
    assert_eq!(
        status.certificate.as_deref(),
        Some(&csr.status.certificate[..])
    );
    let approved = &status.conditions[0];
    assert_eq!(approved.r#type.as_deref(), Some("Approved"));
    assert_eq!(approved.status.as_deref(), Some("True"));
    assert_eq!(approved.reason.as_deref(), Some("KubectlApprove"));
    assert_eq!(approved.message.as_deref(), Some("approved"));
    assert_eq!(
        approved.last_update_time.as_ref().unwrap().seconds,
        Some(1_714_979_290)
    );
    assert_eq!(
        approved.last_transition_time.as_ref().unwrap().seconds,
        Some(1_714_979_290)
    );
    assert_eq!(status.conditions[1].status.as_deref(), Some("Unknown"));

    // And bytes a Kubernetes client writes (every Go value field present, zero times as
    // empty messages, no expirationSeconds) decode into ours.
    let k = certs::CertificateSigningRequest {
        metadata: Some(k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("from-go".into()),
            ..Default::default()
        }),
        spec: Some(certs::CertificateSigningRequestSpec {
            request: Some(b"pem".to_vec()),
            signer_name: Some("example.com/x".into()),
            usages: vec!["client auth".into()],
            username: Some(String::new()),
            ..Default::default()
        }),
        status: Some(certs::CertificateSigningRequestStatus {
            conditions: vec![certs::CertificateSigningRequestCondition {
                r#type: Some("Denied".into()),
                status: Some("True".into()),
                last_update_time: Some(Default::default()),
                ..Default::default()
            }],
            certificate: None,
        }),
    };
    let ours = CertificateSigningRequest::from_proto_bytes(&k.encode_to_vec()).unwrap();
    assert_eq!(ours.metadata.name, "from-go");
    assert_eq!(ours.spec.request, b"pem");
    assert_eq!(ours.spec.signer_name, "example.com/x");
    assert_eq!(ours.spec.expiration_seconds, None);
    assert_eq!(ours.status.conditions[0].type_, "Denied");
    assert_eq!(ours.status.conditions[0].last_update_time, None);
    assert!(ours.status.certificate.is_empty());
}
