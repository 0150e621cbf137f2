//! The component configuration kinds and the tracing configuration through the catalog, as
//! `svc-gateway validate-config` sees them: per kind a valid document, invalid ones with the
//! exact field paths they report, and the golden `--print-defaults` output
//! (`UPDATE_GOLDEN=1 cargo test -p svc-core --test config_kinds` rewrites the golden files,
//! which are then reviewed against Kubernetes' defaults).
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::path::PathBuf;

use svc_config::{ConfigError, catalog, parse_document};

fn load(doc: &str) -> Result<serde_json::Value, ConfigError> {
    catalog::load_any(parse_document(doc.as_bytes())?)
}

/// `doc` must be refused with exactly these field paths, in order.
#[track_caller]
fn refused(doc: &str, fields: &[&str]) {
    let err = load(doc).expect_err(doc);
    let got: Vec<&str> = err.errors.0.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(got, fields, "{doc}\n{:#?}", err.lines());
}

#[track_caller]
fn accepted(doc: &str) -> serde_json::Value {
    load(doc).unwrap_or_else(|e| panic!("{doc}\n{:#?}", e.lines()))
}

fn defaults_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/config/defaults")
}

/// What a kind needs beyond its type meta to be valid; kinds not listed need nothing.
const MINIMAL: &[(&str, &str)] = &[
    (
        "ExecCredential",
        "spec:\n  interactive: false\nstatus:\n  token: my-bearer-token\n",
    ),
    (
        "Configuration",
        "limits:\n- type: Namespace\n  qps: 50\n  burst: 100\n- type: Server\n  qps: 5000\n  \
         burst: 20000\n",
    ),
    (
        "AuthorizationConfiguration",
        "authorizers:\n- type: Webhook\n  name: policy\n  webhook:\n    timeout: 3s\n    \
         subjectAccessReviewVersion: v1\n    matchConditionSubjectAccessReviewVersion: v1\n    \
         failurePolicy: Deny\n    connectionInfo:\n      type: SvcConfig\n      \
         svcConfigFile: /etc/svc/authz.kubeconfig\n- type: AlwaysDeny\n  name: rest\n",
    ),
    (
        "ImageReview",
        "spec:\n  containers:\n  - image: registry.example/app:1.0\n",
    ),
    (
        "Event",
        "level: Metadata\nauditID: 0a4376d5-54c2-4ed4-a4d4-3d2b0a5c7f2e\nstage: ResponseComplete\n\
         requestURI: /api/v1/namespaces\nverb: list\nuser:\n  username: admin\n\
         requestReceivedTimestamp: \"2026-11-23T17:00:00.000000Z\"\n\
         stageTimestamp: \"2026-11-23T17:00:00.001000Z\"\n",
    ),
    (
        "AdmissionReview",
        "response:\n  uid: 705ab4f5-6393-11e8-b7cc-42010a800002\n  allowed: true\n",
    ),
];

/// The golden file of a kind (`Configuration` alone is ambiguous, so the group is added).
fn golden_name(api_version: &str, kind: &str) -> String {
    match api_version.split_once('.') {
        Some((group, _)) if kind == "Configuration" => format!("{group}.{kind}.yaml"),
        _ => format!("{kind}.yaml"),
    }
}

#[test]
fn print_defaults_matches_the_golden_files() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    for entry in catalog::KINDS {
        let version = entry.api_versions[0];
        let body = MINIMAL
            .iter()
            .find(|(k, _)| *k == entry.kind)
            .map_or("", |(_, b)| *b);
        let doc = format!("apiVersion: {version}\nkind: {}\n{body}", entry.kind);
        let value = accepted(&doc);
        let yaml = String::from_utf8(catalog::to_yaml(&value).unwrap()).unwrap();
        let path = defaults_dir().join(golden_name(version, entry.kind));
        if update {
            std::fs::write(&path, &yaml).unwrap();
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
        assert_eq!(yaml, golden, "{}", entry.kind);
        // The defaulted document is itself valid and a fixed point of defaulting.
        assert_eq!(accepted(&yaml), value, "{}", entry.kind);
    }
}

