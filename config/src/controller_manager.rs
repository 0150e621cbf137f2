//! `CloudControllerManagerConfiguration` (`cloudcontrollermanager.config.svc.io/v1alpha1`):
//! the cloud controller manager's file, with the v1alpha1 defaults of cloud-provider and
//! controller-manager. Its Go fields have no JSON tags, so they are written in PascalCase
//! (`Generic`, `KubeCloudShared`); the embedded component-base types keep their camelCase.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::component::{
    ClientConnectionConfiguration, DebuggingConfiguration, LeaderElectionConfiguration, invalid,
    non_negative, null_as_default, parse_cidr, positive,
};
use super::{ConfigKind, Duration, Path};
use svc_core::validation::ErrorList;

/// Namespace of the controller manager's leader-election lock.
pub const LOCK_NAMESPACE: &str = "kube-system";
/// Name of the controller manager's leader-election lock.
pub const LOCK_NAME: &str = "cloud-controller-manager";
/// Default `ClusterName` (Kubernetes' `kubernetes`).
pub const CLUSTER_NAME: &str = "svc";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CloudControllerManagerConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub generic: GenericControllerManagerConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub kube_cloud_shared: KubeCloudSharedConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub node_controller: NodeControllerConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub service_controller: ServiceControllerConfiguration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_status_update_frequency: Option<Duration>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub webhook: WebhookConfiguration,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GenericControllerManagerConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub port: i32,
    #[serde(default, deserialize_with = "null_as_default")]
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_resync_period: Option<Duration>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub client_connection: ClientConnectionConfiguration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_start_interval: Option<Duration>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub leader_election: LeaderElectionConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub controllers: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub debugging: DebuggingConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub leader_migration_enabled: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub leader_migration: LeaderMigrationConfiguration,
}

/// Which component leads each controller while leadership moves between managers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderMigrationConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub leader_name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_lock: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub controller_leaders: Vec<ControllerLeaderConfiguration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerLeaderConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub component: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KubeCloudSharedConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub cloud_provider: CloudProviderConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub external_cloud_volume_plugin: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub use_service_account_credentials: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub allow_untagged_cloud: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_reconciliation_period: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_monitor_period: Option<Duration>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub cluster_name: String,
    #[serde(default, deserialize_with = "null_as_default", rename = "ClusterCIDR")]
    pub cluster_cidr: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        rename = "AllocateNodeCIDRs"
    )]
    pub allocate_node_cidrs: bool,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        rename = "CIDRAllocatorType"
    )]
    pub cidr_allocator_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configure_cloud_routes: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_sync_period: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CloudProviderConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub cloud_config_file: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NodeControllerConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub concurrent_node_syncs: i32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceControllerConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub concurrent_service_syncs: i32,
}

/// The webhooks the manager hosts: `*` all enabled by default, `foo` enables, `-foo`
/// disables; the first item for a name wins.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct WebhookConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub webhooks: Vec<String>,
}

impl ConfigKind for CloudControllerManagerConfiguration {
    const API_VERSIONS: &'static [&'static str] =
        &["cloudcontrollermanager.config.svc.io/v1alpha1"];
    const KIND: &'static str = "CloudControllerManagerConfiguration";

    /// Run on the defaulted configuration, as Kubernetes validates it.
    fn validate(&self) -> ErrorList {
        let mut defaulted = self.clone();
        defaulted.apply_defaults();
        defaulted.validate_defaulted()
    }

    /// cloud-provider's `SetDefaults_CloudControllerManagerConfiguration` and
    /// `SetDefaults_KubeCloudSharedConfiguration`, controller-manager's
    /// `RecommendedDefaultGenericControllerManagerConfiguration`.
    fn apply_defaults(&mut self) {
        self.node_status_update_frequency
            .get_or_insert(Duration::from_secs(5 * 60));
        let g = &mut self.generic;
        g.client_connection.apply_defaults(20.0, 30);
        if g.address.is_empty() {
            g.address = "0.0.0.0".into();
        }
        g.min_resync_period
            .get_or_insert(Duration::from_secs(12 * 3600));
        g.controller_start_interval.get_or_insert(Duration(0));
        if g.controllers.is_empty() {
            g.controllers = vec!["*".into()];
        }
        let le = &mut g.leader_election;
        if le.resource_namespace.is_empty() {
            le.resource_namespace = LOCK_NAMESPACE.into();
        }
        if le.resource_name.is_empty() {
            le.resource_name = LOCK_NAME.into();
        }
        le.apply_defaults();
        if self.service_controller.concurrent_service_syncs == 0 {
            self.service_controller.concurrent_service_syncs = 1;
        }
        if self.node_controller.concurrent_node_syncs == 0 {
            self.node_controller.concurrent_node_syncs = 1;
        }
        let s = &mut self.kube_cloud_shared;
        s.node_monitor_period.get_or_insert(Duration::from_secs(5));
        if s.cluster_name.is_empty() {
            s.cluster_name = CLUSTER_NAME.into();
        }
        s.configure_cloud_routes.get_or_insert(true);
        s.route_reconciliation_period
            .get_or_insert(Duration::from_secs(10));
    }
}

