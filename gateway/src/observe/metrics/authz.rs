//! Authorization metrics with kube-apiserver's names: decisions per configured authorizer,
//! webhook evaluations, their latency and the times a failing webhook was passed over
//! (fail open), match-condition errors and exclusions. Reloads of `--authorization-config`
//! are counted by `reload.rs`.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// kube-apiserver's buckets for `apiserver_authorization_webhook_duration_seconds`.
const WEBHOOK_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    r#type: String,
    name: String,
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    name: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthorizerLabels {
    r#type: String,
    name: String,
}

/// How one webhook call ended (the `result` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookResult {
    Success,
    Timeout,
    Error,
}

impl WebhookResult {
    fn label(self) -> &'static str {
        match self {
            WebhookResult::Success => "success",
            WebhookResult::Timeout => "timeout",
            WebhookResult::Error => "error",
        }
    }
}

/// The authorization families; cheap to clone (each family is reference-counted).
#[derive(Clone, Debug)]
pub struct AuthzMetrics {
    decisions: Family<DecisionLabels, Counter>,
    evaluations: Family<WebhookLabels, Counter>,
    duration: Family<WebhookLabels, Histogram>,
    fail_open: Family<WebhookLabels, Counter>,
    match_errors: Family<AuthorizerLabels, Counter>,
    match_exclusions: Family<AuthorizerLabels, Counter>,
}

impl AuthzMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "apiserver_authorization_decisions",
            "Total number of terminal decisions made by an authorizer split by authorizer \
             type, name, and decision.",
            decisions.clone(),
        );
        let evaluations = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "apiserver_authorization_webhook_evaluations",
            "Round-trips to authorization webhooks.",
            evaluations.clone(),
        );
        let duration = Family::<WebhookLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(WEBHOOK_BUCKETS)
        });
        registry.register(
            "apiserver_authorization_webhook_duration_seconds",
            "Request latency in seconds.",
            duration.clone(),
        );
        let fail_open = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "apiserver_authorization_webhook_evaluations_fail_open",
            "NoOpinion results due to webhook timeout or error.",
            fail_open.clone(),
        );
        let match_errors = Family::<AuthorizerLabels, Counter>::default();
        registry.register(
            "apiserver_authorization_match_condition_evaluation_errors",
            "Total number of errors when an authorization webhook encounters a match condition \
             error split by authorizer type and name.",
            match_errors.clone(),
        );
        let match_exclusions = Family::<AuthorizerLabels, Counter>::default();
        registry.register(
            "apiserver_authorization_match_condition_exclusions",
            "Total number of exclusions when an authorization webhook is skipped by match \
             conditions, split by authorizer type and name.",
            match_exclusions.clone(),
        );
        AuthzMetrics {
            decisions,
            evaluations,
            duration,
            fail_open,
            match_errors,
            match_exclusions,
        }
    }

    /// A terminal decision (`allowed` or `denied`) of configured authorizer `type_`/`name`.
    pub fn decision(&self, type_: &str, name: &str, allowed: bool) {
        self.decisions
            .get_or_create(&DecisionLabels {
                r#type: type_.to_string(),
                name: name.to_string(),
                decision: if allowed { "allowed" } else { "denied" },
            })
            .inc();
    }

    /// One round-trip to webhook `name`.
    pub fn webhook(&self, name: &str, result: WebhookResult, elapsed: Duration) {
        let labels = WebhookLabels {
            name: name.to_string(),
            result: result.label(),
        };
        self.evaluations.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// A failed call to webhook `name` answered as no opinion (`failurePolicy: NoOpinion`).
    pub fn fail_open(&self, name: &str, result: WebhookResult) {
        self.fail_open
            .get_or_create(&WebhookLabels {
                name: name.to_string(),
                result: result.label(),
            })
            .inc();
    }

    pub fn match_condition_error(&self, type_: &str, name: &str) {
        self.match_errors
            .get_or_create(&AuthorizerLabels {
                r#type: type_.to_string(),
                name: name.to_string(),
            })
            .inc();
    }

    pub fn match_condition_exclusion(&self, type_: &str, name: &str) {
        self.match_exclusions
            .get_or_create(&AuthorizerLabels {
                r#type: type_.to_string(),
                name: name.to_string(),
            })
            .inc();
    }
}
