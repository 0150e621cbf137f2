//! Audit logging through TLS: a policy of several rules and a blocking log backend, so each
//! request's lines are in the file when its response arrives; what each level records
//! (requestObject and responseObject exactly when they should be there), a watch audited as
//! one request, a denial's annotations, a non-resource request, the Audit-ID header,
//! rotation of the log file by size; and the webhook backend against a local HTTP receiver:
//! EventList batches, then a receiver that stalls, whose drops are counted while requests go
//! on unslowed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::client::{Client, Resp, TestServer, eventually};

const T: Duration = Duration::from_secs(10);

const POLICY: &str = r#"
apiVersion: audit.svc.io/v1
kind: Policy
rules:
- level: None
  nonResourceURLs: ["/readyz*", "/livez*", "/healthz*"]
- level: RequestResponse
  namespaces: ["rr"]
- level: RequestResponse
  namespaces: ["lean"]
  omitManagedFields: true
- level: Request
  namespaces: ["req"]
  omitManagedFields: true
- level: Metadata
  namespaces: ["meta"]
- level: Metadata
  nonResourceURLs: ["/version"]
- level: Metadata
  resources:
  - group: ""
    resources: ["namespaces"]
"#;

struct Audited {
    server: TestServer,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

async fn start(extra: impl FnOnce(&mut svc_gateway::base::flags::Options, &Path)) -> Audited {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let log = dir.path().join("logs").join("audit.log");
    let (p, l) = (policy.clone(), log.clone());
    let root = dir.path().to_path_buf();
    let server = TestServer::start_with(move |o| {
        o.audit.audit_policy_file = Some(p);
        o.audit.audit_log_path = Some(l);
        extra(o, &root);
    })
    .await;
    Audited {
        server,
        log,
        _dir: dir,
    }
}

/// Every event in the log file(s) given.
fn events_in(files: &[PathBuf]) -> Vec<Value> {
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).expect("each line is one JSON event"))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn with_id<'a>(events: &'a [Value], id: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["auditID"] == id).collect()
}

fn stages(events: &[&Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["stage"].as_str().unwrap().to_string())
        .collect()
}

fn audit_id(r: &Resp) -> String {
    r.headers
        .get("audit-id")
        .expect("every response carries Audit-ID")
        .to_str()
        .unwrap()
        .to_string()
}

