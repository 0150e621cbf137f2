//! Watch streams in JSON (`{"type","object"}` lines): the initial synthetic `ADDED` events,
//! then the store's change feed filtered by namespace and selectors, with bookmarks,
//! `410 Expired` errors for history that is gone, and timeouts.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use rand::Rng;
use serde::Serialize;
use svc_core::object::{self, parse_resource_version};
use svc_core::{ApiError, Resource};
use svc_storage::{Event, EventKind, FeedItem, KeyRange, KeyValue, StoreError};
use tokio::sync::mpsc;

use crate::app::App;
use crate::query::ListOptions;
use crate::respond::{self, Body};
use crate::rest::Call;
use crate::rest::list::Selectors;

/// Frames buffered per watch before the sender waits for the client.
const WATCH_BUFFER: usize = 256;
/// Bookmarks are sent at most this often (and once more just before a timeout ends a watch).
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(30);

#[derive(Serialize)]
struct WatchEvent<'a, T: Serialize> {
    #[serde(rename = "type")]
    kind: &'a str,
    object: T,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BookmarkObject<'a> {
    kind: &'a str,
    api_version: String,
    metadata: BookmarkMeta,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BookmarkMeta {
    resource_version: String,
}

fn frame<T: Serialize>(kind: &str, object: T) -> Result<Bytes, ApiError> {
    let mut v = serde_json::to_vec(&WatchEvent { kind, object }).map_err(ApiError::internal)?;
    v.push(b'\n');
    Ok(Bytes::from(v))
}

fn bookmark<T: Resource>(revision: i64) -> Result<Bytes, ApiError> {
    frame(
        "BOOKMARK",
        BookmarkObject {
            kind: T::INFO.kind,
            api_version: T::INFO.api_version(),
            metadata: BookmarkMeta {
                resource_version: revision.to_string(),
            },
        },
    )
}

fn error_frame(err: &ApiError) -> Bytes {
    frame("ERROR", err.to_status()).unwrap_or_default()
}

pub async fn watch<T: Resource>(
    app: &Arc<App>,
    call: Call,
    opts: ListOptions,
    sel: Selectors,
) -> Result<Response<Body>, ApiError> {
    let range = KeyRange::prefix(T::INFO.prefix(Some(&call.route.namespace)));
    let send_initial = match (opts.resource_version.as_deref(), opts.send_initial_events) {
        (_, Some(v)) => v,
        (None | Some("0"), None) => true,
        (Some(_), None) => false,
    };
    // Where the feed starts, and the state to send first as synthetic ADDED events.
    let (initial, after) = if send_initial {
        let min = match opts.resource_version.as_deref() {
            None | Some("0") => None,
            Some(rv) => Some(parse_resource_version(rv)?),
        };
        if let Some(min) = min {
            crate::rest::wait_for_revision(app, min).await?;
        }
        let res = app
            .store
            .range(range.clone(), None, 0)
            .await
            .map_err(respond::store_error)?;
        (res.kvs, res.revision)
    } else {
        let rv = parse_resource_version(opts.resource_version.as_deref().unwrap_or("0"))?;
        (Vec::new(), rv)
    };

    let timeout = match opts.timeout_seconds {
        Some(s) => Duration::from_secs(s as u64),
        None => {
            let min = app.opts.min_request_timeout;
            min + min.mul_f64(rand::rng().random::<f64>())
        }
    };
    let (tx, rx) = mpsc::channel::<Bytes>(WATCH_BUFFER);
    let app2 = app.clone();
    let bookmarks = opts.allow_watch_bookmarks;
    tokio::spawn(async move {
        let gauge = app2.metrics.watch_gauge(T::INFO.plural);
        gauge.inc();
        let stream = Stream::<T> {
            app: app2.clone(),
            tx,
            sel,
            bookmarks,
            revision: after,
            _kind: std::marker::PhantomData,
        };
        stream
            .run(initial, after, range, timeout, send_initial)
            .await;
        gauge.dec();
    });

    let body = StreamBody::new(tokio_stream_from(rx).map(|b| Ok::<_, Infallible>(Frame::data(b))))
        .map_err(|e: Infallible| match e {});
    let mut resp = Response::new(BodyExt::boxed(body));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}

fn tokio_stream_from(mut rx: mpsc::Receiver<Bytes>) -> impl futures::Stream<Item = Bytes> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

