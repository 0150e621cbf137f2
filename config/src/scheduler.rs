//! `SvcSchedulerConfiguration` (`svcscheduler.config.svc.io/v1`): the scheduler's
//! configuration file, its profiles, plugins and extenders, with kube-scheduler's v1 defaults
//! and validation. The plugin argument kinds are in `scheduler/args.rs`.

pub mod args;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::component::{
    ClientConnectionConfiguration, LeaderElectionConfiguration, invalid, non_negative,
    null_as_default,
};
use super::{ConfigKind, Duration, Path};
use svc_core::validation::{ErrorList, qualified_name};

/// The scheduler API version every plugin argument kind is written in.
pub const API_VERSION: &str = "svcscheduler.config.svc.io/v1";
/// The profile pods without a scheduler name use.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";
/// Namespace of the scheduler's leader-election lock.
pub const LOCK_NAMESPACE: &str = "kube-system";
/// Name of the scheduler's leader-election lock.
pub const LOCK_NAME: &str = "svc-scheduler";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SvcSchedulerConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<i32>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub leader_election: LeaderElectionConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub client_connection: ClientConnectionConfiguration,
    /// From the embedded `DebuggingConfiguration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_profiling: Option<bool>,
    /// From the embedded `DebuggingConfiguration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_contention_profiling: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage_of_nodes_to_score: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_initial_backoff_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_max_backoff_seconds: Option<i64>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub profiles: Vec<Profile>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub extenders: Vec<Extender>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub delay_cache_until_active: bool,
}

/// A scheduling profile: a scheduler name and its plugins.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage_of_nodes_to_score: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugins: Option<Plugins>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub plugin_config: Vec<PluginConfig>,
}

/// The plugins of each extension point; `multiPoint` enables a plugin at every point it
/// implements.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plugins {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub pre_enqueue: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub queue_sort: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub pre_filter: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub filter: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub post_filter: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub pre_score: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub score: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub reserve: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub permit: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub pre_bind: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub bind: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub post_bind: PluginSet,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "PluginSet::is_empty"
    )]
    pub multi_point: PluginSet,
}

impl Plugins {
    fn sets(&self) -> [&PluginSet; 13] {
        [
            &self.multi_point,
            &self.pre_filter,
            &self.filter,
            &self.post_filter,
            &self.reserve,
            &self.pre_score,
            &self.score,
            &self.pre_bind,
            &self.bind,
            &self.post_bind,
            &self.permit,
            &self.pre_enqueue,
            &self.queue_sort,
        ]
    }

