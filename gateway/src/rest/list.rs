//! List: the resourceVersion × resourceVersionMatch × limit/continue rules of the spec,
//! selectors, and continue tokens that pin every page to one revision.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Response, StatusCode};
use serde::{Deserialize, Serialize};
use svc_core::object::{self, parse_resource_version};
use svc_core::resource::field_value;
use svc_core::selector::{FieldSelector, LabelSelector};
use svc_core::{ApiError, ListMeta, Resource};
use svc_storage::{KeyRange, StoreError};

use super::{Call, Kind, wait_for_revision};
use crate::app::App;
use crate::negotiate::Format;
use crate::query::{ListOptions, RvMatch};
use crate::respond::{self, Body};

/// The label and field selectors of a request, parsed once.
#[derive(Debug, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn parse<T: Resource>(opts: &ListOptions) -> Result<Self, ApiError> {
        let labels = LabelSelector::parse(&opts.label_selector)
            .map_err(|e| ApiError::bad_request(format!("unable to parse labelSelector: {e}")))?;
        let fields = FieldSelector::parse(&opts.field_selector, |f| T::INFO.supports_field(f))
            .map_err(|e| ApiError::bad_request(format!("unable to parse fieldSelector: {e}")))?;
        Ok(Selectors { labels, fields })
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub fn matches<T: Resource>(&self, obj: &T) -> bool {
        self.labels.matches(&obj.meta().labels) && self.fields.matches(|f| field_value(obj, f))
    }
}

/// Rejects the combinations the spec's list table marks invalid (400).
pub fn validate(opts: &ListOptions) -> Result<(), ApiError> {
    let bad = |m: &str| Err(ApiError::bad_request(m.to_string()));
    let rv = opts.resource_version.as_deref();
    if opts.watch {
        match (opts.send_initial_events, opts.resource_version_match) {
            (Some(true), m) if m != Some(RvMatch::NotOlderThan) => {
                return bad(
                    "resourceVersionMatch: Forbidden: sendInitialEvents requires setting \
                            resourceVersionMatch to NotOlderThan",
                );
            }
            (None, Some(_)) => {
                return bad(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden \
                            for watch unless sendInitialEvents is provided",
                );
            }
            _ => {}
        }
    } else if opts.send_initial_events.is_some() {
        return bad("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list");
    }
    if let Some(m) = opts.resource_version_match {
        if rv.is_none() && !opts.watch {
            return bad(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden \
                        unless resourceVersion is provided",
            );
        }
        if opts.continue_token.is_some() {
            return bad(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when \
                        continue is provided",
            );
        }
        if m == RvMatch::Exact && rv == Some("0") {
            return bad(
                "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is \
                        forbidden for resourceVersion \"0\"",
            );
        }
    }
    if opts.continue_token.is_some() && rv.is_some_and(|v| v != "0") && !opts.watch {
        return bad("specifying resource version is not allowed when using continue");
    }
    Ok(())
}

#[derive(Debug, Serialize, Deserialize)]
struct ContinueToken {
    v: String,
    rv: i64,
    /// The first key of the next page, relative to the collection's key prefix.
    start: String,
}

const TOKEN_VERSION: &str = "meta.svc.io/v1";

fn encode_token(rv: i64, start: &[u8]) -> String {
    let t = ContinueToken {
        v: TOKEN_VERSION.into(),
        rv,
        start: String::from_utf8_lossy(start).into_owned(),
    };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&t).unwrap_or_default())
}

fn decode_token(token: &str) -> Result<ContinueToken, ApiError> {
    let invalid =
        || ApiError::bad_request("continue key is not valid: the token could not be decoded");
    let raw = URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| invalid())?;
    let t: ContinueToken = serde_json::from_slice(&raw).map_err(|_| invalid())?;
    // A token may only move forward inside its own collection.
    if t.v != TOKEN_VERSION || t.rv <= 0 || t.start.starts_with('/') || t.start.contains("..") {
        return Err(invalid());
    }
    Ok(t)
}

