//! The scheduler's plugin argument kinds (`svcscheduler.config.svc.io/v1`): each is a kind of
//! its own (a document may be one) and the `args` of a profile's `pluginConfig` entry, with
//! kube-scheduler's v1 defaults and `validation_pluginargs.go` rules.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::API_VERSION;
use crate::component::{invalid, null_as_default, prefixed};
use crate::{ConfigKind, Path, decode_strict};
use svc_core::validation::{ErrorList, qualified_name};

/// In-tree plugins that take arguments, and their argument kinds.
pub const PLUGIN_ARGS: &[(&str, &str)] = &[
    ("DefaultPreemption", DefaultPreemptionArgs::KIND),
    ("InterPodAffinity", InterPodAffinityArgs::KIND),
    ("NodeAffinity", NodeAffinityArgs::KIND),
    (
        "NodeResourcesBalancedAllocation",
        NodeResourcesBalancedAllocationArgs::KIND,
    ),
    ("NodeResourcesFit", NodeResourcesFitArgs::KIND),
    ("PodTopologySpread", PodTopologySpreadArgs::KIND),
    ("VolumeBinding", VolumeBindingArgs::KIND),
];

/// The argument kind of plugin `name`, if it takes arguments.
pub fn kind_for_plugin(name: &str) -> Option<&'static str> {
    PLUGIN_ARGS
        .iter()
        .find(|(plugin, _)| *plugin == name)
        .map(|(_, kind)| *kind)
}

/// Decodes `raw` as argument kind `kind` (its type meta optional), applies the defaults, and
/// returns it with its type meta; errors are placed under `path`.
pub fn defaulted(kind: &str, raw: Value, path: &Path) -> Result<Value, ErrorList> {
    match kind {
        DefaultPreemptionArgs::KIND => defaulted_as::<DefaultPreemptionArgs>(raw, path),
        InterPodAffinityArgs::KIND => defaulted_as::<InterPodAffinityArgs>(raw, path),
        NodeAffinityArgs::KIND => defaulted_as::<NodeAffinityArgs>(raw, path),
        NodeResourcesBalancedAllocationArgs::KIND => {
            defaulted_as::<NodeResourcesBalancedAllocationArgs>(raw, path)
        }
        NodeResourcesFitArgs::KIND => defaulted_as::<NodeResourcesFitArgs>(raw, path),
        PodTopologySpreadArgs::KIND => defaulted_as::<PodTopologySpreadArgs>(raw, path),
        VolumeBindingArgs::KIND => defaulted_as::<VolumeBindingArgs>(raw, path),
        other => {
            let mut errors = ErrorList::default();
            errors.invalid(path.as_str(), other, "not a plugin argument kind");
            Err(errors)
        }
    }
}

/// The rule violations of `value` as argument kind `kind`, under `path`; `Err` when it does
/// not decode.
pub fn validate_value(kind: &str, value: Value, path: &Path) -> Result<ErrorList, ErrorList> {
    fn check<T: ConfigKind>(value: Value, path: &Path) -> Result<ErrorList, ErrorList> {
        let args: T = decode_args(value, path)?;
        Ok(prefixed(args.validate(), path))
    }
    match kind {
        DefaultPreemptionArgs::KIND => check::<DefaultPreemptionArgs>(value, path),
        InterPodAffinityArgs::KIND => check::<InterPodAffinityArgs>(value, path),
        NodeAffinityArgs::KIND => check::<NodeAffinityArgs>(value, path),
        NodeResourcesBalancedAllocationArgs::KIND => {
            check::<NodeResourcesBalancedAllocationArgs>(value, path)
        }
        NodeResourcesFitArgs::KIND => check::<NodeResourcesFitArgs>(value, path),
        PodTopologySpreadArgs::KIND => check::<PodTopologySpreadArgs>(value, path),
        VolumeBindingArgs::KIND => check::<VolumeBindingArgs>(value, path),
        _ => Ok(ErrorList::default()),
    }
}

fn defaulted_as<T: ConfigKind>(raw: Value, path: &Path) -> Result<Value, ErrorList> {
    let mut args: T = decode_args(raw, path)?;
    args.apply_defaults();
    let mut value = serde_json::to_value(&args).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.insert("apiVersion".into(), API_VERSION.into());
        map.insert("kind".into(), T::KIND.into());
    }
    Ok(value)
}