    /// Every enabled plugin's name, sorted, once.
    fn enabled_names(&self) -> BTreeSet<String> {
        self.sets()
            .iter()
            .flat_map(|s| s.enabled.iter().map(|p| p.name.clone()))
            .collect()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginSet {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub enabled: Vec<Plugin>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub disabled: Vec<Plugin>,
}

impl PluginSet {
    pub fn is_empty(&self) -> bool {
        self.enabled.is_empty() && self.disabled.is_empty()
    }

    /// kube-scheduler's `mergePluginSet`: the defaults minus what is disabled (`*` disables
    /// all), a re-configured default replaced in place, other custom plugins appended.
    fn merged_over(&self, defaults: &PluginSet) -> PluginSet {
        let disabled: BTreeSet<&str> = self.disabled.iter().map(|p| p.name.as_str()).collect();
        let mut replaced = BTreeSet::new();
        let mut enabled = Vec::new();
        if !disabled.contains("*") {
            for d in defaults
                .enabled
                .iter()
                .filter(|d| !disabled.contains(d.name.as_str()))
            {
                match self
                    .enabled
                    .iter()
                    .enumerate()
                    .find(|(_, c)| c.name == d.name)
                {
                    Some((i, configured)) => {
                        replaced.insert(i);
                        enabled.push(configured.clone());
                    }
                    None => enabled.push(d.clone()),
                }
            }
        }
        for (i, p) in self.enabled.iter().enumerate() {
            if !replaced.contains(&i) {
                enabled.push(p.clone());
            }
        }
        let disabled = self
            .disabled
            .iter()
            .map(|p| Plugin {
                name: p.name.clone(),
                weight: None,
            })
            .collect();
        PluginSet { enabled, disabled }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plugin {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

/// A plugin's arguments: for the in-tree plugins with arguments, one of the argument kinds
/// (its `apiVersion` and `kind` may be left out); for others, any object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginConfig {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
}

/// An external process the scheduler calls to filter, score, preempt or bind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Extender {
    #[serde(default, deserialize_with = "null_as_default")]
    pub url_prefix: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub filter_verb: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub preempt_verb: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub prioritize_verb: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub weight: i64,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub bind_verb: String,
    #[serde(default, deserialize_with = "null_as_default", rename = "enableHTTPS")]
    pub enable_https: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_config: Option<ExtenderTlsConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub node_cache_capable: bool,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub managed_resources: Vec<ExtenderManagedResource>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub ignorable: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtenderTlsConfig {
    #[serde(default, deserialize_with = "null_as_default")]
    pub insecure: bool,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub server_name: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub cert_file: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub key_file: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        rename = "caFile",
        skip_serializing_if = "String::is_empty"
    )]
    pub ca_file: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub cert_data: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub key_data: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        rename = "caData",
        skip_serializing_if = "String::is_empty"
    )]
    pub ca_data: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtenderManagedResource {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub ignored_by_scheduler: bool,
}

/// kube-scheduler's default multi-point plugins, in order, with their score weights.
const DEFAULT_PLUGINS: &[(&str, Option<i32>)] = &[
    ("SchedulingGates", None),
    ("PrioritySort", None),
    ("NodeUnschedulable", None),
    ("NodeName", None),
    ("TaintToleration", Some(3)),
    ("NodeAffinity", Some(2)),
    ("NodePorts", None),
    ("NodeResourcesFit", Some(1)),
    ("VolumeRestrictions", None),
    ("NodeVolumeLimits", None),
    ("VolumeBinding", None),
    ("VolumeZone", None),
    ("PodTopologySpread", Some(2)),
    ("InterPodAffinity", Some(2)),
    ("DefaultPreemption", None),
    ("NodeResourcesBalancedAllocation", Some(1)),
    ("ImageLocality", Some(1)),
    ("DefaultBinder", None),
];

fn default_plugins() -> PluginSet {
    PluginSet {
        enabled: DEFAULT_PLUGINS
            .iter()
            .map(|(name, weight)| Plugin {
                name: (*name).into(),
                weight: *weight,
            })
            .collect(),
        disabled: Vec::new(),
    }
}

impl ConfigKind for SvcSchedulerConfiguration {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = "SvcSchedulerConfiguration";

    /// kube-scheduler's `ValidateKubeSchedulerConfiguration`, run as Kubernetes runs it: on
    /// the defaulted configuration. Plugin arguments that do not decode are reported with
    /// their path and left out of the rest of the checks.
    fn validate(&self) -> ErrorList {
        let mut defaulted = self.clone();
        let mut errors = defaulted.default_profiles();
        defaulted.apply_top_level_defaults();
        defaulted.validate_defaulted(&mut errors);
        errors
    }

    /// kube-scheduler's v1 `SetDefaults_KubeSchedulerConfiguration`, including each profile's
    /// default plugins and the defaulted arguments of every enabled plugin that takes some.
    fn apply_defaults(&mut self) {
        let _ = self.default_profiles();
        self.apply_top_level_defaults();
    }
}

impl SvcSchedulerConfiguration {
    fn apply_top_level_defaults(&mut self) {
        self.parallelism.get_or_insert(16);
        self.percentage_of_nodes_to_score.get_or_insert(0);
        let le = &mut self.leader_election;
        if le.resource_namespace.is_empty() {
            le.resource_namespace = LOCK_NAMESPACE.into();
        }
        if le.resource_name.is_empty() {
            le.resource_name = LOCK_NAME.into();
        }
        le.apply_defaults();
        self.client_connection.apply_defaults(50.0, 100);
        self.pod_initial_backoff_seconds.get_or_insert(1);
        self.pod_max_backoff_seconds.get_or_insert(10);
        let profiling = *self.enable_profiling.get_or_insert(true);
        if profiling {
            self.enable_contention_profiling.get_or_insert(true);
        }
    }