impl CloudControllerManagerConfiguration {
    fn validate_defaulted(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        let e = &mut errors;
        validate_generic(e, &self.generic);
        validate_kube_cloud_shared(e, &self.kube_cloud_shared);
        for (path, value) in [
            (
                Path::root("NodeController").child("ConcurrentNodeSyncs"),
                self.node_controller.concurrent_node_syncs,
            ),
            (
                Path::root("ServiceController").child("ConcurrentServiceSyncs"),
                self.service_controller.concurrent_service_syncs,
            ),
        ] {
            if value < 1 {
                invalid(e, &path, value, "must be greater than 0");
            }
        }
        positive(
            e,
            &Path::root("NodeStatusUpdateFrequency"),
            self.node_status_update_frequency,
        );
        enable_list(
            e,
            &Path::root("Webhook").child("Webhooks"),
            &self.webhook.webhooks,
            "webhook",
        );
        errors
    }
}

/// The `Generic` section: serving address, periods, client and leader election, the
/// controller list and leader migration.
fn validate_generic(e: &mut ErrorList, g: &GenericControllerManagerConfiguration) {
    let gp = Path::root("Generic");
    if !(0..=65535).contains(&g.port) {
        invalid(
            e,
            &gp.child("Port"),
            g.port,
            "must be between 0 and 65535, inclusive",
        );
    }
    if g.address.parse::<core::net::IpAddr>().is_err() {
        invalid(
            e,
            &gp.child("Address"),
            &g.address,
            "not a valid textual representation of an IP address",
        );
    }
    positive(e, &gp.child("MinResyncPeriod"), g.min_resync_period);
    non_negative(
        e,
        &gp.child("ControllerStartInterval"),
        g.controller_start_interval,
    );
    g.client_connection
        .validate(&gp.child("ClientConnection"), e);
    g.leader_election.validate(&gp.child("LeaderElection"), e);
    enable_list(e, &gp.child("Controllers"), &g.controllers, "controller");
    if g.leader_migration_enabled {
        validate_leader_migration(e, &gp.child("LeaderMigration"), &g.leader_migration);
    }
}

/// Leader migration, when enabled: a leader name, the `leases` lock, named controller leaders.
fn validate_leader_migration(e: &mut ErrorList, p: &Path, lm: &LeaderMigrationConfiguration) {
    if lm.leader_name.is_empty() {
        e.required(p.child("leaderName").as_str(), "");
    }
    if !lm.resource_lock.is_empty() && lm.resource_lock != "leases" {
        e.not_supported(
            p.child("resourceLock").as_str(),
            &lm.resource_lock,
            &["leases"],
        );
    }
    let mut seen = BTreeSet::new();
    for (i, leader) in lm.controller_leaders.iter().enumerate() {
        let lp = p.child("controllerLeaders").index(i);
        if leader.name.is_empty() {
            e.required(lp.child("name").as_str(), "");
        } else if !seen.insert(leader.name.as_str()) {
            e.duplicate(lp.child("name").as_str(), &leader.name);
        }
        if leader.component.is_empty() {
            e.required(lp.child("component").as_str(), "");
        }
    }
}

/// The `KubeCloudShared` section: periods and cluster CIDRs.
fn validate_kube_cloud_shared(e: &mut ErrorList, s: &KubeCloudSharedConfiguration) {
    let sp = Path::root("KubeCloudShared");
    positive(
        e,
        &sp.child("RouteReconciliationPeriod"),
        s.route_reconciliation_period,
    );
    positive(e, &sp.child("NodeMonitorPeriod"), s.node_monitor_period);
    non_negative(e, &sp.child("NodeSyncPeriod"), s.node_sync_period);
    if !s.cluster_cidr.is_empty()
        && s.cluster_cidr
            .split(',')
            .any(|c| parse_cidr(c.trim()).is_none())
    {
        invalid(
            e,
            &sp.child("ClusterCIDR"),
            &s.cluster_cidr,
            "must be a comma-separated list of valid CIDR blocks",
        );
    }
    if s.allocate_node_cidrs && s.cluster_cidr.is_empty() {
        e.required(
            sp.child("ClusterCIDR").as_str(),
            "must be set when AllocateNodeCIDRs is true",
        );
    }
}

/// A list of names to enable, `-name` to disable, or `*` for the defaults.
fn enable_list(e: &mut ErrorList, at: &Path, items: &[String], what: &str) {
    for (i, c) in items.iter().enumerate() {
        let name = c.strip_prefix('-').unwrap_or(c);
        if name.is_empty() || (name == "*" && c != "*") {
            invalid(
                e,
                &at.index(i),
                c,
                &format!("must be '*', a {what} name or '-' and a {what} name"),
            );
        }
    }
}