const PROXY: &str = "apiVersion: svcproxy.config.svc.io/v1alpha1\nkind: SvcProxyConfiguration\n";
const SCHEDULER: &str =
    "apiVersion: svcscheduler.config.svc.io/v1\nkind: SvcSchedulerConfiguration\n";
const CCM: &str = "apiVersion: cloudcontrollermanager.config.svc.io/v1alpha1\n\
                   kind: CloudControllerManagerConfiguration\n";
const TRACING: &str = "apiVersion: apiserver.svc.io/v1beta1\nkind: TracingConfiguration\n";

fn with(head: &str, body: &str) -> String {
    format!("{head}{body}")
}

#[test]
fn proxy_configuration() {
    let ok = accepted(&with(
        PROXY,
        "mode: ipvs\nbindAddress: \"::\"\nclusterCIDR: 10.244.0.0/16,fd00:10:244::/56\n\
         nodePortAddresses: [primary]\noomScoreAdj: -1000\niptables:\n  masqueradeBit: 31\n  \
         minSyncPeriod: 0s\nipvs:\n  scheduler: wrr\n  excludeCIDRs: [10.0.0.0/8]\n  tcpTimeout: 0s\n\
         conntrack:\n  maxPerCore: 0\n  udpTimeout: 0s\nlogging:\n  format: json\n  flushFrequency: 1000000000\n",
    ));
    // An IPv6 bind address moves the default health and metrics addresses to IPv6.
    assert_eq!(ok["healthzBindAddress"], "[::]:10256");
    assert_eq!(ok["metricsBindAddress"], "[::1]:10249");
    // A written zero is kept: resync on every change.
    assert_eq!(ok["iptables"]["minSyncPeriod"], "0s");
    assert_eq!(ok["logging"]["flushFrequency"], 1_000_000_000);
    // A host without a port gets the default port.
    let ok = accepted(&with(PROXY, "healthzBindAddress: 127.0.0.1\n"));
    assert_eq!(ok["healthzBindAddress"], "127.0.0.1:10256");
    accepted(&with(
        PROXY,
        "nodePortAddresses: [10.0.0.0/8, \"fd00::/64\"]\n",
    ));
    accepted(&with(
        PROXY,
        "iptables:\n  syncPeriod: 1s\n  minSyncPeriod: 1s\n",
    ));

    for (body, fields) in [
        (
            "iptables:\n  masqueradeBit: 32\n",
            &["iptables.masqueradeBit"][..],
        ),
        (
            "iptables:\n  masqueradeBit: -1\n",
            &["iptables.masqueradeBit"],
        ),
        (
            "nftables:\n  masqueradeBit: 40\nmode: nftables\n",
            &["nftables.masqueradeBit"],
        ),
        ("oomScoreAdj: 1001\n", &["oomScoreAdj"]),
        ("oomScoreAdj: -1001\n", &["oomScoreAdj"]),
        ("iptables:\n  syncPeriod: 0s\n", &["iptables.syncPeriod"]),
        (
            "iptables:\n  minSyncPeriod: -1s\n",
            &["iptables.minSyncPeriod"],
        ),
        // The minimum above the period is reported on the period, as Kubernetes does.
        (
            "iptables:\n  syncPeriod: 1s\n  minSyncPeriod: 2s\n",
            &["iptables.syncPeriod"],
        ),
        (
            "mode: ipvs\nipvs:\n  syncPeriod: 0s\n  scheduler: fastest\n  udpTimeout: -1s\n",
            &["ipvs.syncPeriod", "ipvs.scheduler", "ipvs.udpTimeout"],
        ),
        (
            "mode: ipvs\nipvs:\n  excludeCIDRs: [10.0.0.0/8, 10.0.0.0]\n",
            &["ipvs.excludeCIDRs[1]"],
        ),
        ("configSyncPeriod: 0s\n", &["configSyncPeriod"]),
        (
            "conntrack:\n  min: -1\n  tcpCloseWaitTimeout: -1s\n",
            &["conntrack.min", "conntrack.tcpCloseWaitTimeout"],
        ),
        ("mode: userspace\n", &["mode"]),
        (
            "clientConnection:\n  burst: -1\n",
            &["clientConnection.burst"],
        ),
        ("bindAddress: nowhere\n", &["bindAddress"]),
        (
            "metricsBindAddress: 127.0.0.1:99999\n",
            &["metricsBindAddress"],
        ),
        (
            "healthzBindAddress: \"host:10256\"\n",
            &["healthzBindAddress"],
        ),
        ("clusterCIDR: 10.0.0.0/8,10.1.0.0/16\n", &["clusterCIDR"]),
        (
            "clusterCIDR: 10.0.0.0/8,fd00::/64,10.1.0.0/16\n",
            &["clusterCIDR"],
        ),
        ("clusterCIDR: 10.0.0.0/33\n", &["clusterCIDR"]),
        (
            "nodePortAddresses: [primary, 10.0.0.0/8]\n",
            &["nodePortAddresses[0]"],
        ),
        ("nodePortAddresses: [10.0.0.1]\n", &["nodePortAddresses[0]"]),
        ("portRange: 30000-2\n", &["portRange"]),
        (
            "detectLocalMode: BridgeInterface\n",
            &["detectLocal.bridgeInterface"],
        ),
        ("detectLocalMode: Guess\n", &["detectLocalMode"]),
        ("logging:\n  format: xml\n", &["logging.format"]),
        (
            "logging:\n  options:\n    text:\n      infoBufferSize: 5Mi\n",
            &["logging.options.text.infoBufferSize"],
        ),
        (
            "logging:\n  vmodule:\n  - filePattern: \"a=b\"\n    verbosity: 2\n",
            &["logging.vmodule[0]"],
        ),
        ("iptables:\n  syncPeriod: soon\n", &["iptables.syncPeriod"]),
        (
            "iptables:\n  masqueradeBits: 3\nconntrack:\n  max: 1\n",
            &["iptables.masqueradeBits", "conntrack.max"],
        ),
    ] {
        refused(&with(PROXY, body), fields);
    }
    // The alpha gate allows the text buffer.
    accepted(&with(
        PROXY,
        "featureGates:\n  LoggingAlphaOptions: true\nlogging:\n  options:\n    text:\n      infoBufferSize: 5Mi\n",
    ));
}

