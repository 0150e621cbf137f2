//! YAML (`application/yaml`) request and response bodies. Duplicate keys are refused, as
//! Kubernetes' strict decoding does, rather than silently keeping one of them.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::status::ApiError;

/// Decodes one YAML document.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML body: {e}")))?;
    let options = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
    };
    serde_saphyr::from_str_with_options(text, options)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML body: {e}")))
}

/// Encodes a value as a YAML document. Sequences under a key are indented one step, as this
/// server has always written them.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, ApiError> {
    let options = serde_saphyr::ser_options! {
        compact_list_indent: false,
    };
    serde_saphyr::to_string_with_options(value, options)
        .map(String::into_bytes)
        .map_err(|e| ApiError::internal(format!("encoding YAML: {e}")))
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
    fn strings_that_need_quoting_come_back_as_they_were() {
        // serde-saphyr 0.0 wrote a string ending in a space as a plain scalar, which readers
        // trim; encode wrote such documents as JSON. 2.x quotes them, so YAML is written
        // always and these must round-trip through it.
        let tricky = [
            "a ",
            " a",
            "a\t",
            " ",
            "",
            "a \n",
            "a\n ",
            "yes",
            "no",
            "on",
            "null",
            "~",
            "0.0.0.0",
            "1e3",
            "0x1f",
            "2024-01-01T00:00:00Z",
            "- a",
            "a: b",
            "#a",
            "a #b",
            "'",
            "\"",
            "{",
            "[",
            "*a",
            "&a",
            "!a",
            "%a",
            "@a",
            "`a",
            "a\u{85}b",
            "\u{feff}a",
        ];
        let map: serde_json::Map<String, serde_json::Value> = tricky
            .iter()
            .map(|s| {
                (
                    (*s).to_string(),
                    serde_json::Value::String((*s).to_string()),
                )
            })
            .collect();
        let value = serde_json::json!({"data": map, "list": tricky});
        let text = encode(&value).unwrap();
        assert!(!text.starts_with(b"{"), "written as YAML, not JSON");
        let back: serde_json::Value = decode(&text).unwrap();
        assert_eq!(back, value, "{}", String::from_utf8_lossy(&text));
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
