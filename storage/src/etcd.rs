//! The etcd backend: the `Store` contract on an etcd v3 cluster over gRPC (our own small
//! client in `client`, on tonic, with code generated from `storage/proto/` kept in `pb`).
//!
//! - **Revisions** are etcd's own revisions (note: etcd's first write is revision 2).
//! - **CAS** writes are single transactions comparing the key's `mod_revision` (or
//!   `create_revision` = 0 for creates); the failure branch reads the key in the same
//!   transaction, so `Conflict`/`AlreadyExists` carry the state that made the compare fail.
//! - **Reads** are linearizable ranges, optionally at a past revision.
//! - **Time to live**: a write with a TTL attaches its key to an etcd lease; etcd deletes the
//!   key when the lease expires (a delete event like any other). Leases are shared by writes
//!   expiring close together (`leases`).
//! - **Compaction** is etcd's. etcd has no call answering "what is the compacted revision",
//!   so it is probed with a watch from revision 1 (etcd refuses it and names the compaction
//!   point) and the highest value seen is remembered.
//! - **Feed** (`feed`): one etcd watch stream per feed, with `prev_kv`, progress
//!   notifications requested when idle, and transparent resumption after transport errors.
//! - **Faults**: every call is bounded by `request_timeout`; transport trouble is
//!   `StoreError::Unavailable`. There is one client per endpoint and calls go to the current
//!   one; a failure moves on to the next endpoint (a killed member must not keep a share of
//!   the calls, as it would behind a load-balanced channel). Reads are retried there within
//!   the deadline; writes only when the failure proves the request never left (connect
//!   errors), so a retried write can never be applied twice.
//!
//! Every key is stored under `EtcdConfig::prefix` (prepended; default empty, so our
//! `/registry/...` keys are etcd keys as Kubernetes lays them out).

mod client;
mod feed;
mod leases;
pub mod pb;
#[cfg(feature = "conformance")]
pub mod testing;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::watch;
use tonic::Status;

use self::client::{Client, ConnectOptions};
use self::leases::{Leases, lease_not_found};
use self::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use self::pb::etcdserverpb::request_op::Request;
use self::pb::etcdserverpb::response_op::Response;
use self::pb::etcdserverpb::{
    CompactionRequest, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse,
    RequestOp, ResponseHeader, TxnRequest, TxnResponse, WatchCreateRequest,
};
use self::pb::mvccpb;
use crate::{FeedStream, KeyRange, KeyValue, Later, RangeResult, Revision, Store, StoreError};

/// Client certificates and CA for TLS to etcd (PEM files).
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// How to reach etcd. `Default` is what the server uses apart from `endpoints`.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// Client URLs, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Prepended to every key (default empty).
    pub prefix: String,
    /// TLS to etcd; `None` for plain `http://` endpoints.
    pub tls: Option<EtcdTls>,
    /// Bound of every unary call; past it the call fails `Unavailable`. Default 4 s.
    pub request_timeout: Duration,
    /// Bound of establishing a connection. Default 2 s.
    pub connect_timeout: Duration,
    /// A feed that received nothing for this long asks etcd for a progress notification,
    /// which is what lets a cache prove it is current. Default 200 ms.
    pub progress_interval: Duration,
    /// Items buffered per feed between the etcd stream and the consumer. Default 64.
    pub feed_buffer: usize,
    /// Dials an endpoint's host and port instead of a direct TCP connection (for example
    /// through a tunnel server); TLS, when configured, runs over the stream it returns.
    pub dialer: Option<EtcdDialer>,
}

/// A byte stream to an etcd member, however it was dialled.
pub trait EtcdIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> EtcdIo for T {}

/// The future of one dial.
pub type EtcdDial =
    std::pin::Pin<Box<dyn Future<Output = std::io::Result<Box<dyn EtcdIo>>> + Send>>;

/// Dials `(host, port)` of an endpoint's URL. Storage knows nothing of how.
#[derive(Clone)]
pub struct EtcdDialer(pub Arc<dyn Fn(String, u16) -> EtcdDial + Send + Sync>);

impl std::fmt::Debug for EtcdDialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EtcdDialer")
    }
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".to_string()],
            prefix: String::new(),
            tls: None,
            request_timeout: Duration::from_secs(4),
            connect_timeout: Duration::from_secs(2),
            progress_interval: Duration::from_millis(200),
            feed_buffer: 64,
            dialer: None,
        }
    }
}

