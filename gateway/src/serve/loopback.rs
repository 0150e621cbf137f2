//! The server calling itself: controllers inside the gateway read and write through the same
//! pipeline as any client (authorization, validation, admission, dry-run, metrics), as a
//! named system user, without a socket.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use svc_core::ApiError;

use crate::security::authz::{GROUP_AUTHENTICATED, GROUP_MASTERS};
use crate::serve::app::ServerState;
use crate::serve::pipeline::{self, Caller, RequestBody};
use svc_core::user::UserInfo;

/// A client of this server for one system user.
#[derive(Clone)]
pub struct Loopback {
    app: Arc<ServerState>,
    user: UserInfo,
}

/// A response: its code and JSON body (a `Status` for errors).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Value,
}

impl Reply {
    /// The body as `T` when the request succeeded; the `Status` as an error otherwise.
    pub fn into_result<T: DeserializeOwned>(self) -> Result<T, ApiError> {
        if !self.status.is_success() {
            return Err(status_error(self.status, &self.body));
        }
        serde_json::from_value(self.body).map_err(ApiError::internal)
    }
}

/// An `ApiError` carrying a `Status` answer's code and message.
fn status_error(code: StatusCode, body: &Value) -> ApiError {
    let message = body["message"].as_str().unwrap_or_default().to_string();
    match code {
        StatusCode::CONFLICT => ApiError::Conflict {
            subject: Default::default(),
            message,
        },
        StatusCode::NOT_FOUND => ApiError::PathNotFound(message),
        StatusCode::FORBIDDEN => ApiError::forbidden(message),
        StatusCode::UNPROCESSABLE_ENTITY => ApiError::Unprocessable(message),
        StatusCode::SERVICE_UNAVAILABLE => ApiError::ServiceUnavailable(message),
        _ => ApiError::Internal(format!("{code}: {message}")),
    }
}

impl Loopback {
    /// A client acting as `username` in `system:masters`: controllers are trusted parts of
    /// the server, and each has its own name in audit and metrics.
    pub fn controller(app: &Arc<ServerState>, username: &str) -> Self {
        Loopback {
            app: app.clone(),
            user: UserInfo {
                username: username.into(),
                groups: vec![GROUP_MASTERS.into(), GROUP_AUTHENTICATED.into()],
                ..Default::default()
            },
        }
    }

    /// Sends one request with a JSON body (or none) and reads the whole JSON answer.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&impl Serialize>,
        content_type: &str,
    ) -> Result<Reply, ApiError> {
        let bytes = match body {
            Some(b) => Bytes::from(serde_json::to_vec(b).map_err(ApiError::internal)?),
            None => Bytes::new(),
        };
        let req = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(header::CONTENT_TYPE, content_type)
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, self.user.username.as_str())
            .body(RequestBody::Full(bytes))
            .map_err(ApiError::internal)?;
        let resp =
            pipeline::handle(self.app.clone(), Caller::Internal(self.user.clone()), req).await;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(ApiError::internal)?
            .to_bytes();
        let body = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).map_err(ApiError::internal)?
        };
        Ok(Reply { status, body })
    }

    pub async fn get(&self, path: &str) -> Result<Reply, ApiError> {
        self.send(Method::GET, path, None::<&Value>, "application/json")
            .await
    }

    pub async fn create(&self, path: &str, obj: &impl Serialize) -> Result<Reply, ApiError> {
        self.send(Method::POST, path, Some(obj), "application/json")
            .await
    }

    pub async fn update(&self, path: &str, obj: &impl Serialize) -> Result<Reply, ApiError> {
        self.send(Method::PUT, path, Some(obj), "application/json")
            .await
    }

    pub async fn delete(&self, path: &str) -> Result<Reply, ApiError> {
        self.send(Method::DELETE, path, None::<&Value>, "application/json")
            .await
    }
}
