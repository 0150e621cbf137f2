//! Exec credential plugins for kubeconfig users (`user.exec`, `client.authentication.svc.io/v1`
//! and `v1beta1`): runs the plugin with an `ExecCredential` in `SVC_EXEC_INFO`, parses the
//! `status` it prints (a bearer token or a client certificate and key) and keeps it in memory,
//! shared by every connection of an endpoint, until shortly before `expirationTimestamp` or
//! until a connection gets a 401.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::target::Tls;

/// The environment variable carrying the plugin's input (the spec names none; Kubernetes
/// uses `KUBERNETES_EXEC_INFO`).
pub const INFO_ENV: &str = "SVC_EXEC_INFO";
/// The cluster extension whose value becomes `spec.cluster.config`.
pub const CLUSTER_EXTENSION: &str = "client.authentication.svc.io/exec";
const API_VERSIONS: [&str; 2] = [
    "client.authentication.svc.io/v1",
    "client.authentication.svc.io/v1beta1",
];
/// A plugin that has not finished by then is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest accepted plugin output (stdout).
const MAX_OUTPUT: u64 = 1 << 20;
/// How much of a failing plugin's stderr an error shows.
const STDERR_SHOWN: usize = 2048;
/// A credential is refreshed this long before it expires (or a fifth of its lifetime, if less).
const EXPIRY_MARGIN: Duration = Duration::from_secs(10);

/// `user.exec` of a kubeconfig.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub api_version: String,
    /// The `ExecCredential` given to the plugin (JSON), with `spec.cluster` when
    /// `provideClusterInfo` is set.
    pub input: String,
}

impl ExecConfig {
    /// Reads `user.exec` and the cluster (`cluster` of a kubeconfig's `clusters` entry, and the
    /// whole entry for its extensions). A relative command with a `/` is taken relative to the
    /// kubeconfig's directory; a bare name is looked up on `PATH`.
    pub fn from_kubeconfig(exec: &Value, cluster: &Value, dir: Option<&Path>) -> Result<Self> {
        let command = exec["command"]
            .as_str()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| anyhow!("user.exec.command is missing"))?;
        let command = match dir {
            Some(d) if command.contains('/') && !Path::new(command).is_absolute() => {
                d.join(command).display().to_string()
            }
            _ => command.to_string(),
        };
        let api_version = exec["apiVersion"].as_str().unwrap_or_default();
        if !API_VERSIONS.contains(&api_version) {
            bail!(
                "user.exec.apiVersion {api_version:?} is not one of {}",
                API_VERSIONS.join(", ")
            );
        }
        if exec["interactiveMode"].as_str() == Some("Always") {
            bail!(
                "user.exec.interactiveMode Always: this client never has a terminal for the plugin"
            );
        }
        let strings = |v: &Value, field: &str| -> Result<Vec<String>> {
            match v {
                Value::Null => Ok(Vec::new()),
                Value::Array(items) => items
                    .iter()
                    .map(|s| {
                        s.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| anyhow!("user.exec.{field} holds a non-string"))
                    })
                    .collect(),
                _ => bail!("user.exec.{field} is not a list"),
            }
        };
        let args = strings(&exec["args"], "args")?;
        let env = match &exec["env"] {
            Value::Null => Vec::new(),
            Value::Array(items) => items
                .iter()
                .map(|e| match (e["name"].as_str(), e["value"].as_str()) {
                    (Some(n), Some(v)) if !n.is_empty() => Ok((n.to_string(), v.to_string())),
                    _ => Err(anyhow!("user.exec.env entries need a name and a value")),
                })
                .collect::<Result<_>>()?,
            _ => bail!("user.exec.env is not a list"),
        };
        let mut spec = json!({"interactive": false});
        if exec["provideClusterInfo"].as_bool() == Some(true) {
            spec["cluster"] = cluster_info(cluster);
        }
        let input = json!({
            "apiVersion": api_version,
            "kind": "ExecCredential",
            "spec": spec,
        })
        .to_string();
        Ok(ExecConfig {
            command,
            args,
            env,
            api_version: api_version.to_string(),
            input,
        })
    }
}

