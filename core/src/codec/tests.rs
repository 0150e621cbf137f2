//! Codec tests: full round trips, golden bytes written by hand from the `.proto` tag numbers,
//! and hostile input (truncations, garbage) that must fail cleanly.

use std::collections::BTreeMap;

use time::OffsetDateTime;

use super::*;
use crate::kinds::{LocalObjectReference, ObjectReference, ServiceAccount};
use crate::kinds::{Namespace, NamespaceSpec, NamespaceStatus};
use crate::meta::{ManagedFieldsEntry, ObjectMeta, OwnerReference, Time};
use crate::status::Subject;

// ---- an independent protobuf reader, sharing no code with prost ----

#[derive(Debug, PartialEq)]
enum Field {
    Varint(u64),
    Bytes(Vec<u8>),
}

fn read_varint(b: &mut &[u8]) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (byte, rest) = b.split_first().expect("truncated varint");
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    v
}

/// Every (field number, value) of one message, in wire order.
fn fields(mut b: &[u8]) -> Vec<(u64, Field)> {
    let mut out = vec![];
    while !b.is_empty() {
        let key = read_varint(&mut b);
        let value = match key & 7 {
            0 => Field::Varint(read_varint(&mut b)),
            2 => {
                let len = usize::try_from(read_varint(&mut b)).unwrap();
                let (v, rest) = b.split_at(len);
                b = rest;
                Field::Bytes(v.to_vec())
            }
            w => panic!("unexpected wire type {w}"),
        };
        out.push((key >> 3, value));
    }
    out
}

fn all(b: &[u8], n: u64) -> Vec<Vec<u8>> {
    fields(b)
        .into_iter()
        .filter_map(|(k, v)| match (k == n, v) {
            (true, Field::Bytes(v)) => Some(v),
            _ => None,
        })
        .collect()
}

fn one(b: &[u8], n: u64) -> Vec<u8> {
    let v = all(b, n);
    assert_eq!(v.len(), 1, "field {n} in {b:02x?}");
    v.into_iter().next().unwrap()
}

fn text(b: &[u8], n: u64) -> String {
    String::from_utf8(one(b, n)).unwrap()
}

/// A length-delimited field written by hand: key byte, one-byte length, payload.
fn ld(field: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 128 && field < 16);
    let mut v = vec![(field << 3) | 2, payload.len() as u8];
    v.extend_from_slice(payload);
    v
}

fn envelope_by_hand(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let type_meta = [ld(1, api_version.as_bytes()), ld(2, kind.as_bytes())].concat();
    [b"k8s\0".to_vec(), ld(1, &type_meta), ld(2, raw)].concat()
}

// ---- fixtures with every field set ----

fn at(secs: i64) -> Time {
    Time(OffsetDateTime::from_unix_timestamp(secs).unwrap())
}

fn full_meta(namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: "obj".into(),
        generate_name: "obj-".into(),
        namespace: namespace.into(),
        self_link: "/api/v1/x".into(),
        uid: "3f1c2a7e-0000-4000-8000-000000000001".into(),
        resource_version: "42".into(),
        generation: Some(7),
        creation_timestamp: Some(at(1_700_000_000)),
        deletion_timestamp: Some(at(1_700_000_100)),
        deletion_grace_period_seconds: Some(0),
        labels: BTreeMap::from([("app".into(), "web".into()), ("tier".into(), "".into())]),
        annotations: BTreeMap::from([("note".into(), "ünïcödé".into())]),
        owner_references: vec![
            OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "rs".into(),
                uid: "u-1".into(),
                controller: Some(true),
                block_owner_deletion: Some(false),
            },
            OwnerReference {
                api_version: "v1".into(),
                kind: "Namespace".into(),
                name: "n".into(),
                uid: "u-2".into(),
                controller: None,
                block_owner_deletion: None,
            },
        ],
        finalizers: vec!["a/b".into(), "kubernetes".into()],
        managed_fields: vec![ManagedFieldsEntry {
            manager: "kubectl".into(),
            operation: "Apply".into(),
            api_version: "v1".into(),
            time: Some(at(1_700_000_050)),
            fields_type: "FieldsV1".into(),
            fields_v1: Some(serde_json::json!({"f:metadata": {"f:labels": {"f:app": {}}}})),
            subresource: "status".into(),
        }],
    }
}

