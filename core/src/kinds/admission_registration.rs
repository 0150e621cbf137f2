//! `ValidatingWebhookConfiguration` and `MutatingWebhookConfiguration`
//! (`admissionregistration.svc.io/v1`, cluster-scoped): which admission webhooks the server
//! calls, for which requests, and how. Validation (in `admission_registration/validation.rs`)
//! follows Kubernetes' `pkg/apis/admissionregistration/validation` for v1; the protobuf form
//! is in `admission_registration/wire.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::meta::ObjectMeta;
use crate::patch::strategy::Strategy;
use crate::resource::{Resource, ResourceInfo, STANDARD_VERBS, Scope};
use crate::validation::declarative::{Check, Format, Rule};
use crate::validation::{ErrorList, NameRule};

mod validation;
mod wire;

pub use validation::{MAX_MATCH_CONDITIONS, validate_label_selector};

pub const GROUP: &str = "admissionregistration.svc.io";
pub const FAILURE_POLICY_FAIL: &str = "Fail";
pub const FAILURE_POLICY_IGNORE: &str = "Ignore";
pub const SIDE_EFFECTS_NONE: &str = "None";
pub const SIDE_EFFECTS_NONE_ON_DRY_RUN: &str = "NoneOnDryRun";
pub const REINVOCATION_NEVER: &str = "Never";
pub const REINVOCATION_IF_NEEDED: &str = "IfNeeded";
/// `timeoutSeconds` when none is given, and its bounds.
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 10;
pub const MIN_TIMEOUT_SECONDS: i32 = 1;
pub const MAX_TIMEOUT_SECONDS: i32 = 30;

/// A `metav1.LabelSelector` as API objects write it (`matchLabels`, `matchExpressions`); the
/// empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl LabelSelectorSpec {
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Whether `labels` satisfy every term (a selector that failed validation, with an
    /// unknown operator, matches nothing).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let v = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => v.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => v.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => v.is_some(),
                    "DoesNotExist" => v.is_none(),
                    _ => false,
                }
            })
    }
}

/// Operations, API groups, versions and resources a webhook cares about.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleWithOperations {
    /// `CREATE`, `UPDATE`, `DELETE`, `CONNECT` or `*`.
    #[serde(default)]
    pub operations: Vec<String>,
    #[serde(default)]
    pub api_groups: Vec<String>,
    #[serde(default)]
    pub api_versions: Vec<String>,
    /// `pods`, `pods/status`, `*/status`, `pods/*`, `*`, `*/*`.
    #[serde(default)]
    pub resources: Vec<String>,
    /// `Cluster`, `Namespaced` or `*` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// How to reach a webhook: a URL (`https://`), or a Service reference, which this server
/// refuses (it serves no Services).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookClientConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceReference>,
    /// PEM certificates (base64 in JSON, as Go writes `[]byte`) that verify the webhook's
    /// serving certificate; the system roots when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceReference {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// A CEL condition a request must meet to be sent to the webhook.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MatchCondition {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub expression: String,
}

/// The CEL environment of `matchConditions`: `object`, `oldObject` and `request` (the
/// AdmissionRequest without its objects). Kubernetes' `authorizer` variable is not offered:
/// an expression using it does not compile.
pub fn match_condition_env() -> svc_cel::Env {
    use svc_cel::{Env, Type};
    Env::new()
        .var("object", Type::Dyn)
        .var("oldObject", Type::Dyn)
        .var("request", Type::Dyn)
}

/// Compiles a match condition, which must produce a bool.
pub fn compile_match_condition(
    expression: &str,
) -> Result<svc_cel::Program, svc_cel::CompileError> {
    let program = svc_cel::compile(expression, &match_condition_env())?;
    program.expect(&[svc_cel::Type::Bool])?;
    Ok(program)
}

