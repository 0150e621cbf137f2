//! One call to an admission webhook: the `AdmissionReview` sent, the answer checked
//! (`uid` echoed, `allowed` set, a patch only as `JSONPatch` and only from a mutating
//! webhook), a denial worded as Kubernetes words it, warnings bounded, and the per-webhook
//! metrics with Kubernetes' names.

use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use svc_config::admission_review::{
    API_VERSION, AdmissionRequest, AdmissionResponse, AdmissionReview, ResponseStatus,
};
use svc_core::ApiError;

use crate::observe::metrics::Metrics;
use crate::outbound::client::WebhookClient;

/// A webhook's warnings: each longer than this is cut (Kubernetes asks webhooks to keep
/// them to 120 characters and may truncate past 256).
pub const MAX_WARNING_CHARS: usize = 256;
/// Warnings taken from one response; the rest are dropped.
pub const MAX_WARNINGS_PER_RESPONSE: usize = 32;
/// Audit annotations taken from one response.
pub const MAX_AUDIT_ANNOTATIONS_PER_RESPONSE: usize = 32;

/// Why a call produced no usable answer (subject to the webhook's `failurePolicy`).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub message: String,
    /// The HTTP code the webhook answered with, 0 without an answer.
    pub code: u16,
}

/// Sends `request` and returns the webhook's checked response.
pub async fn call(
    client: &WebhookClient,
    request: &AdmissionRequest,
    mutating: bool,
    timeout: Duration,
) -> Result<(AdmissionResponse, u16), CallError> {
    let review = AdmissionReview {
        api_version: API_VERSION.into(),
        kind: "AdmissionReview".into(),
        request: Some(request.clone()),
        response: None,
    };
    let body = serde_json::to_vec(&review).map_err(|e| CallError {
        message: format!("encoding the AdmissionReview: {e}"),
        code: 0,
    })?;
    let answer = client
        .post(Bytes::from(body), "application/json", timeout)
        .await
        .map_err(|e| CallError {
            message: e.to_string(),
            code: 0,
        })?;
    let code = answer.status.as_u16();
    if !answer.status.is_success() {
        return Err(CallError {
            message: format!(
                "the server responded with {code}: {}",
                String::from_utf8_lossy(answer.body.get(..256).unwrap_or(&answer.body))
            ),
            code,
        });
    }
    let response = check_answer(&answer.body, &request.uid, mutating)
        .map_err(|message| CallError { message, code })?;
    Ok((response, code))
}

/// Decodes and checks a webhook's answer to the request with `uid`.
pub fn check_answer(body: &[u8], uid: &str, mutating: bool) -> Result<AdmissionResponse, String> {
    let review: AdmissionReview = serde_json::from_slice(body)
        .map_err(|e| format!("the response is not an AdmissionReview: {e}"))?;
    if review.api_version != API_VERSION || review.kind != "AdmissionReview" {
        return Err(format!(
            "expected response of apiVersion {API_VERSION} and kind AdmissionReview, got \
             {:?} {:?}",
            review.api_version, review.kind
        ));
    }
    let response = review
        .response
        .ok_or_else(|| "the response has no response field".to_string())?;
    let errors = response.verify(uid, mutating);
    if !errors.is_empty() {
        let lines: Vec<String> = errors
            .0
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        return Err(lines.join("; "));
    }
    Ok(response)
}

/// A webhook's warnings as the client gets them: at most [`MAX_WARNINGS_PER_RESPONSE`],
/// each cut to [`MAX_WARNING_CHARS`] characters, blank ones dropped.
pub fn bounded_warnings(warnings: &[String]) -> Vec<String> {
    warnings
        .iter()
        .filter(|w| !w.trim().is_empty())
        .take(MAX_WARNINGS_PER_RESPONSE)
        .map(|w| {
            if w.chars().count() > MAX_WARNING_CHARS {
                w.chars().take(MAX_WARNING_CHARS).collect()
            } else {
                w.clone()
            }
        })
        .collect()
}

