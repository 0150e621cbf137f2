//! Validation tables for AuthorizationConfiguration: one valid document, then one broken
//! field at a time, each error naming its path.

use super::*;
use crate::load;

const VALID: &str = r#"
apiVersion: apiserver.svc.io/v1beta1
kind: AuthorizationConfiguration
authorizers:
- type: Webhook
  name: policy
  webhook:
    authorizedTTL: 1m
    unauthorizedTTL: 10s
    timeout: 3s
    subjectAccessReviewVersion: v1
    matchConditionSubjectAccessReviewVersion: v1
    failurePolicy: NoOpinion
    connectionInfo:
      type: SvcConfig
      svcConfigFile: /etc/svc/authz-webhook.kubeconfig
    matchConditions:
    - expression: has(request.resourceAttributes)
    - expression: request.user != "system:admin"
- type: AlwaysDeny
  name: deny-rest
"#;

fn errors_of(doc: &str) -> Vec<(String, String)> {
    match load::<AuthorizationConfiguration>(doc.as_bytes()) {
        Ok(_) => Vec::new(),
        Err(e) => e
            .errors
            .0
            .into_iter()
            .map(|c| (c.field, c.message))
            .collect(),
    }
}

/// `VALID` with `from` replaced by `to` (which must occur).
fn edit(from: &str, to: &str) -> String {
    assert!(VALID.contains(from), "{from}");
    VALID.replacen(from, to, 1)
}

#[test]
fn a_valid_document_loads_with_defaults_and_in_every_version() {
    let c = load::<AuthorizationConfiguration>(VALID.as_bytes()).unwrap();
    assert_eq!(c.authorizers.len(), 2);
    let w = c.authorizers[0].webhook.as_ref().unwrap();
    assert_eq!(w.timeout, Duration::from_secs(3));
    assert_eq!(w.authorized_ttl, Duration::from_secs(60));
    assert_eq!(w.match_conditions.len(), 2);
    for v in ["v1", "v1alpha1"] {
        let doc = edit("apiserver.svc.io/v1beta1", &format!("apiserver.svc.io/{v}"));
        assert!(errors_of(&doc).is_empty(), "{v}");
    }
    // Cache times left out take Kubernetes' defaults.
    let doc = edit("    authorizedTTL: 1m\n    unauthorizedTTL: 10s\n", "");
    let c = load::<AuthorizationConfiguration>(doc.as_bytes()).unwrap();
    let w = c.authorizers[0].webhook.as_ref().unwrap();
    assert_eq!(w.authorized_ttl, DEFAULT_AUTHORIZED_TTL);
    assert_eq!(w.unauthorized_ttl, DEFAULT_UNAUTHORIZED_TTL);
}

