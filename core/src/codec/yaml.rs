//! YAML (`application/yaml`) request and response bodies. Duplicate keys are refused, as
//! Kubernetes' strict decoding does, rather than silently keeping one of them.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::status::ApiError;

/// Decodes one YAML document.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML body: {e}")))?;
    let options = serde_saphyr::Options {
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
        ..Default::default()
    };
    serde_saphyr::from_str_with_options(text, options)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML body: {e}")))
}

/// Encodes a value as a YAML document.
///
/// The YAML writer emits a string (key or value) that ends in a space as a plain scalar, which
/// every reader trims (`"a "` comes back as `"a"`). A document holding such a string is
/// therefore written as JSON instead, which is also YAML and keeps every string as it is. In
/// compact JSON a space followed by `"` occurs only where a string ends in a space.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, ApiError> {
    let err = |e: &dyn std::fmt::Display| ApiError::internal(format!("encoding YAML: {e}"));
    let json = serde_json::to_vec(value).map_err(|e| err(&e))?;
    if json.windows(2).any(|w| w == b" \"") {
        let mut pretty = serde_json::to_vec_pretty(value).map_err(|e| err(&e))?;
        pretty.push(b'\n');
        return Ok(pretty);
    }
    serde_saphyr::to_string(value)
        .map(String::into_bytes)
        .map_err(|e| err(&e))
}

/// Re-encodes canonical JSON bytes as YAML.
pub fn from_json(json: &[u8]) -> Result<Vec<u8>, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(json).map_err(ApiError::internal)?;
    encode(&value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::ServiceAccount;

    #[test]
    fn decodes_and_round_trips() {
        let sa: ServiceAccount = decode(
            b"apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n  labels: {x: \"1\"}\nautomountServiceAccountToken: false\n",
        )
        .unwrap();
        assert_eq!(sa.metadata.name, "a");
        assert_eq!(sa.automount_service_account_token, Some(false));
        let text = encode(&sa).unwrap();
        let back: ServiceAccount = decode(&text).unwrap();
        assert_eq!(back, sa);
        // JSON is YAML.
        let j: ServiceAccount = decode(br#"{"metadata":{"name":"j"}}"#).unwrap();
        assert_eq!(j.metadata.name, "j");
    }

    #[test]
    fn refuses_duplicates_and_garbage() {
        let dup = decode::<serde_json::Value>(b"a: 1\na: 2\n").unwrap_err();
        assert_eq!(dup.code(), 400);
        assert!(decode::<ServiceAccount>(b"metadata: [unclosed").is_err());
        assert!(decode::<ServiceAccount>(b"\xff\xfe").is_err());
        assert!(decode::<ServiceAccount>(b"secrets: 5").is_err());
    }
}
