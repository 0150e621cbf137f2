//! The upstream's list and watch protocol, as proxy mode reads it: collection paths; lists
//! read page by page, at the newest revision or exactly at one; streaming lists read up to
//! their `initial-events-end` bookmark; watches opened with bookmarks; and the lines of a
//! JSON watch stream read into the store's change-feed types (`Event`, `FeedItem`), each
//! object with its key and its JSON with its type, as a watch cache takes them. The caches
//! these fill live in `registry/caches/upstream/`; nothing here holds one.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt as _;
use serde::Deserialize;
use serde_json::value::RawValue;
use svc_core::ResourceInfo;
use svc_core::watch::unstructured::{ObjectHead, with_type_meta};
use svc_storage::{Event, EventKind, KeyValue, Revision};

use crate::outbound::client;
use crate::outbound::upstream::{CALL_TIMEOUT, Upstream};

/// Items per page of the upstream list.
const PAGE: usize = 500;
/// How long one page of the upstream list may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest list page read (500 large objects).
const MAX_PAGE_BYTES: usize = 512 << 20;
/// The longest watch event line read (an object is at most 1.5 MiB in etcd; room to spare).
pub const MAX_LINE: usize = 16 << 20;
/// How long a streaming list may take to send the initial state.
pub const STREAMING_LIST_TIMEOUT: Duration = Duration::from_secs(120);

/// The collection path of a resource upstream (`/api/v1/pods`, `/apis/apps/v1/deployments`).
pub fn collection_path(info: &ResourceInfo) -> String {
    if info.group.is_empty() {
        format!("/api/{}/{}", info.version, info.plural)
    } else {
        format!("/apis/{}/{}/{}", info.group, info.version, info.plural)
    }
}

/// The path of a namespace's part of a namespaced resource's collection.
pub fn namespaced_path(info: &ResourceInfo, namespace: &str) -> String {
    let namespace: String = form_urlencoded::byte_serialize(namespace.as_bytes()).collect();
    if info.group.is_empty() {
        format!(
            "/api/{}/namespaces/{namespace}/{}",
            info.version, info.plural
        )
    } else {
        format!(
            "/apis/{}/{}/namespaces/{namespace}/{}",
            info.group, info.version, info.plural
        )
    }
}

#[derive(Deserialize)]
struct ListPage<'a> {
    #[serde(default)]
    metadata: ListHead,
    #[serde(borrow, default)]
    items: Vec<&'a RawValue>,
}

#[derive(Default, Deserialize)]
struct ListHead {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
    #[serde(default, rename = "continue")]
    continue_: String,
}

pub fn parse_rv(rv: &str) -> Result<Revision, String> {
    rv.parse::<Revision>()
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| format!("resourceVersion {rv:?} is not a positive integer"))
}

/// One object of `info` as the cache takes it: its key and JSON (with its type).
pub fn key_value(info: &ResourceInfo, raw: Bytes) -> Result<KeyValue, String> {
    let head: ObjectHead<'_> = serde_json::from_slice(&raw).map_err(|e| e.to_string())?;
    let rev = parse_rv(&head.metadata.resource_version)?;
    let key = Bytes::from(info.key(&head.metadata.namespace, &head.metadata.name));
    let value = with_type_meta(raw.clone(), &head, &info.api_version(), info.kind);
    Ok(KeyValue {
        key,
        value,
        create_revision: rev,
        mod_revision: rev,
        version: 1,
    })
}

/// Every object of `info` upstream, page by page, and the revision of the read: the newest,
/// or exactly `at` (an error when the upstream no longer holds it). A page whose continue
/// token expired starts the list over.
pub async fn list(
    upstream: &Upstream,
    info: &'static ResourceInfo,
    at: Option<Revision>,
) -> Result<(Vec<KeyValue>, Revision), String> {
    let path = collection_path(info);
    'again: loop {
        let mut kvs = Vec::new();
        let mut token = String::new();
        let mut revision = None;
        loop {
            let url = {
                let mut query = form_urlencoded::Serializer::new(String::new());
                query.append_pair("limit", &PAGE.to_string());
                if !token.is_empty() {
                    query.append_pair("continue", &token);
                } else if let Some(at) = at {
                    query.append_pair("resourceVersion", &at.to_string());
                    query.append_pair("resourceVersionMatch", "Exact");
                }
                format!("{path}?{}", query.finish())
            };
            let (status, body) = upstream
                .get(&url, "application/json", MAX_PAGE_BYTES, LIST_TIMEOUT)
                .await?;
            if status == http::StatusCode::GONE && !token.is_empty() {
                continue 'again;
            }
            if !status.is_success() {
                return Err(format!(
                    "{path} answered {}: {}",
                    status.as_u16(),
                    String::from_utf8_lossy(body.get(..512).unwrap_or(&body))
                ));
            }
            let page: ListPage<'_> = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
            if revision.is_none() {
                revision = Some(parse_rv(&page.metadata.resource_version)?);
            }
            for item in page.items {
                kvs.push(key_value(info, body.slice_ref(item.get().as_bytes()))?);
            }
            if page.metadata.continue_.is_empty() {
                let rev = revision.unwrap_or_default();
                return Ok((kvs, rev));
            }
            token = page.metadata.continue_;
        }
    }
}

