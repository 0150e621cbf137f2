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
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, ApiError> {
    let mut out = SELF_DESCRIBED.to_vec();
    ciborium::into_writer(value, &mut out)
        .map_err(|e| ApiError::internal(format!("encoding CBOR: {e}")))?;
    Ok(out)
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
    value.deserialized().map_err(|e| bad(e.to_string()))
}

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
    fn watch_items_are_maps() {
        let item = watch_event("ADDED", br#"{"kind":"X"}"#).unwrap();
        let v: serde_json::Value = decode(&item).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "ADDED", "object": {"kind": "X"}})
        );
    }
}