/// `spec.cluster` from a kubeconfig `clusters` entry (`{name, cluster}`).
fn cluster_info(entry: &Value) -> Value {
    let c = &entry["cluster"];
    let mut out = serde_json::Map::new();
    out.insert("server".into(), c["server"].clone());
    for k in ["tls-server-name", "certificate-authority-data", "proxy-url"] {
        if let Some(s) = c[k].as_str() {
            out.insert(k.into(), s.into());
        }
    }
    for k in ["insecure-skip-tls-verify", "disable-compression"] {
        if let Some(b) = c[k].as_bool() {
            out.insert(k.into(), b.into());
        }
    }
    let ext = c["extensions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"].as_str() == Some(CLUSTER_EXTENSION));
    if let Some(e) = ext {
        out.insert("config".into(), e["extension"].clone());
    }
    Value::Object(out)
}

/// What a plugin returned, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecStatus {
    pub token: Option<String>,
    /// Client certificate and key, PEM.
    pub cert: Option<(String, String)>,
    pub expires: Option<SystemTime>,
}

/// Parses a plugin's stdout: an `ExecCredential` of the kubeconfig's `apiVersion` with a
/// `status` holding a token or a certificate and its key.
pub fn parse_output(out: &[u8], api_version: &str) -> Result<ExecStatus> {
    let v: Value = serde_json::from_slice(out).context("the output is not JSON")?;
    if v["kind"].as_str() != Some("ExecCredential") {
        bail!("the output's kind is {}, not ExecCredential", v["kind"]);
    }
    if v["apiVersion"].as_str() != Some(api_version) {
        bail!(
            "the output's apiVersion {} does not match the kubeconfig's {api_version}",
            v["apiVersion"]
        );
    }
    let status = v
        .get("status")
        .filter(|s| s.is_object())
        .ok_or_else(|| anyhow!("the output has no status"))?;
    let field = |k: &str| -> Result<Option<String>> {
        match &status[k] {
            Value::Null => Ok(None),
            Value::String(s) if s.is_empty() => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            other => bail!("status.{k} is not a string: {other}"),
        }
    };
    let token = field("token")?;
    let cert = match (field("clientCertificateData")?, field("clientKeyData")?) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        (Some(_), None) => bail!("status.clientCertificateData without status.clientKeyData"),
        (None, Some(_)) => bail!("status.clientKeyData without status.clientCertificateData"),
    };
    if token.is_none() && cert.is_none() {
        bail!("status holds neither a token nor a client certificate and key");
    }
    let expires = match field("expirationTimestamp")? {
        None => None,
        Some(t) => {
            let at =
                time::OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339)
                    .with_context(|| format!("status.expirationTimestamp {t:?}"))?;
            let nanos = at.unix_timestamp_nanos();
            let since = Duration::from_nanos(u64::try_from(nanos.max(0)).unwrap_or(u64::MAX));
            Some(SystemTime::UNIX_EPOCH + since)
        }
    };
    Ok(ExecStatus {
        token,
        cert,
        expires,
    })
}

/// Until when a credential obtained at `obtained` and expiring at `expires` is used: a bit
/// before it expires (`EXPIRY_MARGIN`, or a fifth of its lifetime when that is shorter).
pub fn fresh_until(obtained: SystemTime, expires: SystemTime) -> SystemTime {
    let life = expires.duration_since(obtained).unwrap_or_default();
    expires - EXPIRY_MARGIN.min(life / 5)
}

/// A credential in use: a bearer token, or a TLS configuration with the client certificate.
pub struct Credential {
    pub token: Option<Arc<str>>,
    pub tls: Option<Tls>,
    /// Counts plugin runs: a 401 invalidates only the credential it was refused with.
    pub generation: u64,
}

