//! `SvcProxyConfiguration` (`svcproxy.config.svc.io/v1alpha1`): the network proxy's
//! configuration file, with kube-proxy's v1alpha1 defaults and validation rules.
//!
//! Durations that Kubernetes defaults when zero are optional here: an absent one gets the
//! default, a written `0s` is kept and judged, so `minSyncPeriod: 0s` means "resync on every
//! change" as the spec says, and `syncPeriod: 0s` is refused.

use std::collections::BTreeMap;
// Addresses are parsed, never bound: `core::net` holds the types without the sockets.
use core::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::component::{
    ClientConnectionConfiguration, LoggingConfiguration, invalid, non_negative, null_as_default,
    parse_cidr, positive, validate_host_port,
};
use super::{ConfigKind, Duration, Path};
use svc_core::validation::ErrorList;

/// kube-proxy's health port.
pub const HEALTHZ_PORT: u16 = 10256;
/// kube-proxy's metrics port.
pub const METRICS_PORT: u16 = 10249;
/// Kubernetes' `qos.KubeProxyOOMScoreAdj`.
pub const OOM_SCORE_ADJ: i32 = -999;
const IPVS_SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh",
];
const MODES: &[&str] = &["iptables", "ipvs", "nftables", "kernelspace"];
const LOCAL_MODES: &[&str] = &[
    "ClusterCIDR",
    "NodeCIDR",
    "BridgeInterface",
    "InterfaceNamePrefix",
];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SvcProxyConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub feature_gates: BTreeMap<String, bool>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub client_connection: ClientConnectionConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub logging: LoggingConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub hostname_override: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub bind_address: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub healthz_bind_address: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub metrics_bind_address: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub bind_address_hard_fail: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub enable_profiling: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub show_hidden_metrics_for_version: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub mode: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub iptables: IptablesConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub ipvs: IpvsConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub nftables: NftablesConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub winkernel: WinkernelConfiguration,
    #[serde(default, deserialize_with = "null_as_default")]
    pub detect_local_mode: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub detect_local: DetectLocalConfiguration,
    #[serde(default, deserialize_with = "null_as_default", rename = "clusterCIDR")]
    pub cluster_cidr: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub node_port_addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_score_adj: Option<i32>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub conntrack: ConntrackConfiguration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_sync_period: Option<Duration>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub port_range: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub windows_run_as_service: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IptablesConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masquerade_bit: Option<i32>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub masquerade_all: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub localhost_node_ports: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_period: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_sync_period: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpvsConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_period: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_sync_period: Option<Duration>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub scheduler: String,
    #[serde(default, deserialize_with = "null_as_default", rename = "excludeCIDRs")]
    pub exclude_cidrs: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default", rename = "strictARP")]
    pub strict_arp: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_fin_timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_timeout: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NftablesConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masquerade_bit: Option<i32>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub masquerade_all: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_period: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_sync_period: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WinkernelConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub network_name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub source_vip: String,
    #[serde(default, deserialize_with = "null_as_default", rename = "enableDSR")]
    pub enable_dsr: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub root_hns_endpoint_name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub forward_health_check_vip: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DetectLocalConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub bridge_interface: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub interface_name_prefix: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConntrackConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_core: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_established_timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_close_wait_timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_stream_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub tcp_be_liberal: bool,
}

impl ConfigKind for SvcProxyConfiguration {
    const API_VERSIONS: &'static [&'static str] = &["svcproxy.config.svc.io/v1alpha1"];
    const KIND: &'static str = "SvcProxyConfiguration";

    /// kube-proxy's `Validate`, run as Kubernetes runs it: on the defaulted configuration.
    fn validate(&self) -> ErrorList {
        let mut defaulted = self.clone();
        defaulted.apply_defaults();
        defaulted.validate_defaulted()
    }

    /// kube-proxy's v1alpha1 `SetDefaults_KubeProxyConfiguration`.
    fn apply_defaults(&mut self) {
        if self.bind_address.is_empty() {
            self.bind_address = "0.0.0.0".into();
        }
        let v6 = self
            .bind_address
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_ipv6());
        let (healthz_host, metrics_host) = if v6 {
            ("[::]", "[::1]")
        } else {
            ("0.0.0.0", "127.0.0.1")
        };
        self.healthz_bind_address =
            with_port(&self.healthz_bind_address, healthz_host, HEALTHZ_PORT);
        self.metrics_bind_address =
            with_port(&self.metrics_bind_address, metrics_host, METRICS_PORT);
        self.oom_score_adj.get_or_insert(OOM_SCORE_ADJ);
        let ipt = &mut self.iptables;
        ipt.masquerade_bit.get_or_insert(14);
        ipt.localhost_node_ports.get_or_insert(true);
        ipt.sync_period.get_or_insert(Duration::from_secs(30));
        ipt.min_sync_period.get_or_insert(Duration::from_secs(1));
        self.ipvs.sync_period.get_or_insert(Duration::from_secs(30));
        let nft = &mut self.nftables;
        nft.masquerade_bit.get_or_insert(14);
        nft.sync_period.get_or_insert(Duration::from_secs(30));
        nft.min_sync_period.get_or_insert(Duration::from_secs(1));
        let ct = &mut self.conntrack;
        ct.max_per_core.get_or_insert(32 * 1024);
        ct.min.get_or_insert(128 * 1024);
        ct.tcp_established_timeout
            .get_or_insert(Duration::from_secs(24 * 3600));
        ct.tcp_close_wait_timeout
            .get_or_insert(Duration::from_secs(3600));
        self.config_sync_period
            .get_or_insert(Duration::from_secs(15 * 60));
        self.client_connection.apply_defaults(5.0, 10);
        self.logging.apply_defaults();
        if self.detect_local_mode.is_empty() {
            self.detect_local_mode = "ClusterCIDR".into();
        }
    }
}

