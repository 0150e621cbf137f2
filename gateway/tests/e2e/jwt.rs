//! JWT authenticators of `--authentication-config` through real TLS sockets, against an OIDC
//! issuer the test runs on 127.0.0.1 (discovery and JWKS over TLS with its own CA): accepted
//! tokens and the user they map to (seen by an authorizer that records who asks), each reason
//! to refuse one, key rotation, an issuer that cannot be reached, reload of the file, a file
//! that stops the start, the file's anonymous settings, and kubectl with a token.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::{Method, StatusCode};
use jsonwebtoken::Algorithm;
use parking_lot::Mutex;
use serde_json::{Value, json};
use svc_core::user::UserInfo;
use svc_gateway::security::authz::{Attributes, Authorizer, Decision, DecisionFuture};

use crate::support::client::{Client, TestServer, eventually};
use crate::support::oidc::{SigningKey, TestIssuer};

const T: Duration = Duration::from_secs(10);
const AUD: &str = "svc-gateway";
/// A path the built-in policy does not answer, so the recorder is asked.
const NS: &str = "/api/v1/namespaces";

/// Allows every request and remembers who made it.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<UserInfo>>>);

impl Recorder {
    fn last(&self) -> UserInfo {
        self.0
            .lock()
            .last()
            .cloned()
            .expect("a request was authorized")
    }
}

impl Authorizer for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    fn authorize<'a>(&'a self, user: &'a UserInfo, _: &'a Attributes<'a>) -> DecisionFuture<'a> {
        self.0.lock().push(user.clone());
        Box::pin(std::future::ready(Decision::Allow))
    }
}

/// An AuthenticationConfiguration with one authenticator for `issuer`; `rest` is YAML under
/// the authenticator (claimMappings and rules), indented by two spaces.
fn config(issuer: &TestIssuer, rest: &str) -> String {
    format!(
        "apiVersion: apiserver.svc.io/v1beta1\nkind: AuthenticationConfiguration\njwt:\n\
         - issuer:\n    url: {}\n    audiences: [{AUD}]\n{}{rest}",
        issuer.url,
        issuer.ca_yaml(4)
    )
}

const MAPPINGS: &str = "  claimValidationRules:
  - claim: hd
    requiredValue: example.com
  claimMappings:
    username:
      claim: sub
      prefix: 'oidc:'
    groups:
      claim: groups
      prefix: 'oidc:'
    uid:
      claim: uid
";

async fn start(file: &Path, text: &str) -> (TestServer, Recorder) {
    std::fs::write(file, text).unwrap();
    let file = file.to_path_buf();
    let srv = TestServer::start_with(move |o| {
        o.authentication_config = Some(file);
        o.config_reload_interval = Duration::from_millis(200);
    })
    .await;
    let rec = Recorder::default();
    srv.own()
        .security
        .set_authorizers(vec![Box::new(rec.clone())]);
    (srv, rec)
}

async fn get_with(c: &Client, path: &str, token: &str) -> StatusCode {
    let auth = format!("Bearer {token}");
    c.request(Method::GET, path, "", &[("authorization", auth.as_str())])
        .await
        .status
}

/// Waits until the issuer's keys have been fetched (tokens are refused before).
async fn until_accepted(c: &Client, token: &str) {
    eventually(T, "a valid token is accepted", || async {
        get_with(c, NS, token).await == StatusCode::OK
    })
    .await;
}

