//! Bounds on connections, below the HTTP layer: how many are open at once (`--max-connections`,
//! since file descriptors are finite), and when one that carries no request is closed
//! (`--http-idle-timeout`, Go's `IdleTimeout` for HTTP/1.1 and h2 alike).
//!
//! The cap works like Go's `netutil.LimitListener`: the accept loop takes a permit before it
//! accepts, so past the cap new connections wait in the kernel's backlog instead of being
//! accepted and dropped; a permit is given back when its connection ends.
//!
//! Idleness is counted in requests, not bytes: a connection is busy while any of its requests
//! is being handled or its response body (a watch, say) is being written, however quiet that
//! response is. Once no request has been in flight for the idle timeout, the connection is
//! closed gracefully (HTTP/1.1: closed between requests; h2: GOAWAY).
//!
//! The listeners' accept queues are as long as the kernel allows (`net.core.somaxconn`), as
//! Go's listeners are ([`listen`]): a burst of connections (every informer of a relist storm
//! reconnecting at once) waits there for the accept loop instead of having its SYNs dropped
//! and retried a second later.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The accept queue asked for where `net.core.somaxconn` cannot be read: Linux's default
/// since 5.4 (the kernel caps what is asked at `somaxconn` in any case).
const DEFAULT_BACKLOG: u32 = 4096;

/// A listener on `addr` (address reuse on, as `TcpListener::bind` sets it) whose accept queue
/// is `net.core.somaxconn` long, where `TcpListener::bind` asks for 1,024. Past the queue the
/// kernel drops a connection's SYN and the client sends it again one second later, three
/// the second time: 2,000 informers relisting at once had 200 of them wait a second or more.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(somaxconn_backlog())
}

/// The accept queue to ask for on this machine.
fn somaxconn_backlog() -> u32 {
    let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn").ok();
    backlog(somaxconn.as_deref())
}

/// The accept queue to ask for, from the text of `/proc/sys/net/core/somaxconn`.
fn backlog(somaxconn: Option<&str>) -> u32 {
    somaxconn
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|&n| n > 0)
        // listen(2) takes an int.
        .map_or(DEFAULT_BACKLOG, |n| n.min(i32::MAX as u32))
}

/// File descriptors kept back from the connection cap derived from the open-file limit: the
/// store's files, etcd and webhook connections, the listeners themselves.
const RESERVED_FDS: usize = 256;

/// The smallest derived cap, however low the open-file limit.
const MIN_DERIVED_CAP: usize = 64;

/// The cap on open connections: `--max-connections`, or with 0 the process's open-file limit
/// less what other files need. `None` when the limit cannot be read (no cap).
pub fn connection_cap(flag: usize) -> Option<usize> {
    if flag > 0 {
        return Some(flag);
    }
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let soft = open_file_limit(&limits)?;
    Some(soft.saturating_sub(RESERVED_FDS).max(MIN_DERIVED_CAP))
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text (`None` when unlimited or absent).
fn open_file_limit(limits: &str) -> Option<usize> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How long a connection asked to close (idle, or at shutdown) may take to do so while it
/// carries no request.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The permits of the connection cap (no permits needed without a cap).
#[derive(Clone, Debug)]
pub struct ConnectionLimit {
    permits: Option<Arc<Semaphore>>,
}

impl ConnectionLimit {
    pub fn new(cap: Option<usize>) -> Self {
        ConnectionLimit {
            permits: cap.map(|n| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)))),
        }
    }

    /// Waits for room for one more connection; the permit is held for the connection's life.
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        match &self.permits {
            None => None,
            // The semaphore is never closed, so this only fails if it were.
            Some(s) => s.clone().acquire_owned().await.ok(),
        }
    }

    /// Connections that may still be opened (None: no cap).
    pub fn available(&self) -> Option<usize> {
        self.permits.as_ref().map(|s| s.available_permits())
    }
}

/// Requests in flight on one connection, and a signal each time that number changes.
#[derive(Debug, Default)]
pub struct Activity {
    active: AtomicUsize,
    /// Counts the changes of `active`: a connection's task polls its idle timer again only
    /// once this moved (or nothing is in flight), not on every wake-up.
    changes: AtomicU64,
    changed: Notify,
}

