//! The `MutatingAdmissionWebhook` and `ValidatingAdmissionWebhook` plugins: the webhooks of
//! the MutatingWebhookConfiguration and ValidatingWebhookConfiguration objects, read from the
//! server's own watch caches (a change takes effect on the next request that needs it, with
//! no restart), called for the requests they match (`webhook/rules.rs`) with an
//! `AdmissionReview` (`webhook/call.rs`).
//!
//! As in Kubernetes: configurations run in name order and their webhooks in list order;
//! mutating webhooks one after another, each seeing the last one's patch, and a webhook with
//! `reinvocationPolicy: IfNeeded` called once more if a later one changed the object;
//! validating webhooks all at once, the first refusal (in order) answering. A dry run that
//! matches a webhook with side effects (`Some`, `Unknown`) is refused with 400. A webhook
//! that cannot be reached, times out or answers wrongly fails the request (`failurePolicy:
//! Fail`, 500) or is skipped (`Ignore`). Requests to the webhook configurations themselves
//! never reach webhooks, so a broken webhook can always be removed. Deletes reach validating
//! webhooks only (the chain has no mutating phase for deletes). `matchConditions` are CEL
//! over `object`, `oldObject` and `request` (the AdmissionRequest without its objects),
//! each evaluated under Kubernetes' per-call cost budget: any false skips the webhook, an
//! error (with none false) fails the request under `failurePolicy: Fail` and skips the
//! webhook under `Ignore`. Kubernetes' `authorizer` variable is not offered.

pub mod call;
pub mod rules;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use svc_cel::{Activation, DEFAULT_BUDGET, Program};
use svc_config::admission_review::{
    AdmissionRequest, AdmissionResponse, GroupVersionKind, GroupVersionResource,
};
use svc_core::kinds::admission_registration::{
    self as reg, MutatingWebhook, Webhook, WebhookConfiguration, WebhookType,
};
use svc_core::kinds::{MutatingWebhookConfiguration, Namespace, ValidatingWebhookConfiguration};
use svc_core::resource::Scope;
use svc_core::watch::{State, WatchCache};
use svc_core::{ApiError, Resource, patch};

use self::call::{CallError, Verdict, WebhookMetrics};
use self::rules::Target;
use super::{AdmissionObject, Attributes, Mutating, Operation, Outcome, Plugin, Validating};
use crate::base::deadline::Deadline;
use crate::outbound::client::WebhookClient;
use crate::outbound::egress::Egress;
use crate::registry::caches::Caches;

pub const MUTATING_NAME: &str = "MutatingAdmissionWebhook";
pub const VALIDATING_NAME: &str = "ValidatingAdmissionWebhook";

/// How long a request waits for the configuration caches' first list before it is refused,
/// as Kubernetes' `WaitForReady`.
const READY_WAIT: Duration = Duration::from_secs(10);

/// The registry's builder: the plugins take no configuration file; their parts are attached
/// by [`super::Chain::with_webhooks`] once the server's caches exist.
pub fn build(config: Option<Value>) -> Result<Plugin, String> {
    match config {
        None => Ok(Plugin::default()),
        Some(_) => Err(
            "this server takes no configuration for the webhook plugins (no kubeConfigFile)".into(),
        ),
    }
}

/// A configuration kind and its webhooks.
trait Configuration: DeserializeOwned {
    type Hook: Webhook + Clone + Send + Sync + 'static;
    fn into_hooks(self) -> (String, Vec<Self::Hook>);
}

impl<W: WebhookType> Configuration for WebhookConfiguration<W> {
    type Hook = W;
    fn into_hooks(self) -> (String, Vec<W>) {
        (self.metadata.name, self.webhooks)
    }
}

/// One webhook ready to call: its definition (defaults applied) and its client, or why no
/// client could be built (a call then fails, subject to the failure policy).
pub struct Hook<W> {
    pub configuration: String,
    pub webhook: W,
    client: Result<WebhookClient, String>,
    /// The compiled match conditions, by name, or why one does not compile.
    conditions: Result<Vec<(String, Program)>, String>,
    url: String,
    ca_bundle: Option<String>,
}