/// The initial events of a streaming list from the newest state, up to its
/// `initial-events-end` bookmark; None when the upstream refuses streaming lists.
pub async fn streaming_list(
    upstream: &Upstream,
    info: &'static ResourceInfo,
) -> Result<Option<(Vec<KeyValue>, Revision)>, String> {
    let url = format!(
        "{}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan\
         &allowWatchBookmarks=true&timeoutSeconds={}",
        collection_path(info),
        STREAMING_LIST_TIMEOUT.as_secs()
    );
    let request = json_get(&url)?;
    let response = tokio::time::timeout(CALL_TIMEOUT, upstream.send(request))
        .await
        .map_err(|_| format!("{url}: no answer within {CALL_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    if response.status().is_client_error() {
        return Ok(None);
    }
    if !response.status().is_success() {
        return Err(format!("{url} answered {}", response.status()));
    }
    let mut kvs = Vec::new();
    let end = lines(WatchBody(response.into_body()), |line| {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let parsed: Line<'_> = serde_json::from_slice(line).map_err(|e| e.to_string())?;
        let raw = line.slice_ref(parsed.object.get().as_bytes());
        match &*parsed.ty {
            "ADDED" => {
                kvs.push(key_value(info, raw)?);
                Ok(None)
            }
            "BOOKMARK" => Ok(Bookmark::initial_events_end(&raw)?.map(Some)),
            // An upstream that does not stream lists answers a plain watch, or its refusal
            // as an event: pages instead.
            _ => Ok(Some(None)),
        }
    })
    .await?;
    Ok(end.flatten().map(|rv| (kvs, rv)))
}

/// Feeds the lines of a watch body to `each` until it returns a value or the body ends.
pub async fn lines<T>(
    mut body: WatchBody,
    mut each: impl FnMut(&Bytes) -> Result<Option<T>, String>,
) -> Result<Option<T>, String> {
    let mut buf = BytesMut::new();
    while let Some(data) = body.chunk().await {
        buf.extend_from_slice(&data?);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line = buf.split_to(nl.saturating_add(1)).freeze();
            if let Some(v) = each(&line)? {
                return Ok(Some(v));
            }
        }
        if buf.len() > MAX_LINE {
            return Err(format!("a watch event over {MAX_LINE} bytes"));
        }
    }
    Ok(None)
}

/// How long the upstream is given to refuse a watch from a resume point (kube-apiserver
/// refuses one from a version its history no longer holds at once, as its first event).
const RESUME_PROBE: Duration = Duration::from_secs(1);

/// Whether the upstream takes a watch from `at`: false when it refuses it (an `ERROR` first,
/// an error status, a failed request) within [`RESUME_PROBE`]; true when it sends anything
/// else or nothing.
pub async fn watchable_from(
    upstream: &Upstream,
    info: &'static ResourceInfo,
    at: Revision,
) -> bool {
    let url = format!(
        "{}?watch=1&allowWatchBookmarks=true&resourceVersion={at}&timeoutSeconds=2",
        collection_path(info)
    );
    let probe = async {
        let body = open(upstream, &url).await.map_err(|e| format!("{e:?}"))?;
        let first = lines(body, |line| {
            if line.iter().all(u8::is_ascii_whitespace) {
                return Ok(None);
            }
            let l: Line<'_> = serde_json::from_slice(line).map_err(|e| e.to_string())?;
            Ok(Some(l.ty != "ERROR"))
        })
        .await?;
        Ok::<bool, String>(first.unwrap_or(true))
    };
    match tokio::time::timeout(RESUME_PROBE, probe).await {
        Ok(Ok(takes)) => takes,
        Ok(Err(_)) => false,
        // Nothing within the probe's time: a quiet resource's watch, taken.
        Err(_) => true,
    }
}

/// An upstream watch's body (or a streaming list's), read chunk by chunk.
pub struct WatchBody(hyper::body::Incoming);

