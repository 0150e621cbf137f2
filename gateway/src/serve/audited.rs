//! The audit of a request's response: its status (and, at `RequestResponse`, its object)
//! read from the HTTP response, the stage emitted, and for a watch a body that emits
//! `ResponseComplete` when its stream ends. The policy, events and backends are
//! `security::audit`'s; this is the part that knows HTTP responses.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, SizeHint};
use svc_config::audit::{RawJson, ResponseStatus, Stage};

use crate::http::respond::{self, Body};
use crate::security::audit::{CompleteOnDrop, Record};

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
        return resp.map(|inner| AuditedStream { inner, _end: end }.boxed());
    }
    let want = record.wants_response_object();
    let (resp, status, response) = inspect(&record, resp, want).await;
    let _ = record
        .emit(Stage::ResponseComplete, Some(status), response)
        .await;
    resp
}

/// The response's status (with the `Status` body's message and reason for errors) and,
/// when `want_object`, its JSON body. Only complete (in-memory) bodies are read.
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
    let is_json = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    let complete = resp.body().size_hint().exact().is_some();
    if !(is_json && complete && (code >= 400 || want_object)) {
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
    if code >= 400
        && let Ok(s) = serde_json::from_slice::<ResponseStatus>(&bytes)
    {
        status = ResponseStatus {
            metadata: BTreeMap::new(),
            code,
            ..s
        };
    }
    let object = want_object
        .then(|| record.response_object(&bytes))
        .flatten();
    (
        Response::from_parts(parts, respond::full(bytes)),
        status,
        object,
    )
}

/// A watch stream's body: when it ends (or the client goes away), `ResponseComplete`.
struct AuditedStream {
    inner: Body,
    _end: CompleteOnDrop,
}

impl hyper::body::Body for AuditedStream {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