struct Cached {
    cred: Arc<Credential>,
    fresh_until: Option<SystemTime>,
}

/// Builds the TLS configurations for a client certificate and key.
pub type MakeTls =
    Box<dyn Fn(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) -> Result<Tls> + Send + Sync>;

/// The credential every connection of one endpoint shares.
pub struct Source {
    cfg: ExecConfig,
    make_tls: MakeTls,
    cached: parking_lot::Mutex<Option<Cached>>,
    generation: parking_lot::Mutex<u64>,
    /// One plugin run at a time: connections that find no credential wait for it.
    refreshing: tokio::sync::Mutex<()>,
}

impl Source {
    pub fn new(cfg: ExecConfig, make_tls: MakeTls) -> Self {
        Source {
            cfg,
            make_tls,
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

    /// The credential in force, running the plugin when there is none or it is about to expire.
    pub async fn get(&self) -> Result<Arc<Credential>> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let _one = self.refreshing.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let out = run_plugin(&self.cfg).await?;
        let st = parse_output(&out, &self.cfg.api_version)
            .with_context(|| format!("exec plugin {}", self.cfg.command))?;
        let tls = match &st.cert {
            None => None,
            Some((cert, key)) => {
                let certs: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_slice_iter(cert.as_bytes())
                        .collect::<std::result::Result<_, _>>()
                        .context("status.clientCertificateData")?;
                if certs.is_empty() {
                    bail!(
                        "exec plugin {}: status.clientCertificateData holds no certificate",
                        self.cfg.command
                    );
                }
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .context("status.clientKeyData")?;
                Some((self.make_tls)(certs, key)?)
            }
        };
        let generation = {
            let mut g = self.generation.lock();
            *g += 1;
            *g
        };
        let cred = Arc::new(Credential {
            token: st.token.map(Arc::from),
            tls,
            generation,
        });
        *self.cached.lock() = Some(Cached {
            cred: cred.clone(),
            fresh_until: st.expires.map(|e| fresh_until(SystemTime::now(), e)),
        });
        Ok(cred)
    }

    /// The server refused credential `generation` (401): the next `get` runs the plugin,
    /// unless another connection already got a newer credential.
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
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(ETXTBSY) && tries < 10 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

async fn run_plugin(cfg: &ExecConfig) -> Result<Vec<u8>> {
    let name = &cfg.command;
    let mut cmd = tokio::process::Command::new(name);
    cmd.args(&cfg.args)
        .envs(cfg.env.iter().map(|(k, v)| (k, v)))
        .env(INFO_ENV, &cfg.input)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = spawn_retrying_busy(&mut cmd)
        .await
        .with_context(|| format!("exec plugin {name}: cannot start it"))?;
    let (Some(mut stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        bail!("exec plugin {name}: no pipes");
    };
    let work = async {
        // stderr on its own task: a plugin over the output limit is killed (on drop) without
        // waiting for its stderr to close.
        let err = tokio::spawn(head(stderr, STDERR_SHOWN));
        let mut out = Vec::new();
        (&mut stdout)
            .take(MAX_OUTPUT + 1)
            .read_to_end(&mut out)
            .await?;
        if out.len() as u64 > MAX_OUTPUT {
            bail!("exec plugin {name}: output exceeds {MAX_OUTPUT} bytes");
        }
        let status = child.wait().await?;
        let err = err.await.unwrap_or_default();
        if !status.success() {
            bail!("exec plugin {name} failed ({status}): {}", err.trim());
        }
        Ok(out)
    };
    match tokio::time::timeout(RUN_TIMEOUT, work).await {
        Ok(r) => r,
        Err(_) => bail!("exec plugin {name}: no answer within {RUN_TIMEOUT:?}"),
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
        let room = max - kept.len();
        kept.extend_from_slice(&buf[..n.min(room)]);
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

    const V1: &str = "client.authentication.svc.io/v1";
    const V1BETA1: &str = "client.authentication.svc.io/v1beta1";

    fn out(api: &str, status: Value) -> Vec<u8> {
        json!({"apiVersion": api, "kind": "ExecCredential", "status": status})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn parses_v1_and_v1beta1() {
        for api in [V1, V1BETA1] {
            let st = parse_output(
                &out(
                    api,
                    json!({"token": "abc", "expirationTimestamp": "2030-01-02T03:04:05Z"}),
                ),
                api,
            )
            .unwrap();
            assert_eq!(st.token.as_deref(), Some("abc"));
            assert_eq!(st.cert, None);
            assert_eq!(
                st.expires,
                Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_893_553_445))
            );
            let st = parse_output(
                &out(
                    api,
                    json!({"clientCertificateData": "C", "clientKeyData": "K"}),
                ),
                api,
            )
            .unwrap();
            assert_eq!(st.token, None);
            assert_eq!(st.cert, Some(("C".into(), "K".into())));
            assert_eq!(st.expires, None);
        }
    }

    #[test]
    fn refuses_a_mismatched_api_version() {
        let e = parse_output(&out(V1BETA1, json!({"token": "abc"})), V1).unwrap_err();
        assert!(format!("{e}").contains("does not match"), "{e}");
        let e = parse_output(&out("v1", json!({"token": "abc"})), V1).unwrap_err();
        assert!(format!("{e}").contains("does not match"), "{e}");
    }

    #[test]
    fn refuses_missing_or_empty_status() {
        let no_status = json!({"apiVersion": V1, "kind": "ExecCredential"}).to_string();
        let e = parse_output(no_status.as_bytes(), V1).unwrap_err();
        assert!(format!("{e}").contains("no status"), "{e}");
        let e = parse_output(&out(V1, json!({})), V1).unwrap_err();
        assert!(format!("{e}").contains("neither"), "{e}");
        let e = parse_output(&out(V1, json!({"clientCertificateData": "C"})), V1).unwrap_err();
        assert!(format!("{e}").contains("without"), "{e}");
        let wrong_kind = json!({"apiVersion": V1, "kind": "Pod", "status": {"token": "t"}});
        assert!(parse_output(wrong_kind.to_string().as_bytes(), V1).is_err());
        assert!(parse_output(b"not json", V1).is_err());
        let bad_time = out(V1, json!({"token": "t", "expirationTimestamp": "tomorrow"}));
        assert!(parse_output(&bad_time, V1).is_err());
    }

    #[test]
    fn refreshes_a_bit_before_expiry() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        // An hour's token: 10 s early.
        let hour = t0 + Duration::from_secs(3600);
        assert_eq!(fresh_until(t0, hour), hour - Duration::from_secs(10));
        // A 5 s token: a fifth of its life early.
        let short = t0 + Duration::from_secs(5);
        assert_eq!(fresh_until(t0, short), t0 + Duration::from_secs(4));
        // Already expired: stale at once.
        assert_eq!(
            fresh_until(t0, t0 - Duration::from_secs(1)),
            t0 - Duration::from_secs(1)
        );
    }

    #[test]
    fn reads_the_kubeconfig_exec_block() {
        let exec = json!({
            "apiVersion": V1,
            "command": "./bin/plugin",
            "args": ["--a", "b"],
            "env": [{"name": "FOO", "value": "bar"}],
            "provideClusterInfo": true,
            "interactiveMode": "Never",
        });
        let cluster = json!({"name": "c", "cluster": {
            "server": "https://127.0.0.1:6443",
            "certificate-authority-data": "Q0E=",
            "tls-server-name": "svc",
            "insecure-skip-tls-verify": false,
            "extensions": [
                {"name": "other", "extension": {"x": 1}},
                {"name": CLUSTER_EXTENSION, "extension": {"audience": "loadtest"}},
            ],
        }});
        let cfg = ExecConfig::from_kubeconfig(&exec, &cluster, Some(Path::new("/etc/kc"))).unwrap();
        assert_eq!(cfg.command, "/etc/kc/./bin/plugin");
        assert_eq!(cfg.args, ["--a", "b"]);
        assert_eq!(cfg.env, [("FOO".to_string(), "bar".to_string())]);
        let input: Value = serde_json::from_str(&cfg.input).unwrap();
        assert_eq!(input["apiVersion"], V1);
        assert_eq!(input["kind"], "ExecCredential");
        assert_eq!(input["spec"]["interactive"], false);
        let c = &input["spec"]["cluster"];
        assert_eq!(c["server"], "https://127.0.0.1:6443");
        assert_eq!(c["certificate-authority-data"], "Q0E=");
        assert_eq!(c["tls-server-name"], "svc");
        assert_eq!(c["insecure-skip-tls-verify"], false);
        assert_eq!(c["config"], json!({"audience": "loadtest"}));
        // Without provideClusterInfo there is no cluster; a bare name stays for PATH lookup.
        let exec = json!({"apiVersion": V1BETA1, "command": "plugin"});
        let cfg = ExecConfig::from_kubeconfig(&exec, &cluster, Some(Path::new("/etc/kc"))).unwrap();
        assert_eq!(cfg.command, "plugin");
        let input: Value = serde_json::from_str(&cfg.input).unwrap();
        assert!(input["spec"].get("cluster").is_none());
        // Unknown apiVersion, no command, Always interactive: refused.
        for bad in [
            json!({"apiVersion": "v1", "command": "p"}),
            json!({"apiVersion": V1}),
            json!({"apiVersion": V1, "command": "p", "interactiveMode": "Always"}),
            json!({"apiVersion": V1, "command": "p", "env": [{"name": "X"}]}),
        ] {
            assert!(
                ExecConfig::from_kubeconfig(&bad, &cluster, None).is_err(),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn a_failing_plugin_names_the_command_and_its_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fail.sh");
        std::fs::write(&p, "#!/bin/sh\necho 'no credentials here' >&2\nexit 3\n").unwrap();
        set_exec(&p);
        let cfg = ExecConfig::from_kubeconfig(
            &json!({"apiVersion": V1, "command": p.display().to_string()}),
            &Value::Null,
            None,
        )
        .unwrap();
        let e = format!("{:#}", run_plugin(&cfg).await.unwrap_err());
        assert!(
            e.contains("fail.sh") && e.contains("no credentials here"),
            "{e}"
        );
        let cfg = ExecConfig {
            command: "svc-no-such-plugin".into(),
            ..cfg
        };
        let e = format!("{:#}", run_plugin(&cfg).await.unwrap_err());
        assert!(e.contains("svc-no-such-plugin"), "{e}");
    }

    #[tokio::test]
    async fn the_plugin_gets_its_input_args_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("echo.sh");
        std::fs::write(
            &p,
            format!("#!/bin/sh\nprintf '%s|%s|%s' \"${INFO_ENV}\" \"$1\" \"$FOO\"\n"),
        )
        .unwrap();
        set_exec(&p);
        let cfg = ExecConfig::from_kubeconfig(
            &json!({"apiVersion": V1, "command": p.display().to_string(), "args": ["x"],
                    "env": [{"name": "FOO", "value": "bar"}]}),
            &Value::Null,
            None,
        )
        .unwrap();
        let out = String::from_utf8(run_plugin(&cfg).await.unwrap()).unwrap();
        assert_eq!(out, format!("{}|x|bar", cfg.input));
    }

    #[tokio::test]
    async fn output_over_the_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.sh");
        std::fs::write(&p, "#!/bin/sh\nhead -c 2000000 /dev/zero\nsleep 60\n").unwrap();
        set_exec(&p);
        let cfg = plugin_config(&p, V1);
        let t0 = std::time::Instant::now();
        let e = format!("{:#}", run_plugin(&cfg).await.unwrap_err());
        assert!(e.contains("exceeds"), "{e}");
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "waited for the plugin"
        );
    }

    /// A plugin that counts its runs in `count` and prints a token expiring in `life` s.
    fn counting_plugin(dir: &Path, api: &str, life: i64) -> ExecConfig {
        let p = dir.join("count.sh");
        let script = format!(
            "#!/bin/sh\necho run >> {d}/count\nn=$(wc -l < {d}/count)\n\
             exp=$(date -u -d \"@$(( $(date +%s) + {life} ))\" +%Y-%m-%dT%H:%M:%SZ)\n\
             printf '{{\"apiVersion\":\"{api}\",\"kind\":\"ExecCredential\",\
             \"status\":{{\"token\":\"t%s\",\"expirationTimestamp\":\"%s\"}}}}' $n $exp\n",
            d = dir.display()
        );
        std::fs::write(&p, script).unwrap();
        set_exec(&p);
        plugin_config(&p, api)
    }

    fn source(cfg: ExecConfig) -> Source {
        Source::new(cfg, Box::new(|_, _| bail!("no TLS here")))
    }

    #[tokio::test]
    async fn a_credential_is_reused_until_expiry_or_refusal() {
        let dir = tempfile::tempdir().unwrap();
        let src = source(counting_plugin(dir.path(), V1, 3600));
        let runs = || {
            std::fs::read_to_string(dir.path().join("count"))
                .unwrap()
                .lines()
                .count()
        };
        let a = src.get().await.unwrap();
        let b = src.get().await.unwrap();
        assert_eq!(a.token.as_deref(), Some("t1"));
        assert_eq!(b.generation, a.generation);
        assert_eq!(runs(), 1);
        // A refusal of an older credential changes nothing; of the current one, runs again.
        src.invalidate(a.generation + 7);
        assert_eq!(src.get().await.unwrap().token.as_deref(), Some("t1"));
        src.invalidate(a.generation);
        let c = src.get().await.unwrap();
        assert_eq!(c.token.as_deref(), Some("t2"));
        assert!(c.generation > a.generation);
        assert_eq!(runs(), 2);
        // Concurrent callers after a refusal share one run.
        src.invalidate(c.generation);
        let all = futures::future::join_all((0..8).map(|_| src.get())).await;
        assert!(
            all.iter()
                .all(|r| r.as_ref().unwrap().token.as_deref() == Some("t3"))
        );
        assert_eq!(runs(), 3);
    }

    #[tokio::test]
    async fn an_expired_credential_is_refreshed() {
        let dir = tempfile::tempdir().unwrap();
        // Expired when it arrives: every get runs the plugin.
        let src = source(counting_plugin(dir.path(), V1BETA1, -1));
        assert_eq!(src.get().await.unwrap().token.as_deref(), Some("t1"));
        assert_eq!(src.get().await.unwrap().token.as_deref(), Some("t2"));
        // Two seconds of life: reused at once, refreshed a little before it ends.
        let dir = tempfile::tempdir().unwrap();
        let src = source(counting_plugin(dir.path(), V1BETA1, 2));
        assert_eq!(src.get().await.unwrap().token.as_deref(), Some("t1"));
        assert_eq!(src.get().await.unwrap().token.as_deref(), Some("t1"));
        tokio::time::sleep(Duration::from_millis(2100)).await;
        assert_eq!(src.get().await.unwrap().token.as_deref(), Some("t2"));
    }

    fn plugin_config(p: &Path, api: &str) -> ExecConfig {
        ExecConfig::from_kubeconfig(
            &json!({"apiVersion": api, "command": p.display().to_string()}),
            &Value::Null,
            None,
        )
        .unwrap()
    }

    fn set_exec(p: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}