impl WatchBody {
    /// The next chunk of the body; None at its end. Cancel-safe: a call dropped before it
    /// completes loses nothing.
    pub async fn chunk(&mut self) -> Option<Result<Bytes, String>> {
        loop {
            match self.0.frame().await? {
                Err(e) => return Some(Err(e.to_string())),
                Ok(f) => {
                    if let Ok(data) = f.into_data() {
                        return Some(Ok(data));
                    }
                }
            }
        }
    }
}

/// Why the upstream did not open a read.
#[derive(Debug)]
pub enum NotOpened {
    /// Too busy to now: a 429, 503 or 504, or no connection or answer.
    Busy(String),
    /// It refuses the read (any other status).
    Refused(String),
}

/// A GET of `url` (its path and query) asking for JSON; sent under the proxy's credential.
fn json_get(url: &str) -> Result<http::Request<client::RequestBody>, String> {
    http::Request::get(url)
        .header(http::header::ACCEPT, "application/json")
        .body(client::buffered(Bytes::new()))
        .map_err(|e| e.to_string())
}

/// Opens `url` (a watch, for its lines) as the proxy, in JSON.
pub async fn open(upstream: &Upstream, url: &str) -> Result<WatchBody, NotOpened> {
    let request = json_get(url).map_err(NotOpened::Refused)?;
    let response = upstream
        .send(request)
        .await
        .map_err(|e| NotOpened::Busy(e.to_string()))?;
    let status = response.status();
    if status.is_success() {
        return Ok(WatchBody(response.into_body()));
    }
    let e = format!("{url} answered {status}");
    Err(match status {
        http::StatusCode::TOO_MANY_REQUESTS
        | http::StatusCode::SERVICE_UNAVAILABLE
        | http::StatusCode::GATEWAY_TIMEOUT => NotOpened::Busy(e),
        _ => NotOpened::Refused(e),
    })
}

/// Opens a watch of `info` upstream from `from` (bookmarks asked for, lasting
/// `timeout_seconds`), as the proxy, in JSON. A 410 (the upstream's history no longer
/// reaches back to `from`) is [`LineEnd::Expired`], any other failure [`LineEnd::Failed`].
pub async fn watch(
    upstream: &Upstream,
    info: &ResourceInfo,
    from: Revision,
    timeout_seconds: u64,
) -> Result<WatchBody, LineEnd> {
    let url = format!(
        "{}?watch=1&allowWatchBookmarks=true&resourceVersion={from}&timeoutSeconds={timeout_seconds}",
        collection_path(info)
    );
    let request = json_get(&url).map_err(LineEnd::Failed)?;
    let response = match tokio::time::timeout(CALL_TIMEOUT, upstream.send(request)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(LineEnd::Failed(e.to_string())),
        Err(_) => {
            return Err(LineEnd::Failed(format!(
                "no answer within {CALL_TIMEOUT:?}"
            )));
        }
    };
    if response.status() == http::StatusCode::GONE {
        return Err(LineEnd::Expired);
    }
    if !response.status().is_success() {
        return Err(LineEnd::Failed(format!(
            "{url} answered {}",
            response.status()
        )));
    }
    Ok(WatchBody(response.into_body()))
}

/// One line of a JSON watch stream: its type, and its object as sent.
#[derive(Deserialize)]
pub struct Line<'a> {
    #[serde(rename = "type", borrow)]
    pub ty: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    pub object: &'a RawValue,
}

/// A bookmark's object: its revision, and whether it ends a streaming list's initial
/// events (`k8s.io/initial-events-end`).
#[derive(Deserialize)]
pub struct Bookmark {
    #[serde(default)]
    metadata: BookmarkMeta,
}

#[derive(Default, Deserialize)]
struct BookmarkMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

impl Bookmark {
    /// The revision of the bookmark that ends a streaming list's initial events; None for
    /// any other bookmark.
    pub fn initial_events_end(object: &[u8]) -> Result<Option<Revision>, String> {
        let b: Bookmark = serde_json::from_slice(object).map_err(|e| e.to_string())?;
        let ended = b
            .metadata
            .annotations
            .get("k8s.io/initial-events-end")
            .is_some_and(|v| v == "true");
        if ended {
            parse_rv(&b.metadata.resource_version).map(Some)
        } else {
            Ok(None)
        }
    }
}

#[derive(Deserialize)]
struct StatusHead {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    message: String,
}

pub enum Taken {
    Event(Revision),
    Bookmark(Revision),
    Nothing,
}

pub enum LineEnd {
    Expired,
    Failed(String),
}

