//! Command-line flags, in the style of the Kubernetes API server.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// The `Store` backend (`--storage-backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StorageBackend {
    Embedded,
    Etcd,
}

#[derive(Clone, Debug, Parser)]
#[command(
    name = "svc-gateway",
    version,
    about = "The svc API server: list and watch at scale."
)]
pub struct Options {
    /// Directory of the embedded store; PKI and admin.kubeconfig are created here too.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,

    /// Proxy mode: the kubeconfig of an existing kube-apiserver to stand in front of (its
    /// current context's server, CA and credential, which is the proxy's own identity). There
    /// is then no local store: every request but the proxy's health probes is passed upstream
    /// with the caller's identity (impersonation). The serving certificate and its CA still
    /// come from the data directory.
    #[arg(long)]
    pub upstream_kubeconfig: Option<PathBuf>,

    /// Proxy mode: a PEM bundle of the CAs whose client certificates authenticate callers (CN
    /// the user, O the groups), as kube-apiserver's flag of that name; usually the upstream's
    /// client CA. Without it only bearer tokens (checked by the upstream) authenticate.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,

    /// Proxy mode: request-header (front-proxy) authentication, as kube-apiserver's flag of
    /// that name: a client certificate of this CA (with a common name of
    /// `--requestheader-allowed-names`, when given) is a front proxy, and the caller is who
    /// its `--requestheader-*-headers` name.
    #[arg(long)]
    pub requestheader_client_ca_file: Option<PathBuf>,

    /// Proxy mode: the common names a front proxy's certificate may have (comma-separated);
    /// empty: any certificate of `--requestheader-client-ca-file`.
    #[arg(long, value_delimiter = ',')]
    pub requestheader_allowed_names: Vec<String>,

    /// Proxy mode: the headers naming a front proxy's caller, the first present wins.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    pub requestheader_username_headers: Vec<String>,

    /// Proxy mode: the headers naming the caller's groups (each value one group).
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    pub requestheader_group_headers: Vec<String>,

    /// Proxy mode: the prefixes of the headers naming the caller's extra attributes
    /// (`X-Remote-Extra-Scopes: a` is extra `scopes` = `a`; keys percent-decoded).
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    pub requestheader_extra_headers_prefix: Vec<String>,

    /// Proxy mode: the headers naming the caller's uid.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Uid")]
    pub requestheader_uid_headers: Vec<String>,

    /// Proxy mode: which upstream resources are cached, and their lists and watches served
    /// from the cache: comma-separated `*` (every resource discovery offers for list and
    /// watch, but Secrets), resource names (`pods`, `deployments.apps`, `secrets`) to add,
    /// and `-name` to leave out. Empty: nothing is cached, every request passes through.
    #[arg(long, default_value = "*")]
    pub cache_resources: String,

    /// Proxy mode: a caller who authenticates with a bearer token reaches the upstream with
    /// that token as its credential (the upstream authenticates it again, and sees the
    /// caller's own `Impersonate-*` headers), instead of the proxy's credential with
    /// impersonation headers. Callers with client certificates are impersonated either way.
    #[arg(long)]
    pub upstream_caller_tokens: bool,

    /// Proxy mode: how long an upstream watch of a cached resource may say nothing (no event,
    /// no bookmark) before it is opened again from where it was, once its resource has been
    /// seen to bookmark. kube-apiserver bookmarks every watch about once a minute, but sends
    /// none for resources it does not watch-cache (Events): their silence is no sign of
    /// trouble, and a dead connection under them is found by h2 PINGs.
    #[arg(long, default_value = "150s", value_parser = parse_duration)]
    pub upstream_watch_idle_timeout: Duration,

    /// Proxy mode: the most long-running requests one user may have passed upstream at once
    /// (watches the caches do not answer, logs with follow, exec, attach, port-forward,
    /// proxy); past it a request is answered 429. Each goes over an upstream connection of
    /// its own, never over the one that carries short requests and the proxy's own calls.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub upstream_long_running_per_user: u32,

    /// Proxy mode: the most long-running requests passed upstream at once, all users
    /// together; past it a request is answered 429.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub upstream_long_running_max: u32,

