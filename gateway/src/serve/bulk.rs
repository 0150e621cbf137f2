//! Threads of their own, at a lower OS priority, for the requests that move the most bytes
//! for the least urgency: lists (`--list-niceness`). A list of 10,000 objects
//! is megabytes to gather, encrypt and copy into a socket; 32 clients listing at once kept
//! both request threads of a 2-core machine busy, and a write queued behind them (writer
//! p99 5.6–9× its p99 alone, in BENCHMARKS.md). Here a list's request, from its handler to
//! its response's last byte, runs on the bulk runtime, whose threads run at the niceness
//! asked for: when the CPUs are busy, the kernel runs the request threads (writes, gets,
//! watches) ahead of them, and the request threads' own queues hold no lists.
//!
//! The sockets stay registered with the request runtime's reactor: a bulk thread only polls
//! them. Over h2, a list's request task (its handler, and handing its body to h2 as the
//! stream's window allows) runs here; the connection's one task, which encrypts and writes
//! for every stream of it, stays on the request threads.

use std::future::Future;
use std::io;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::base::router;
use crate::base::threads::Threads;

/// The bulk runtime. Dropping it stops its threads without waiting for them.
pub struct Bulk {
    threads: Threads,
}

impl Bulk {
    /// A runtime of `threads` threads, each `steps` nicer than the thread that
    /// started it (up to 19).
    pub fn new(threads: usize, steps: u8) -> io::Result<Bulk> {
        // Absolute, so that a thread a bulk thread starts (which inherits its niceness) gets
        // the same, not more.
        let to = niceness().saturating_add(i32::from(steps)).min(19);
        let threads = Threads::new("svc-bulk", threads, move || {
            if let Err(e) = set_niceness(to) {
                tracing::warn!(error = %e, to, "bulk thread left at the process's niceness");
            }
        })?;
        Ok(Bulk { threads })
    }

    /// Where to spawn onto the bulk threads.
    pub fn handle(&self) -> &Handle {
        self.threads.handle()
    }

    /// Runs `fut` on a bulk thread.
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.threads.spawn(fut)
    }
}

/// Whether a request is a list (a GET of a collection, not a watch): what runs here. Told by
/// the path's shape, as Kubernetes' request info tells it, so that the kinds this server does
/// not know itself (custom resources, an upstream's in proxy mode) are told too: after the
/// group and version, `{resource}` or `namespaces/{namespace}/{resource}` (but not a
/// namespace's own `status` or `finalize`).
pub fn is_list(method: &http::Method, uri: &http::Uri) -> bool {
    if method != http::Method::GET {
        return false;
    }
    let (watch, rest) = router::watch_and_rest(uri);
    if watch {
        return false;
    }
    let parts = match rest.as_slice() {
        ["namespaces", _, sub, tail @ ..] if !matches!(*sub, "status" | "finalize") => {
            tail.len().saturating_add(1)
        }
        all => all.len(),
    };
    parts == 1
}

/// Sets the calling thread's niceness to `to`: on Linux each thread has its own, and
/// `setpriority(PRIO_PROCESS, 0, n)` sets the caller's. Raising it needs no privilege.
#[cfg(target_os = "linux")]
#[allow(unsafe_code, reason = "setpriority has no safe binding")]
pub fn set_niceness(to: i32) -> io::Result<()> {
    // SAFETY: `setpriority` takes plain integers and changes only the calling thread's niceness.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, to) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Elsewhere the niceness is per process: bulk threads keep the process's.
#[cfg(not(target_os = "linux"))]
pub fn set_niceness(_to: i32) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "per-thread niceness is Linux's",
    ))
}

/// The calling thread's niceness (on Linux, its own).
#[allow(unsafe_code, reason = "getpriority has no safe binding")]
pub fn niceness() -> i32 {
    // SAFETY: `getpriority` takes plain integers and reads the calling thread's niceness. Its
    // -1 for an error is also a valid niceness; the caller (this thread) always exists.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn bulk_threads_run_at_the_niceness_asked_and_the_caller_keeps_its_own() {
        let before = niceness();
        let bulk = Bulk::new(1, 7).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let inside = rt.block_on(bulk.spawn(async { niceness() })).unwrap();
        assert_eq!(inside, (before + 7).min(19));
        assert_eq!(niceness(), before);
    }

    #[test]
    fn lists_are_gets_of_collections_that_are_not_watches() {
        let list = |m: http::Method, u: &str| is_list(&m, &u.parse().unwrap());
        assert!(list(http::Method::GET, "/api/v1/namespaces"));
        assert!(list(
            http::Method::GET,
            "/api/v1/namespaces/a/serviceaccounts?limit=500"
        ));
        assert!(!list(http::Method::GET, "/api/v1/namespaces?watch=true"));
        assert!(!list(http::Method::GET, "/api/v1/watch/namespaces"));
        assert!(!list(http::Method::GET, "/api/v1/namespaces/default"));
        assert!(!list(http::Method::POST, "/api/v1/namespaces"));
        assert!(!list(http::Method::GET, "/readyz"));
    }

    #[test]
    fn a_bulk_runtime_dropped_on_one_of_its_own_threads_lets_that_task_finish() {
        // The server's state owns the runtime and the tasks on it hold the state: the last
        // holder may be a list's task on a bulk thread.
        let bulk = std::sync::Arc::new(parking_lot::Mutex::new(Some(Bulk::new(1, 1).unwrap())));
        let inner = bulk.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(b) = bulk.lock().as_ref() {
            drop(b.spawn(async move {
                let taken = inner.lock().take();
                drop(taken);
                tx.send(()).unwrap();
            }));
        }
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the task that dropped its runtime ran on to its end");
        assert!(bulk.lock().is_none());
    }

    #[test]
    fn a_bulk_runtime_dropped_inside_a_task_does_not_block_it() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let bulk = Bulk::new(2, 5).unwrap();
            assert_eq!(bulk.spawn(async { 1 + 1 }).await.unwrap(), 2);
            drop(bulk);
        });
    }
}