/// Whether a failed call may be sent again.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Reads: always (within the deadline).
    Always,
    /// Writes: only if the request surely never reached etcd.
    IfNotSent,
}

/// What the store handle and its feeds share.
pub(crate) struct EtcdState {
    config: EtcdConfig,
    options: ConnectOptions,
    /// One client per endpoint (same order as `config.endpoints`).
    clients: Mutex<Vec<Client>>,
    /// When each endpoint's client was last built: rebuilt at most once a second, so an
    /// outage under load does not churn through channels.
    built: Mutex<Vec<Instant>>,
    /// Index of the endpoint calls go to.
    current: AtomicUsize,
    /// Highest compaction point seen (etcd cannot be asked directly).
    compacted: AtomicI64,
    /// Leases of keys written with a time to live.
    leases: Leases,
}

impl EtcdState {
    /// The current endpoint's index and client (cheap: clones channel handles).
    pub(crate) fn client(&self) -> (usize, Client) {
        let clients = self.clients.lock();
        let index = self
            .current
            .load(Ordering::Relaxed)
            .checked_rem(clients.len())
            .unwrap_or(0);
        // `open` refuses an empty endpoint list, so `clients` is never empty and `index < len`.
        #[allow(clippy::indexing_slicing)]
        let client = clients[index].clone();
        (index, client)
    }

    /// After a transport failure on endpoint `used`: later calls go to the next endpoint,
    /// and `used` gets a fresh client (lazy, no I/O) for when its turn comes again. Only the
    /// first of several concurrent failures on one endpoint moves on.
    pub(crate) fn fail_over(&self, used: usize) {
        let count = self.config.endpoints.len().max(1);
        if self
            .current
            .compare_exchange(
                used,
                used.saturating_add(1).checked_rem(count).unwrap_or(0),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return;
        }
        let Some(endpoint) = self.config.endpoints.get(used) else {
            return;
        };
        {
            let mut built = self.built.lock();
            match built.get_mut(used) {
                Some(at) if at.elapsed() >= Duration::from_secs(1) => *at = Instant::now(),
                _ => return,
            }
        }
        match Client::new(endpoint, &self.options) {
            Ok(client) => {
                if let Some(slot) = self.clients.lock().get_mut(used) {
                    *slot = client;
                }
            }
            Err(e) => tracing::warn!(endpoint, error = %e, "etcd: rebuilding a client failed"),
        }
    }

    pub(crate) fn note_compacted(&self, revision: Revision) {
        self.compacted.fetch_max(revision, Ordering::Relaxed);
    }

