//! The protobuf envelope: the `k8s\0` magic prefix followed by a `runtime.Unknown` message
//! whose `typeMeta` names the object and whose `raw` holds the object's own message.

use prost::Message;

use super::wire;
use crate::meta::TypeMeta;
use crate::status::ApiError;

/// `k8s` and an encoding-style byte; 0 is the only style Kubernetes defines (an `Unknown`).
pub const PROTOBUF_MAGIC: [u8; 4] = [0x6b, 0x38, 0x73, 0x00];

/// Wraps an object's message bytes in the envelope, magic prefix included.
pub fn encode_envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let unknown = wire::Unknown {
        type_meta: Some(wire::TypeMeta {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        }),
        raw: raw.to_vec(),
        // Both unset, as Kubernetes writes them: no encoding, and the type is protobuf.
        content_encoding: String::new(),
        content_type: String::new(),
    };
    let mut out = Vec::with_capacity(unknown.encoded_len().saturating_add(PROTOBUF_MAGIC.len()));
    out.extend_from_slice(&PROTOBUF_MAGIC);
    unknown.encode_raw(&mut out);
    out
}

/// Splits an enveloped body into its type header and the object's message bytes.
///
/// Errors use Kubernetes' wording (`protobuf.Serializer.Decode`) and are 400s, except an
/// envelope announcing a `contentEncoding` or a non-protobuf `contentType`, which we cannot
/// read: 415.
pub fn decode_envelope(body: &[u8]) -> Result<(TypeMeta, Vec<u8>), ApiError> {
    let Some(rest) = body.strip_prefix(&PROTOBUF_MAGIC[..]) else {
        return Err(if body.is_empty() {
            ApiError::bad_request("empty data")
        } else {
            // Go prints the prefix as a byte slice: `[107 56 115 0]`.
            ApiError::bad_request(
                "provided data does not appear to be a protobuf message, expected prefix \
                 [107 56 115 0]",
            )
        });
    };
    if rest.is_empty() {
        return Err(ApiError::bad_request("empty body"));
    }
    let unknown = wire::Unknown::decode(rest)
        .map_err(|e| ApiError::bad_request(format!("unable to decode protobuf envelope: {e}")))?;
    if !unknown.content_encoding.is_empty() {
        return Err(ApiError::UnsupportedMediaType(format!(
            "unsupported protobuf contentEncoding {:?}",
            unknown.content_encoding
        )));
    }
    if !unknown.content_type.is_empty() && !super::is_protobuf_media_type(&unknown.content_type) {
        return Err(ApiError::UnsupportedMediaType(format!(
            "unsupported protobuf contentType {:?}",
            unknown.content_type
        )));
    }
    let tm = unknown.type_meta.unwrap_or_default();
    Ok((
        TypeMeta {
            api_version: tm.api_version,
            kind: tm.kind,
        },
        unknown.raw,
    ))
}
