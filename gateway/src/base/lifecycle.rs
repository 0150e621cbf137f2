//! Start-up and shutdown plumbing shared by every layer: post-start hooks that readiness
//! waits for, the stop signals long-running tasks and requests select on, and the GOAWAYs
//! shutdown waits for before it ends the watches.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::RwLock;
use tokio::sync::{Notify, watch};

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

/// Resolves `grace` after `flag` turns true: how long a connection that was being opened when
/// shutdown began gets to finish opening and send its first request (Go's server gives new
/// connections the same chance).
pub async fn grace_after(flag: &mut watch::Receiver<bool>, grace: std::time::Duration) {
    until_set(flag).await;
    tokio::time::sleep(grace).await;
}

/// The connections that owe their clients a farewell (h2's GOAWAY) once shutdown asks them to
/// close. Shutdown ends the watches only when every one has said it: a client that learns the
/// connection is going before its watch ends opens the next watch elsewhere, not on the
/// closing connection (where Go's client meets a broken pipe, and client-go's reflector
/// lists again).
#[derive(Default)]
pub struct Farewells {
    owed: AtomicUsize,
    said: Notify,
}

/// One connection's farewell, owed until dropped.
pub struct Farewell(Arc<Farewells>);

impl Farewells {
    pub fn owe(self: &Arc<Self>) -> Farewell {
        self.owed.fetch_add(1, Ordering::AcqRel);
        Farewell(self.clone())
    }

    /// Resolves once no connection owes one.
    pub async fn all_said(&self) {
        loop {
            let said = self.said.notified();
            tokio::pin!(said);
            said.as_mut().enable();
            if self.owed.load(Ordering::Acquire) == 0 {
                return;
            }
            said.await;
        }
    }
}

impl Drop for Farewell {
    fn drop(&mut self) {
        if self.0.owed.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.said.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn all_said_waits_for_the_last_farewell() {
        let f = Arc::new(Farewells::default());
        tokio::time::timeout(Duration::from_secs(5), f.all_said())
            .await
            .expect("none owed: at once");
        let a = f.owe();
        let b = f.owe();
        let wait = tokio::spawn({
            let f = f.clone();
            async move { f.all_said().await }
        });
        drop(a);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!wait.is_finished(), "one farewell is still owed");
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .expect("resolves with the last")
            .unwrap();
    }
}
