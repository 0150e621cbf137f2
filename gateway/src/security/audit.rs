//! Audit logging: `--audit-policy-file` decides per request how much is recorded (the first
//! matching rule; no match is `None`), and each recorded stage of a request becomes an
//! `audit.svc.io/v1` Event sent to the backends: the log file (`audit/log.rs`) and the
//! webhook (`audit/webhook.rs`), each in `blocking`, `blocking-strict` or `batch` mode
//! (`audit/buffer.rs`).
//!
//! The pipeline asks [`Auditor::begin`] once a request is authenticated. At level `None` that
//! is all it costs (a policy lookup and a counter), and with no policy file the pipeline
//! skips the whole module on one branch. A watch is audited as one request:
//! `RequestReceived`, `ResponseStarted` when its stream starts, and `ResponseComplete` when the
//! stream ends (from a guard on the body), never per watch event.
//!
//! Handlers (admission, rate limits) add annotations through [`annotate`] on the request's
//! extensions; the pipeline records the authorization decision the same way.

pub mod buffer;
pub mod log;
pub mod request;
pub mod webhook;

pub use request::{
    AUDIT_ID_HEADER, Annotations, DECISION_ANNOTATION, RATE_LIMIT_ANNOTATION, REASON_ANNOTATION,
    annotate,
};
use request::{source_ips, user_agent};

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::HeaderValue;
use prometheus_client::metrics::counter::Counter;
use svc_config::audit::{
    AuditedResource, Evaluator, Event, Level, ObjectReference, Policy, RawJson, RequestAttributes,
    RequestAuditConfig, ResponseStatus, Stage,
};
use svc_core::meta::MicroTime;
use svc_core::user::UserInfo;

use crate::base::flags::{AuditMode, AuditOptions, BatchOptions};
use crate::base::router::Route;
use crate::observe::metrics::AuditMetrics;

/// How long shutdown waits for batch buffers to drain.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);

/// An audit backend: the log file, the webhook, or either behind a batch buffer.
pub trait Sink: Send + Sync {
    /// `log` or `webhook`: the `plugin` label of `apiserver_audit_error_total`.
    fn name(&self) -> &'static str;
    fn process<'a>(&'a self, events: &'a [Arc<Event>]) -> BoxFuture<'a, Result<(), String>>;
}

struct Backend {
    sink: Arc<dyn Sink>,
    buffered: Option<Arc<buffer::Buffered>>,
    strict: bool,
    errors: Counter,
}

/// The audit policy and backends of a server.
pub struct Auditor {
    policy: Evaluator,
    backends: Vec<Backend>,
    metrics: AuditMetrics,
}

impl Auditor {
    /// The auditor the flags ask for: None without `--audit-policy-file` or without a
    /// backend. `webhook` sends to `--audit-webhook-config-file`'s server.
    pub fn from_options(
        opts: &AuditOptions,
        metrics: &AuditMetrics,
        webhook: Option<Arc<dyn webhook::Destination>>,
    ) -> Result<Option<Arc<Auditor>>, String> {
        let Some(policy_file) = &opts.audit_policy_file else {
            return Ok(None);
        };
        let bytes = std::fs::read(policy_file)
            .map_err(|e| format!("reading --audit-policy-file {}: {e}", policy_file.display()))?;
        let policy: Policy = svc_config::load(&bytes)
            .map_err(|e| format!("--audit-policy-file {}: {e}", policy_file.display()))?;
        let mut sinks: Vec<(Arc<dyn Sink>, AuditMode, BatchOptions)> = Vec::new();
        if let Some(path) = &opts.audit_log_path {
            let writer = if path.as_os_str() == "-" {
                log::LogWriter::stdout()
            } else {
                log::LogWriter::file(
                    path,
                    log::Rotation {
                        max_bytes: opts.audit_log_maxsize.saturating_mul(1024 * 1024),
                        max_backups: opts.audit_log_maxbackup,
                        max_age: Duration::from_secs(opts.audit_log_maxage.saturating_mul(86400)),
                    },
                )
                .map_err(|e| format!("opening --audit-log-path {}: {e}", path.display()))?
            };
            sinks.push((
                Arc::new(log::LogSink::new(writer)),
                opts.audit_log_mode,
                opts.log_batch(),
            ));
        }
        if opts.audit_webhook_config_file.is_some() && webhook.is_none() {
            return Err("--audit-webhook-config-file: no client for the webhook was given".into());
        }
        if let Some(target) = webhook {
            sinks.push((
                Arc::new(webhook::WebhookSink::new(
                    target,
                    webhook::Backoff::kubernetes(opts.audit_webhook_initial_backoff),
                )),
                opts.audit_webhook_mode,
                opts.webhook_batch(),
            ));
        }
        if sinks.is_empty() {
            tracing::warn!(
                "--audit-policy-file is set but no audit backend is: nothing is audited"
            );
            return Ok(None);
        }
        Ok(Some(Arc::new(Auditor::new(
            &policy,
            sinks,
            metrics.clone(),
        ))))
    }

