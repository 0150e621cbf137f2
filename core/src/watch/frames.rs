//! Watch frames, encoded once per event and media type and shared by every watcher (the
//! Kubernetes `caching_object.go`): JSON lines that splice the object's canonical JSON in
//! without re-serializing it, and length-prefixed protobuf `WatchEvent`s.
//!
//! An event's frames live in `OnceLock`s on the event, so the first watcher that needs a
//! format pays for it and every other watcher clones the same `Bytes` (a reference count,
//! no copy). [`FrameStats`] counts the encodings so tests can prove N watchers cost one.
//! Frame bytes are charged to the history ring's byte bound while their event is in the ring.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parking_lot::Mutex;
use svc_storage::Revision;

use super::cached::{CachedObject, KindCodec};
use super::history::{EventType, WatchCacheEvent};
use crate::codec::{encode_envelope, encode_status_protobuf, encode_watch_event_protobuf};
use crate::meta::ListMeta;
use crate::status::ApiError;

/// The media type of a watch stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameFormat {
    /// `application/json`: one `{"type":..,"object":..}` line per event.
    Json,
    /// `application/vnd.kubernetes.protobuf;stream=watch`: `[u32 BE length][WatchEvent]`.
    Protobuf,
    /// `application/cbor-seq`: one self-described CBOR map `{type, object}` per event.
    CborSeq,
    /// `application/json;as=PartialObjectMetadata;g=<group>;v=v1`: JSON lines whose objects
    /// carry only `metadata`, as client-go's metadata informers watch.
    PartialMetadata(MetaGroup),
}

/// The group a client names for the `meta` kinds (`PartialObjectMetadata`): Kubernetes'
/// `meta.k8s.io`, which client-go's metadata client asks for, or ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaGroup {
    K8s,
    Svc,
}

impl MetaGroup {
    pub fn api_version(self) -> &'static str {
        match self {
            MetaGroup::K8s => "meta.k8s.io/v1",
            MetaGroup::Svc => "meta.svc.io/v1",
        }
    }
}

/// How many distinct frame formats there are (the cells per event type).
const FORMATS: usize = 5;

impl FrameFormat {
    pub const ALL: [FrameFormat; FORMATS] = [
        FrameFormat::Json,
        FrameFormat::Protobuf,
        FrameFormat::CborSeq,
        FrameFormat::PartialMetadata(MetaGroup::K8s),
        FrameFormat::PartialMetadata(MetaGroup::Svc),
    ];

    pub(crate) fn index(self) -> usize {
        match self {
            FrameFormat::Json => 0,
            FrameFormat::Protobuf => 1,
            FrameFormat::CborSeq => 2,
            FrameFormat::PartialMetadata(MetaGroup::K8s) => 3,
            FrameFormat::PartialMetadata(MetaGroup::Svc) => 4,
        }
    }
}

/// Encodings performed, per format: event frames and bookmarks, not per-watcher copies
/// (there are none).
#[derive(Debug, Default)]
pub struct FrameStats {
    encoded: [AtomicU64; FORMATS],
}

