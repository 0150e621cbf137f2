//! Protobuf encoding of API objects, byte-compatible with Kubernetes'
//! `application/vnd.kubernetes.protobuf`, which we also serve as `application/vnd.svc.protobuf`.
//!
//! A body is `k8s\0` + `runtime.Unknown{typeMeta, raw}` where `raw` is the object's own message
//! (`k8s.io.api.core.v1.Namespace`, ...). Messages carry no `apiVersion`/`kind`; the envelope
//! does.
//!
//! Watch streams are framed differently, as Kubernetes does it (checked in its source):
//! - `apiserver/pkg/endpoints/handlers/watch.go` encodes each event with
//!   `serializer.StreamSerializer` and embeds the object with `serializer.Serializer`;
//! - `runtime/serializer/codec_factory.go` registers protobuf with
//!   `StreamSerializer: protobuf.NewRawSerializer(..)` and
//!   `Framer: protobuf.LengthDelimitedFramer`;
//! - `RawSerializer` (`runtime/serializer/protobuf/protobuf.go`) writes a message's bytes with
//!   no prefix and no `Unknown`; `util/framer/framer.go` prefixes each write with its length
//!   as a 4-byte big-endian uint32;
//! - `handlers/response.go`'s `watchEncoder.doEncode` sets
//!   `WatchEvent{Type, Object: RawExtension{Raw: <embedded encoder output>}}`, and the
//!   embedded encoder is the enveloping `protobuf.Serializer`.
//!
//! So one event on the wire is `[len: u32 BE][meta.v1.WatchEvent]`, the WatchEvent bare (no
//! magic, no envelope), and its `object.raw` is a full `k8s\0` + `Unknown` of the object
//! (or of a `Status` for `ERROR`). The response content type is
//! `application/vnd.kubernetes.protobuf;stream=watch`.

pub mod cbor;
pub(crate) mod convert;
mod delete_options;
mod envelope;
pub(crate) mod wire;
pub mod yaml;

#[cfg(test)]
mod tests;

use prost::Message;

pub use delete_options::{DeleteOptions, Preconditions};
pub use envelope::{PROTOBUF_MAGIC, decode_envelope, encode_envelope};

use crate::meta::ListMeta;
use crate::resource::Resource;
use crate::status::{ApiError, Status};

/// Our name for the protobuf media type.
pub const MEDIA_TYPE_PROTOBUF: &str = "application/vnd.svc.protobuf";
/// Kubernetes' name for the same bytes, which kubectl and client-go send and accept.
pub const MEDIA_TYPE_KUBERNETES_PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Whether a media type (without parameters) names the protobuf encoding.
pub fn is_protobuf_media_type(media_type: &str) -> bool {
    let essence = media_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case(MEDIA_TYPE_PROTOBUF)
        || essence.eq_ignore_ascii_case(MEDIA_TYPE_KUBERNETES_PROTOBUF)
}

/// The error for protobuf bytes that do not decode as `kind`'s message.
pub(crate) fn decode_error(kind: &str, e: prost::DecodeError) -> ApiError {
    ApiError::bad_request(format!("unable to decode protobuf {kind}: {e}"))
}

/// A kind with a protobuf message. The bytes are the bare object message, without envelope;
/// decoded objects have empty `apiVersion`/`kind` (the envelope carries them).
pub trait ProtoKind: Sized {
    fn to_proto_bytes(&self) -> Vec<u8>;
    fn from_proto_bytes(raw: &[u8]) -> Result<Self, ApiError>;
}

/// Decodes an enveloped request body into `T`, checking the envelope's type header the way
/// `object::decode_json` checks `apiVersion`/`kind`, and filling in the type meta.
pub fn decode_protobuf<T: Resource + ProtoKind>(body: &[u8]) -> Result<T, ApiError> {
    let (tm, raw) = decode_envelope(body)?;
    crate::object::check_type_header::<T>(&tm.api_version, &tm.kind)?;
    let mut obj = T::from_proto_bytes(&raw)?;
    obj.set_type_meta();
    Ok(obj)
}

/// The enveloped form of one object, with the type's canonical `apiVersion`/`kind`.
pub fn encode_protobuf<T: Resource + ProtoKind>(obj: &T) -> Vec<u8> {
    let info = T::INFO;
    encode_envelope(&info.api_version(), info.kind, &obj.to_proto_bytes())
}