/// The fields both webhook types share, declared once for each struct (so that each accepts
/// exactly its own fields when decoded strictly).
macro_rules! webhook_struct {
    ($(#[$doc:meta])* $name:ident { $($extra:tt)* }) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
        #[serde(rename_all = "camelCase")]
        pub struct $name {
            /// Fully qualified (`label.example.com`): at least three dot-separated segments.
            #[serde(default)]
            pub name: String,
            #[serde(default)]
            pub client_config: WebhookClientConfig,
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub rules: Vec<RuleWithOperations>,
            /// `Fail` (the default) or `Ignore`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub failure_policy: Option<String>,
            /// `Equivalent` (the default) or `Exact`; this server serves each resource in one
            /// version, so both match the same requests.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub match_policy: Option<String>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub namespace_selector: Option<LabelSelectorSpec>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub object_selector: Option<LabelSelectorSpec>,
            /// Required: `None` or `NoneOnDryRun` (`Some` and `Unknown` come only from older
            /// versions; a dry run that reaches such a webhook is refused).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub side_effects: Option<String>,
            /// 1 to 30; 10 by default.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub timeout_seconds: Option<i32>,
            /// Must include `v1`, the only AdmissionReview version this server sends.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub admission_review_versions: Vec<String>,
            $($extra)*
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub match_conditions: Vec<MatchCondition>,
        }
    };
}

webhook_struct!(
    /// One validating webhook: it may allow or deny, never change the object.
    ValidatingWebhook {}
);

webhook_struct!(
    /// One mutating webhook: it may answer with a JSON Patch.
    MutatingWebhook {
        /// `Never` (the default) or `IfNeeded`: called again once if a later mutating
        /// webhook changed the object.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub reinvocation_policy: Option<String>,
    }
);

/// The view of a webhook that matching and calling need, whichever its type.
pub trait Webhook {
    fn name(&self) -> &str;
    fn client_config(&self) -> &WebhookClientConfig;
    fn rules(&self) -> &[RuleWithOperations];
    fn failure_policy(&self) -> Option<&str>;
    fn namespace_selector(&self) -> Option<&LabelSelectorSpec>;
    fn object_selector(&self) -> Option<&LabelSelectorSpec>;
    fn side_effects(&self) -> Option<&str>;
    fn timeout_seconds(&self) -> Option<i32>;
    fn match_conditions(&self) -> &[MatchCondition];
    /// Set only on mutating webhooks.
    fn reinvocation_policy(&self) -> Option<&str> {
        None
    }
    fn admission_review_versions(&self) -> &[String];
    fn match_policy(&self) -> Option<&str>;
    fn apply_defaults(&mut self);
}

/// The accessors and Kubernetes' v1 defaults (`Fail`, `Equivalent`, empty selectors, 10
/// seconds, scope `*`) of both webhook types, written once; the optional string fields only
/// one type has come as `field = default`, each with its accessor.
macro_rules! webhook_view {
    ($($own:ident = $own_default:expr),* $(,)?) => {
        fn name(&self) -> &str {
            &self.name
        }
        fn client_config(&self) -> &WebhookClientConfig {
            &self.client_config
        }
        fn rules(&self) -> &[RuleWithOperations] {
            &self.rules
        }
        fn failure_policy(&self) -> Option<&str> {
            self.failure_policy.as_deref()
        }
        fn namespace_selector(&self) -> Option<&LabelSelectorSpec> {
            self.namespace_selector.as_ref()
        }
        fn object_selector(&self) -> Option<&LabelSelectorSpec> {
            self.object_selector.as_ref()
        }
        fn side_effects(&self) -> Option<&str> {
            self.side_effects.as_deref()
        }
        fn timeout_seconds(&self) -> Option<i32> {
            self.timeout_seconds
        }
        fn match_conditions(&self) -> &[MatchCondition] {
            &self.match_conditions
        }
        fn admission_review_versions(&self) -> &[String] {
            &self.admission_review_versions
        }
        fn match_policy(&self) -> Option<&str> {
            self.match_policy.as_deref()
        }
        $(
            fn $own(&self) -> Option<&str> {
                self.$own.as_deref()
            }
        )*
        fn apply_defaults(&mut self) {
            self.failure_policy
                .get_or_insert_with(|| FAILURE_POLICY_FAIL.into());
            self.match_policy.get_or_insert_with(|| "Equivalent".into());
            self.namespace_selector
                .get_or_insert_with(LabelSelectorSpec::default);
            self.object_selector
                .get_or_insert_with(LabelSelectorSpec::default);
            self.timeout_seconds.get_or_insert(DEFAULT_TIMEOUT_SECONDS);
            for r in &mut self.rules {
                r.scope.get_or_insert_with(|| "*".into());
            }
            $(
                self.$own.get_or_insert_with(|| $own_default.into());
            )*
        }
    };
}

impl Webhook for ValidatingWebhook {
    webhook_view!();
}

impl Webhook for MutatingWebhook {
    webhook_view!(reinvocation_policy = REINVOCATION_NEVER);
}

/// What sets the two webhook types apart beyond their fields, as data: the configuration kind
/// that holds them, and whether they may change the object.
pub trait WebhookType:
    Webhook
    + Clone
    + std::fmt::Debug
    + Default
    + PartialEq
    + Serialize
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    const CONFIGURATION: &'static ResourceInfo;
    const MUTATING: bool;
}

impl WebhookType for ValidatingWebhook {
    const CONFIGURATION: &'static ResourceInfo = &VALIDATING_INFO;
    const MUTATING: bool = false;
}

impl WebhookType for MutatingWebhook {
    const CONFIGURATION: &'static ResourceInfo = &MUTATING_INFO;
    const MUTATING: bool = true;
}

/// A webhook configuration: `ValidatingWebhookConfiguration` or
/// `MutatingWebhookConfiguration`, by the type of its webhooks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookConfiguration<W> {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default = "Vec::new", skip_serializing_if = "Vec::is_empty")]
    pub webhooks: Vec<W>,
}

pub type ValidatingWebhookConfiguration = WebhookConfiguration<ValidatingWebhook>;
pub type MutatingWebhookConfiguration = WebhookConfiguration<MutatingWebhook>;

