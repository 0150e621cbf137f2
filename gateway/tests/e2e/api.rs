//! End-to-end API tests through real TLS sockets: CRUD, conflicts, watch resume, selectors,
//! paging, authentication and authorization, and bad input.

use std::time::Duration;

use crate::support::client::{Client, TestServer, summary};
use http::{Method, StatusCode};
use serde_json::json;

const T: Duration = Duration::from_secs(10);

async fn make_ns(c: &Client, name: &str) {
    let (s, v) = c
        .post("/api/v1/namespaces", json!({"metadata": {"name": name}}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_round_trip() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    make_ns(&c, "team-a").await;

    let (s, sa) = c
        .post(
            "/api/v1/namespaces/team-a/serviceaccounts",
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "builder", "labels": {"app": "ci"}},
                   "secrets": [{"name": "s1"}], "imagePullSecrets": [{"name": "reg"}],
                   "automountServiceAccountToken": false}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{sa}");
    assert_eq!(sa["metadata"]["namespace"], "team-a");
    assert_eq!(sa["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert!(sa["metadata"]["creationTimestamp"].is_string());
    let rv = sa["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    let (s, got) = c
        .get("/api/v1/namespaces/team-a/serviceaccounts/builder")
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(got, sa);

    // Duplicate create.
    let (s, st) = c
        .post(
            "/api/v1/namespaces/team-a/serviceaccounts",
            json!({"metadata": {"name": "builder"}}),
        )
        .await;
    assert_eq!(
        (s, st["reason"].as_str()),
        (StatusCode::CONFLICT, Some("AlreadyExists"))
    );

    // Update with the current resourceVersion succeeds and moves it.
    let mut next = got.clone();
    next["automountServiceAccountToken"] = json!(true);
    let (s, updated) = c
        .put(
            "/api/v1/namespaces/team-a/serviceaccounts/builder",
            next.clone(),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{updated}");
    assert_ne!(updated["metadata"]["resourceVersion"].as_str().unwrap(), rv);
    assert_eq!(updated["metadata"]["uid"], sa["metadata"]["uid"]);

    // A stale resourceVersion is a conflict.
    let (s, st) = c
        .put("/api/v1/namespaces/team-a/serviceaccounts/builder", next)
        .await;
    assert_eq!(
        (s, st["reason"].as_str()),
        (StatusCode::CONFLICT, Some("Conflict")),
        "{st}"
    );

    // PUT of a missing object: ServiceAccounts do not allow create-on-update.
    let (s, _) = c
        .put(
            "/api/v1/namespaces/team-a/serviceaccounts/ghost",
            json!({"metadata": {"name": "ghost"}}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // List in the namespace and across namespaces.
    let (s, list) = c.get("/api/v1/namespaces/team-a/serviceaccounts").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list["kind"], "ServiceAccountList");
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let (_, all) = c.get("/api/v1/serviceaccounts").await;
    assert!(
        all["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["metadata"]["name"] == "builder")
    );

    // Delete returns the object, then it is gone.
    let (s, deleted) = c
        .delete("/api/v1/namespaces/team-a/serviceaccounts/builder")
        .await;
    assert_eq!(
        (s, deleted["metadata"]["name"].as_str()),
        (StatusCode::OK, Some("builder"))
    );
    let (s, st) = c
        .get("/api/v1/namespaces/team-a/serviceaccounts/builder")
        .await;
    assert_eq!(
        (s, st["reason"].as_str()),
        (StatusCode::NOT_FOUND, Some("NotFound"))
    );
    assert_eq!(st["message"], "serviceaccounts \"builder\" not found");
    let (s, _) = c
        .delete("/api/v1/namespaces/team-a/serviceaccounts/builder")
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_scope_their_objects() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    // System namespaces exist from the start.
    let (s, _) = c.get("/api/v1/namespaces/kube-system").await;
    assert_eq!(s, StatusCode::OK);
    // No objects in a namespace that does not exist.
    let (s, st) = c
        .post(
            "/api/v1/namespaces/nope/serviceaccounts",
            json!({"metadata": {"name": "a"}}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{st}");
    assert_eq!(st["message"], "namespaces \"nope\" not found");
    // Body namespace must match the path.
    make_ns(&c, "ns1").await;
    let (s, _) = c
        .post(
            "/api/v1/namespaces/ns1/serviceaccounts",
            json!({"metadata": {"name": "a", "namespace": "default"}}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    // Deleting a namespace terminates it, removes its contents, then removes it.
    let (s, _) = c
        .post(
            "/api/v1/namespaces/ns1/serviceaccounts",
            json!({"metadata": {"name": "a"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, ns) = c.delete("/api/v1/namespaces/ns1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(ns["status"]["phase"], "Terminating");
    assert!(ns["metadata"]["deletionTimestamp"].is_string());
    let mut gone = false;
    for _ in 0..100 {
        if c.get("/api/v1/namespaces/ns1").await.0 == StatusCode::NOT_FOUND {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "namespace was never removed");
    let (_, list) = c.get("/api/v1/namespaces/ns1/serviceaccounts").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_name_gives_unique_names() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    let mut names = std::collections::HashSet::new();
    for _ in 0..20 {
        let (s, sa) = c
            .post(
                "/api/v1/namespaces/default/serviceaccounts",
                json!({"metadata": {"generateName": "job-"}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED);
        let name = sa["metadata"]["name"].as_str().unwrap().to_string();
        assert!(name.starts_with("job-") && name.len() == 9, "{name}");
        names.insert(name);
    }
    assert_eq!(names.len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_changes_and_resumes() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    make_ns(&c, "w").await;
    let base = "/api/v1/namespaces/w/serviceaccounts";
    let (_, a) = c.post(base, json!({"metadata": {"name": "a"}})).await;
    let a_rv = a["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    // Unset resourceVersion: synthetic ADDED for what exists, then live events.
    let mut w = c.watch(&format!("{base}?watch=true")).await;
    assert_eq!(
        summary(&w.next_within(T).await.unwrap()),
        ("ADDED".into(), "a".into(), a_rv.clone())
    );
    let (_, b) = c
        .post(
            base,
            json!({"metadata": {"name": "b", "labels": {"x": "1"}}}),
        )
        .await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(summary(&ev).0, "ADDED");
    assert_eq!(ev["object"]["metadata"]["name"], "b");
    let mut b2 = b.clone();
    b2["metadata"]["labels"]["x"] = json!("2");
    let (s, b2) = c.put(&format!("{base}/b"), b2).await;
    assert_eq!(s, StatusCode::OK);
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(
        summary(&ev),
        (
            "MODIFIED".into(),
            "b".into(),
            b2["metadata"]["resourceVersion"].as_str().unwrap().into()
        )
    );
    let (s, _) = c.delete(&format!("{base}/a")).await;
    assert_eq!(s, StatusCode::OK);
    let del = w.next_within(T).await.unwrap();
    assert_eq!(summary(&del).0, "DELETED");
    assert_eq!(del["object"]["metadata"]["name"], "a");
    let del_rv: i64 = del["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        del_rv
            > b2["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse::<i64>()
                .unwrap()
    );

    // Resuming from a's creation replays exactly what came after it, without synthetic events.
    let mut r = c
        .watch(&format!("{base}?watch=1&resourceVersion={a_rv}"))
        .await;
    let got: Vec<_> = [
        r.next_within(T).await,
        r.next_within(T).await,
        r.next_within(T).await,
    ]
    .into_iter()
    .map(|e| summary(&e.unwrap()))
    .map(|(t, n, _)| (t, n))
    .collect();
    assert_eq!(
        got,
        vec![
            ("ADDED".to_string(), "b".to_string()),
            ("MODIFIED".into(), "b".into()),
            ("DELETED".into(), "a".into())
        ]
    );

    // A label-selected watch sees an object stop matching as DELETED.
    let mut sel = c
        .watch(&format!("{base}?watch=1&labelSelector=x%3D2"))
        .await;
    assert_eq!(summary(&sel.next_within(T).await.unwrap()).0, "ADDED");
    let (_, cur) = c.get(&format!("{base}/b")).await;
    let mut b3 = cur.clone();
    b3["metadata"]["labels"]["x"] = json!("3");
    assert_eq!(c.put(&format!("{base}/b"), b3).await.0, StatusCode::OK);
    assert_eq!(summary(&sel.next_within(T).await.unwrap()).0, "DELETED");

    // timeoutSeconds ends the stream.
    let mut short = c
        .watch(&format!(
            "{base}?watch=1&timeoutSeconds=1&resourceVersion={del_rv}"
        ))
        .await;
    let ended = tokio::time::timeout(T, async { while short.next().await.is_some() {} }).await;
    assert!(ended.is_ok(), "watch did not end after timeoutSeconds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_from_one_snapshot() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    make_ns(&c, "p").await;
    for i in 0..7 {
        let (s, _) = c
            .post("/api/v1/namespaces/p/serviceaccounts", json!({"metadata": {"name": format!("sa-{i}"), "labels": {"even": (i % 2 == 0).to_string()}}}))
            .await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let (s, page1) = c.get("/api/v1/namespaces/p/serviceaccounts?limit=3").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(page1["items"].as_array().unwrap().len(), 3);
    assert_eq!(page1["metadata"]["remainingItemCount"], 4);
    let rv = page1["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let token = page1["metadata"]["continue"].as_str().unwrap().to_string();
    // A write between pages does not show up in later pages.
    let (s, _) = c
        .post(
            "/api/v1/namespaces/p/serviceaccounts",
            json!({"metadata": {"name": "sa-9"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let mut names: Vec<String> = page1["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let mut token = token;
    while !token.is_empty() {
        let (s, page) = c
            .get(&format!(
                "/api/v1/namespaces/p/serviceaccounts?limit=3&continue={token}"
            ))
            .await;
        assert_eq!(s, StatusCode::OK, "{page}");
        assert_eq!(page["metadata"]["resourceVersion"].as_str().unwrap(), rv);
        names.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap().to_string()),
        );
        token = page["metadata"]["continue"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if token.is_empty() {
            assert!(page["metadata"].get("remainingItemCount").is_none());
        }
    }
    assert_eq!(names, (0..7).map(|i| format!("sa-{i}")).collect::<Vec<_>>());

    // Selectors filter, and remainingItemCount is omitted with selectors.
    let (_, even) = c
        .get("/api/v1/namespaces/p/serviceaccounts?labelSelector=even%3Dtrue&limit=2")
        .await;
    assert_eq!(even["items"].as_array().unwrap().len(), 2);
    assert!(even["metadata"].get("remainingItemCount").is_none());
    assert!(!even["metadata"]["continue"].as_str().unwrap().is_empty());
    let (_, by_name) = c
        .get("/api/v1/serviceaccounts?fieldSelector=metadata.name%3Dsa-3")
        .await;
    assert_eq!(by_name["items"].as_array().unwrap().len(), 1);

    // Invalid parameter combinations are 400s, bad selectors too.
    for q in [
        "resourceVersionMatch=Exact",
        "resourceVersion=0&resourceVersionMatch=Exact",
        "limit=2&continue=abc&resourceVersion=5",
        "labelSelector=a%20in%20(",
        "fieldSelector=spec.nodeName%3Dx",
        "continue=garbage",
        "limit=ten",
    ] {
        let (s, st) = c
            .get(&format!("/api/v1/namespaces/p/serviceaccounts?{q}"))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {st}");
        assert_eq!(st["kind"], "Status");
    }
    // A version from the future: 504 with the message Kubernetes clients look for.
    let (s, st) = c.get("/api/v1/namespaces/p/serviceaccounts?resourceVersion=999999&resourceVersionMatch=NotOlderThan").await;
    assert_eq!(s, StatusCode::GATEWAY_TIMEOUT);
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("Too large resource version"),
        "{st}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_and_authorization() {
    let srv = TestServer::start().await;
    // No certificate, by default: probes of health and version succeed, as Kubernetes lets
    // load balancers probe; everything else is 401 with a Status body.
    let anon = srv.anonymous();
    for path in ["/readyz", "/livez", "/healthz", "/readyz/etcd", "/version"] {
        assert_eq!(anon.get(path).await.0, StatusCode::OK, "{path}");
    }
    for path in ["/api/v1/namespaces", "/api", "/metrics"] {
        let (s, st) = anon.get(path).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(st["kind"], "Status");
        assert_eq!(st["code"], 401);
    }
    // With anonymous access off, not even the probes.
    let closed = TestServer::start_with(|o| o.anonymous_auth = Some(false)).await;
    let (s, st) = closed.anonymous().get("/readyz").await;
    assert_eq!(
        (s, st["code"].as_u64()),
        (StatusCode::UNAUTHORIZED, Some(401))
    );
    // A bearer token nobody issued is refused too.
    let r = anon
        .request(
            Method::GET,
            "/api/v1/namespaces",
            "",
            &[("authorization", "Bearer nope")],
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    // An authenticated user outside system:masters may discover but not read objects.
    let bob = srv.user("bob", &["devs"]);
    assert_eq!(bob.get("/api/v1").await.0, StatusCode::OK);
    let (s, st) = bob.get("/api/v1/namespaces/default/serviceaccounts").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("User \"bob\" cannot list resource \"serviceaccounts\""),
        "{st}"
    );

    // With anonymous access on, health is public and resources are not.
    let srv2 = TestServer::start_with(|o| o.anonymous_auth = Some(true)).await;
    let anon2 = srv2.anonymous();
    assert_eq!(anon2.get("/livez").await.0, StatusCode::OK);
    assert_eq!(
        anon2.get("/api/v1/namespaces").await.0,
        StatusCode::FORBIDDEN
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors() {
    let srv = TestServer::start_with(|o| o.max_request_body_bytes = 64 * 1024).await;
    let c = srv.admin();
    let sa = "/api/v1/namespaces/default/serviceaccounts";
    let cases: Vec<(&str, String, StatusCode, &str)> = vec![
        (
            "malformed JSON",
            "{\"metadata\": ".into(),
            StatusCode::BAD_REQUEST,
            "BadRequest",
        ),
        (
            "wrong kind",
            r#"{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}"#.into(),
            StatusCode::BAD_REQUEST,
            "BadRequest",
        ),
        (
            "wrong field type",
            r#"{"metadata":{"name":"x"},"secrets":"nope"}"#.into(),
            StatusCode::BAD_REQUEST,
            "BadRequest",
        ),
        (
            "bad name",
            r#"{"metadata":{"name":"Not_Valid"}}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
        ),
        (
            "no name",
            r#"{"metadata":{}}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
        ),
        (
            "bad label",
            r#"{"metadata":{"name":"x","labels":{"a":"-bad-"}}}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
        ),
        (
            "empty body",
            String::new(),
            StatusCode::BAD_REQUEST,
            "BadRequest",
        ),
        (
            "huge body",
            format!(
                r#"{{"metadata":{{"name":"x","annotations":{{"a":"{}"}}}}}}"#,
                "x".repeat(100_000)
            ),
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
        ),
    ];
    for (what, body, code, reason) in cases {
        let r = c
            .request(
                Method::POST,
                sa,
                &body,
                &[("content-type", "application/json")],
            )
            .await;
        assert_eq!(r.status, code, "{what}: {}", r.text());
        let st = r.json();
        assert_eq!(st["kind"], "Status", "{what}");
        assert_eq!(st["reason"], reason, "{what}: {st}");
    }
    let r = c
        .request(Method::POST, sa, "{}", &[("content-type", "text/plain")])
        .await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let r = c
        .request(Method::GET, sa, "", &[("accept", "application/xml")])
        .await;
    assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE);
    let (s, st) = c.get("/api/v1/pods").await;
    assert_eq!(
        (s, st["kind"].as_str()),
        (StatusCode::NOT_FOUND, Some("Status"))
    );
    // Invalid names in 422s name the field.
    let (_, st) = c.post(sa, json!({"metadata": {"name": "UPPER"}})).await;
    assert_eq!(st["details"]["causes"][0]["field"], "metadata.name");
    // The server is still healthy after all of that.
    assert_eq!(c.get("/readyz").await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_watches_share_one_h2_connection() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    make_ns(&c, "h2").await;
    let h2 = srv.client_with(
        Some((
            srv.handle().pki.admin_credentials().0.into(),
            srv.handle().pki.admin_credentials().1.into(),
        )),
        true,
    );
    let mut conn = h2.connect().await.unwrap();
    let mut bodies = Vec::new();
    for _ in 0..50 {
        let req = Client::build(
            Method::GET,
            "/api/v1/namespaces/h2/serviceaccounts?watch=1&resourceVersion=0",
            bytes::Bytes::new(),
            &[],
        );
        let resp = conn.send(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.version(), http::Version::HTTP_2);
        bodies.push(resp.into_body());
    }
    let (s, _) = c
        .post(
            "/api/v1/namespaces/h2/serviceaccounts",
            json!({"metadata": {"name": "x"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    use http_body_util::BodyExt;
    for b in bodies.iter_mut() {
        let frame = tokio::time::timeout(T, b.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let data = frame.into_data().unwrap();
        let ev: serde_json::Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(ev["type"], "ADDED");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_bodies_responses_and_watch() {
    use http_body_util::BodyExt;
    use svc_core::Resource;
    use svc_core::codec;
    use svc_core::kinds::ServiceAccount;

    let srv = TestServer::start().await;
    let c = srv.admin();
    let pb = "application/vnd.kubernetes.protobuf";
    let mut sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "pb", "labels": {"a": "b"}}})).unwrap();
    sa.set_type_meta();
    let body = codec::encode_protobuf(&sa);
    let r = c
        .send(Client::build(
            Method::POST,
            "/api/v1/namespaces/default/serviceaccounts",
            body,
            &[("content-type", pb), ("accept", pb)],
        ))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(r.headers["content-type"], pb);
    assert_eq!(&r.body[..4], &codec::PROTOBUF_MAGIC);
    let created: ServiceAccount = codec::decode_protobuf(&r.body).unwrap();
    assert_eq!(
        created.metadata.labels.get("a").map(String::as_str),
        Some("b")
    );
    assert!(!created.metadata.uid.is_empty());

    // Our own media type name works the same, and a body without the prefix is refused.
    let r = c
        .request(
            Method::GET,
            "/api/v1/namespaces/default/serviceaccounts/pb",
            "",
            &[("accept", "application/vnd.svc.protobuf")],
        )
        .await;
    assert_eq!(r.headers["content-type"], "application/vnd.svc.protobuf");
    let got: ServiceAccount = codec::decode_protobuf(&r.body).unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);
    let r = c
        .send(Client::build(
            Method::POST,
            "/api/v1/namespaces/default/serviceaccounts",
            "\x0a\x02hi",
            &[("content-type", pb)],
        ))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());

    // Watch in protobuf: length-prefixed WatchEvents whose objects are enveloped.
    let mut conn = c.connect().await.unwrap();
    let resp = conn
        .send(Client::build(
            Method::GET,
            "/api/v1/namespaces/default/serviceaccounts?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Dpb",
            bytes::Bytes::new(),
            &[("accept", pb)],
        ))
        .await
        .unwrap();
    assert_eq!(
        resp.headers()["content-type"],
        "application/vnd.kubernetes.protobuf;stream=watch"
    );
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    while buf.len() < 4 || buf.len() < 4 + u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize
    {
        let f = tokio::time::timeout(T, body.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        buf.extend_from_slice(&f.into_data().unwrap());
    }
    let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
    let (ty, obj) = codec::decode_watch_event_protobuf(&buf[..4 + len]).unwrap();
    assert_eq!(ty, "ADDED");
    let watched: ServiceAccount = codec::decode_protobuf(&obj).unwrap();
    assert_eq!(watched.metadata.name, "pb");

    // Lists in protobuf.
    let r = c
        .request(
            Method::GET,
            "/api/v1/namespaces/default/serviceaccounts",
            "",
            &[("accept", pb)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(&r.body[..4], &codec::PROTOBUF_MAGIC);
}
