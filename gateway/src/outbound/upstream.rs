//! The upstream of proxy mode (`--upstream-kubeconfig`): an unmodified kube-apiserver, reached
//! with the kubeconfig's server, CA and credential (the proxy's own identity) through the
//! pooled client of `client.rs` (h2 where the upstream offers it by ALPN, HTTP/1.1 else; the
//! pool's limits are hyper's). Short requests are spread over `--upstream-connections` h2
//! connections ([`Upstream::send`]), and the proxy's own calls have one apart from them;
//! long-running requests and upgrades each take an HTTP/1.1 connection of their own
//! ([`Upstream::send_alone`]), bounded by `http/proxy/bounds.rs`. Requests passed
//! through stream both ways and carry no timeout here (watches must not have one; the caller
//! bounds the others); the proxy's own calls (TokenReview, SubjectAccessReview, readiness) are
//! bounded in time and size.

pub mod discovery;
#[cfg(test)]
pub mod scripted;
#[cfg(test)]
mod tests;
pub mod watch;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;

use crate::base::threads::Threads;
use crate::outbound::client::{self, ClientError, RequestBody, WebhookClient};
use crate::outbound::egress::Egress;

/// How long the proxy's own calls (reviews, readiness) may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Reviews (TokenReviews, SubjectAccessReviews) sent at once on the own calls' connection, at
/// most: below the 100 streams kube-apiserver allows a connection, so that a review past them
/// waits here, in order and for a bounded time, instead of in the connection for a stream,
/// and the readiness check always finds one free. After a proxy restarts, every agent's
/// first read needs a review (about 15,000 at 3,000 nodes); queued in the connection, they took
/// longer than their timeout, were given up and asked again, and `/readyz` waited behind
/// them for minutes.
pub const REVIEWS_IN_FLIGHT: usize = 90;
/// How long a review waits for one of those turns; then its caller gets a 429 and asks
/// again a second later.
pub const REVIEW_TURN_WAIT: Duration = Duration::from_secs(5);

/// The upstream API server. Cheap to clone; clones share connections.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// The proxy's own calls (TokenReviews, SubjectAccessReviews, readiness), and the
    /// connections of their own that long-running requests take.
    client: WebhookClient,
    /// The short requests sent on ([`Upstream::send`]), spread over connections of their
    /// own, so that they never queue the proxy's own calls behind them.
    spread: Arc<Spread>,
    /// The thread the proxy's own calls and their connection run on, apart from the request
    /// runtime: a review's body is sent by a task of its own once h2 gives it room, and on a
    /// request runtime queued with thousands of agents' requests (a cluster's nodes starting
    /// at once) that task waited seconds, while kube-apiserver held the review open waiting
    /// for its body, and the review timed out. Started by the first call (a proxy's caches
    /// have an `Upstream` of their own that makes none).
    calls: Arc<OnceLock<Result<Threads, String>>>,
    /// The turns of reviews ([`REVIEWS_IN_FLIGHT`]), taken in order of asking.
    reviews: Arc<tokio::sync::Semaphore>,
}

/// Clients with an h2 connection each, taken in turn.
#[derive(Debug)]
struct Spread {
    clients: Vec<WebhookClient>,
    next: AtomicUsize,
}

