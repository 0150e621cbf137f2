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
use svc_core::ApiError;
use svc_core::codec;
use svc_core::object::{self, parse_resource_version};
use svc_storage::{Event, EventKind, FeedItem, KeyRange, KeyValue, StoreError};
use tokio::sync::mpsc;

use crate::app::App;
use crate::negotiate::Format;
use crate::query::ListOptions;
use crate::respond::{self, Body};
use crate::rest::Call;
use crate::rest::Kind;
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

fn json_frame<T: Serialize>(kind: &str, object: T) -> Result<Bytes, ApiError> {
    let mut v = serde_json::to_vec(&WatchEvent { kind, object }).map_err(ApiError::internal)?;
    v.push(b'\n');
    Ok(Bytes::from(v))
}

/// One event in the stream's format: a JSON line, or a length-prefixed protobuf WatchEvent
/// whose object is the enveloped object, as Kubernetes frames them.
fn frame<T: Kind>(format: Format, kind: &str, obj: &T) -> Result<Bytes, ApiError> {
    match format {
        Format::Json => json_frame(kind, obj),
        Format::Protobuf(_) => {
            let envelope = codec::encode_protobuf(obj);
            Ok(Bytes::from(codec::encode_watch_event_protobuf(
                kind, &envelope,
            )?))
        }
    }
}

fn bookmark<T: Kind>(format: Format, revision: i64) -> Result<Bytes, ApiError> {
    match format {
        Format::Json => json_frame(
            "BOOKMARK",
            BookmarkObject {
                kind: T::INFO.kind,
                api_version: T::INFO.api_version(),
                metadata: BookmarkMeta {
                    resource_version: revision.to_string(),
                },
            },
        ),
        Format::Protobuf(_) => {
            // An object of the watched kind carrying only metadata.resourceVersion.
            let mut obj: T = serde_json::from_value(serde_json::json!({
                "metadata": {"resourceVersion": revision.to_string()}
            }))
            .map_err(ApiError::internal)?;
            obj.set_type_meta();
            frame(format, "BOOKMARK", &obj)
        }
    }
}

fn error_frame(format: Format, err: &ApiError) -> Bytes {
    let status = err.to_status();
    let encoded = match format {
        Format::Json => json_frame("ERROR", status),
        Format::Protobuf(_) => {
            let envelope = codec::encode_status_protobuf(&status);
            codec::encode_watch_event_protobuf("ERROR", &envelope).map(Bytes::from)
        }
    };
    encoded.unwrap_or_default()
}

pub async fn watch<T: Kind>(
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
    let format = call.format;
    tokio::spawn(async move {
        let gauge = app2.metrics.watch_gauge(T::INFO.plural);
        gauge.inc();
        let stream = Stream::<T> {
            app: app2.clone(),
            format,
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
    let content_type = match format {
        Format::Json => HeaderValue::from_static("application/json"),
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

fn tokio_stream_from(mut rx: mpsc::Receiver<Bytes>) -> impl futures::Stream<Item = Bytes> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

struct Stream<T: Kind> {
    app: Arc<App>,
    format: Format,
    tx: mpsc::Sender<Bytes>,
    sel: Selectors,
    bookmarks: bool,
    revision: i64,
    _kind: std::marker::PhantomData<T>,
}

impl<T: Kind> Stream<T> {
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
                    let Ok(f) = frame(self.format, "ADDED", &obj) else {
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
            if let Ok(b) = bookmark::<T>(self.format, after)
                && !self.send(b).await
            {
                return;
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
                    if self.bookmarks
                        && let Ok(b) = bookmark::<T>(self.format, self.revision) {
                            let _ = self.send(b).await;
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
                    let _ = self.send(error_frame(self.format, &err)).await;
                    return;
                }
                Some(Err(e)) => {
                    let _ = self
                        .send(error_frame(self.format, &respond::store_error(e)))
                        .await;
                    return;
                }
                Some(Ok(FeedItem::Progress(rev))) => {
                    self.revision = self.revision.max(rev);
                    if self.bookmarks && last_bookmark.elapsed() >= BOOKMARK_INTERVAL {
                        last_bookmark = Instant::now();
                        let Ok(b) = bookmark::<T>(self.format, self.revision) else {
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
                        if let Some(f) = self.event_frame(ev)
                            && !self.send(f).await
                        {
                            return;
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
                .and_then(|p| frame(self.format, "DELETED", &p).ok()),
            EventKind::Put => {
                let cur = decode(&ev.kv)?;
                let cur_matches = self.sel.matches(&cur);
                match (prev.is_some() && prev_matches, cur_matches) {
                    (true, true) => frame(self.format, "MODIFIED", &cur).ok(),
                    (false, true) => frame(self.format, "ADDED", &cur).ok(),
                    (true, false) => prev.and_then(|p| frame(self.format, "DELETED", &p).ok()),
                    (false, false) => None,
                }
            }
        }
    }
}
