//! Watch streams served from the watch cache. A [`WatchStream`] drives one cache `Watcher`
//! (no task or channel per watch): polled, it drains a batch of shared pre-encoded frames and
//! yields them as one chunk, adds bookmarks when due, and ends at `timeoutSeconds` or after
//! an `ERROR` frame (410 when the client fell off the history ring). Its server keeps the
//! clock and the shutdown signal: over HTTP/1.1 the response body ([`WatchBody`]) has a
//! timer of its own; over h2 the connection task (`serve::h2conn`) takes the stream from the
//! response ([`WatchHandoff`]) and drives all of its watches with one timer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::Response;
use http_body_util::BodyExt;
use hyper::body::Frame;
use parking_lot::Mutex;
use svc_core::watch::Watcher;

use crate::http::respond::Body;
use crate::observe::metrics::{OpenWatch, WatchEvents};

/// Bytes of frames coalesced into one write (one chunk) per wake-up.
pub const MAX_BATCH_BYTES: usize = 64 * 1024;

/// One watch stream, polled by whoever serves the connection: an HTTP/1.1 response body
/// ([`WatchBody`]) or the h2 connection task (`h2conn.rs`). It keeps no timer and no stop
/// future of its own: its server wakes it at [`WatchStream::wake_at`] and ends it at shutdown.
pub struct WatchStream {
    watcher: Option<Watcher>,
    /// Frames to send before anything else (an `ERROR` for a watch that could not start).
    first: Option<Bytes>,
    deadline: tokio::time::Instant,
    done: bool,
    /// The last drain left nothing ready: wait for the watcher before draining again.
    idle: bool,
    /// Counts this watch as open until the stream is dropped.
    _open: OpenWatch,
    sent: WatchEvents,
}