#[test]
fn scheduler_configuration() {
    let ok = accepted(&with(
        SCHEDULER,
        "parallelism: 8\npodInitialBackoffSeconds: 2\npodMaxBackoffSeconds: 2\n\
         leaderElection:\n  leaseDuration: 10s\n  renewDeadline: 10s\n\
         profiles:\n- schedulerName: default-scheduler\n  pluginConfig:\n  - name: DefaultPreemption\n    \
         args:\n      minCandidateNodesPercentage: 0\n  - name: NodeResourcesFit\n    args:\n      \
         apiVersion: svcscheduler.config.svc.io/v1\n      kind: NodeResourcesFitArgs\n      \
         scoringStrategy:\n        type: MostAllocated\n  - name: MyPlugin\n    args:\n      anything: [1, 2]\n\
         - schedulerName: other\n  plugins:\n    multiPoint:\n      disabled:\n      - name: ImageLocality\n      \
         enabled:\n      - name: TaintToleration\n        weight: 9\n      - name: MyPlugin\n\
         extenders:\n- urlPrefix: http://127.0.0.1:8888\n  prioritizeVerb: prioritize\n  weight: 1\n  bindVerb: bind\n",
    ));
    let profiles = ok["profiles"].as_array().unwrap();
    let args = &profiles[0]["pluginConfig"][0]["args"];
    assert_eq!(args["minCandidateNodesPercentage"], 0);
    assert_eq!(args["minCandidateNodesAbsolute"], 100);
    assert_eq!(args["kind"], "DefaultPreemptionArgs");
    let fit = &profiles[0]["pluginConfig"][1]["args"]["scoringStrategy"];
    assert_eq!(fit["type"], "MostAllocated");
    assert_eq!(fit["resources"][0]["name"], "cpu");
    assert_eq!(profiles[0]["pluginConfig"][2]["args"]["anything"][1], 2);
    // The second profile: ImageLocality gone, TaintToleration re-weighted in place, its own
    // plugin appended; the default arguments of the enabled plugins are filled.
    let enabled: Vec<(String, Option<i64>)> = profiles[1]["plugins"]["multiPoint"]["enabled"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["weight"].as_i64(),
            )
        })
        .collect();
    assert!(!enabled.iter().any(|(n, _)| n == "ImageLocality"));
    assert_eq!(enabled[4], ("TaintToleration".to_string(), Some(9)));
    assert_eq!(enabled.last().unwrap().0, "MyPlugin");
    assert_eq!(profiles[1]["pluginConfig"].as_array().unwrap().len(), 7);

    for (body, fields) in [
        ("parallelism: 0\n", &["parallelism"][..]),
        (
            "podInitialBackoffSeconds: 0\n",
            &["podInitialBackoffSeconds"],
        ),
        (
            "podInitialBackoffSeconds: 5\npodMaxBackoffSeconds: 4\n",
            &["podMaxBackoffSeconds"],
        ),
        ("podMaxBackoffSeconds: 0\n", &["podMaxBackoffSeconds"]),
        (
            "percentageOfNodesToScore: 101\n",
            &["percentageOfNodesToScore"],
        ),
        (
            "leaderElection:\n  leaseDuration: 5s\n",
            &["leaderElection.renewDeadline"],
        ),
        (
            "leaderElection:\n  retryPeriod: 0s\n",
            &["leaderElection.retryPeriod"],
        ),
        (
            "leaderElection:\n  resourceLock: endpoints\n",
            &["leaderElection.resourceLock"],
        ),
        (
            "clientConnection:\n  burst: -5\n",
            &["clientConnection.burst"],
        ),
        (
            "profiles:\n- schedulerName: a\n- schedulerName: a\n",
            &["profiles[1].schedulerName"],
        ),
        (
            "profiles:\n- percentageOfNodesToScore: -1\n- schedulerName: b\n",
            &[
                "profiles[0].schedulerName",
                "profiles[0].percentageOfNodesToScore",
            ],
        ),
        (
            "profiles:\n- schedulerName: a\n  plugins:\n    queueSort:\n      enabled: [{name: PrioritySort}]\n\
          - schedulerName: b\n",
            &["profiles[1].plugins.queueSort"],
        ),
        (
            "profiles:\n- pluginConfig:\n  - name: DefaultPreemption\n    args:\n      minCandidateNodesPercentage: 101\n",
            &["profiles[0].pluginConfig[0].args.minCandidateNodesPercentage"],
        ),
        (
            "profiles:\n- pluginConfig:\n  - name: InterPodAffinity\n    args: {hardPodAffinityWeight: 1}\n  \
          - name: InterPodAffinity\n    args: {}\n",
            &["profiles[0].pluginConfig[1]"],
        ),
        (
            "profiles:\n- pluginConfig:\n  - name: VolumeBinding\n    args:\n      kind: InterPodAffinityArgs\n",
            &["profiles[0].pluginConfig[0].args.kind"],
        ),
        (
            "profiles:\n- pluginConfig:\n  - name: VolumeBinding\n    args:\n      bindTimeout: 5\n",
            &["profiles[0].pluginConfig[0].args.bindTimeout"],
        ),
        (
            "extenders:\n- urlPrefix: http://a\n  prioritizeVerb: p\n",
            &["extenders[0].weight"],
        ),
        (
            "extenders:\n- urlPrefix: http://a\n  bindVerb: b\n- urlPrefix: http://b\n  bindVerb: b\n",
            &["extenders"],
        ),
        (
            "extenders:\n- urlPrefix: http://a\n  managedResources:\n  - name: example.com/gpu\n  \
          - name: example.com/gpu\n  - name: cpu\n",
            &[
                "extenders[0].managedResources[1].name",
                "extenders[0].managedResources[2].name",
            ],
        ),
        ("profile: []\n", &["profile"]),
    ] {
        refused(&with(SCHEDULER, body), fields);
    }
}