type Hooks<W> = Arc<Vec<Arc<Hook<W>>>>;

/// The webhooks of one configuration kind, rebuilt from its cache when the cache's state
/// changes (an O(1) pointer comparison otherwise).
struct Source<C: Configuration> {
    cache: WatchCache,
    built: parking_lot::Mutex<(Option<State>, Hooks<C::Hook>)>,
}

impl<C: Configuration> Source<C> {
    fn new(cache: WatchCache) -> Self {
        Source {
            cache,
            built: parking_lot::Mutex::new((None, Arc::new(Vec::new()))),
        }
    }

    /// The webhooks now configured, or `None` before the cache's first list.
    fn current(&self, egress: &Egress) -> Option<Hooks<C::Hook>> {
        let snapshot = self.cache.snapshot().ok()?;
        let mut built = self.built.lock();
        if built.0.as_ref().is_some_and(|s| s.ptr_eq(&snapshot.state)) {
            return Some(built.1.clone());
        }
        let hooks = Arc::new(self.build(&snapshot.state, &built.1, egress));
        *built = (Some(snapshot.state), hooks.clone());
        Some(hooks)
    }

    fn build(
        &self,
        state: &State,
        previous: &[Arc<Hook<C::Hook>>],
        egress: &Egress,
    ) -> Vec<Arc<Hook<C::Hook>>> {
        let mut out = Vec::new();
        // The state is ordered by key, so by configuration name.
        for obj in state.values() {
            let config: C = match serde_json::from_slice(&obj.json) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(name = %obj.name, error = %e, "skipping an undecodable webhook configuration");
                    continue;
                }
            };
            let (configuration, hooks) = config.into_hooks();
            for mut webhook in hooks {
                webhook.apply_defaults();
                let cc = webhook.client_config();
                let url = cc.url.clone().unwrap_or_default();
                let ca_bundle = cc.ca_bundle.clone();
                // Connections are kept across changes of other webhooks.
                let reused = previous
                    .iter()
                    .find(|h| h.url == url && h.ca_bundle == ca_bundle && h.client.is_ok())
                    .map(|h| h.client.clone());
                let client =
                    reused.unwrap_or_else(|| client_for(&url, ca_bundle.as_deref(), egress));
                let conditions = webhook
                    .match_conditions()
                    .iter()
                    .map(|c| {
                        reg::compile_match_condition(&c.expression)
                            .map(|p| (c.name.clone(), p))
                            .map_err(|e| format!("match condition {:?}: {e}", c.name))
                    })
                    .collect();
                out.push(Arc::new(Hook {
                    configuration: configuration.clone(),
                    webhook,
                    client,
                    conditions,
                    url,
                    ca_bundle,
                }));
            }
        }
        out
    }
}

fn client_for(
    url: &str,
    ca_bundle: Option<&str>,
    egress: &Egress,
) -> Result<WebhookClient, String> {
    if url.is_empty() {
        return Err("the webhook has no url (service references are not supported)".into());
    }
    let pem = match ca_bundle {
        Some(b) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| format!("caBundle: {e}"))?,
        ),
        None => None,
    };
    WebhookClient::from_url(url, pem.as_deref(), egress).map_err(|e| e.to_string())
}

/// Everything both plugins share: the configuration sources, the namespaces (for namespace
/// selectors), the egress selector their clients dial through, and the metrics.
pub struct Webhooks {
    mutating: Source<MutatingWebhookConfiguration>,
    validating: Source<ValidatingWebhookConfiguration>,
    namespaces: WatchCache,
    egress: Egress,
    metrics: WebhookMetrics,
}

impl Webhooks {
    pub fn new(caches: &Caches, egress: Egress, metrics: WebhookMetrics) -> Self {
        Webhooks {
            mutating: Source::new(caches.get(MutatingWebhookConfiguration::INFO).clone()),
            validating: Source::new(caches.get(ValidatingWebhookConfiguration::INFO).clone()),
            namespaces: caches.get(Namespace::INFO).clone(),
            egress,
            metrics,
        }
    }