    /// Starts the batch tasks of `batch`-mode sinks (needs a runtime).
    pub fn new(
        policy: &Policy,
        sinks: Vec<(Arc<dyn Sink>, AuditMode, BatchOptions)>,
        metrics: AuditMetrics,
    ) -> Auditor {
        let backends = sinks
            .into_iter()
            .map(|(sink, mode, batch)| {
                let errors = metrics.errors(sink.name());
                match mode {
                    AuditMode::Batch => {
                        let b = Arc::new(buffer::Buffered::start(
                            sink,
                            buffer::BatchConfig {
                                buffer_size: batch.buffer_size,
                                max_batch_size: batch.max_size,
                                max_batch_wait: batch.max_wait,
                                throttle: batch
                                    .throttle_enable
                                    .then_some((batch.throttle_qps, batch.throttle_burst)),
                            },
                            errors.clone(),
                            errors.clone(),
                        ));
                        Backend {
                            sink: b.clone(),
                            buffered: Some(b),
                            strict: false,
                            errors,
                        }
                    }
                    AuditMode::Blocking | AuditMode::BlockingStrict => Backend {
                        sink,
                        buffered: None,
                        strict: mode == AuditMode::BlockingStrict,
                        errors,
                    },
                }
            })
            .collect();
        Auditor {
            policy: Evaluator::new(policy),
            backends,
            metrics,
        }
    }

    /// Sends what the batch buffers hold (bounded in time).
    pub async fn shutdown(&self) {
        for b in &self.backends {
            if let Some(buf) = &b.buffered {
                buf.shutdown(SHUTDOWN_DRAIN).await;
            }
        }
    }

    /// Sends one event to every backend; Err when a `blocking-strict` one failed.
    async fn emit(&self, event: Event) -> Result<(), String> {
        self.metrics.events.inc();
        let events = [Arc::new(event)];
        let mut strict_failure = Ok(());
        for b in &self.backends {
            if let Err(e) = b.sink.process(&events).await {
                b.errors.inc();
                tracing::warn!(backend = b.sink.name(), error = %e, "audit event not written");
                if b.strict {
                    strict_failure = Err(e);
                }
            }
        }
        strict_failure
    }