    /// Proxy mode: the h2 connections to the upstream that short requests passed through
    /// are spread over, in turn. kube-apiserver allows 100 streams on a connection
    /// (`--http2-max-streams-per-connection`); past them a request waits in the proxy for a
    /// stream. One connection is the default: at 3,000 nodes on two cores, 8 let so many
    /// requests into kube-apiserver at once that it answered 429 to 2,224 lease renewals
    /// and 2,997 of the nodes were Ready after 8 minutes, where with one it answered none and
    /// all were Ready in 4 (BENCHMARKS, "A simulated cluster"). Raise it for an upstream
    /// with cores to spare.
    /// The proxy's own calls (TokenReviews, SubjectAccessReviews) have a connection of their
    /// own beside them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub upstream_connections: u32,

    /// Proxy mode: the most short requests one user may have passed upstream at once (writes,
    /// and reads the caches do not answer), each held until the upstream's answer has been
    /// sent on; past it a request is answered 429. They take no seat of
    /// `--max-requests-inflight` or `--max-mutating-requests-inflight`, which bound what the
    /// proxy serves itself: the upstream's own limits and priorities judge them.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub upstream_requests_per_user: u32,

    /// Proxy mode: the most short requests passed upstream at once, all users together;
    /// past it a request is answered 429.
    #[arg(long, default_value_t = 4_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub upstream_requests_max: u32,

    /// Address to serve HTTPS on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: IpAddr,

    /// Port to serve HTTPS on (0 picks a free port).
    #[arg(long, default_value_t = 6443)]
    pub secure_port: u16,

    /// Directory of the CA, serving certificate and keys (default: <data-dir>/pki).
    #[arg(long)]
    pub cert_dir: Option<PathBuf>,

    /// Extra names (DNS or IP) for the serving certificate; repeatable or comma-separated.
    #[arg(long = "tls-san", value_delimiter = ',')]
    pub tls_sans: Vec<String>,

    /// Plain-HTTP port on 127.0.0.1 without authentication, for loopback load tests only
    /// (0 disables it). Every request on it acts as a member of `system:masters`.
    #[arg(long, default_value_t = 0)]
    pub insecure_port: u16,

    /// Read-only requests in flight at once (watches and `system:masters` not counted); past
    /// it, a request waits in its user's queue (`--max-queued-requests-per-user`,
    /// `--max-queue-wait`), then 429 with `Retry-After`. 0: no limit.
    #[arg(long, default_value_t = 400)]
    pub max_requests_inflight: usize,

    /// Mutating requests (create, update, patch, delete) in flight at once; 0: no limit.
    #[arg(long, default_value_t = 200)]
    pub max_mutating_requests_inflight: usize,

    /// Lists run on threads of their own this many steps nicer (`nice(1)`, up to 19) than the
    /// request threads, so that writes, gets and watches are scheduled ahead of them when the
    /// CPUs are busy: over HTTP/1.1 from their handler to their response's last byte; over h2
    /// their handler and the handing of their body to h2. 0: lists run on the request threads.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=19))]
    pub list_niceness: u8,

    /// Watches open at once (`system:masters` not counted); past it, a new watch gets 429
    /// with `Retry-After`. Each costs a task and a small queue, not a seat of the limits
    /// above. 0: no limit.
    #[arg(long, default_value_t = 100_000)]
    pub max_watches: usize,

    /// Requests one user may have waiting for a seat when the inflight limits are reached;
    /// past it, 429 (`queue-full`). 0: no queueing, a full limit answers 429 at once.
    #[arg(long, default_value_t = 50)]
    pub max_queued_requests_per_user: usize,

    /// Users that may have requests waiting at once (per limit); a request of another user
    /// then gets 429 (`queue-full`). A large cluster has a user per node (`system:node:*`),
    /// each with a request or two at a time: thousands of them may wait together, as in
    /// Kubernetes' API Priority and Fairness, whose queues users share by hash.
    #[arg(long, default_value_t = 4096)]
    pub max_queued_users: usize,

    /// Requests that may wait at once, all users together (per limit); past it, 429
    /// (`queue-full`). The default is what one of Kubernetes' priority levels holds (64
    /// queues of 50).
    #[arg(long, default_value_t = 3200)]
    pub max_queued_requests: usize,