    pub(crate) fn full_key(&self, key: &[u8]) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.config.prefix.len().saturating_add(key.len()));
        full.extend_from_slice(self.config.prefix.as_bytes());
        full.extend_from_slice(key);
        full
    }

    /// The etcd `[key, range_end)` of one of our ranges.
    pub(crate) fn full_range(&self, range: &KeyRange) -> (Vec<u8>, Vec<u8>) {
        let start = self.full_key(&range.start);
        let end = if !range.end.is_empty() {
            self.full_key(&range.end)
        } else {
            let prefix_end = KeyRange::prefix(self.config.prefix.clone().into_bytes()).end;
            if prefix_end.is_empty() {
                // "\0" is etcd's "every key >= start".
                vec![0]
            } else {
                prefix_end.to_vec()
            }
        };
        // etcd reads an empty key as "not provided"; "\0" is the smallest real key.
        let start = if start.is_empty() { vec![0] } else { start };
        (start, end)
    }

    /// One of etcd's key-values as ours (the key without the prefix). Takes ownership: the
    /// decoded buffers become the `Bytes` without a copy.
    pub(crate) fn convert(&self, kv: mvccpb::KeyValue) -> KeyValue {
        let mut key = Bytes::from(kv.key);
        if key.starts_with(self.config.prefix.as_bytes()) {
            key = key.slice(self.config.prefix.len()..);
        }
        KeyValue {
            key,
            value: Bytes::from(kv.value),
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
        }
    }

    /// Runs one call (built by `op` for a client) under the request timeout, mapping
    /// failures; on transport failure it fails over and, if `retry` allows, tries again.
    async fn call<T, F, Fut>(&self, retry: Retry, op: F) -> Result<T, StoreError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let timeout = self.config.request_timeout;
        let deadline = Instant::now().later(timeout);
        // Each endpoint gets at most two tries; one silent endpoint must not eat the whole
        // deadline, so a single try gets at most half of it.
        let max_attempts = self.config.endpoints.len().max(1).saturating_mul(2);
        let mut attempt = 0usize;
        loop {
            attempt = attempt.saturating_add(1);
            let (used, client) = self.client();
            let remaining = deadline.saturating_duration_since(Instant::now());
            let limit = if max_attempts > 2 {
                remaining.min(timeout.checked_div(2).unwrap_or_default())
            } else {
                remaining
            };
            let (err, not_sent) = match tokio::time::timeout(limit, op(client)).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) => {
                    let not_sent = never_sent(&e);
                    (map_error(e), not_sent)
                }
                Err(_) => (
                    StoreError::Unavailable(format!("etcd did not answer within {limit:?}")),
                    false,
                ),
            };
            if !matches!(err, StoreError::Unavailable(_)) {
                return Err(err);
            }
            self.fail_over(used);
            let may_retry = retry == Retry::Always || not_sent;
            if !may_retry || attempt >= max_attempts || Instant::now() >= deadline {
                return Err(err);
            }
            // A short pause: with every member down, do not spin through them.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The compaction point: a watch from revision 1 is refused with it, or accepted
    /// (nothing compacted).
    async fn probe_compacted(&self) -> Result<Revision, StoreError> {
        let create = WatchCreateRequest {
            key: self.full_key(b"\0svc-compaction-probe"),
            start_revision: 1,
            ..WatchCreateRequest::default()
        };
        let probe = |client: Client| Self::compaction_probe(client, create.clone());
        let compacted = self.call(Retry::Always, probe).await?;
        self.note_compacted(compacted);
        Ok(self.compacted.load(Ordering::Relaxed).max(compacted))
    }

    /// One probe: a watch from revision 1 on a key nobody writes, closed right after the
    /// first answer.
    async fn compaction_probe(
        client: Client,
        create: WatchCreateRequest,
    ) -> Result<Revision, Status> {
        let mut stream = client.watch(create).await?;
        loop {
            match stream.message().await? {
                Some(resp) if resp.compact_revision > 0 => return Ok(resp.compact_revision),
                Some(resp) if resp.created => return Ok(0),
                Some(resp) if resp.canceled => {
                    return Err(Status::unavailable(format!(
                        "probe watch canceled: {}",
                        resp.cancel_reason
                    )));
                }
                Some(_) => {}
                None => return Err(Status::unavailable("probe watch ended")),
            }
        }
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        let request = RangeRequest {
            key: self.full_key(b"\0svc-revision-probe"),
            count_only: true,
            ..RangeRequest::default()
        };
        let resp = self.range(request).await?;
        header_revision(resp.header.as_ref())
    }

    /// Turns etcd's revision errors into ours, with the numbers they need.
    async fn revision_error(&self, err: StoreError, requested: Revision) -> StoreError {
        match err {
            StoreError::Compacted { .. } => {
                let compacted = self
                    .probe_compacted()
                    .await
                    .unwrap_or(requested.saturating_add(1));
                StoreError::Compacted {
                    requested,
                    compacted,
                }
            }
            StoreError::FutureRevision { .. } => {
                let current = self.current_revision().await.unwrap_or(0);
                StoreError::FutureRevision { requested, current }
            }
            other => other,
        }
    }

    /// A write transaction (retried only when it surely was not sent).
    async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse, StoreError> {
        self.call(Retry::IfNotSent, |c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// A linearizable range read.
    async fn range(&self, request: RangeRequest) -> Result<RangeResponse, StoreError> {
        self.call(Retry::Always, |c| {
            let request = request.clone();
            async move { c.range(request).await }
        })
        .await
    }
}

/// The etcd-backed store.
pub struct EtcdStore {
    shared: Arc<EtcdState>,
    /// Dropped with the store: feeds see it and end.
    closed: watch::Sender<bool>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.shared.config.endpoints)
            .field("prefix", &self.shared.config.prefix)
            .finish()
    }
}