/// One chunk of a batch's frames: the shared bytes themselves when there is one, else a copy.
pub fn coalesce(frames: Vec<Bytes>, bytes: usize) -> Bytes {
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

impl WatchStream {
    /// The next chunk to write, `Ready(None)` once the stream is over, or `Pending` with `cx`
    /// registered to be woken when the watcher has something. Time is not watched here: the
    /// caller also wakes the stream at [`Self::wake_at`] (a bookmark or the deadline is due).
    /// The task group that drives this stream (see `Watcher::set_wake_group`).
    pub fn set_wake_group(&self, group: u64) {
        if let Some(w) = &self.watcher {
            w.set_wake_group(group);
        }
    }

    /// What another watch must share with this one to be served from one registration
    /// (`Watcher::share_key`): None while it has anything of its own to send first.
    pub fn share_key(&self) -> Option<svc_core::watch::ShareKey> {
        if self.first.is_some() || self.done {
            return None;
        }
        self.watcher.as_ref().and_then(Watcher::share_key)
    }

    /// Takes the watcher out: the stream is then served from another's frames, and keeps
    /// its deadline and its counts.
    pub fn take_watcher(&mut self) -> Option<Watcher> {
        self.watcher.take()
    }

    /// Serves the stream from its own watcher again.
    pub fn put_watcher(&mut self, watcher: Watcher) {
        self.watcher = Some(watcher);
        self.idle = false;
    }

    /// Counts frames written to this stream that its own watcher did not give (shared:
    /// `times` streams got them).
    pub fn record_shared(&self, frames: &[Bytes], times: usize) {
        self.sent.record_times(frames, times);
    }

    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        self.poll_chunk_within(cx, MAX_BATCH_BYTES, tokio::time::Instant::now())
    }

    /// Whether [`Self::poll_chunk`] has something to give (frames, a bookmark, the end), without
    /// draining: a server asks for room to send only then. Pending registers the waker as
    /// `poll_chunk` would; a Ready may still find nothing (the chunk's poll then waits).
    /// `now` is the caller's clock reading for this poll (one per wake-up, not one per check).
    pub fn poll_ready(&mut self, cx: &mut Context<'_>, now: tokio::time::Instant) -> Poll<()> {
        if self.first.is_some() || self.done || !self.idle {
            return Poll::Ready(());
        }
        let Some(watcher) = self.watcher.as_mut() else {
            return Poll::Ready(());
        };
        if watcher.poll_ready(cx).is_ready() {
            self.idle = false;
            return Poll::Ready(());
        }
        // Nothing from the cache: only the clock can have something due.
        if now >= self.deadline
            || watcher
                .next_bookmark_at()
                .is_some_and(|b| b <= now.into_std())
        {
            return Poll::Ready(());
        }
        Poll::Pending
    }

    /// As [`Self::poll_chunk`], with at most about `max_bytes` (at least one frame).
    pub fn poll_chunk_within(
        &mut self,
        cx: &mut Context<'_>,
        max_bytes: usize,
        now: tokio::time::Instant,
    ) -> Poll<Option<Bytes>> {
        self.poll_batch_within(cx, max_bytes, now).map(|b| {
            b.map(|frames| {
                let bytes = frames.iter().fold(0usize, |n, f| n.saturating_add(f.len()));
                coalesce(frames, bytes)
            })
        })
    }

    /// As [`Self::poll_chunk_within`], the frames as the cache shares them (not copied into
    /// one chunk): for a server that frames them itself.
    pub fn poll_batch_within(
        &mut self,
        cx: &mut Context<'_>,
        max_bytes: usize,
        now: tokio::time::Instant,
    ) -> Poll<Option<Vec<Bytes>>> {
        if let Some(f) = self.first.take() {
            self.done = self.watcher.is_none();
            self.sent.record(std::slice::from_ref(&f));
            return Poll::Ready(Some(vec![f]));
        }
        if self.done {
            return Poll::Ready(None);
        }
        let Some(watcher) = self.watcher.as_mut() else {
            return Poll::Ready(None);
        };
        let std_now = now.into_std();
        loop {
            if now >= self.deadline {
                // A last bookmark tells the client how far it got, so it can resume.
                self.done = true;
                return Poll::Ready(watcher.final_bookmark().map(|b| vec![b]));
            }
            // A bookmark that fell due while idle still needs the drain that adds it.
            let bookmark_due =
                self.idle && watcher.next_bookmark_at().is_some_and(|b| b <= std_now);
            if self.idle && !bookmark_due {
                self.idle = false;
            } else {
                self.idle = false;
                let d = watcher.drain(max_bytes.min(MAX_BATCH_BYTES), std_now);
                if d.finished {
                    self.done = true;
                }
                if !d.frames.is_empty() {
                    self.sent.record(&d.frames);
                    // Nothing else was ready: next time wait first instead of draining again
                    // for nothing (one drain per wake-up, not two).
                    self.idle = !d.more;
                    return Poll::Ready(Some(d.frames));
                }
                if self.done {
                    return Poll::Ready(None);
                }
                if d.more {
                    continue;
                }
            }
            if watcher.poll_ready(cx).is_pending() {
                // Drained to nothing: wait for the watcher before draining again. Left
                // unset, `poll_ready` answered Ready at once, and an h2 stream asked for
                // room, was given it, drained nothing and gave it back, again and again: an
                // idle proxy with a few kubelets spent 1.4 cores so.
                self.idle = true;
                return Poll::Pending;
            }
        }
    }

    /// When the stream must be polled again even if the watcher stays quiet: its next
    /// bookmark or its deadline, whichever comes first.
    pub fn wake_at(&self) -> tokio::time::Instant {
        self.watcher
            .as_ref()
            .and_then(Watcher::next_bookmark_at)
            .map(tokio::time::Instant::from_std)
            .map_or(self.deadline, |b| b.min(self.deadline))
    }

    /// The end of `timeoutSeconds`.
    pub fn deadline(&self) -> tokio::time::Instant {
        self.deadline
    }
}