/// One request in flight; dropping it (with the response body) ends it.
#[derive(Debug)]
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
        self.0.changes.fetch_add(1, Ordering::AcqRel);
        self.0.changed.notify_waiters();
    }
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Activity::default())
    }

    /// Marks a request as started.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.active.fetch_add(1, Ordering::AcqRel);
        self.changes.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
        Busy(self.clone())
    }

    pub fn in_flight(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// How many times the count of requests in flight changed.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Resolves once no request has been in flight for `timeout` without interruption.
    pub async fn idle_for(&self, timeout: Duration) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the count is read, so no change in between is missed.
            changed.as_mut().enable();
            if self.in_flight() > 0 {
                changed.await;
            } else if tokio::time::timeout(timeout, changed).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_file_limit_is_read_from_proc_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max cpu time              unlimited            unlimited            seconds   \n\
                    Max open files            20000                1048576              files     \n";
        assert_eq!(open_file_limit(text), Some(20000));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(open_file_limit(unlimited), None);
        assert_eq!(open_file_limit("Max processes 10 10 processes\n"), None);
        assert_eq!(connection_cap(7), Some(7));
        // Derived on this machine: never below the floor.
        if let Some(cap) = connection_cap(0) {
            assert!(cap >= MIN_DERIVED_CAP);
        }
    }

    #[test]
    fn the_backlog_is_somaxconn() {
        assert_eq!(backlog(Some("4096\n")), 4096);
        assert_eq!(backlog(Some("65535")), 65535);
        assert_eq!(backlog(Some("4294967295")), i32::MAX as u32);
        assert_eq!(backlog(Some("0")), DEFAULT_BACKLOG);
        assert_eq!(backlog(Some("x")), DEFAULT_BACKLOG);
        assert_eq!(backlog(None), DEFAULT_BACKLOG);
    }

    /// A burst larger than `TcpListener::bind`'s queue of 1,024, none of it accepted yet:
    /// every connection completes its handshake at once (none waits a second for its SYN to
    /// be sent again), as a relist storm's reconnects need.
    #[tokio::test]
    async fn a_burst_past_1024_connections_waits_in_the_accept_queue() {
        const BURST: usize = 1_500;
        if somaxconn_backlog() < BURST as u32 || !raise_open_files(2 * BURST + 256) {
            eprintln!("skipped: needs somaxconn and an open-file limit above the burst");
            return;
        }
        let listener = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let connects = (0..BURST).map(|_| {
            tokio::time::timeout(
                Duration::from_millis(700),
                tokio::net::TcpStream::connect(addr),
            )
        });
        let results = futures::future::join_all(connects).await;
        let connected = results.iter().filter(|r| matches!(r, Ok(Ok(_)))).count();
        assert_eq!(connected, BURST, "connections left waiting for a SYN retry");
        drop(listener);
    }

    /// Raises the soft open-file limit to at least `want` (up to the hard limit).
    #[allow(unsafe_code, reason = "getrlimit and setrlimit have no safe binding")]
    fn raise_open_files(want: usize) -> bool {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit read and write the struct passed, nothing else.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return false;
            }
            if lim.rlim_cur >= want as libc::rlim_t {
                return true;
            }
            if lim.rlim_max < want as libc::rlim_t {
                return false;
            }
            lim.rlim_cur = want as libc::rlim_t;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0
        }
    }

    #[tokio::test]
    async fn the_cap_holds_until_a_permit_is_given_back() {
        let limit = ConnectionLimit::new(Some(2));
        let a = limit.acquire().await.unwrap();
        let _b = limit.acquire().await.unwrap();
        assert_eq!(limit.available(), Some(0));
        let third = tokio::spawn({
            let limit = limit.clone();
            async move { limit.acquire().await.is_some() }
        });
        tokio::task::yield_now().await;
        assert!(!third.is_finished());
        drop(a);
        assert!(third.await.unwrap());
        assert!(ConnectionLimit::new(None).acquire().await.is_none());
    }

    #[tokio::test]
    async fn idleness_counts_requests_and_restarts_with_each() {
        let timeout = Duration::from_secs(1);
        let activity = Activity::new();
        let busy = activity.begin();
        let idle = tokio::spawn({
            let a = activity.clone();
            async move { a.idle_for(timeout).await }
        });
        // A request in flight for longer than the timeout keeps the connection busy.
        tokio::time::sleep(timeout * 2).await;
        assert!(!idle.is_finished());
        drop(busy);
        // A short request soon after restarts the count.
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(activity.begin());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!idle.is_finished());
        tokio::time::timeout(timeout * 10, idle)
            .await
            .expect("idle once nothing is in flight")
            .unwrap();
        assert_eq!(activity.in_flight(), 0);
    }
}
