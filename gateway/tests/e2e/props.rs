//! Property tests through the real server of what clients put in query strings and headers:
//! list query strings (the server refuses exactly what `ListOptions` refuses), continue tokens
//! (arbitrary, and valid ones changed: never a 5xx, never an item of another collection),
//! resourceVersions, and bearer tokens (arbitrary, and issued ones changed: 401 and a
//! TokenReview that does not authenticate, never a 5xx). Each runs a fixed number of cases.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{Method, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use svc_gateway::base::query::{ListOptions, Query};

use crate::support::client::{Resp, TestServer, create_namespace};

const CASES: u32 = 256;

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A read at a revision the server has not reached yet waits for it, then gets Kubernetes'
/// 504 `Too large resource version` with a retry hint: the one 5xx that is the right answer.
fn too_large_resource_version(r: &Resp) -> bool {
    if r.status != StatusCode::GATEWAY_TIMEOUT {
        return false;
    }
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    v["kind"] == "Status"
        && v["code"] == 504
        && v["reason"] == "Timeout"
        && v["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Timeout: Too large resource version"))
        && v["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"
        && v["details"]["retryAfterSeconds"].is_number()
}

/// An error answer is a `Status` naming its own code; nothing is a server error.
fn check_answer(what: &str, r: &Resp) -> Result<(), TestCaseError> {
    if too_large_resource_version(r) {
        return Ok(());
    }
    prop_assert!(r.status.as_u16() < 500, "{what}: {} {}", r.status, r.text());
    if r.status.as_u16() >= 400 {
        let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        prop_assert!(
            v["kind"] == "Status" && v["code"] == r.status.as_u16() && v["status"] == "Failure",
            "{what}: {} is not a Status: {}",
            r.status,
            r.text()
        );
    }
    Ok(())
}

/// Query text: known list parameters (watch left out: it streams) with values near and far
/// from valid, joined and percent-encoded in any way.
fn list_query() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        4 => prop::sample::select(vec![
            "limit", "continue", "resourceVersion", "resourceVersionMatch", "labelSelector",
            "fieldSelector", "timeoutSeconds", "allowWatchBookmarks", "pretty",
            "sendInitialEvents", "", "limit[]",
        ])
        .prop_map(String::from),
        1 => ".{0,6}",
    ];
    let value = prop_oneof![
        prop::sample::select(vec![
            "",
            "0",
            "1",
            "-1",
            "2",
            "500",
            "9223372036854775807",
            "9223372036854775808",
            "1e3",
            "Exact",
            "NotOlderThan",
            "exact",
            "true",
            "false",
            "T",
            "yes",
            "app=web",
            "app in (a,b)",
            "!app",
            "app>1",
            "metadata.name=a",
            "metadata.name!=a",
            "metadata.namespace==default",
            "spec.x=y",
            "a,b",
            "=",
            "%",
            "%zz",
            "\u{0}",
        ])
        .prop_map(String::from),
        ".{0,12}",
    ];
    let encoded = prop::bool::ANY;
    prop::collection::vec((key, value, encoded), 0..6).prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(k, v, encode)| {
                if encode {
                    form_urlencoded::Serializer::new(String::new())
                        .append_pair(&k, &v)
                        .finish()
                } else {
                    // Raw, but still a valid URI: only what a query may carry goes through
                    // (a stray `%` included).
                    let keep = |s: &str| -> String {
                        s.chars()
                            .filter(|c| {
                                c.is_ascii_alphanumeric() || "-._~!$'()*+,;:@/?%".contains(*c)
                            })
                            .collect()
                    };
                    format!("{}={}", keep(&k), keep(&v))
                }
            })
            .collect::<Vec<_>>()
            .join("&")
    })
}

#[test]
fn list_query_strings_are_answered_as_list_options_parse_them() {
    let rt = runtime();
    let server = rt.block_on(TestServer::start());
    let admin = server.admin();
    rt.block_on(create_namespace(&admin, "props"));
    let mut runner = runner(CASES);
    let result = runner.run(&list_query(), |q| {
        let parsed = ListOptions::from_query(&Query::parse(Some(&q)));
        for path in [
            "/api/v1/namespaces/props/serviceaccounts",
            "/api/v1/secrets",
            "/apis/certificates.svc.io/v1/certificatesigningrequests",
        ] {
            let uri = format!("{path}?{q}");
            let r = rt.block_on(admin.request(Method::GET, &uri, "", &[]));
            check_answer(&uri, &r)?;
            if parsed.is_err() {
                prop_assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}: {}", uri, r.text());
            }
        }
        Ok(())
    });
    rt.block_on(async move { drop(server) });
    result.unwrap();
}