fn full_namespace() -> Namespace {
    Namespace {
        api_version: "v1".into(),
        kind: "Namespace".into(),
        metadata: full_meta(""),
        spec: NamespaceSpec {
            finalizers: vec!["kubernetes".into()],
        },
        status: NamespaceStatus {
            phase: "Terminating".into(),
            conditions: vec![serde_json::json!({
                "type": "NamespaceDeletionContentFailure",
                "status": "False",
                "lastTransitionTime": "2024-03-05T07:08:09Z",
                "reason": "ContentDeleted",
                "message": "All content successfully deleted"
            })],
        },
    }
}

fn full_service_account() -> ServiceAccount {
    ServiceAccount {
        api_version: "v1".into(),
        kind: "ServiceAccount".into(),
        metadata: full_meta("team-a"),
        secrets: vec![ObjectReference {
            kind: "Secret".into(),
            namespace: "team-a".into(),
            name: "token".into(),
            uid: "u-3".into(),
            api_version: "v1".into(),
            resource_version: "9".into(),
            field_path: "data".into(),
        }],
        image_pull_secrets: vec![
            LocalObjectReference {
                name: "pull-1".into(),
            },
            LocalObjectReference {
                name: "pull-2".into(),
            },
        ],
        automount_service_account_token: Some(false),
    }
}

fn without_type_meta<T: Resource>(mut obj: T, clear: impl Fn(&mut T)) -> T {
    clear(&mut obj);
    obj
}

// ---- round trips ----

#[test]
fn namespace_round_trips_every_field() {
    let ns = full_namespace();
    let bare = Namespace::from_proto_bytes(&ns.to_proto_bytes()).unwrap();
    let expected = without_type_meta(ns.clone(), |n| {
        n.api_version.clear();
        n.kind.clear();
    });
    assert_eq!(bare, expected);
    assert_eq!(
        decode_protobuf::<Namespace>(&encode_protobuf(&ns)).unwrap(),
        ns
    );
}

#[test]
fn service_account_round_trips_every_field() {
    let sa = full_service_account();
    let bare = ServiceAccount::from_proto_bytes(&sa.to_proto_bytes()).unwrap();
    let expected = without_type_meta(sa.clone(), |s| {
        s.api_version.clear();
        s.kind.clear();
    });
    assert_eq!(bare, expected);
    assert_eq!(
        decode_protobuf::<ServiceAccount>(&encode_protobuf(&sa)).unwrap(),
        sa
    );
}

#[test]
fn empty_objects_round_trip() {
    let ns = Namespace::default();
    assert_eq!(
        Namespace::from_proto_bytes(&ns.to_proto_bytes()).unwrap(),
        ns
    );
    let sa = ServiceAccount::default();
    assert_eq!(
        ServiceAccount::from_proto_bytes(&sa.to_proto_bytes()).unwrap(),
        sa
    );
}

// ---- golden bytes ----

/// The ServiceAccount used by the golden tests and its bytes, written from the tags in
/// core/v1 and meta/v1 generated.proto: ServiceAccount{metadata=1, secrets=2,
/// automountServiceAccountToken=4}, ObjectMeta{name=1, namespace=3, labels=11 (map entries
/// are {key=1, value=2})}, ObjectReference{name=3}.
fn golden_service_account() -> (ServiceAccount, Vec<u8>) {
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: "sa".into(),
            namespace: "ns".into(),
            labels: BTreeMap::from([("a".into(), "b".into())]),
            ..Default::default()
        },
        secrets: vec![ObjectReference {
            name: "s".into(),
            ..Default::default()
        }],
        automount_service_account_token: Some(false),
        ..Default::default()
    };
    let meta = [
        vec![0x0a, 0x02, b's', b'a'],                         // 1: name
        vec![0x1a, 0x02, b'n', b's'],                         // 3: namespace
        vec![0x5a, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'b'], // 11: labels {a: b}
    ]
    .concat();
    let bytes = [
        vec![0x0a, 0x10], // 1: metadata, 16 bytes
        meta,
        vec![0x12, 0x03, 0x1a, 0x01, b's'], // 2: secrets[0] {name=3: "s"}
        vec![0x20, 0x00],                   // 4: automountServiceAccountToken = false
    ]
    .concat();
    (sa, bytes)
}

