//! What proxy mode (`--upstream-kubeconfig`) brings to the one start path of `run.rs`: the
//! upstream clients from the kubeconfig, client certificates verified against
//! `--client-ca-file` (the serving certificate and its CA come from the data directory, as in
//! standalone mode), the caches and their tasks; no local store, no controllers, no admin
//! kubeconfig (callers hold the upstream's credentials).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::base::flags::Options;
use crate::http::proxy::Proxy;
use crate::outbound::egress::Egress;
use crate::outbound::pki::{self, PkiOptions};
use crate::outbound::upstream::Upstream;
use crate::outbound::upstream::discovery::ResourceFilter;
use crate::registry::caches::upstream::UpstreamCaches;
use crate::registry::caches::upstream::resume::ResumePoints;
use crate::run::Signals;
use crate::serve::app::{Parts, ServerState};
use crate::serve::server::Tls;

/// What a proxy is built from besides its flags: the upstream (short requests and the
/// proxy's own calls), a second client of it for the caches, and the CAs its callers'
/// certificates are verified against. Read before anything listens; the upstream is not
/// dialled here: an unreachable one shows in `/readyz` and as 503s.
pub struct Upstreams {
    upstream: Upstream,
    /// The caches' lists, watches and proofs of freshness, over a connection of their own,
    /// so that their watches take none of the streams short requests need.
    caches: Upstream,
    /// `--client-ca-file`.
    client_ca: Option<Vec<u8>>,
    /// `--requestheader-client-ca-file` and `--requestheader-allowed-names`.
    front_proxy: Option<(Vec<u8>, Vec<String>)>,
    /// `--egress-selector-config-file`, read once for the upstream and the server's webhooks.
    egress: Egress,
}

impl Upstreams {
    /// The egress selection the upstream is dialled through.
    pub fn egress(&self) -> &Egress {
        &self.egress
    }

    pub fn from_options(opts: &Options) -> anyhow::Result<Self> {
        let Some(kubeconfig) = opts.upstream_kubeconfig.clone() else {
            anyhow::bail!("proxy mode needs --upstream-kubeconfig");
        };
        let egress = Egress::from_options(opts)?;
        let upstream = Upstream::from_kubeconfig_file(
            &kubeconfig,
            &egress,
            opts.upstream_connections as usize,
        )
        .map_err(|e| anyhow::anyhow!("--upstream-kubeconfig: {e}"))?;
        let caches = Upstream::from_kubeconfig_file(&kubeconfig, &egress, 1)
            .map_err(|e| anyhow::anyhow!("--upstream-kubeconfig: {e}"))?;
        let client_ca = match &opts.client_ca_file {
            None => {
                tracing::warn!("no --client-ca-file: only bearer tokens authenticate callers");
                None
            }
            Some(path) => Some(
                std::fs::read(path)
                    .with_context(|| format!("reading --client-ca-file {}", path.display()))?,
            ),
        };
        let front_proxy = match &opts.requestheader_client_ca_file {
            None => None,
            Some(path) => Some((
                std::fs::read(path).with_context(|| {
                    format!("reading --requestheader-client-ca-file {}", path.display())
                })?,
                opts.requestheader_allowed_names.clone(),
            )),
        };
        Ok(Upstreams {
            upstream,
            caches,
            client_ca,
            front_proxy,
            egress,
        })
    }
}

/// The proxy's server state and its caches' tasks: the caches of `--cache-resources` over
/// their own upstream client, with resume points in the data directory, and the pipeline's
/// proxy with its bounds.
pub(crate) fn state(
    opts: &Options,
    upstreams: Upstreams,
    mut parts: Parts,
    signals: &Signals,
) -> anyhow::Result<(Arc<ServerState>, Vec<JoinHandle<()>>)> {
    let Upstreams {
        upstream,
        caches: caches_upstream,
        ..
    } = upstreams;
    let filter = ResourceFilter::parse(&opts.cache_resources).map_err(anyhow::Error::msg)?;
    let caches = Arc::new(UpstreamCaches::new(
        caches_upstream,
        filter,
        opts.watch_cache_config(),
        opts.upstream_watch_idle_timeout,
        // A quiet resource's watcher is as far as its last bookmark: points that far back,
        // and a margin (75 s in all by default, the history kube-apiserver's watch cache
        // keeps at the least).
        Some(ResumePoints::open(
            &opts.data_dir.join("proxy"),
            opts.watch_bookmark_interval.saturating_add(
                opts.watch_bookmark_interval
                    .min(std::time::Duration::from_secs(15)),
            ),
        )),
    ));
    // Not among the tasks shutdown waits for: it ends on its own within a call's timeout.
    tokio::spawn({
        let upstream = upstream.clone();
        async move { upstream.warm().await }
    });
    let mut proxy = Proxy::new(upstream);
    proxy.caches = Some(caches.clone());
    proxy.caller_tokens = opts.upstream_caller_tokens;
    {
        use crate::http::proxy::bounds::{Bound, LONG_RUNNING, SHORT};
        proxy.long_running = Bound::new(
            &LONG_RUNNING,
            opts.upstream_long_running_per_user as usize,
            opts.upstream_long_running_max as usize,
        );
        proxy.short = Bound::new(
            &SHORT,
            opts.upstream_requests_per_user as usize,
            opts.upstream_requests_max as usize,
        );
    }
    proxy.request_headers = crate::security::authn::RequestHeaderNames {
        username: opts.requestheader_username_headers.clone(),
        group: opts.requestheader_group_headers.clone(),
        extra_prefix: opts.requestheader_extra_headers_prefix.clone(),
        uid: opts.requestheader_uid_headers.clone(),
    };
    parts.collectors = vec![
        caches.collector(),
        proxy.long_running.collector(),
        proxy.short.collector(),
    ];
    let state = ServerState::over_upstream(opts.clone(), parts, proxy)?;
    let tasks = vec![
        tokio::spawn(crate::registry::caches::pace(
            caches.gate().clone(),
            signals.watches(),
        )),
        tokio::spawn(caches.clone().keep_resume_points(signals.watches())),
        tokio::spawn(caches.run(signals.watches())),
    ];
    Ok((Arc::new(state), tasks))
}

/// The data directory's PKI without an admin kubeconfig, and the proxy's TLS acceptor, which
/// verifies callers' certificates against the client CAs.
pub async fn prepare_pki(
    opts: &Options,
    addr: SocketAddr,
    upstreams: &Upstreams,
) -> anyhow::Result<(Arc<pki::Pki>, Tls)> {
    let pki_opts = PkiOptions {
        tls_sans: opts.tls_sans.clone(),
        admin_kubeconfig_path: std::path::PathBuf::new(),
        server_url: format!("https://{addr}"),
        cluster_signing: None,
    };
    let cert_dir = opts.cert_dir();
    let pki = tokio::task::spawn_blocking(move || pki::ensure_pki(&cert_dir, &pki_opts))
        .await?
        .context("preparing certificates")?;
    let front_proxy = upstreams
        .front_proxy
        .as_ref()
        .map(|(pem, names)| (pem.as_slice(), names.clone()));
    let (config, client_certs) = pki
        .proxy_server_config(upstreams.client_ca.as_deref(), front_proxy)
        .context("building the TLS configuration (is --client-ca-file a PEM bundle of CAs?)")?;
    let tls = Tls {
        acceptor: TlsAcceptor::from(config),
        client_certs,
    };
    Ok((Arc::new(pki), tls))
}