impl std::fmt::Display for LineEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineEnd::Expired => f.write_str("the upstream's history no longer reaches back (410)"),
            LineEnd::Failed(e) => f.write_str(e),
        }
    }
}

/// Reads one line of the upstream's JSON watch stream into `events`.
pub fn take_line(
    info: &ResourceInfo,
    line: &Bytes,
    events: &mut Vec<Event>,
) -> Result<Taken, LineEnd> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(Taken::Nothing);
    }
    let parsed: Line<'_> =
        serde_json::from_slice(line).map_err(|e| LineEnd::Failed(format!("watch event: {e}")))?;
    let raw = line.slice_ref(parsed.object.get().as_bytes());
    match &*parsed.ty {
        "ADDED" | "MODIFIED" => {
            let kv = key_value(info, raw).map_err(LineEnd::Failed)?;
            let rev = kv.mod_revision;
            events.push(Event {
                kind: EventKind::Put,
                kv,
                prev_kv: None,
            });
            Ok(Taken::Event(rev))
        }
        "DELETED" => {
            let kv = key_value(info, raw).map_err(LineEnd::Failed)?;
            let rev = kv.mod_revision;
            events.push(Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    value: Bytes::new(),
                    create_revision: 0,
                    version: 0,
                    ..kv
                },
                prev_kv: None,
            });
            Ok(Taken::Event(rev))
        }
        "BOOKMARK" => {
            let head: ObjectHead<'_> = serde_json::from_slice(&raw)
                .map_err(|e| LineEnd::Failed(format!("bookmark: {e}")))?;
            parse_rv(&head.metadata.resource_version)
                .map(Taken::Bookmark)
                .map_err(LineEnd::Failed)
        }
        "ERROR" => {
            let s: StatusHead = serde_json::from_slice(&raw).unwrap_or(StatusHead {
                code: 0,
                message: String::from_utf8_lossy(&raw).into_owned(),
            });
            if s.code == 410 {
                Err(LineEnd::Expired)
            } else {
                Err(LineEnd::Failed(format!("{}: {}", s.code, s.message)))
            }
        }
        other => Err(LineEnd::Failed(format!(
            "unknown watch event type {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> &'static ResourceInfo {
        crate::outbound::upstream::discovery::core_kind("pods", "Pod", true)
    }

    #[test]
    fn watch_lines_become_events_bookmarks_and_ends() {
        let info = pods();
        let mut events = Vec::new();
        let line = |s: &str| Bytes::from(format!("{s}\n"));
        let added = line(
            r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","resourceVersion":"12"}}}"#,
        );
        assert!(matches!(
            take_line(info, &added, &mut events),
            Ok(Taken::Event(12))
        ));
        assert_eq!(&events[0].kv.key[..], b"/registry/pods/ns/p");
        let deleted = line(
            r#"{"type":"DELETED","object":{"metadata":{"name":"p","namespace":"ns","resourceVersion":"13"}}}"#,
        );
        assert!(matches!(
            take_line(info, &deleted, &mut events),
            Ok(Taken::Event(13))
        ));
        assert_eq!(events[1].kind, EventKind::Delete);
        let bookmark = line(
            r#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"20"}}}"#,
        );
        assert!(matches!(
            take_line(info, &bookmark, &mut events),
            Ok(Taken::Bookmark(20))
        ));
        let gone =
            line(r#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}"#);
        assert!(matches!(
            take_line(info, &gone, &mut events),
            Err(LineEnd::Expired)
        ));
        let other = line(r#"{"type":"ERROR","object":{"kind":"Status","code":500}}"#);
        assert!(matches!(
            take_line(info, &other, &mut events),
            Err(LineEnd::Failed(_))
        ));
        let bad_rv =
            line(r#"{"type":"ADDED","object":{"metadata":{"name":"p","resourceVersion":"x"}}}"#);
        assert!(matches!(
            take_line(info, &bad_rv, &mut events),
            Err(LineEnd::Failed(_))
        ));
        assert!(matches!(
            take_line(info, &line(""), &mut events),
            Ok(Taken::Nothing)
        ));
        assert!(take_line(info, &line("{"), &mut events).is_err());

        // List items without their type get it.
        let item = key_value(
            info,
            Bytes::from_static(
                br#"{"metadata":{"name":"q","namespace":"ns","resourceVersion":"5"}}"#,
            ),
        )
        .unwrap();
        assert!(
            item.value
                .starts_with(br#"{"apiVersion":"v1","kind":"Pod","#)
        );
        assert_eq!(
            (item.mod_revision, &item.key[..]),
            (5, &b"/registry/pods/ns/q"[..])
        );
    }
}
