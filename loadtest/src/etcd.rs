//! The etcd baseline over etcd's native gRPC API, used the way an API server uses etcd: a few
//! HTTP/2 connections (`--etcd-connections`), each carrying Watch streams that multiplex many
//! watches (`--etcd-watches-per-stream`, 100 by default). Every watcher is one watch on the
//! run's key prefix, so, as in the fan-out scenario against a server, each sees every write.
//! Writes are KV Put (and DeleteRange for churn), each acknowledged before the next.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

use crate::etcd_pb::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, WatchCreateRequest, WatchRequest, WatchResponse,
    kv_client::KvClient, watch_client::WatchClient, watch_request,
};
use crate::stats::{Live, now_nanos};
use crate::watch::{WState, digits, on_event};

/// Longest wait for one call or for a stream's watches to be created.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Streams being opened at once.
const OPEN_CONCURRENCY: usize = 32;
/// Largest watch response accepted (etcd batches many events per response).
const MAX_MESSAGE: usize = 64 << 20;

/// The connections of one run: one tonic channel (one HTTP/2 connection) each.
#[derive(Clone)]
pub struct Etcd {
    channels: Arc<Vec<Channel>>,
}

impl Etcd {
    /// Opens `n` connections to `url` (`http://host:port`, already checked to be loopback).
    pub async fn connect(url: &str, n: usize) -> Result<Self> {
        let mut channels = Vec::with_capacity(n.max(1));
        for _ in 0..n.max(1) {
            let ch = Endpoint::from_shared(url.to_string())
                .map_err(|e| anyhow!("{url}: {e}"))?
                .tcp_nodelay(true)
                .connect_timeout(Duration::from_secs(10))
                // Larger windows, as for the h2 watchers of a server: a watch stream is a
                // long one-way flow.
                .initial_stream_window_size(1 << 20)
                .initial_connection_window_size(16 << 20)
                .connect()
                .await
                .with_context(|| format!("connecting to etcd at {url}"))?;
            channels.push(ch);
        }
        Ok(Etcd {
            channels: Arc::new(channels),
        })
    }

    fn channel(&self, i: usize) -> Channel {
        self.channels[i % self.channels.len()].clone()
    }

    /// The store's current revision (watches start right after it).
    pub async fn revision(&self, prefix: &[u8]) -> Result<i64> {
        let req = RangeRequest {
            key: prefix.to_vec(),
            range_end: prefix_end(prefix),
            limit: 1,
            ..Default::default()
        };
        let r = tokio::time::timeout(CALL_TIMEOUT, KvClient::new(self.channel(0)).range(req))
            .await
            .map_err(|_| anyhow!("etcd range: timed out"))?
            .map_err(|s| anyhow!("etcd range: {}", s.message()))?
            .into_inner();
        r.header
            .map(|h| h.revision)
            .context("etcd range has no header")
    }
}

/// The end of the key range holding every key that starts with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Watchers opened on one run's prefix: a receiving task per stream returning the states of
/// its watchers (in index order, streams in order).
pub struct Watchers {
    pub tasks: Vec<JoinHandle<Vec<WState>>>,
    pub opened: usize,
}

/// Opens `n` watches on `prefix` from `start_revision`, `per_stream` to a Watch stream, the
/// streams spread round-robin over the connections; returns once etcd confirmed every watch.
pub async fn open_watchers(
    etcd: &Etcd,
    prefix: &[u8],
    start_revision: i64,
    n: usize,
    per_stream: usize,
    live: Arc<Live>,
    stop: watch::Receiver<bool>,
) -> Result<Watchers> {
    let per_stream = per_stream.max(1);
    let streams = n.div_ceil(per_stream);
    let opened: Vec<Result<(usize, JoinHandle<Vec<WState>>)>> = futures::stream::iter(0..streams)
        .map(|s| {
            let k = per_stream.min(n - s * per_stream);
            let ch = etcd.channel(s);
            let prefix = prefix.to_vec();
            let (live, stop) = (live.clone(), stop.clone());
            async move {
                let (tx, resp) = open_stream(ch, &prefix, start_revision, k).await?;
                Ok((k, tokio::spawn(receive(resp, tx, k, live, stop))))
            }
        })
        .buffered(OPEN_CONCURRENCY)
        .collect()
        .await;
    let mut tasks = Vec::with_capacity(streams);
    let mut count = 0;
    for r in opened {
        let (k, t) = r?;
        count += k;
        tasks.push(t);
    }
    Ok(Watchers {
        tasks,
        opened: count,
    })
}

type Requests = futures::channel::mpsc::Sender<WatchRequest>;

