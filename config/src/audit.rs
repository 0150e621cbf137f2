//! Audit logging (`audit.svc.io/v1`): the Policy that says how much of each request is
//! recorded, its validation, the evaluation of its rules against a request (first match
//! wins, no match is `None`), and the Event and EventList written to audit backends.
//!
//! The policy is decoded with strings for its levels and stages so that validation can
//! name a bad value with its path; [`Evaluator`] is the checked, ready-to-match form. The
//! events are in `audit/event.rs`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ConfigKind, Path};
use svc_core::user::UserInfo;
use svc_core::validation::ErrorList;

mod event;
pub use event::{
    Event, EventList, ObjectReference, RawJson, ResponseStatus, without_managed_fields,
};

pub const API_VERSION: &str = "audit.svc.io/v1";

/// How much of a request an event records; ordered from nothing to everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Level {
    None,
    Metadata,
    Request,
    RequestResponse,
}

impl Level {
    pub const ALL: [&'static str; 4] = ["None", "Metadata", "Request", "RequestResponse"];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "None" => Level::None,
            "Metadata" => Level::Metadata,
            "Request" => Level::Request,
            "RequestResponse" => Level::RequestResponse,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }
}

/// The point in a request's life an event is written at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stage {
    RequestReceived,
    /// Headers sent, body still streaming: long-running requests (watches) only.
    ResponseStarted,
    ResponseComplete,
    Panic,
}

impl Stage {
    pub const ALL: [&'static str; 4] = [
        "RequestReceived",
        "ResponseStarted",
        "ResponseComplete",
        "Panic",
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "RequestReceived" => Stage::RequestReceived,
            "ResponseStarted" => Stage::ResponseStarted,
            "ResponseComplete" => Stage::ResponseComplete,
            "Panic" => Stage::Panic,
            _ => return None,
        })
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of stages, as a bit set (the union of a rule's and the policy's `omitStages`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stages(u8);

impl Stages {
    pub fn of(stages: &[String]) -> Self {
        Stages(
            stages
                .iter()
                .filter_map(|s| Stage::parse(s))
                .fold(0, |acc, s| acc | s.bit()),
        )
    }

    pub fn contains(self, stage: Stage) -> bool {
        self.0 & stage.bit() != 0
    }

    pub fn union(self, other: Stages) -> Stages {
        Stages(self.0 | other.0)
    }
}

/// `Policy`: ordered rules; the first that matches a request sets its level.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omit_stages: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub omit_managed_fields: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    #[serde(default)]
    pub level: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verbs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<GroupResources>,
    /// Namespaces matched; `""` matches cluster-scoped resources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Paths of non-resource requests; a trailing `*` matches any suffix.
    #[serde(
        default,
        rename = "nonResourceURLs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub non_resource_urls: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omit_stages: Vec<String>,
    /// Overrides the policy's `omitManagedFields` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omit_managed_fields: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupResources {
    /// The API group; empty is the core group.
    #[serde(default)]
    pub group: String,
    /// `pods`, `pods/log`, `*` (every resource and subresource), `pods/*` (pods and its
    /// subresources, as Kubernetes matches it), `*/scale`;
    /// empty means every resource of the group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
}

impl ConfigKind for Policy {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = "Policy";

    /// Kubernetes' audit policy validation, plus refusing overlapping wildcards.
    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        validate_stages(&self.omit_stages, &Path::root("omitStages"), &mut errors);
        let rules = Path::root("rules");
        for (i, rule) in self.rules.iter().enumerate() {
            validate_rule(rule, &rules.index(i), &mut errors);
        }
        errors
    }
}

fn validate_stages(stages: &[String], path: &Path, errors: &mut ErrorList) {
    for (i, s) in stages.iter().enumerate() {
        if Stage::parse(s).is_none() {
            errors.not_supported(path.index(i).as_str(), s, &Stage::ALL);
        }
    }
}

fn validate_rule(rule: &PolicyRule, path: &Path, errors: &mut ErrorList) {
    let level = path.child("level");
    if rule.level.is_empty() {
        errors.required(level.as_str(), "");
    } else if Level::parse(&rule.level).is_none() {
        errors.not_supported(level.as_str(), &rule.level, &Level::ALL);
    }
    let urls = path.child("nonResourceURLs");
    for (i, url) in rule.non_resource_urls.iter().enumerate() {
        if url == "*" {
            continue;
        }
        let at = urls.index(i);
        if !url.starts_with('/') {
            errors.invalid(
                at.as_str(),
                url,
                "non-resource URL rules must begin with a '/' character",
            );
        }
        // A '*' anywhere but at the end.
        if url
            .find('*')
            .is_some_and(|at| at.saturating_add(1) < url.len())
        {
            errors.invalid(
                at.as_str(),
                url,
                "non-resource URL wildcards '*' must be the final character of the rule",
            );
        }
    }
    let resources = path.child("resources");
    for (i, gr) in rule.resources.iter().enumerate() {
        let at = resources.index(i);
        if !gr.group.is_empty()
            && let Err(msg) = svc_core::validation::dns1123_subdomain(&gr.group)
        {
            errors.invalid(at.child("group").as_str(), &gr.group, &msg);
        }
        if !gr.resource_names.is_empty() && gr.resources.is_empty() {
            errors.invalid(
                at.child("resourceNames").as_str(),
                &format!("{:?}", gr.resource_names),
                "using resourceNames requires at least one resource",
            );
        }
        if let Some((a, b)) = overlapping(&gr.resources) {
            errors.invalid(
                at.child("resources").as_str(),
                &format!("{:?}", gr.resources),
                &format!(
                    "resources {a:?} and {b:?} overlap: a wildcard must not cover another entry"
                ),
            );
        }
    }
    validate_stages(&rule.omit_stages, &path.child("omitStages"), errors);
    if !rule.non_resource_urls.is_empty()
        && (!rule.resources.is_empty() || !rule.namespaces.is_empty())
    {
        errors.invalid(
            urls.as_str(),
            &format!("{:?}", rule.non_resource_urls),
            "rules cannot apply to both regular resources and non-resource URLs",
        );
    }
}

