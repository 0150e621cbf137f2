//! Reloading a configuration file without a restart: the file's content hash is polled at an
//! interval (`--config-reload-interval`), and a changed file is handed to the owner's `apply`.
//! A version `apply` refuses leaves the one in force alone; the refusal is logged and counted.
//! Authentication and authorization configuration share this, each with its metric prefix
//! (`apiserver_authentication_config_controller`, `apiserver_authorization_config_controller`).

use std::io::Read as _;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Configuration files larger than this are refused rather than read.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

/// `<prefix>_automatic_reloads_total{status}` and
/// `<prefix>_automatic_reload_last_timestamp_seconds{status}`, Kubernetes' names.
#[derive(Clone, Debug, Default)]
pub struct ReloadMetrics {
    reloads: Family<StatusLabels, Counter>,
    last: Family<StatusLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl ReloadMetrics {
    /// Registers both families under `prefix` (for example
    /// `apiserver_authentication_config_controller`).
    pub fn register(registry: &mut Registry, prefix: &str) -> Self {
        let m = Self::default();
        // Counters get their `_total` suffix from the encoder.
        registry.register(
            format!("{prefix}_automatic_reloads"),
            "Total number of automatic reloads of the configuration split by status",
            m.reloads.clone(),
        );
        registry.register(
            format!("{prefix}_automatic_reload_last_timestamp_seconds"),
            "Timestamp of the last automatic reload of the configuration split by status",
            m.last.clone(),
        );
        m
    }

    fn record(&self, status: &'static str) {
        let labels = StatusLabels { status };
        self.reloads.get_or_create(&labels).inc();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        self.last.get_or_create(&labels).set(now);
    }

    /// Reloads counted with `status` (`success` or `failure`).
    pub fn count(&self, status: &'static str) -> u64 {
        self.reloads.get_or_create(&StatusLabels { status }).get()
    }
}

/// Reads a configuration file, refusing one over [`MAX_FILE_BYTES`].
pub fn read_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{}: larger than {MAX_FILE_BYTES} bytes",
            path.display()
        ));
    }
    Ok(bytes)
}

fn hash(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Polls `path` every `interval` until `stop` turns true; when its content differs from the
/// content at the time of the call (what the caller has loaded) and from the last version
/// tried, `apply` gets the new bytes. A file that cannot be read is logged and retried at the
/// next poll without counting as a reload.
pub fn spawn<F>(
    name: &'static str,
    path: PathBuf,
    interval: Duration,
    metrics: ReloadMetrics,
    mut stop: watch::Receiver<bool>,
    apply: F,
) -> JoinHandle<()>
where
    F: Fn(&[u8]) -> Result<(), String> + Send + Sync + 'static,
{
    let mut seen = read_file(&path).ok().map(|b| hash(&b));
    let interval = interval.max(Duration::from_millis(10));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let read_path = path.clone();
            let bytes = match tokio::task::spawn_blocking(move || read_file(&read_path)).await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => {
                    tracing::warn!(config = name, error = %e, "cannot read the configuration file");
                    continue;
                }
                Err(_) => continue,
            };
            let h = hash(&bytes);
            if seen == Some(h) {
                continue;
            }
            // A refused version is not retried until the file changes again.
            seen = Some(h);
            match apply(&bytes) {
                Ok(()) => {
                    metrics.record("success");
                    tracing::info!(config = name, path = %path.display(), "configuration reloaded");
                }
                Err(e) => {
                    metrics.record("failure");
                    tracing::error!(config = name, path = %path.display(), error = %e,
                        "the new configuration is refused; the previous one stays in force");
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_changed_file_is_applied_once_and_a_refused_one_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "one").unwrap();
        let mut registry = Registry::default();
        let metrics = ReloadMetrics::register(&mut registry, "test_config_controller");
        let applied = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
        let seen = applied.clone();
        let (stop_tx, stop) = watch::channel(false);
        let task = spawn(
            "test",
            path.clone(),
            Duration::from_millis(20),
            metrics.clone(),
            stop,
            move |b| {
                let text = String::from_utf8_lossy(b).into_owned();
                seen.lock().push(text.clone());
                if text == "bad" {
                    Err("bad".into())
                } else {
                    Ok(())
                }
            },
        );
        let calls = Arc::new(AtomicUsize::new(0));
        let wait = |n: usize| {
            let applied = applied.clone();
            let calls = calls.clone();
            async move {
                for _ in 0..250 {
                    calls.store(applied.lock().len(), Ordering::Relaxed);
                    if applied.lock().len() >= n {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                panic!("only {} applies", calls.load(Ordering::Relaxed));
            }
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            applied.lock().is_empty(),
            "the loaded version is not applied again"
        );
        std::fs::write(&path, "two").unwrap();
        wait(1).await;
        std::fs::write(&path, "bad").unwrap();
        wait(2).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(*applied.lock(), ["two", "bad"]);
        assert_eq!(metrics.count("success"), 1);
        assert_eq!(metrics.count("failure"), 1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("test_config_controller_automatic_reloads_total{status=\"failure\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "test_config_controller_automatic_reload_last_timestamp_seconds{status=\"success\"}"
            ),
            "{text}"
        );
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .unwrap()
            .unwrap();
    }
}