impl FrameStats {
    pub fn encoded(&self, format: FrameFormat) -> u64 {
        self.encoded
            .get(format.index())
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    fn count(&self, format: FrameFormat) {
        if let Some(n) = self.encoded.get(format.index()) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The high bit of [`EventFrames::accounted`]: the event has left the ring, so frames encoded
/// from now on are no longer charged to it.
const EVICTED: usize = 1 << (usize::BITS - 1);

/// The lazily encoded frames of one event: one cell per (event type, format), since one event
/// is `ADDED` to a watcher whose selector just started matching and `MODIFIED` to another.
#[derive(Debug, Default)]
pub(crate) struct EventFrames {
    cells: [OnceLock<Result<Bytes, Arc<str>>>; 3 * FORMATS],
    /// Bytes of frames charged to the ring's byte count, plus the `EVICTED` flag.
    accounted: AtomicUsize,
}

impl EventFrames {
    fn cell(&self, ty: EventType, format: FrameFormat) -> &OnceLock<Result<Bytes, Arc<str>>> {
        // Indexes are in range by construction (3 types × FORMATS formats, so nothing
        // wraps); `get` keeps it panic-free.
        let i = (ty as usize)
            .wrapping_mul(FORMATS)
            .wrapping_add(format.index());
        self.cells.get(i).unwrap_or(&self.cells[3 * FORMATS - 1])
    }

    /// Charges `n` frame bytes to the ring total, unless the event has already left the ring.
    /// The global count is raised first and lowered back if the event turned out evicted, so
    /// it never dips below what the events in the ring hold.
    fn charge(&self, n: usize, total: &AtomicUsize) {
        total.fetch_add(n, Ordering::AcqRel);
        let charged = self
            .accounted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(n).filter(|_| cur & EVICTED == 0)
            })
            .is_ok();
        if !charged {
            total.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Marks the event evicted; returns the frame bytes it had charged, to be released.
    pub(crate) fn evict(&self) -> usize {
        self.accounted.fetch_or(EVICTED, Ordering::AcqRel) & !EVICTED
    }
}

/// A JSON watch line: `{"type":"<ty>","object":<json>}\n`, the object's bytes copied once.
pub fn json_line(event_type: &str, object_json: &[u8]) -> Bytes {
    const HEAD: &[u8] = b"{\"type\":\"";
    const MID: &[u8] = b"\",\"object\":";
    const FIXED: usize = HEAD.len() + MID.len() + 2;
    let len = FIXED
        .saturating_add(event_type.len())
        .saturating_add(object_json.len());
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(HEAD);
    out.extend_from_slice(event_type.as_bytes());
    out.extend_from_slice(MID);
    out.extend_from_slice(object_json);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// A list response body (`{"kind":"XList","apiVersion":..,"metadata":..,"items":[..]}`)
/// built from the items' canonical JSON without re-serializing any of them.
pub fn list_json(
    api_version: &str,
    list_kind: &str,
    meta: &ListMeta,
    items: &[Arc<CachedObject>],
    item_types: bool,
) -> Result<Vec<u8>, ApiError> {
    let meta = serde_json::to_vec(meta).map_err(ApiError::internal)?;
    let body: usize = items.iter().map(|o| o.json.len().saturating_add(1)).sum();
    let len = [api_version.len(), list_kind.len(), meta.len(), body]
        .into_iter()
        .fold(64, usize::saturating_add);
    Ok(list_body(
        api_version,
        list_kind,
        &meta,
        items.iter().map(|o| {
            if item_types {
                (&b""[..], &o.json[..])
            } else {
                without_type_meta(&o.json)
            }
        }),
        len,
    ))
}

/// An object's JSON as `{` and the rest with its leading `apiVersion` and `kind` members left
/// out, as Kubernetes writes the items of a built-in kind's list. JSON that does not begin with
/// them (in either order, compactly written) is given back whole, after an empty head.
pub fn without_type_meta(json: &[u8]) -> (&'static [u8], &[u8]) {
    let Some(mut rest) = json.strip_prefix(b"{") else {
        return (b"", json);
    };
    let mut removed = false;
    for _ in 0..2 {
        let Some(value) = [&b"\"apiVersion\":\""[..], b"\"kind\":\""]
            .into_iter()
            .find_map(|name| rest.strip_prefix(name))
        else {
            break;
        };
        // The values are type names: no escapes. One with a backslash is left alone.
        let Some(end) = value.iter().position(|&b| b == b'"' || b == b'\\') else {
            return (b"", json);
        };
        if value.get(end) != Some(&b'"') {
            return (b"", json);
        }
        let after = value.get(end.saturating_add(1)..).unwrap_or_default();
        rest = match after.strip_prefix(b",") {
            Some(r) => r,
            None if after.starts_with(b"}") => after,
            None => return (b"", json),
        };
        removed = true;
    }
    if !removed {
        return (b"", json);
    }
    (b"{", rest)
}

/// `{"kind":..,"apiVersion":..,"metadata":..,"items":[..]}` from items already encoded, each
/// as a head and the rest.
fn list_body<'a>(
    api_version: &str,
    list_kind: &str,
    meta: &[u8],
    items: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    capacity: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    // Both names are static identifiers; they need no escaping.
    out.extend_from_slice(b"{\"kind\":\"");
    out.extend_from_slice(list_kind.as_bytes());
    out.extend_from_slice(b"\",\"apiVersion\":\"");
    out.extend_from_slice(api_version.as_bytes());
    out.extend_from_slice(b"\",\"metadata\":");
    out.extend_from_slice(meta);
    out.extend_from_slice(b",\"items\":[");
    for (i, (head, rest)) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(head);
        out.extend_from_slice(rest);
    }
    out.extend_from_slice(b"]}");
    out
}

/// `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{..}}`: the
/// object's metadata alone, as Kubernetes answers `as=PartialObjectMetadata`.
pub fn partial_object_metadata(group: MetaGroup, object_json: &[u8]) -> Result<Vec<u8>, ApiError> {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(default)]
        metadata: serde_json::Map<String, serde_json::Value>,
    }
    let meta: Meta = serde_json::from_slice(object_json).map_err(ApiError::internal)?;
    let metadata = serde_json::to_string(&meta.metadata).map_err(ApiError::internal)?;
    let mut out = Vec::with_capacity(metadata.len().saturating_add(80));
    out.extend_from_slice(b"{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"");
    out.extend_from_slice(group.api_version().as_bytes());
    out.extend_from_slice(b"\",\"metadata\":");
    out.extend_from_slice(metadata.as_bytes());
    out.push(b'}');
    Ok(out)
}

/// A `PartialObjectMetadataList` body from the items' canonical JSON.
pub fn partial_object_metadata_list(
    group: MetaGroup,
    meta: &ListMeta,
    items: &[Arc<CachedObject>],
) -> Result<Vec<u8>, ApiError> {
    let meta = serde_json::to_vec(meta).map_err(ApiError::internal)?;
    let partial: Vec<Vec<u8>> = items
        .iter()
        .map(|o| partial_object_metadata(group, &o.json))
        .collect::<Result<_, _>>()?;
    let len = partial.iter().map(|p| p.len().saturating_add(1)).sum();
    Ok(list_body(
        group.api_version(),
        "PartialObjectMetadataList",
        &meta,
        partial.iter().map(|p| (&b""[..], p.as_slice())),
        meta.len().saturating_add(len).saturating_add(96),
    ))
}

/// The object of a `BOOKMARK` event: only kind, apiVersion and `metadata.resourceVersion`,
/// plus the `k8s.io/initial-events-end` annotation on the bookmark that ends the initial
/// events of a `sendInitialEvents=true` watch.
pub fn bookmark_object_json(
    api_version: &str,
    kind: &str,
    revision: Revision,
    initial_events_end: bool,
) -> Vec<u8> {
    let annotations = if initial_events_end {
        ",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}"
    } else {
        ""
    };
    // kind and apiVersion are static identifiers from `ResourceInfo`; they need no escaping.
    format!(
        "{{\"kind\":\"{kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{{\"resourceVersion\":\"{revision}\"{annotations}}}}}"
    )
    .into_bytes()
}

#[derive(Debug)]
struct BookmarkEntry {
    revision: Revision,
    initial_events_end: bool,
    format: FrameFormat,
    frame: Bytes,
}

/// How many distinct bookmark frames are kept for sharing (different revisions or formats).
const BOOKMARK_CACHE: usize = 8;

/// Encodes every frame of one cache: shares event frames through the events' cells and
/// bookmark frames through a tiny cache (thousands of watchers bookmark the same revision).
#[derive(Debug)]
pub(crate) struct FrameEncoder {
    pub(crate) codec: KindCodec,
    api_version: String,
    pub(crate) stats: FrameStats,
    /// Bytes of encoded frames whose events are still in the history ring.
    pub(crate) frame_bytes: AtomicUsize,
    bookmarks: Mutex<Vec<BookmarkEntry>>,
}

/// A watcher's share of a frame cell's content: the frame, or the encoding's error.
fn shared_frame(cell: &Result<Bytes, Arc<str>>) -> Result<Bytes, ApiError> {
    cell.clone().map_err(|m| ApiError::Internal(m.to_string()))
}

impl FrameEncoder {
    pub(crate) fn new(codec: KindCodec) -> Self {
        FrameEncoder {
            api_version: codec.info.api_version(),
            codec,
            stats: FrameStats::default(),
            frame_bytes: AtomicUsize::new(0),
            bookmarks: Mutex::new(Vec::new()),
        }
    }