/// The first pair of entries of which one (a wildcard) matches everything the other does.
fn overlapping(resources: &[String]) -> Option<(&str, &str)> {
    let covers = |wild: &str, other: &str| -> bool {
        if wild == other {
            return false;
        }
        if wild == "*" {
            return true;
        }
        let (res, sub) = other.split_once('/').unwrap_or((other, ""));
        if let Some(sub_wild) = wild.strip_prefix("*/") {
            return !sub.is_empty() && (sub == sub_wild || sub == "*");
        }
        if let Some(res_wild) = wild.strip_suffix("/*") {
            // As Kubernetes matches it, `pods/*` covers `pods` itself too.
            return res == res_wild || res == "*";
        }
        false
    };
    for a in resources {
        for b in resources {
            if covers(a, b) {
                return Some((a, b));
            }
        }
    }
    None
}

/// A request as the policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct RequestAttributes<'a> {
    /// None when authentication failed: rules naming users or groups do not match.
    pub user: Option<&'a UserInfo>,
    pub verb: &'a str,
    /// Set for resource requests.
    pub resource: Option<AuditedResource<'a>>,
    /// The path of a non-resource request.
    pub path: &'a str,
}

#[derive(Clone, Copy, Debug)]
pub struct AuditedResource<'a> {
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// What the policy decided for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestAuditConfig {
    pub level: Level,
    /// The union of the matching rule's and the policy's `omitStages`.
    pub omit_stages: Stages,
    pub omit_managed_fields: bool,
}

/// A validated [`Policy`], ready to match requests.
#[derive(Clone, Debug)]
pub struct Evaluator {
    rules: Vec<(PolicyRule, RequestAuditConfig)>,
    none: RequestAuditConfig,
}

impl Evaluator {
    /// Assumes `policy` passed validation (levels and stages that do not parse count as
    /// `None` and are ignored).
    pub fn new(policy: &Policy) -> Self {
        let global = Stages::of(&policy.omit_stages);
        let rules = policy
            .rules
            .iter()
            .map(|r| {
                let config = RequestAuditConfig {
                    level: Level::parse(&r.level).unwrap_or(Level::None),
                    omit_stages: Stages::of(&r.omit_stages).union(global),
                    omit_managed_fields: r
                        .omit_managed_fields
                        .unwrap_or(policy.omit_managed_fields),
                };
                (r.clone(), config)
            })
            .collect();
        Evaluator {
            rules,
            none: RequestAuditConfig {
                level: Level::None,
                omit_stages: global,
                omit_managed_fields: policy.omit_managed_fields,
            },
        }
    }

    /// The first matching rule's decision, or level `None`.
    pub fn evaluate(&self, attrs: &RequestAttributes<'_>) -> RequestAuditConfig {
        self.rules
            .iter()
            .find(|(rule, _)| rule_matches(rule, attrs))
            .map_or(self.none, |(_, c)| *c)
    }
}

fn rule_matches(r: &PolicyRule, attrs: &RequestAttributes<'_>) -> bool {
    if !r.users.is_empty() && !attrs.user.is_some_and(|u| r.users.contains(&u.username)) {
        return false;
    }
    if !r.user_groups.is_empty()
        && !attrs
            .user
            .is_some_and(|u| u.groups.iter().any(|g| r.user_groups.contains(g)))
    {
        return false;
    }
    if !r.verbs.is_empty() && !r.verbs.iter().any(|v| v == attrs.verb) {
        return false;
    }
    if !r.namespaces.is_empty() || !r.resources.is_empty() {
        return attrs.resource.is_some_and(|res| matches_resource(r, &res));
    }
    if !r.non_resource_urls.is_empty() {
        return attrs.resource.is_none()
            && r.non_resource_urls
                .iter()
                .any(|spec| path_matches(attrs.path, spec));
    }
    true
}

fn matches_resource(r: &PolicyRule, a: &AuditedResource<'_>) -> bool {
    if !r.namespaces.is_empty() && !r.namespaces.iter().any(|n| n == a.namespace) {
        return false;
    }
    if r.resources.is_empty() {
        return true;
    }
    r.resources
        .iter()
        .filter(|gr| gr.group == a.group)
        .any(|gr| {
            if gr.resources.is_empty() {
                return true;
            }
            if !gr.resource_names.is_empty() && !gr.resource_names.iter().any(|n| n == a.name) {
                return false;
            }
            gr.resources.iter().any(|res| {
                let combined_matches = if a.subresource.is_empty() {
                    res == a.resource
                } else {
                    res.split_once('/') == Some((a.resource, a.subresource))
                };
                combined_matches
                    || res == "*"
                    || (!a.subresource.is_empty() && res.strip_prefix("*/") == Some(a.subresource))
                    || res.strip_suffix("/*") == Some(a.resource)
            })
        })
}

fn path_matches(path: &str, spec: &str) -> bool {
    spec == "*"
        || spec == path
        || spec
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix.trim_end_matches('*')))
}

#[cfg(test)]
mod tests;
