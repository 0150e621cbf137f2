//! The watch handler: where a watch starts (consistent, from a revision, with initial
//! events), its selector, format and deadline, and the cache watcher it reads; the stream
//! itself is `http::stream`'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderValue, Response, StatusCode, header};
use rand::Rng;
use svc_core::ApiError;
use svc_core::object::parse_resource_version;
use svc_core::watch::{FrameFormat, Selector, WatchRequest, WatchStart};

use super::call::{Call, Selectors};
use crate::base::query::ListOptions;
use crate::http::api::Api;
use crate::http::negotiate::Format;
use crate::http::respond::{self, Body};
use crate::http::stream::WatchStream;
use crate::registry::caches::freshness::{wait_for_cache, wait_for_consistent};
use svc_core::registry::Kind;

/// The longest `timeoutSeconds` honoured: a watch open longer than a year ends anyway when the
/// server restarts, and a longer deadline would overflow the clock.
const MAX_WATCH_TIMEOUT: Duration = Duration::from_secs(366 * 24 * 3600);

pub async fn watch<T: Kind>(
    app: &Arc<Api>,
    call: Call,
    opts: ListOptions,
    sel: Selectors,
) -> Result<Response<Body>, ApiError> {
    let cache = app.registry.caches.get(T::INFO);
    let rv = opts.resource_version.as_deref();
    let initial = match (rv, opts.send_initial_events) {
        (_, Some(v)) => v,
        (None | Some("0"), None) => true,
        (Some(_), None) => false,
    };
    // Where the stream starts; "unset" reads are consistent: the cache first catches up with
    // the store's current revision.
    let start = match rv {
        None => {
            wait_for_consistent(app.registry.store.as_ref(), cache).await?;
            if initial {
                WatchStart::InitialEvents {
                    end_bookmark: opts.allow_watch_bookmarks
                        && opts.send_initial_events == Some(true),
                }
            } else {
                WatchStart::Now
            }
        }
        Some("0") if initial => WatchStart::InitialEvents {
            end_bookmark: opts.allow_watch_bookmarks && opts.send_initial_events == Some(true),
        },
        Some("0") => WatchStart::Now,
        Some(v) => {
            let v = parse_resource_version(v)?;
            wait_for_cache(cache, v).await?;
            if initial {
                WatchStart::InitialEvents {
                    end_bookmark: opts.allow_watch_bookmarks,
                }
            } else {
                WatchStart::After(v)
            }
        }
    };
    let format = call.format;
    let req = WatchRequest {
        namespace: (!call.route.namespace.is_empty()).then(|| call.route.namespace.clone()),
        selector: Selector::new(sel.labels, sel.fields),
        start,
        bookmarks: opts.allow_watch_bookmarks,
        format: match format {
            Format::Json => FrameFormat::Json,
            Format::Protobuf(_) => FrameFormat::Protobuf,
            Format::Cbor => FrameFormat::CborSeq,
            Format::Yaml | Format::Table => {
                return Err(ApiError::NotAcceptable(
                    "watch streams are served as JSON, protobuf or CBOR sequences".into(),
                ));
            }
        },
    };
    let (watcher, first) = match cache.watch(req, Instant::now()) {
        Ok(w) => (Some(w), None),
        Err(e @ (ApiError::Expired(_) | ApiError::Gone(_))) => {
            (None, Some(respond::watch_error_frame(format, &e)))
        }
        Err(e) => return Err(e),
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
        Format::Json | Format::Yaml | Format::Table => HeaderValue::from_static("application/json"),
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