#[test]
fn golden_service_account_bytes() {
    let (sa, bytes) = golden_service_account();
    assert_eq!(sa.to_proto_bytes(), bytes);
    assert_eq!(ServiceAccount::from_proto_bytes(&bytes).unwrap(), sa);

    // The same bytes, read by the independent reader.
    let meta = one(&bytes, 1);
    assert_eq!(text(&meta, 1), "sa");
    assert_eq!(text(&meta, 3), "ns");
    let label = one(&meta, 11);
    assert_eq!((text(&label, 1), text(&label, 2)), ("a".into(), "b".into()));
    assert_eq!(text(&one(&bytes, 2), 3), "s");
    assert!(fields(&bytes).contains(&(4, Field::Varint(0))));

    let envelope = [
        b"k8s\0".to_vec(),
        vec![0x0a, 0x14, 0x0a, 0x02, b'v', b'1', 0x12, 0x0e],
        b"ServiceAccount".to_vec(),
        vec![0x12, 0x19],
        bytes.clone(),
    ]
    .concat();
    assert_eq!(envelope, envelope_by_hand("v1", "ServiceAccount", &bytes));
    assert_eq!(encode_protobuf(&sa), envelope);
    let mut typed = sa.clone();
    typed.api_version = "v1".into();
    typed.kind = "ServiceAccount".into();
    assert_eq!(decode_protobuf::<ServiceAccount>(&envelope).unwrap(), typed);
}

/// What a Go client sends for fields it never set: empty strings, `generation: 0`, and an
/// empty message for the zero `creationTimestamp`. None of them may read as set.
#[test]
fn go_zero_values_read_as_unset() {
    let meta = [
        ld(1, b"sa"),
        ld(2, b""),       // generateName ""
        vec![0x38, 0x00], // 7: generation 0
        ld(8, b""),       // creationTimestamp: zero Time is an empty message
    ]
    .concat();
    let raw = [ld(1, &meta), ld(2, &ld(3, b"tok")), ld(3, &ld(1, b""))].concat();
    let sa = ServiceAccount::from_proto_bytes(&raw).unwrap();
    assert_eq!(sa.metadata.name, "sa");
    assert_eq!(sa.metadata.generation, None);
    assert_eq!(sa.metadata.creation_timestamp, None);
    assert_eq!(sa.automount_service_account_token, None);
    assert_eq!(sa.image_pull_secrets, vec![LocalObjectReference::default()]);

    // Time{seconds=1} with nanos ignored, as Kubernetes' Time.Unmarshal does.
    let meta = [ld(8, &[0x08, 0x01, 0x10, 0x05])].concat();
    let sa = ServiceAccount::from_proto_bytes(&ld(1, &meta)).unwrap();
    assert_eq!(sa.metadata.creation_timestamp, Some(at(1)));
}

#[test]
fn delete_options_golden_and_json() {
    let raw = [
        vec![0x08, 0x00],                            // 1: gracePeriodSeconds 0
        ld(2, &[ld(1, b"u"), ld(2, b"5")].concat()), // 2: preconditions{uid, rv}
        vec![0x18, 0x00],                            // 3: orphanDependents false
        ld(4, b"Foreground"),                        // 4: propagationPolicy
        ld(5, b"All"),                               // 5: dryRun
    ]
    .concat();
    let body = envelope_by_hand("v1", "DeleteOptions", &raw);
    let expected = DeleteOptions {
        api_version: "v1".into(),
        kind: "DeleteOptions".into(),
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some("u".into()),
            resource_version: Some("5".into()),
        }),
        orphan_dependents: Some(false),
        propagation_policy: Some("Foreground".into()),
        dry_run: vec!["All".into()],
        ignore_store_read_error_with_cluster_breaking_potential: None,
    };
    assert_eq!(DeleteOptions::from_protobuf(&body).unwrap(), expected);
    assert_eq!(expected.to_protobuf(), body);

    let json = br#"{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0,
        "preconditions":{"uid":"u","resourceVersion":"5"},"orphanDependents":false,
        "propagationPolicy":"Foreground","dryRun":["All"]}"#;
    assert_eq!(DeleteOptions::from_json(json).unwrap(), expected);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&serde_json::to_vec(&expected).unwrap())
            .unwrap(),
        serde_json::from_slice::<serde_json::Value>(json).unwrap()
    );

    assert_eq!(
        DeleteOptions::from_json(b"").unwrap(),
        DeleteOptions::default()
    );
    assert_eq!(
        DeleteOptions::from_protobuf(b"").unwrap(),
        DeleteOptions::default()
    );
    let wrong = envelope_by_hand("v1", "Namespace", &raw);
    assert_eq!(
        DeleteOptions::from_protobuf(&wrong).unwrap_err().code(),
        400
    );
    assert_eq!(
        DeleteOptions::from_json(br#"{"kind":"Pod"}"#)
            .unwrap_err()
            .code(),
        400
    );
}

