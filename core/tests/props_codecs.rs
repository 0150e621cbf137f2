//! Property tests of the object codecs clients feed: JSON, YAML, CBOR and protobuf. Arbitrary
//! bytes (and valid encodings with bytes changed) never panic a decoder, and generated valid
//! objects come back equal from every codec.
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

use base64::Engine as _;
use proptest::prelude::*;
use svc_core::codec::{cbor, decode_envelope, decode_protobuf, encode_protobuf, yaml};
use svc_core::kinds::{
    CertificateSigningRequest, Event, LocalObjectReference, Namespace, ObjectReference, Secret,
    ServiceAccount,
};
use svc_core::meta::Time;
use svc_core::object::decode_json;
use svc_core::{ObjectMeta, Resource};

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(256)
    }
}

/// Strings as clients send them: mostly plain, sometimes any Unicode, sometimes what YAML
/// must quote (leading or trailing blanks, indicators, words it would read as other types).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9.-]{0,20}",
        1 => any::<String>(),
        1 => "[ \t]?[a-z0-9 :#'\"&*!|>%@`,\\[\\]{}-]{0,8}[ \t]?",
        1 => prop::sample::select(vec!["yes", "No", "on", "null", "~", "0.0.0.0", "1e3", "0o17", ".inf"])
            .prop_map(String::from),
    ]
}

fn string_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(text(), text(), 0..4)
}

fn time() -> impl Strategy<Value = Time> {
    // 1970 to 2100, whole seconds (the wire keeps seconds).
    (0i64..4_102_444_800).prop_map(|s| Time(time::OffsetDateTime::from_unix_timestamp(s).unwrap()))
}

fn meta() -> impl Strategy<Value = ObjectMeta> {
    (
        (text(), text(), text(), text()),
        (prop::option::of(any::<i64>()), prop::option::of(time())),
        (
            string_map(),
            string_map(),
            prop::collection::vec(text(), 0..3),
        ),
    )
        .prop_map(
            |(
                (name, generate_name, namespace, uid),
                (generation, creation_timestamp),
                (labels, annotations, finalizers),
            )| ObjectMeta {
                name,
                generate_name,
                namespace,
                uid,
                generation,
                creation_timestamp,
                labels,
                annotations,
                finalizers,
                ..Default::default()
            },
        )
}

fn service_account() -> impl Strategy<Value = ServiceAccount> {
    (
        meta(),
        prop::collection::vec((text(), text(), text()), 0..3),
        prop::collection::vec(text(), 0..3),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(metadata, secrets, pulls, automount)| {
            let mut sa = ServiceAccount {
                metadata,
                secrets: secrets
                    .into_iter()
                    .map(|(kind, namespace, name)| ObjectReference {
                        kind,
                        namespace,
                        name,
                        ..Default::default()
                    })
                    .collect(),
                image_pull_secrets: pulls
                    .into_iter()
                    .map(|name| LocalObjectReference { name })
                    .collect(),
                automount_service_account_token: automount,
                ..Default::default()
            };
            sa.set_type_meta();
            sa
        })
}

fn secret() -> impl Strategy<Value = Secret> {
    (
        meta(),
        prop::collection::btree_map(text(), prop::collection::vec(any::<u8>(), 0..40), 0..4),
        text(),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(metadata, data, type_, immutable)| {
            let mut s = Secret {
                metadata,
                data: data
                    .into_iter()
                    .map(|(k, v)| (k, base64::engine::general_purpose::STANDARD.encode(v)))
                    .collect(),
                type_,
                immutable,
                ..Default::default()
            };
            s.set_type_meta();
            s
        })
}

/// Every decoder of `T` a request body can reach, on the same bytes: none may panic.
fn decode_all<T: Resource + svc_core::codec::ProtoKind>(bytes: &[u8]) {
    let _ = decode_json::<T>(bytes);
    let _ = yaml::decode::<T>(bytes);
    let _ = cbor::decode::<T>(bytes);
    let _ = decode_protobuf::<T>(bytes);
}