static VALIDATING_INFO: ResourceInfo = ResourceInfo {
    group: GROUP,
    version: "v1",
    kind: "ValidatingWebhookConfiguration",
    list_kind: "ValidatingWebhookConfigurationList",
    plural: "validatingwebhookconfigurations",
    singular: "validatingwebhookconfiguration",
    short_names: &[],
    scope: Scope::Cluster,
    verbs: STANDARD_VERBS,
    name_rule: NameRule::Dns1123Subdomain,
    extra_fields: &[],
    allow_create_on_update: false,
    delete_returns_object: false,
    merge_strategies: MERGE_STRATEGIES,
    columns: &[],
    schema: webhook_schema::<ValidatingWebhook>,
    subresources: &[],
    stored: true,
    expires: false,
};

static MUTATING_INFO: ResourceInfo = ResourceInfo {
    group: GROUP,
    version: "v1",
    kind: "MutatingWebhookConfiguration",
    list_kind: "MutatingWebhookConfigurationList",
    plural: "mutatingwebhookconfigurations",
    singular: "mutatingwebhookconfiguration",
    short_names: &[],
    scope: Scope::Cluster,
    verbs: STANDARD_VERBS,
    name_rule: NameRule::Dns1123Subdomain,
    extra_fields: &[],
    allow_create_on_update: false,
    delete_returns_object: false,
    merge_strategies: MERGE_STRATEGIES,
    columns: &[],
    schema: webhook_schema::<MutatingWebhook>,
    subresources: &[],
    stored: true,
    expires: false,
};

const MERGE_STRATEGIES: &[(&str, Strategy)] = &[
    ("webhooks", Strategy::Keyed("name")),
    ("webhooks.rules", Strategy::Atomic),
    ("webhooks.admissionReviewVersions", Strategy::Atomic),
    ("webhooks.matchConditions", Strategy::Keyed("name")),
];

fn webhook_schema<W: WebhookType>() -> Value {
    let string = json!({"type": "string"});
    let strings = json!({"type": "array", "items": {"type": "string"}});
    let selector = json!({"type": "object", "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {"type": "object", "properties": {
            "key": string, "operator": string, "values": strings}}}}});
    let mut webhook = json!({
        "name": string,
        "clientConfig": {"type": "object", "properties": {
            "url": string,
            "caBundle": {"type": "string", "format": "byte"},
            "service": {"type": "object", "properties": {
                "namespace": string, "name": string, "path": string,
                "port": {"type": "integer", "format": "int32"}}}}},
        "rules": {"type": "array", "x-kubernetes-list-type": "atomic", "items": {
            "type": "object", "properties": {
                "operations": strings, "apiGroups": strings, "apiVersions": strings,
                "resources": strings, "scope": string}}},
        "failurePolicy": string,
        "matchPolicy": string,
        "namespaceSelector": selector,
        "objectSelector": selector,
        "sideEffects": string,
        "timeoutSeconds": {"type": "integer", "format": "int32"},
        "admissionReviewVersions": strings,
        "matchConditions": {"type": "array", "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"], "items": {"type": "object", "properties": {
                "name": string, "expression": string}}},
    });
    if W::MUTATING
        && let Some(webhook) = webhook.as_object_mut()
    {
        webhook.insert("reinvocationPolicy".into(), string);
    }
    json!({
        "webhooks": {"type": "array", "x-kubernetes-patch-merge-key": "name",
            "x-kubernetes-patch-strategy": "merge",
            "items": {"type": "object", "properties": webhook}},
    })
}

static RULES: [Rule; 3] = [
    Rule::new(
        "metadata.name",
        Check::Required("name or generateName is required"),
    ),
    Rule::new("metadata.name", Check::Format(Format::Dns1123Subdomain)),
    Rule::new("metadata.name", Check::Immutable),
];

/// As Kubernetes' strategy for both configurations: generation 1 on create, one more on each
/// update that changes the webhooks (the generic update has kept the stored one).
fn next_generation(meta: &mut crate::meta::ObjectMeta, old: Option<i64>, changed: bool) {
    if changed {
        meta.generation = Some(old.unwrap_or(0).saturating_add(1));
    }
}

impl<W: WebhookType> Resource for WebhookConfiguration<W> {
    const INFO: &'static ResourceInfo = W::CONFIGURATION;

    crate::resource::object_accessors!();

    fn declarative_rules() -> &'static [Rule] {
        &RULES
    }

    fn prepare_for_create(&mut self) {
        self.webhooks.iter_mut().for_each(Webhook::apply_defaults);
        self.metadata.generation = Some(1);
    }

    fn prepare_for_update(&mut self, old: &Self) {
        self.webhooks.iter_mut().for_each(Webhook::apply_defaults);
        next_generation(
            &mut self.metadata,
            old.metadata.generation,
            self.webhooks != old.webhooks,
        );
    }

    fn validate(&self) -> ErrorList {
        validation::validate_webhooks(&self.webhooks, W::MUTATING)
    }
}