#[test]
fn list_has_list_meta_and_items() {
    let (sa, sa_bytes) = golden_service_account();
    let list_meta = ListMeta {
        resource_version: "42".into(),
        continue_: "abc".into(),
        remaining_item_count: Some(3),
        ..Default::default()
    };
    let body = encode_list_protobuf("v1", "ServiceAccountList", &list_meta, &[sa.clone(), sa]);
    let (tm, raw) = decode_envelope(&body).unwrap();
    assert_eq!(
        (tm.api_version.as_str(), tm.kind.as_str()),
        ("v1", "ServiceAccountList")
    );
    let lm = one(&raw, 1);
    assert_eq!(text(&lm, 2), "42");
    assert_eq!(text(&lm, 3), "abc");
    assert!(fields(&lm).contains(&(4, Field::Varint(3))));
    assert_eq!(all(&raw, 2), vec![sa_bytes.clone(), sa_bytes]);

    // An empty list still carries its (empty) ListMeta, as Go writes it.
    let empty = encode_list_protobuf::<Namespace>("v1", "NamespaceList", &ListMeta::default(), &[]);
    assert_eq!(decode_envelope(&empty).unwrap().1, vec![0x0a, 0x00]);
}

#[test]
fn status_round_trips_and_has_kubernetes_tags() {
    let status = ApiError::Invalid {
        kind: "Namespace".into(),
        group: String::new(),
        name: "Bad".into(),
        causes: vec![crate::status::StatusCause {
            reason: "FieldValueInvalid".into(),
            message: "bad".into(),
            field: "metadata.name".into(),
        }],
    }
    .to_status();
    let body = encode_status_protobuf(&status);
    assert_eq!(decode_status_protobuf(&body).unwrap(), status);

    let (tm, raw) = decode_envelope(&body).unwrap();
    assert_eq!(
        (tm.api_version.as_str(), tm.kind.as_str()),
        ("v1", "Status")
    );
    assert_eq!(text(&raw, 2), "Failure");
    assert_eq!(text(&raw, 4), "Invalid");
    assert!(fields(&raw).contains(&(6, Field::Varint(422))));
    let details = one(&raw, 5);
    assert_eq!(text(&details, 1), "Bad");
    assert_eq!(text(&details, 3), "Namespace");
    assert_eq!(text(&one(&details, 4), 3), "metadata.name");

    let retry = ApiError::too_large_resource_version(10, 5).to_status();
    assert_eq!(
        decode_status_protobuf(&encode_status_protobuf(&retry)).unwrap(),
        retry
    );
    let nf = ApiError::NotFound(Subject::new("", "namespaces", "x")).to_status();
    assert_eq!(
        decode_status_protobuf(&encode_status_protobuf(&nf)).unwrap(),
        nf
    );
}

#[test]
fn watch_event_frame_matches_kubernetes_framing() {
    let (sa, _) = golden_service_account();
    let object = encode_protobuf(&sa);
    let frame = encode_watch_event_protobuf("ADDED", &object).unwrap();

    // [u32 BE length][WatchEvent{type=1, object=2 RawExtension{raw=1}}], the event bare.
    let event = [ld(1, b"ADDED"), ld(2, &ld(1, &object))].concat();
    let mut expected = u32::try_from(event.len()).unwrap().to_be_bytes().to_vec();
    expected.extend_from_slice(&event);
    assert_eq!(frame, expected);
    assert!(!frame[4..].starts_with(&PROTOBUF_MAGIC));
    assert!(one(&one(&frame[4..], 2), 1).starts_with(&PROTOBUF_MAGIC));

    let (kind, got) = decode_watch_event_protobuf(&frame).unwrap();
    assert_eq!(kind, "ADDED");
    assert_eq!(
        decode_protobuf::<ServiceAccount>(&got)
            .unwrap()
            .metadata
            .name,
        "sa"
    );

    assert!(decode_watch_event_protobuf(&frame[..3]).is_err());
    assert!(decode_watch_event_protobuf(&frame[..frame.len() - 1]).is_err());
}

// ---- rejections ----