#[test]
fn scheduler_plugin_argument_kinds() {
    let head = |kind: &str| format!("apiVersion: svcscheduler.config.svc.io/v1\nkind: {kind}\n");
    for (kind, body) in [
        (
            "DefaultPreemptionArgs",
            "minCandidateNodesPercentage: 0\nminCandidateNodesAbsolute: 1\n",
        ),
        (
            "InterPodAffinityArgs",
            "hardPodAffinityWeight: 100\nignorePreferredTermsOfExistingPods: true\n",
        ),
        (
            "NodeAffinityArgs",
            "addedAffinity:\n  requiredDuringSchedulingIgnoredDuringExecution:\n    \
          nodeSelectorTerms:\n    - matchExpressions:\n      - {key: zone, operator: In, values: [a]}\n      \
          - {key: rank, operator: Gt, values: [\"3\"]}\n      matchFields:\n      \
          - {key: metadata.name, operator: In, values: [n1]}\n  \
          preferredDuringSchedulingIgnoredDuringExecution:\n  - weight: 100\n    preference:\n      \
          matchExpressions: [{key: ssd, operator: Exists}]\n",
        ),
        (
            "NodeResourcesBalancedAllocationArgs",
            "resources: [{name: cpu, weight: 1}, {name: example.com/gpu}]\n",
        ),
        (
            "NodeResourcesFitArgs",
            "ignoredResources: [example.com/foo]\nignoredResourceGroups: [example.com]\n\
          scoringStrategy:\n  type: RequestedToCapacityRatio\n  resources: [{name: cpu, weight: 100}]\n  \
          requestedToCapacityRatio:\n    shape: [{utilization: 0, score: 0}, {utilization: 100, score: 10}]\n",
        ),
        (
            "PodTopologySpreadArgs",
            "defaultingType: List\ndefaultConstraints:\n- maxSkew: 1\n  \
          topologyKey: topology.svc.io/zone\n  whenUnsatisfiable: ScheduleAnyway\n",
        ),
        ("VolumeBindingArgs", "bindTimeoutSeconds: 0\n"),
    ] {
        let ok = accepted(&format!("{}{body}", head(kind)));
        assert_eq!(ok["kind"], kind);
    }
    for (kind, body, fields) in [
        (
            "DefaultPreemptionArgs",
            "minCandidateNodesPercentage: 101\nminCandidateNodesAbsolute: -1\n",
            &["minCandidateNodesPercentage", "minCandidateNodesAbsolute"][..],
        ),
        (
            "DefaultPreemptionArgs",
            "minCandidateNodesPercentage: 0\nminCandidateNodesAbsolute: 0\n",
            &["minCandidateNodesPercentage", "minCandidateNodesAbsolute"],
        ),
        (
            "InterPodAffinityArgs",
            "hardPodAffinityWeight: 101\n",
            &["hardPodAffinityWeight"],
        ),
        (
            "NodeAffinityArgs",
            "addedAffinity:\n  requiredDuringSchedulingIgnoredDuringExecution:\n    \
          nodeSelectorTerms:\n    - matchExpressions:\n      - {key: zone, operator: In}\n      \
          - {key: zone, operator: Near, values: [a]}\n      matchFields:\n      - {key: spec.nodeName, operator: In, values: [a]}\n",
            &[
                "addedAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values",
                "addedAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[1].operator",
                "addedAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].key",
            ],
        ),
        (
            "NodeAffinityArgs",
            "addedAffinity:\n  preferredDuringSchedulingIgnoredDuringExecution:\n  - weight: 0\n    \
          preference: {matchExpressions: [{key: a, operator: Exists, values: [x]}]}\n",
            &[
                "addedAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
                "addedAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchExpressions[0].values",
            ],
        ),
        (
            "NodeResourcesBalancedAllocationArgs",
            "resources: [{name: cpu, weight: 2}, {name: cpu}]\n",
            &["resources[0].weight", "resources[1].name"],
        ),
        (
            "NodeResourcesFitArgs",
            "ignoredResourceGroups: [example.com/x]\nscoringStrategy:\n  type: Random\n  \
          resources: [{name: cpu, weight: 101}]\n",
            &[
                "ignoredResourceGroups[0]",
                "scoringStrategy.type",
                "scoringStrategy.resources[0].weight",
            ],
        ),
        (
            "NodeResourcesFitArgs",
            "scoringStrategy:\n  type: RequestedToCapacityRatio\n",
            &["scoringStrategy.requestedToCapacityRatio"],
        ),
        (
            "NodeResourcesFitArgs",
            "scoringStrategy:\n  type: RequestedToCapacityRatio\n  requestedToCapacityRatio:\n    \
          shape: [{utilization: 50, score: 11}, {utilization: 40, score: 1}]\n",
            &[
                "scoringStrategy.requestedToCapacityRatio.shape[1].utilization",
                "scoringStrategy.requestedToCapacityRatio.shape[0].score",
            ],
        ),
        (
            "PodTopologySpreadArgs",
            "defaultConstraints:\n- maxSkew: 1\n  topologyKey: zone\n  whenUnsatisfiable: DoNotSchedule\n",
            &["defaultingType"],
        ),
        (
            "PodTopologySpreadArgs",
            "defaultingType: List\ndefaultConstraints:\n- maxSkew: 0\n  topologyKey: \"\"\n  \
          whenUnsatisfiable: Maybe\n  labelSelector: {}\n- maxSkew: 1\n  topologyKey: zone\n  whenUnsatisfiable: DoNotSchedule\n\
          - maxSkew: 1\n  topologyKey: zone\n  whenUnsatisfiable: DoNotSchedule\n",
            &[
                "defaultConstraints[0].maxSkew",
                "defaultConstraints[0].topologyKey",
                "defaultConstraints[0].whenUnsatisfiable",
                "defaultConstraints[0].labelSelector",
                "defaultConstraints[2]",
            ],
        ),
        (
            "PodTopologySpreadArgs",
            "defaultingType: Auto\n",
            &["defaultingType"],
        ),
        (
            "VolumeBindingArgs",
            "bindTimeoutSeconds: -1\nshape: [{utilization: 0, score: 0}]\n",
            &["bindTimeoutSeconds", "shape"],
        ),
        (
            "VolumeBindingArgs",
            "bindTimeoutSecond: 1\n",
            &["bindTimeoutSecond"],
        ),
    ] {
        refused(&format!("{}{body}", head(kind)), fields);
    }
}