fn expired_continue() -> ApiError {
    ApiError::Expired(
        "The provided continue parameter is too old to display a consistent list result. You \
         can start a new list without the continue parameter, or use the continue token in this \
         response to retrieve the remainder of the results. Continuing with the provided token \
         results in an inconsistent list - objects that were created, modified, or deleted \
         between the time the first chunk was returned and now may show up in the list."
            .into(),
    )
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct List<T> {
    kind: &'static str,
    api_version: String,
    metadata: ListMeta,
    items: Vec<T>,
}

pub async fn list_or_watch<T: Kind>(
    app: &Arc<App>,
    call: Call,
) -> Result<Response<Body>, ApiError> {
    let opts = ListOptions::from_query(&call.query)?;
    validate(&opts)?;
    let selectors = Selectors::parse::<T>(&opts)?;
    if opts.watch {
        return crate::watch::watch::<T>(app, call, opts, selectors).await;
    }
    list::<T>(app, &call, &opts, &selectors).await
}

async fn list<T: Kind>(
    app: &Arc<App>,
    call: &Call,
    opts: &ListOptions,
    sel: &Selectors,
) -> Result<Response<Body>, ApiError> {
    let prefix = T::INFO.prefix(Some(&call.route.namespace));
    let full = KeyRange::prefix(prefix.clone());
    let limit = opts.limit.map(|l| l as usize);

    // Which revision to read at, and where to start.
    let (at, start, continuation) = if let Some(token) = &opts.continue_token {
        let t = decode_token(token)?;
        let mut start = prefix.clone();
        start.extend_from_slice(t.start.as_bytes());
        (Some(t.rv), start, true)
    } else {
        let at = match opts.resource_version.as_deref() {
            None | Some("0") => None,
            Some(rv) => {
                let rv = parse_resource_version(rv)?;
                let exact = opts.resource_version_match == Some(RvMatch::Exact)
                    || (opts.resource_version_match.is_none() && limit.is_some());
                wait_for_revision(app, rv).await?;
                if exact { Some(rv) } else { None }
            }
        };
        (at, prefix.clone(), false)
    };

    let mut items = Vec::new();
    let mut range = KeyRange {
        start: Bytes::from(start),
        end: full.end.clone(),
    };
    let mut revision = at;
    let mut next_start: Option<Vec<u8>> = None;
    // Fetch pages of the store until the limit is filled with matching items.
    let page = limit.map(|l| l.max(64)).unwrap_or(0);
    'pages: loop {
        let res = app
            .store
            .range(range.clone(), revision, page)
            .await
            .map_err(|e| match e {
                StoreError::Compacted { .. } if continuation => expired_continue(),
                StoreError::Compacted {
                    requested,
                    compacted,
                } => ApiError::Expired(format!(
                    "too old resource version: {requested} ({compacted})"
                )),
                other => respond::store_error(other),
            })?;
        revision = Some(res.revision);
        for (i, kv) in res.kvs.iter().enumerate() {
            let obj: T = object::decode_from_store(kv)?;
            if sel.matches(&obj) {
                items.push(obj);
            }
            if limit.is_some_and(|l| items.len() >= l) {
                let remaining_here = i + 1 < res.kvs.len();
                if remaining_here || res.more {
                    let mut k = kv.key.to_vec();
                    k.push(0);
                    next_start = Some(k);
                }
                break 'pages;
            }
        }
        match (res.more, res.kvs.last()) {
            (true, Some(last)) => {
                let mut k = last.key.to_vec();
                k.push(0);
                range.start = Bytes::from(k);
            }
            _ => break,
        }
    }
    let revision = revision.unwrap_or_default();
    let mut meta = ListMeta {
        resource_version: revision.to_string(),
        ..Default::default()
    };
    if let Some(next) = next_start {
        meta.continue_ = encode_token(revision, &next[prefix.len()..]);
        if sel.is_empty() {
            let rest = KeyRange {
                start: Bytes::from(next),
                end: full.end.clone(),
            };
            let remaining = app
                .store
                .range(rest, Some(revision), 0)
                .await
                .map_err(respond::store_error)?;
            meta.remaining_item_count = Some(remaining.kvs.len() as i64);
        }
    }
    if let Format::Protobuf(ct) = call.format {
        let api_version = T::INFO.api_version();
        let body =
            svc_core::codec::encode_list_protobuf(&api_version, T::INFO.list_kind, &meta, &items);
        return Ok(respond::bytes_response(StatusCode::OK, ct, body));
    }
    let list = List {
        kind: T::INFO.list_kind,
        api_version: T::INFO.api_version(),
        metadata: meta,
        items,
    };
    Ok(respond::json(StatusCode::OK, &list, call.query.pretty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::Query;

    fn opts(q: &str) -> ListOptions {
        ListOptions::from_query(&Query::parse(Some(q))).unwrap()
    }

    #[test]
    fn invalid_combinations_are_rejected() {
        for q in [
            "resourceVersionMatch=Exact",
            "resourceVersionMatch=NotOlderThan",
            "resourceVersion=0&resourceVersionMatch=Exact",
            "resourceVersion=5&limit=2&continue=abc",
            "resourceVersion=5&resourceVersionMatch=Exact&continue=abc",
            "sendInitialEvents=true",
            "watch=1&sendInitialEvents=true",
            "watch=1&resourceVersion=1&resourceVersionMatch=Exact",
        ] {
            assert_eq!(validate(&opts(q)).unwrap_err().code(), 400, "{q}");
        }
        for q in [
            "",
            "resourceVersion=0",
            "resourceVersion=0&resourceVersionMatch=NotOlderThan",
            "resourceVersion=7&resourceVersionMatch=Exact&limit=5",
            "limit=2&continue=abc",
            "resourceVersion=0&limit=2&continue=abc",
            "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        ] {
            assert!(validate(&opts(q)).is_ok(), "{q}");
        }
    }

    #[test]
    fn tokens_round_trip_and_reject_tampering() {
        let t = encode_token(42, b"ns/name\0");
        let d = decode_token(&t).unwrap();
        assert_eq!((d.rv, d.start.as_str()), (42, "ns/name\0"));
        assert!(decode_token("not-a-token").is_err());
        let escape =
            URL_SAFE_NO_PAD.encode(br#"{"v":"meta.svc.io/v1","rv":3,"start":"/registry/x"}"#);
        assert!(decode_token(&escape).is_err());
    }
}
