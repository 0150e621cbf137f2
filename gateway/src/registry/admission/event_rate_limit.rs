//! The `EventRateLimit` admission plugin: Event creates and updates are charged to token
//! buckets (server-wide, per namespace, per user, per source and object; the limiter is
//! `svc_config::rate_limit`), and one over a limit gets 429 `TooManyRequests` with
//! `Retry-After`. Dry-run requests are not charged, as in Kubernetes: they never reach the
//! store, so they cost it nothing.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;
use svc_config::event_rate_limit::Configuration;
use svc_config::rate_limit::{EventRateLimiter, Subject};
use svc_core::kinds::Event;
use svc_core::{ApiError, Resource};

use super::{AdmissionObject, Attributes, Operation, Outcome, Plugin, Validating};

pub const NAME: &str = "EventRateLimit";

/// The plugin: the limiter and the origin of its monotonic clock.
pub struct EventRateLimit {
    limiter: EventRateLimiter,
    origin: Instant,
}

impl EventRateLimit {
    pub fn new(config: &Configuration) -> Self {
        EventRateLimit {
            limiter: EventRateLimiter::new(config, 0),
            origin: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Builds the plugin from its `Configuration` document; it has no default configuration.
pub fn build(config: Option<Value>) -> Result<Plugin, String> {
    let doc = config.ok_or_else(|| {
        "a configuration is required: name the plugin in --admission-control-config-file"
            .to_string()
    })?;
    let config: Configuration = svc_config::load_value(doc).map_err(|e| e.to_string())?;
    Ok(Plugin {
        mutating: None,
        validating: Some(std::sync::Arc::new(EventRateLimit::new(&config))),
    })
}

/// Whole seconds to wait, rounded up and at least 1 (what `Retry-After` can say).
fn retry_after_seconds(wait: Duration) -> i32 {
    let secs = wait
        .as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0));
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

#[async_trait]
impl Validating for EventRateLimit {
    fn handles(&self, attrs: &Attributes<'_>) -> bool {
        // Kubernetes' plugin handles creates and updates of Events.
        matches!(attrs.operation, Operation::Create | Operation::Update)
            && attrs.info.group == Event::INFO.group
            && attrs.info.kind == Event::INFO.kind
    }

    async fn validate(
        &self,
        attrs: &Attributes<'_>,
        object: Option<&dyn AdmissionObject>,
        _old: Option<&dyn AdmissionObject>,
        out: &mut Outcome,
    ) -> Result<(), ApiError> {
        if attrs.dry_run {
            return Ok(());
        }
        let Some(event) = object.and_then(|o| o.as_any().downcast_ref::<Event>()) else {
            return Ok(());
        };
        let subject = Subject {
            namespace: attrs.namespace,
            user: &attrs.user.username,
            event,
        };
        self.limiter
            .check(&subject, self.now())
            .inspect_err(|_| {
                out.annotate(
                    crate::base::annotations::RATE_LIMIT_ANNOTATION,
                    "EventRateLimit",
                )
            })
            .map_err(|r| ApiError::TooManyRequests {
                message: format!("Too many requests: {}", r.message),
                retry_after_seconds: Some(retry_after_seconds(r.retry_after)),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_seconds(Duration::from_nanos(1)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(333)), 1);
        assert_eq!(retry_after_seconds(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_seconds(Duration::from_millis(2001)), 3);
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
    }
}