    /// The audit ID of a request (its `Audit-ID` header, else a new UUID) and, unless the
    /// policy says `None`, its record. `user` is None when authentication failed.
    pub fn begin(
        self: &Arc<Self>,
        req: &http::Request<impl Sized>,
        peer: Option<SocketAddr>,
        route: &Route,
        verb: &'static str,
        user: Option<&UserInfo>,
    ) -> Begun {
        let audit_id = req
            .headers()
            .get(AUDIT_ID_HEADER)
            .filter(|v| !v.is_empty())
            .cloned()
            .unwrap_or_else(|| {
                HeaderValue::from_str(&uuid::Uuid::new_v4().to_string())
                    .unwrap_or(HeaderValue::from_static("0"))
            });
        let path = req.uri().path();
        let resource = match route {
            Route::Resource(r) => Some(AuditedResource {
                group: r.info.group,
                resource: r.info.plural,
                subresource: r.subresource.as_deref().unwrap_or_default(),
                namespace: &r.namespace,
                name: r.name.as_deref().unwrap_or_default(),
            }),
            _ => None,
        };
        let config = self.policy.evaluate(&RequestAttributes {
            user,
            verb,
            resource,
            path,
        });
        self.metrics.level(config.level).inc();
        if config.level == Level::None {
            return Begun {
                audit_id,
                record: None,
            };
        }
        let object_ref = match route {
            Route::Resource(r) if !matches!(verb, "list" | "watch" | "deletecollection") => {
                Some(ObjectReference {
                    resource: r.info.plural.to_string(),
                    namespace: r.namespace.clone(),
                    name: r.name.clone().unwrap_or_default(),
                    api_group: r.info.group.to_string(),
                    api_version: r.info.version.to_string(),
                    subresource: r.subresource.clone().unwrap_or_default(),
                    ..Default::default()
                })
            }
            _ => None,
        };
        let verb = if resource.is_some() {
            verb.to_string()
        } else {
            req.method().as_str().to_ascii_lowercase()
        };
        let record = Record {
            auditor: self.clone(),
            config,
            audit_id: audit_id.to_str().unwrap_or_default().to_string(),
            request_uri: req
                .uri()
                .path_and_query()
                .map_or_else(|| path.to_string(), |pq| pq.as_str().to_string()),
            long_running: verb == "watch",
            verb,
            user: user.cloned().unwrap_or_default(),
            source_ips: source_ips(req.headers(), peer.map(|p| p.ip())),
            user_agent: user_agent(req.headers()),
            object_ref,
            kind: match route {
                Route::Resource(r) if r.subresource.is_none() => Some(r.info),
                _ => None,
            },
            received: MicroTime::now(),
            annotations: Annotations::default(),
            request_object: None,
        };
        Begun {
            audit_id,
            record: Some(record),
        }
    }
}

/// What [`Auditor::begin`] decided.
pub struct Begun {
    /// Returned in the response's `Audit-ID` header.
    pub audit_id: HeaderValue,
    /// None at level `None`.
    pub record: Option<Record>,
}

/// One audited request.
pub struct Record {
    auditor: Arc<Auditor>,
    config: RequestAuditConfig,
    audit_id: String,
    request_uri: String,
    verb: String,
    user: UserInfo,
    source_ips: Vec<String>,
    user_agent: String,
    object_ref: Option<ObjectReference>,
    /// The kind of the route's objects (not of a subresource's), so bodies in other formats
    /// than JSON can be recorded as JSON.
    kind: Option<&'static svc_core::ResourceInfo>,
    received: MicroTime,
    annotations: Annotations,
    request_object: Option<RawJson>,
    long_running: bool,
}

impl Record {
    /// The handle handlers annotate through (put it in the request's extensions).
    pub fn annotations(&self) -> Annotations {
        self.annotations.clone()
    }

    pub fn annotate(&self, key: &str, value: &str) {
        self.annotations.add(key, value);
    }

    pub fn level(&self) -> Level {
        self.config.level
    }

    /// Keeps the request body (at `Request` level and up), given as JSON (`serve::audited`
    /// converts the other formats); the name and namespace of an object being created
    /// complete the object reference.
    pub fn request_body(&mut self, body: &Bytes) {
        if let Some(r) = &mut self.object_ref
            && r.name.is_empty()
            && self.verb == "create"
        {
            #[derive(serde::Deserialize)]
            struct Meta {
                #[serde(default)]
                name: String,
                #[serde(default)]
                namespace: String,
            }
            #[derive(serde::Deserialize)]
            struct Obj {
                metadata: Option<Meta>,
            }
            if let Ok(Obj { metadata: Some(m) }) = serde_json::from_slice::<Obj>(body) {
                r.name = m.name;
                if r.namespace.is_empty() {
                    r.namespace = m.namespace;
                }
            }
        }
        if self.config.level < Level::Request || body.is_empty() {
            return;
        }
        let stripped = if self.config.omit_managed_fields {
            svc_config::audit::without_managed_fields(body)
        } else {
            None
        };
        self.request_object = RawJson::new(stripped.as_deref().unwrap_or(body));
    }

