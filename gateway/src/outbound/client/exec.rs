//! Exec credential plugins of a webhook client's kubeconfig user (`user.exec`,
//! `client.authentication.svc.io/v1` and `v1beta1`): runs the plugin with its
//! `ExecCredential` input in `SVC_EXEC_INFO` (`spec.cluster` when `provideClusterInfo` is set,
//! `interactive` false), checks its output with core's rules and keeps the token or client
//! certificate only in memory, shared by every clone of the client, until a little before
//! `expirationTimestamp` or until the webhook answers 401. One plugin run at a time; it is
//! bounded in time and output.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use svc_config::exec_credential::{ExecCredential, INFO_ENV};
use svc_config::kubeconfig;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{ClientError, Pool};

/// A plugin that has not finished by then is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest accepted plugin output (stdout).
const MAX_OUTPUT: u64 = 1 << 20;
/// How much of a failing plugin's stderr an error shows.
const STDERR_SHOWN: usize = 2048;
/// A credential is refreshed this long before it expires (or a fifth of its lifetime, if less).
const EXPIRY_MARGIN: Duration = Duration::from_secs(10);

/// How to run the plugin.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub api_version: String,
    /// The `ExecCredential` given to the plugin, as JSON.
    pub input: String,
    /// Shown when the plugin cannot be started.
    pub install_hint: String,
}

impl ExecConfig {
    /// From a checked kubeconfig exec block. A relative command with a `/` is taken
    /// relative to the kubeconfig's folder; a bare name is looked up on `PATH`.
    pub fn new(exec: &kubeconfig::ExecConfig, cluster: &kubeconfig::Cluster, dir: &Path) -> Self {
        let command = if exec.command.contains('/') && !Path::new(&exec.command).is_absolute() {
            dir.join(&exec.command).display().to_string()
        } else {
            exec.command.clone()
        };
        let cluster = exec.provide_cluster_info.then(|| cluster.exec_info());
        let input = serde_json::to_string(&ExecCredential::input(&exec.api_version, cluster))
            .unwrap_or_default();
        ExecConfig {
            command,
            args: exec.args.clone(),
            env: exec
                .env
                .iter()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect(),
            api_version: exec.api_version.clone(),
            input,
            install_hint: exec.install_hint.clone(),
        }
    }
}

/// Until when a credential obtained at `obtained` and expiring at `expires` is used.
pub fn fresh_until(obtained: SystemTime, expires: SystemTime) -> SystemTime {
    let life = expires.duration_since(obtained).unwrap_or_default();
    let margin = EXPIRY_MARGIN.min(life.checked_div(5).unwrap_or_default());
    expires.checked_sub(margin).unwrap_or(obtained)
}

/// A credential in use.
pub struct Credential {
    pub token: Option<Arc<str>>,
    /// The connections presenting the plugin's client certificate.
    pub(super) pool: Option<Pool>,
    /// Counts plugin runs: a 401 invalidates only the credential it was refused with.
    pub generation: u64,
}

struct Cached {
    cred: Arc<Credential>,
    fresh_until: Option<SystemTime>,
}

/// Builds the connection pool for a client certificate and key.
pub(super) type MakePool = Box<
    dyn Fn(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) -> Result<Pool, String>
        + Send
        + Sync,
>;

/// The credential every clone of one client shares.
pub struct Source {
    cfg: ExecConfig,
    make_pool: MakePool,
    cached: parking_lot::Mutex<Option<Cached>>,
    generation: parking_lot::Mutex<u64>,
    refreshing: tokio::sync::Mutex<()>,
}

