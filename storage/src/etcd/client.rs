//! A small etcd v3 client on tonic: one endpoint's lazily connected channel and the calls the
//! backend makes (KV range, txn and compact; lease grants; watch streams), each sent with
//! etcd's leader requirement.
//!
//! The requirement is the `hasleader: true` metadata (what etcd's own clients send with
//! `WithRequireLeader`): a member cut off from the quorum then refuses the call ("etcdserver:
//! no leader") and cancels the stream's watches, instead of serving a frozen view or letting
//! the call wait out its deadline, so the backend fails over to a member that has a leader.
//!
//! Watches are created without `fragment`, so etcd never splits a revision's events over
//! several responses; a response is bounded by [`MAX_MESSAGE_BYTES`] instead.

use std::time::Duration;

use tokio::sync::mpsc;
use tonic::Status;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::pb::etcdserverpb::kv_client::KvClient;
use super::pb::etcdserverpb::lease_client::LeaseClient;
use super::pb::etcdserverpb::watch_client::WatchClient;
use super::pb::etcdserverpb::watch_request::RequestUnion;
use super::pb::etcdserverpb::{
    CompactionRequest, CompactionResponse, LeaseGrantRequest, LeaseGrantResponse, RangeRequest,
    RangeResponse, TxnRequest, TxnResponse, WatchCreateRequest, WatchProgressRequest, WatchRequest,
    WatchResponse,
};
use super::{EtcdDialer, EtcdIo, EtcdTls};
use crate::StoreError;

/// Largest gRPC message accepted from etcd (a big list is one message). etcd's own default
/// send limit is 2 GiB; this keeps our buffer bounded while allowing large lists.
pub(crate) const MAX_MESSAGE_BYTES: usize = 512 * 1024 * 1024;

/// The metadata key etcd reads as "refuse unless this member has a leader".
const REQUIRE_LEADER_KEY: &str = "hasleader";

/// Watch requests (creation, progress requests) queued for etcd on one stream. Progress
/// requests are sent at most once per progress interval, so this rarely holds more than one.
const WATCH_REQUEST_BUFFER: usize = 4;

/// How each endpoint's channel is built.
#[derive(Clone, Debug)]
pub(crate) struct ConnectOptions {
    /// Bound of every call until its response headers (tonic's request timeout).
    pub(crate) request_timeout: Duration,
    /// Bound of establishing a connection.
    pub(crate) connect_timeout: Duration,
    /// TLS for `https://` endpoints (and endpoints given without a scheme).
    pub(crate) tls: Option<ClientTlsConfig>,
    /// Dials instead of tonic's own TCP connector.
    pub(crate) dialer: Option<EtcdDialer>,
}

/// An [`EtcdDialer`] as the tower service tonic connects through.
#[derive(Clone)]
struct DialService(EtcdDialer);

impl tower_service::Service<tonic::codegen::http::Uri> for DialService {
    type Response = hyper_util::rt::TokioIo<Box<dyn EtcdIo>>;
    type Error = std::io::Error;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, std::io::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), std::io::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: tonic::codegen::http::Uri) -> Self::Future {
        let dial = self.0.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, "no host in the URL")
                })?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(2379);
            let io = (dial.0)(host, port).await?;
            Ok(hyper_util::rt::TokioIo::new(io))
        })
    }
}

/// The client side of TLS to etcd: the CA that signs etcd's serving certificate, and our
/// client certificate if etcd requires one.
pub(crate) fn tls_config(tls: &EtcdTls) -> Result<ClientTlsConfig, StoreError> {
    let mut config = ClientTlsConfig::new();
    if let Some(ca) = &tls.ca_file {
        config = config.ca_certificate(Certificate::from_pem(read_pem(ca, "CA")?));
    }
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            config = config.identity(Identity::from_pem(
                read_pem(cert, "client certificate")?,
                read_pem(key, "client key")?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(StoreError::Unavailable(
                "--etcd-certfile and --etcd-keyfile must be given together".to_string(),
            ));
        }
    }
    Ok(config)
}

