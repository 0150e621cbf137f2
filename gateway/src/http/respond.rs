//! The one place that turns errors into HTTP responses: every error becomes a `Status` body
//! with the matching code (and `Retry-After` where the error carries a hint).

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use svc_core::table::IncludeObject;
use svc_core::watch::ListMedia;
use svc_core::{ApiError, Status};

use crate::http::negotiate::Format;
use svc_core::registry::Kind;

/// The body type of every response: a full buffer or a stream (watches).
pub type Body = BoxBody<Bytes, std::io::Error>;

/// `body`, holding `guard` (a place under a limit) until the stream ends or is dropped.
pub fn holding<G: Send + Sync + 'static>(body: Body, guard: G) -> Body {
    Body::new(body.map_frame(move |f| {
        let _held = &guard;
        f
    }))
}

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

/// An object in the negotiated format (a Table of one row for `as=Table`).
pub fn object<T: Kind>(code: StatusCode, obj: &T, format: Format, pretty: bool) -> Response<Body> {
    object_with(code, obj, format, pretty, IncludeObject::Metadata)
}

pub fn object_with<T: Kind>(
    code: StatusCode,
    obj: &T,
    format: Format,
    pretty: bool,
    include: IncludeObject,
) -> Response<Body> {
    let encoded = match format {
        Format::Json => return json(code, obj, pretty),
        Format::Protobuf(ct) => Ok((ct, svc_core::codec::encode_protobuf(obj))),
        Format::Yaml => svc_core::codec::yaml::encode(obj).map(|b| ("application/yaml", b)),
        Format::Cbor => svc_core::codec::cbor::encode(obj).map(|b| ("application/cbor", b)),
        Format::PartialMetadata { list: true, .. } => Err(ApiError::NotAcceptable(format!(
            "you requested PartialObjectMetadataList, but the requested object is not a list ({})",
            T::INFO.kind
        ))),
        Format::PartialMetadata { group, list: false } => serde_json::to_vec(obj)
            .map_err(ApiError::internal)
            .and_then(|json| svc_core::watch::frames::partial_object_metadata(group, &json))
            .map(|b| ("application/json", b)),
        Format::Table => match serde_json::to_value(obj) {
            Ok(v) => {
                let meta = svc_core::ListMeta {
                    resource_version: obj.meta().resource_version.clone(),
                    ..Default::default()
                };
                return json(
                    code,
                    &svc_core::table::table(
                        T::INFO,
                        &meta,
                        vec![v],
                        include,
                        time::OffsetDateTime::now_utc(),
                    ),
                    pretty,
                );
            }
            Err(e) => Err(ApiError::internal(e)),
        },
    };
    match encoded {
        Ok((ct, body)) => bytes_response(code, ct, body),
        Err(e) => error(&e),
    }
}

/// A list that is a whole collection's or namespace's (no selector, no limit, no continue),
/// whose JSON and protobuf bodies are shared by the lists of it at the same revision while a
/// response holds one (`svc_core::watch::shared_list`).
#[derive(Clone, Copy, Debug)]
pub struct Whole<'a> {
    /// The namespace listed; `None`: every namespace.
    pub namespace: Option<&'a str>,
}

impl<'a> Whole<'a> {
    /// A list of `namespace` (empty: every namespace) is whole when it has no selector, no
    /// limit and no continue token.
    pub fn of(
        namespace: &'a str,
        selector: &svc_core::watch::Selector,
        opts: &crate::base::query::ListOptions,
    ) -> Option<Self> {
        let limited = opts.limit.is_some_and(|l| l > 0);
        (selector.is_empty() && !limited && opts.continue_token.is_none()).then_some(Whole {
            namespace: (!namespace.is_empty()).then_some(namespace),
        })
    }
}

/// A list body from `build`, shared as [`Whole`] lists' are when `shared_at` names its
/// revision and namespace.
fn list_body(
    cache: &svc_core::watch::WatchCache,
    shared_at: Option<(i64, Option<&str>)>,
    media: ListMedia,
    build: impl FnOnce() -> Result<Vec<u8>, ApiError>,
) -> Result<Bytes, ApiError> {
    match shared_at {
        Some((revision, namespace)) => cache
            .shared_lists()
            .get_or_build(media, revision, namespace, build),
        None => Ok(Bytes::from(build()?)),
    }
}

