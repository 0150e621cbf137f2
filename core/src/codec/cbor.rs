//! CBOR (`application/cbor`, RFC 8949) bodies and `application/cbor-seq` watch items, as the
//! spec's alpha `CBORServingAndStorage` gate serves them: one self-described item per body
//! (tag 55799, the bytes `d9 d9 f7`), the same field names as JSON.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::status::ApiError;

/// The self-described CBOR tag (55799) every body starts with, so a reader can tell CBOR
/// from other bytes.
pub const SELF_DESCRIBED: [u8; 3] = [0xd9, 0xd9, 0xf7];

/// Encodes one value as a self-described CBOR item.
///
/// A field the kind's schema marks `format: byte` (a Go `[]byte`: a Secret's `data`, a CSR's
/// `request`) is written as Kubernetes writes it, a byte string tagged 22 ("expected
/// conversion to base64"), not as the base64 text JSON carries: client-go decodes a `[]byte`
/// field only from a byte string. Objects are recognised by `apiVersion` and `kind`, at the
/// top, in a list's `items` and in a watch event's `object`.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, ApiError> {
    let json = serde_json::to_value(value)
        .map_err(|e| ApiError::internal(format!("encoding CBOR: {e}")))?;
    let mut out = SELF_DESCRIBED.to_vec();
    ciborium::into_writer(&to_cbor(&json, None), &mut out)
        .map_err(|e| ApiError::internal(format!("encoding CBOR: {e}")))?;
    Ok(out)
}

/// The schema of the object `v` is, if `v` names a registered kind (or its list).
fn schema_of(v: &serde_json::Value) -> Option<&'static serde_json::Value> {
    use std::sync::OnceLock;
    static SCHEMAS: OnceLock<Vec<(&'static crate::ResourceInfo, serde_json::Value)>> =
        OnceLock::new();
    let kind = v.get("kind")?.as_str()?;
    let api_version = v.get("apiVersion")?.as_str()?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let schemas = SCHEMAS.get_or_init(|| {
        crate::registry::all()
            .iter()
            .map(|r| {
                // A kind's schema function gives its properties beyond apiVersion, kind and
                // metadata.
                let item = serde_json::json!({"properties": (r.schema)()});
                let list = serde_json::json!({"properties": {"items": {"items": item}}});
                (*r, serde_json::json!({"item": item, "list": list}))
            })
            .collect()
    });
    schemas.iter().find_map(|(r, s)| {
        if r.group != group || r.version != version {
            None
        } else if r.kind == kind {
            s.get("item")
        } else if r.list_kind == kind {
            s.get("list")
        } else {
            None
        }
    })
}

fn to_cbor(v: &serde_json::Value, schema: Option<&serde_json::Value>) -> ciborium::Value {
    use base64::Engine as _;
    use ciborium::Value as C;
    use serde_json::Value as J;
    let schema = schema.or_else(|| schema_of(v));
    let child = |key: &str| {
        let s = schema?;
        s.get("properties")
            .and_then(|p| p.get(key))
            .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
    };
    match v {
        J::Null => C::Null,
        J::Bool(b) => C::Bool(*b),
        J::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => C::Integer(u.into()),
            (None, Some(i)) => C::Integer(i.into()),
            _ => C::Float(n.as_f64().unwrap_or_default()),
        },
        J::String(s) => {
            let bytes = schema
                .filter(|s| s.get("format").and_then(J::as_str) == Some("byte"))
                .and_then(|_| base64::engine::general_purpose::STANDARD.decode(s).ok());
            match bytes {
                Some(b) => C::Tag(22, Box::new(C::Bytes(b))),
                None => C::Text(s.clone()),
            }
        }
        J::Array(items) => {
            let item_schema = schema.and_then(|s| s.get("items"));
            C::Array(items.iter().map(|i| to_cbor(i, item_schema)).collect())
        }
        J::Object(m) => C::Map(
            m.iter()
                .map(|(k, v)| (C::Text(k.clone()), to_cbor(v, child(k))))
                .collect(),
        ),
    }
}

/// Re-encodes canonical JSON bytes as a self-described CBOR item.
pub fn from_json(json: &[u8]) -> Result<Vec<u8>, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(json).map_err(ApiError::internal)?;
    encode(&value)
}

/// One watch event as a `cbor-seq` item: a map `{type, object}`.
pub fn watch_event(event_type: &str, object_json: &[u8]) -> Result<Vec<u8>, ApiError> {
    #[derive(Serialize)]
    struct Event<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        object: serde_json::Value,
    }
    let object: serde_json::Value =
        serde_json::from_slice(object_json).map_err(ApiError::internal)?;
    encode(&Event {
        kind: event_type,
        object,
    })
}

/// Decodes exactly one CBOR item (the self-described tag optional); trailing bytes are an
/// error, as one body holds one item.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let bad = |m: String| ApiError::bad_request(format!("error decoding CBOR body: {m}"));
    let rest = body.strip_prefix(&SELF_DESCRIBED[..]).unwrap_or(body);
    if rest.is_empty() {
        return Err(bad("empty body".into()));
    }
    let mut reader = rest;
    let value: ciborium::Value =
        ciborium::from_reader(&mut reader).map_err(|e| bad(e.to_string()))?;
    if !reader.is_empty() {
        return Err(bad(format!("{} bytes after the first item", reader.len())));
    }
    as_strings(value)
        .map_err(bad)?
        .deserialized()
        .map_err(|e| bad(e.to_string()))
}