    /// Defaults the profiles and their plugin arguments; returns the errors of arguments that
    /// could not be decoded (their raw value is kept).
    fn default_profiles(&mut self) -> ErrorList {
        let mut errors = ErrorList::default();
        if self.profiles.is_empty() {
            self.profiles.push(Profile::default());
        }
        if let [only] = self.profiles.as_mut_slice()
            && only.scheduler_name.is_none()
        {
            only.scheduler_name = Some(DEFAULT_SCHEDULER_NAME.into());
        }
        let profiles = Path::root("profiles");
        for (i, profile) in self.profiles.iter_mut().enumerate() {
            let mut plugins = profile.plugins.take().unwrap_or_default();
            plugins.multi_point = plugins.multi_point.merged_over(&default_plugins());
            let names = plugins.enabled_names();
            profile.plugins = Some(plugins);
            let mut configured = BTreeSet::new();
            for (j, config) in profile.plugin_config.iter_mut().enumerate() {
                configured.insert(config.name.clone());
                let path = profiles
                    .index(i)
                    .child("pluginConfig")
                    .index(j)
                    .child("args");
                let Some(kind) = args::kind_for_plugin(&config.name) else {
                    continue;
                };
                let raw = config
                    .args
                    .take()
                    .unwrap_or(Value::Object(Default::default()));
                match args::defaulted(kind, raw.clone(), &path) {
                    Ok(value) => config.args = Some(value),
                    Err(e) => {
                        errors.extend(e);
                        config.args = Some(raw);
                    }
                }
            }
            for name in names.iter().filter(|n| !configured.contains(*n)) {
                if let Some(kind) = args::kind_for_plugin(name) {
                    let empty = Value::Object(Default::default());
                    if let Ok(value) = args::defaulted(kind, empty, &Path::root("")) {
                        profile.plugin_config.push(PluginConfig {
                            name: name.clone(),
                            args: Some(value),
                        });
                    }
                }
            }
        }
        errors
    }

    fn validate_defaulted(&self, errors: &mut ErrorList) {
        let e = errors;
        let root = Path::root("");
        self.client_connection
            .validate(&root.child("clientConnection"), e);
        let le_path = root.child("leaderElection");
        self.leader_election.validate(&le_path, e);
        if self.leader_election.leader_elect == Some(true)
            && self.leader_election.resource_lock != "leases"
        {
            invalid(
                e,
                &le_path.child("resourceLock"),
                &self.leader_election.resource_lock,
                r#"resourceLock value must be "leases""#,
            );
        }
        if let Some(p) = self.parallelism.filter(|p| *p <= 0) {
            invalid(
                e,
                &root.child("parallelism"),
                p,
                "should be an integer value greater than zero",
            );
        }
        let profiles = root.child("profiles");
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, profile) in self.profiles.iter().enumerate() {
            let path = profiles.index(i);
            validate_profile(&path, profile, e);
            let name = profile.scheduler_name.as_deref().unwrap_or_default();
            if let Some(first) = seen.get(name) {
                e.duplicate(
                    path.child("schedulerName").as_str(),
                    profiles.index(*first).child("schedulerName").as_str(),
                );
            } else {
                seen.insert(name, i);
            }
        }
        validate_common_queue_sort(&profiles, &self.profiles, e);
        percentage(
            e,
            &root.child("percentageOfNodesToScore"),
            self.percentage_of_nodes_to_score,
        );
        let initial = self.pod_initial_backoff_seconds.unwrap_or_default();
        if initial <= 0 {
            invalid(
                e,
                &root.child("podInitialBackoffSeconds"),
                initial,
                "must be greater than 0",
            );
        }
        let max = self.pod_max_backoff_seconds.unwrap_or_default();
        if max < initial {
            invalid(
                e,
                &root.child("podMaxBackoffSeconds"),
                max,
                "must be greater than or equal to podInitialBackoffSeconds",
            );
        }
        validate_extenders(&root.child("extenders"), &self.extenders, e);
    }
}

fn percentage(e: &mut ErrorList, path: &Path, value: Option<i32>) {
    if let Some(v) = value.filter(|v| !(0..=100).contains(v)) {
        invalid(e, path, v, "not in valid range [0-100]");
    }
}