#[test]
fn cloud_controller_manager_configuration() {
    let ok = accepted(&with(
        CCM,
        "Generic:\n  Port: 10258\n  Controllers: [\"*\", \"-route\"]\n  ClientConnection:\n    qps: 100\n  \
         LeaderElection:\n    leaderElect: false\n  Debugging:\n    enableProfiling: true\n\
         KubeCloudShared:\n  CloudProvider:\n    Name: external\n    CloudConfigFile: /etc/cloud.conf\n  \
         ClusterCIDR: 10.0.0.0/8,fd00::/48\n  AllocateNodeCIDRs: true\n\
         NodeController:\n  ConcurrentNodeSyncs: 5\nNodeStatusUpdateFrequency: 1m\nWebhook:\n  Webhooks: [\"*\"]\n",
    ));
    assert_eq!(ok["Generic"]["ClientConnection"]["qps"], 100.0);
    assert_eq!(ok["Generic"]["ClientConnection"]["burst"], 30);
    assert_eq!(ok["ServiceController"]["ConcurrentServiceSyncs"], 1);
    assert_eq!(ok["NodeStatusUpdateFrequency"], "1m0s");
    for (body, fields) in [
        ("Generic:\n  Port: 70000\n", &["Generic.Port"][..]),
        (
            "Generic:\n  Address: here\n  MinResyncPeriod: 0s\n",
            &["Generic.Address", "Generic.MinResyncPeriod"],
        ),
        (
            "Generic:\n  LeaderElection:\n    leaseDuration: 1s\n",
            &["Generic.LeaderElection.renewDeadline"],
        ),
        (
            "Generic:\n  Controllers: [\"-\"]\n",
            &["Generic.Controllers[0]"],
        ),
        (
            "Generic:\n  LeaderMigrationEnabled: true\n  LeaderMigration:\n    controllerLeaders:\n    \
          - {name: route, component: \"\"}\n",
            &[
                "Generic.LeaderMigration.leaderName",
                "Generic.LeaderMigration.controllerLeaders[0].component",
            ],
        ),
        (
            "KubeCloudShared:\n  AllocateNodeCIDRs: true\n  RouteReconciliationPeriod: -1s\n",
            &[
                "KubeCloudShared.RouteReconciliationPeriod",
                "KubeCloudShared.ClusterCIDR",
            ],
        ),
        (
            "KubeCloudShared:\n  ClusterCIDR: 10.0.0.0\n",
            &["KubeCloudShared.ClusterCIDR"],
        ),
        (
            "NodeController:\n  ConcurrentNodeSyncs: -1\n",
            &["NodeController.ConcurrentNodeSyncs"],
        ),
        (
            "NodeStatusUpdateFrequency: -1s\n",
            &["NodeStatusUpdateFrequency"],
        ),
        ("Webhook:\n  Webhooks: [\"-*\"]\n", &["Webhook.Webhooks[0]"]),
        // The Go fields are PascalCase: camelCase spellings are unknown fields.
        (
            "generic: {}\nKubeCloudShared:\n  cloudProvider: {}\n",
            &["generic", "KubeCloudShared.cloudProvider"],
        ),
    ] {
        refused(&with(CCM, body), fields);
    }
}

