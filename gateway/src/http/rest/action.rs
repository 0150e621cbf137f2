//! Requests that do something other than store what they send: a `create` through an action
//! subresource (`serviceaccounts/<name>/token`), and a `create` of a kind that is answered,
//! not stored (`TokenReview`). These are behaviours, not copies of the generic machinery,
//! so this is the one place in the REST layer that names them; each is implemented beside
//! what it needs (tokens and reviews with authentication).

use std::sync::Arc;

use http::Response;
use svc_core::ApiError;
use svc_core::kinds::auth;
use svc_core::status::Subject;

use super::call::RestRequest;
use super::token;
use crate::http::api::Standalone;
use crate::http::respond::Body;
use svc_core::registry::Kind;

/// `POST <object>/<sub>`: the action `sub` performs on the object `name`.
pub(super) async fn create<T: Kind>(
    app: &Arc<Standalone>,
    call: &RestRequest,
    sub: &str,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    if (T::INFO.group, T::INFO.plural, sub) == ("", "serviceaccounts", "token") {
        return token::create_token(app, call, name).await;
    }
    Err(ApiError::NotFound(Subject::new(
        T::INFO.group,
        &format!("{}/{sub}", T::INFO.plural),
        name,
    )))
}

/// `POST <collection>` of a kind that is not stored: the answer to the request it carries.
pub(super) async fn review<T: Kind>(
    app: &Arc<Standalone>,
    call: &RestRequest,
) -> Result<Response<Body>, ApiError> {
    if (T::INFO.group, T::INFO.plural) == (auth::GROUP, "tokenreviews") {
        return token::review_token(app, call).await;
    }
    Err(ApiError::MethodNotAllowed(format!(
        "{} are not served",
        T::INFO.plural
    )))
}