impl Source {
    pub(super) fn new(cfg: ExecConfig, make_pool: MakePool) -> Self {
        Source {
            cfg,
            make_pool,
            cached: parking_lot::Mutex::new(None),
            generation: parking_lot::Mutex::new(0),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    fn current(&self) -> Option<Arc<Credential>> {
        let c = self.cached.lock();
        let c = c.as_ref()?;
        match c.fresh_until {
            Some(t) if SystemTime::now() >= t => None,
            _ => Some(c.cred.clone()),
        }
    }

    /// The credential in force, running the plugin when there is none or it is about to
    /// expire.
    pub async fn get(&self) -> Result<Arc<Credential>, ClientError> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let _one = self.refreshing.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let name = &self.cfg.command;
        let fail = |m: String| ClientError::Exec(format!("exec plugin {name}: {m}"));
        let out = run_plugin(&self.cfg).await.map_err(fail)?;
        let parsed = ExecCredential::parse_output(&out, &self.cfg.api_version)
            .map_err(|e| fail(e.to_string()))?;
        let expires = parsed.expiry().and_then(|t| {
            let nanos = u64::try_from(t.unix_timestamp_nanos().max(0)).unwrap_or(u64::MAX);
            SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(nanos))
        });
        let status = parsed.status.unwrap_or_default();
        let pool = if status.client_certificate_data.is_empty() {
            None
        } else {
            let (certs, key) = super::identity(
                status.client_certificate_data.as_bytes(),
                status.client_key_data.as_bytes(),
            )
            .map_err(|e| fail(format!("status: {e}")))?;
            Some((self.make_pool)(certs, key).map_err(fail)?)
        };
        let generation = {
            let mut g = self.generation.lock();
            *g = g.saturating_add(1);
            *g
        };
        let cred = Arc::new(Credential {
            token: (!status.token.is_empty()).then(|| Arc::from(status.token.as_str())),
            pool,
            generation,
        });
        *self.cached.lock() = Some(Cached {
            cred: cred.clone(),
            fresh_until: expires.map(|e| fresh_until(SystemTime::now(), e)),
        });
        Ok(cred)
    }

    /// The server refused credential `generation` (401): the next `get` runs the plugin,
    /// unless a newer credential is already in place.
    pub fn invalidate(&self, generation: u64) {
        let mut c = self.cached.lock();
        if c.as_ref().is_some_and(|c| c.cred.generation == generation) {
            *c = None;
        }
    }
}