/// Kubernetes' CBOR (apimachinery's encode modes, which client-go uses) writes every string,
/// field names included, as a byte string, and a `[]byte` field as a byte string tagged 22
/// ("expected conversion to base64"). Objects here are read through their JSON shape, so a
/// byte string becomes the text it holds (which must be UTF-8, as text strings are), and a
/// tagged one the encoding its tag names (22 base64, 21 base64url, 23 base16), which is how
/// JSON carries `[]byte`.
fn as_strings(v: ciborium::Value) -> Result<ciborium::Value, String> {
    use base64::Engine as _;
    use ciborium::Value as V;
    Ok(match v {
        V::Bytes(b) => V::Text(
            String::from_utf8(b).map_err(|_| "a byte string used as a string is not UTF-8")?,
        ),
        V::Tag(tag @ 21..=23, inner) => match *inner {
            V::Bytes(b) => V::Text(match tag {
                21 => base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b),
                22 => base64::engine::general_purpose::STANDARD.encode(b),
                _ => b.iter().map(|x| format!("{x:02x}")).collect(),
            }),
            other => as_strings(other)?,
        },
        V::Tag(SELF_DESCRIBED_TAG, inner) => as_strings(*inner)?,
        V::Tag(t, inner) => V::Tag(t, Box::new(as_strings(*inner)?)),
        V::Array(items) => V::Array(
            items
                .into_iter()
                .map(as_strings)
                .collect::<Result<_, _>>()?,
        ),
        V::Map(entries) => V::Map(
            entries
                .into_iter()
                .map(|(k, v)| Ok((as_strings(k)?, as_strings(v)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other,
    })
}

const SELF_DESCRIBED_TAG: u64 = 55799;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_golden_bytes() {
        let v = serde_json::json!({"a": 1});
        let bytes = encode(&v).unwrap();
        // d9d9f7 (tag 55799), a1 (map of 1), 61 61 ("a"), 01 (1)
        assert_eq!(bytes, [0xd9, 0xd9, 0xf7, 0xa1, 0x61, b'a', 0x01]);
        let back: serde_json::Value = decode(&bytes).unwrap();
        assert_eq!(back, v);
        // Without the tag too.
        let untagged: serde_json::Value = decode(&bytes[3..]).unwrap();
        assert_eq!(untagged, v);
    }

    #[test]
    fn rejects_garbage_and_trailing_items() {
        let mut two = encode(&1).unwrap();
        two.extend_from_slice(&encode(&2).unwrap()[3..]);
        assert_eq!(decode::<serde_json::Value>(&two).unwrap_err().code(), 400);
        assert_eq!(decode::<serde_json::Value>(&[]).unwrap_err().code(), 400);
        assert_eq!(
            decode::<serde_json::Value>(&[0xff, 0x00])
                .unwrap_err()
                .code(),
            400
        );
        let full = encode(&serde_json::json!({"metadata": {"name": "x"}})).unwrap();
        for cut in 0..full.len() {
            let _ = decode::<serde_json::Value>(&full[..cut]);
        }
    }

    #[test]
    fn byte_strings_read_as_strings_and_tagged_ones_as_their_encoding() {
        // {h'6b696e64': h'53656372657459', h'64617461': {h'6b': 22(h'00ff')}}: how client-go
        // writes {"kind": "Secret", "data": {"k": <bytes 00 ff>}}.
        let body = [
            0xa2, 0x44, b'k', b'i', b'n', b'd', 0x46, b'S', b'e', b'c', b'r', b'e', b't', 0x44,
            b'd', b'a', b't', b'a', 0xa1, 0x41, b'k', 0xd6, 0x42, 0x00, 0xff,
        ];
        let v: serde_json::Value = decode(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"kind": "Secret", "data": {"k": "AP8="}})
        );
        // A byte string that is not UTF-8 where a string is expected is a 400, not a panic.
        let bad = [0xa1, 0x41, b'k', 0x42, 0xc3, 0x28];
        let err = decode::<serde_json::Value>(&bad).unwrap_err();
        assert_eq!(err.code(), 400);
        assert!(err.to_string().contains("not UTF-8"), "{err}");
    }

    #[test]
    fn byte_fields_are_written_as_tagged_byte_strings() {
        let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s"}, "data": {"k": "AP8="}});
        let bytes = encode(&secret).unwrap();
        // ... a1 61 6b d6 42 00 ff: {"k": 22(h'00ff')}
        let want = [0xa1, 0x61, b'k', 0xd6, 0x42, 0x00, 0xff];
        assert!(bytes.windows(want.len()).any(|w| w == want), "{bytes:02x?}");
        // Read back, the tag makes it base64 again: the JSON shape round-trips.
        assert_eq!(decode::<serde_json::Value>(&bytes).unwrap(), secret);
        // In a list's items and a watch event's object too; a plain string stays text.
        let list = serde_json::json!({"apiVersion": "v1", "kind": "SecretList",
            "items": [{"data": {"k": "AP8="}}]});
        let bytes = encode(&list).unwrap();
        assert!(bytes.windows(want.len()).any(|w| w == want));
        let event = serde_json::json!({"type": "ADDED", "object": secret});
        let bytes = encode(&event).unwrap();
        assert!(bytes.windows(want.len()).any(|w| w == want));
        let sa = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "AP8="}});
        assert!(!encode(&sa).unwrap().contains(&0xd6));
    }

    #[test]
    fn watch_items_are_maps() {
        let item = watch_event("ADDED", br#"{"kind":"X"}"#).unwrap();
        let v: serde_json::Value = decode(&item).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "ADDED", "object": {"kind": "X"}})
        );
    }
}
