//! Admission webhooks end to end: a local HTTPS webhook started by the test (its own CA given
//! as `caBundle`), configured through the API as MutatingWebhookConfiguration and
//! ValidatingWebhookConfiguration objects. A mutating webhook adds a label by JSON Patch (and
//! is called again when a later one changes the object), a validating one denies with a
//! message the client sees, failure policies with the webhook down or slow, warnings reaching
//! kubectl, dry runs kept from webhooks with side effects, and changes taking effect without
//! a restart.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::client::{Client, TestServer, eventually};

const LIMIT: Duration = Duration::from_secs(15);
const GROUP_PATH: &str = "/apis/admissionregistration.svc.io/v1";

/// What the webhook was asked, by path.
#[derive(Default)]
struct Seen {
    reviews: Mutex<Vec<(String, Value)>>,
}

impl Seen {
    fn count(&self, path: &str) -> usize {
        self.reviews
            .lock()
            .iter()
            .filter(|(p, _)| p == path)
            .count()
    }
    fn last(&self, path: &str) -> Value {
        self.reviews
            .lock()
            .iter()
            .rev()
            .find(|(p, _)| p == path)
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| panic!("{path} was never called"))
    }
    fn clear(&self) {
        self.reviews.lock().clear();
    }
}

struct Webhook {
    addr: SocketAddr,
    ca_bundle: String,
    seen: Arc<Seen>,
}

impl Webhook {
    fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }
}

/// The webhook's answer to `review` at `path`.
async fn answer(path: &str, review: &Value) -> Value {
    let req = &review["request"];
    let uid = req["uid"].clone();
    let obj = &req["object"];
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let has_labels = obj["metadata"]["labels"].is_object();
    let add_label = |key: &str, value: &str| {
        let patch = if has_labels {
            json!([{"op": "add", "path": format!("/metadata/labels/{key}"), "value": value}])
        } else {
            json!([{"op": "add", "path": "/metadata/labels", "value": {key: value}}])
        };
        base64::engine::general_purpose::STANDARD.encode(patch.to_string())
    };
    let response = match path {
        "/mutate" => json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
            "patch": add_label("mutated-by", "hook"), "warnings": ["mutated by hook"],
            "auditAnnotations": {"mutated": "yes"}}),
        "/second" => json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
            "patch": add_label("second", "yes")}),
        "/deny" if name.starts_with("deny-") => json!({"uid": uid, "allowed": false,
            "status": {"code": 403, "message": "names starting with deny- are refused"}}),
        "/warn" => json!({"uid": uid, "allowed": true,
            "warnings": ["first warning", "w".repeat(300)]}),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            json!({"uid": uid, "allowed": true})
        }
        "/wrong-uid" => json!({"uid": "not-the-request", "allowed": true}),
        _ => json!({"uid": uid, "allowed": true}),
    };
    json!({"apiVersion": "admission.svc.io/v1", "kind": "AdmissionReview", "response": response})
}

async fn webhook() -> Webhook {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let certs = svc_gateway::outbound::egress::certs_from_pem(cert.pem().as_bytes()).unwrap();
    let key =
        <rustls::pki_types::PrivateKeyDer as rustls::pki_types::pem::PemObject>::from_pem_slice(
            key.serialize_pem().as_bytes(),
        )
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let state = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = state.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await?.to_bytes();
                        let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        seen.reviews.lock().push((path.clone(), review.clone()));
                        let out = answer(&path, &review).await;
                        Ok::<_, hyper::Error>(
                            http::Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(out.to_string())))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Webhook {
        addr,
        ca_bundle: base64::engine::general_purpose::STANDARD.encode(ca_pem),
        seen,
    }
}

/// One webhook entry for a configuration.
fn hook_entry(name: &str, url: &str, ca: &str, extra: Value) -> Value {
    let mut h = json!({
        "name": name,
        "clientConfig": {"url": url, "caBundle": ca},
        "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
            "apiVersions": ["v1"], "resources": ["secrets"]}],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    });
    for (k, v) in extra.as_object().unwrap() {
        h[k] = v.clone();
    }
    h
}

