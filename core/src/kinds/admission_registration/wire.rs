//! The protobuf form of the webhook configurations: `k8s.io.api.admissionregistration.v1`
//! messages (tags from Kubernetes' `generated.proto`) and the conversions to and from ours.

use base64::Engine;
use prost::Message;

use super::{
    LabelSelectorRequirement, LabelSelectorSpec, MatchCondition, MutatingWebhook,
    RuleWithOperations, ServiceReference, ValidatingWebhook, WebhookClientConfig,
    WebhookConfiguration, WebhookType,
};
use crate::codec::convert::{object_meta_from_wire, object_meta_to_wire};
use crate::codec::wire::ObjectMeta;
use crate::codec::{ProtoKind, decode_error};
use crate::status::ApiError;

#[derive(Clone, PartialEq, prost::Message)]
struct LabelSelectorRequirementPb {
    #[prost(string, optional, tag = "1")]
    key: Option<String>,
    #[prost(string, optional, tag = "2")]
    operator: Option<String>,
    #[prost(string, repeated, tag = "3")]
    values: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LabelSelectorPb {
    #[prost(btree_map = "string, string", tag = "1")]
    match_labels: std::collections::BTreeMap<String, String>,
    #[prost(message, repeated, tag = "2")]
    match_expressions: Vec<LabelSelectorRequirementPb>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RulePb {
    #[prost(string, repeated, tag = "1")]
    api_groups: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    api_versions: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    resources: Vec<String>,
    #[prost(string, optional, tag = "4")]
    scope: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RuleWithOperationsPb {
    #[prost(string, repeated, tag = "1")]
    operations: Vec<String>,
    #[prost(message, optional, tag = "2")]
    rule: Option<RulePb>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ServiceReferencePb {
    #[prost(string, optional, tag = "1")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "2")]
    name: Option<String>,
    #[prost(string, optional, tag = "3")]
    path: Option<String>,
    #[prost(int32, optional, tag = "4")]
    port: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WebhookClientConfigPb {
    #[prost(message, optional, tag = "1")]
    service: Option<ServiceReferencePb>,
    #[prost(bytes = "vec", optional, tag = "2")]
    ca_bundle: Option<Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    url: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct MatchConditionPb {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    expression: Option<String>,
}

fn selector_to(s: &LabelSelectorSpec) -> LabelSelectorPb {
    LabelSelectorPb {
        match_labels: s.match_labels.clone(),
        match_expressions: s
            .match_expressions
            .iter()
            .map(|r| LabelSelectorRequirementPb {
                key: Some(r.key.clone()),
                operator: Some(r.operator.clone()),
                values: r.values.clone(),
            })
            .collect(),
    }
}

fn selector_from(s: LabelSelectorPb) -> LabelSelectorSpec {
    LabelSelectorSpec {
        match_labels: s.match_labels,
        match_expressions: s
            .match_expressions
            .into_iter()
            .map(|r| LabelSelectorRequirement {
                key: r.key.unwrap_or_default(),
                operator: r.operator.unwrap_or_default(),
                values: r.values,
            })
            .collect(),
    }
}

fn rule_to(r: &RuleWithOperations) -> RuleWithOperationsPb {
    RuleWithOperationsPb {
        operations: r.operations.clone(),
        rule: Some(RulePb {
            api_groups: r.api_groups.clone(),
            api_versions: r.api_versions.clone(),
            resources: r.resources.clone(),
            scope: r.scope.clone(),
        }),
    }
}

fn rule_from(r: RuleWithOperationsPb) -> RuleWithOperations {
    let rule = r.rule.unwrap_or_default();
    RuleWithOperations {
        operations: r.operations,
        api_groups: rule.api_groups,
        api_versions: rule.api_versions,
        resources: rule.resources,
        scope: rule.scope,
    }
}

fn client_to(c: &WebhookClientConfig) -> WebhookClientConfigPb {
    WebhookClientConfigPb {
        service: c.service.as_ref().map(|s| ServiceReferencePb {
            namespace: Some(s.namespace.clone()),
            name: Some(s.name.clone()),
            path: s.path.clone(),
            port: s.port,
        }),
        // Validation keeps the bundle base64; anything else was never stored.
        ca_bundle: c.ca_bundle.as_ref().map(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .unwrap_or_default()
        }),
        url: c.url.clone(),
    }
}

fn client_from(c: WebhookClientConfigPb) -> WebhookClientConfig {
    WebhookClientConfig {
        url: c.url,
        service: c.service.map(|s| ServiceReference {
            namespace: s.namespace.unwrap_or_default(),
            name: s.name.unwrap_or_default(),
            path: s.path,
            port: s.port,
        }),
        ca_bundle: c
            .ca_bundle
            .map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
    }
}

fn conditions_to(c: &[MatchCondition]) -> Vec<MatchConditionPb> {
    c.iter()
        .map(|c| MatchConditionPb {
            name: Some(c.name.clone()),
            expression: Some(c.expression.clone()),
        })
        .collect()
}

fn conditions_from(c: Vec<MatchConditionPb>) -> Vec<MatchCondition> {
    c.into_iter()
        .map(|c| MatchCondition {
            name: c.name.unwrap_or_default(),
            expression: c.expression.unwrap_or_default(),
        })
        .collect()
}

/// One webhook type's protobuf form, written once for both: its message (the fields both
/// types share, then `$extra`, the optional strings only this type has, then the two fields
/// whose tags follow them), its configuration's message, and the conversions.
macro_rules! webhook_wire {
    (
        $hook:ident, $hook_pb:ident, $config_pb:ident,
        extra { $($extra:ident = $extra_tag:tt),* },
        object_selector = $object_selector:tt,
        match_conditions = $match_conditions:tt $(,)?
    ) => {
        #[derive(Clone, PartialEq, prost::Message)]
        struct $hook_pb {
            #[prost(string, optional, tag = "1")]
            name: Option<String>,
            #[prost(message, optional, tag = "2")]
            client_config: Option<WebhookClientConfigPb>,
            #[prost(message, repeated, tag = "3")]
            rules: Vec<RuleWithOperationsPb>,
            #[prost(string, optional, tag = "4")]
            failure_policy: Option<String>,
            #[prost(message, optional, tag = "5")]
            namespace_selector: Option<LabelSelectorPb>,
            #[prost(string, optional, tag = "6")]
            side_effects: Option<String>,
            #[prost(int32, optional, tag = "7")]
            timeout_seconds: Option<i32>,
            #[prost(string, repeated, tag = "8")]
            admission_review_versions: Vec<String>,
            #[prost(string, optional, tag = "9")]
            match_policy: Option<String>,
            $(
                #[prost(string, optional, tag = $extra_tag)]
                $extra: Option<String>,
            )*
            #[prost(message, optional, tag = $object_selector)]
            object_selector: Option<LabelSelectorPb>,
            #[prost(message, repeated, tag = $match_conditions)]
            match_conditions: Vec<MatchConditionPb>,
        }

        #[derive(Clone, PartialEq, prost::Message)]
        struct $config_pb {
            #[prost(message, optional, tag = "1")]
            metadata: Option<ObjectMeta>,
            #[prost(message, repeated, tag = "2")]
            webhooks: Vec<$hook_pb>,
        }

        impl ProtoKind for WebhookConfiguration<$hook> {
            fn to_proto_bytes(&self) -> Vec<u8> {
                $config_pb {
                    metadata: Some(object_meta_to_wire(&self.metadata)),
                    webhooks: self
                        .webhooks
                        .iter()
                        .map(|w| $hook_pb {
                            name: Some(w.name.clone()),
                            client_config: Some(client_to(&w.client_config)),
                            rules: w.rules.iter().map(rule_to).collect(),
                            failure_policy: w.failure_policy.clone(),
                            namespace_selector: w.namespace_selector.as_ref().map(selector_to),
                            side_effects: w.side_effects.clone(),
                            timeout_seconds: w.timeout_seconds,
                            admission_review_versions: w.admission_review_versions.clone(),
                            match_policy: w.match_policy.clone(),
                            $($extra: w.$extra.clone(),)*
                            object_selector: w.object_selector.as_ref().map(selector_to),
                            match_conditions: conditions_to(&w.match_conditions),
                        })
                        .collect(),
                }
                .encode_to_vec()
            }

            fn from_proto_bytes(raw: &[u8]) -> Result<Self, ApiError> {
                let m = $config_pb::decode(raw)
                    .map_err(|e| decode_error(<$hook as WebhookType>::CONFIGURATION.kind, e))?;
                Ok(WebhookConfiguration {
                    api_version: String::new(),
                    kind: String::new(),
                    metadata: object_meta_from_wire(m.metadata.unwrap_or_default())?,
                    webhooks: m
                        .webhooks
                        .into_iter()
                        .map(|w| $hook {
                            name: w.name.unwrap_or_default(),
                            client_config: client_from(w.client_config.unwrap_or_default()),
                            rules: w.rules.into_iter().map(rule_from).collect(),
                            failure_policy: w.failure_policy,
                            match_policy: w.match_policy,
                            namespace_selector: w.namespace_selector.map(selector_from),
                            object_selector: w.object_selector.map(selector_from),
                            side_effects: w.side_effects,
                            timeout_seconds: w.timeout_seconds,
                            admission_review_versions: w.admission_review_versions,
                            $($extra: w.$extra,)*
                            match_conditions: conditions_from(w.match_conditions),
                        })
                        .collect(),
                })
            }
        }
    };
}

webhook_wire!(
    ValidatingWebhook,
    ValidatingWebhookPb,
    ValidatingWebhookConfigurationPb,
    extra {},
    object_selector = "10",
    match_conditions = "11",
);

webhook_wire!(
    MutatingWebhook,
    MutatingWebhookPb,
    MutatingWebhookConfigurationPb,
    extra { reinvocation_policy = "10" },
    object_selector = "11",
    match_conditions = "12",
);

#[cfg(test)]
mod tests {
    use super::super::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
    use super::*;

    #[test]
    fn protobuf_round_trips() {
        let json = serde_json::json!({
            "metadata": {"name": "w"},
            "webhooks": [{"name": "a.example.com", "clientConfig": {"url": "https://h/x",
                "caBundle": "AAEC"}, "rules": [{"operations": ["CREATE"], "apiGroups": [""],
                "apiVersions": ["v1"], "resources": ["namespaces"], "scope": "*"}],
                "failurePolicy": "Ignore", "sideEffects": "None", "timeoutSeconds": 3,
                "admissionReviewVersions": ["v1"], "reinvocationPolicy": "IfNeeded",
                "objectSelector": {"matchLabels": {"a": "b"}, "matchExpressions": [
                    {"key": "c", "operator": "In", "values": ["d"]}]},
                "matchConditions": [{"name": "n", "expression": "true"}]}],
        });
        let m: MutatingWebhookConfiguration = serde_json::from_value(json.clone()).unwrap();
        let back = MutatingWebhookConfiguration::from_proto_bytes(&m.to_proto_bytes()).unwrap();
        assert_eq!(back, m);
        let mut v = json;
        v["webhooks"][0]
            .as_object_mut()
            .unwrap()
            .remove("reinvocationPolicy");
        let m: ValidatingWebhookConfiguration = serde_json::from_value(v).unwrap();
        let back = ValidatingWebhookConfiguration::from_proto_bytes(&m.to_proto_bytes()).unwrap();
        assert_eq!(back, m);
    }

    /// Every field of both webhook types at its tag of Kubernetes' `generated.proto`: the
    /// mutating webhook's `reinvocationPolicy` is 10, its `objectSelector` and
    /// `matchConditions` one later than the validating webhook's.
    #[test]
    fn protobuf_bytes_are_kubernetes_tags() {
        let json = serde_json::json!({
            "metadata": {"name": "w"},
            "webhooks": [{"name": "a", "clientConfig": {"url": "u", "caBundle": "AAEC",
                "service": {"namespace": "n", "name": "s", "path": "/p", "port": 1}},
                "rules": [{"operations": ["CREATE"], "apiGroups": ["g"], "apiVersions": ["v"],
                "resources": ["r"], "scope": "*"}], "failurePolicy": "F", "matchPolicy": "M",
                "namespaceSelector": {"matchLabels": {"k": "v"}}, "sideEffects": "S",
                "timeoutSeconds": 3, "admissionReviewVersions": ["v1"],
                "reinvocationPolicy": "R", "objectSelector": {"matchExpressions": [
                    {"key": "c", "operator": "In", "values": ["d"]}]},
                "matchConditions": [{"name": "n", "expression": "e"}]}],
        });
        let hex = |b: Vec<u8>| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let m: MutatingWebhookConfiguration = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(
            hex(m.to_proto_bytes()),
            "0a030a017712650a016112160a0c0a016e1201731a022f70200112030001021a01751a160a06435245415445120c0a01671201761a017222012a2201462a080a060a016b1201763201533803420276314a014d5201525a0c120a0a01631202496e1a016462060a016e120165"
        );
        let mut v = json;
        v["webhooks"][0]
            .as_object_mut()
            .unwrap()
            .remove("reinvocationPolicy");
        let m: ValidatingWebhookConfiguration = serde_json::from_value(v).unwrap();
        assert_eq!(
            hex(m.to_proto_bytes()),
            "0a030a017712620a016112160a0c0a016e1201731a022f70200112030001021a01751a160a06435245415445120c0a01671201761a017222012a2201462a080a060a016b1201763201533803420276314a014d520c120a0a01631202496e1a01645a060a016e120165"
        );
    }
}