fn decode_every_kind(bytes: &[u8]) {
    decode_all::<ServiceAccount>(bytes);
    decode_all::<Secret>(bytes);
    decode_all::<Namespace>(bytes);
    decode_all::<Event>(bytes);
    decode_all::<CertificateSigningRequest>(bytes);
    let _ = decode_envelope(bytes);
    let _ = yaml::from_json(bytes);
    let _ = cbor::from_json(bytes);
}

/// Bytes that reach past the first checks of each decoder: a protobuf envelope around
/// arbitrary bytes, JSON-ish and YAML-ish text, and plain noise.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        prop::collection::vec(any::<u8>(), 0..300).prop_map(|raw| {
            let mut b = b"k8s\0".to_vec();
            b.extend(raw);
            b
        }),
        (text(), prop::collection::vec(any::<u8>(), 0..200))
            .prop_map(|(kind, raw)| { svc_core::codec::encode_envelope("v1", &kind, &raw) }),
        "[\\{\\}\\[\\]\":,a-z0-9 \n-]{0,200}".prop_map(String::into_bytes),
    ]
}

/// `bytes` with the byte at each chosen position replaced.
fn mutate(mut bytes: Vec<u8>, edits: &[(prop::sample::Index, u8)]) -> Vec<u8> {
    if bytes.is_empty() {
        return bytes;
    }
    for (i, b) in edits {
        let at = i.index(bytes.len());
        bytes[at] = *b;
    }
    bytes
}

fn edits() -> impl Strategy<Value = Vec<(prop::sample::Index, u8)>> {
    prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic_a_decoder(bytes in body()) {
        decode_every_kind(&bytes);
    }

    #[test]
    fn changed_bytes_of_valid_encodings_never_panic_a_decoder(
        sa in service_account(),
        edits in edits(),
        truncate in any::<prop::sample::Index>(),
    ) {
        let encodings = [
            serde_json::to_vec(&sa).unwrap(),
            yaml::encode(&sa).unwrap(),
            cbor::encode(&sa).unwrap(),
            encode_protobuf(&sa),
        ];
        for e in encodings {
            let cut = truncate.index(e.len() + 1);
            decode_every_kind(&e[..cut]);
            decode_every_kind(&mutate(e, &edits));
        }
    }

    #[test]
    fn service_accounts_round_trip_through_every_codec(sa in service_account()) {
        let json = serde_json::to_vec(&sa).unwrap();
        prop_assert_eq!(&decode_json::<ServiceAccount>(&json).unwrap(), &sa);
        prop_assert_eq!(&yaml::decode::<ServiceAccount>(&yaml::encode(&sa).unwrap()).unwrap(), &sa);
        prop_assert_eq!(&cbor::decode::<ServiceAccount>(&cbor::encode(&sa).unwrap()).unwrap(), &sa);
        prop_assert_eq!(&decode_protobuf::<ServiceAccount>(&encode_protobuf(&sa)).unwrap(), &sa);
        // The translations the gateway does for responses keep the object too.
        let via_yaml = yaml::from_json(&json).unwrap();
        prop_assert_eq!(&yaml::decode::<ServiceAccount>(&via_yaml).unwrap(), &sa);
        let via_cbor = cbor::from_json(&json).unwrap();
        prop_assert_eq!(&cbor::decode::<ServiceAccount>(&via_cbor).unwrap(), &sa);
    }

    #[test]
    fn secrets_round_trip_through_every_codec(s in secret()) {
        let json = serde_json::to_vec(&s).unwrap();
        prop_assert_eq!(&decode_json::<Secret>(&json).unwrap(), &s);
        prop_assert_eq!(&yaml::decode::<Secret>(&yaml::encode(&s).unwrap()).unwrap(), &s);
        prop_assert_eq!(&cbor::decode::<Secret>(&cbor::encode(&s).unwrap()).unwrap(), &s);
        prop_assert_eq!(&decode_protobuf::<Secret>(&encode_protobuf(&s)).unwrap(), &s);
    }
}