/// Where a watch response keeps its stream until a server takes it: the h2 connection task
/// takes it from the response's extensions; an HTTP/1.1 body takes it when first polled.
/// The stream is boxed: the response body keeps the handoff (empty, once taken) as long as
/// the watch lasts, and an empty slot the size of a stream cost every h2 watch 300 bytes.
#[derive(Clone)]
pub struct WatchHandoff(Arc<Mutex<Option<Box<WatchStream>>>>);

impl WatchHandoff {
    pub fn take(&self) -> Option<Box<WatchStream>> {
        self.0.lock().take()
    }
}

/// A watch response body for HTTP/1.1 (one per connection task): the stream with its own
/// timer (moved only when its target changes: re-arming on every wake-up showed in profiles)
/// and its own shutdown future, both made when first polled (never, over h2).
struct WatchBody {
    handoff: Option<WatchHandoff>,
    /// Boxed: over h2 the body is kept, and never polled, for as long as its watch lasts.
    stream: Option<Box<WatchStream>>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    stop_rx: tokio::sync::watch::Receiver<bool>,
    stop: Option<Pin<Box<dyn Future<Output = ()> + Send + Sync>>>,
}

impl hyper::body::Body for WatchBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        if let Some(h) = this.handoff.take() {
            this.stream = h.take();
        }
        let Some(stream) = this.stream.as_mut() else {
            return Poll::Ready(None);
        };
        let stop = this.stop.get_or_insert_with(|| {
            let mut rx = this.stop_rx.clone();
            Box::pin(async move { crate::base::lifecycle::until_set(&mut rx).await })
        });
        if stop.as_mut().poll(cx).is_ready() {
            this.stream = None;
            return Poll::Ready(None);
        }
        loop {
            match stream.poll_chunk(cx) {
                Poll::Ready(Some(chunk)) => return Poll::Ready(Some(Ok(Frame::data(chunk)))),
                Poll::Ready(None) => {
                    this.stream = None;
                    return Poll::Ready(None);
                }
                Poll::Pending => {}
            }
            let wake_at = stream.wake_at();
            let timer = this
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(wake_at)));
            if timer.deadline() != wake_at {
                timer.as_mut().reset(wake_at);
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl WatchStream {
    /// A stream over `watcher` (None when the watch could not start: then `first`, its
    /// `ERROR` frame, is all it sends), ending at `deadline`.
    pub fn new(
        watcher: Option<Watcher>,
        first: Option<Bytes>,
        deadline: tokio::time::Instant,
        open: OpenWatch,
        sent: WatchEvents,
    ) -> Self {
        WatchStream {
            watcher,
            first,
            deadline,
            done: false,
            idle: false,
            _open: open,
            sent,
        }
    }

    /// The response that serves this stream: over HTTP/1.1 its body drives it; over h2 the
    /// connection task takes it from the response's extensions ([`WatchHandoff`]).
    pub fn into_response(self, stop_watches: tokio::sync::watch::Receiver<bool>) -> Response<Body> {
        let handoff = WatchHandoff(Arc::new(Mutex::new(Some(Box::new(self)))));
        let body = WatchBody {
            handoff: Some(handoff.clone()),
            stream: None,
            timer: None,
            stop_rx: stop_watches,
            stop: None,
        };
        let mut resp = Response::new(BodyExt::boxed(body));
        resp.extensions_mut().insert(handoff);
        resp
    }
}

/// The longest `timeoutSeconds` honoured: a watch open longer than a year ends anyway when the
/// server restarts, and a longer deadline would overflow the clock.
const MAX_WATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(366 * 24 * 3600);

/// The response of a watch of `info` that `watcher` serves (None when it could not start:
/// then `first`, its `ERROR` frame, is all it sends), in `format`, until `timeoutSeconds` or
/// else a random time between `--min-request-timeout` and twice that, as Kubernetes picks it.
pub fn watch_response(
    api: &crate::http::api::Api,
    info: &'static svc_core::ResourceInfo,
    namespaced: bool,
    watcher: Option<Watcher>,
    first: Option<Bytes>,
    timeout_seconds: Option<i64>,
    format: crate::http::negotiate::Format,
) -> Response<Body> {
    use crate::http::negotiate::Format;
    use http::{HeaderValue, StatusCode, header};
    use rand::Rng as _;
    let timeout = match timeout_seconds {
        // Negative values were refused with the query; a huge one is as good as a year (and
        // must not overflow the deadline).
        Some(s) => {
            std::time::Duration::from_secs(u64::try_from(s).unwrap_or(0)).min(MAX_WATCH_TIMEOUT)
        }
        None => {
            let min = api.opts.min_request_timeout;
            min.saturating_add(min.mul_f64(rand::rng().random::<f64>()))
        }
    };
    let open = api.metrics.watch_opened(info, namespaced);
    let deadline = crate::base::deadline::Deadline::later(tokio::time::Instant::now(), timeout);
    let stream = WatchStream::new(
        watcher,
        first,
        deadline,
        open,
        api.metrics.watch_events(info),
    );
    let mut resp = stream.into_response(api.stop_watches.clone());
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
    resp
}

#[cfg(test)]
mod tests {
    use std::task::Waker;
    use std::time::{Duration, Instant};

    use svc_core::Resource as _;
    use svc_core::kinds::ServiceAccount;
    use svc_core::selector::{FieldSelector, LabelSelector};
    use svc_core::watch::{
        FrameFormat, KindCodec, Selector, WatchCache, WatchCacheConfig, WatchRequest, WatchStart,
    };

    use super::*;
    use crate::observe::metrics::Metrics;

    #[test]
    fn what_an_h2_watch_keeps_of_its_response_body_is_small() {
        // Over h2 the body and its emptied handoff last as long as the watch, never polled:
        // a stream's worth of room in either is paid by every watch of a million.
        let handoff = std::mem::size_of::<Mutex<Option<Box<WatchStream>>>>();
        let body = std::mem::size_of::<WatchBody>();
        assert!(handoff <= 16, "{handoff}");
        assert!(body <= 64, "{body}");
        assert!(
            std::mem::size_of::<WatchStream>() > body,
            "the stream is what is boxed"
        );
    }

    #[test]
    fn a_stream_drained_to_nothing_waits_for_its_watcher() {
        let cache = WatchCache::new(
            KindCodec::with_protobuf::<ServiceAccount>(),
            WatchCacheConfig::default(),
        );
        cache.replace(&[], 1, Instant::now());
        let selector = Selector::new(
            LabelSelector::parse("").unwrap(),
            FieldSelector::parse("", |_| true).unwrap(),
        );
        let watcher = cache
            .watch(
                WatchRequest {
                    namespace: None,
                    selector,
                    start: WatchStart::Now,
                    bookmarks: true,
                    format: FrameFormat::Json,
                },
                Instant::now(),
            )
            .unwrap();
        let metrics = Metrics::new();
        let info = ServiceAccount::INFO;
        let mut stream = WatchStream::new(
            Some(watcher),
            None,
            tokio::time::Instant::now() + Duration::from_secs(600),
            metrics.watch_opened(info, true),
            metrics.watch_events(info),
        );
        let mut cx = Context::from_waker(Waker::noop());
        // A new stream has its first drain, which finds nothing.
        assert!(
            stream
                .poll_ready(&mut cx, tokio::time::Instant::now())
                .is_ready()
        );
        assert!(stream.poll_chunk(&mut cx).is_pending());
        // Then it waits for the watcher: its server asks h2 for room only once there is
        // something to send.
        assert!(
            stream
                .poll_ready(&mut cx, tokio::time::Instant::now())
                .is_pending()
        );
        assert!(stream.poll_chunk(&mut cx).is_pending());
        assert!(
            stream
                .poll_ready(&mut cx, tokio::time::Instant::now())
                .is_pending()
        );
    }
}