impl Upstream {
    /// The current context of the kubeconfig at `path`: its cluster's server and CA, its
    /// user's client certificate, token, token file or exec plugin. Dials through the
    /// `controlplane` egress selection. Short requests are spread over `connections` h2
    /// connections (at least one): kube-apiserver allows 100 streams on each
    /// (`--http2-max-streams-per-connection`), and a request past them waits in the
    /// connection for a stream, unseen by the upstream's own limits and priorities.
    pub fn from_kubeconfig_file(
        path: &Path,
        egress: &Egress,
        connections: usize,
    ) -> Result<Self, ClientError> {
        let clients = (0..connections.max(1))
            .map(|_| WebhookClient::from_kubeconfig_file(path, egress))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Upstream {
            calls: Arc::default(),
            reviews: Arc::new(tokio::sync::Semaphore::new(REVIEWS_IN_FLIGHT)),
            client: WebhookClient::from_kubeconfig_file(path, egress)?,
            spread: Arc::new(Spread {
                clients,
                next: AtomicUsize::new(0),
            }),
        })
    }

    /// The next client of the spread.
    fn spread(&self) -> &WebhookClient {
        let s = &*self.spread;
        let i = s
            .next
            .fetch_add(1, Ordering::Relaxed)
            .checked_rem(s.clients.len())
            .unwrap_or(0);
        s.clients.get(i).unwrap_or(&self.client)
    }

    /// The server URL, for messages.
    pub fn url(&self) -> String {
        self.client.url()
    }

    /// Sends a request (its path and query appended to the server URL) under the proxy's
    /// credential, over the next connection of the spread; the caller's `Authorization` is
    /// replaced. No timeout.
    pub async fn send(
        &self,
        request: http::Request<RequestBody>,
    ) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
        self.spread().request(request).await
    }

    /// Sends a request on an HTTP/1.1 connection of its own, never the h2 connection that
    /// short requests share: one that asks to switch protocols (`Upgrade`), or a
    /// long-running one (a watch, logs with follow), which could otherwise hold that
    /// connection's streams from everyone else. No timeout.
    pub async fn send_alone(
        &self,
        request: http::Request<RequestBody>,
    ) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
        self.client.request_upgrade(request).await
    }

    /// Sends a request with `authorization` (a caller's own token) as its credential instead
    /// of the proxy's. No timeout.
    pub async fn send_as(
        &self,
        request: http::Request<RequestBody>,
        authorization: http::HeaderValue,
        upgrade: bool,
    ) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
        let client = if upgrade { &self.client } else { self.spread() };
        client.request_with(request, authorization, upgrade).await
    }

    /// POSTs a review (a JSON document) to `path` once one of [`REVIEWS_IN_FLIGHT`] turns is
    /// free (within [`REVIEW_TURN_WAIT`]), and reads the answer (at most
    /// [`client::MAX_RESPONSE_BODY`]) within [`CALL_TIMEOUT`]. The turn is held until the
    /// exchange ends, even if the caller stops waiting for it.
    pub async fn review(&self, path: &str, body: Bytes) -> Result<client::Response, ClientError> {
        let request = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(client::buffered(body))
            .map_err(|e| ClientError::Config(e.to_string()))?;
        let turn = match tokio::time::timeout(
            REVIEW_TURN_WAIT,
            self.reviews.clone().acquire_owned(),
        )
        .await
        {
            Ok(Ok(turn)) => turn,
            _ => {
                return Err(ClientError::Request {
                    url: self.url(),
                    message: format!(
                        "{REVIEWS_IN_FLIGHT} reviews were under way for {REVIEW_TURN_WAIT:?}"
                    ),
                });
            }
        };
        self.call(request, Some(turn)).await
    }

    /// GETs `path` (its query included) with `accept`, under the proxy's credential, and reads
    /// the answer whole: at most `limit` bytes, all within `timeout`. Proxy mode's own reads
    /// (discovery, the lists that fill its caches).
    pub async fn get(
        &self,
        path: &str,
        accept: &str,
        limit: usize,
        timeout: Duration,
    ) -> Result<(http::StatusCode, Bytes), String> {
        use http_body_util::BodyExt as _;
        let request = http::Request::get(path)
            .header(http::header::ACCEPT, accept)
            .body(client::buffered(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let url = self.url();
        let exchange = async {
            let response = self.send(request).await.map_err(|e| e.to_string())?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| format!("{url}{path}: {e}"))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| Err(format!("{url}{path}: no answer within {timeout:?}")))
    }

    /// Opens the connection of the proxy's own calls and those of the spread with a `GET
    /// /readyz` each (answers ignored), so that the first burst of callers shares them: a pool
    /// dials one connection for many requests only once it knows its server speaks h2
    /// (`client.rs`). An upstream not reachable yet costs nothing here.
    pub async fn warm(&self) {
        let spread = self.spread.clients.iter().filter_map(|c| {
            let request = http::Request::get("/readyz")
                .body(client::buffered(Bytes::new()))
                .ok()?;
            Some(exchange(c.clone(), request))
        });
        let _ = futures::join!(self.ready(), futures::future::join_all(spread));
    }

    /// Whether the upstream answers `GET /readyz` with 200 within [`CALL_TIMEOUT`].
    pub async fn ready(&self) -> Result<(), String> {
        let request = http::Request::get("/readyz")
            .body(client::buffered(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = self.call(request, None).await.map_err(|e| e.to_string())?;
        if response.status == http::StatusCode::OK {
            Ok(())
        } else {
            Err(format!(
                "{}/readyz answered {}",
                self.url(),
                response.status.as_u16()
            ))
        }
    }

    /// One of the proxy's own calls, on their thread, holding `turn` until it ends.
    async fn call(
        &self,
        request: http::Request<RequestBody>,
        turn: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Result<client::Response, ClientError> {
        let thread_failed = |e: String| ClientError::Request {
            url: self.url(),
            message: format!("the upstream calls' thread: {e}"),
        };
        let calls = self
            .calls
            .get_or_init(|| Threads::new("svc-upstream-calls", 1, || {}).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| thread_failed(e.clone()))?;
        let client = self.client.clone();
        calls
            .spawn(async move {
                let answer = exchange(client, request).await;
                drop(turn);
                answer
            })
            .await
            .unwrap_or_else(|e| Err(thread_failed(e.to_string())))
    }
}

/// `request` sent by `client`, its answer read whole (at most [`client::MAX_RESPONSE_BODY`]),
/// all within [`CALL_TIMEOUT`].
async fn exchange(
    client: WebhookClient,
    request: http::Request<RequestBody>,
) -> Result<client::Response, ClientError> {
    let url = client.url();
    let exchange = async {
        let response = client.request(request).await?;
        client::read_response(&url, response).await
    };
    match tokio::time::timeout(CALL_TIMEOUT, exchange).await {
        Ok(r) => r,
        Err(_) => Err(ClientError::Timeout {
            url,
            timeout: CALL_TIMEOUT,
        }),
    }
}
