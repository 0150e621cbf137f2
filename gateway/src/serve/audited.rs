//! The audit of a request's response: its status (and, at `RequestResponse`, its object)
//! read from the HTTP response, the stage emitted, and for a watch a body that emits
//! `ResponseComplete` when its stream ends. The policy, events and backends are
//! `security::audit`'s; this is the part that knows HTTP responses.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::Response;
use http_body_util::BodyExt;
use hyper::body::Body as _;
use svc_config::audit::{RawJson, ResponseStatus, Stage};
use svc_core::ResourceInfo;
use svc_core::codec;
use svc_core::registry::{self, Kind, KindVisitor};

use crate::http::negotiate::{Format, body_format};
use crate::http::respond::{self, Body};
use crate::security::audit::Record;
use crate::serve::held::Held;

/// A request that failed authentication: one `ResponseStarted` event with its 401.
pub async fn failed_authentication(record: Record, resp: Response<Body>) -> Response<Body> {
    let (resp, status, _) = inspect(&record, resp, false).await;
    let _ = record
        .emit(Stage::ResponseStarted, Some(status), None)
        .await;
    resp
}

/// A handler that panicked: the `Panic` stage, and a 500 for the client.
pub async fn panicked(record: Record, message: &str) -> Response<Body> {
    let err = svc_core::ApiError::internal(format!("APIServer panic'd: {message}"));
    let resp = respond::error(&err);
    let (resp, status, _) = inspect(&record, resp, false).await;
    let _ = record.emit(Stage::Panic, Some(status), None).await;
    resp
}

/// The end of the request: `ResponseComplete` now, or for a watch `ResponseStarted` now
/// and `ResponseComplete` when its stream ends.
pub async fn finish(record: Record, resp: Response<Body>) -> Response<Body> {
    if record.is_long_running() && resp.status().is_success() {
        let status = ResponseStatus {
            code: resp.status().as_u16(),
            ..Default::default()
        };
        let _ = record
            .emit(Stage::ResponseStarted, Some(status.clone()), None)
            .await;
        let end = record.complete_on_drop(status);
        return resp.map(|inner| Held::new(inner, end).boxed());
    }
    let want = record.wants_response_object();
    let (resp, status, response) = inspect(&record, resp, want).await;
    let _ = record
        .emit(Stage::ResponseComplete, Some(status), response)
        .await;
    resp
}

/// The response's status (with the `Status` body's message and reason for errors) and,
/// when `want_object`, its body as JSON. Only complete (in-memory) bodies are read; one in
/// protobuf, YAML or CBOR is recorded as JSON, as kube-apiserver records it whatever the
/// wire format.
async fn inspect(
    record: &Record,
    resp: Response<Body>,
    want_object: bool,
) -> (Response<Body>, ResponseStatus, Option<RawJson>) {
    let code = resp.status().as_u16();
    let mut status = ResponseStatus {
        code,
        ..Default::default()
    };
    let content_type = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let complete = resp.body().size_hint().exact().is_some();
    if !(complete && (code >= 400 || want_object) && readable(&content_type)) {
        return (resp, status, None);
    }
    let (parts, body) = resp.into_parts();
    let Ok(collected) = body.collect().await else {
        return (
            respond::error(&svc_core::ApiError::internal("reading a response body")),
            status,
            None,
        );
    };
    let bytes = collected.to_bytes();
    let json = body_as_json(record.kind(), &content_type, &bytes);
    if code >= 400
        && let Some(s) = json
            .as_deref()
            .and_then(|j| serde_json::from_slice::<ResponseStatus>(j).ok())
    {
        status = ResponseStatus {
            metadata: BTreeMap::new(),
            code,
            ..s
        };
    }
    let object = want_object
        .then(|| json.and_then(|j| record.response_object(&j)))
        .flatten();
    (
        Response::from_parts(parts, respond::full(bytes)),
        status,
        object,
    )
}

/// The request body as the audit event records it: JSON, converted from the other formats
/// through the route's kind; an empty body, or one that cannot be read, as sent.
pub fn request_as_json(record: &Record, headers: &http::HeaderMap, body: &Bytes) -> Bytes {
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if body.is_empty() || !readable(content_type) {
        return body.clone();
    }
    body_as_json(record.kind(), content_type, body)
        .map(Bytes::from)
        .unwrap_or_else(|| body.clone())
}

/// Whether a body of this media type can be recorded (as JSON): one that names a format the
/// server reads, other than a Table.
fn readable(content_type: &str) -> bool {
    !content_type.is_empty() && matches!(body_format(content_type), Some(f) if f != Format::Table)
}

/// A body as JSON: as is when it is JSON, else decoded (YAML and CBOR as documents; protobuf
/// as a `Status` or as an object of `kind`). None when it cannot be read.
fn body_as_json(
    kind: Option<&'static ResourceInfo>,
    content_type: &str,
    body: &[u8],
) -> Option<Vec<u8>> {
    let value: serde_json::Value = match body_format(content_type)? {
        Format::Json => return Some(body.to_vec()),
        Format::Yaml => codec::yaml::decode(body).ok()?,
        Format::Cbor => codec::cbor::decode(body).ok()?,
        Format::Table | Format::PartialMetadata { .. } => return None,
        Format::Protobuf(_) => {
            let (type_meta, _) = codec::decode_envelope(body).ok()?;
            if type_meta.kind == "Status" {
                return serde_json::to_vec(&codec::decode_status_protobuf(body).ok()?).ok();
            }
            return registry::visit(kind?, ProtobufToJson(body)).flatten();
        }
    };
    serde_json::to_vec(&value).ok()
}

/// Decodes a protobuf object of the visited kind and writes it as JSON.
struct ProtobufToJson<'a>(&'a [u8]);

impl KindVisitor for ProtobufToJson<'_> {
    type Output = Option<Vec<u8>>;
    fn visit<T: Kind>(self) -> Option<Vec<u8>> {
        let obj: T = codec::decode_protobuf(self.0).ok()?;
        serde_json::to_vec(&obj).ok()
    }
}

#[cfg(test)]
mod tests;
