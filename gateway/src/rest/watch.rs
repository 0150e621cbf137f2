//! Watch streams served from the watch cache. The response body drives one cache `Watcher`
//! inside the connection's own task (no task or channel per watch): it waits until the
//! watcher is ready, drains a batch of shared pre-encoded frames and writes them as one
//! chunk, adds bookmarks when due, and ends at `timeoutSeconds`, at shutdown, or after an
//! `ERROR` frame (410 when the client fell off the history ring).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use rand::Rng;
use svc_core::ApiError;
use svc_core::object::parse_resource_version;
use svc_core::watch::{FrameFormat, Selector, WatchRequest, WatchStart, Watcher};

use super::call::{Call, Selectors};
use crate::app::App;
use crate::caches::freshness::{wait_for_cache, wait_for_consistent};
use crate::kind::Kind;
use crate::metrics::{OpenWatch, WatchEvents};
use crate::negotiate::Format;
use crate::query::ListOptions;
use crate::respond::{self, Body};

/// The longest `timeoutSeconds` honoured: a watch open longer than a year ends anyway when the
/// server restarts, and a longer deadline would overflow the clock.
const MAX_WATCH_TIMEOUT: Duration = Duration::from_secs(366 * 24 * 3600);

/// Bytes of frames coalesced into one write (one chunk) per wake-up.
const MAX_BATCH_BYTES: usize = 64 * 1024;

/// The state of one watch response body.
struct WatchBody {
    watcher: Option<Watcher>,
    /// Frames to send before anything else (an `ERROR` for a watch that could not start).
    first: Option<Bytes>,
    deadline: tokio::time::Instant,
    /// One timer for the whole stream, aimed at the next bookmark or the deadline and moved
    /// only when that changes: re-arming a timer on every wake-up showed in profiles.
    timer: Pin<Box<tokio::time::Sleep>>,
    /// Resolves at shutdown; kept across wake-ups for the same reason.
    stop: Pin<Box<dyn Future<Output = ()> + Send + Sync>>,
    done: bool,
    /// Counts this watch as open until the body is dropped.
    _open: OpenWatch,
    sent: WatchEvents,
}

fn coalesce(frames: Vec<Bytes>, bytes: usize) -> Bytes {
    if frames.len() == 1 {
        // One frame: hand out the shared bytes themselves, no copy.
        return frames.into_iter().next().unwrap_or_default();
    }
    let mut buf = BytesMut::with_capacity(bytes);
    for f in &frames {
        buf.extend_from_slice(f);
    }
    buf.freeze()
}

impl WatchBody {
    /// The next chunk to write, or None when the stream is over.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if let Some(f) = self.first.take() {
            self.done = self.watcher.is_none();
            self.sent.record(std::slice::from_ref(&f));
            return Some(f);
        }
        if self.done {
            return None;
        }
        let watcher = self.watcher.as_mut()?;
        loop {
            let d = watcher.drain(MAX_BATCH_BYTES, Instant::now());
            if d.finished {
                self.done = true;
            }
            if !d.frames.is_empty() {
                self.sent.record(&d.frames);
                return Some(coalesce(d.frames, d.bytes));
            }
            if self.done {
                return None;
            }
            if d.more {
                continue;
            }
            let ready = watcher.ready();
            let wake_at = watcher
                .next_bookmark_at()
                .map(tokio::time::Instant::from_std)
                .map_or(self.deadline, |b| b.min(self.deadline));
            if self.timer.deadline() != wake_at {
                self.timer.as_mut().reset(wake_at);
            }
            tokio::select! {
                _ = ready => {}
                _ = self.timer.as_mut() => {
                    if tokio::time::Instant::now() >= self.deadline {
                        // A last bookmark tells the client how far it got, so it can resume.
                        self.done = true;
                        return watcher.final_bookmark();
                    }
                    // Otherwise a bookmark is due: the next drain adds it.
                }
                _ = self.stop.as_mut() => {
                    self.done = true;
                    return None;
                }
            }
        }
    }
}

pub async fn watch<T: Kind>(
    app: &Arc<App>,
    call: Call,
    opts: ListOptions,
    sel: Selectors,
) -> Result<Response<Body>, ApiError> {
    let cache = app.caches.get(T::INFO);
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
            wait_for_consistent(app.store.as_ref(), cache).await?;
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
    let deadline = crate::Later::later(tokio::time::Instant::now(), timeout);
    let mut stop_rx = app.stop_watches.clone();
    let state = WatchBody {
        watcher,
        first,
        deadline,
        timer: Box::pin(tokio::time::sleep_until(deadline)),
        stop: Box::pin(async move { crate::lifecycle::until_set(&mut stop_rx).await }),
        done: false,
        _open: open,
        sent: app.metrics.watch_events(T::INFO),
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        let chunk = st.next_chunk().await?;
        Some((Ok::<_, std::io::Error>(Frame::data(chunk)), st))
    });
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(stream)));
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