    /// Longest wait for a seat; then 429 (`time-out`). Freed seats go round-robin across the
    /// users waiting.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub max_queue_wait: Duration,

    /// Unauthenticated requests as `system:anonymous`: `true` everywhere (authorization then
    /// lets them read health and version only), `false` nowhere. Unset, as Kubernetes behaves
    /// by default: only GETs of `/healthz`, `/livez`, `/readyz` (and their checks) and
    /// `/version` are anonymous, so load balancers can probe without a certificate; anything
    /// else without a credential is 401.
    #[arg(long, action = clap::ArgAction::Set)]
    pub anonymous_auth: Option<bool>,

    /// AuthorizationConfiguration file (`apiserver.svc.io/v1beta1`, `v1`, `v1alpha1`): the
    /// authorizers asked after `system:masters` and the built-in policy, in order. Re-read
    /// when it changes; a version that does not load leaves the previous one in force.
    #[arg(long)]
    pub authorization_config: Option<PathBuf>,

    /// AuthenticationConfiguration file (`apiserver.svc.io/v1beta1`): JWT authenticators
    /// (OIDC issuers) and anonymous access. Re-read when it changes; a version with errors is
    /// refused (logged and counted) and the previous one stays in force.
    #[arg(long)]
    pub authentication_config: Option<PathBuf>,

    /// How often configuration files given by flags are checked for changes.
    #[arg(long, default_value = "1m", value_parser = parse_duration, hide = true)]
    pub config_reload_interval: Duration,

    /// Time to keep serving after SIGTERM while /readyz reports failure, so load balancers
    /// stop sending new requests first.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay_duration: Duration,

    /// How long in-flight requests may run after shutdown begins before they are cut.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,

    /// Time after start during which /livez reports success whatever its checks say.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub livez_grace_period: Duration,

    /// Largest request body accepted (bytes); larger requests get 413.
    #[arg(long, default_value_t = 3 * 1024 * 1024)]
    pub max_request_body_bytes: usize,

    /// Get and list responses smaller than this many bytes are sent uncompressed even when the
    /// client accepts gzip (0: every one is compressed, as the spec says). Below ~16 KiB the
    /// encoder's fixed cost (~11 µs) outweighs the bytes saved on a fast link; see
    /// `benches/benches/encode.rs`.
    #[arg(long, default_value_t = 0)]
    pub response_compression_min_bytes: usize,

    /// Watches without `timeoutSeconds` end after a random time in [T, 2T].
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub min_request_timeout: Duration,

    /// Non-watch requests are cut after this long.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// Concurrent HTTP/2 streams per connection.
    #[arg(long, default_value_t = 1000)]
    pub http2_max_streams_per_connection: u32,

    /// How long a client may take to send a request's headers (kube-apiserver's
    /// `ReadHeaderTimeout`); an HTTP/1.1 connection waiting for its next request is closed
    /// after this long too.
    #[arg(long, default_value = "32s", value_parser = parse_duration)]
    pub http_header_read_timeout: Duration,

    /// A connection with no request in flight for this long is closed (h2: GOAWAY), as
    /// kube-apiserver's `IdleTimeout`.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    pub http_idle_timeout: Duration,

    /// How long a client may take to complete the TLS handshake, counted from the accept.
    /// kube-apiserver's is 32 s (its `ReadHeaderTimeout`, which Go's server also applies to
    /// the handshake): thousands of agents reconnecting at once to a server that has just
    /// started wait for its handshakes, and one ended after 10 s, its client already past its
    /// own part, fails its first request with a broken pipe, and client-go lists again.
    #[arg(long, default_value = "32s", value_parser = parse_duration)]
    pub tls_handshake_timeout: Duration,

    /// Largest request head (HTTP/1.1 request line and headers; h2 header list), as Go's
    /// `MaxHeaderBytes` in kube-apiserver; larger requests get 431.
    #[arg(long, default_value_t = 1 << 20)]
    pub http_max_header_bytes: usize,

    /// Connections open at once; past it, new ones wait in the listen backlog. 0: the
    /// process's open-file limit less 256 kept for other files.
    #[arg(long, default_value_t = 0)]
    pub max_connections: usize,

    /// How long the watch cache keeps events: the window a watch may resume from (410 after).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub watch_cache_history_window: Duration,