/// The error a denial becomes, as Kubernetes' `ToStatusErr` makes it: the webhook's code
/// (at least 400) and `admission webhook "<name>" denied the request: <message>`. Codes this
/// server has no error of their own for become 400 (below 500) or 500.
pub fn denial(webhook: &str, status: Option<&ResponseStatus>) -> ApiError {
    let denied = format!("admission webhook {webhook:?} denied the request");
    let default = ResponseStatus::default();
    let status = status.unwrap_or(&default);
    let message = if !status.message.is_empty() {
        format!("{denied}: {}", status.message)
    } else if !status.reason.is_empty() {
        format!("{denied}: {}", status.reason)
    } else {
        format!("{denied} without explanation")
    };
    match status.code.unwrap_or(0) {
        401 => ApiError::Unauthorized(message),
        403 => ApiError::forbidden(message),
        405 => ApiError::MethodNotAllowed(message),
        406 => ApiError::NotAcceptable(message),
        410 => ApiError::Gone(message),
        413 => ApiError::RequestEntityTooLarge(message),
        415 => ApiError::UnsupportedMediaType(message),
        422 => ApiError::Unprocessable(message),
        429 => ApiError::TooManyRequests {
            message,
            retry_after_seconds: None,
        },
        503 => ApiError::ServiceUnavailable(message),
        504 => ApiError::Timeout {
            message,
            retry_after_seconds: None,
        },
        c if c >= 500 => ApiError::Internal(message),
        _ => ApiError::BadRequest(message),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    name: String,
    r#type: &'static str,
    operation: &'static str,
    rejected: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectionLabels {
    name: String,
    r#type: &'static str,
    operation: &'static str,
    error_type: &'static str,
    rejection_code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    name: String,
    r#type: &'static str,
    operation: &'static str,
    code: u16,
    rejected: &'static str,
}

/// Kubernetes' buckets for `apiserver_admission_webhook_admission_duration_seconds`.
const DURATION_BUCKETS: [f64; 8] = [0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 10.0, 25.0];

/// How a call ended, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Admitted,
    /// The webhook said no, with this code.
    Denied(u16),
    /// No usable answer; `rejected` when the failure policy turned it into a refusal.
    Failed {
        rejected: bool,
    },
    /// The answer could not be applied (a patch that does not apply).
    Internal,
}

/// The per-webhook metrics, registered with kube-apiserver's names.
#[derive(Clone)]
pub struct WebhookMetrics {
    duration: Family<DurationLabels, Histogram>,
    rejections: Family<RejectionLabels, Counter>,
    requests: Family<RequestLabels, Counter>,
}

impl WebhookMetrics {
    pub fn register(metrics: &mut Metrics) -> Self {
        let duration = Family::<DurationLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(DURATION_BUCKETS)
        });
        metrics.register(
            "apiserver_admission_webhook_admission_duration_seconds",
            "Admission webhook latency in seconds, identified by name and broken out for each \
             operation and API resource and type (validating or admit)",
            duration.clone(),
        );
        let rejections = Family::<RejectionLabels, Counter>::default();
        metrics.register(
            "apiserver_admission_webhook_rejection_count",
            "Admission webhook rejection count, identified by name and broken out for each \
             admission type (validating or admit) and operation; error_type is \
             calling_webhook_error, apiserver_internal_error or no_error",
            rejections.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        metrics.register(
            "apiserver_admission_webhook_request",
            "Admission webhook request total, identified by name and broken out for each \
             admission type (validating or admit) and operation; code is the HTTP code of \
             the answer (0 without one)",
            requests.clone(),
        );
        WebhookMetrics {
            duration,
            rejections,
            requests,
        }
    }

    /// Unregistered metrics, for tests.
    pub fn detached() -> Self {
        WebhookMetrics {
            duration: Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS)),
            rejections: Family::default(),
            requests: Family::default(),
        }
    }

    pub fn observe(
        &self,
        name: &str,
        mutating: bool,
        operation: &'static str,
        code: u16,
        verdict: Verdict,
        started: Instant,
    ) {
        let r#type = if mutating { "admit" } else { "validating" };
        let rejected = match verdict {
            Verdict::Admitted | Verdict::Failed { rejected: false } => false,
            Verdict::Denied(_) | Verdict::Failed { rejected: true } | Verdict::Internal => true,
        };
        let flag = if rejected { "true" } else { "false" };
        self.duration
            .get_or_create(&DurationLabels {
                name: name.to_string(),
                r#type,
                operation,
                rejected: flag,
            })
            .observe(started.elapsed().as_secs_f64());
        self.requests
            .get_or_create(&RequestLabels {
                name: name.to_string(),
                r#type,
                operation,
                code,
                rejected: flag,
            })
            .inc();
        let (error_type, rejection_code) = match verdict {
            Verdict::Denied(c) => ("no_error", c),
            Verdict::Failed { rejected: true } => ("calling_webhook_error", code),
            Verdict::Internal => ("apiserver_internal_error", 500),
            _ => return,
        };
        self.rejections
            .get_or_create(&RejectionLabels {
                name: name.to_string(),
                r#type,
                operation,
                error_type,
                rejection_code,
            })
            .inc();
    }
}