#[test]
fn envelope_rejections() {
    let (sa, raw) = golden_service_account();
    let good = encode_protobuf(&sa);

    let err = decode_envelope(&good[4..]).unwrap_err();
    assert_eq!(err.code(), 400);
    assert!(
        err.to_string().contains("expected prefix [107 56 115 0]"),
        "{err}"
    );
    assert_eq!(
        decode_envelope(b"{\"kind\":\"x\"}").unwrap_err().code(),
        400
    );
    assert_eq!(decode_envelope(b"").unwrap_err().to_string(), "empty data");
    assert_eq!(
        decode_envelope(&PROTOBUF_MAGIC).unwrap_err().to_string(),
        "empty body"
    );

    let with = |field: u8, value: &[u8]| [good.clone(), ld(field, value)].concat();
    assert_eq!(decode_envelope(&with(3, b"gzip")).unwrap_err().code(), 415);
    assert_eq!(
        decode_envelope(&with(4, b"application/json"))
            .unwrap_err()
            .code(),
        415
    );
    let typed = with(4, MEDIA_TYPE_KUBERNETES_PROTOBUF.as_bytes());
    assert_eq!(decode_envelope(&typed).unwrap().1, raw);

    let wrong_kind = envelope_by_hand("v1", "Namespace", &raw);
    let err = decode_protobuf::<ServiceAccount>(&wrong_kind).unwrap_err();
    assert!(
        err.to_string().contains("does not match the expected kind"),
        "{err}"
    );
    let wrong_version = envelope_by_hand("apps/v1", "ServiceAccount", &raw);
    assert_eq!(
        decode_protobuf::<ServiceAccount>(&wrong_version)
            .unwrap_err()
            .code(),
        400
    );
    // Kubernetes defaults a missing kind and version from the endpoint.
    let untyped = envelope_by_hand("", "", &raw);
    assert_eq!(
        decode_protobuf::<ServiceAccount>(&untyped).unwrap().kind,
        "ServiceAccount"
    );
}

#[test]
fn media_types() {
    assert!(is_protobuf_media_type(
        "application/vnd.kubernetes.protobuf"
    ));
    assert!(is_protobuf_media_type(
        "application/vnd.svc.protobuf; charset=x"
    ));
    assert!(is_protobuf_media_type(
        "Application/Vnd.Kubernetes.Protobuf;stream=watch"
    ));
    assert!(!is_protobuf_media_type("application/json"));
}

/// Every truncation of valid bodies, and deterministic garbage: never a panic, and never the
/// original object back from a cut-short body.
#[test]
fn truncated_and_garbage_input_fails_cleanly() {
    let sa = full_service_account();
    let ns = full_namespace();
    let bodies = [encode_protobuf(&sa), encode_protobuf(&ns)];
    let mut errors = 0;
    for n in 0..bodies[0].len() {
        match decode_protobuf::<ServiceAccount>(&bodies[0][..n]) {
            Ok(got) => assert_ne!(got, sa, "truncated to {n} bytes"),
            Err(_) => errors += 1,
        }
        let _ = ServiceAccount::from_proto_bytes(&bodies[0][4..n.max(4)]);
    }
    for n in 0..bodies[1].len() {
        if let Ok(got) = decode_protobuf::<Namespace>(&bodies[1][..n]) {
            assert_ne!(got, ns, "truncated to {n} bytes");
        }
    }
    // Cuts inside `raw` are the common case and must all be errors.
    assert!(
        errors > bodies[0].len() * 9 / 10,
        "{errors} of {}",
        bodies[0].len()
    );

    // Single-byte corruption of a valid body, then pseudo-random bodies after the magic.
    for body in &bodies {
        for i in 0..body.len() {
            for b in [0x00, 0x7f, 0x80, 0xff] {
                let mut bad = body.clone();
                bad[i] = b;
                let _ = decode_protobuf::<ServiceAccount>(&bad);
                let _ = decode_protobuf::<Namespace>(&bad);
                let _ = DeleteOptions::from_protobuf(&bad);
                let _ = decode_status_protobuf(&bad);
            }
        }
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for len in 0..600 {
        let mut body = PROTOBUF_MAGIC.to_vec();
        for _ in 0..len % 97 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            body.push(state.to_le_bytes()[0]);
        }
        let _ = decode_protobuf::<ServiceAccount>(&body);
        let _ = decode_protobuf::<Namespace>(&body);
        let _ = DeleteOptions::from_protobuf(&body);
        let _ = ServiceAccount::from_proto_bytes(&body[4..]);
        let _ = Namespace::from_proto_bytes(&body[4..]);
        let mut frame = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        let _ = decode_watch_event_protobuf(&frame);
    }
}