/// Strict decoding of plugin arguments, where `apiVersion` and `kind` may be omitted but must
/// name `T` when written.
fn decode_args<T: ConfigKind>(mut raw: Value, path: &Path) -> Result<T, ErrorList> {
    let mut errors = ErrorList::default();
    if let Value::Object(map) = &mut raw {
        if let Some(v) = map.remove("apiVersion") {
            let v = v.as_str().unwrap_or_default().to_string();
            if v != API_VERSION {
                errors.not_supported(path.child("apiVersion").as_str(), &v, &[API_VERSION]);
            }
        }
        if let Some(k) = map.remove("kind") {
            let k = k.as_str().unwrap_or_default().to_string();
            if k != T::KIND {
                errors.invalid(
                    path.child("kind").as_str(),
                    &k,
                    &format!("has to match plugin args {}", T::KIND),
                );
            }
        }
    }
    let decoded = decode_strict::<T>(raw).map_err(|e| prefixed(e, path));
    match decoded {
        Ok(v) if errors.is_empty() => Ok(v),
        Ok(_) => Err(errors),
        Err(e) => {
            errors.extend(e);
            Err(errors)
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DefaultPreemptionArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_candidate_nodes_percentage: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_candidate_nodes_absolute: Option<i32>,
}

impl ConfigKind for DefaultPreemptionArgs {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = "DefaultPreemptionArgs";

    fn validate(&self) -> ErrorList {
        let mut e = ErrorList::default();
        let pct = self.min_candidate_nodes_percentage.unwrap_or(10);
        let abs = self.min_candidate_nodes_absolute.unwrap_or(100);
        let pct_path = Path::root("minCandidateNodesPercentage");
        let abs_path = Path::root("minCandidateNodesAbsolute");
        if !(0..=100).contains(&pct) {
            invalid(&mut e, &pct_path, pct, "not in valid range [0, 100]");
        }
        if abs < 0 {
            invalid(&mut e, &abs_path, abs, "not in valid range [0, inf)");
        }
        if pct == 0 && abs == 0 {
            let both = |other: &Path| format!("cannot be zero at the same time as {other}");
            invalid(&mut e, &pct_path, pct, &both(&abs_path));
            invalid(&mut e, &abs_path, abs, &both(&pct_path));
        }
        e
    }

    fn apply_defaults(&mut self) {
        self.min_candidate_nodes_percentage.get_or_insert(10);
        self.min_candidate_nodes_absolute.get_or_insert(100);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterPodAffinityArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_pod_affinity_weight: Option<i32>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub ignore_preferred_terms_of_existing_pods: bool,
}

impl ConfigKind for InterPodAffinityArgs {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = "InterPodAffinityArgs";

    fn validate(&self) -> ErrorList {
        let mut e = ErrorList::default();
        if let Some(w) = self
            .hard_pod_affinity_weight
            .filter(|w| !(0..=100).contains(w))
        {
            invalid(
                &mut e,
                &Path::root("hardPodAffinityWeight"),
                w,
                "not in valid range [0, 100]",
            );
        }
        e
    }

    fn apply_defaults(&mut self) {
        self.hard_pod_affinity_weight.get_or_insert(1);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAffinityArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_affinity: Option<NodeAffinity>,
}

/// The core `NodeAffinity` of a pod spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeAffinity {
    #[serde(
        default,
        rename = "requiredDuringSchedulingIgnoredDuringExecution",
        skip_serializing_if = "Option::is_none"
    )]
    pub required: Option<NodeSelector>,
    #[serde(
        default,
        rename = "preferredDuringSchedulingIgnoredDuringExecution",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub preferred: Vec<PreferredSchedulingTerm>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelector {
    #[serde(default, deserialize_with = "null_as_default")]
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorTerm {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub match_expressions: Vec<NodeSelectorRequirement>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub match_fields: Vec<NodeSelectorRequirement>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSelectorRequirement {
    #[serde(default, deserialize_with = "null_as_default")]
    pub key: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub operator: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PreferredSchedulingTerm {
    #[serde(default, deserialize_with = "null_as_default")]
    pub weight: i32,
    #[serde(default, deserialize_with = "null_as_default")]
    pub preference: NodeSelectorTerm,
}

const OPERATORS: &[&str] = &["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"];

/// kube-scheduler's `nodeaffinity.NewNodeSelector` checks of one term.
fn validate_term(term: &NodeSelectorTerm, path: &Path, e: &mut ErrorList) {
    for (i, req) in term.match_expressions.iter().enumerate() {
        let p = path.child("matchExpressions").index(i);
        if let Err(msg) = qualified_name(&req.key) {
            invalid(e, &p.child("key"), &req.key, &msg);
        }
        let values = p.child("values");
        match req.operator.as_str() {
            "In" | "NotIn" if req.values.is_empty() => e.required(
                values.as_str(),
                "must be specified when `operator` is 'In' or 'NotIn'",
            ),
            "Exists" | "DoesNotExist" if !req.values.is_empty() => e.forbidden(
                values.as_str(),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            ),
            "Gt" | "Lt" => {
                if req.values.len() != 1 {
                    e.required(
                        values.as_str(),
                        "must be specified single value when `operator` is 'Lt' or 'Gt'",
                    );
                } else if let Some(value) = req.values.first()
                    && value.parse::<i64>().is_err()
                {
                    invalid(
                        e,
                        &values.index(0),
                        value,
                        "must be an integer when `operator` is 'Lt' or 'Gt'",
                    );
                }
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => e.not_supported(p.child("operator").as_str(), other, OPERATORS),
        }
    }
    for (i, req) in term.match_fields.iter().enumerate() {
        let p = path.child("matchFields").index(i);
        if req.key != "metadata.name" {
            e.not_supported(p.child("key").as_str(), &req.key, &["metadata.name"]);
        }
        if !matches!(req.operator.as_str(), "In" | "NotIn") {
            e.not_supported(
                p.child("operator").as_str(),
                &req.operator,
                &["In", "NotIn"],
            );
        }
        if req.values.len() != 1 {
            e.required(
                p.child("values").as_str(),
                "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
            );
        }
    }
}

impl ConfigKind for NodeAffinityArgs {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = "NodeAffinityArgs";

    fn validate(&self) -> ErrorList {
        let mut e = ErrorList::default();
        let Some(affinity) = &self.added_affinity else {
            return e;
        };
        let base = Path::root("addedAffinity");
        if let Some(required) = &affinity.required {
            let p = base
                .child("requiredDuringSchedulingIgnoredDuringExecution")
                .child("nodeSelectorTerms");
            for (i, term) in required.node_selector_terms.iter().enumerate() {
                validate_term(term, &p.index(i), &mut e);
            }
        }
        let p = base.child("preferredDuringSchedulingIgnoredDuringExecution");
        for (i, term) in affinity.preferred.iter().enumerate() {
            if !(1..=100).contains(&term.weight) {
                invalid(
                    &mut e,
                    &p.index(i).child("weight"),
                    term.weight,
                    "must be in the range 1-100",
                );
            }
            validate_term(&term.preference, &p.index(i).child("preference"), &mut e);
        }
        e
    }
}

/// A resource and its weight in scoring.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub weight: i64,
}

fn default_resources() -> Vec<ResourceSpec> {
    ["cpu", "memory"]
        .into_iter()
        .map(|name| ResourceSpec {
            name: name.into(),
            weight: 1,
        })
        .collect()
}

fn default_weights(resources: &mut Vec<ResourceSpec>) {
    if resources.is_empty() {
        *resources = default_resources();
    }
    for r in resources.iter_mut().filter(|r| r.weight == 0) {
        r.weight = 1;
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeResourcesBalancedAllocationArgs {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub resources: Vec<ResourceSpec>,
}

impl ConfigKind for NodeResourcesBalancedAllocationArgs {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = "NodeResourcesBalancedAllocationArgs";

    fn validate(&self) -> ErrorList {
        let mut e = ErrorList::default();
        let mut seen = BTreeSet::new();
        for (i, r) in self.resources.iter().enumerate() {
            let p = Path::root("resources").index(i);
            if !seen.insert(r.name.as_str()) {
                e.duplicate(p.child("name").as_str(), &r.name);
            }
            // An unset weight is defaulted to 1.
            if r.weight != 1 && r.weight != 0 {
                invalid(&mut e, &p.child("weight"), r.weight, "must be 1");
            }
        }
        e
    }

    fn apply_defaults(&mut self) {
        default_weights(&mut self.resources);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeResourcesFitArgs {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ignored_resources: Vec<String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ignored_resource_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scoring_strategy: Option<ScoringStrategy>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScoringStrategy {
    #[serde(default, deserialize_with = "null_as_default", rename = "type")]
    pub kind: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub resources: Vec<ResourceSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_to_capacity_ratio: Option<RequestedToCapacityRatioParam>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestedToCapacityRatioParam {
    #[serde(default, deserialize_with = "null_as_default")]
    pub shape: Vec<UtilizationShapePoint>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UtilizationShapePoint {
    #[serde(default, deserialize_with = "null_as_default")]
    pub utilization: i32,
    #[serde(default, deserialize_with = "null_as_default")]
    pub score: i32,
}

const SCORING_STRATEGIES: &[&str] = &[
    "LeastAllocated",
    "MostAllocated",
    "RequestedToCapacityRatio",
];
/// Kubernetes' `MaxCustomPriorityScore`.
const MAX_SHAPE_SCORE: i32 = 10;

fn validate_shape(shape: &[UtilizationShapePoint], path: &Path, e: &mut ErrorList) {
    if shape.is_empty() {
        e.required(path.as_str(), "at least one point must be specified");
        return;
    }
    let unsorted = (1usize..)
        .zip(shape.windows(2))
        .find_map(|(i, pair)| match pair {
            [before, point] if before.utilization >= point.utilization => Some((i, point)),
            _ => None,
        });
    if let Some((i, point)) = unsorted {
        invalid(
            e,
            &path.index(i).child("utilization"),
            point.utilization,
            "utilization values must be sorted in increasing order",
        );
    }
    for (i, point) in shape.iter().enumerate() {
        if !(0..=100).contains(&point.utilization) {
            invalid(
                e,
                &path.index(i).child("utilization"),
                point.utilization,
                "not in valid range [0, 100]",
            );
        }
        if !(0..=MAX_SHAPE_SCORE).contains(&point.score) {
            invalid(
                e,
                &path.index(i).child("score"),
                point.score,
                &format!("not in valid range [0, {MAX_SHAPE_SCORE}]"),
            );
        }
    }
}

/// `ValidateLabelName`: a qualified name.
fn label_name(e: &mut ErrorList, path: &Path, name: &str) {
    if let Err(msg) = qualified_name(name) {
        invalid(e, path, name, &msg);
    }
}

impl ConfigKind for NodeResourcesFitArgs {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = "NodeResourcesFitArgs";

    fn validate(&self) -> ErrorList {
        let mut e = ErrorList::default();
        for (i, r) in self.ignored_resources.iter().enumerate() {
            label_name(&mut e, &Path::root("ignoredResources").index(i), r);
        }
        for (i, g) in self.ignored_resource_groups.iter().enumerate() {
            let p = Path::root("ignoredResourceGroups").index(i);
            if g.contains('/') {
                invalid(&mut e, &p, g, "resource group name can't contain '/'");
            }
            label_name(&mut e, &p, g);
        }
        if let Some(s) = &self.scoring_strategy {
            let p = Path::root("scoringStrategy");
            if !SCORING_STRATEGIES.contains(&s.kind.as_str()) {
                e.not_supported(p.child("type").as_str(), &s.kind, SCORING_STRATEGIES);
            }
            for (i, r) in s.resources.iter().enumerate() {
                // An unset weight is defaulted to 1.
                if r.weight != 0 && !(1..=100).contains(&r.weight) {
                    invalid(
                        &mut e,
                        &p.child("resources").index(i).child("weight"),
                        r.weight,
                        &format!("resource weight of {} not in valid range (0, 100]", r.name),
                    );
                }
            }
            let ratio = p.child("requestedToCapacityRatio");
            match &s.requested_to_capacity_ratio {
                Some(r) => validate_shape(&r.shape, &ratio.child("shape"), &mut e),
                None if s.kind == "RequestedToCapacityRatio" => e.required(
                    ratio.as_str(),
                    "must be set when type is RequestedToCapacityRatio",
                ),
                None => {}
            }
        }
        e
    }

    fn apply_defaults(&mut self) {
        let s = self
            .scoring_strategy
            .get_or_insert_with(|| ScoringStrategy {
                kind: "LeastAllocated".into(),
                ..Default::default()
            });
        default_weights(&mut s.resources);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodTopologySpreadArgs {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub default_constraints: Vec<TopologySpreadConstraint>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub defaulting_type: String,
}

/// The core `TopologySpreadConstraint` of a pod spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologySpreadConstraint {
    #[serde(default, deserialize_with = "null_as_default")]
    pub max_skew: i32,
    #[serde(default, deserialize_with = "null_as_default")]
    pub topology_key: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub when_unsatisfiable: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_domains: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_taints_policy: Option<String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub match_label_keys: Vec<String>,
}

const DEFAULTING_TYPES: &[&str] = &["System", "List"];
const WHEN_UNSATISFIABLE: &[&str] = &["DoNotSchedule", "ScheduleAnyway"];

impl ConfigKind for PodTopologySpreadArgs {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = "PodTopologySpreadArgs";

    fn validate(&self) -> ErrorList {
        let mut e = ErrorList::default();
        let defaulting = if self.defaulting_type.is_empty() {
            "System"
        } else {
            self.defaulting_type.as_str()
        };
        let dt = Path::root("defaultingType");
        if !DEFAULTING_TYPES.contains(&defaulting) {
            e.not_supported(dt.as_str(), defaulting, DEFAULTING_TYPES);
        } else if defaulting == "System" && !self.default_constraints.is_empty() {
            invalid(
                &mut e,
                &dt,
                defaulting,
                "when .defaultConstraints are not empty",
            );
        }
        let base = Path::root("defaultConstraints");
        for (i, c) in self.default_constraints.iter().enumerate() {
            let p = base.index(i);
            if c.max_skew <= 0 {
                invalid(
                    &mut e,
                    &p.child("maxSkew"),
                    c.max_skew,
                    "not in valid range (0, inf)",
                );
            }
            if c.topology_key.is_empty() {
                e.required(p.child("topologyKey").as_str(), "can not be empty");
            } else {
                label_name(&mut e, &p.child("topologyKey"), &c.topology_key);
            }
            let wu = p.child("whenUnsatisfiable");
            if c.when_unsatisfiable.is_empty() {
                e.required(wu.as_str(), "can not be empty");
            } else if !WHEN_UNSATISFIABLE.contains(&c.when_unsatisfiable.as_str()) {
                e.not_supported(wu.as_str(), &c.when_unsatisfiable, WHEN_UNSATISFIABLE);
            }
            if c.label_selector.is_some() {
                e.forbidden(
                    p.child("labelSelector").as_str(),
                    "constraint must not define a selector, as they deduced for each pod",
                );
            }
            let repeated = self.default_constraints.iter().take(i).any(|o| {
                o.topology_key == c.topology_key && o.when_unsatisfiable == c.when_unsatisfiable
            });
            if repeated {
                e.duplicate(
                    p.as_str(),
                    &format!("{{{}, {}}}", c.topology_key, c.when_unsatisfiable),
                );
            }
        }
        e
    }

    fn apply_defaults(&mut self) {
        if self.defaulting_type.is_empty() {
            self.defaulting_type = "System".into();
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeBindingArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind_timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<UtilizationShapePoint>>,
}

impl ConfigKind for VolumeBindingArgs {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = "VolumeBindingArgs";

    fn validate(&self) -> ErrorList {
        let mut e = ErrorList::default();
        if let Some(t) = self.bind_timeout_seconds.filter(|t| *t < 0) {
            invalid(
                &mut e,
                &Path::root("bindTimeoutSeconds"),
                t,
                "invalid BindTimeoutSeconds, should not be a negative value",
            );
        }
        // Kubernetes accepts a shape only with its alpha storage-capacity scoring gate, off by
        // default; there are no gates in this file, so the shape is refused as it is there.
        if self.shape.is_some() {
            invalid(
                &mut e,
                &Path::root("shape"),
                "[...]",
                "unsupported when VolumeCapacityPriority feature is disabled",
            );
        }
        e
    }

    fn apply_defaults(&mut self) {
        self.bind_timeout_seconds.get_or_insert(600);
    }
}