    /// The plugin parts for the chain.
    pub fn plugins(self: &Arc<Self>) -> (Arc<dyn Mutating>, Arc<dyn Validating>) {
        (
            Arc::new(MutatingWebhooks(self.clone())),
            Arc::new(ValidatingWebhooks(self.clone())),
        )
    }

    /// The source's webhooks, waiting (bounded) for the caches' first list.
    async fn wait_current<C: Configuration>(
        &self,
        source: &Source<C>,
    ) -> Result<Hooks<C::Hook>, ApiError> {
        let deadline = Instant::now().later(READY_WAIT);
        loop {
            if let Some(h) = source.current(&self.egress) {
                return Ok(h);
            }
            if Instant::now() >= deadline {
                return Err(ApiError::forbidden(
                    "admission webhooks: not yet ready to handle request",
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether `hook` is to be called for this request.
    fn matches<W: Webhook>(
        &self,
        hook: &W,
        attrs: &Attributes<'_>,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<bool, ApiError> {
        let info = attrs.info;
        let target = Target {
            operation: attrs.operation.as_str(),
            group: info.group,
            version: info.version,
            resource: info.plural,
            subresource: attrs.subresource.unwrap_or(""),
            scope: info.scope,
        };
        if !rules::rules_match(hook.rules(), &target) {
            return Ok(false);
        }
        if let Some(sel) = hook.namespace_selector().filter(|s| !s.is_empty()) {
            let labels = if std::ptr::eq(info, Namespace::INFO) {
                rules::labels_of(object.or(old)).unwrap_or_default()
            } else if info.scope == Scope::Cluster || attrs.namespace.is_empty() {
                Default::default()
            } else {
                let key = Namespace::INFO.key("", attrs.namespace);
                let snapshot = self.namespaces.snapshot()?;
                match snapshot.get(&key) {
                    Some(ns) => ns
                        .labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    None => {
                        return Err(ApiError::NotFound(svc_core::status::Subject::new(
                            "",
                            "namespaces",
                            attrs.namespace,
                        )));
                    }
                }
            };
            let cluster_scoped_other =
                info.scope == Scope::Cluster && !std::ptr::eq(info, Namespace::INFO);
            if !cluster_scoped_other && !sel.matches(&labels) {
                return Ok(false);
            }
        }
        Ok(rules::object_selector_matches(
            hook.object_selector(),
            object,
            old,
        ))
    }

    /// Calls one webhook and sorts out its answer: warnings and audit annotations into
    /// `out`, a denial or (with `failurePolicy: Fail`) a failure as the error, and the
    /// response otherwise (`None` when a failure was ignored).
    async fn invoke<W: Webhook>(
        &self,
        hook: &Hook<W>,
        request: &AdmissionRequest,
        mutating: bool,
        out: &mut Outcome,
    ) -> Result<Option<AdmissionResponse>, ApiError> {
        let (result, started) = self.send(hook, request, mutating).await;
        self.settle(hook, request, mutating, result, started, out)
    }

    async fn send<W: Webhook>(
        &self,
        hook: &Hook<W>,
        request: &AdmissionRequest,
        mutating: bool,
    ) -> (Result<(AdmissionResponse, u16), CallError>, Instant) {
        let started = Instant::now();
        let timeout = hook
            .webhook
            .timeout_seconds()
            .unwrap_or(reg::DEFAULT_TIMEOUT_SECONDS)
            .clamp(reg::MIN_TIMEOUT_SECONDS, reg::MAX_TIMEOUT_SECONDS);
        let result = match &hook.client {
            Ok(client) => {
                call::call(
                    client,
                    request,
                    mutating,
                    Duration::from_secs(u64::from(timeout.unsigned_abs())),
                )
                .await
            }
            Err(e) => Err(CallError {
                message: e.clone(),
                code: 0,
            }),
        };
        (result, started)
    }

    fn settle<W: Webhook>(
        &self,
        hook: &Hook<W>,
        request: &AdmissionRequest,
        mutating: bool,
        result: Result<(AdmissionResponse, u16), CallError>,
        started: Instant,
        out: &mut Outcome,
    ) -> Result<Option<AdmissionResponse>, ApiError> {
        let name = hook.webhook.name();
        let operation = operation_label(&request.operation);
        let (response, code) = match result {
            Ok(r) => r,
            Err(e) => {
                let ignore = hook.webhook.failure_policy() == Some(reg::FAILURE_POLICY_IGNORE);
                self.metrics.observe(
                    name,
                    mutating,
                    operation,
                    e.code,
                    Verdict::Failed { rejected: !ignore },
                    started,
                );
                if ignore {
                    tracing::warn!(webhook = %name, error = %e, "failed calling webhook, failing open");
                    let phase = if mutating { "mutation" } else { "validation" };
                    out.annotate(
                        format!("failed-open.{phase}.webhook.admission.svc.io/{name}"),
                        name,
                    );
                    return Ok(None);
                }
                tracing::warn!(webhook = %name, error = %e, "failed calling webhook, failing closed");
                return Err(ApiError::Internal(format!(
                    "failed calling webhook {name:?}: {e}"
                )));
            }
        };
        for w in call::bounded_warnings(&response.warnings) {
            out.warn(w);
        }
        for (k, v) in response
            .audit_annotations
            .iter()
            .take(call::MAX_AUDIT_ANNOTATIONS_PER_RESPONSE)
        {
            out.annotate(format!("{name}/{k}"), v.clone());
        }
        if response.allowed != Some(true) {
            let err = call::denial(name, response.status.as_ref());
            self.metrics.observe(
                name,
                mutating,
                operation,
                code,
                Verdict::Denied(err.code()),
                started,
            );
            return Err(err);
        }
        self.metrics
            .observe(name, mutating, operation, code, Verdict::Admitted, started);
        Ok(Some(response))
    }
}

/// Whether the webhook's match conditions hold for `request`: false as soon as one is false;
/// an error when one fails to evaluate and none is false.
pub fn conditions_hold(
    conditions: &Result<Vec<(String, Program)>, String>,
    request: &AdmissionRequest,
) -> Result<bool, String> {
    let programs = conditions.as_ref().map_err(Clone::clone)?;
    if programs.is_empty() {
        return Ok(true);
    }
    let vars = Activation::new()
        .bind("object", request.object.clone().unwrap_or(Value::Null))
        .bind(
            "oldObject",
            request.old_object.clone().unwrap_or(Value::Null),
        )
        .bind("request", request_variable(request));
    let mut error = None;
    for (name, program) in programs {
        match program.eval_bool(&vars, DEFAULT_BUDGET) {
            Ok(false) => return Ok(false),
            Ok(true) => {}
            Err(e) => {
                error.get_or_insert_with(|| format!("match condition {name:?}: {e}"));
            }
        }
    }
    error.map_or(Ok(true), Err)
}

/// The `request` variable: the AdmissionRequest without its objects, every field present
/// (empty strings and lists where unset), as Kubernetes' typed variable has them.
fn request_variable(r: &AdmissionRequest) -> Value {
    let user = r.user_info.clone().unwrap_or_default();
    json!({
        "uid": r.uid,
        "kind": r.kind,
        "resource": r.resource,
        "subResource": r.sub_resource,
        "requestKind": r.request_kind,
        "requestResource": r.request_resource,
        "requestSubResource": r.request_sub_resource,
        "name": r.name,
        "namespace": r.namespace,
        "operation": r.operation,
        "userInfo": {"username": user.username, "uid": user.uid, "groups": user.groups,
            "extra": user.extra},
        "dryRun": r.dry_run.unwrap_or(false),
        "options": r.options,
    })
}

/// Whether a matched webhook is to be called after its match conditions: skipped when one
/// is false, or when one fails under `failurePolicy: Ignore`; the request fails (500) when
/// one fails under `Fail`.
fn should_call<W: Webhook>(hook: &Hook<W>, request: &AdmissionRequest) -> Result<bool, ApiError> {
    match conditions_hold(&hook.conditions, request) {
        Ok(call) => Ok(call),
        Err(e) if hook.webhook.failure_policy() == Some(reg::FAILURE_POLICY_IGNORE) => {
            tracing::warn!(webhook = %hook.webhook.name(), error = %e, "skipping webhook");
            Ok(false)
        }
        Err(e) => Err(ApiError::Internal(format!(
            "failed calling webhook {:?}: {e}",
            hook.webhook.name()
        ))),
    }
}

/// The operation as a static label value.
fn operation_label(op: &str) -> &'static str {
    match op {
        "CREATE" => "CREATE",
        "UPDATE" => "UPDATE",
        "DELETE" => "DELETE",
        _ => "CONNECT",
    }
}

/// Requests that never reach webhooks: writes of the webhook configurations themselves.
fn exempt(attrs: &Attributes<'_>) -> bool {
    attrs.info.group == reg::GROUP
}

/// The `AdmissionReview` request for this write: every field of the spec. The kind is the
/// object's own (a TokenRequest through `serviceaccounts/token`), the resource the one
/// written; this server converts nothing, so the `request*` fields repeat them.
pub fn admission_request(
    attrs: &Attributes<'_>,
    object: Option<&Value>,
    old: Option<&Value>,
) -> AdmissionRequest {
    let info = attrs.info;
    let typed = object.or(old);
    let (group, version) = typed
        .and_then(|o| o.get("apiVersion"))
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
        .map(|v| match v.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), v.to_string()),
        })
        .unwrap_or_else(|| (info.group.to_string(), info.version.to_string()));
    let kind = typed
        .and_then(|o| o.get("kind"))
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .unwrap_or(info.kind)
        .to_string();
    let gvk = GroupVersionKind {
        group,
        version,
        kind,
    };
    let gvr = GroupVersionResource {
        group: info.group.into(),
        version: info.version.into(),
        resource: info.plural.into(),
    };
    let (options_kind, carries_old) = match attrs.operation {
        Operation::Create => ("CreateOptions", false),
        Operation::Update => ("UpdateOptions", true),
        Operation::Delete => ("DeleteOptions", true),
        Operation::Connect => ("", false),
    };
    let options = (!options_kind.is_empty()).then(|| {
        let mut o = json!({"apiVersion": "meta.svc.io/v1", "kind": options_kind});
        if attrs.dry_run
            && let Some(o) = o.as_object_mut()
        {
            o.insert("dryRun".into(), json!(["All"]));
        }
        o
    });
    let sub = attrs.subresource.unwrap_or("").to_string();
    AdmissionRequest {
        uid: uuid::Uuid::new_v4().to_string(),
        kind: Some(gvk.clone()),
        resource: Some(gvr.clone()),
        sub_resource: sub.clone(),
        request_kind: Some(gvk),
        request_resource: Some(gvr),
        request_sub_resource: sub,
        name: attrs.name.to_string(),
        namespace: attrs.namespace.to_string(),
        operation: attrs.operation.as_str().to_string(),
        user_info: Some(attrs.user.clone()),
        object: object.cloned(),
        old_object: if carries_old { old.cloned() } else { None },
        dry_run: Some(attrs.dry_run),
        options,
    }
}

/// A dry run may reach only webhooks without side effects on dry runs.
fn refuse_dry_run<W: Webhook>(hook: &W, attrs: &Attributes<'_>) -> Result<(), ApiError> {
    let safe = matches!(
        hook.side_effects(),
        Some(reg::SIDE_EFFECTS_NONE) | Some(reg::SIDE_EFFECTS_NONE_ON_DRY_RUN)
    );
    if attrs.dry_run && !safe {
        return Err(ApiError::BadRequest(format!(
            "admission webhook {:?} does not support dry run",
            hook.name()
        )));
    }
    Ok(())
}

/// Applies a mutating webhook's patch to `object`; whether it changed. A patch that does
/// not apply fails the request (500), whatever the failure policy, as in Kubernetes.
fn apply_patch(
    name: &str,
    response: &AdmissionResponse,
    object: &mut Value,
) -> Result<bool, ApiError> {
    let Some(patch) = response.patch.as_deref().filter(|p| !p.is_empty()) else {
        return Ok(false);
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|e| ApiError::Internal(format!("webhook {name:?}: patch: {e}")))?;
    let next = patch::json_patch::apply(object, &bytes).map_err(|e| {
        ApiError::Internal(format!("webhook {name:?}: the patch does not apply: {e}"))
    })?;
    if next == *object {
        return Ok(false);
    }
    *object = next;
    Ok(true)
}

struct MutatingWebhooks(Arc<Webhooks>);

#[async_trait]
impl Mutating for MutatingWebhooks {
    fn handles(&self, attrs: &Attributes<'_>) -> bool {
        !exempt(attrs)
            && self
                .0
                .mutating
                .current(&self.0.egress)
                .is_none_or(|h| !h.is_empty())
    }