#[test]
fn tracing_configuration() {
    for version in ["v1beta1", "v1alpha1", "v1"] {
        let ok = accepted(&format!(
            "apiVersion: apiserver.svc.io/{version}\nkind: TracingConfiguration\n\
             endpoint: collector.example:4317\nsamplingRatePerMillion: 1000000\n"
        ));
        assert_eq!(ok["samplingRatePerMillion"], 1_000_000);
        assert_eq!(ok["apiVersion"], format!("apiserver.svc.io/{version}"));
    }
    accepted(&with(
        TRACING,
        "endpoint: \"http://collector:4317\"\nsamplingRatePerMillion: 0\n",
    ));
    accepted(&with(TRACING, "endpoint: \"[::1]:4317\"\n"));
    for (body, fields) in [
        (
            "samplingRatePerMillion: 1000001\n",
            &["samplingRatePerMillion"][..],
        ),
        ("samplingRatePerMillion: -1\n", &["samplingRatePerMillion"]),
        ("endpoint: \"\"\n", &["endpoint"]),
        ("endpoint: \"[::1:4317\"\n", &["endpoint"]),
        ("endpoint: \"a b:1\"\n", &["endpoint"]),
        // The collector is dialled without TLS, at a named host.
        ("endpoint: \"https://collector:4317\"\n", &["endpoint"]),
        ("endpoint: \"dns:///collector:4317\"\n", &["endpoint"]),
        ("endpoint: \":4317\"\n", &["endpoint"]),
        (
            "samplingRatePerMillion: 3000000000\n",
            &["samplingRatePerMillion"],
        ),
        ("endpoints: x\n", &["endpoints"]),
    ] {
        refused(&with(TRACING, body), fields);
    }
}

