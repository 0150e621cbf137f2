//! The watch handler: a watch's frame format, selector and deadline, its start asked of the
//! registry (`registry::watch`), and the response that streams it (`http::stream`).

use std::sync::Arc;

use http::Response;
use svc_core::ApiError;
use svc_core::watch::Selector;

use super::call::{RestRequest, Selectors};
use crate::base::query::ListOptions;
use crate::http::api::Standalone;
use crate::http::respond::{self, Body};
use crate::registry;
use crate::registry::watch::WatchFrom;
use svc_core::registry::Kind;

pub async fn watch<T: Kind>(
    app: &Arc<Standalone>,
    call: RestRequest,
    opts: ListOptions,
    sel: Selectors,
) -> Result<Response<Body>, ApiError> {
    let format = call.format;
    let frames = format.watch_frames()?;
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

    Ok(crate::http::stream::watch_response(
        &app.api,
        T::INFO,
        !call.route.namespace.is_empty(),
        watcher,
        first,
        opts.timeout_seconds,
        format,
    ))
}