async fn post(c: &Client, path: &str, body: &Value) -> Resp {
    c.request(
        Method::POST,
        path,
        &body.to_string(),
        &[
            ("content-type", "application/json"),
            ("user-agent", "audit-e2e/1.0"),
            ("x-forwarded-for", "203.0.113.7"),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_level_records_what_it_should_and_a_watch_is_one_request() {
    let a = start(|_, _| {}).await;
    let admin = a.server.admin();
    for ns in ["meta", "req", "rr", "quiet"] {
        crate::support::client::create_namespace(&admin, ns).await;
    }

    // Creates at Metadata, Request and RequestResponse; none in "quiet" (no rule).
    let mut ids = Vec::new();
    for ns in ["meta", "req", "rr", "quiet"] {
        let body = json!({"metadata": {"name": "robot", "labels": {"from": ns}}});
        let r = post(
            &admin,
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            &body,
        )
        .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        ids.push(audit_id(&r));
    }
    // omitManagedFields drops metadata.managedFields from the objects recorded.
    crate::support::client::create_namespace(&admin, "lean").await;
    let body = json!({"metadata": {"name": "robot"}});
    let r = post(&admin, "/api/v1/namespaces/lean/serviceaccounts", &body).await;
    assert_eq!(r.status, StatusCode::CREATED);
    let events = events_in(std::slice::from_ref(&a.log));
    let lean = with_id(&events, &audit_id(&r));
    assert_eq!(lean[1]["responseObject"]["metadata"]["name"], "robot");
    assert!(
        lean[1]["responseObject"]["metadata"]
            .get("managedFields")
            .is_none()
    );
    let rr = with_id(&events, &ids[2]);
    assert!(rr[1]["responseObject"]["metadata"]["managedFields"].is_array());

    for (ns, id) in ["meta", "req", "rr"].iter().zip(&ids) {
        let evs = with_id(&events, id);
        assert_eq!(
            stages(&evs),
            ["RequestReceived", "ResponseComplete"],
            "{ns}"
        );
        let done = evs[1];
        let level = done["level"].as_str().unwrap();
        assert_eq!(
            level,
            match *ns {
                "meta" => "Metadata",
                "req" => "Request",
                _ => "RequestResponse",
            }
        );
        assert_eq!(done["verb"], "create");
        assert_eq!(
            done["requestURI"],
            format!("/api/v1/namespaces/{ns}/serviceaccounts")
        );
        assert_eq!(done["user"]["username"], "admin");
        assert_eq!(done["userAgent"], "audit-e2e/1.0");
        assert_eq!(done["sourceIPs"], json!(["203.0.113.7", "127.0.0.1"]));
        assert_eq!(
            done["objectRef"],
            json!({"resource": "serviceaccounts", "namespace": ns, "name": "robot", "apiVersion": "v1"})
        );
        assert_eq!(done["responseStatus"]["code"], 201);
        assert_eq!(
            done["annotations"]["authorization.svc.io/decision"],
            "allow"
        );
        assert!(
            done["requestReceivedTimestamp"]
                .as_str()
                .unwrap()
                .ends_with('Z')
        );
        assert_eq!(
            done["stageTimestamp"].as_str().unwrap().len(),
            27,
            "microseconds"
        );
        // The request as sent: at Request level and up, never in RequestReceived.
        assert!(evs[0].get("requestObject").is_none());
        let has_request = done.get("requestObject").is_some();
        assert_eq!(has_request, *ns != "meta", "{ns}");
        if has_request {
            assert_eq!(done["requestObject"]["metadata"]["labels"]["from"], *ns);
            assert!(
                done["requestObject"].get("kind").is_none(),
                "as sent, not defaulted"
            );
        }
        let has_response = done.get("responseObject").is_some();
        assert_eq!(has_response, *ns == "rr", "{ns}");
        if has_response {
            assert_eq!(done["responseObject"]["kind"], "ServiceAccount");
            assert!(done["responseObject"]["metadata"]["uid"].is_string());
        }
    }
    assert!(
        with_id(&events, &ids[3]).is_empty(),
        "no rule matches: level None"
    );

    // get and list; a client's own Audit-ID is used and returned.
    let r = admin
        .request(
            Method::GET,
            "/api/v1/namespaces/meta/serviceaccounts/robot",
            "",
            &[("audit-id", "client-chosen-id")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(audit_id(&r), "client-chosen-id");
    let r2 = admin
        .request(
            Method::GET,
            "/api/v1/namespaces/meta/serviceaccounts",
            "",
            &[],
        )
        .await;
    let events = events_in(std::slice::from_ref(&a.log));
    let get = with_id(&events, "client-chosen-id");
    assert_eq!(stages(&get), ["RequestReceived", "ResponseComplete"]);
    assert_eq!(get[1]["verb"], "get");
    assert_eq!(get[1]["objectRef"]["name"], "robot");
    assert!(get[1].get("responseObject").is_none(), "Metadata level");
    let list = with_id(&events, &audit_id(&r2));
    assert_eq!(list[1]["verb"], "list");
    assert!(
        list[1].get("objectRef").is_none(),
        "lists have no objectRef"
    );

    // A denied request: 403, the decision and the Status in the event.
    let eve = a.server.user("eve", &["staff"]);
    let r = eve
        .request(
            Method::GET,
            "/api/v1/namespaces/meta/serviceaccounts",
            "",
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let events = events_in(std::slice::from_ref(&a.log));
    let denied = with_id(&events, &audit_id(&r));
    assert_eq!(stages(&denied), ["RequestReceived", "ResponseComplete"]);
    let done = denied[1];
    assert_eq!(done["user"]["username"], "eve");
    assert_eq!(
        done["annotations"]["authorization.svc.io/decision"],
        "forbid"
    );
    assert!(
        done["annotations"]
            .get("authorization.svc.io/reason")
            .is_some()
    );
    assert_eq!(done["responseStatus"]["code"], 403);
    assert_eq!(done["responseStatus"]["reason"], "Forbidden");
    assert!(
        done["responseStatus"]["message"]
            .as_str()
            .unwrap()
            .contains("User \"eve\" cannot list")
    );

    // A request that fails authentication: one ResponseStarted event with its 401.
    let r = a
        .server
        .anonymous()
        .request(Method::GET, "/api/v1/namespaces", "", &[])
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let events = events_in(std::slice::from_ref(&a.log));
    let failed = with_id(&events, &audit_id(&r));
    assert_eq!(stages(&failed), ["ResponseStarted"]);
    assert_eq!(failed[0]["responseStatus"]["code"], 401);
    assert_eq!(failed[0]["user"], json!({}));

    // A non-resource request: the lower-cased method, no objectRef; health checks: None.
    let r = admin.request(Method::GET, "/version", "", &[]).await;
    let r2 = admin.request(Method::GET, "/readyz", "", &[]).await;
    let events = events_in(std::slice::from_ref(&a.log));
    let version = with_id(&events, &audit_id(&r));
    assert_eq!(version[1]["verb"], "get");
    assert_eq!(version[1]["level"], "Metadata");
    assert!(version[1].get("objectRef").is_none());
    assert!(with_id(&events, &audit_id(&r2)).is_empty());

    // A watch: RequestReceived and ResponseStarted while it is open, whatever it sends;
    // ResponseComplete when it ends.
    let watch_uri = "/api/v1/namespaces/meta/serviceaccounts?watch=true&labelSelector=w%3D1";
    let mut w = admin.watch(watch_uri).await;
    let body = json!({"metadata": {"name": "watched", "labels": {"w": "1"}}});
    let r = post(&admin, "/api/v1/namespaces/meta/serviceaccounts", &body).await;
    assert_eq!(r.status, StatusCode::CREATED);
    let ev = w.next_within(T).await.expect("an event");
    assert_eq!(ev["type"], "ADDED");
    let of_watch = |events: &[Value]| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["requestURI"] == watch_uri)
            .map(|e| e["stage"].as_str().unwrap().to_string())
            .collect()
    };
    let events = events_in(std::slice::from_ref(&a.log));
    assert_eq!(of_watch(&events), ["RequestReceived", "ResponseStarted"]);
    let started = events
        .iter()
        .find(|e| e["requestURI"] == watch_uri && e["stage"] == "ResponseStarted")
        .unwrap();
    assert_eq!(started["verb"], "watch");
    assert_eq!(started["responseStatus"]["code"], 200);
    assert!(started.get("objectRef").is_none());
    drop(w);
    let log = a.log.clone();
    eventually(T, "the watch's ResponseComplete is written", || {
        let log = log.clone();
        async move {
            of_watch(&events_in(&[log]))
                == ["RequestReceived", "ResponseStarted", "ResponseComplete"]
        }
    })
    .await;

    let metrics = admin.request(Method::GET, "/metrics", "", &[]).await.text();
    let sample = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    assert!(sample("apiserver_audit_event_total") >= 20.0);
    assert!(sample("apiserver_audit_level_total{level=\"Metadata\"}") >= 5.0);
    assert!(sample("apiserver_audit_level_total{level=\"None\"}") >= 2.0);
}

/// kube-apiserver records request and response objects as JSON whatever the wire format, and
/// takes a created object's name from it: so does the gateway for protobuf (kubectl's
/// default for the core group), and a protobuf error keeps its message in the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_requests_are_recorded_as_json() {
    use svc_core::Resource;
    use svc_core::codec;
    use svc_core::kinds::ServiceAccount;

    let a = start(|_, _| {}).await;
    let admin = a.server.admin();
    crate::support::client::create_namespace(&admin, "rr").await;
    let pb = "application/vnd.kubernetes.protobuf";
    let mut sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "from-pb", "labels": {"a": "b"}}}))
            .unwrap();
    sa.set_type_meta();
    let r = admin
        .send(Client::build(
            Method::POST,
            "/api/v1/namespaces/rr/serviceaccounts",
            codec::encode_protobuf(&sa),
            &[("content-type", pb), ("accept", pb)],
        ))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let created_id = audit_id(&r);
    let r = admin
        .request(
            Method::GET,
            "/api/v1/namespaces/rr/serviceaccounts/missing",
            "",
            &[("accept", pb)],
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        r.headers["content-type"], pb,
        "the error is in protobuf too"
    );
    let missing_id = audit_id(&r);

    let events = events_in(std::slice::from_ref(&a.log));
    let created = with_id(&events, &created_id);
    let done = created[1];
    assert_eq!(done["objectRef"]["name"], "from-pb", "{done}");
    assert_eq!(
        done["requestObject"]["metadata"]["name"], "from-pb",
        "{done}"
    );
    assert_eq!(
        done["requestObject"]["metadata"]["labels"]["a"], "b",
        "{done}"
    );
    assert_eq!(done["responseObject"]["kind"], "ServiceAccount", "{done}");
    assert!(
        !done["responseObject"]["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{done}"
    );
    let missing = with_id(&events, &missing_id);
    let status = &missing[1]["responseStatus"];
    assert_eq!(status["code"], 404, "{status}");
    assert_eq!(status["reason"], "NotFound", "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap_or_default()
            .contains("missing"),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_rotates_by_size_and_keeps_max_backup_files() {
    let a = start(|o, _| {
        o.audit.audit_log_maxsize = 1;
        o.audit.audit_log_maxbackup = 1;
    })
    .await;
    let admin = a.server.admin();
    crate::support::client::create_namespace(&admin, "rr").await;
    // Each create is logged with its request and response: ~600 KB a request.
    let big = "x".repeat(200_000);
    for i in 0..5 {
        let body = json!({"metadata": {"name": format!("big-{i}"), "annotations": {"a": big}}});
        let r = post(&admin, "/api/v1/namespaces/rr/serviceaccounts", &body).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    }
    let dir = a.log.parent().unwrap();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "the log and one backup: {names:?}");
    assert_eq!(names[1], "audit.log");
    let backup = &names[0];
    // audit-2026-11-23T17-00-00.000.log
    assert!(
        backup.starts_with("audit-") && backup.ends_with(".log"),
        "{backup}"
    );
    let stamp = &backup["audit-".len()..backup.len() - ".log".len()];
    assert_eq!(stamp.len(), 23, "{stamp}");
    assert_eq!(&stamp[10..11], "T");
    assert_eq!(&stamp[13..14], "-");
    assert_eq!(&stamp[19..20], ".");
    for name in &names {
        let len = std::fs::metadata(dir.join(name)).unwrap().len();
        assert!(len <= 1024 * 1024, "{name}: {len} bytes");
    }
    // Whole lines only, in both files.
    let files: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
    assert!(!events_in(&files).is_empty());
}

/// `blocking-strict` refuses a request whose `RequestReceived` event cannot be written;
/// `blocking` serves it and counts the error. `/dev/full` refuses every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_strict_fails_requests_it_cannot_audit() {
    for (mode, want) in [
        (
            svc_gateway::base::flags::AuditMode::BlockingStrict,
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        (
            svc_gateway::base::flags::AuditMode::Blocking,
            StatusCode::OK,
        ),
    ] {
        let a = start(|o, _| {
            o.audit.audit_log_path = Some(PathBuf::from("/dev/full"));
            o.audit.audit_log_mode = mode;
        })
        .await;
        let admin = a.server.admin();
        let r = admin.request(Method::GET, "/version", "", &[]).await;
        assert_eq!(r.status, want, "{mode:?}: {}", r.text());
        // Health checks are at level None: served either way.
        assert_eq!(admin.get("/readyz").await.0, StatusCode::OK);
        let metrics = admin.request(Method::GET, "/metrics", "", &[]).await.text();
        assert!(
            metrics.lines().any(
                |l| l.starts_with("apiserver_audit_error_total{plugin=\"log\"} ")
                    && !l.ends_with(" 0")
            ),
            "{mode:?}: errors counted"
        );
    }
}

/// Batch mode: the request does not wait for the log; its events arrive shortly after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_writes_the_log_from_its_buffer() {
    let a = start(|o, _| {
        o.audit.audit_log_mode = svc_gateway::base::flags::AuditMode::Batch;
        o.audit.audit_log_batch_max_size = 10;
        o.audit.audit_log_batch_max_wait = Duration::from_millis(50);
    })
    .await;
    let r = a
        .server
        .admin()
        .request(Method::GET, "/version", "", &[])
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let id = audit_id(&r);
    let log = a.log.clone();
    eventually(T, "both events are in the log", || {
        let (log, id) = (log.clone(), id.clone());
        async move {
            stages(&with_id(&events_in(&[log]), &id)) == ["RequestReceived", "ResponseComplete"]
        }
    })
    .await;
}

