//! The watch handler: a watch's frame format, selector and deadline, its start asked of the
//! registry (`registry::watch`), and the response that streams it (`http::stream`).

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Response, StatusCode, header};
use rand::Rng;
use svc_core::ApiError;
use svc_core::watch::{FrameFormat, Selector};

use super::call::{RestRequest, Selectors};
use crate::base::query::ListOptions;
use crate::http::api::Api;
use crate::http::negotiate::Format;
use crate::http::respond::{self, Body};
use crate::http::stream::WatchStream;
use crate::registry;
use crate::registry::watch::WatchFrom;
use svc_core::registry::Kind;

/// The longest `timeoutSeconds` honoured: a watch open longer than a year ends anyway when the
/// server restarts, and a longer deadline would overflow the clock.
const MAX_WATCH_TIMEOUT: Duration = Duration::from_secs(366 * 24 * 3600);

pub async fn watch<T: Kind>(
    app: &Arc<Api>,
    call: RestRequest,
    opts: ListOptions,
    sel: Selectors,
) -> Result<Response<Body>, ApiError> {
    let format = call.format;
    let frames = match format {
        Format::Json => FrameFormat::Json,
        Format::Protobuf(_) => FrameFormat::Protobuf,
        Format::Cbor => FrameFormat::CborSeq,
        Format::PartialMetadata { group, list: false } => FrameFormat::PartialMetadata(group),
        Format::PartialMetadata { list: true, .. } => {
            return Err(ApiError::NotAcceptable(
                "you requested PartialObjectMetadataList, but a watch event's object is not a list"
                    .into(),
            ));
        }
        Format::Yaml | Format::Table => {
            return Err(ApiError::NotAcceptable(
                "watch streams are served as JSON, protobuf or CBOR sequences".into(),
            ));
        }
    };
    let start = WatchFrom {
        namespace: (!call.route.namespace.is_empty()).then(|| call.route.namespace.clone()),
        selector: Selector::new(sel.labels, sel.fields),
        resource_version: opts.resource_version.as_deref(),
        send_initial_events: opts.send_initial_events,
        bookmarks: opts.allow_watch_bookmarks,
        format: frames,
    };
    let (watcher, first) = match registry::watch::start::<T>(&app.registry, start).await? {
        Ok(w) => (Some(w), None),
        // A start the history no longer holds is the stream's only frame (410).
        Err(e) => (None, Some(respond::watch_error_frame(format, &e))),
    };

    let timeout = match opts.timeout_seconds {
        // Negative values were refused with the query; a huge one is as good as a year (and
        // must not overflow the deadline).
        Some(s) => Duration::from_secs(u64::try_from(s).unwrap_or(0)).min(MAX_WATCH_TIMEOUT),
        None => {
            let min = app.opts.min_request_timeout;
            min.saturating_add(min.mul_f64(rand::rng().random::<f64>()))
        }
    };
    let open = app
        .metrics
        .watch_opened(T::INFO, !call.route.namespace.is_empty());
    let deadline = crate::base::deadline::Deadline::later(tokio::time::Instant::now(), timeout);
    let stream = WatchStream::new(
        watcher,
        first,
        deadline,
        open,
        app.metrics.watch_events(T::INFO),
    );
    let mut resp = stream.into_response(app.registry.stop_watches.clone());
    *resp.status_mut() = StatusCode::OK;
    let content_type = match format {
        Format::Json | Format::Yaml | Format::Table | Format::PartialMetadata { .. } => {
            HeaderValue::from_static("application/json")
        }
        Format::Cbor => HeaderValue::from_static("application/cbor-seq"),
        // Kubernetes marks protobuf watch streams with `;stream=watch`.
        Format::Protobuf(ct) => HeaderValue::from_str(&format!("{ct};stream=watch")).unwrap_or(
            HeaderValue::from_static("application/vnd.kubernetes.protobuf;stream=watch"),
        ),
    };
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}