fn connect_options(config: &EtcdConfig) -> Result<ConnectOptions, StoreError> {
    Ok(ConnectOptions {
        request_timeout: config.request_timeout,
        connect_timeout: config.connect_timeout,
        tls: config.tls.as_ref().map(client::tls_config).transpose()?,
        dialer: config.dialer.clone(),
    })
}

impl EtcdStore {
    /// Builds the client (connections are made lazily, so this succeeds while etcd is down;
    /// `health` tells whether it is reachable).
    pub async fn connect(config: EtcdConfig) -> Result<Arc<Self>, StoreError> {
        if config.endpoints.is_empty() {
            return Err(StoreError::Unavailable(
                "no etcd endpoints configured".to_string(),
            ));
        }
        let options = connect_options(&config)?;
        let mut clients = Vec::with_capacity(config.endpoints.len());
        for endpoint in &config.endpoints {
            clients.push(Client::new(endpoint, &options)?);
        }
        let (closed, _) = watch::channel(false);
        Ok(Arc::new(EtcdStore {
            shared: Arc::new(EtcdState {
                config,
                options,
                built: Mutex::new(vec![Instant::now(); clients.len()]),
                clients: Mutex::new(clients),
                current: AtomicUsize::new(0),
                compacted: AtomicI64::new(0),
                leases: Leases::default(),
            }),
            closed,
        }))
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &EtcdConfig {
        &self.shared.config
    }
}

fn header_revision(header: Option<&ResponseHeader>) -> Result<Revision, StoreError> {
    header
        .map(|h| h.revision)
        .ok_or_else(|| inconsistent("response without a header"))
}

fn inconsistent(what: &str) -> StoreError {
    StoreError::Backend(format!("unexpected etcd response: {what}").into())
}

/// Maps a call's failure: transport and availability trouble is `Unavailable` (503 higher
/// up); etcd's revision errors become placeholders `revision_error` fills in.
pub(crate) fn map_error(status: Status) -> StoreError {
    use tonic::Code;
    let message = status.message();
    if message.contains("required revision has been compacted") {
        return StoreError::Compacted {
            requested: 0,
            compacted: 0,
        };
    }
    if message.contains("required revision is a future revision") {
        return StoreError::FutureRevision {
            requested: 0,
            current: 0,
        };
    }
    match status.code() {
        // Connection failures, timeouts (tonic's own deadline is `Cancelled`), a member
        // without a leader, and the `Unknown` of a transport error that carries no status.
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Aborted
        | Code::ResourceExhausted
        | Code::Unknown => StoreError::Unavailable(format!("etcd: {message}")),
        _ => StoreError::Backend(Box::new(status)),
    }
}

/// Whether a failed call surely never reached etcd (the connection could not be made), so
/// even a write may be sent again elsewhere.
fn never_sent(status: &Status) -> bool {
    let text = status.message().to_ascii_lowercase();
    text.contains("connect error") || text.contains("connection refused")
}

/// Compares `key`'s `create_revision` with `revision` (0: the key is absent).
fn create_revision(key: &[u8], result: CompareResult, revision: Revision) -> Compare {
    Compare {
        result: result.into(),
        target: CompareTarget::Create.into(),
        key: key.to_vec(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
        range_end: Vec::new(),
    }
}

/// Whether `key`'s `mod_revision` is `revision`.
fn mod_revision_is(key: &[u8], revision: Revision) -> Compare {
    Compare {
        result: CompareResult::Equal.into(),
        target: CompareTarget::Mod.into(),
        key: key.to_vec(),
        target_union: Some(TargetUnion::ModRevision(revision)),
        range_end: Vec::new(),
    }
}

/// Reads one key (the failure branch of every write transaction).
fn get_op(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(RangeRequest {
            key,
            ..RangeRequest::default()
        })),
    }
}

/// Puts one key, attached to `lease` (0: none, which also detaches a lease the key had).
fn put_op(key: Vec<u8>, value: Vec<u8>, prev_kv: bool, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key,
            value,
            prev_kv,
            lease,
            ..PutRequest::default()
        })),
    }
}

/// Deletes one key, returning what it held.
fn delete_op(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
            key,
            prev_kv: true,
            ..DeleteRangeRequest::default()
        })),
    }
}