/// One Watch stream carrying `k` watches with ids 1..=k; waits until etcd created them all.
async fn open_stream(
    ch: Channel,
    prefix: &[u8],
    start_revision: i64,
    k: usize,
) -> Result<(Requests, tonic::Streaming<WatchResponse>)> {
    let (mut tx, rx) = futures::channel::mpsc::channel::<WatchRequest>(k + 1);
    for id in 1..=k {
        let create = WatchCreateRequest {
            key: prefix.to_vec(),
            range_end: prefix_end(prefix),
            start_revision,
            watch_id: id as i64,
            ..Default::default()
        };
        tx.try_send(WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
        })
        .map_err(|e| anyhow!("queueing a watch: {e}"))?;
    }
    let mut client = WatchClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let deadline = Instant::now() + CALL_TIMEOUT;
    let mut resp = tokio::time::timeout_at(deadline.into(), client.watch(rx))
        .await
        .map_err(|_| anyhow!("etcd watch: timed out"))?
        .map_err(|s| anyhow!("etcd watch: {}", s.message()))?
        .into_inner();
    let mut created = 0;
    while created < k {
        let m = tokio::time::timeout_at(deadline.into(), resp.message())
            .await
            .map_err(|_| anyhow!("etcd watch: {created} of {k} watches created in time"))?
            .map_err(|s| anyhow!("etcd watch: {}", s.message()))?
            .ok_or_else(|| anyhow!("etcd watch: the stream ended while creating watches"))?;
        if m.canceled {
            bail!("etcd watch {} refused: {}", m.watch_id, m.cancel_reason);
        }
        if m.created {
            created += 1;
        } else if !m.events.is_empty() {
            bail!("etcd watch: events before every watch was created");
        }
    }
    Ok((tx, resp))
}

/// Reads one stream until `stop`: each event is counted for the watch it names.
async fn receive(
    mut resp: tonic::Streaming<WatchResponse>,
    // Kept open: the stream lives as long as its requests may still come.
    _requests: Requests,
    k: usize,
    live: Arc<Live>,
    mut stop: watch::Receiver<bool>,
) -> Vec<WState> {
    let mut states = vec![WState::default(); k];
    let mut lat: Vec<u64> = Vec::with_capacity(1024);
    loop {
        if *stop.borrow() {
            break;
        }
        let m = tokio::select! {
            m = resp.message() => m,
            r = stop.changed() => if r.is_err() { break } else { continue },
        };
        let m = match m {
            Ok(Some(m)) => m,
            Ok(None) | Err(_) if live.stopping.load(Relaxed) => break,
            Ok(None) => {
                live.watch_errors.fetch_add(1, Relaxed);
                live.note_error("etcd watch stream ended early".into());
                break;
            }
            Err(s) => {
                live.watch_errors.fetch_add(1, Relaxed);
                live.note_error(format!("etcd watch stream: {}", s.message()));
                break;
            }
        };
        if m.canceled {
            live.watch_errors.fetch_add(1, Relaxed);
            live.note_error(format!("etcd watch canceled: {}", m.cancel_reason));
        }
        if m.events.is_empty() {
            continue;
        }
        let Some(st) = usize::try_from(m.watch_id - 1)
            .ok()
            .and_then(|i| states.get_mut(i))
        else {
            live.watch_errors.fetch_add(1, Relaxed);
            live.note_error(format!(
                "etcd watch: events for unknown watch {}",
                m.watch_id
            ));
            continue;
        };
        let now = now_nanos();
        let before = st.count;
        lat.clear();
        for ev in &m.events {
            let Some(kv) = &ev.kv else { continue };
            // The value starts with the writer's 19-digit timestamp.
            let ts = digits(&kv.value);
            on_event(st, &mut lat, now, Some(kv.mod_revision as u64), ts);
        }
        live.delivered.fetch_add(st.count - before, Relaxed);
        if !lat.is_empty()
            && let Some(h) = live.interval.lock().as_mut()
        {
            for &l in &lat {
                h.saturating_record(l.max(1));
            }
        }
    }
    states
}

/// What one etcd writer does with key `i` of its sequence.
pub enum Write {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

/// One write, bounded in time; an error names the call.
pub async fn write(etcd: &Etcd, conn: usize, w: Write) -> Result<()> {
    let mut kv = KvClient::new(etcd.channel(conn));
    let call = async {
        match w {
            Write::Put(key, value) => kv
                .put(PutRequest {
                    key,
                    value,
                    ..Default::default()
                })
                .await
                .map(|_| ()),
            Write::Delete(key) => kv
                .delete_range(DeleteRangeRequest {
                    key,
                    ..Default::default()
                })
                .await
                .map(|_| ()),
        }
    };
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| anyhow!("etcd write: timed out"))?
        .map_err(|s| anyhow!("etcd write: {}: {}", s.code(), s.message()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_every_key_with_the_prefix() {
        assert_eq!(prefix_end(b"/loadtest/a/"), b"/loadtest/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }
}