#[test]
fn unknown_kinds_and_versions_name_the_field() {
    refused(
        "apiVersion: svcproxy.config.svc.io/v1\nkind: SvcProxyConfiguration\n",
        &["apiVersion"],
    );
    refused("apiVersion: example.com/v1\nkind: Frobnicator\n", &["kind"]);
    refused("kind: TracingConfiguration\n", &["apiVersion"]);
    refused("apiVersion: apiserver.svc.io/v1\n", &["kind"]);
    refused("- 1\n- 2\n", &[""]);
    // The catalog lists every kind once per version, and each (apiVersion, kind) once.
    let mut seen = std::collections::BTreeSet::new();
    for entry in catalog::KINDS {
        for v in entry.api_versions {
            assert!(seen.insert((*v, entry.kind)), "{v} {}", entry.kind);
            assert!(catalog::find(v, entry.kind).is_some());
        }
    }
}

#[test]
fn messages_read_as_kubernetes_prints_them() {
    let lines = |doc: String| load(&doc).unwrap_err().lines();
    assert_eq!(
        lines(with(
            PROXY,
            "iptables:\n  masqueradeBit: 32\n  syncPeriod: 0s\nmode: userspace\n"
        )),
        [
            "iptables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]",
            "iptables.syncPeriod: Invalid value: \"0s\": must be greater than 0",
            "mode: Unsupported value: \"userspace\": supported values: \"iptables\", \"ipvs\", \
             \"nftables\", \"kernelspace\"",
        ]
    );
    assert_eq!(
        lines(with(
            SCHEDULER,
            "profiles:\n- schedulerName: a\n- schedulerName: a\n"
        )),
        ["profiles[1].schedulerName: Duplicate value: \"profiles[0].schedulerName\""]
    );
    assert_eq!(
        lines(with(
            CCM,
            "Generic:\n  LeaderElection:\n    leaderElect: true\n    leaseDuration: 1s\n"
        )),
        [
            "Generic.LeaderElection.renewDeadline: Invalid value: \"10s\": must be less than or equal \
          to leaseDuration"
        ]
    );
}