/// The enveloped form of a list (`NamespaceList`, ...).
pub fn encode_list_protobuf<T: ProtoKind>(
    api_version: &str,
    list_kind: &str,
    list_meta: &ListMeta,
    items: &[T],
) -> Vec<u8> {
    encode_list_protobuf_raw(
        api_version,
        list_kind,
        list_meta,
        items.iter().map(ProtoKind::to_proto_bytes),
    )
}

/// Like [`encode_list_protobuf`] for items already encoded with [`ProtoKind::to_proto_bytes`]
/// (bare messages, not envelopes), e.g. cached by the watch cache.
pub fn encode_list_protobuf_raw<I>(
    api_version: &str,
    list_kind: &str,
    list_meta: &ListMeta,
    items: I,
) -> Vec<u8>
where
    I: IntoIterator,
    I::Item: AsRef<[u8]>,
{
    let list = wire::RawList {
        metadata: Some(convert::list_meta_to_wire(list_meta)),
        items: items.into_iter().map(|i| i.as_ref().to_vec()).collect(),
    };
    encode_envelope(api_version, list_kind, &list.encode_to_vec())
}

/// The enveloped form of a `Status` (error responses, some deletes, watch `ERROR` events).
pub fn encode_status_protobuf(status: &Status) -> Vec<u8> {
    let api_version = non_empty(&status.api_version, "v1");
    let kind = non_empty(&status.kind, "Status");
    let raw = convert::status_to_wire(status).encode_to_vec();
    encode_envelope(api_version, kind, &raw)
}

/// Decodes an enveloped `Status`, as a client reads an error response.
pub fn decode_status_protobuf(body: &[u8]) -> Result<Status, ApiError> {
    let (tm, raw) = decode_envelope(body)?;
    if !tm.kind.is_empty() && tm.kind != "Status" {
        return Err(ApiError::bad_request(format!(
            "expected a Status, got kind {:?}",
            tm.kind
        )));
    }
    let m = wire::Status::decode(raw.as_slice())
        .map_err(|e| ApiError::bad_request(format!("unable to decode protobuf Status: {e}")))?;
    let mut status = convert::status_from_wire(m);
    status.api_version = non_empty(&tm.api_version, "v1").to_string();
    status.kind = "Status".to_string();
    Ok(status)
}

fn non_empty<'a>(s: &'a str, default: &'a str) -> &'a str {
    if s.is_empty() { default } else { s }
}

/// One watch event as a complete frame: `[len: u32 BE][meta.v1.WatchEvent]` (see the module
/// doc for why the event itself is bare). `object_envelope` is the output of
/// [`encode_protobuf`] (or [`encode_status_protobuf`] for `ERROR`), so an object encoded once
/// can be shared by every watcher.
///
/// Fails only for a frame over 4 GiB, which the length prefix cannot express.
pub fn encode_watch_event_protobuf(
    event_type: &str,
    object_envelope: &[u8],
) -> Result<Vec<u8>, ApiError> {
    let event = wire::WatchEvent {
        r#type: event_type.to_string(),
        object: Some(wire::RawExtension {
            raw: object_envelope.to_vec(),
        }),
    };
    let len = event.encoded_len();
    let prefix = u32::try_from(len)
        .map_err(|_| ApiError::internal(format!("watch event of {len} bytes is too large")))?;
    let mut out = Vec::with_capacity(len.saturating_add(4));
    out.extend_from_slice(&prefix.to_be_bytes());
    event.encode_raw(&mut out);
    Ok(out)
}

/// Reads one complete frame written by [`encode_watch_event_protobuf`]: the event type and the
/// object's envelope. For clients and tests; `frame` must be exactly one frame.
pub fn decode_watch_event_protobuf(frame: &[u8]) -> Result<(String, Vec<u8>), ApiError> {
    let Some((len, body)) = frame.split_first_chunk::<4>() else {
        return Err(ApiError::bad_request(
            "watch frame shorter than its length prefix",
        ));
    };
    let len = u32::from_be_bytes(*len);
    if usize::try_from(len).ok() != Some(body.len()) {
        return Err(ApiError::bad_request(format!(
            "watch frame announces {len} bytes but carries {}",
            body.len()
        )));
    }
    let event = wire::WatchEvent::decode(body)
        .map_err(|e| ApiError::bad_request(format!("unable to decode protobuf WatchEvent: {e}")))?;
    Ok((event.r#type, event.object.unwrap_or_default().raw))
}