async fn create_config(c: &Client, plural: &str, name: &str, webhooks: Vec<Value>) {
    let (s, body) = c
        .post(
            &format!("{GROUP_PATH}/{plural}"),
            json!({"metadata": {"name": name}, "webhooks": webhooks}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
}

async fn labelled_namespace(c: &Client, name: &str, labels: Value) {
    let (s, body) = c
        .post(
            "/api/v1/namespaces",
            json!({"metadata": {"name": name, "labels": labels}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
}

fn secret(name: &str) -> Value {
    json!({"metadata": {"name": name}, "stringData": {"k": "v"}})
}

async fn create_secret(
    c: &Client,
    ns: &str,
    name: &str,
    query: &str,
) -> (StatusCode, Value, Vec<String>) {
    let r = c
        .request(
            Method::POST,
            &format!("/api/v1/namespaces/{ns}/secrets{query}"),
            &secret(name).to_string(),
            &[("content-type", "application/json")],
        )
        .await;
    let warnings = r
        .headers
        .get_all(http::header::WARNING)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    (r.status, r.json(), warnings)
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(v["metadata"]["labels"].clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_webhooks_patch_and_validating_webhooks_deny() {
    let server = TestServer::start().await;
    let c = server.admin();
    let hook = webhook().await;
    labelled_namespace(&c, "hooked", json!({"webhooks": "on"})).await;
    labelled_namespace(&c, "plain", json!({})).await;
    let on = json!({"namespaceSelector": {"matchLabels": {"webhooks": "on"}}});
    let mut first = hook_entry(
        "mutate.example.com",
        &hook.url("/mutate"),
        &hook.ca_bundle,
        on.clone(),
    );
    first["reinvocationPolicy"] = json!("IfNeeded");
    create_config(&c, "mutatingwebhookconfigurations", "a-first", vec![first]).await;
    create_config(
        &c,
        "mutatingwebhookconfigurations",
        "b-second",
        vec![hook_entry(
            "second.example.com",
            &hook.url("/second"),
            &hook.ca_bundle,
            on.clone(),
        )],
    )
    .await;
    create_config(
        &c,
        "validatingwebhookconfigurations",
        "deny",
        vec![hook_entry(
            "deny.example.com",
            &hook.url("/deny"),
            &hook.ca_bundle,
            on,
        )],
    )
    .await;

    // The configurations take effect once the server's caches have them.
    let mut n = 0;
    eventually(LIMIT, "both mutating webhooks label new secrets", || {
        n += 1;
        let c = c.clone();
        async move {
            let (s, obj, _) = create_secret(&c, "hooked", &format!("probe-{n}"), "").await;
            s == StatusCode::CREATED && labels(&obj).len() == 2
        }
    })
    .await;
    eventually(LIMIT, "the validating webhook denies", || {
        let c = c.clone();
        async move { create_secret(&c, "hooked", "deny-probe", "").await.0 == StatusCode::FORBIDDEN }
    })
    .await;

    hook.seen.clear();
    let (s, obj, warnings) = create_secret(&c, "hooked", "s1", "").await;
    assert_eq!(s, StatusCode::CREATED, "{obj}");
    assert_eq!(
        labels(&obj),
        BTreeMap::from([
            ("mutated-by".to_string(), "hook".to_string()),
            ("second".to_string(), "yes".to_string())
        ])
    );
    assert_eq!(warnings, [r#"299 - "mutated by hook""#]);
    // The first webhook (IfNeeded) ran again after the second changed the object, and the
    // validating webhook saw the final object.
    assert_eq!(hook.seen.count("/mutate"), 2);
    assert_eq!(hook.seen.count("/second"), 1);
    assert_eq!(hook.seen.count("/deny"), 1);
    assert_eq!(
        labels(&hook.seen.last("/deny")["request"]["object"]).len(),
        2
    );
    let stored = c.get("/api/v1/namespaces/hooked/secrets/s1").await.1;
    assert_eq!(labels(&stored), labels(&obj));

    // The request carries the spec's fields.
    let review = hook.seen.last("/deny");
    assert_eq!(review["apiVersion"], "admission.svc.io/v1");
    let req = &review["request"];
    assert_eq!(req["uid"].as_str().unwrap().len(), 36);
    assert_eq!(
        req["kind"],
        json!({"group": "", "version": "v1", "kind": "Secret"})
    );
    assert_eq!(
        req["resource"],
        json!({"group": "", "version": "v1", "resource": "secrets"})
    );
    assert_eq!(req["requestResource"], req["resource"]);
    assert_eq!(
        (req["namespace"].as_str(), req["name"].as_str()),
        (Some("hooked"), Some("s1"))
    );
    assert_eq!(req["operation"], "CREATE");
    assert!(
        req["userInfo"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:masters")),
        "{req}"
    );
    assert_eq!(req["dryRun"], false);
    assert_eq!(req["options"]["kind"], "CreateOptions");
    assert!(req.get("oldObject").is_none());

    // Outside the selected namespace nothing is called.
    let (s, obj, _) = create_secret(&c, "plain", "deny-me", "").await;
    assert_eq!(s, StatusCode::CREATED, "{obj}");
    assert!(labels(&obj).is_empty());

    // A denial reaches the client with the webhook's code and message.
    let (s, status, _) = create_secret(&c, "hooked", "deny-this", "").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(status["code"], 403);
    assert_eq!(
        status["message"],
        "admission webhook \"deny.example.com\" denied the request: names starting with deny- \
         are refused"
    );
    assert_eq!(
        c.get("/api/v1/namespaces/hooked/secrets/deny-this").await.0,
        StatusCode::NOT_FOUND
    );

    // A patch becomes an UPDATE with the old object; dry runs reach webhooks without side
    // effects, marked as such, and store nothing.
    hook.seen.clear();
    let r = c
        .request(
            Method::PATCH,
            "/api/v1/namespaces/hooked/secrets/s1",
            r#"{"metadata":{"annotations":{"a":"b"}}}"#,
            &[("content-type", "application/merge-patch+json")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let req = hook.seen.last("/deny")["request"].clone();
    assert_eq!(req["operation"], "UPDATE");
    assert_eq!(req["oldObject"]["metadata"]["name"], "s1");
    assert_eq!(req["options"]["kind"], "UpdateOptions");
    let (s, _, _) = create_secret(&c, "hooked", "dry", "?dryRun=All").await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(hook.seen.last("/mutate")["request"]["dryRun"], true);
    assert_eq!(
        c.get("/api/v1/namespaces/hooked/secrets/dry").await.0,
        StatusCode::NOT_FOUND
    );

    // Per-webhook metrics with Kubernetes' names.
    let metrics = c.request(Method::GET, "/metrics", "", &[]).await.text();
    for line in [
        r#"apiserver_admission_webhook_request_total{name="mutate.example.com",type="admit",operation="CREATE",code="200",rejected="false"}"#,
        r#"apiserver_admission_webhook_rejection_count_total{name="deny.example.com",type="validating",operation="CREATE",error_type="no_error",rejection_code="403"}"#,
        r#"apiserver_admission_webhook_admission_duration_seconds_count{name="deny.example.com",type="validating",operation="CREATE",rejected="true"}"#,
    ] {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }

    // Writes to the configurations never reach webhooks; deleting one takes effect.
    let (s, body) = c
        .delete(&format!(
            "{GROUP_PATH}/validatingwebhookconfigurations/deny"
        ))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    eventually(LIMIT, "the validating webhook is gone", || {
        let c = c.clone();
        async move {
            matches!(
                create_secret(&c, "hooked", "deny-after", "").await.0,
                StatusCode::CREATED
            )
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policy_decides_when_the_webhook_is_down_or_slow() {
    let server = TestServer::start().await;
    let c = server.admin();
    let hook = webhook().await;
    // A port that refuses connections.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let down = format!("https://{closed}/hook");
    let mut hooks = Vec::new();
    for (case, url, policy) in [
        ("down-fail", down.clone(), "Fail"),
        ("down-ignore", down.clone(), "Ignore"),
        ("slow-fail", hook.url("/slow"), "Fail"),
        ("slow-ignore", hook.url("/slow"), "Ignore"),
        ("uid-fail", hook.url("/wrong-uid"), "Fail"),
        ("uid-ignore", hook.url("/wrong-uid"), "Ignore"),
    ] {
        labelled_namespace(&c, case, json!({"case": case})).await;
        hooks.push(hook_entry(
            &format!("{case}.example.com"),
            &url,
            &hook.ca_bundle,
            json!({"failurePolicy": policy, "timeoutSeconds": 1,
                "namespaceSelector": {"matchLabels": {"case": case}}}),
        ));
    }
    // Match conditions: a false one skips the webhook (here one that is down), an error
    // fails the request under Fail and skips the webhook under Ignore.
    for (case, policy, expression) in [
        (
            "cond",
            "Fail",
            "object.metadata.name != 'skip-me' && request.operation == 'CREATE'",
        ),
        ("cond-error-fail", "Fail", "object.spec.missing == 1"),
        ("cond-error-ignore", "Ignore", "object.spec.missing == 1"),
    ] {
        labelled_namespace(&c, case, json!({"case": case})).await;
        hooks.push(hook_entry(
            &format!("{case}.example.com"),
            &down,
            &hook.ca_bundle,
            json!({"failurePolicy": policy, "timeoutSeconds": 1,
                "namespaceSelector": {"matchLabels": {"case": case}},
                "matchConditions": [{"name": "check", "expression": expression}]}),
        ));
    }
    create_config(&c, "validatingwebhookconfigurations", "failures", hooks).await;
    let mut n = 0;
    eventually(LIMIT, "the configuration takes effect", || {
        n += 1;
        let c = c.clone();
        async move {
            create_secret(&c, "down-fail", &format!("p{n}"), "").await.0
                == StatusCode::INTERNAL_SERVER_ERROR
        }
    })
    .await;
    for (ns, code, wanted) in [
        (
            "down-fail",
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed calling webhook \"down-fail.example.com\"",
        ),
        ("down-ignore", StatusCode::CREATED, ""),
        (
            "slow-fail",
            StatusCode::INTERNAL_SERVER_ERROR,
            "no response within 1s",
        ),
        ("slow-ignore", StatusCode::CREATED, ""),
        (
            "uid-fail",
            StatusCode::INTERNAL_SERVER_ERROR,
            "response.uid",
        ),
        ("uid-ignore", StatusCode::CREATED, ""),
        (
            "cond",
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed calling webhook \"cond.example.com\"",
        ),
        (
            "cond-error-fail",
            StatusCode::INTERNAL_SERVER_ERROR,
            "match condition \"check\": no such key",
        ),
        ("cond-error-ignore", StatusCode::CREATED, ""),
    ] {
        let started = std::time::Instant::now();
        let (s, body, _) = create_secret(&c, ns, "s", "").await;
        assert_eq!(s, code, "{ns}: {body}");
        if !wanted.is_empty() {
            assert!(
                body["message"].as_str().unwrap().contains(wanted),
                "{ns}: {body}"
            );
        }
        // A slow webhook is given up on at its timeout, not when it answers.
        if ns.starts_with("slow") {
            assert!(
                started.elapsed() < Duration::from_millis(2900),
                "{ns} waited for the webhook"
            );
        }
    }
    let (s, body, _) = create_secret(&c, "cond", "skip-me", "").await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "a false condition skips the webhook: {body}"
    );
    let metrics = c.request(Method::GET, "/metrics", "", &[]).await.text();
    let line = r#"apiserver_admission_webhook_rejection_count_total{name="down-fail.example.com",type="validating",operation="CREATE",error_type="calling_webhook_error",rejection_code="0"}"#;
    assert!(metrics.contains(line), "{line} missing from\n{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_never_reaches_a_webhook_with_side_effects() {
    use svc_core::Resource;
    use svc_core::kinds::ValidatingWebhookConfiguration;
    let server = TestServer::start().await;
    let c = server.admin();
    let hook = webhook().await;
    labelled_namespace(&c, "effects", json!({"effects": "yes"})).await;
    // `sideEffects: Some` is refused by v1 validation...
    let entry = hook_entry(
        "effects.example.com",
        &hook.url("/allow"),
        &hook.ca_bundle,
        json!({"sideEffects": "Some", "namespaceSelector": {"matchLabels": {"effects": "yes"}}}),
    );
    let (s, body) = c
        .post(
            &format!("{GROUP_PATH}/validatingwebhookconfigurations"),
            json!({"metadata": {"name": "effects"}, "webhooks": [entry.clone()]}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("webhooks[0].sideEffects"),
        "{body}"
    );
    // ...but older versions stored it: such an object is written to the store directly.
    let obj: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.svc.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "effects", "uid": "0b0e1c5e-0000-4000-8000-000000000001",
            "creationTimestamp": "2026-01-01T00:00:00Z"},
        "webhooks": [entry]}))
    .unwrap();
    let key = ValidatingWebhookConfiguration::INFO.key("", "effects");
    let value = svc_core::object::encode_for_store(&obj).unwrap();
    server
        .own()
        .registry
        .store
        .create(Bytes::from(key), Bytes::from(value))
        .await
        .unwrap();
    let mut n = 0;
    eventually(LIMIT, "the webhook is called for ordinary writes", || {
        n += 1;
        let c = c.clone();
        let seen = hook.seen.clone();
        async move {
            let (s, _, _) = create_secret(&c, "effects", &format!("p{n}"), "").await;
            s == StatusCode::CREATED && seen.count("/allow") > 0
        }
    })
    .await;
    let calls = hook.seen.count("/allow");
    let (s, status, _) = create_secret(&c, "effects", "dry", "?dryRun=All").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{status}");
    assert_eq!(
        status["message"],
        "admission webhook \"effects.example.com\" does not support dry run"
    );
    assert_eq!(
        hook.seen.count("/allow"),
        calls,
        "the dry run reached the webhook"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_configures_webhooks_without_a_restart_and_prints_their_warnings() {
    let server = TestServer::start().await;
    let hook = webhook().await;
    let dir = server
        .handle()
        .admin_kubeconfig
        .parent()
        .unwrap()
        .to_path_buf();
    let manifest = format!(
        "apiVersion: admissionregistration.svc.io/v1\nkind: ValidatingWebhookConfiguration\n\
         metadata:\n  name: warn\nwebhooks:\n- name: warn.example.com\n  clientConfig:\n    \
         url: {}\n    caBundle: {}\n  rules:\n  - operations: [CREATE]\n    apiGroups: [\"\"]\n    \
         apiVersions: [v1]\n    resources: [namespaces]\n  sideEffects: None\n  \
         admissionReviewVersions: [v1]\n  timeoutSeconds: 5\n",
        hook.url("/warn"),
        hook.ca_bundle
    );
    let kubectl = |args: Vec<String>, stdin: Option<String>| {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            crate::support::kubectl::kubectl(&dir, &args, stdin.as_deref())
        })
    };
    let out = kubectl(
        vec!["apply".into(), "-f".into(), "-".into()],
        Some(manifest),
    )
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = kubectl(
        vec![
            "get".into(),
            "validatingwebhookconfigurations".into(),
            "-o".into(),
            "name".into(),
        ],
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&shown.stdout).trim(),
        "validatingwebhookconfiguration.admissionregistration.svc.io/warn"
    );
    // Poll until the configuration takes effect (bounded): kubectl prints the warnings.
    let deadline = std::time::Instant::now() + LIMIT;
    let mut n = 0;
    let stderr = loop {
        n += 1;
        let out = kubectl(
            vec!["create".into(), "namespace".into(), format!("warned-{n}")],
            None,
        )
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if stderr.contains("Warning: first warning") {
            break stderr;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl never printed the webhook's warnings: {stderr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The 300-character warning arrives cut to 256.
    let long = stderr
        .lines()
        .find(|l| l.starts_with("Warning: w"))
        .unwrap_or_else(|| panic!("no long warning in {stderr}"));
    assert_eq!(long, format!("Warning: {}", "w".repeat(256)));
}