/// A list body in the negotiated format, from the items' canonical JSON (spliced, not
/// re-serialized, for JSON; re-encoded per item for the other formats).
pub fn list(
    cache: &svc_core::watch::WatchCache,
    meta: &svc_core::ListMeta,
    items: &[std::sync::Arc<svc_core::watch::CachedObject>],
    format: Format,
    pretty: bool,
    include: IncludeObject,
    whole: Option<Whole<'_>>,
) -> Result<Response<Body>, ApiError> {
    let info = cache.codec().info;
    let api_version = info.api_version();
    let as_value = |items: &[std::sync::Arc<svc_core::watch::CachedObject>]| -> Result<Vec<serde_json::Value>, ApiError> {
        items.iter().map(|o| serde_json::from_slice(&o.json).map_err(ApiError::internal)).collect()
    };
    // The list's JSON, items spliced in as the cache keeps them.
    let spliced = || {
        svc_core::watch::frames::list_json(
            &api_version,
            info.list_kind,
            meta,
            items,
            cache.codec().list_item_types,
        )
    };
    // A whole list at one revision: its body is shared (the metadata is then the revision
    // alone, the items every object at it).
    let shared_at = whole
        .filter(|_| meta.continue_.is_empty() && meta.remaining_item_count.is_none())
        .and_then(|w| Some((meta.resource_version.parse::<i64>().ok()?, w.namespace)));
    let whole = || -> Result<serde_json::Value, ApiError> {
        serde_json::from_slice(&spliced()?).map_err(ApiError::internal)
    };
    Ok(match format {
        Format::Json if pretty => json(StatusCode::OK, &whole()?, true),
        Format::Json => {
            let build = || {
                let mut body = spliced()?;
                body.push(b'\n');
                Ok(body)
            };
            let body = list_body(cache, shared_at, ListMedia::Json, build)?;
            bytes_response(StatusCode::OK, "application/json", body)
        }
        Format::Protobuf(ct) => {
            let build = || -> Result<Vec<u8>, ApiError> {
                let raws: Result<Vec<Bytes>, ApiError> =
                    items.iter().map(|o| cache.object_protobuf(o)).collect();
                Ok(svc_core::codec::encode_list_protobuf_raw(
                    &api_version,
                    info.list_kind,
                    meta,
                    raws?,
                ))
            };
            let body = list_body(cache, shared_at, ListMedia::Protobuf, build)?;
            bytes_response(StatusCode::OK, ct, body)
        }
        Format::Yaml => bytes_response(
            StatusCode::OK,
            "application/yaml",
            svc_core::codec::yaml::encode(&whole()?)?,
        ),
        Format::Cbor => bytes_response(
            StatusCode::OK,
            "application/cbor",
            svc_core::codec::cbor::encode(&whole()?)?,
        ),
        Format::PartialMetadata { list: false, .. } => {
            return Err(ApiError::NotAcceptable(format!(
                "you requested PartialObjectMetadata, but the requested object is a list ({})",
                info.list_kind
            )));
        }
        Format::PartialMetadata { group, list: true } => {
            let mut body =
                svc_core::watch::frames::partial_object_metadata_list(group, meta, items)?;
            body.push(b'\n');
            bytes_response(StatusCode::OK, "application/json", body)
        }
        Format::Table => json(
            StatusCode::OK,
            &svc_core::table::table(
                info,
                meta,
                as_value(items)?,
                include,
                time::OffsetDateTime::now_utc(),
            ),
            pretty,
        ),
    })
}

/// Adds one `Warning: 299 - "<text>"` header per warning.
pub fn with_warnings(mut resp: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in warnings {
        let text = format!("299 - {}", go_quote(w));
        if let Ok(v) = HeaderValue::from_str(&text) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

/// A string quoted the way Go's `%q` does for printable ASCII (what warning headers carry).
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii_graphic() || c == ' ' => out.push(c),
            c => out.push_str(&c.escape_unicode().to_string()),
        }
    }
    out.push('"');
    out
}

/// The response for an API error: a `Status` object in JSON and its code (before a format is
/// negotiated, or outside the resource API).
pub fn error(err: &ApiError) -> Response<Body> {
    error_in(err, Format::Json)
}

/// The response for an API error in the negotiated format: a `Status` object and its code,
/// with `Retry-After` when the error names one.
pub fn error_in(err: &ApiError, format: Format) -> Response<Body> {
    let status = err.to_status();
    let code = StatusCode::from_u16(status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = status_in(code, &status, format, false);
    if let Some(secs) = err.retry_after() {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// A `Status` (an error, or a success naming a deleted object) in the negotiated format:
/// protobuf for protobuf clients, YAML and CBOR for theirs, else JSON (a Table is asked of
/// objects, never of a `Status`).
pub fn status_in(
    code: StatusCode,
    status: &Status,
    format: Format,
    pretty: bool,
) -> Response<Body> {
    let encoded = match format {
        Format::Protobuf(ct) => Ok((ct, svc_core::codec::encode_status_protobuf(status))),
        Format::Yaml => svc_core::codec::yaml::encode(status).map(|b| ("application/yaml", b)),
        Format::Cbor => svc_core::codec::cbor::encode(status).map(|b| ("application/cbor", b)),
        Format::Json | Format::Table | Format::PartialMetadata { .. } => {
            return json(code, status, pretty);
        }
    };
    match encoded {
        Ok((ct, body)) => bytes_response(code, ct, body),
        Err(_) => json(code, status, pretty),
    }
}

/// The `ERROR` frame for a watch that cannot start (e.g. 410: its version is too old),
/// sent in the stream as Kubernetes does, so clients relist.
pub fn watch_error_frame(format: Format, err: &ApiError) -> Bytes {
    let status = err.to_status();
    match format {
        Format::Json | Format::PartialMetadata { .. } => match serde_json::to_vec(&status) {
            Ok(json) => svc_core::watch::frames::json_line("ERROR", &json),
            Err(_) => Bytes::new(),
        },
        Format::Protobuf(_) => {
            let envelope = svc_core::codec::encode_status_protobuf(&status);
            svc_core::codec::encode_watch_event_protobuf("ERROR", &envelope)
                .map(Bytes::from)
                .unwrap_or_default()
        }
        Format::Cbor => serde_json::to_vec(&status)
            .map_err(ApiError::internal)
            .and_then(|json| svc_core::codec::cbor::watch_event("ERROR", &json))
            .map(Bytes::from)
            .unwrap_or_default(),
        // Negotiation never picks these for a watch.
        Format::Yaml | Format::Table => Bytes::new(),
    }
}

/// Adds a `date` header of now, as hyper writes one, unless the response has its own.
pub fn ensure_date(headers: &mut HeaderMap) {
    if !headers.contains_key(header::DATE)
        && let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(std::time::SystemTime::now()))
    {
        headers.insert(header::DATE, v);
    }
}
