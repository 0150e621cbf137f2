//! Identity through real TLS sockets: every namespace's `default` account (recreated when
//! deleted), Secrets, tokens from `serviceaccounts/<name>/token`, TokenReview, bearer
//! authentication (a token user is authenticated, then authorized: 403, not 401), and
//! revocation when the account or the bound Secret goes, or the account is recreated.

use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::client::{Client, TestServer, create_namespace, eventually};

const T: Duration = Duration::from_secs(10);
const REVIEWS: &str = "/apis/authentication.svc.io/v1/tokenreviews";

async fn token_for(c: &Client, ns: &str, sa: &str, spec: Value) -> (StatusCode, Value) {
    c.post(
        &format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"),
        json!({"apiVersion": "authentication.svc.io/v1", "kind": "TokenRequest", "spec": spec}),
    )
    .await
}

async fn review(c: &Client, token: &str, audiences: &[&str]) -> Value {
    let (s, v) = c
        .post(
            REVIEWS,
            json!({"apiVersion": "authentication.svc.io/v1", "kind": "TokenReview",
                   "spec": {"token": token, "audiences": audiences}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v["status"].clone()
}

/// A GET with `Authorization: Bearer <token>`.
async fn get_with(c: &Client, path: &str, token: &str) -> (StatusCode, Value) {
    let auth = format!("Bearer {token}");
    let r = c
        .request(Method::GET, path, "", &[("authorization", auth.as_str())])
        .await;
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_authenticate_are_reviewed_and_are_revoked() {
    let srv = TestServer::start().await;
    let admin = srv.admin();
    let anon = srv.anonymous();
    create_namespace(&admin, "id").await;
    let (s, sa) = admin
        .post(
            "/api/v1/namespaces/id/serviceaccounts",
            json!({"metadata": {"name": "builder"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{sa}");
    let uid = sa["metadata"]["uid"].as_str().unwrap().to_string();

    let (s, tr) = token_for(&admin, "id", "builder", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{tr}");
    assert_eq!(tr["kind"], "TokenRequest");
    assert_eq!(tr["apiVersion"], "authentication.svc.io/v1");
    assert_eq!(tr["metadata"]["name"], "builder");
    assert_eq!(tr["spec"]["expirationSeconds"], 3600);
    assert_eq!(
        tr["spec"]["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    assert!(tr["status"]["expirationTimestamp"].is_string());
    let token = tr["status"]["token"].as_str().unwrap().to_string();
    assert_eq!(token.split('.').count(), 3, "a JWT");

    // TokenReview: the account's identity, Kubernetes' groups, the shared audiences.
    let st = review(&admin, &token, &[]).await;
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(st["user"]["username"], "system:serviceaccount:id:builder");
    assert_eq!(st["user"]["uid"], uid.as_str());
    assert_eq!(
        st["user"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:id",
            "system:authenticated"
        ])
    );
    assert!(
        st["user"]["extra"]["authentication.svc.io/credential-id"][0]
            .as_str()
            .unwrap()
            .starts_with("JTI=")
    );
    assert_eq!(
        st["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    // A reviewer naming an audience the token lacks: not authenticated, with a reason.
    let st = review(&admin, &token, &["vault"]).await;
    assert_eq!(st["authenticated"], Value::Null, "{st}");
    assert!(st["error"].as_str().unwrap().contains("audiences"), "{st}");
    // Garbage is an answer, not an HTTP error.
    let st = review(&admin, "not-a-token", &[]).await;
    assert!(
        st["authenticated"].is_null() && st["error"].is_string(),
        "{st}"
    );

    // The token is a credential: discovery works, resources are forbidden (403, not 401).
    let (s, _) = get_with(&anon, "/api/v1", &token).await;
    assert_eq!(s, StatusCode::OK);
    let (s, st) = get_with(&anon, "/api/v1/namespaces/id/secrets", &token).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{st}");
    assert_eq!(
        st["message"],
        "secrets is forbidden: User \"system:serviceaccount:id:builder\" cannot list resource \
         \"secrets\" in API group \"\" in the namespace \"id\""
    );
    let (s, _) = get_with(&anon, "/api/v1", "garbage").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // A token for another audience is no credential here.
    let (_, other) = token_for(&admin, "id", "builder", json!({"audiences": ["vault"]})).await;
    let other = other["status"]["token"].as_str().unwrap();
    assert_eq!(
        get_with(&anon, "/api/v1", other).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        review(&admin, other, &["vault"]).await["authenticated"],
        true
    );

    // Deleting the account revokes its tokens; recreating it does not bring them back.
    let (s, _) = admin
        .delete("/api/v1/namespaces/id/serviceaccounts/builder")
        .await;
    assert_eq!(s, StatusCode::OK);
    eventually(T, "the deleted account's token is refused", || async {
        get_with(&anon, "/api/v1", &token).await.0 == StatusCode::UNAUTHORIZED
    })
    .await;
    let st = review(&admin, &token, &[]).await;
    assert!(st["error"].as_str().unwrap().contains("deleted"), "{st}");
    let (s, _) = admin
        .post(
            "/api/v1/namespaces/id/serviceaccounts",
            json!({"metadata": {"name": "builder"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let st = review(&admin, &token, &[]).await;
    assert!(st["error"].as_str().unwrap().contains("UID"), "{st}");
    assert_eq!(
        get_with(&anon, "/api/v1", &token).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_tokens_live_as_long_as_their_secret() {
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "b").await;
    let (s, secret) = admin
        .post(
            "/api/v1/namespaces/b/secrets",
            json!({"metadata": {"name": "s"}, "stringData": {"k": "v"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{secret}");
    assert_eq!(secret["data"]["k"], "dg==", "stringData folds into data");
    assert_eq!(secret["type"], "Opaque");
    assert!(secret.get("stringData").is_none());
    let secret_uid = secret["metadata"]["uid"].as_str().unwrap();

    let bound = json!({"boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": "s"}});
    let (s, tr) = token_for(&admin, "b", "default", bound).await;
    assert_eq!(s, StatusCode::CREATED, "{tr}");
    assert_eq!(tr["spec"]["boundObjectRef"]["uid"], secret_uid);
    let token = tr["status"]["token"].as_str().unwrap().to_string();
    assert_eq!(review(&admin, &token, &[]).await["authenticated"], true);

    // A stale uid in the reference is a conflict; a Pod or another kind is invalid.
    let stale = json!({"boundObjectRef": {"kind": "Secret", "name": "s", "uid": "nope"}});
    assert_eq!(
        token_for(&admin, "b", "default", stale).await.0,
        StatusCode::CONFLICT
    );
    let (s, st) = token_for(
        &admin,
        "b",
        "default",
        json!({"boundObjectRef": {"kind": "Pod", "name": "p"}, "expirationSeconds": 60}),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{st}");
    let fields: Vec<&str> = st["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        ["spec.expirationSeconds", "spec.boundObjectRef.kind"]
    );
    let missing = json!({"boundObjectRef": {"kind": "Secret", "name": "absent"}});
    assert_eq!(
        token_for(&admin, "b", "default", missing).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        token_for(&admin, "b", "nobody", json!({})).await.0,
        StatusCode::NOT_FOUND
    );

    let (s, _) = admin.delete("/api/v1/namespaces/b/secrets/s").await;
    assert_eq!(s, StatusCode::OK);
    eventually(
        T,
        "the token bound to the deleted secret is refused",
        || async { review(&admin, &token, &[]).await["authenticated"].is_null() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_namespace_keeps_a_default_account_and_discovery_lists_identity() {
    let srv = TestServer::start().await;
    let admin = srv.admin();
    create_namespace(&admin, "keep").await;
    let path = "/api/v1/namespaces/keep/serviceaccounts/default";
    let (_, first) = admin.get(path).await;
    let (s, _) = admin.delete(path).await;
    assert_eq!(s, StatusCode::OK);
    eventually(T, "the default account is recreated", || async {
        let (s, v) = admin.get(path).await;
        s == StatusCode::OK && v["metadata"]["uid"] != first["metadata"]["uid"]
    })
    .await;
    for ns in ["default", "kube-system"] {
        let (s, _) = admin
            .get(&format!("/api/v1/namespaces/{ns}/serviceaccounts/default"))
            .await;
        assert_eq!(s, StatusCode::OK, "{ns}");
    }

    let (_, core) = admin.get("/api/v1").await;
    let names: Vec<&str> = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for want in ["secrets", "serviceaccounts", "serviceaccounts/token"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let token = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "serviceaccounts/token")
        .unwrap();
    assert_eq!(token["verbs"], json!(["create"]));
    assert_eq!(token["group"], "authentication.svc.io");
    let (s, auth) = admin.get("/apis/authentication.svc.io/v1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(auth["resources"][0]["name"], "tokenreviews");
    assert_eq!(auth["resources"][0]["verbs"], json!(["create"]));
    // A review is only created: nothing to list.
    let (s, _) = admin.get(REVIEWS).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
}

/// One request over a new TLS connection of `c`'s configuration (its session cache shared):
/// how the handshake went, and the answer's status and JSON.
async fn over_new_connection(c: &Client, path: &str) -> (rustls::HandshakeKind, StatusCode, Value) {
    use http_body_util::BodyExt as _;
    let tls = c.tls_stream().await.unwrap();
    let kind = tls.get_ref().1.handshake_kind().unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = send
        .send_request(Client::build(Method::GET, path, "", &[]))
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (kind, status, serde_json::from_slice(&body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_tls_session_is_still_its_client_certificates_user() {
    let srv = TestServer::start().await;
    let carol = srv.user("carol", &[]);
    let path = "/api/v1/namespaces/default/secrets";
    // The first connection is a full handshake; the server's ticket comes with the answer.
    let (kind, status, body) = over_new_connection(&carol, path).await;
    assert_eq!(kind, rustls::HandshakeKind::Full);
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let refused = "secrets is forbidden: User \"carol\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\"";
    assert_eq!(body["message"], refused);
    // Other clients' first connections meanwhile, more than a server would keep sessions of
    // in memory (rustls' cache holds 256, and each full handshake is given two tickets):
    // carol's ticket still holds.
    for _ in 0..200 {
        assert_eq!(srv.anonymous().get("/livez").await.0, StatusCode::OK);
    }
    // The next resumes with it, and is still carol, authorized as carol.
    let (kind, status, body) = over_new_connection(&carol, path).await;
    assert_eq!(kind, rustls::HandshakeKind::Resumed);
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["message"], refused);
    // Another client, with no session of its own yet, starts in full.
    let admin = srv.admin();
    let (kind, status, _) = over_new_connection(&admin, path).await;
    assert_eq!(kind, rustls::HandshakeKind::Full);
    assert_eq!(status, StatusCode::OK);
    let metrics = admin.request(Method::GET, "/metrics", "", &[]).await.text();
    let resumed = metrics
        .lines()
        .find_map(|l| l.strip_prefix("svc_tls_handshakes_total{result=\"resumed\"} "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no resumed handshakes in /metrics"));
    assert!(resumed >= 1.0, "{resumed}");
}