    fn event(
        &self,
        stage: Stage,
        status: Option<ResponseStatus>,
        response: Option<RawJson>,
    ) -> Event {
        let request_object = (stage != Stage::RequestReceived)
            .then(|| self.request_object.clone())
            .flatten();
        Event {
            kind: "Event".into(),
            api_version: svc_config::audit::API_VERSION.into(),
            level: self.config.level,
            audit_id: self.audit_id.clone(),
            stage,
            request_uri: self.request_uri.clone(),
            verb: self.verb.clone(),
            user: self.user.clone(),
            impersonated_user: None,
            source_ips: self.source_ips.clone(),
            user_agent: self.user_agent.clone(),
            object_ref: self.object_ref.clone(),
            response_status: status,
            request_object,
            response_object: response,
            request_received_timestamp: self.received,
            stage_timestamp: MicroTime::now(),
            annotations: self.annotations.snapshot(),
        }
    }

    async fn stage(
        &self,
        stage: Stage,
        status: Option<ResponseStatus>,
        response: Option<RawJson>,
    ) -> Result<(), String> {
        if self.config.omit_stages.contains(stage) {
            return Ok(());
        }
        self.auditor.emit(self.event(stage, status, response)).await
    }

    /// The `RequestReceived` stage; Err when a `blocking-strict` backend could not take it
    /// (the request then fails with 500).
    pub async fn received(&self) -> Result<(), svc_core::ApiError> {
        self.stage(Stage::RequestReceived, None, None)
            .await
            .map_err(|e| svc_core::ApiError::internal(format!("audit: {e}")))
    }

    /// The kind of the request's objects, when it is a resource request (not a subresource).
    pub fn kind(&self) -> Option<&'static svc_core::ResourceInfo> {
        self.kind
    }

    /// Whether the request is a watch: its `ResponseComplete` comes when the stream ends.
    pub fn is_long_running(&self) -> bool {
        self.long_running
    }

    /// Whether the event records the response's object (level `RequestResponse`).
    pub fn wants_response_object(&self) -> bool {
        self.config.level >= Level::RequestResponse
    }

    /// A JSON response body as the event records it (managed fields left out when the policy
    /// says so); None when it is not JSON.
    pub fn response_object(&self, body: &[u8]) -> Option<RawJson> {
        let stripped = if self.config.omit_managed_fields {
            svc_config::audit::without_managed_fields(body)
        } else {
            None
        };
        RawJson::new(stripped.as_deref().unwrap_or(body))
    }

    /// Emits one stage of the event (unless the policy omits it); Err when a backend that
    /// must not lose events could not take it.
    pub async fn emit(
        &self,
        stage: Stage,
        status: Option<ResponseStatus>,
        response: Option<RawJson>,
    ) -> Result<(), String> {
        self.stage(stage, status, response).await
    }

    /// Hands the `ResponseComplete` stage to a guard that emits it when dropped: at the end
    /// of a watch's stream, or when its client goes away.
    pub fn complete_on_drop(self, status: ResponseStatus) -> CompleteOnDrop {
        CompleteOnDrop(Some((self, status)))
    }
}

/// Emits a long-running request's `ResponseComplete` stage when dropped.
pub struct CompleteOnDrop(Option<(Record, ResponseStatus)>);

impl Drop for CompleteOnDrop {
    fn drop(&mut self) {
        let Some((record, status)) = self.0.take() else {
            return;
        };
        if record.config.omit_stages.contains(Stage::ResponseComplete) {
            return;
        }
        let event = record.event(Stage::ResponseComplete, Some(status), None);
        let auditor = record.auditor.clone();
        let mut fut: BoxFuture<'static, ()> = Box::pin(async move {
            let _ = auditor.emit(event).await;
        });
        // Blocking log writes finish here; anything that must wait runs as a task.
        let waker = futures::task::noop_waker();
        if fut
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(fut);
        }
    }
}

#[cfg(test)]
mod tests;