#[test]
fn each_broken_field_is_named() {
    let cases: Vec<(String, &str, &str)> = vec![
        (
            edit("timeout: 3s", "timeout: 31s"),
            "authorizers[0].webhook.timeout",
            "Invalid value: \"31s\": must be <= 30s",
        ),
        (
            edit("    timeout: 3s\n", ""),
            "authorizers[0].webhook.timeout",
            "Required value",
        ),
        (
            edit("timeout: 3s", "timeout: -1s"),
            "authorizers[0].webhook.timeout",
            "must be > 0s",
        ),
        (
            edit("unauthorizedTTL: 10s", "unauthorizedTTL: -10s"),
            "authorizers[0].webhook.unauthorizedTTL",
            "must be > 0",
        ),
        (
            edit("name: policy", "name: Policy_1"),
            "authorizers[0].name",
            "Invalid value: \"Policy_1\": a lowercase RFC 1123 label",
        ),
        (
            edit("name: deny-rest", "name: policy"),
            "authorizers[1].name",
            "Duplicate value: \"policy\"",
        ),
        (
            edit("  name: policy\n", ""),
            "authorizers[0].name",
            "Required value",
        ),
        (
            edit(
                "subjectAccessReviewVersion: v1\n",
                "subjectAccessReviewVersion: v2\n",
            ),
            "authorizers[0].webhook.subjectAccessReviewVersion",
            "Unsupported value: \"v2\": supported values: \"v1\", \"v1beta1\"",
        ),
        (
            edit(
                "matchConditionSubjectAccessReviewVersion: v1",
                "matchConditionSubjectAccessReviewVersion: v1beta1",
            ),
            "authorizers[0].webhook.matchConditionSubjectAccessReviewVersion",
            "Unsupported value: \"v1beta1\"",
        ),
        (
            edit(
                "- expression: has(request.resourceAttributes)",
                "- expression: size(request.groups) + 1",
            ),
            "authorizers[0].webhook.matchConditions[0].expression",
            "Invalid value: \"size(request.groups) + 1\": compilation failed: ERROR: <input>:1:1: \
             expression must evaluate to bool, got int",
        ),
        (
            edit(
                "- expression: has(request.resourceAttributes)",
                "- expression: request.user ==",
            ),
            "authorizers[0].webhook.matchConditions[0].expression",
            "compilation failed",
        ),
        (
            edit(
                "- expression: has(request.resourceAttributes)",
                "- expression: resource.name == 'x'",
            ),
            "authorizers[0].webhook.matchConditions[0].expression",
            "undeclared reference to 'resource'",
        ),
        (
            edit("failurePolicy: NoOpinion", "failurePolicy: Allow"),
            "authorizers[0].webhook.failurePolicy",
            "Unsupported value: \"Allow\"",
        ),
        (
            edit("type: SvcConfig", "type: InClusterConfig"),
            "authorizers[0].webhook.connectionInfo.type",
            "Unsupported value: \"InClusterConfig\"",
        ),
        (
            edit(
                "svcConfigFile: /etc/svc/authz-webhook.kubeconfig",
                "svcConfigFile: relative.kubeconfig",
            ),
            "authorizers[0].webhook.connectionInfo.svcConfigFile",
            "must be an absolute path",
        ),
        (
            edit(
                "- expression: has(request.resourceAttributes)",
                "- expression: ''",
            ),
            "authorizers[0].webhook.matchConditions[0].expression",
            "Required value",
        ),
        (
            edit(
                "- expression: request.user != \"system:admin\"",
                "- expression: has(request.resourceAttributes)",
            ),
            "authorizers[0].webhook.matchConditions[1].expression",
            "Duplicate value",
        ),
        (
            edit(
                "- type: AlwaysDeny\n  name: deny-rest\n",
                "- type: RBAC\n  name: rbac\n",
            ),
            "authorizers[1].type",
            "Unsupported value: \"RBAC\": not supported by this server",
        ),
        (
            edit("- type: AlwaysDeny", "- type: Magic"),
            "authorizers[1].type",
            "Unsupported value: \"Magic\"",
        ),
        (
            edit(
                "- type: AlwaysDeny\n  name: deny-rest\n",
                "- type: AlwaysDeny\n  name: a\n- type: AlwaysDeny\n  name: b\n",
            ),
            "authorizers[2].type",
            "Duplicate value: \"AlwaysDeny\"",
        ),
        (
            edit("- type: Webhook", "- type: AlwaysAllow"),
            "authorizers[0].webhook",
            "only allowed for type=Webhook",
        ),
        (
            "apiVersion: apiserver.svc.io/v1beta1\nkind: AuthorizationConfiguration\n\
             authorizers:\n- type: Webhook\n  name: w\n"
                .to_string(),
            "authorizers[0].webhook",
            "Required value: required when type=Webhook",
        ),
        (
            "apiVersion: apiserver.svc.io/v1beta1\nkind: AuthorizationConfiguration\n".to_string(),
            "authorizers",
            "Required value: at least one authorization mode must be defined",
        ),
        (
            "apiVersion: apiserver.svc.io/v1beta1\nkind: AuthorizationConfiguration\n\
             authorizers: []\n"
                .to_string(),
            "authorizers",
            "Required value",
        ),
        (
            edit(
                "    failurePolicy: NoOpinion\n",
                "    failurePolicy: NoOpinion\n    retries: 3\n",
            ),
            "authorizers[0].webhook.retries",
            "unknown field",
        ),
    ];
    for (doc, field, message) in cases {
        let errors = errors_of(&doc);
        assert!(
            errors
                .iter()
                .any(|(f, m)| f == field && m.contains(message)),
            "expected {field}: {message}, got {errors:?}\n{doc}"
        );
        assert_eq!(errors.len(), 1, "one error only: {errors:?}\n{doc}");
    }
}

#[test]
fn at_most_64_match_conditions() {
    let many = |n: usize| {
        let conditions: String = (0..n)
            .map(|i| format!("    - expression: request.user != \"u{i}\"\n"))
            .collect();
        edit(
            "    - expression: has(request.resourceAttributes)\n    - expression: request.user != \"system:admin\"\n",
            &conditions,
        )
    };
    assert!(errors_of(&many(64)).is_empty());
    let errors = errors_of(&many(65));
    assert_eq!(
        errors,
        [(
            "authorizers[0].webhook.matchConditions".to_string(),
            "Too many: 65: must have at most 64 items".to_string()
        )]
    );
}