fn read_pem(path: &std::path::Path, what: &str) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| {
        StoreError::Io(std::io::Error::new(
            e.kind(),
            format!("reading etcd {what} {}: {e}", path.display()),
        ))
    })
}

/// The endpoint of one client URL: `http://` plain, `https://` with TLS, no scheme: whichever
/// the options say.
fn endpoint(url: &str, options: &ConnectOptions) -> Result<Endpoint, StoreError> {
    let url = if url.contains("://") {
        url.to_string()
    } else if options.tls.is_some() {
        format!("https://{url}")
    } else {
        format!("http://{url}")
    };
    let invalid = |e: tonic::transport::Error| {
        StoreError::Unavailable(format!("invalid etcd endpoint {url}: {e}"))
    };
    let mut endpoint = Endpoint::from_shared(url.clone()).map_err(invalid)?;
    if url.starts_with("https://") {
        let tls = options.tls.clone().unwrap_or_default();
        endpoint = endpoint.tls_config(tls).map_err(invalid)?;
    } else if options.tls.is_some() {
        return Err(StoreError::Unavailable(format!(
            "etcd endpoint {url}: TLS is configured, so the URL must be https://"
        )));
    }
    Ok(endpoint
        .timeout(options.request_timeout)
        .connect_timeout(options.connect_timeout)
        // Detects a silently dead member (no RST) so feeds move on to another.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(3))
        .keep_alive_while_idle(true))
}

/// A request carrying the leader requirement.
fn leader_required<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert(REQUIRE_LEADER_KEY, MetadataValue::from_static("true"));
    request
}

/// One etcd endpoint. Cloning is cheap (a handle on the same channel).
#[derive(Clone)]
pub(crate) struct Client {
    channel: Channel,
}

impl Client {
    /// The client of `url`. The channel connects on first use and again after a failure, so
    /// this succeeds while etcd is down; only a malformed URL or TLS setting fails here.
    pub(crate) fn new(url: &str, options: &ConnectOptions) -> Result<Self, StoreError> {
        let endpoint = endpoint(url, options)?;
        let channel = match &options.dialer {
            Some(d) => endpoint.connect_with_connector_lazy(DialService(d.clone())),
            None => endpoint.connect_lazy(),
        };
        Ok(Client { channel })
    }

    fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    pub(crate) async fn range(&self, request: RangeRequest) -> Result<RangeResponse, Status> {
        let response = self.kv().range(leader_required(request)).await?;
        Ok(response.into_inner())
    }

    pub(crate) async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, Status> {
        let response = self.kv().txn(leader_required(request)).await?;
        Ok(response.into_inner())
    }

    pub(crate) async fn compact(
        &self,
        request: CompactionRequest,
    ) -> Result<CompactionResponse, Status> {
        let response = self.kv().compact(leader_required(request)).await?;
        Ok(response.into_inner())
    }

    pub(crate) async fn lease_grant(
        &self,
        request: LeaseGrantRequest,
    ) -> Result<LeaseGrantResponse, Status> {
        let response = LeaseClient::new(self.channel.clone())
            .lease_grant(leader_required(request))
            .await?;
        Ok(response.into_inner())
    }

    /// Opens a watch stream with one watcher, `create`. Returns once etcd answered the call
    /// (its first response, normally `created`, is read with [`WatchStream::message`]).
    pub(crate) async fn watch(&self, create: WatchCreateRequest) -> Result<WatchStream, Status> {
        let (requests, outbound) = mpsc::channel(WATCH_REQUEST_BUFFER);
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(create)),
        };
        if requests.try_send(create).is_err() {
            // Cannot happen: the channel is new and has room.
            return Err(Status::internal("queueing the watch creation failed"));
        }
        // Ends (a half-close to etcd) when the `WatchStream` is dropped.
        let outbound = futures::stream::unfold(outbound, |mut outbound| async move {
            outbound.recv().await.map(|request| (request, outbound))
        });
        let responses = WatchClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .watch(leader_required(outbound))
            .await?
            .into_inner();
        Ok(WatchStream {
            requests,
            responses,
        })
    }
}

/// One watch stream: responses from etcd, and the way to ask it for progress.
pub(crate) struct WatchStream {
    requests: mpsc::Sender<WatchRequest>,
    responses: tonic::Streaming<WatchResponse>,
}