    /// Upper bound on the bytes of each type's watch history.
    #[arg(long, default_value_t = 64 << 20)]
    pub watch_cache_history_max_bytes: usize,

    /// Upper bound on the number of events in each type's watch history.
    #[arg(long, default_value_t = 250_000)]
    pub watch_cache_history_max_events: usize,

    /// Event references queued per watcher before it walks the history itself.
    #[arg(long, default_value_t = 1024)]
    pub watch_cache_watcher_queue_limit: usize,

    /// Watchers registered at once per type's watch cache (every namespace and selector
    /// together); more get 429. Each costs a slot in the cache (a few hundred bytes) besides
    /// its stream.
    #[arg(long, default_value_t = 200_000)]
    pub watch_cache_max_watchers: usize,

    /// How long superseded states stay listable (`resourceVersionMatch=Exact`, continue).
    #[arg(long, default_value = "75s", value_parser = parse_duration)]
    pub list_snapshot_window: Duration,

    /// How often watches with `allowWatchBookmarks=true` get a bookmark.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub watch_bookmark_interval: Duration,

    /// Lifetime of a list `continue` token; an older one gets 410.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub continue_token_ttl: Duration,

    /// How long the embedded store keeps history (reads at past revisions, feed replay);
    /// older history is compacted away, like etcd's periodic compaction.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub storage_history_retention: Duration,

    /// MiB of the embedded store's page cache (redb's). Reads are served by the watch caches,
    /// so the store's cache serves writes and startup; pages it does not hold are read from
    /// the operating system's file cache, which the kernel can reclaim, where this cache's
    /// pages are the process's own until it exits.
    #[arg(long, default_value_t = 32)]
    pub storage_page_cache_mb: usize,

    /// How long an Event lives: every write of one gives it this time to live, after which
    /// the store deletes it without anything scanning for it (0: events never expire).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub event_ttl: Duration,

    /// Where objects live: `embedded` (one data directory, the default) or `etcd` (an etcd
    /// v3 cluster; several gateways may share one).
    #[arg(long, value_enum, default_value_t = StorageBackend::Embedded)]
    pub storage_backend: StorageBackend,

    /// etcd client URLs, comma-separated (with `--storage-backend=etcd`).
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    pub etcd_servers: Vec<String>,

    /// Prepended to every key in etcd (keys already start with `/registry/`).
    #[arg(long, default_value = "")]
    pub etcd_prefix: String,

    /// CA bundle to verify etcd's serving certificate (https endpoints).
    #[arg(long)]
    pub etcd_cafile: Option<PathBuf>,

    /// Client certificate presented to etcd.
    #[arg(long)]
    pub etcd_certfile: Option<PathBuf>,

    /// Key of `--etcd-certfile`.
    #[arg(long)]
    pub etcd_keyfile: Option<PathBuf>,

    /// EgressSelectorConfiguration file: how the server dials webhooks (`controlplane`) and
    /// etcd (`etcd`), directly or through an HTTP CONNECT tunnel server.
    #[arg(long)]
    pub egress_selector_config_file: Option<PathBuf>,

    /// The `iss` of service-account tokens, and the issuer they must name to be accepted.
    #[arg(long, default_value = "https://kubernetes.default.svc.cluster.local")]
    pub service_account_issuer: String,

    /// PEM private key (ECDSA P-256) that signs service-account tokens; default
    /// `<cert-dir>/sa.key`, created on first start and shared by replicas via `--cert-dir`.
    #[arg(long)]
    pub service_account_signing_key_file: Option<PathBuf>,

    /// More PEM public keys that verify service-account tokens (rotation), repeatable; the
    /// signing key's own public key always verifies.
    #[arg(long = "service-account-key-file")]
    pub service_account_key_files: Vec<PathBuf>,

    /// The audiences a token must name to be a credential here; default the issuer.
    #[arg(long, value_delimiter = ',')]
    pub api_audiences: Vec<String>,

    /// The longest validity a token request is granted (`0s`: no cap beyond the request).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub service_account_max_token_expiration: Duration,