    /// The frame of `event` as `ty` for one watcher: encoded on first use, shared after.
    pub(crate) fn event_frame(
        &self,
        event: &WatchCacheEvent,
        ty: EventType,
        format: FrameFormat,
    ) -> Result<Bytes, ApiError> {
        shared_frame(self.encoded_cell(event, ty, format))
    }

    /// The frame of `event` as `ty` if it is encoded already (as `apply` encodes the frames
    /// an event's watchers need): a lookup, cheap enough to take under the cache's lock.
    pub(crate) fn encoded_frame(
        event: &WatchCacheEvent,
        ty: EventType,
        format: FrameFormat,
    ) -> Option<Result<Bytes, ApiError>> {
        event.frames.cell(ty, format).get().map(shared_frame)
    }

    /// Encodes the frames of `event` named in `frames` (`dispatch::frame_bit`s) now, so that
    /// the watchers find them made; a failure is kept in the frame's cell and reported to each
    /// of them.
    pub(crate) fn prepare(&self, event: &WatchCacheEvent, frames: u16) {
        for ty in [EventType::Added, EventType::Modified, EventType::Deleted] {
            for format in FrameFormat::ALL {
                if frames & super::dispatch::frame_bit(ty, format) != 0 {
                    self.encoded_cell(event, ty, format);
                }
            }
        }
    }