/// The one response of a transaction branch.
fn first_response(resp: &mut TxnResponse) -> Option<Response> {
    if resp.responses.is_empty() {
        return None;
    }
    resp.responses.swap_remove(0).response
}

/// The key-value read by the failure branch of a transaction (its one `get`).
fn else_branch_kv(
    shared: &EtcdState,
    mut resp: TxnResponse,
) -> Result<Option<KeyValue>, StoreError> {
    match first_response(&mut resp) {
        Some(Response::ResponseRange(range)) => {
            Ok(range.kvs.into_iter().next().map(|kv| shared.convert(kv)))
        }
        _ => Err(inconsistent("transaction failure branch without a read")),
    }
}

impl EtcdStore {
    /// Runs `write` with a lease for `ttl`; a lease etcd no longer knows (revoked or expired
    /// while cached) is forgotten and the write tried once more with a new one.
    async fn with_lease<F, Fut>(&self, ttl: Duration, write: F) -> Result<KeyValue, StoreError>
    where
        F: Fn(i64) -> Fut,
        Fut: Future<Output = Result<KeyValue, StoreError>>,
    {
        let leases = &self.shared.leases;
        let lease = leases.lease_for(&self.shared, ttl).await?;
        match write(lease).await {
            Err(err) if lease_not_found(&err) => {
                leases.forget(ttl, lease).await;
                write(leases.lease_for(&self.shared, ttl).await?).await
            }
            other => other,
        }
    }

    async fn create_leased(
        &self,
        key: Bytes,
        value: Bytes,
        lease: i64,
    ) -> Result<KeyValue, StoreError> {
        let s = &self.shared;
        let full = s.full_key(&key);
        let txn = TxnRequest {
            compare: vec![create_revision(&full, CompareResult::Equal, 0)],
            success: vec![put_op(full.clone(), value.to_vec(), false, lease)],
            failure: vec![get_op(full)],
        };
        let resp = s.txn(txn).await?;
        if resp.succeeded {
            let revision = header_revision(resp.header.as_ref())?;
            return Ok(KeyValue {
                key,
                value,
                create_revision: revision,
                mod_revision: revision,
                version: 1,
            });
        }
        match else_branch_kv(s, resp)? {
            Some(current) => Err(StoreError::AlreadyExists {
                current: Box::new(current),
            }),
            // Cannot happen: the compare failed because the key existed in this revision.
            None => Err(inconsistent("create refused but the key is absent")),
        }
    }