    /// CA certificate (PEM) that issues the certificates of CertificateSigningRequests for
    /// the built-in signers, instead of the cluster CA; client certificates it signs
    /// authenticate too. Needs `--cluster-signing-key-file`.
    #[arg(long)]
    pub cluster_signing_cert_file: Option<PathBuf>,

    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1) of `--cluster-signing-cert-file`.
    #[arg(long)]
    pub cluster_signing_key_file: Option<PathBuf>,

    /// Longest validity of a certificate issued for a CertificateSigningRequest; a request's
    /// `expirationSeconds` may ask for less (never under 10 minutes).
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    pub cluster_signing_duration: Duration,

    /// Admission plugins to run besides those on by default, comma-separated
    /// (`EventRateLimit`); an unknown name is an error.
    #[arg(long, value_delimiter = ',')]
    pub enable_admission_plugins: Vec<String>,

    /// Admission plugins not to run, even those on by default; naming one also enabled is an
    /// error.
    #[arg(long, value_delimiter = ',')]
    pub disable_admission_plugins: Vec<String>,

    /// An AdmissionConfiguration (`apiserver.svc.io/v1`) giving admission plugins their
    /// configuration, inline or by path (relative to this file).
    #[arg(long)]
    pub admission_control_config_file: Option<PathBuf>,

    /// Feature gates: `Name=true,Other=false` (see `features.rs` for the known gates).
    #[arg(long, default_value = "", value_parser = crate::base::features::FeatureGates::parse)]
    pub feature_gates: crate::base::features::FeatureGates,

    /// Declarative validation rules added to a kind's own (kind name, rule). No flag sets
    /// them: embedding and tests use them to make the two validations disagree on purpose.
    #[arg(skip)]
    pub extra_declarative_rules: Vec<(&'static str, svc_core::validation::declarative::Rule)>,

    /// TracingConfiguration file (`apiserver.svc.io/v1beta1`): spans of requests, sent over
    /// OTLP/gRPC to its `endpoint`. Unset: no tracing.
    #[arg(long)]
    pub tracing_config_file: Option<PathBuf>,

    /// Log level (error, warn, info, debug, trace) or a tracing filter directive.
    #[arg(long, default_value = "info")]
    pub log_level: String,

    /// Verbosity in the Kubernetes style: 0-1 info, 2-3 debug, 4+ trace (overrides --log-level).
    #[arg(short = 'v', long = "v")]
    pub verbosity: Option<u8>,

    /// Emit logs as JSON lines.
    #[arg(long, default_value_t = false)]
    pub log_json: bool,

    #[command(flatten)]
    pub audit: AuditOptions,

    /// A tool to run instead of the server.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands; without one, `svc-gateway [flags]` runs the server.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum Command {
    /// Validate configuration files of any known kind (and print them with their defaults).
    ValidateConfig(crate::base::validate_config::ValidateArgs),
}