struct Stream<T: Resource> {
    app: Arc<App>,
    tx: mpsc::Sender<Bytes>,
    sel: Selectors,
    bookmarks: bool,
    revision: i64,
    _kind: std::marker::PhantomData<T>,
}

impl<T: Resource> Stream<T> {
    /// Sends one frame; false when the client has gone.
    async fn send(&self, b: Bytes) -> bool {
        let ok = self.tx.send(b).await.is_ok();
        if ok {
            self.app.metrics.watch_event_counter(T::INFO.plural).inc();
        }
        ok
    }

    async fn run(
        mut self,
        initial: Vec<KeyValue>,
        after: i64,
        range: KeyRange,
        timeout: Duration,
        sent_initial: bool,
    ) {
        for kv in &initial {
            match object::decode_from_store::<T>(kv) {
                Ok(obj) if self.sel.matches(&obj) => {
                    let Ok(f) = frame("ADDED", &obj) else {
                        continue;
                    };
                    if !self.send(f).await {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "skipping undecodable object in watch"),
            }
        }
        if sent_initial && self.bookmarks {
            // sendInitialEvents: the bookmark says the initial state is complete.
            if let Ok(b) = bookmark::<T>(after) {
                if !self.send(b).await {
                    return;
                }
            }
        }
        let mut feed = self.app.store.watch(range, after);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut stop = self.app.stop_watches.clone();
        let mut last_bookmark = Instant::now();
        loop {
            let item = tokio::select! {
                item = feed.next() => item,
                _ = tokio::time::sleep_until(deadline) => {
                    if self.bookmarks {
                        if let Ok(b) = bookmark::<T>(self.revision) {
                            let _ = self.send(b).await;
                        }
                    }
                    return;
                }
                _ = crate::app::until_set(&mut stop) => return,
                _ = self.tx.closed() => return,
            };
            match item {
                None => return,
                Some(Err(StoreError::Compacted {
                    requested,
                    compacted,
                })) => {
                    let err = ApiError::Expired(format!(
                        "too old resource version: {requested} ({compacted})"
                    ));
                    let _ = self.send(error_frame(&err)).await;
                    return;
                }
                Some(Err(e)) => {
                    let _ = self.send(error_frame(&respond::store_error(e))).await;
                    return;
                }
                Some(Ok(FeedItem::Progress(rev))) => {
                    self.revision = self.revision.max(rev);
                    if self.bookmarks && last_bookmark.elapsed() >= BOOKMARK_INTERVAL {
                        last_bookmark = Instant::now();
                        let Ok(b) = bookmark::<T>(self.revision) else {
                            continue;
                        };
                        if !self.send(b).await {
                            return;
                        }
                    }
                }
                Some(Ok(FeedItem::Events(events))) => {
                    for ev in &events {
                        self.revision = ev.revision();
                        if let Some(f) = self.event_frame(ev) {
                            if !self.send(f).await {
                                return;
                            }
                        }
                    }
                }
            }
        }
    }

    /// The frame one store event becomes for this watcher, if any: selector transitions turn
    /// into ADDED (starts matching) and DELETED (stops matching).
    fn event_frame(&self, ev: &Event) -> Option<Bytes> {
        let rev = ev.revision();
        let decode = |kv: &KeyValue| -> Option<T> {
            match object::decode_from_store::<T>(kv) {
                Ok(mut o) => {
                    o.meta_mut().resource_version = rev.to_string();
                    Some(o)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "skipping undecodable object in watch");
                    None
                }
            }
        };
        let prev = ev.prev_kv.as_ref().and_then(decode);
        let prev_matches = prev.as_ref().is_some_and(|p| self.sel.matches(p));
        match ev.kind {
            EventKind::Delete => prev
                .filter(|_| prev_matches)
                .and_then(|p| frame("DELETED", &p).ok()),
            EventKind::Put => {
                let cur = decode(&ev.kv)?;
                let cur_matches = self.sel.matches(&cur);
                match (prev.is_some() && prev_matches, cur_matches) {
                    (true, true) => frame("MODIFIED", &cur).ok(),
                    (false, true) => frame("ADDED", &cur).ok(),
                    (true, false) => prev.and_then(|p| frame("DELETED", &p).ok()),
                    (false, false) => None,
                }
            }
        }
    }
}
