//! The one place that turns errors into HTTP responses: every error becomes a `Status` body
//! with the matching code (and `Retry-After` where the error carries a hint).

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use svc_core::ApiError;
use svc_storage::StoreError;

/// The body type of every response: a full buffer or a stream (watches).
pub type Body = BoxBody<Bytes, std::io::Error>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|e: Infallible| match e {})
        .boxed()
}

/// A JSON response of `value`, pretty-printed when the client asked with `pretty=true`.
pub fn json<T: Serialize>(code: StatusCode, value: &T, pretty: bool) -> Response<Body> {
    let encoded = if pretty {
        serde_json::to_vec_pretty(value)
    } else {
        serde_json::to_vec(value)
    };
    match encoded {
        Ok(mut bytes) => {
            bytes.push(b'\n');
            bytes_response(code, "application/json", bytes)
        }
        Err(e) => error(&ApiError::internal(format!("encoding response: {e}"))),
    }
}

pub fn bytes_response(
    code: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = code;
    if let Ok(v) = HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

pub fn text(code: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = bytes_response(code, "text/plain; charset=utf-8", body);
    resp.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// An object in the negotiated format.
pub fn object<T: svc_core::Resource + svc_core::codec::ProtoKind>(
    code: StatusCode,
    obj: &T,
    format: crate::negotiate::Format,
    pretty: bool,
) -> Response<Body> {
    match format {
        crate::negotiate::Format::Json => json(code, obj, pretty),
        crate::negotiate::Format::Protobuf(ct) => {
            bytes_response(code, ct, svc_core::codec::encode_protobuf(obj))
        }
    }
}

/// The response for an API error: a `Status` object and its code.
pub fn error(err: &ApiError) -> Response<Body> {
    let status = err.to_status();
    let code = StatusCode::from_u16(status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = json(code, &status, false);
    if let Some(secs) = err.retry_after() {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// Maps a storage failure that the handler did not turn into something more specific.
/// Conflicts and not-found are handled where the resource is known; this is the remainder.
pub fn store_error(err: StoreError) -> ApiError {
    match err {
        StoreError::Compacted {
            requested,
            compacted,
        } => ApiError::Expired(format!(
            "The resourceVersion for the provided list is too old: requested {requested}, \
             compacted at {compacted}"
        )),
        StoreError::FutureRevision { requested, current } => {
            ApiError::too_large_resource_version(requested, current)
        }
        StoreError::Unavailable(msg) => {
            ApiError::ServiceUnavailable(format!("storage unavailable: {msg}"))
        }
        StoreError::Closed => ApiError::ServiceUnavailable("storage is shutting down".into()),
        StoreError::Corrupt { location, detail } => {
            ApiError::Internal(format!("stored object at {location} is corrupt: {detail}"))
        }
        other => ApiError::Internal(other.to_string()),
    }
}
