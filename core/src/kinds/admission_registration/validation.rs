//! Validation of webhook configurations, after Kubernetes' v1 rules
//! (`pkg/apis/admissionregistration/validation`): fully qualified unique webhook names,
//! rules without overlapping wildcards, the enumerations, `sideEffects` and
//! `admissionReviewVersions` required, timeouts of 1 to 30 seconds, an `https` URL (a
//! Service reference is refused: this server serves no Services), valid label selectors and
//! at most 64 named match conditions whose CEL compiles to a bool.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine;

use super::{
    FAILURE_POLICY_FAIL, FAILURE_POLICY_IGNORE, LabelSelectorSpec, MAX_TIMEOUT_SECONDS,
    MIN_TIMEOUT_SECONDS, MatchCondition, REINVOCATION_IF_NEEDED, REINVOCATION_NEVER,
    RuleWithOperations, SIDE_EFFECTS_NONE, SIDE_EFFECTS_NONE_ON_DRY_RUN, Webhook,
    WebhookClientConfig,
};
use crate::validation::Path;
use crate::validation::{ErrorList, dns1123_subdomain, label_value, qualified_name};

/// Kubernetes' bound on `matchConditions`.
pub const MAX_MATCH_CONDITIONS: usize = 64;
const OPERATIONS: &[&str] = &["*", "CREATE", "UPDATE", "DELETE", "CONNECT"];
const SCOPES: &[&str] = &["Cluster", "Namespaced", "*"];
/// The AdmissionReview versions this server sends.
const REVIEW_VERSIONS: &[&str] = &["v1"];

pub(super) fn validate_webhooks<W: Webhook>(webhooks: &[W], mutating: bool) -> ErrorList {
    let mut errors = ErrorList::default();
    let mut names = BTreeSet::new();
    for (i, hook) in webhooks.iter().enumerate() {
        let at = Path::root("webhooks").index(i);
        errors.extend(validate_webhook(hook, &at, mutating));
        if !hook.name().is_empty() && !names.insert(hook.name()) {
            errors.duplicate(at.child("name").as_str(), hook.name());
        }
    }
    errors
}

fn validate_webhook<W: Webhook>(hook: &W, at: &Path, mutating: bool) -> ErrorList {
    let mut errors = ErrorList::default();
    validate_webhook_name(&mut errors, &at.child("name"), hook.name());
    for (i, rule) in hook.rules().iter().enumerate() {
        validate_rule(&mut errors, &at.child("rules").index(i), rule);
    }
    validate_policies(&mut errors, at, hook);
    validate_review_versions(&mut errors, at, hook.admission_review_versions());
    if mutating
        && let Some(p) = hook.reinvocation_policy()
        && p != REINVOCATION_NEVER
        && p != REINVOCATION_IF_NEEDED
    {
        errors.not_supported(
            at.child("reinvocationPolicy").as_str(),
            p,
            &[REINVOCATION_NEVER, REINVOCATION_IF_NEEDED],
        );
    }
    validate_client_config(&mut errors, &at.child("clientConfig"), hook.client_config());
    for (field, sel) in [
        ("namespaceSelector", hook.namespace_selector()),
        ("objectSelector", hook.object_selector()),
    ] {
        if let Some(sel) = sel {
            errors.extend(validate_label_selector(sel, &at.child(field)));
        }
    }
    validate_match_conditions(
        &mut errors,
        &at.child("matchConditions"),
        hook.match_conditions(),
    );
    errors
}

/// A webhook's name: a DNS subdomain of at least three segments.
fn validate_webhook_name(errors: &mut ErrorList, name: &Path, value: &str) {
    if value.is_empty() {
        errors.required(name.as_str(), "");
    } else if let Err(e) = dns1123_subdomain(value) {
        errors.invalid(name.as_str(), value, &e);
    } else if value.split('.').count() < 3 {
        errors.invalid(
            name.as_str(),
            value,
            "should be a domain with at least three segments separated by dots",
        );
    }
}