/// Runs the plugin once, bounded in time and output; returns its stdout.
/// Starts `cmd`, retrying a few times while the executable is busy (ETXTBSY): a plugin just
/// written or replaced can be held open for writing for a moment, in this process by a
/// concurrent fork or by whoever installs it.
async fn spawn_retrying_busy(
    cmd: &mut tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    const ETXTBSY: i32 = 26;
    let mut tries = 0u32;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(ETXTBSY) && tries < 10 => {
                tries = tries.saturating_add(1);
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

async fn run_plugin(cfg: &ExecConfig) -> Result<Vec<u8>, String> {
    let mut cmd = tokio::process::Command::new(&cfg.command);
    cmd.args(&cfg.args)
        .envs(cfg.env.iter().map(|(k, v)| (k, v)))
        .env(INFO_ENV, &cfg.input)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = spawn_retrying_busy(&mut cmd).await.map_err(|e| {
        if cfg.install_hint.is_empty() {
            format!("cannot start it: {e}")
        } else {
            format!("cannot start it: {e}\n{}", cfg.install_hint)
        }
    })?;
    let (Some(mut stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err("no pipes".to_string());
    };
    let work = async {
        // stderr on its own task: a plugin over the output limit is killed (on drop) without
        // waiting for its stderr to close.
        let err = tokio::spawn(head(stderr, STDERR_SHOWN));
        let mut out = Vec::new();
        (&mut stdout)
            .take(MAX_OUTPUT + 1)
            .read_to_end(&mut out)
            .await
            .map_err(|e| e.to_string())?;
        if out.len() as u64 > MAX_OUTPUT {
            return Err(format!("output exceeds {MAX_OUTPUT} bytes"));
        }
        let status = child.wait().await.map_err(|e| e.to_string())?;
        let err = err.await.unwrap_or_default();
        if !status.success() {
            return Err(format!("failed ({status}): {}", err.trim()));
        }
        Ok(out)
    };
    match tokio::time::timeout(RUN_TIMEOUT, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {RUN_TIMEOUT:?}")),
    }
}

/// Reads a stream to its end, keeping its first `max` bytes (lossy UTF-8, marked when cut).
async fn head(mut r: impl AsyncRead + Unpin, max: usize) -> String {
    let mut kept = Vec::new();
    let mut buf = [0u8; 4096];
    let mut cut = false;
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = max.saturating_sub(kept.len());
        kept.extend_from_slice(buf.get(..n.min(room)).unwrap_or_default());
        cut |= n > room;
    }
    let mut s = String::from_utf8_lossy(&kept).into_owned();
    if cut {
        s.push_str(" [truncated]");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use svc_config::exec_credential::V1;

    fn set_exec(p: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn config(dir: &Path, script: &str, provide: bool) -> ExecConfig {
        let p = dir.join("plugin.sh");
        std::fs::write(&p, script).unwrap();
        set_exec(&p);
        let exec = kubeconfig::ExecConfig {
            command: "./plugin.sh".into(),
            api_version: V1.into(),
            args: vec!["x".into()],
            env: vec![kubeconfig::ExecEnvVar {
                name: "FOO".into(),
                value: "bar".into(),
            }],
            provide_cluster_info: provide,
            ..Default::default()
        };
        let cluster = kubeconfig::Cluster {
            server: "https://127.0.0.1:1/hook".into(),
            extensions: vec![kubeconfig::NamedExtension {
                name: svc_config::exec_credential::CLUSTER_EXTENSION.into(),
                extension: serde_json::json!({"audience": "hook"}),
            }],
            ..Default::default()
        };
        ExecConfig::new(&exec, &cluster, dir)
    }

    #[tokio::test]
    async fn the_plugin_gets_its_input_args_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(
            dir.path(),
            &format!("#!/bin/sh\nprintf '%s|%s|%s' \"${INFO_ENV}\" \"$1\" \"$FOO\"\n"),
            true,
        );
        let out = String::from_utf8(run_plugin(&cfg).await.unwrap()).unwrap();
        let (input, rest) = out.split_once('|').unwrap();
        assert_eq!(rest, "x|bar");
        let input: serde_json::Value = serde_json::from_str(input).unwrap();
        assert_eq!(input["spec"]["interactive"], false);
        assert_eq!(
            input["spec"]["cluster"]["server"],
            "https://127.0.0.1:1/hook"
        );
        assert_eq!(input["spec"]["cluster"]["config"]["audience"], "hook");
        let cfg = config(
            dir.path(),
            "#!/bin/sh\nprintf '%s' \"$SVC_EXEC_INFO\"\n",
            false,
        );
        let out: serde_json::Value =
            serde_json::from_slice(&run_plugin(&cfg).await.unwrap()).unwrap();
        assert!(out["spec"].get("cluster").is_none());
    }

    #[tokio::test]
    async fn failing_and_invalid_plugins_are_errors_naming_the_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(
            dir.path(),
            "#!/bin/sh\necho 'no creds' >&2\nexit 3\n",
            false,
        );
        let src = Source::new(cfg, Box::new(|_, _| Err("no TLS here".into())));
        let e = src.get().await.err().unwrap().to_string();
        assert!(e.contains("plugin.sh") && e.contains("no creds"), "{e}");
        let cfg = config(
            dir.path(),
            &format!(
                "#!/bin/sh\necho '{{\"apiVersion\":\"{V1}\",\"kind\":\"ExecCredential\",\
                 \"status\":{{\"clientKeyData\":\"k\"}}}}'\n"
            ),
            false,
        );
        let src = Source::new(cfg, Box::new(|_, _| Err("no TLS here".into())));
        let e = src.get().await.err().unwrap().to_string();
        assert!(
            e.contains("status.clientCertificateData: Required value"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_missing_plugin_shows_its_install_hint() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), "#!/bin/sh\n", false);
        cfg.command = dir.path().join("absent").display().to_string();
        cfg.install_hint = "install it with: apt-get install svc-plugin".into();
        let e = run_plugin(&cfg).await.unwrap_err();
        assert!(
            e.contains("cannot start it") && e.contains("apt-get install svc-plugin"),
            "{e}"
        );
    }

    #[test]
    fn refreshes_a_bit_before_expiry() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = t0 + Duration::from_secs(3600);
        assert_eq!(fresh_until(t0, hour), hour - Duration::from_secs(10));
        let short = t0 + Duration::from_secs(5);
        assert_eq!(fresh_until(t0, short), t0 + Duration::from_secs(4));
    }
}