/// A local HTTP receiver of audit webhooks: keeps each EventList it is sent; while `stall` is
/// set it reads a request and never answers.
struct Receiver {
    addr: SocketAddr,
    lists: Arc<parking_lot::Mutex<Vec<Value>>>,
    stall: Arc<AtomicBool>,
    stalled: Arc<AtomicUsize>,
}

async fn receiver() -> Receiver {
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let r = Receiver {
        addr: listener.local_addr().unwrap(),
        lists: Default::default(),
        stall: Default::default(),
        stalled: Default::default(),
    };
    let (lists, stall, stalled) = (r.lists.clone(), r.stall.clone(), r.stalled.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (lists, stall, stalled) = (lists.clone(), stall.clone(), stalled.clone());
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (lists, stall, stalled) =
                            (lists.clone(), stall.clone(), stalled.clone());
                        async move {
                            assert_eq!(req.method(), Method::POST);
                            assert_eq!(req.uri().path(), "/audit");
                            assert_eq!(req.headers()["content-type"], "application/json");
                            let body = req.into_body().collect().await?.to_bytes();
                            if stall.load(Ordering::SeqCst) {
                                stalled.fetch_add(1, Ordering::SeqCst);
                                std::future::pending::<()>().await;
                            }
                            lists
                                .lock()
                                .push(serde_json::from_slice(&body).expect("an EventList"));
                            Ok::<_, hyper::Error>(http::Response::new(http_body_util::Full::new(
                                bytes::Bytes::new(),
                            )))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    r
}

/// A kubeconfig naming the receiver.
fn webhook_kubeconfig(dir: &Path, addr: SocketAddr) -> PathBuf {
    let path = dir.join("audit-webhook.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: audit\n  cluster:\n    \
             server: http://{addr}/audit\nusers:\n- name: gw\n  user:\n    token: t\n\
             contexts:\n- name: c\n  context:\n    cluster: audit\n    user: gw\n\
             current-context: c\n"
        ),
    )
    .unwrap();
    path
}

fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_gets_event_list_batches_and_a_stalled_one_costs_drops_not_time() {
    let rx = receiver().await;
    let addr = rx.addr;
    let a = start(move |o, dir| {
        o.audit.audit_log_path = None;
        o.audit.audit_webhook_config_file = Some(webhook_kubeconfig(dir, addr));
        // Batch mode (the default) with a small buffer and a short wait.
        o.audit.audit_webhook_batch_buffer_size = 20;
        o.audit.audit_webhook_batch_max_size = 50;
        o.audit.audit_webhook_batch_max_wait = Duration::from_millis(100);
    })
    .await;
    let admin = a.server.admin();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let r = admin.request(Method::GET, "/version", "", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        ids.push(audit_id(&r));
    }
    let lists = rx.lists.clone();
    let want = ids.clone();
    eventually(
        T,
        "the receiver has every stage of the three requests",
        || {
            let (lists, want) = (lists.clone(), want.clone());
            async move {
                let items: Vec<Value> = lists
                    .lock()
                    .iter()
                    .flat_map(|l| l["items"].as_array().cloned().unwrap_or_default())
                    .collect();
                want.iter().all(|id| {
                    stages(&with_id(&items, id)) == ["RequestReceived", "ResponseComplete"]
                })
            }
        },
    )
    .await;
    {
        let lists = rx.lists.lock();
        for list in lists.iter() {
            assert_eq!(list["kind"], "EventList");
            assert_eq!(list["apiVersion"], "audit.svc.io/v1");
            assert!(list["items"].as_array().unwrap().len() <= 50);
        }
        assert!(lists.len() < 6, "events are batched: {} lists", lists.len());
    }

    // The receiver stalls: the sending task waits on one batch, the buffer of 20 fills, and
    // further events are dropped and counted, while requests are served as before.
    rx.stall.store(true, Ordering::SeqCst);
    let r = admin.request(Method::GET, "/version", "", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let stalled = rx.stalled.clone();
    eventually(T, "a batch is stuck in the receiver", || {
        let stalled = stalled.clone();
        async move { stalled.load(Ordering::SeqCst) > 0 }
    })
    .await;
    let start = Instant::now();
    for _ in 0..40 {
        let r = admin.request(Method::GET, "/version", "", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    // 80 events for a buffer of 20: blocking on the receiver would take 30 s per call.
    assert!(
        start.elapsed() < Duration::from_secs(25),
        "requests waited on the stalled webhook: {:?}",
        start.elapsed()
    );
    let metrics = admin.request(Method::GET, "/metrics", "", &[]).await.text();
    let dropped = counter(&metrics, "apiserver_audit_error_total{plugin=\"webhook\"}");
    assert!(dropped >= 60.0, "dropped events counted: {dropped}");
    assert_eq!(rx.stalled.load(Ordering::SeqCst), 1, "one batch at a time");
}

/// An EventRateLimit refusal is annotated on the request's audit event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_refusal_is_annotated() {
    let a = start(|o, dir| {
        std::fs::write(
            dir.join("limits.yaml"),
            "apiVersion: eventratelimit.admission.svc.io/v1alpha1\nkind: Configuration\n\
             limits:\n- type: Namespace\n  qps: 1\n  burst: 1\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("admission.yaml"),
            "apiVersion: apiserver.svc.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
             - name: EventRateLimit\n  path: limits.yaml\n",
        )
        .unwrap();
        o.enable_admission_plugins = vec!["EventRateLimit".into()];
        o.admission_control_config_file = Some(dir.join("admission.yaml"));
    })
    .await;
    let admin = a.server.admin();
    crate::support::client::create_namespace(&admin, "meta").await;
    let mut refused = None;
    for i in 0..20 {
        let event = json!({
            "apiVersion": "events.svc.io/v1", "kind": "Event",
            "metadata": {"name": format!("e{i}")},
            "eventTime": "2024-05-06T07:08:09.123456Z",
            "reportingController": "svc.io/test", "reportingInstance": "test-1",
            "action": "Testing", "reason": "Tested", "type": "Normal",
            "regarding": {"kind": "ServiceAccount", "namespace": "meta", "name": "x", "apiVersion": "v1"},
        });
        let r = post(
            &admin,
            "/apis/events.svc.io/v1/namespaces/meta/events",
            &event,
        )
        .await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(audit_id(&r));
            break;
        }
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    }
    let id = refused.expect("a create past the burst is refused");
    let events = events_in(std::slice::from_ref(&a.log));
    let evs = with_id(&events, &id);
    assert_eq!(stages(&evs), ["RequestReceived", "ResponseComplete"]);
    assert_eq!(
        evs[1]["annotations"]["apiserver.svc.io/rejected-by"],
        "EventRateLimit"
    );
    assert_eq!(evs[1]["responseStatus"]["code"], 429);
    assert_eq!(evs[1]["responseStatus"]["reason"], "TooManyRequests");
    assert_eq!(evs[1]["objectRef"]["resource"], "events");
    assert_eq!(evs[1]["objectRef"]["apiGroup"], "events.svc.io");
}