/// One of a webhook's rules: operations, API groups and versions, resources and scope.
fn validate_rule(errors: &mut ErrorList, at: &Path, rule: &RuleWithOperations) {
    one_wildcard_list(
        errors,
        &at.child("operations"),
        &rule.operations,
        "operations",
    );
    for (j, op) in rule.operations.iter().enumerate() {
        if !OPERATIONS.contains(&op.as_str()) {
            errors.not_supported(at.child("operations").index(j).as_str(), op, OPERATIONS);
        }
    }
    one_wildcard_list(
        errors,
        &at.child("apiGroups"),
        &rule.api_groups,
        "API groups",
    );
    one_wildcard_list(
        errors,
        &at.child("apiVersions"),
        &rule.api_versions,
        "API versions",
    );
    for (j, v) in rule.api_versions.iter().enumerate() {
        if v.is_empty() {
            errors.required(at.child("apiVersions").index(j).as_str(), "");
        }
    }
    validate_resources(errors, &at.child("resources"), &rule.resources);
    if let Some(scope) = &rule.scope
        && !SCOPES.contains(&scope.as_str())
    {
        errors.not_supported(at.child("scope").as_str(), scope, SCOPES);
    }
}

/// The enumerations `failurePolicy`, `matchPolicy` and `sideEffects`, and the timeout.
fn validate_policies<W: Webhook>(errors: &mut ErrorList, at: &Path, hook: &W) {
    if let Some(p) = hook.failure_policy()
        && p != FAILURE_POLICY_FAIL
        && p != FAILURE_POLICY_IGNORE
    {
        errors.not_supported(
            at.child("failurePolicy").as_str(),
            p,
            &[FAILURE_POLICY_FAIL, FAILURE_POLICY_IGNORE],
        );
    }
    if let Some(p) = hook.match_policy()
        && p != "Exact"
        && p != "Equivalent"
    {
        errors.not_supported(
            at.child("matchPolicy").as_str(),
            p,
            &["Equivalent", "Exact"],
        );
    }
    let side = at.child("sideEffects");
    match hook.side_effects() {
        None | Some("") => errors.required(side.as_str(), ""),
        Some(SIDE_EFFECTS_NONE) | Some(SIDE_EFFECTS_NONE_ON_DRY_RUN) => {}
        Some(other) => errors.not_supported(
            side.as_str(),
            other,
            &[SIDE_EFFECTS_NONE, SIDE_EFFECTS_NONE_ON_DRY_RUN],
        ),
    }
    if let Some(t) = hook.timeout_seconds()
        && !(MIN_TIMEOUT_SECONDS..=MAX_TIMEOUT_SECONDS).contains(&t)
    {
        errors.invalid(
            at.child("timeoutSeconds").as_str(),
            &t.to_string(),
            "the timeout value must be between 1 and 30 seconds",
        );
    }
}

