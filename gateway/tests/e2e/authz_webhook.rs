//! `--authorization-config` with a webhook authorizer, end to end: the test runs its own
//! authorizer webhook over TLS (its own CA; the gateway presents a client certificate from
//! it, named in the kubeconfig `svcConfigFile` points at) that counts its calls and answers
//! by user (alice allowed, bob denied with a reason, anyone else no opinion). Users are
//! client certificates of the gateway's own CA. Shown: allow, deny (403 with the webhook's
//! reason, the next authorizer not asked), no opinion (the next decides), the cache through
//! the call count, failure policy with the webhook down, match conditions skipping the
//! webhook, and reloads of the file changing behaviour without a restart.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use svc_config::subject_access_review::decode_request;
use svc_gateway::outbound::pki::{self, PkiOptions};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::support::client::{Client, TestServer, eventually};

const T: Duration = Duration::from_secs(10);
const SA: &str = "/api/v1/namespaces/default/serviceaccounts";

/// The test's authorizer webhook.
struct Webhook {
    addr: SocketAddr,
    calls: Arc<AtomicUsize>,
    /// Kubeconfig for reaching it: its CA and a client certificate it issued.
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl Webhook {
    async fn start() -> Webhook {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let kubeconfig = dir.path().join("webhook.kubeconfig");
        let opts = PkiOptions {
            tls_sans: vec!["127.0.0.1".into()],
            admin_kubeconfig_path: kubeconfig.clone(),
            server_url: format!("https://{addr}"),
            cluster_signing: None,
        };
        let pki = pki::ensure_pki(&dir.path().join("pki"), &opts).unwrap();
        let tls = TlsAcceptor::from(pki.server_config().unwrap().0);
        let calls = Arc::new(AtomicUsize::new(0));
        tokio::spawn(serve(listener, tls, calls.clone()));
        Webhook {
            addr,
            calls,
            kubeconfig,
            _dir: dir,
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn serve(listener: TcpListener, tls: TlsAcceptor, calls: Arc<AtomicUsize>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let tls = tls.clone();
        let calls = calls.clone();
        tokio::spawn(async move {
            let Ok(stream) = tls.accept(tcp).await else {
                return;
            };
            // Only the gateway, with the certificate its kubeconfig names, may ask.
            let client_cert = stream
                .get_ref()
                .1
                .peer_certificates()
                .is_some_and(|c| !c.is_empty());
            let svc = service_fn(move |req: Request<Incoming>| {
                let calls = calls.clone();
                async move { Ok::<_, hyper::Error>(answer(req, client_cert, &calls).await) }
            });
            // The server certificate's TLS configuration offers h2 and HTTP/1.1.
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    client_cert: bool,
    calls: &AtomicUsize,
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    if !client_cert {
        return reply(StatusCode::UNAUTHORIZED, b"{}".to_vec());
    }
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let Ok((version, spec)) = decode_request(&body) else {
        return reply(StatusCode::BAD_REQUEST, b"{}".to_vec());
    };
    calls.fetch_add(1, Ordering::SeqCst);
    let status = match spec.user.as_str() {
        "alice" => json!({"allowed": true}),
        "bob" => json!({"allowed": false, "denied": true, "reason": "bob is on leave"}),
        _ => json!({"allowed": false, "reason": "no rule for this user"}),
    };
    let review = json!({"apiVersion": version, "kind": "SubjectAccessReview", "status": status});
    reply(StatusCode::OK, serde_json::to_vec(&review).unwrap())
}

/// An AuthorizationConfiguration: the webhook `policy` at `kubeconfig`, then `after`.
fn config(kubeconfig: &Path, failure_policy: &str, authorized_ttl: &str, after: &str) -> String {
    format!(
        r#"apiVersion: apiserver.svc.io/v1beta1
kind: AuthorizationConfiguration
authorizers:
- type: Webhook
  name: policy
  webhook:
    authorizedTTL: {authorized_ttl}
    unauthorizedTTL: 1s
    timeout: 5s
    subjectAccessReviewVersion: v1
    matchConditionSubjectAccessReviewVersion: v1
    failurePolicy: {failure_policy}
    connectionInfo:
      type: SvcConfig
      svcConfigFile: {kubeconfig}
    matchConditions:
    - expression: '!has(request.resourceAttributes) || request.resourceAttributes.namespace != "skipped"'
{after}"#,
        kubeconfig = kubeconfig.display()
    )
}

const THEN_ALLOW: &str = "- type: AlwaysAllow\n  name: everyone\n";

/// Writes `text` to `path` through a rename, as configuration managers replace files.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn status(c: &Client, path: &str) -> (StatusCode, String) {
    let (s, body) = c.get(path).await;
    (s, body["message"].as_str().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_decides_caches_fails_by_policy_and_reloads() {
    let webhook = Webhook::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("authz.yaml");
    std::fs::write(
        &file,
        config(&webhook.kubeconfig, "NoOpinion", "2s", THEN_ALLOW),
    )
    .unwrap();
    let srv = TestServer::start_with(|o| {
        o.authorization_config = Some(file.clone());
        o.config_reload_interval = Duration::from_millis(100);
    })
    .await;
    let alice = srv.user("alice", &[]);
    let bob = srv.user("bob", &[]);
    let carol = srv.user("carol", &[]);

    // Allowed by the webhook.
    assert_eq!(status(&alice, SA).await.0, StatusCode::OK);
    assert_eq!(webhook.calls(), 1);
    // Denied with the webhook's reason; AlwaysAllow after it is not asked.
    let (s, msg) = status(&bob, SA).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(
        msg,
        "serviceaccounts is forbidden: User \"bob\" cannot list resource \"serviceaccounts\" in \
         API group \"\" in the namespace \"default\": bob is on leave"
    );
    // No opinion: AlwaysAllow decides.
    assert_eq!(status(&carol, SA).await.0, StatusCode::OK);
    assert_eq!(webhook.calls(), 3);

    // The cache: the same request again is not sent; after authorizedTTL (2s) it is.
    assert_eq!(status(&alice, SA).await.0, StatusCode::OK);
    assert_eq!(webhook.calls(), 3, "answered from the cache");
    eventually(
        T,
        "the approval expires and the webhook is asked again",
        || async {
            assert_eq!(status(&alice, SA).await.0, StatusCode::OK);
            webhook.calls() == 4
        },
    )
    .await;

    // Match conditions: a request in namespace "skipped" never reaches the webhook, so bob
    // gets no denial there and AlwaysAllow decides.
    let skipped = "/api/v1/namespaces/skipped/serviceaccounts";
    let before = webhook.calls();
    assert_eq!(status(&bob, skipped).await.0, StatusCode::OK);
    assert_eq!(webhook.calls(), before);

    // Reload: without AlwaysAllow, no opinion is the end of the chain: 403 with the reason.
    replace_file(&file, &config(&webhook.kubeconfig, "NoOpinion", "2s", ""));
    eventually(T, "the reloaded chain ends in 403 for carol", || async {
        status(&carol, SA).await.0 == StatusCode::FORBIDDEN
    })
    .await;
    assert!(
        status(&carol, SA)
            .await
            .1
            .ends_with(": no rule for this user")
    );

    // An invalid version keeps the one in force and is counted as a failure.
    replace_file(
        &file,
        "apiVersion: apiserver.svc.io/v1beta1\nkind: AuthorizationConfiguration\n",
    );
    let admin = srv.admin();
    eventually(T, "the failed reload is counted", || async {
        let (_, text) = metrics(&admin).await;
        text.contains("apiserver_authorization_config_controller_automatic_reloads_total{status=\"failure\"} 1")
    })
    .await;
    assert_eq!(status(&alice, SA).await.0, StatusCode::OK);
    assert_eq!(status(&carol, SA).await.0, StatusCode::FORBIDDEN);

    // The webhook down (nothing listens where the kubeconfig points).
    let down = dir.path().join("down.kubeconfig");
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let text = std::fs::read_to_string(&webhook.kubeconfig).unwrap();
    std::fs::write(
        &down,
        text.replace(&webhook.addr.to_string(), &closed.to_string()),
    )
    .unwrap();
    // NoOpinion: the next authorizer decides.
    replace_file(&file, &config(&down, "NoOpinion", "2s", THEN_ALLOW));
    eventually(
        T,
        "with the webhook down, NoOpinion lets AlwaysAllow decide",
        || async { status(&bob, SA).await.0 == StatusCode::OK },
    )
    .await;
    // Deny: 403, and AlwaysAllow is not asked.
    replace_file(&file, &config(&down, "Deny", "2s", THEN_ALLOW));
    eventually(T, "with the webhook down, Deny refuses", || async {
        status(&carol, SA).await.0 == StatusCode::FORBIDDEN
    })
    .await;

    let (_, text) = metrics(&admin).await;
    for line in [
        "apiserver_authorization_decisions_total{type=\"Webhook\",name=\"policy\",decision=\"allowed\"}",
        "apiserver_authorization_decisions_total{type=\"Webhook\",name=\"policy\",decision=\"denied\"}",
        "apiserver_authorization_webhook_evaluations_total{name=\"policy\",result=\"success\"}",
        "apiserver_authorization_webhook_evaluations_total{name=\"policy\",result=\"error\"}",
        "apiserver_authorization_webhook_evaluations_fail_open_total{name=\"policy\",result=\"error\"}",
        "apiserver_authorization_webhook_duration_seconds_count{name=\"policy\",result=\"success\"}",
        "apiserver_authorization_match_condition_exclusions_total{type=\"Webhook\",name=\"policy\"} 1",
        "apiserver_authorization_config_controller_automatic_reloads_total{status=\"success\"}",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}

async fn metrics(admin: &Client) -> (StatusCode, String) {
    let r = admin.request(http::Method::GET, "/metrics", "", &[]).await;
    (r.status, r.text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_that_does_not_load_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("authz.yaml");
    std::fs::write(
        &file,
        "apiVersion: apiserver.svc.io/v1beta1\nkind: AuthorizationConfiguration\n\
         authorizers:\n- {type: RBAC, name: rbac}\n",
    )
    .unwrap();
    let mut opts = svc_gateway::base::flags::Options::for_tests(dir.path().join("data"));
    opts.authorization_config = Some(file);
    let err = svc_gateway::run::start(opts)
        .await
        .err()
        .expect("start refused");
    let text = format!("{err:#}");
    assert!(
        text.contains(
            "authorizers[0].type: Unsupported value: \"RBAC\": not supported by this server"
        ),
        "{text}"
    );
}