#[test]
fn null_reads_as_left_out() {
    let ok = accepted(&with(
        PROXY,
        "iptables: null\nmode: null\nnodePortAddresses: null\nlogging:\n  options: {text: null}\n",
    ));
    assert_eq!(ok["iptables"]["syncPeriod"], "30s");
    assert_eq!(ok["logging"]["options"]["text"]["infoBufferSize"], "0");
    let ok = accepted(&with(SCHEDULER, "profiles: null\nleaderElection: null\n"));
    assert_eq!(ok["profiles"][0]["schedulerName"], "default-scheduler");
    accepted(&with(CCM, "Generic: null\nWebhook: {Webhooks: null}\n"));
    // A null where a value is required is still refused where the rule says so.
    refused(
        &with(
            SCHEDULER,
            "profiles:\n- schedulerName: a\n- schedulerName: null\n",
        ),
        &["profiles[1].schedulerName"],
    );
}

#[test]
fn audit_policy_and_event() {
    let policy = "apiVersion: audit.svc.io/v1\nkind: Policy\n";
    accepted(&with(
        policy,
        "rules:\n- level: Metadata\n  resources:\n  - group: \"\"\n    resources: [\"pods/*\"]\n",
    ));
    refused(
        &with(
            policy,
            "omitStages: [Sometimes]\nrules:\n- level: Loud\n  nonResourceURLs: [\"x*y\"]\n",
        ),
        &[
            "omitStages[0]",
            "rules[0].level",
            "rules[0].nonResourceURLs[0]",
            "rules[0].nonResourceURLs[0]",
        ],
    );
    refused(
        &with(policy, "rules:\n- level: None\n  verb: [get]\n"),
        &["rules[0].verb"],
    );
    refused(
        "apiVersion: audit.svc.io/v1\nkind: Event\nlevel: Metadata\nauditID: \"\"\n\
         stage: Panic\nrequestURI: /\nverb: get\nuser: {}\n\
         requestReceivedTimestamp: \"2026-11-23T17:00:00.000000Z\"\n\
         stageTimestamp: \"2026-11-23T17:00:00.000000Z\"\n",
        &["auditID"],
    );
}