/// `AppendPortIfNeeded`: the default host and port when empty, the port added when missing.
fn with_port(addr: &str, default_host: &str, port: u16) -> String {
    if addr.is_empty() {
        return format!("{default_host}:{port}");
    }
    match addr.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => format!("{ip}:{port}"),
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        Err(_) => addr.to_string(),
    }
}

impl SvcProxyConfiguration {
    fn validate_defaulted(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        let e = &mut errors;
        let root = Path::root("");
        self.validate_iptables(e);
        match self.mode.as_str() {
            "ipvs" => self.validate_ipvs(e),
            "nftables" => self.validate_nftables(e),
            _ => {}
        }
        self.validate_conntrack(e);
        if !self.mode.is_empty() && !MODES.contains(&self.mode.as_str()) {
            e.not_supported("mode", &self.mode, MODES);
        }
        self.client_connection
            .validate(&root.child("clientConnection"), e);
        positive(e, &root.child("configSyncPeriod"), self.config_sync_period);
        if self.bind_address.parse::<IpAddr>().is_err() {
            invalid(
                e,
                &root.child("bindAddress"),
                &self.bind_address,
                "not a valid textual representation of an IP address",
            );
        }
        validate_host_port(
            e,
            &root.child("healthzBindAddress"),
            &self.healthz_bind_address,
        );
        validate_host_port(
            e,
            &root.child("metricsBindAddress"),
            &self.metrics_bind_address,
        );
        self.validate_cluster_cidr(e);
        if !self.port_range.is_empty() && !port_range_ok(&self.port_range) {
            invalid(
                e,
                &root.child("portRange"),
                &self.port_range,
                "must be a valid port range (e.g. 300-2000)",
            );
        }
        self.validate_node_port_addresses(e);
        if !self.show_hidden_metrics_for_version.is_empty()
            && !minor_version_ok(&self.show_hidden_metrics_for_version)
        {
            invalid(
                e,
                &root.child("showHiddenMetricsForVersion"),
                &self.show_hidden_metrics_for_version,
                "must be a previous minor version, for example 1.29",
            );
        }
        if let Some(adj) = self.oom_score_adj.filter(|a| !(-1000..=1000).contains(a)) {
            invalid(
                e,
                &root.child("oomScoreAdj"),
                adj,
                "must be within the range [-1000, 1000]",
            );
        }
        let detect = root.child("detectLocal");
        match self.detect_local_mode.as_str() {
            "BridgeInterface" => interface(
                e,
                &detect.child("bridgeInterface"),
                &self.detect_local.bridge_interface,
            ),
            "InterfaceNamePrefix" => interface(
                e,
                &detect.child("interfaceNamePrefix"),
                &self.detect_local.interface_name_prefix,
            ),
            "ClusterCIDR" | "NodeCIDR" => {}
            other => e.not_supported("detectLocalMode", other, LOCAL_MODES),
        }
        self.logging
            .validate(&self.feature_gates, &root.child("logging"), e);
        errors
    }

    fn validate_iptables(&self, e: &mut ErrorList) {
        let p = Path::root("iptables");
        let c = &self.iptables;
        masquerade_bit(e, &p, c.masquerade_bit);
        sync_periods(e, &p, c.sync_period, c.min_sync_period);
    }

    fn validate_nftables(&self, e: &mut ErrorList) {
        let p = Path::root("nftables");
        let c = &self.nftables;
        masquerade_bit(e, &p, c.masquerade_bit);
        sync_periods(e, &p, c.sync_period, c.min_sync_period);
    }

    fn validate_ipvs(&self, e: &mut ErrorList) {
        let p = Path::root("ipvs");
        let c = &self.ipvs;
        sync_periods(e, &p, c.sync_period, c.min_sync_period);
        if !c.scheduler.is_empty() && !IPVS_SCHEDULERS.contains(&c.scheduler.as_str()) {
            e.not_supported(p.child("scheduler").as_str(), &c.scheduler, IPVS_SCHEDULERS);
        }
        non_negative(e, &p.child("tcpTimeout"), c.tcp_timeout);
        non_negative(e, &p.child("tcpFinTimeout"), c.tcp_fin_timeout);
        non_negative(e, &p.child("udpTimeout"), c.udp_timeout);
        for (i, cidr) in c.exclude_cidrs.iter().enumerate() {
            if parse_cidr(cidr).is_none() {
                invalid(
                    e,
                    &p.child("excludeCIDRs").index(i),
                    cidr,
                    "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
                );
            }
        }
    }