    /// The cell of `event`'s frame as `ty`, encoded into on first use.
    fn encoded_cell<'e>(
        &self,
        event: &'e WatchCacheEvent,
        ty: EventType,
        format: FrameFormat,
    ) -> &'e Result<Bytes, Arc<str>> {
        event.frames.cell(ty, format).get_or_init(|| {
            self.stats.count(format);
            let encoded = match ty {
                EventType::Deleted => event
                    .deleted_object(&self.codec)
                    .and_then(|obj| self.object_frame(ty, &obj, format)),
                _ => self.object_frame(ty, &event.object, format),
            };
            if let Ok(frame) = &encoded {
                event.frames.charge(frame.len(), &self.frame_bytes);
            }
            encoded.map_err(|e| Arc::from(e.to_string()))
        })
    }

    /// A frame for `obj` that is not shared (initial `ADDED` events: each watcher walks its
    /// own snapshot). JSON is one copy of the canonical bytes; protobuf reuses the object's
    /// cached message.
    pub(crate) fn object_frame(
        &self,
        ty: EventType,
        obj: &CachedObject,
        format: FrameFormat,
    ) -> Result<Bytes, ApiError> {
        match format {
            FrameFormat::Json => Ok(json_line(ty.as_str(), &obj.json)),
            FrameFormat::Protobuf => {
                let raw = obj.protobuf(&self.codec)?;
                self.protobuf_frame(ty.as_str(), &raw)
            }
            FrameFormat::CborSeq => {
                crate::codec::cbor::watch_event(ty.as_str(), &obj.json).map(Bytes::from)
            }
            FrameFormat::PartialMetadata(group) => Ok(json_line(
                ty.as_str(),
                &partial_object_metadata(group, &obj.json)?,
            )),
        }
    }

    fn protobuf_frame(&self, event_type: &str, raw: &[u8]) -> Result<Bytes, ApiError> {
        let envelope = encode_envelope(&self.api_version, self.codec.info.kind, raw);
        encode_watch_event_protobuf(event_type, &envelope).map(Bytes::from)
    }

    /// A `BOOKMARK` frame at `revision`, shared by every watcher that bookmarks it.
    pub(crate) fn bookmark(
        &self,
        revision: Revision,
        initial_events_end: bool,
        format: FrameFormat,
    ) -> Result<Bytes, ApiError> {
        let mut cache = self.bookmarks.lock();
        if let Some(e) = cache.iter().find(|e| {
            e.revision == revision
                && e.initial_events_end == initial_events_end
                && e.format == format
        }) {
            return Ok(e.frame.clone());
        }
        // Encoded under the lock on purpose: the first of many watchers pays, the others wait
        // microseconds and share the result instead of encoding it again.
        let object = bookmark_object_json(
            &self.api_version,
            self.codec.info.kind,
            revision,
            initial_events_end,
        );
        let frame = match format {
            FrameFormat::Json => json_line("BOOKMARK", &object),
            FrameFormat::Protobuf => {
                let encode = self.codec.protobuf.ok_or_else(|| {
                    ApiError::internal(format!("{} has no protobuf encoding", self.codec.info.kind))
                })?;
                self.protobuf_frame("BOOKMARK", &encode(&object)?)?
            }
            FrameFormat::CborSeq => {
                Bytes::from(crate::codec::cbor::watch_event("BOOKMARK", &object)?)
            }
            FrameFormat::PartialMetadata(group) => {
                json_line("BOOKMARK", &partial_object_metadata(group, &object)?)
            }
        };
        self.stats.count(format);
        if cache.len() >= BOOKMARK_CACHE {
            cache.remove(0);
        }
        cache.push(BookmarkEntry {
            revision,
            initial_events_end,
            format,
            frame: frame.clone(),
        });
        Ok(frame)
    }

    /// An `ERROR` frame carrying `err` as a `Status`. Never fails: a frame that cannot be
    /// encoded in the watcher's format degrades to JSON, which always can.
    pub(crate) fn error(&self, err: &ApiError, format: FrameFormat) -> Bytes {
        let status = err.to_status();
        if format == FrameFormat::Protobuf
            && let Ok(f) = encode_watch_event_protobuf("ERROR", &encode_status_protobuf(&status))
        {
            return Bytes::from(f);
        }
        let object = serde_json::to_vec(&status).unwrap_or_else(|_| b"{}".to_vec());
        if format == FrameFormat::CborSeq
            && let Ok(f) = crate::codec::cbor::watch_event("ERROR", &object)
        {
            return Bytes::from(f);
        }
        json_line("ERROR", &object)
    }
}