/// At most `MAX_MATCH_CONDITIONS` conditions, uniquely named, whose CEL compiles.
fn validate_match_conditions(errors: &mut ErrorList, conditions: &Path, items: &[MatchCondition]) {
    if items.len() > MAX_MATCH_CONDITIONS {
        errors.push(
            conditions.as_str(),
            "FieldValueTooMany",
            format!(
                "Too many: {}: must have at most {MAX_MATCH_CONDITIONS} items",
                items.len()
            ),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, c) in items.iter().enumerate() {
        let at = conditions.index(i);
        if c.name.is_empty() {
            errors.required(at.child("name").as_str(), "");
        } else if let Err(e) = qualified_name(&c.name) {
            errors.invalid(at.child("name").as_str(), &c.name, &e);
        } else if !seen.insert(c.name.as_str()) {
            errors.duplicate(at.child("name").as_str(), &c.name);
        }
        if c.expression.trim().is_empty() {
            errors.required(at.child("expression").as_str(), "");
        } else if let Err(e) = super::compile_match_condition(&c.expression) {
            errors.invalid(
                at.child("expression").as_str(),
                &c.expression,
                &e.to_string(),
            );
        }
    }
}

/// A list that must not be empty, where `*` stands alone.
fn one_wildcard_list(errors: &mut ErrorList, at: &Path, items: &[String], what: &str) {
    if items.is_empty() {
        errors.required(at.as_str(), "");
    } else if items.len() > 1 && items.iter().any(|i| i == "*") {
        errors.invalid(
            at.as_str(),
            &format!("{items:?}"),
            &format!("if '*' is present, must not specify other {what}"),
        );
    }
}

fn validate_resources(errors: &mut ErrorList, at: &Path, resources: &[String]) {
    if resources.is_empty() {
        errors.required(at.as_str(), "");
        return;
    }
    let mut wildcard_sub: BTreeSet<&str> = BTreeSet::new();
    let mut wildcard_res: BTreeSet<&str> = BTreeSet::new();
    let (mut double, mut single, mut plain) = (false, false, false);
    for (i, r) in resources.iter().enumerate() {
        if r.is_empty() {
            errors.required(at.index(i).as_str(), "");
            continue;
        }
        double |= r == "*/*";
        single |= r == "*";
        let Some((res, sub)) = r.split_once('/') else {
            plain |= r != "*";
            continue;
        };
        if wildcard_sub.contains(res) {
            errors.invalid(
                at.index(i).as_str(),
                r,
                &format!("if '{res}/*' is present, must not specify {r}"),
            );
        }
        if wildcard_res.contains(sub) {
            errors.invalid(
                at.index(i).as_str(),
                r,
                &format!("if '*/{sub}' is present, must not specify {r}"),
            );
        }
        if sub == "*" {
            wildcard_sub.insert(res);
        }
        if res == "*" {
            wildcard_res.insert(sub);
        }
    }
    let shown = format!("{resources:?}");
    if resources.len() > 1 && double {
        errors.invalid(
            at.as_str(),
            &shown,
            "if '*/*' is present, must not specify other resources",
        );
    }
    if single && plain {
        errors.invalid(
            at.as_str(),
            &shown,
            "if '*' is present, must not specify other resources without subresources",
        );
    }
}

fn validate_review_versions(errors: &mut ErrorList, at: &Path, versions: &[String]) {
    let at = at.child("admissionReviewVersions");
    if versions.is_empty() {
        errors.required(
            at.as_str(),
            &format!("must specify one of {}", REVIEW_VERSIONS.join(", ")),
        );
        return;
    }
    let mut seen = BTreeSet::new();
    for (i, v) in versions.iter().enumerate() {
        if !seen.insert(v.as_str()) {
            errors.invalid(at.index(i).as_str(), v, "duplicate version");
        }
    }
    if !versions
        .iter()
        .any(|v| REVIEW_VERSIONS.contains(&v.as_str()))
    {
        errors.invalid(
            at.as_str(),
            &format!("{versions:?}"),
            &format!(
                "must include at least one of {} (the AdmissionReview versions this server \
                 sends)",
                REVIEW_VERSIONS.join(", ")
            ),
        );
    }
}

fn validate_client_config(errors: &mut ErrorList, at: &Path, cc: &WebhookClientConfig) {
    match (&cc.url, &cc.service) {
        (None, None) | (Some(_), Some(_)) => {
            errors.required(at.as_str(), "exactly one of url or service is required");
        }
        (None, Some(_)) => errors.forbidden(
            at.child("service").as_str(),
            "this server serves no Services: give the webhook's url",
        ),
        (Some(url), None) => {
            if let Err(e) = check_https_url(url) {
                errors.invalid(at.child("url").as_str(), url, &e);
            }
        }
    }
    if let Some(ca) = &cc.ca_bundle
        && base64::engine::general_purpose::STANDARD
            .decode(ca)
            .is_err()
    {
        errors.invalid(at.child("caBundle").as_str(), "<bytes>", "must be base64");
    }
}

/// Kubernetes' `ValidateWebhookURL` with `https` forced.
fn check_https_url(url: &str) -> Result<(), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("'https' is the only allowed URL scheme".into());
    };
    if scheme != "https" {
        return Err("'https' is the only allowed URL scheme".into());
    }
    if rest.contains('#') {
        return Err("fragments are not permitted in the URL".into());
    }
    if rest.contains('?') {
        return Err("query parameters are not permitted in the URL".into());
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Err("user information is not permitted in the URL".into());
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    if host.is_empty() {
        return Err("host must be specified".into());
    }
    Ok(())
}