/// A continue token as it is, as base64 of changed JSON, or with its text changed.
#[derive(Debug, Clone)]
enum TokenChange {
    Text(Vec<(prop::sample::Index, char)>),
    Field(&'static str, Value),
    Arbitrary(String),
}

fn token_change() -> impl Strategy<Value = TokenChange> {
    let json_value = prop_oneof![
        any::<i64>().prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "/",
            "..",
            "../secrets/x",
            "/registry/secrets/",
            "a",
            "default/",
            "\u{0}",
            "meta.svc.io/v1",
            "props/b",
        ])
        .prop_map(Value::from),
        ".{0,10}".prop_map(Value::from),
        Just(Value::Null),
        Just(json!({"a": 1})),
    ];
    prop_oneof![
        prop::collection::vec((any::<prop::sample::Index>(), any::<char>()), 1..3)
            .prop_map(TokenChange::Text),
        (
            prop::sample::select(vec!["v", "rv", "start", "t", "extra"]),
            json_value
        )
            .prop_map(|(f, v)| TokenChange::Field(f, v)),
        ".{0,40}".prop_map(TokenChange::Arbitrary),
    ]
}

fn apply_change(token: &str, change: &TokenChange) -> String {
    match change {
        TokenChange::Text(edits) => {
            let mut chars: Vec<char> = token.chars().collect();
            for (i, c) in edits {
                let at = i.index(chars.len());
                chars[at] = *c;
            }
            chars.into_iter().collect()
        }
        TokenChange::Field(field, value) => {
            let raw = URL_SAFE_NO_PAD.decode(token).unwrap();
            let mut v: Value = serde_json::from_slice(&raw).unwrap();
            v[*field] = value.clone();
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&v).unwrap())
        }
        TokenChange::Arbitrary(s) => s.clone(),
    }
}

fn encode_query_value(v: &str) -> String {
    form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

#[test]
fn changed_continue_tokens_never_fail_the_server_or_leave_their_collection() {
    let rt = runtime();
    let server = rt.block_on(TestServer::start());
    let admin = server.admin();
    let list = "/api/v1/namespaces/props/serviceaccounts";
    let token = rt.block_on(async {
        create_namespace(&admin, "props").await;
        create_namespace(&admin, "other").await;
        for (ns, name) in [
            ("props", "a"),
            ("props", "b"),
            ("props", "c"),
            ("other", "z"),
        ] {
            let (s, v) = admin
                .post(
                    &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
                    json!({"metadata": {"name": name}}),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{v}");
        }
        for name in ["s1", "s2"] {
            let (s, v) = admin
                .post(
                    "/api/v1/namespaces/props/secrets",
                    json!({"metadata": {"name": name}}),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{v}");
        }
        let (s, v) = admin.get(&format!("{list}?limit=1")).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v["metadata"]["continue"].as_str().unwrap().to_string()
    });
    // The unchanged token continues the list.
    let (s, v) = rt.block_on(admin.get(&format!("{list}?limit=1&continue={token}")));
    assert_eq!(s, StatusCode::OK, "{v}");

    let mut runner = runner(CASES);
    let result = runner.run(&(token_change(), prop::bool::ANY), |(change, limit)| {
        let changed = apply_change(&token, &change);
        let limit = if limit { "&limit=1" } else { "" };
        let uri = format!("{list}?continue={}{limit}", encode_query_value(&changed));
        let r = rt.block_on(admin.request(Method::GET, &uri, "", &[]));
        if too_large_resource_version(&r) {
            return Ok(());
        }
        check_answer(&uri, &r)?;
        prop_assert!(
            matches!(r.status.as_u16(), 200 | 400 | 410),
            "{}: {} {}",
            uri,
            r.status,
            r.text()
        );
        if r.status == StatusCode::OK {
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            prop_assert_eq!(&v["kind"], "ServiceAccountList");
            for item in v["items"].as_array().unwrap() {
                prop_assert_eq!(
                    &item["metadata"]["namespace"],
                    "props",
                    "{} left its collection: {}",
                    uri,
                    item
                );
            }
        }
        Ok(())
    });
    rt.block_on(async move { drop(server) });
    result.unwrap();
}

/// resourceVersions near and far from valid.
fn resource_version() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "0",
            "1",
            "-1",
            "+1",
            "01",
            "9223372036854775807",
            "9223372036854775808",
            "18446744073709551616",
            " 1",
            "1.0",
            "0x10",
            "",
        ])
        .prop_map(String::from),
        any::<i64>().prop_map(|n| n.to_string()),
        ".{0,12}",
    ]
}