impl Options {
    pub fn cert_dir(&self) -> PathBuf {
        self.cert_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("pki"))
    }

    /// The audiences of this server: `--api-audiences`, else the issuer.
    pub fn api_audiences(&self) -> Vec<String> {
        if self.api_audiences.is_empty() {
            vec![self.service_account_issuer.clone()]
        } else {
            self.api_audiences.clone()
        }
    }

    pub fn store_dir(&self) -> PathBuf {
        self.data_dir.join("store")
    }

    /// Options for an in-process server on loopback with free ports (tests, benchmarks).
    pub fn for_tests(data_dir: PathBuf) -> Self {
        let mut o = Options::parse_from(["svc-gateway"]);
        o.data_dir = data_dir;
        o.bind_address = IpAddr::from([127, 0, 0, 1]);
        o.secure_port = 0;
        o.shutdown_timeout = Duration::from_secs(5);
        o
    }

    pub fn embedded_store_config(&self) -> svc_storage::embedded::EmbeddedConfig {
        let retention = self.storage_history_retention;
        svc_storage::embedded::EmbeddedConfig {
            auto_compaction: svc_storage::embedded::AutoCompaction::Retention(retention),
            // Check often enough that history never outlives its retention by much.
            compaction_check_interval: (retention.checked_div(2).unwrap_or_default())
                .clamp(Duration::from_millis(100), Duration::from_secs(10)),
            cache_size: self.storage_page_cache_mb.saturating_mul(1024 * 1024),
            ..Default::default()
        }
    }

    pub fn etcd_config(&self) -> svc_storage::etcd::EtcdConfig {
        let tls = (self.etcd_cafile.is_some()
            || self.etcd_certfile.is_some()
            || self.etcd_keyfile.is_some())
        .then(|| svc_storage::etcd::EtcdTls {
            ca_file: self.etcd_cafile.clone(),
            cert_file: self.etcd_certfile.clone(),
            key_file: self.etcd_keyfile.clone(),
        });
        svc_storage::etcd::EtcdConfig {
            endpoints: self.etcd_servers.clone(),
            prefix: self.etcd_prefix.clone(),
            tls,
            ..Default::default()
        }
    }

    pub fn watch_cache_config(&self) -> svc_core::watch::WatchCacheConfig {
        svc_core::watch::WatchCacheConfig {
            history_window: self.watch_cache_history_window,
            history_max_bytes: self.watch_cache_history_max_bytes,
            history_max_events: self.watch_cache_history_max_events,
            list_snapshots: self
                .feature_gates
                .enabled(crate::base::features::Feature::ListFromCacheSnapshot),
            snapshot_window: self.list_snapshot_window,
            watcher_queue_limit: self.watch_cache_watcher_queue_limit,
            bookmark_interval: self.watch_bookmark_interval,
            max_watchers: self.watch_cache_max_watchers,
            ..Default::default()
        }
    }

    /// Flags that proxy mode cannot honour, refused at start with their names: the upstream
    /// stores, authorizes, admits and issues tokens itself, and a loopback listener without
    /// authentication would act as `system:masters` upstream. `--client-ca-file` belongs to
    /// proxy mode (standalone trusts its own CA).
    pub fn check_mode(&self) -> Result<(), String> {
        if self.upstream_kubeconfig.is_none() {
            if self.upstream_caller_tokens {
                return Err(
                    "--upstream-caller-tokens is only for proxy mode (--upstream-kubeconfig)"
                        .into(),
                );
            }
            if self.cache_resources != "*" {
                return Err(
                    "--cache-resources is only for proxy mode (--upstream-kubeconfig)".into(),
                );
            }
            if self.requestheader_client_ca_file.is_some() {
                return Err("--requestheader-client-ca-file is only for proxy mode \
                            (--upstream-kubeconfig)"
                    .into());
            }
            if self.client_ca_file.is_some() {
                return Err(
                    "--client-ca-file is only for proxy mode (--upstream-kubeconfig); \
                     standalone mode verifies client certificates with its own CA"
                        .into(),
                );
            }
            return Ok(());
        }
        let set: [(&str, bool); 14] = [
            (
                "--storage-backend=etcd",
                self.storage_backend == StorageBackend::Etcd,
            ),
            ("--insecure-port", self.insecure_port != 0),
            ("--anonymous-auth", self.anonymous_auth.is_some()),
            (
                "--authorization-config",
                self.authorization_config.is_some(),
            ),
            (
                "--authentication-config",
                self.authentication_config.is_some(),
            ),
            (
                "--cluster-signing-cert-file",
                self.cluster_signing_cert_file.is_some(),
            ),
            (
                "--cluster-signing-key-file",
                self.cluster_signing_key_file.is_some(),
            ),
            (
                "--service-account-signing-key-file",
                self.service_account_signing_key_file.is_some(),
            ),
            (
                "--service-account-key-file",
                !self.service_account_key_files.is_empty(),
            ),
            (
                "--enable-admission-plugins",
                !self.enable_admission_plugins.is_empty(),
            ),
            (
                "--disable-admission-plugins",
                !self.disable_admission_plugins.is_empty(),
            ),
            (
                "--admission-control-config-file",
                self.admission_control_config_file.is_some(),
            ),
            ("--tracing-config-file", self.tracing_config_file.is_some()),
            (
                "--audit-policy-file",
                self.audit.audit_policy_file.is_some(),
            ),
        ];
        let refused: Vec<&str> = set.iter().filter(|(_, on)| *on).map(|(n, _)| *n).collect();
        if refused.is_empty() {
            return Ok(());
        }
        Err(format!(
            "--upstream-kubeconfig (proxy mode) cannot be combined with {}: the upstream API \
             server stores, authenticates, authorizes, admits and audits itself, and proxy mode \
             has no loopback listener",
            refused.join(", ")
        ))
    }

    pub fn log_filter(&self) -> String {
        match self.verbosity {
            Some(0..=1) => "info".into(),
            Some(2..=3) => "debug".into(),
            Some(_) => "trace".into(),
            None => self.log_level.clone(),
        }
    }
}