    async fn update_leased(
        &self,
        key: Bytes,
        value: Bytes,
        expected: Revision,
        lease: i64,
    ) -> Result<KeyValue, StoreError> {
        let s = &self.shared;
        let full = s.full_key(&key);
        let txn = TxnRequest {
            compare: vec![
                create_revision(&full, CompareResult::Greater, 0),
                mod_revision_is(&full, expected),
            ],
            success: vec![put_op(full.clone(), value.to_vec(), true, lease)],
            failure: vec![get_op(full)],
        };
        let mut resp = s.txn(txn).await?;
        if resp.succeeded {
            let revision = header_revision(resp.header.as_ref())?;
            let prev = match first_response(&mut resp) {
                Some(Response::ResponsePut(put)) => put.prev_kv.map(|kv| s.convert(kv)),
                _ => None,
            };
            let prev = prev.ok_or_else(|| inconsistent("update without the previous value"))?;
            return Ok(KeyValue {
                key,
                value,
                create_revision: prev.create_revision,
                mod_revision: revision,
                version: prev.version.saturating_add(1),
            });
        }
        match else_branch_kv(s, resp)? {
            Some(current) => Err(StoreError::Conflict {
                current: Box::new(current),
            }),
            None => Err(StoreError::NotFound),
        }
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn create(&self, key: Bytes, value: Bytes) -> Result<KeyValue, StoreError> {
        self.create_leased(key, value, 0).await
    }

    async fn update(
        &self,
        key: Bytes,
        value: Bytes,
        expected: Revision,
    ) -> Result<KeyValue, StoreError> {
        self.update_leased(key, value, expected, 0).await
    }

    async fn create_with_ttl(
        &self,
        key: Bytes,
        value: Bytes,
        ttl: Duration,
    ) -> Result<KeyValue, StoreError> {
        self.with_lease(ttl, |lease| {
            self.create_leased(key.clone(), value.clone(), lease)
        })
        .await
    }

    async fn update_with_ttl(
        &self,
        key: Bytes,
        value: Bytes,
        expected: Revision,
        ttl: Duration,
    ) -> Result<KeyValue, StoreError> {
        self.with_lease(ttl, |lease| {
            self.update_leased(key.clone(), value.clone(), expected, lease)
        })
        .await
    }

    async fn delete(
        &self,
        key: Bytes,
        expected: Option<Revision>,
    ) -> Result<(KeyValue, Revision), StoreError> {
        let s = &self.shared;
        let full = s.full_key(&key);
        let condition = match expected {
            Some(rev) => mod_revision_is(&full, rev),
            None => create_revision(&full, CompareResult::Greater, 0),
        };
        let txn = TxnRequest {
            compare: vec![condition],
            success: vec![delete_op(full.clone())],
            failure: vec![get_op(full)],
        };
        let mut resp = s.txn(txn).await?;
        if resp.succeeded {
            let revision = header_revision(resp.header.as_ref())?;
            let deleted = match first_response(&mut resp) {
                Some(Response::ResponseDeleteRange(del)) => {
                    del.prev_kvs.into_iter().next().map(|kv| s.convert(kv))
                }
                _ => None,
            };
            let deleted =
                deleted.ok_or_else(|| inconsistent("delete without the previous value"))?;
            return Ok((deleted, revision));
        }
        match else_branch_kv(s, resp)? {
            Some(current) => Err(StoreError::Conflict {
                current: Box::new(current),
            }),
            None => Err(StoreError::NotFound),
        }
    }

    async fn get(
        &self,
        key: Bytes,
        at: Option<Revision>,
    ) -> Result<(Option<KeyValue>, Revision), StoreError> {
        let s = &self.shared;
        let request = RangeRequest {
            key: s.full_key(&key),
            revision: at.unwrap_or(0),
            ..RangeRequest::default()
        };
        let resp = match s.range(request).await {
            Ok(resp) => resp,
            Err(e) => return Err(s.revision_error(e, at.unwrap_or(0)).await),
        };
        let revision = match at {
            Some(rev) => rev,
            None => header_revision(resp.header.as_ref())?,
        };
        Ok((
            resp.kvs.into_iter().next().map(|kv| s.convert(kv)),
            revision,
        ))
    }

    async fn range(
        &self,
        range: KeyRange,
        at: Option<Revision>,
        limit: usize,
    ) -> Result<RangeResult, StoreError> {
        let s = &self.shared;
        let (start, end) = s.full_range(&range);
        let request = RangeRequest {
            key: start,
            range_end: end,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            revision: at.unwrap_or(0),
            ..RangeRequest::default()
        };
        let resp = match s.range(request).await {
            Ok(resp) => resp,
            Err(e) => return Err(s.revision_error(e, at.unwrap_or(0)).await),
        };
        let revision = match at {
            Some(rev) => rev,
            None => header_revision(resp.header.as_ref())?,
        };
        Ok(RangeResult {
            kvs: resp.kvs.into_iter().map(|kv| s.convert(kv)).collect(),
            revision,
            more: resp.more,
        })
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        self.shared.current_revision().await
    }

    async fn compacted_revision(&self) -> Result<Revision, StoreError> {
        self.shared.probe_compacted().await
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let s = &self.shared;
        let request = CompactionRequest {
            revision,
            physical: true,
        };
        // Compacting twice is harmless, so it may be retried like a read.
        let compact = |c: Client| async move { c.compact(request).await };
        match s.call(Retry::Always, compact).await {
            Ok(_) => {
                s.note_compacted(revision);
                Ok(())
            }
            // At or below the current compaction point: nothing to do.
            Err(StoreError::Compacted { .. }) => Ok(()),
            Err(e) => Err(s.revision_error(e, revision).await),
        }
    }

    fn watch(&self, range: KeyRange, after: Revision) -> FeedStream {
        feed::start(self.shared.clone(), range, after, self.closed.subscribe())
    }

    async fn health(&self) -> Result<(), StoreError> {
        // A linearizable read needs a quorum with a leader: exactly "can serve writes".
        self.shared.current_revision().await.map(|_| ())
    }
}