fn validate_profile(path: &Path, profile: &Profile, e: &mut ErrorList) {
    if profile
        .scheduler_name
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        e.required(path.child("schedulerName").as_str(), "");
    }
    percentage(
        e,
        &path.child("percentageOfNodesToScore"),
        profile.percentage_of_nodes_to_score,
    );
    let mut seen = BTreeSet::new();
    for (j, config) in profile.plugin_config.iter().enumerate() {
        let p = path.child("pluginConfig").index(j);
        if !seen.insert(config.name.as_str()) {
            e.duplicate(p.as_str(), &config.name);
        }
        // Arguments that failed to decode were reported while defaulting.
        if let (Some(kind), Some(args)) = (args::kind_for_plugin(&config.name), &config.args)
            && let Ok(errors) = args::validate_value(kind, args.clone(), &p.child("args"))
        {
            e.extend(errors);
        }
    }
}

/// Every profile must sort its queue the same way (one queue serves them all).
fn validate_common_queue_sort(path: &Path, profiles: &[Profile], e: &mut ErrorList) {
    let queue_sort = |p: &Profile| {
        p.plugins
            .as_ref()
            .map(|x| x.queue_sort.clone())
            .unwrap_or_default()
    };
    let Some(first) = profiles.first() else {
        return;
    };
    let canon = queue_sort(first);
    if canon.enabled.len() > 1 {
        invalid(
            e,
            &path
                .index(0)
                .child("plugins")
                .child("queueSort")
                .child("enabled"),
            canon.enabled.len(),
            "only one queue sort plugin can be enabled",
        );
    }
    let sort_name = canon.enabled.first().map(|p| p.name.as_str());
    let args_of = |p: &Profile| {
        p.plugin_config
            .iter()
            .find(|c| Some(c.name.as_str()) == sort_name)
            .and_then(|c| c.args.clone())
    };
    let canon_args = args_of(first);
    for (i, profile) in profiles.iter().enumerate().skip(1) {
        if queue_sort(profile) != canon {
            e.invalid(
                path.index(i).child("plugins").child("queueSort").as_str(),
                "",
                "must be the same for all profiles",
            );
        }
        if sort_name.is_some() && args_of(profile) != canon_args {
            e.invalid(
                path.index(i).child("pluginConfig").child("args").as_str(),
                "",
                "must be the same for all profiles",
            );
        }
    }
}

fn validate_extenders(path: &Path, extenders: &[Extender], e: &mut ErrorList) {
    let mut binders = 0usize;
    let mut managed = BTreeSet::new();
    for (i, extender) in extenders.iter().enumerate() {
        let p = path.index(i);
        if !extender.prioritize_verb.is_empty() && extender.weight <= 0 {
            invalid(
                e,
                &p.child("weight"),
                extender.weight,
                "must have a positive weight applied to it",
            );
        }
        if !extender.bind_verb.is_empty() {
            binders = binders.saturating_add(1);
        }
        non_negative(e, &p.child("httpTimeout"), extender.http_timeout);
        for (j, resource) in extender.managed_resources.iter().enumerate() {
            let rp = p.child("managedResources").index(j).child("name");
            if let Err(msg) = extended_resource_name(&resource.name) {
                invalid(e, &rp, &resource.name, &msg);
            }
            if !managed.insert(resource.name.as_str()) {
                invalid(
                    e,
                    &rp,
                    &resource.name,
                    "duplicate extender managed resource name",
                );
            }
        }
    }
    if binders > 1 {
        invalid(
            e,
            path,
            format!("found {binders} extenders implementing bind"),
            "only one extender can implement bind",
        );
    }
}

/// An extended resource: a qualified name with a domain outside Kubernetes' own, not
/// starting with `requests.`.
fn extended_resource_name(name: &str) -> Result<(), String> {
    qualified_name(name)?;
    let Some((domain, _)) = name.split_once('/') else {
        return Err("must be a fully qualified name with a domain prefix".into());
    };
    let native = domain == "kubernetes.io"
        || domain.ends_with(".kubernetes.io")
        || domain == "svc.io"
        || domain.ends_with(".svc.io");
    if native || name.starts_with("requests.") {
        return Err("is an invalid extended resource name".into());
    }
    Ok(())
}
