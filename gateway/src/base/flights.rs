//! One call at a time per key ("single flight"): callers asking for a key while a call for
//! it is under way wait for that call's result instead of making their own. The proxy's
//! access reviews go through it, so that thousands of clients starting together with the
//! same identity and the same question (every node's kube-proxy listing Services as
//! `system:kube-proxy`) cost the upstream one SubjectAccessReview, not one each.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::OnceCell;

/// The calls under way, by key.
pub struct Flights<K, V> {
    under_way: Mutex<HashMap<K, Arc<OnceCell<V>>>>,
}

impl<K, V> Default for Flights<K, V> {
    fn default() -> Self {
        Flights {
            under_way: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone, V: Clone> Flights<K, V> {
    /// The result of `call` for `key`, or of the call for `key` already under way. A caller
    /// dropped while its call runs hands the call on: the next caller waiting makes it.
    pub async fn run<F, Fut>(&self, key: K, call: F) -> V
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        let cell = self
            .under_way
            .lock()
            .entry(key.clone())
            .or_default()
            .clone();
        let value = cell.get_or_init(call).await.clone();
        let mut under_way = self.under_way.lock();
        if under_way.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            under_way.remove(&key);
        }
        value
    }

    /// No call is under way.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.under_way.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn callers_of_one_key_share_one_call_and_other_keys_have_their_own() {
        let flights: Arc<Flights<&str, usize>> = Arc::new(Flights::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for key in ["a", "a", "a", "a", "b"] {
            let (flights, calls) = (flights.clone(), calls.clone());
            tasks.push(tokio::spawn(async move {
                flights
                    .run(key, || async {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        calls.fetch_add(1, Ordering::SeqCst) + 1
                    })
                    .await
            }));
        }
        let mut got = Vec::new();
        for t in tasks {
            got.push(t.await.unwrap_or_default());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one call for a, one for b");
        assert_eq!(
            got[..4],
            [got[0]; 4],
            "every caller of a got a's one result"
        );
        assert!(flights.is_empty(), "nothing left under way");
        // Once done, a key is asked again.
        let again = flights.run("a", || async { 99 }).await;
        assert_eq!(again, 99);
    }

    #[tokio::test]
    async fn a_caller_dropped_mid_call_hands_it_on() {
        let flights: Arc<Flights<&str, u8>> = Arc::new(Flights::default());
        let first = {
            let flights = flights.clone();
            tokio::spawn(async move {
                flights
                    .run("k", || async {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        1
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = {
            let flights = flights.clone();
            tokio::spawn(async move { flights.run("k", || async { 2 }).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        first.abort();
        let got = tokio::time::timeout(Duration::from_secs(5), second).await;
        assert!(matches!(got, Ok(Ok(2))), "{got:?}");
    }
}
