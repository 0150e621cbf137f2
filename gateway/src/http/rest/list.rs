//! The list handler: the registry's page of the list (`registry::list`), encoded in the
//! negotiated format (a Table with `includeObject` as asked).

use std::sync::Arc;

use http::Response;
use svc_core::ApiError;
use svc_core::registry::Kind;
use svc_core::table::IncludeObject;
use svc_core::watch::Selector;

use super::call::{RestRequest, Selectors};
use crate::base::query::ListOptions;
use crate::http::api::Standalone;
use crate::http::respond::{self, Body};
use crate::registry;

pub(super) async fn list<T: Kind>(
    app: &Arc<Standalone>,
    call: &RestRequest,
    opts: &ListOptions,
    sel: Selectors,
) -> Result<Response<Body>, ApiError> {
    let include = IncludeObject::parse(call.query.get("includeObject"))?;
    let selector = Selector::new(sel.labels, sel.fields);
    let whole = respond::Whole::of(&call.route.namespace, &selector, opts);
    let listed =
        registry::list::list::<T>(&app.registry, &call.route.namespace, opts, selector).await?;
    respond::list(
        listed.cache,
        &listed.meta,
        &listed.items,
        call.format,
        call.query.pretty(),
        include,
        whole,
    )
}