/// Nesting far deeper than any object: each decoder refuses it (or reads it) without
/// overflowing the stack, which would abort the whole server.
#[test]
fn deeply_nested_bodies_are_refused_not_a_stack_overflow() {
    const DEPTH: usize = 100_000;
    let json = format!("{}{}", "[".repeat(DEPTH), "]".repeat(DEPTH));
    let json_obj = format!(
        "{{\"metadata\":{{\"labels\":{}{}}}}}",
        "{\"a\":".repeat(DEPTH),
        "}".repeat(DEPTH)
    );
    let yaml_flow = json.clone();
    let yaml_block: String = (0..2_000)
        .map(|i| format!("{}- \n", " ".repeat(i * 2)))
        .collect();
    let mut cbor_bytes = vec![0x81u8; DEPTH];
    cbor_bytes.push(0x00);
    let mut cbor_maps = Vec::new();
    for _ in 0..DEPTH {
        cbor_maps.extend_from_slice(&[0xa1, 0x61, b'a']);
    }
    cbor_maps.push(0x00);
    // Protobuf: an unknown length-delimited field nested in itself, and the envelope.
    let mut proto = Vec::new();
    for _ in 0..1_000 {
        let mut outer = vec![0x0a];
        let mut len = proto.len();
        loop {
            let b = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                outer.push(b);
                break;
            }
            outer.push(b | 0x80);
        }
        outer.extend_from_slice(&proto);
        proto = outer;
    }
    let groups: Vec<u8> = [vec![0x0bu8; DEPTH], vec![0x0c; DEPTH]].concat();
    for bytes in [
        json.as_bytes(),
        json_obj.as_bytes(),
        yaml_flow.as_bytes(),
        yaml_block.as_bytes(),
        &cbor_bytes,
        &cbor_maps,
        &svc_core::codec::encode_envelope("v1", "ServiceAccount", &proto),
        &svc_core::codec::encode_envelope("v1", "ServiceAccount", &groups),
    ] {
        decode_every_kind(bytes);
    }
}

/// YAML aliases that expand exponentially (a "billion laughs" document) are refused or read
/// within bounds.
#[test]
fn yaml_alias_bombs_are_bounded() {
    let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        doc.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    doc.push_str("metadata: {labels: {x: y}}\nz: *a11\n");
    let _ = yaml::decode::<ServiceAccount>(doc.as_bytes());
    let _ = yaml::decode::<serde_json::Value>(doc.as_bytes());
}

/// Strings ending in spaces keep them through YAML (the writer's plain scalars would lose
/// them; such documents are written as JSON, which is YAML too).
#[test]
fn yaml_keeps_trailing_spaces() {
    let mut sa = ServiceAccount::default();
    sa.metadata.name = "a".into();
    sa.metadata.annotations = BTreeMap::from([("note".into(), "ends in a space ".into())]);
    sa.metadata.finalizers = vec!["in a list ".into()];
    sa.metadata.labels = BTreeMap::from([("k".into(), "v".into())]);
    sa.set_type_meta();
    let bytes = yaml::encode(&sa).unwrap();
    assert_eq!(yaml::decode::<ServiceAccount>(&bytes).unwrap(), sa);
    // The writer quotes them, so the document stays block YAML (serde-saphyr 0.0 did not,
    // and such documents were written as JSON).
    assert!(String::from_utf8_lossy(&bytes).contains("name: a\n"));
    sa.metadata.annotations = BTreeMap::from([("key ends in a space ".into(), "v".into())]);
    let bytes = yaml::encode(&sa).unwrap();
    assert_eq!(yaml::decode::<ServiceAccount>(&bytes).unwrap(), sa);
    assert!(String::from_utf8_lossy(&bytes).contains("name: a\n"));
    // Documents without such strings are block YAML too.
    sa.metadata.annotations.clear();
    sa.metadata.finalizers.clear();
    let bytes = yaml::encode(&sa).unwrap();
    assert!(
        String::from_utf8(bytes.clone())
            .unwrap()
            .contains("name: a\n")
    );
    assert_eq!(yaml::decode::<ServiceAccount>(&bytes).unwrap(), sa);
}
