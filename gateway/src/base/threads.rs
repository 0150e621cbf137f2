//! A Tokio runtime on threads of its own, beside the request runtime: the caches' ingest
//! thread (`registry::caches`), the list threads (`serve::bulk`) and the thread of a proxy's
//! own calls to its upstream (`outbound::upstream`). Dropping one stops its
//! threads without waiting for them, so the last holder of the server's state may drop it
//! from anywhere, one of its own threads included.

use std::future::Future;
use std::io;

use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;

/// A runtime of its own; dropping it stops its threads without waiting for them.
pub struct Threads {
    rt: Option<Runtime>,
    handle: Handle,
}

impl Threads {
    /// `count` worker threads named `name`; each runs `on_start` first.
    pub fn new(
        name: &'static str,
        count: usize,
        on_start: impl Fn() + Send + Sync + 'static,
    ) -> io::Result<Threads> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(count.max(1))
            .thread_name(name)
            .on_thread_start(on_start)
            .on_thread_park(crate::base::allocator::on_park)
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        Ok(Threads {
            rt: Some(rt),
            handle,
        })
    }

    /// Where to spawn onto these threads.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Runs `fut` on one of these threads.
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(fut)
    }
}

impl std::fmt::Debug for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Threads").finish_non_exhaustive()
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        // A runtime dropped inside another's task would block it; this one is not waited for.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