    async fn admit(
        &self,
        attrs: &Attributes<'_>,
        object: &mut Value,
        old: Option<&dyn AdmissionObject>,
        out: &mut Outcome,
    ) -> Result<bool, ApiError> {
        let w = &self.0;
        let hooks = w.wait_current(&w.mutating).await?;
        let old = old.map(|o| o.to_json()).transpose()?;
        let mut changed = false;
        // Webhooks that asked to be called again, with the object as they left it.
        let mut reinvoke: Vec<(&Arc<Hook<MutatingWebhook>>, Value)> = Vec::new();
        for hook in hooks.iter() {
            if !w.matches(&hook.webhook, attrs, Some(object), old.as_ref())? {
                continue;
            }
            let request = admission_request(attrs, Some(object), old.as_ref());
            if !should_call(hook, &request)? {
                continue;
            }
            refuse_dry_run(&hook.webhook, attrs)?;
            if let Some(resp) = w.invoke(hook, &request, true, out).await? {
                changed |= apply_patch(hook.webhook.name(), &resp, object)?;
            }
            if hook.webhook.reinvocation_policy() == Some(reg::REINVOCATION_IF_NEEDED) {
                reinvoke.push((hook, object.clone()));
            }
        }
        // Once more, for those whose output a later webhook changed.
        for (hook, left) in reinvoke {
            if left == *object || !w.matches(&hook.webhook, attrs, Some(object), old.as_ref())? {
                continue;
            }
            let request = admission_request(attrs, Some(object), old.as_ref());
            if !should_call(hook, &request)? {
                continue;
            }
            if let Some(resp) = w.invoke(hook, &request, true, out).await? {
                changed |= apply_patch(hook.webhook.name(), &resp, object)?;
            }
        }
        Ok(changed)
    }
}

struct ValidatingWebhooks(Arc<Webhooks>);

#[async_trait]
impl Validating for ValidatingWebhooks {
    fn handles(&self, attrs: &Attributes<'_>) -> bool {
        !exempt(attrs)
            && self
                .0
                .validating
                .current(&self.0.egress)
                .is_none_or(|h| !h.is_empty())
    }

    async fn validate(
        &self,
        attrs: &Attributes<'_>,
        object: Option<&dyn AdmissionObject>,
        old: Option<&dyn AdmissionObject>,
        out: &mut Outcome,
    ) -> Result<(), ApiError> {
        let w = &self.0;
        let hooks = w.wait_current(&w.validating).await?;
        let object = object.map(|o| o.to_json()).transpose()?;
        let old = old.map(|o| o.to_json()).transpose()?;
        let mut calls = Vec::new();
        for hook in hooks.iter() {
            if !w.matches(&hook.webhook, attrs, object.as_ref(), old.as_ref())? {
                continue;
            }
            let request = admission_request(attrs, object.as_ref(), old.as_ref());
            if !should_call(hook, &request)? {
                continue;
            }
            refuse_dry_run(&hook.webhook, attrs)?;
            calls.push(async move {
                let (result, started) = w.send(hook, &request, false).await;
                (hook, request, result, started)
            });
        }
        // All at once, as Kubernetes calls validating webhooks; answers are read in order.
        let mut first_error = None;
        for (hook, request, result, started) in futures::future::join_all(calls).await {
            if let Err(e) = w.settle(hook, &request, false, result, started, out) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests;