    fn validate_conntrack(&self, e: &mut ErrorList) {
        let p = Path::root("conntrack");
        let c = &self.conntrack;
        for (name, value) in [("maxPerCore", c.max_per_core), ("min", c.min)] {
            if let Some(v) = value.filter(|v| *v < 0) {
                invalid(e, &p.child(name), v, "must be greater than or equal to 0");
            }
        }
        non_negative(
            e,
            &p.child("tcpEstablishedTimeout"),
            c.tcp_established_timeout,
        );
        non_negative(e, &p.child("tcpCloseWaitTimeout"), c.tcp_close_wait_timeout);
        non_negative(e, &p.child("udpTimeout"), c.udp_timeout);
        non_negative(e, &p.child("udpStreamTimeout"), c.udp_stream_timeout);
    }

    fn validate_cluster_cidr(&self, e: &mut ErrorList) {
        if self.cluster_cidr.is_empty() {
            return;
        }
        let path = Path::root("clusterCIDR");
        let cidrs: Vec<&str> = self.cluster_cidr.split(',').collect();
        match cidrs.as_slice() {
            [one] => {
                if parse_cidr(one).is_none() {
                    invalid(
                        e,
                        &path,
                        &self.cluster_cidr,
                        "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
                    );
                }
            }
            [a, b] => {
                let dual = match (parse_cidr(a), parse_cidr(b)) {
                    (Some((a, _)), Some((b, _))) => a.is_ipv4() != b.is_ipv4(),
                    _ => false,
                };
                if !dual {
                    invalid(
                        e,
                        &path,
                        &self.cluster_cidr,
                        "must be a valid DualStack CIDR (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)",
                    );
                }
            }
            _ => invalid(
                e,
                &path,
                &self.cluster_cidr,
                "only one CIDR allowed or a valid DualStack CIDR (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)",
            ),
        }
    }

    fn validate_node_port_addresses(&self, e: &mut ErrorList) {
        let path = Path::root("nodePortAddresses");
        let addrs = &self.node_port_addresses;
        for (i, addr) in addrs.iter().enumerate() {
            if addr == "primary" {
                if addrs.len() > 1 {
                    invalid(
                        e,
                        &path.index(i),
                        addr,
                        "can't use both 'primary' and CIDRs",
                    );
                }
                continue;
            }
            if parse_cidr(addr).is_none() {
                invalid(e, &path.index(i), addr, "must be a valid CIDR or 'primary'");
            }
        }
    }
}

fn masquerade_bit(e: &mut ErrorList, p: &Path, bit: Option<i32>) {
    if let Some(bit) = bit.filter(|b| !(0..=31).contains(b)) {
        invalid(
            e,
            &p.child("masqueradeBit"),
            bit,
            "must be within the range [0, 31]",
        );
    }
}

fn sync_periods(e: &mut ErrorList, p: &Path, sync: Option<Duration>, min: Option<Duration>) {
    positive(e, &p.child("syncPeriod"), sync);
    non_negative(e, &p.child("minSyncPeriod"), min);
    if let (Some(sync), Some(min)) = (sync, min)
        && sync > Duration::default()
        && min > sync
    {
        invalid(
            e,
            &p.child("syncPeriod"),
            sync,
            &format!(
                "must be greater than or equal to {}",
                p.child("minSyncPeriod")
            ),
        );
    }
}

fn interface(e: &mut ErrorList, path: &Path, name: &str) {
    if name.is_empty() {
        e.required(path.as_str(), "must not be empty");
    }
}

/// `utilnet.ParsePortRange`: `N`, `N-M` or `N+K` with ports up to 65535.
fn port_range_ok(text: &str) -> bool {
    let port = |s: &str| {
        !s.is_empty()
            && s.len() <= 5
            && s.bytes().all(|b| b.is_ascii_digit())
            && s.parse::<u32>().is_ok_and(|p| p <= 65535)
    };
    let text = text.trim();
    if let Some((a, b)) = text.split_once('-') {
        port(a) && port(b) && a.parse::<u32>().ok() <= b.parse::<u32>().ok()
    } else if let Some((a, b)) = text.split_once('+') {
        port(a)
            && port(b)
            && a.parse::<u32>()
                .unwrap_or(0)
                .saturating_add(b.parse::<u32>().unwrap_or(0))
                <= 65535
    } else {
        port(text)
    }
}

/// `MAJOR.MINOR`, as `--show-hidden-metrics-for-version` takes it.
fn minor_version_ok(text: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit());
    text.split_once('.')
        .is_some_and(|(major, minor)| digits(major) && digits(minor))
}