impl WatchStream {
    /// The next response; `None` when etcd ended the stream.
    pub(crate) async fn message(&mut self) -> Result<Option<WatchResponse>, Status> {
        self.responses.message().await
    }

    /// Asks etcd for a progress notification (answered once the watcher is caught up). Never
    /// waits: when earlier requests are still queued, this one would add nothing.
    pub(crate) fn request_progress(&self) -> Result<(), Status> {
        let request = WatchRequest {
            request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
        };
        match self.requests.try_send(request) {
            Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Status::unavailable(
                "etcd watch stream: the request side is closed",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(tls: Option<ClientTlsConfig>) -> ConnectOptions {
        ConnectOptions {
            request_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            tls,
            dialer: None,
        }
    }

    #[test]
    fn every_request_requires_a_leader() {
        let request = leader_required(RangeRequest::default());
        let value = request.metadata().get(REQUIRE_LEADER_KEY);
        assert_eq!(value.and_then(|v| v.to_str().ok()), Some("true"));
    }

    #[test]
    fn endpoint_scheme_follows_the_tls_setting() {
        let plain = endpoint("127.0.0.1:2379", &options(None)).unwrap();
        assert_eq!(plain.uri().to_string(), "http://127.0.0.1:2379/");
        let tls = Some(ClientTlsConfig::new());
        let secure = endpoint("127.0.0.1:2379", &options(tls.clone())).unwrap();
        assert_eq!(secure.uri().to_string(), "https://127.0.0.1:2379/");
        // TLS settings with a plain URL are a configuration mistake, not a silent downgrade.
        assert!(endpoint("http://127.0.0.1:2379", &options(tls)).is_err());
        assert!(endpoint("http://bad host:2379", &options(None)).is_err());
    }

    #[test]
    fn tls_needs_certificate_and_key_together() {
        let only_cert = EtcdTls {
            ca_file: None,
            cert_file: Some("/nonexistent/client.crt".into()),
            key_file: None,
        };
        assert!(matches!(
            tls_config(&only_cert),
            Err(StoreError::Unavailable(_))
        ));
        let missing_ca = EtcdTls {
            ca_file: Some("/nonexistent/ca.crt".into()),
            ..EtcdTls::default()
        };
        assert!(matches!(tls_config(&missing_ca), Err(StoreError::Io(_))));
    }

    /// `lease_grant` and `PutRequest.lease` against a real etcd: a key put with a lease
    /// carries its ID and goes when the lease is revoked (what expiring keys use).
    #[cfg(feature = "conformance")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_attached_to_a_lease_go_with_it() {
        use crate::etcd::pb::etcdserverpb::{LeaseGrantRequest, LeaseRevokeRequest, PutRequest};
        use crate::etcd::testing::EtcdCluster;

        let dir = tempfile::tempdir().unwrap();
        let cluster = EtcdCluster::start(dir.path(), 1).await;
        let client = Client::new(&cluster.endpoints()[0], &options(None)).unwrap();
        let mut leases = LeaseClient::new(client.channel.clone());
        let grant = LeaseGrantRequest { ttl: 60, id: 0 };
        let lease = client.lease_grant(grant).await.unwrap();
        assert!(lease.id != 0 && lease.ttl > 0, "{lease:?}");

        let put = PutRequest {
            key: b"/leased".to_vec(),
            value: b"v".to_vec(),
            lease: lease.id,
            ..PutRequest::default()
        };
        client.kv().put(leader_required(put)).await.unwrap();
        let read = || {
            client.range(RangeRequest {
                key: b"/leased".to_vec(),
                ..RangeRequest::default()
            })
        };
        let kvs = read().await.unwrap().kvs;
        assert_eq!(kvs.len(), 1);
        assert_eq!(
            (kvs[0].value.as_slice(), kvs[0].lease),
            (&b"v"[..], lease.id)
        );

        let revoke = LeaseRevokeRequest { id: lease.id };
        leases.lease_revoke(leader_required(revoke)).await.unwrap();
        assert!(read().await.unwrap().kvs.is_empty());
    }
}