#[test]
fn arbitrary_resource_versions_never_fail_the_server() {
    let rt = runtime();
    let server = rt.block_on(TestServer::start());
    let admin = server.admin();
    let current: i64 = rt.block_on(async {
        create_namespace(&admin, "props").await;
        let (s, v) = admin
            .post(
                "/api/v1/namespaces/props/serviceaccounts",
                json!({"metadata": {"name": "a"}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    });
    let one = "/api/v1/namespaces/props/serviceaccounts/a";
    let mut runner = runner(CASES);
    let strategy = (
        resource_version(),
        prop::sample::select(vec!["", "Exact", "NotOlderThan"]),
    );
    let result = runner.run(&strategy, |(rv, rv_match)| {
        let enc = encode_query_value(&rv);
        let lists = [
            format!("/api/v1/namespaces/props/serviceaccounts?resourceVersion={enc}&resourceVersionMatch={rv_match}"),
            format!("/api/v1/serviceaccounts?resourceVersion={enc}&limit=1&resourceVersionMatch={rv_match}"),
            format!("{one}?resourceVersion={enc}"),
        ];
        // A read at a revision the server has not reached waits for it, then answers 504
        // `Too large resource version` (as Kubernetes does): valid, but slow, so such
        // revisions go to the writes only.
        let future = rv.trim().parse::<i64>().is_ok_and(|n| n > current);
        let lists = if future { &lists[..0] } else { &lists[..] };
        for uri in lists {
            let r = rt.block_on(admin.request(Method::GET, uri, "", &[]));
            check_answer(uri, &r)?;
        }
        // As a precondition of an update and a delete.
        let body = json!({"metadata": {"name": "a", "resourceVersion": rv}}).to_string();
        let r = rt.block_on(admin.request(
            Method::PUT,
            one,
            &body,
            &[("content-type", "application/json")],
        ));
        check_answer("PUT with a resourceVersion", &r)?;
        let del = json!({"kind": "DeleteOptions", "apiVersion": "v1",
                         "preconditions": {"resourceVersion": rv}, "dryRun": ["All"]})
        .to_string();
        let r = rt.block_on(admin.request(
            Method::DELETE,
            one,
            &del,
            &[("content-type", "application/json")],
        ));
        check_answer("DELETE with a resourceVersion precondition", &r)?;
        Ok(())
    });
    rt.block_on(async move { drop(server) });
    result.unwrap();
}

/// Tokens near and far from a JWT.
fn bearer(issued: String) -> impl Strategy<Value = String> {
    let parts: Vec<String> = issued.split('.').map(str::to_string).collect();
    let issued2 = issued.clone();
    prop_oneof![
        // The issued token with characters changed.
        prop::collection::vec((any::<prop::sample::Index>(), any::<char>()), 1..3).prop_map(
            move |edits| {
                let mut chars: Vec<char> = issued.chars().collect();
                for (i, c) in edits {
                    let at = i.index(chars.len());
                    chars[at] = c;
                }
                chars.into_iter().collect()
            }
        ),
        // Its header, claims or signature replaced by arbitrary JSON or bytes.
        (
            0..3usize,
            prop_oneof![
                Just(json!({"alg": "none"})),
                Just(json!({"alg": "HS256", "typ": "JWT"})),
                Just(json!({"alg": "ES256", "kid": "x"})),
                Just(json!({"iss": "svc", "sub": "system:serviceaccount:props:a", "exp": 1})),
                ".{0,20}".prop_map(Value::from),
            ]
        )
            .prop_map(move |(i, v)| {
                let mut p = parts.clone();
                p[i] = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&v).unwrap());
                p.join(".")
            }),
        // Truncated.
        any::<prop::sample::Index>()
            .prop_map(move |i| issued2[..i.index(issued2.len())].to_string()),
        ".{0,60}",
        "[A-Za-z0-9_-]{0,20}\\.[A-Za-z0-9_-]{0,20}\\.[A-Za-z0-9_-]{0,20}",
    ]
}

#[test]
fn changed_and_arbitrary_bearer_tokens_are_refused() {
    let rt = runtime();
    let server = rt.block_on(TestServer::start());
    let admin = server.admin();
    let anon = server.anonymous();
    let issued = rt.block_on(async {
        create_namespace(&admin, "props").await;
        let (s, v) = admin
            .post(
                "/api/v1/namespaces/props/serviceaccounts",
                json!({"metadata": {"name": "a"}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        let (s, v) = admin
            .post(
                "/api/v1/namespaces/props/serviceaccounts/a/token",
                json!({"apiVersion": "authentication.svc.io/v1", "kind": "TokenRequest", "spec": {}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["status"]["token"].as_str().unwrap().to_string()
    });
    // The issued token itself is a credential (the check below can tell).
    let ok = rt.block_on(anon.request(
        Method::GET,
        "/api/v1",
        "",
        &[("authorization", &format!("Bearer {issued}"))],
    ));
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());

    let mut runner = runner(CASES);
    let result = runner.run(&bearer(issued.clone()), |token| {
        if token == issued {
            return Ok(());
        }
        let review = json!({"apiVersion": "authentication.svc.io/v1", "kind": "TokenReview",
                            "spec": {"token": token}})
        .to_string();
        let r = rt.block_on(admin.request(
            Method::POST,
            "/apis/authentication.svc.io/v1/tokenreviews",
            &review,
            &[("content-type", "application/json")],
        ));
        check_answer("TokenReview", &r)?;
        if r.status == StatusCode::CREATED {
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            prop_assert!(
                v["status"]["authenticated"] != true,
                "a changed token authenticated: {:?}",
                token
            );
        } else {
            // Only an empty token is an invalid review.
            prop_assert!(token.is_empty(), "TokenReview of {:?}: {}", token, r.text());
        }
        // As a credential: 401 (header values carry visible ASCII only).
        if !token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic()) {
            let auth = format!("Bearer {token}");
            let r = rt.block_on(anon.request(
                Method::GET,
                "/api/v1/namespaces",
                "",
                &[("authorization", auth.as_str())],
            ));
            check_answer("bearer", &r)?;
            prop_assert_eq!(
                r.status,
                StatusCode::UNAUTHORIZED,
                "{:?}: {}",
                token,
                r.text()
            );
        }
        Ok(())
    });
    rt.block_on(async move { drop(server) });
    result.unwrap();
}

/// JSON patches that would grow a document without bound: copies of the document into itself
/// (each doubles it) and moves that wrap it one level deeper each. Both are refused with 422
/// and the server goes on serving (before the bounds, the first exhausted memory and the
/// second overflowed a stack, which aborts the process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_patches_that_grow_without_bound_are_refused() {
    let server = TestServer::start().await;
    let admin = server.admin();
    create_namespace(&admin, "props").await;
    let one = "/api/v1/namespaces/props/serviceaccounts/a";
    let (s, v) = admin
        .post(
            "/api/v1/namespaces/props/serviceaccounts",
            json!({"metadata": {"name": "a", "labels": {"x": "y"}, "annotations": {"n": "v"}}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let doubling: Vec<Value> = (0..64)
        .map(|i| json!({"op": "copy", "from": "/metadata", "path": format!("/metadata/annotations/c{i}")}))
        .collect();
    let mut nesting = vec![json!({"op": "add", "path": "/metadata/annotations", "value": {}})];
    for _ in 0..3_000 {
        nesting.push(json!({"op": "add", "path": "/t", "value": {}}));
        nesting.push(json!({"op": "move", "from": "/metadata/annotations", "path": "/t/a"}));
        nesting.push(json!({"op": "move", "from": "/t", "path": "/metadata/annotations"}));
    }
    for (what, ops, message) in [
        (
            "doubling copies",
            doubling,
            "accumulated size increase of copy",
        ),
        ("nesting moves", nesting, "deeper than 128 levels"),
    ] {
        let r = admin
            .request(
                Method::PATCH,
                one,
                &serde_json::to_string(&ops).unwrap(),
                &[("content-type", "application/json-patch+json")],
            )
            .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{what}: {}",
            r.text()
        );
        let v = r.json();
        assert_eq!(v["kind"], "Status", "{what}: {v}");
        assert!(
            v["message"].as_str().unwrap().contains(message),
            "{what}: {v}"
        );
    }
    let (s, v) = admin.get(one).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["metadata"]["labels"], json!({"x": "y"}));
}