/// How an audit backend takes events (`--audit-log-mode`, `--audit-webhook-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuditMode {
    /// The request writes its events itself and waits for them (backpressure).
    Blocking,
    /// As blocking, and a request whose `RequestReceived` event cannot be written fails.
    BlockingStrict,
    /// Events go into a bounded buffer sent in batches; a full buffer drops (and counts) them.
    Batch,
}

/// The audit flags, with Kubernetes' names and defaults.
#[derive(Clone, Debug, clap::Args)]
pub struct AuditOptions {
    /// An `audit.svc.io/v1` Policy: which requests are audited, at which level. Without it
    /// nothing is audited.
    #[arg(long)]
    pub audit_policy_file: Option<PathBuf>,

    /// Audit log file (`-`: standard output): one JSON event per line.
    #[arg(long)]
    pub audit_log_path: Option<PathBuf>,

    /// Megabytes of audit log before it is rotated (0: 100).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxsize: u64,

    /// Rotated audit logs kept (0: all).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxbackup: usize,

    /// Days a rotated audit log is kept (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxage: u64,

    /// Format of the audit log: `json` (the `legacy` format is not supported).
    #[arg(long, default_value = "json", value_parser = parse_audit_log_format)]
    pub audit_log_format: String,

    #[arg(long, value_enum, default_value_t = AuditMode::Blocking)]
    pub audit_log_mode: AuditMode,
    #[arg(long, default_value_t = 10000)]
    pub audit_log_batch_buffer_size: usize,
    #[arg(long, default_value_t = 1)]
    pub audit_log_batch_max_size: usize,
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub audit_log_batch_max_wait: Duration,
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub audit_log_batch_throttle_enable: bool,
    #[arg(long, default_value_t = 10.0)]
    pub audit_log_batch_throttle_qps: f32,
    #[arg(long, default_value_t = 15)]
    pub audit_log_batch_throttle_burst: usize,

    /// A kubeconfig naming the server audit events are POSTed to as EventLists.
    #[arg(long)]
    pub audit_webhook_config_file: Option<PathBuf>,

    /// How long to wait before retrying the first failed request to the audit webhook.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub audit_webhook_initial_backoff: Duration,

    #[arg(long, value_enum, default_value_t = AuditMode::Batch)]
    pub audit_webhook_mode: AuditMode,
    #[arg(long, default_value_t = 10000)]
    pub audit_webhook_batch_buffer_size: usize,
    #[arg(long, default_value_t = 400)]
    pub audit_webhook_batch_max_size: usize,
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub audit_webhook_batch_max_wait: Duration,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub audit_webhook_batch_throttle_enable: bool,
    #[arg(long, default_value_t = 10.0)]
    pub audit_webhook_batch_throttle_qps: f32,
    #[arg(long, default_value_t = 15)]
    pub audit_webhook_batch_throttle_burst: usize,
}

/// The batch settings of one audit backend.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    pub buffer_size: usize,
    pub max_size: usize,
    pub max_wait: Duration,
    pub throttle_enable: bool,
    pub throttle_qps: f32,
    pub throttle_burst: usize,
}

impl AuditOptions {
    pub fn log_batch(&self) -> BatchOptions {
        BatchOptions {
            buffer_size: self.audit_log_batch_buffer_size,
            max_size: self.audit_log_batch_max_size,
            max_wait: self.audit_log_batch_max_wait,
            throttle_enable: self.audit_log_batch_throttle_enable,
            throttle_qps: self.audit_log_batch_throttle_qps,
            throttle_burst: self.audit_log_batch_throttle_burst,
        }
    }

    pub fn webhook_batch(&self) -> BatchOptions {
        BatchOptions {
            buffer_size: self.audit_webhook_batch_buffer_size,
            max_size: self.audit_webhook_batch_max_size,
            max_wait: self.audit_webhook_batch_max_wait,
            throttle_enable: self.audit_webhook_batch_throttle_enable,
            throttle_qps: self.audit_webhook_batch_throttle_qps,
            throttle_burst: self.audit_webhook_batch_throttle_burst,
        }
    }
}