/// A `metav1.LabelSelector`'s rules: qualified keys, label values, `In`/`NotIn` with values,
/// `Exists`/`DoesNotExist` without.
pub fn validate_label_selector(sel: &LabelSelectorSpec, at: &Path) -> ErrorList {
    let mut errors = ErrorList::default();
    validate_labels(&mut errors, &at.child("matchLabels"), &sel.match_labels);
    for (i, r) in sel.match_expressions.iter().enumerate() {
        let at = at.child("matchExpressions").index(i);
        match r.operator.as_str() {
            "In" | "NotIn" if r.values.is_empty() => errors.required(
                at.child("values").as_str(),
                "must be specified when `operator` is 'In' or 'NotIn'",
            ),
            "Exists" | "DoesNotExist" if !r.values.is_empty() => errors.forbidden(
                at.child("values").as_str(),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errors.invalid(
                at.child("operator").as_str(),
                other,
                "not a valid selector operator",
            ),
        }
        if let Err(e) = qualified_name(&r.key) {
            errors.invalid(at.child("key").as_str(), &r.key, &e);
        }
    }
    errors
}

fn validate_labels(errors: &mut ErrorList, at: &Path, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        if let Err(e) = qualified_name(k) {
            errors.invalid(at.as_str(), k, &e);
        }
        if let Err(e) = label_value(v) {
            errors.invalid(at.key(k).as_str(), v, &e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
    use crate::resource::Resource;

    fn fields_of<T: Resource>(yaml: &str) -> Vec<String> {
        let mut obj: T = serde_saphyr::from_str(yaml).unwrap();
        obj.prepare_for_create();
        obj.validate().0.into_iter().map(|c| c.field).collect()
    }

    const OK: &str = "metadata: {name: w}\nwebhooks:\n- name: a.example.com\n  \
                      clientConfig: {url: \"https://127.0.0.1:8443/v\"}\n  \
                      rules: [{operations: [CREATE], apiGroups: [\"\"], apiVersions: [v1], \
                      resources: [namespaces]}]\n  sideEffects: None\n  \
                      admissionReviewVersions: [v1]\n";

    #[test]
    fn webhooks_are_validated_as_kubernetes_validates_them() {
        for (body, expected) in [
            (OK.to_string(), vec![]),
            (
                OK.replace("a.example.com", "example.com"),
                vec!["webhooks[0].name"],
            ),
            (
                format!("{OK}{}", &OK[OK.find("- name").unwrap()..]),
                vec!["webhooks[1].name"],
            ),
            (
                OK.replace("[CREATE]", "[CREATE, \"*\"]"),
                vec!["webhooks[0].rules[0].operations"],
            ),
            (
                OK.replace("[CREATE]", "[PATCH]"),
                vec!["webhooks[0].rules[0].operations[0]"],
            ),
            (
                OK.replace("apiGroups: [\"\"]", "apiGroups: []"),
                vec!["webhooks[0].rules[0].apiGroups"],
            ),
            (
                OK.replace("[namespaces]", "[\"*\", pods]"),
                vec!["webhooks[0].rules[0].resources"],
            ),
            (
                OK.replace("[namespaces]", "[\"pods/*\", pods/status]"),
                vec!["webhooks[0].rules[0].resources[1]"],
            ),
            (
                OK.replace("[namespaces]", "[\"*/*\", pods]"),
                vec!["webhooks[0].rules[0].resources"],
            ),
            (
                OK.replace("[namespaces]", "[\"*/status\", pods/status]"),
                vec!["webhooks[0].rules[0].resources[1]"],
            ),
            (OK.replace("[namespaces]", "[\"*\", \"*/status\"]"), vec![]),
            (
                OK.replace(
                    "resources: [namespaces]",
                    "resources: [pods], scope: Global",
                ),
                vec!["webhooks[0].rules[0].scope"],
            ),
            (
                OK.replace("sideEffects: None", "sideEffects: Some"),
                vec!["webhooks[0].sideEffects"],
            ),
            (
                OK.replace("  sideEffects: None\n", ""),
                vec!["webhooks[0].sideEffects"],
            ),
            (
                format!("{OK}  timeoutSeconds: 31\n"),
                vec!["webhooks[0].timeoutSeconds"],
            ),
            (
                format!("{OK}  timeoutSeconds: 0\n"),
                vec!["webhooks[0].timeoutSeconds"],
            ),
            (
                format!("{OK}  failurePolicy: Maybe\n"),
                vec!["webhooks[0].failurePolicy"],
            ),
            (
                OK.replace("[v1]", "[v1beta1]"),
                vec!["webhooks[0].admissionReviewVersions"],
            ),
            (
                OK.replace("[v1]", "[v1, v1]"),
                vec!["webhooks[0].admissionReviewVersions[1]"],
            ),
            (
                OK.replace("https://", "http://"),
                vec!["webhooks[0].clientConfig.url"],
            ),
            (
                OK.replace("8443/v", "8443/v?x=1"),
                vec!["webhooks[0].clientConfig.url"],
            ),
            (
                OK.replace("https://", "https://u@"),
                vec!["webhooks[0].clientConfig.url"],
            ),
            (
                OK.replace(
                    "{url: \"https://127.0.0.1:8443/v\"}",
                    "{service: {namespace: a, name: b}}",
                ),
                vec!["webhooks[0].clientConfig.service"],
            ),
            (
                OK.replace("{url: \"https://127.0.0.1:8443/v\"}", "{}"),
                vec!["webhooks[0].clientConfig"],
            ),
            (
                format!(
                    "{OK}  namespaceSelector: {{matchExpressions: [{{key: a, operator: In}}]}}\n"
                ),
                vec!["webhooks[0].namespaceSelector.matchExpressions[0].values"],
            ),
            (
                format!(
                    "{OK}  objectSelector: {{matchExpressions: [{{key: a, operator: Has}}]}}\n"
                ),
                vec!["webhooks[0].objectSelector.matchExpressions[0].operator"],
            ),
            (
                format!(
                    "{OK}  matchConditions: [{{name: a, expression: 'true'}}, {{name: a, expression: ''}}]\n"
                ),
                vec![
                    "webhooks[0].matchConditions[1].name",
                    "webhooks[0].matchConditions[1].expression",
                ],
            ),
            (
                format!(
                    "{OK}  matchConditions: [{{name: a, expression: 'object.metadata.name'}}, \
                     {{name: b, expression: 'authorizer.allowed()'}}, \
                     {{name: c, expression: \"request.operation == 'CREATE' || has(oldObject.x)\"}}, \
                     {{name: d, expression: '1 + 1'}}]\n"
                ),
                vec![
                    "webhooks[0].matchConditions[1].expression",
                    "webhooks[0].matchConditions[3].expression",
                ],
            ),
        ] {
            assert_eq!(
                fields_of::<ValidatingWebhookConfiguration>(&body),
                expected,
                "{body}"
            );
        }
        assert_eq!(
            fields_of::<MutatingWebhookConfiguration>(&format!(
                "{OK}  reinvocationPolicy: Always\n"
            )),
            ["webhooks[0].reinvocationPolicy"]
        );
        assert!(
            fields_of::<MutatingWebhookConfiguration>(&format!(
                "{OK}  reinvocationPolicy: IfNeeded\n"
            ))
            .is_empty()
        );
    }

    #[test]
    fn defaults_are_kubernetes_v1_defaults() {
        let mut obj: MutatingWebhookConfiguration = serde_saphyr::from_str(OK).unwrap();
        obj.prepare_for_create();
        let w = &obj.webhooks[0];
        assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(w.timeout_seconds, Some(10));
        assert_eq!(w.reinvocation_policy.as_deref(), Some("Never"));
        assert_eq!(w.match_policy.as_deref(), Some("Equivalent"));
        assert_eq!(w.rules[0].scope.as_deref(), Some("*"));
        assert!(w.namespace_selector.as_ref().is_some_and(|s| s.is_empty()));
    }
}
