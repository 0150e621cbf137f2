//! Start-up and shutdown plumbing shared by every layer: post-start hooks that readiness
//! waits for, and the stop signals long-running tasks and requests select on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;
use tokio::sync::watch;

/// Post-start hooks: named start-up tasks that readiness waits for (`poststarthook/<name>`).
#[derive(Default)]
pub struct PostStartHooks {
    hooks: RwLock<Vec<(String, Arc<AtomicBool>)>>,
}

impl PostStartHooks {
    /// Registers a hook; the returned flag is set when it has finished.
    pub fn register(&self, name: &str) -> Arc<AtomicBool> {
        let done = Arc::new(AtomicBool::new(false));
        self.hooks
            .write()
            .push((format!("poststarthook/{name}"), done.clone()));
        done
    }

    pub(crate) fn list(&self) -> Vec<(String, bool)> {
        self.hooks
            .read()
            .iter()
            .map(|(n, d)| (n.clone(), d.load(Ordering::Acquire)))
            .collect()
    }
}

/// Resolves once `flag` turns true (or its sender is gone); holds no borrow across awaits.
pub async fn until_set(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|s| *s).await;
}