fn parse_audit_log_format(s: &str) -> Result<String, String> {
    match s {
        "json" => Ok(s.to_string()),
        "legacy" => Err("the legacy audit log format is not supported: use json".into()),
        other => Err(format!("unknown audit log format {other:?}: use json")),
    }
}

/// Parses a flag's Go duration (`90s`, `1m30s`, `500ms`, `1µs`, `2h`, `0`) with the exact
/// parser configuration files use (integer nanoseconds, Go's units and errors). A flag's
/// duration is a length of time, so a negative one is refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = svc_config::Duration::parse(s.trim())?;
    if d.is_negative() {
        return Err(format!("invalid duration {s:?}: must not be negative"));
    }
    Ok(d.to_std())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        // Exact where floating point was not, and Go's spellings of microseconds.
        assert_eq!(parse_duration("1µs").unwrap(), Duration::from_micros(1));
        assert_eq!(parse_duration("1μs").unwrap(), Duration::from_micros(1));
        assert_eq!(parse_duration("0.3s").unwrap(), Duration::from_millis(300));
        assert_eq!(
            parse_duration("2562047h").unwrap(),
            Duration::from_secs(2_562_047 * 3600)
        );
        assert!(parse_duration("2562048h").is_err(), "past Go's range");
        assert!(parse_duration("-5s").is_err());
    }

    #[test]
    fn the_watch_caches_cap_on_watchers_is_a_flag() {
        let o = Options::parse_from(["svc-gateway"]);
        assert_eq!(o.watch_cache_config().max_watchers, 200_000);
        let o = Options::parse_from(["svc-gateway", "--watch-cache-max-watchers", "2000000"]);
        assert_eq!(o.watch_cache_config().max_watchers, 2_000_000);
    }

    #[test]
    fn audit_flags_have_kubernetes_defaults_and_refuse_the_legacy_format() {
        let o = Options::parse_from(["svc-gateway"]).audit;
        assert_eq!(o.audit_log_mode, AuditMode::Blocking);
        assert_eq!(o.audit_webhook_mode, AuditMode::Batch);
        assert_eq!(o.log_batch().max_size, 1);
        assert!(!o.log_batch().throttle_enable);
        let w = o.webhook_batch();
        assert_eq!((w.buffer_size, w.max_size), (10000, 400));
        assert_eq!(w.max_wait, Duration::from_secs(30));
        assert!(w.throttle_enable);
        assert_eq!(o.audit_webhook_initial_backoff, Duration::from_secs(10));
        let err = Options::try_parse_from(["svc-gateway", "--audit-log-format=legacy"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("legacy audit log format is not supported"),
            "{err}"
        );
        let o = Options::try_parse_from([
            "svc-gateway",
            "--audit-log-mode=blocking-strict",
            "--audit-webhook-batch-throttle-enable=false",
        ])
        .unwrap()
        .audit;
        assert_eq!(o.audit_log_mode, AuditMode::BlockingStrict);
        assert!(!o.audit_webhook_batch_throttle_enable);
    }

    #[test]
    fn proxy_mode_refuses_what_only_a_standalone_server_does() {
        let parse = |args: &[&str]| {
            let mut all = vec!["svc-gateway"];
            all.extend_from_slice(args);
            Options::parse_from(all).check_mode()
        };
        assert_eq!(parse(&[]), Ok(()));
        let proxy = ["--upstream-kubeconfig=k", "--client-ca-file=ca.crt"];
        assert_eq!(parse(&proxy), Ok(()));
        assert_eq!(parse(&["--upstream-kubeconfig=k"]), Ok(()));
        let err = parse(&["--client-ca-file=ca.crt"]).unwrap_err();
        assert!(err.contains("only for proxy mode"), "{err}");
        let mut bad = proxy.to_vec();
        bad.extend(["--insecure-port=8080", "--storage-backend=etcd"]);
        let err = parse(&bad).unwrap_err();
        assert!(
            err.contains("--storage-backend=etcd, --insecure-port"),
            "{err}"
        );
    }
}