fn good(issuer: &TestIssuer, extra: Value) -> Value {
    let mut base =
        json!({"sub": "alice", "hd": "example.com", "uid": "u-1", "groups": ["dev", "ops"]});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        base[k] = v;
    }
    issuer.claims(AUD, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_map_to_users_and_every_bad_one_is_refused() {
    let key = SigningKey::generate("k1", Algorithm::ES256);
    let issuer = TestIssuer::start(vec![key.clone()]).await;
    let dir = tempfile::tempdir().unwrap();
    let (srv, rec) = start(&dir.path().join("authn.yaml"), &config(&issuer, MAPPINGS)).await;
    let c = srv.anonymous();

    let token = key.sign(&good(&issuer, json!({})));
    until_accepted(&c, &token).await;
    let u = rec.last();
    assert_eq!(u.username, "oidc:alice");
    assert_eq!(u.uid, "u-1");
    assert_eq!(u.groups, ["oidc:dev", "oidc:ops", "system:authenticated"]);

    // The same token again is served from the cache; a string groups claim is one group.
    assert_eq!(get_with(&c, NS, &token).await, StatusCode::OK);
    let single = key.sign(&good(&issuer, json!({"groups": "solo"})));
    assert_eq!(get_with(&c, NS, &single).await, StatusCode::OK);
    assert_eq!(rec.last().groups, ["oidc:solo", "system:authenticated"]);

    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let refused = [
        (
            "wrong audience",
            key.sign(&good(&issuer, json!({"aud": ["other"]}))),
        ),
        (
            "audience as a string, wrong",
            key.sign(&good(&issuer, json!({"aud": "other"}))),
        ),
        (
            "expired",
            key.sign(&good(
                &issuer,
                json!({"exp": now - 3600, "iat": now - 7200, "nbf": now - 7200}),
            )),
        ),
        (
            "not yet valid",
            key.sign(&good(&issuer, json!({"nbf": now + 3600}))),
        ),
        (
            "failed claim rule",
            key.sign(&good(&issuer, json!({"hd": "evil.com"}))),
        ),
        (
            "no username claim",
            key.sign(&issuer.claims(AUD, json!({"hd": "example.com", "uid": "u"}))),
        ),
        (
            "another issuer",
            key.sign(&good(&issuer, json!({"iss": "https://elsewhere.example"}))),
        ),
        (
            "unknown key",
            SigningKey::generate("k9", Algorithm::ES256).sign(&good(&issuer, json!({}))),
        ),
        (
            "forged with the right kid",
            SigningKey::generate("k1", Algorithm::ES256).sign(&good(&issuer, json!({}))),
        ),
        ("no signature", unsigned(&good(&issuer, json!({})))),
        ("garbage", "not.a.jwt".to_string()),
    ];
    for (why, token) in &refused {
        let r = c
            .request(
                Method::GET,
                NS,
                "",
                &[("authorization", &format!("Bearer {token}"))],
            )
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{why}: {}", r.text());
        assert_eq!(r.json()["reason"], "Unauthorized", "{why}");
    }

    // TokenReview asks the JWT authenticators too, for this server's audiences.
    let review = |token: String, audiences: Value| {
        let admin = srv.admin();
        async move {
            let (s, v) = admin
                .post(
                    "/apis/authentication.svc.io/v1/tokenreviews",
                    json!({"apiVersion": "authentication.svc.io/v1", "kind": "TokenReview",
                           "spec": {"token": token, "audiences": audiences}}),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{v}");
            v["status"].clone()
        }
    };
    let st = review(token.clone(), json!([])).await;
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(st["user"]["username"], "oidc:alice");
    assert_eq!(st["user"]["uid"], "u-1");
    assert_eq!(
        st["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    let st = review(token.clone(), json!(["elsewhere"])).await;
    assert_eq!(st["authenticated"], Value::Null, "{st}");
    let st = review(refused[0].1.clone(), json!([])).await;
    assert!(
        st["error"].as_str().unwrap().contains("expected audience"),
        "{st}"
    );

    // Without a credential: probes stay anonymous, the API is 401.
    assert_eq!(c.get("/readyz").await.0, StatusCode::OK);
    assert_eq!(c.get("/api").await.0, StatusCode::UNAUTHORIZED);
    let (_, metrics) = srv.admin().get("/metrics").await;
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert!(
        metrics.contains("apiserver_authentication_jwt_authenticator_latency_seconds_count{result=\"success\",jwt_issuer_hash=\"sha256:"),
        "{metrics}"
    );
}

/// An `alg: none` token: header and payload, empty signature.
fn unsigned(claims: &Value) -> String {
    use base64::Engine as _;
    let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT"}"#),
        b64(claims.to_string().as_bytes())
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_keys_are_fetched_and_dropped_keys_refused() {
    let old = SigningKey::generate("old", Algorithm::ES256);
    let issuer = TestIssuer::start(vec![old.clone()]).await;
    let dir = tempfile::tempdir().unwrap();
    let (srv, rec) = start(&dir.path().join("authn.yaml"), &config(&issuer, MAPPINGS)).await;
    let c = srv.anonymous();
    until_accepted(&c, &old.sign(&good(&issuer, json!({})))).await;

    let new = SigningKey::generate("new", Algorithm::ES384);
    issuer.publish(vec![new.clone()]);
    // A token with the new key id makes the server fetch the keys again (at most every
    // couple of seconds, so this may take a moment).
    let token = new.sign(&good(&issuer, json!({"sub": "bob"})));
    until_accepted(&c, &token).await;
    assert_eq!(rec.last().username, "oidc:bob");
    // A token never seen before, signed with the dropped key.
    let stale = old.sign(&good(&issuer, json!({})));
    assert_eq!(get_with(&c, NS, &stale).await, StatusCode::UNAUTHORIZED);

    // Unknown key ids fetch the keys at most once per interval, however many arrive.
    let before = issuer.jwks_fetches.load(Ordering::Relaxed);
    let stranger = SigningKey::generate("stranger", Algorithm::ES256);
    for i in 0..20 {
        let t = stranger.sign(&good(&issuer, json!({"sub": format!("s{i}")})));
        assert_eq!(get_with(&c, NS, &t).await, StatusCode::UNAUTHORIZED);
    }
    let fetched = issuer.jwks_fetches.load(Ordering::Relaxed) - before;
    assert!(fetched <= 2, "{fetched} fetches for 20 tokens");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_issuer_refuses_its_tokens_and_blocks_no_other() {
    let key = SigningKey::generate("k1", Algorithm::ES256);
    let issuer = TestIssuer::start(vec![key.clone()]).await;
    // Nothing listens on this port: its keys never arrive.
    let dead = crate::support::process::free_port();
    let text = format!(
        "{}- issuer:\n    url: https://127.0.0.1:{dead}\n    audiences: [{AUD}]\n  claimMappings:\n    username: {{claim: sub, prefix: ''}}\n",
        config(&issuer, MAPPINGS)
    );
    let dir = tempfile::tempdir().unwrap();
    let (srv, _rec) = start(&dir.path().join("authn.yaml"), &text).await;
    let c = srv.anonymous();
    until_accepted(&c, &key.sign(&good(&issuer, json!({})))).await;
    let mut claims = issuer.claims(AUD, json!({"sub": "x"}));
    claims["iss"] = json!(format!("https://127.0.0.1:{dead}"));
    let started = std::time::Instant::now();
    assert_eq!(
        get_with(&c, NS, &key.sign(&claims)).await,
        StatusCode::UNAUTHORIZED
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused without waiting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_is_reloaded_and_a_bad_version_keeps_the_old_one() {
    let key = SigningKey::generate("k1", Algorithm::ES256);
    let issuer = TestIssuer::start(vec![key.clone()]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("authn.yaml");
    let (srv, rec) = start(&file, &config(&issuer, MAPPINGS)).await;
    let c = srv.anonymous();
    let token = key.sign(&good(&issuer, json!({})));
    until_accepted(&c, &token).await;
    assert_eq!(rec.last().username, "oidc:alice");

    std::fs::write(
        &file,
        config(
            &issuer,
            &MAPPINGS.replace("prefix: 'oidc:'\n    groups", "prefix: 'corp:'\n    groups"),
        ),
    )
    .unwrap();
    eventually(T, "the new username prefix is in force", || async {
        get_with(&c, NS, &token).await == StatusCode::OK && rec.last().username == "corp:alice"
    })
    .await;

    // A version with errors is refused; the one in force goes on.
    std::fs::write(
        &file,
        config(&issuer, "  claimMappings:\n    username: {claim: sub}\n"),
    )
    .unwrap();
    let admin = srv.admin();
    eventually(T, "the refused reload is counted", || async {
        let (_, m) = admin.get("/metrics").await;
        m.as_str().unwrap_or_default().contains(
            "apiserver_authentication_config_controller_automatic_reloads_total{status=\"failure\"} 1",
        )
    })
    .await;
    let (_, m) = admin.get("/metrics").await;
    let m = m.as_str().unwrap_or_default().to_string();
    assert!(m.contains("apiserver_authentication_config_controller_automatic_reloads_total{status=\"success\"} 1"), "{m}");
    assert!(m.contains("apiserver_authentication_config_controller_automatic_reload_last_timestamp_seconds{status=\"failure\"}"), "{m}");
    let fresh = key.sign(&good(&issuer, json!({})));
    assert_eq!(get_with(&c, NS, &fresh).await, StatusCode::OK);
    assert_eq!(rec.last().username, "corp:alice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_stops_the_start_with_every_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("authn.yaml");
    std::fs::write(
        &file,
        "apiVersion: apiserver.svc.io/v1beta1\nkind: AuthenticationConfiguration\njwt:\n\
         - issuer:\n    url: http://x\n    audiences: [a, b]\n  claimMappings:\n    username: {claim: sub}\n",
    )
    .unwrap();
    let mut opts = svc_gateway::base::flags::Options::for_tests(dir.path().join("data"));
    opts.authentication_config = Some(file.clone());
    let err = svc_gateway::run::start(opts)
        .await
        .err()
        .expect("refused")
        .to_string();
    for want in [
        "jwt[0].issuer.url: Invalid value: \"http://x\": URL scheme must be https",
        "jwt[0].issuer.audienceMatchPolicy: Invalid value: \"\": audienceMatchPolicy must be MatchAny for multiple audiences",
        "jwt[0].claimMappings.username.prefix: Required value",
    ] {
        assert!(err.contains(want), "{want} missing from {err}");
    }

    // The file's anonymous settings and --anonymous-auth exclude each other, and no JWT
    // authenticator may claim the service-account issuer.
    std::fs::write(
        &file,
        "apiVersion: apiserver.svc.io/v1\nkind: AuthenticationConfiguration\njwt:\n\
         - issuer:\n    url: https://kubernetes.default.svc.cluster.local\n    audiences: [a]\n  \
         claimMappings:\n    username: {claim: sub, prefix: ''}\nanonymous:\n  enabled: true\n",
    )
    .unwrap();
    let mut opts = svc_gateway::base::flags::Options::for_tests(dir.path().join("data"));
    opts.authentication_config = Some(file);
    opts.anonymous_auth = Some(true);
    let err = svc_gateway::run::start(opts)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("anonymous: Forbidden: --anonymous-auth flag cannot be set"),
        "{err}"
    );
    assert!(err.contains("jwt[0].issuer.url: Invalid value: \"https://kubernetes.default.svc.cluster.local\": URL must not overlap with disallowed issuers"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_files_anonymous_conditions_decide_who_is_anonymous() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("authn.yaml");
    let (srv, rec) = start(
        &file,
        "apiVersion: apiserver.svc.io/v1beta1\nkind: AuthenticationConfiguration\n\
         anonymous:\n  enabled: true\n  conditions:\n  - path: /livez\n  - path: /api\n",
    )
    .await;
    let c = srv.anonymous();
    assert_eq!(c.get("/livez").await.0, StatusCode::OK);
    assert_eq!(c.get("/api").await.0, StatusCode::OK);
    let u = rec.last();
    assert_eq!(u.username, "system:anonymous");
    assert_eq!(u.groups, ["system:unauthenticated"]);
    assert_eq!(c.get("/readyz").await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(c.get("/apis").await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_and_curl_with_a_token_from_the_issuer() {
    let key = SigningKey::generate("k1", Algorithm::ES256);
    let issuer = TestIssuer::start(vec![key.clone()]).await;
    let dir = tempfile::tempdir().unwrap();
    let (srv, rec) = start(&dir.path().join("authn.yaml"), &config(&issuer, MAPPINGS)).await;
    let token = key.sign(&good(&issuer, json!({"sub": "carol"})));
    until_accepted(&srv.anonymous(), &token).await;

    let kubeconfig = dir.path().join("jwt.kubeconfig");
    std::fs::copy(&srv.handle().admin_kubeconfig, &kubeconfig).unwrap();
    let kc = kubeconfig.to_str().unwrap().to_string();
    let run = move |args: Vec<String>| {
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kc)
            .args(args)
            .output()
            .expect("kubectl is installed by the test command (scripts/test.sh)")
    };
    let run = Arc::new(run);
    let r = run.clone();
    let token2 = token.clone();
    let out = tokio::task::spawn_blocking(move || {
        let set = r(vec![
            "config".into(),
            "set-credentials".into(),
            "jwt".into(),
            format!("--token={token2}"),
        ]);
        assert!(
            set.status.success(),
            "{}",
            String::from_utf8_lossy(&set.stderr)
        );
        let ctx = r(vec![
            "config".into(),
            "set-context".into(),
            "--current".into(),
            "--user=jwt".into(),
        ]);
        assert!(
            ctx.status.success(),
            "{}",
            String::from_utf8_lossy(&ctx.stderr)
        );
        r(vec![
            "get".into(),
            "namespaces".into(),
            "-o".into(),
            "name".into(),
        ])
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/default"));
    assert_eq!(rec.last().username, "oidc:carol");

    let port = srv.handle().addr.port();
    let curl = move |path: &str| {
        let out = std::process::Command::new("curl")
            .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!("https://127.0.0.1:{port}{path}"))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (readyz, api) = tokio::task::spawn_blocking(move || (curl("/readyz"), curl("/api")))
        .await
        .unwrap();
    assert_eq!(readyz, "200");
    assert_eq!(api, "401");
}

const EXPRESSIONS: &str = "  claimValidationRules:
  - expression: \"claims.hd == 'example.com'\"
    message: the token is not from example.com
  - expression: \"!has(claims.items) || claims.items.all(x, claims.items.all(y, x == y || x != y))\"
  claimMappings:
    username:
      expression: \"claims.email_verified ? 'cel:' + claims.email : ''\"
    groups:
      expression: \"claims.groups.map(g, 'team:' + g)\"
    uid:
      expression: \"'id-' + claims.uid\"
    extra:
    - key: example.com/tenant
      valueExpression: claims.tenant
    - key: example.com/empty
      valueExpression: \"''\"
  userValidationRules:
  - expression: \"!user.username.startsWith('cel:system:')\"
    message: system users are not for tokens
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expressions_map_claims_and_rules_refuse_tokens() {
    let key = SigningKey::generate("k1", Algorithm::ES256);
    let issuer = TestIssuer::start(vec![key.clone()]).await;
    let dir = tempfile::tempdir().unwrap();
    let (srv, rec) = start(
        &dir.path().join("authn.yaml"),
        &config(&issuer, EXPRESSIONS),
    )
    .await;
    let c = srv.anonymous();
    let claims = |extra: Value| {
        good(
            &issuer,
            json!({"email": "dana@example.com", "email_verified": true, "tenant": "blue"})
                .as_object()
                .unwrap()
                .clone()
                .into_iter()
                .chain(extra.as_object().cloned().unwrap_or_default())
                .collect::<serde_json::Map<String, Value>>()
                .into(),
        )
    };
    until_accepted(&c, &key.sign(&claims(json!({})))).await;
    let u = rec.last();
    assert_eq!(u.username, "cel:dana@example.com");
    assert_eq!(u.uid, "id-u-1");
    assert_eq!(u.groups, ["team:dev", "team:ops", "system:authenticated"]);
    assert_eq!(u.extra.get("example.com/tenant").unwrap(), &["blue"]);
    assert!(
        !u.extra.contains_key("example.com/empty"),
        "an empty value is no value"
    );

    for (why, extra) in [
        ("failed claim rule", json!({"hd": "evil.com"})),
        ("empty username", json!({"email_verified": false})),
        ("failed user rule", json!({"email": "system:admin"})),
        ("wrong type for the username", json!({"email": 5})),
    ] {
        let token = key.sign(&claims(extra));
        assert_eq!(
            get_with(&c, NS, &token).await,
            StatusCode::UNAUTHORIZED,
            "{why}"
        );
    }

    // An expression that would cost more than its budget is stopped and refuses the token;
    // the server goes on serving.
    let items: Vec<u32> = (0..1500).collect();
    let costly = key.sign(&claims(json!({"items": items})));
    assert_eq!(get_with(&c, NS, &costly).await, StatusCode::UNAUTHORIZED);
    assert_eq!(srv.admin().get("/readyz").await.0, StatusCode::OK);
    let small = key.sign(&claims(json!({"items": [1, 2, 3]})));
    assert_eq!(get_with(&c, NS, &small).await, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expressions_that_do_not_compile_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("authn.yaml");
    std::fs::write(
        &file,
        "apiVersion: apiserver.svc.io/v1beta1\nkind: AuthenticationConfiguration\njwt:\n\
         - issuer:\n    url: https://issuer.example\n    audiences: [a]\n  claimMappings:\n    \
         username: {expression: 'claims.sub +'}\n    uid: {expression: '1 + 2'}\n  \
         userValidationRules:\n  - expression: nobody.username\n",
    )
    .unwrap();
    let mut opts = svc_gateway::base::flags::Options::for_tests(dir.path().join("data"));
    opts.authentication_config = Some(file);
    let err = svc_gateway::run::start(opts)
        .await
        .err()
        .expect("refused")
        .to_string();
    for want in [
        "jwt[0].claimMappings.username.expression: Invalid value: \"claims.sub +\": compilation failed",
        "jwt[0].claimMappings.uid.expression: Invalid value: \"1 + 2\": compilation failed",
        "jwt[0].userValidationRules[0].expression: Invalid value: \"nobody.username\": compilation failed",
    ] {
        assert!(err.contains(want), "{want} missing from {err}");
    }
}
