//! The webhook backend (`--audit-webhook-config-file`): each batch of events is POSTed as one
//! `EventList` (JSON) to the server a kubeconfig names. A failed send is retried with
//! Kubernetes' backoff for audit webhooks: `--audit-webhook-initial-backoff`, then 1.5 times
//! longer each time (jitter 0.2), five tries in all; connection failures, 429 and 5xx are
//! retried, other answers are not.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use rand::Rng;
use svc_config::audit::{Event, EventList};

use super::Sink;

/// Where events are sent: an HTTP(S) endpoint answering a POST with a status code.
pub trait Destination: Send + Sync {
    /// POSTs `body` (`application/json`); the response's status, or why there was none.
    fn post(&self, body: Bytes) -> BoxFuture<'_, Result<u16, String>>;
}

/// How often and how long to try.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub initial: Duration,
    pub factor: f64,
    pub jitter: f64,
    pub steps: u32,
}

impl Backoff {
    /// Kubernetes' `DefaultRetryBackoffWithInitialDelay`.
    pub fn kubernetes(initial: Duration) -> Self {
        Backoff {
            initial,
            factor: 1.5,
            jitter: 0.2,
            steps: 5,
        }
    }
}

/// How long one POST may take, as Kubernetes' audit webhook allows.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The gateway's webhook client is a target.
impl Destination for crate::outbound::client::WebhookClient {
    fn post(&self, body: Bytes) -> BoxFuture<'_, Result<u16, String>> {
        Box::pin(async move {
            crate::outbound::client::WebhookClient::post(
                self,
                body,
                "application/json",
                CALL_TIMEOUT,
            )
            .await
            .map(|r| r.status.as_u16())
            .map_err(|e| e.to_string())
        })
    }
}

pub struct WebhookSink {
    target: Arc<dyn Destination>,
    backoff: Backoff,
}

impl WebhookSink {
    pub fn new(target: Arc<dyn Destination>, backoff: Backoff) -> Self {
        WebhookSink { target, backoff }
    }
}

fn retryable(result: &Result<u16, String>) -> bool {
    match result {
        Err(_) => true,
        Ok(code) => *code == 429 || *code >= 500,
    }
}

impl Sink for WebhookSink {
    fn name(&self) -> &'static str {
        "webhook"
    }

    fn process<'a>(&'a self, events: &'a [Arc<Event>]) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let list = EventList::new(events.iter().map(|e| (**e).clone()).collect());
            let body = Bytes::from(list.to_json());
            let mut delay = self.backoff.initial;
            let mut last = Err("no attempt".to_string());
            for step in 0..self.backoff.steps.max(1) {
                if step > 0 {
                    let jitter = rand::rng().random_range(0.0..=self.backoff.jitter.max(0.0));
                    tokio::time::sleep(delay.mul_f64(1.0 + jitter)).await;
                    delay = delay.mul_f64(self.backoff.factor);
                }
                last = self.target.post(body.clone()).await;
                if !retryable(&last) {
                    break;
                }
            }
            match last {
                Ok(code) if (200..300).contains(&code) => Ok(()),
                Ok(code) => Err(format!("the audit webhook answered {code}")),
                Err(e) => Err(format!("calling the audit webhook: {e}")),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Scripted {
        answers: parking_lot::Mutex<Vec<Result<u16, String>>>,
        bodies: parking_lot::Mutex<Vec<Bytes>>,
    }

    impl Destination for Scripted {
        fn post(&self, body: Bytes) -> BoxFuture<'_, Result<u16, String>> {
            self.bodies.lock().push(body);
            let next = self.answers.lock().pop().unwrap_or(Ok(200));
            Box::pin(std::future::ready(next))
        }
    }

    fn event() -> Arc<Event> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "kind": "Event", "apiVersion": "audit.svc.io/v1", "level": "Metadata",
                "auditID": "a", "stage": "ResponseComplete", "requestURI": "/api",
                "verb": "get", "user": {"username": "jane"},
                "requestReceivedTimestamp": "2026-11-23T17:00:00.000000Z",
                "stageTimestamp": "2026-11-23T17:00:00.000001Z"
            }))
            .unwrap(),
        )
    }

    #[tokio::test]
    async fn sends_an_event_list_and_retries_server_errors() {
        let target = Arc::new(Scripted {
            // Popped from the end: a refusal, a 503, then success.
            answers: parking_lot::Mutex::new(vec![Ok(200), Ok(503), Err("refused".into())]),
            bodies: Default::default(),
        });
        let sink = WebhookSink::new(
            target.clone(),
            Backoff::kubernetes(Duration::from_millis(20)),
        );
        let evs = [event(), event()];
        sink.process(&evs).await.unwrap();
        let bodies = target.bodies.lock();
        assert_eq!(bodies.len(), 3);
        let list: serde_json::Value = serde_json::from_slice(&bodies[2]).unwrap();
        assert_eq!(list["kind"], "EventList");
        assert_eq!(list["apiVersion"], "audit.svc.io/v1");
        assert_eq!(list["items"].as_array().unwrap().len(), 2);
        assert_eq!(list["items"][0]["level"], "Metadata");
    }

    #[tokio::test]
    async fn gives_up_after_five_tries_and_does_not_retry_a_client_error() {
        let down = Arc::new(Scripted {
            answers: parking_lot::Mutex::new(vec![Ok(500); 10]),
            bodies: Default::default(),
        });
        let sink = WebhookSink::new(down.clone(), Backoff::kubernetes(Duration::from_millis(20)));
        let start = std::time::Instant::now();
        assert!(sink.process(&[event()]).await.is_err());
        assert_eq!(down.bodies.lock().len(), 5);
        // 20 + 30 + 45 + 67.5 ms of backoff at least.
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(162), "{waited:?}");
        let refused = Arc::new(Scripted {
            answers: parking_lot::Mutex::new(vec![Ok(400)]),
            bodies: Default::default(),
        });
        let sink = WebhookSink::new(
            refused.clone(),
            Backoff::kubernetes(Duration::from_millis(20)),
        );
        assert!(sink.process(&[event()]).await.is_err());
        assert_eq!(refused.bodies.lock().len(), 1);
    }
}
