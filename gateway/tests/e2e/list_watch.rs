//! The spec's list and watch rules through a real socket, served from the watch cache:
//! every row of the resourceVersion × resourceVersionMatch × paging table, bookmarks,
//! streaming lists (`sendInitialEvents`), and 410 for history that is gone.

use std::time::Duration;

use crate::support::client::{Client, TestServer, create_namespace, eventually, summary};
use http::StatusCode;
use serde_json::{Value, json};
use svc_gateway::base::features::Feature;

const T: Duration = Duration::from_secs(10);
const SA: &str = "/api/v1/namespaces/lw/serviceaccounts";

async fn setup(c: &Client) {
    create_namespace(c, "lw").await;
}

async fn create(c: &Client, name: &str) -> Value {
    let (s, v) = c.post(SA, json!({"metadata": {"name": name}})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v
}

fn rv(v: &Value) -> i64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The names of a list's items, but for the namespace's `default` account, which the
/// service-account controller created (every list here is of this test's own objects).
fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .filter(|n| n != "default")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_table_rows() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    setup(&c).await;
    let a = create(&c, "a").await;
    let b = create(&c, "b").await;
    let rv_ab = rv(&b);
    let mut a2 = a.clone();
    a2["automountServiceAccountToken"] = json!(false);
    let (_, a2) = c.put(&format!("{SA}/a"), a2).await;
    create(&c, "c").await;

    // rv unset, no limit: Most Recent; a write just acknowledged is visible at once.
    let (s, l) = c.get(SA).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(names(&l), ["a", "b", "c"]);
    assert!(rv(&json!({"metadata": l["metadata"]})) >= rv(&a2));

    // rv=0: Any (served from the cache, whatever its freshness).
    let (s, l) = c.get(&format!("{SA}?resourceVersion=0")).await;
    assert_eq!((s, names(&l).len()), (StatusCode::OK, 3));

    // rv=other, no limit: Not older than (the collection version is at least the requested one).
    let (_, l) = c.get(&format!("{SA}?resourceVersion={rv_ab}")).await;
    assert!(
        l["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap()
            >= rv_ab
    );
    assert_eq!(names(&l), ["a", "b", "c"]);

    // rv=other with a limit: Exact, the state at that revision (c absent, a unmodified).
    let (s, l) = c
        .get(&format!("{SA}?resourceVersion={rv_ab}&limit=10"))
        .await;
    assert_eq!(s, StatusCode::OK, "{l}");
    assert_eq!(l["metadata"]["resourceVersion"], rv_ab.to_string());
    assert_eq!(names(&l), ["a", "b"]);
    assert!(l["items"][0].get("automountServiceAccountToken").is_none());

    // resourceVersionMatch=Exact, with or without a limit.
    for q in ["", "&limit=1"] {
        let (s, l) = c
            .get(&format!(
                "{SA}?resourceVersion={rv_ab}&resourceVersionMatch=Exact{q}"
            ))
            .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(l["metadata"]["resourceVersion"], rv_ab.to_string());
        assert_eq!(names(&l)[0], "a");
    }
    // Exact with limit 1: paging continues at the same revision.
    let (_, p1) = c
        .get(&format!(
            "{SA}?resourceVersion={rv_ab}&resourceVersionMatch=Exact&limit=1"
        ))
        .await;
    // `b` and the namespace's `default` account remain.
    assert_eq!(p1["metadata"]["remainingItemCount"], 2);
    let token = p1["metadata"]["continue"].as_str().unwrap();
    let (_, p2) = c.get(&format!("{SA}?limit=1&continue={token}")).await;
    assert_eq!(
        (names(&p2), p2["metadata"]["resourceVersion"].as_str()),
        (vec!["b".to_string()], Some(rv_ab.to_string().as_str()))
    );
    // Then the controller's `default` account, the last page at the same revision.
    let token = p2["metadata"]["continue"].as_str().unwrap();
    let (_, p3) = c.get(&format!("{SA}?limit=1&continue={token}")).await;
    assert_eq!(p3["items"][0]["metadata"]["name"], "default");
    assert_eq!(p3["metadata"]["resourceVersion"], rv_ab.to_string());
    assert_eq!(p3["metadata"]["continue"], Value::Null);

    // NotOlderThan with rv=0 is Any; with a version it is not older than it.
    let (s, l) = c
        .get(&format!(
            "{SA}?resourceVersion=0&resourceVersionMatch=NotOlderThan&limit=2"
        ))
        .await;
    assert_eq!((s, names(&l).len()), (StatusCode::OK, 2));
    let (_, l) = c
        .get(&format!(
            "{SA}?resourceVersion={rv_ab}&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    assert_eq!(names(&l), ["a", "b", "c"]);

    // rv=0 with a limit and continue: Continuation.
    let (_, p1) = c.get(&format!("{SA}?resourceVersion=0&limit=2")).await;
    let token = p1["metadata"]["continue"].as_str().unwrap();
    let (s, p2) = c
        .get(&format!("{SA}?resourceVersion=0&limit=2&continue={token}"))
        .await;
    assert_eq!((s, names(&p2)), (StatusCode::OK, vec!["c".to_string()]));

    // Invalid rows.
    for q in [
        "resourceVersionMatch=Exact",
        "resourceVersion=0&resourceVersionMatch=Exact",
        "resourceVersionMatch=NotOlderThan&limit=1",
        &format!("resourceVersion={rv_ab}&limit=1&continue={token}"),
    ] {
        assert_eq!(
            c.get(&format!("{SA}?{q}")).await.0,
            StatusCode::BAD_REQUEST,
            "{q}"
        );
    }
    // A version the store has never reached: 504 with the message clients look for.
    let (s, st) = c
        .get(&format!("{SA}?resourceVersion=99999999&limit=1"))
        .await;
    assert_eq!(s, StatusCode::GATEWAY_TIMEOUT);
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("Too large resource version")
    );
    assert_eq!(st["details"]["retryAfterSeconds"], 1);
    assert_eq!(
        st["details"]["causes"][0]["reason"], "ResourceVersionTooLarge",
        "the cause client-go's reflector looks for: {st}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_tokens_expire() {
    let srv = TestServer::start_with(|o| o.continue_token_ttl = Duration::from_secs(3)).await;
    let c = srv.admin();
    setup(&c).await;
    for n in ["a", "b", "c"] {
        create(&c, n).await;
    }
    let (_, p1) = c.get(&format!("{SA}?limit=1")).await;
    let token = p1["metadata"]["continue"].as_str().unwrap().to_string();
    let next = format!("{SA}?limit=1&continue={token}");
    // Fresh, the token serves the next page; once its TTL has passed, 410 Expired.
    let (s, p2) = c.get(&next).await;
    assert_eq!(s, StatusCode::OK, "{p2}");
    assert_eq!(names(&p2), ["b"]);
    eventually(
        Duration::from_secs(10),
        "the continue token expires",
        || async {
            let (s, st) = c.get(&next).await;
            if s == StatusCode::OK {
                return false;
            }
            assert_eq!(
                (s, st["reason"].as_str()),
                (StatusCode::GONE, Some("Expired")),
                "{st}"
            );
            true
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_carry_only_the_version() {
    let srv =
        TestServer::start_with(|o| o.watch_bookmark_interval = Duration::from_millis(500)).await;
    let c = srv.admin();
    setup(&c).await;
    let a = create(&c, "a").await;
    let mut w = c
        .watch(&format!(
            "{SA}?watch=1&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds=3",
            rv(&a)
        ))
        .await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(ev["type"], "BOOKMARK", "{ev}");
    let obj = ev["object"].as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["apiVersion", "kind", "metadata"]);
    assert_eq!(ev["object"]["kind"], "ServiceAccount");
    assert_eq!(ev["object"]["metadata"].as_object().unwrap().len(), 1);
    assert!(rv(&ev["object"]) >= rv(&a));
    // Events still flow between bookmarks, and a last bookmark precedes the timeout.
    let b = create(&c, "b").await;
    let mut last = None;
    while let Some(ev) = w.next_within(T).await {
        last = Some(ev);
    }
    let last = last.unwrap();
    assert_eq!(last["type"], "BOOKMARK");
    assert!(rv(&last["object"]) >= rv(&b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_with_send_initial_events() {
    // Streaming lists are beta and off by default (gate WatchList).
    let off = TestServer::start().await;
    let r = off
        .admin()
        .request(http::Method::GET, "/api/v1/namespaces/default/serviceaccounts?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", "", &[])
        .await;
    // Refused as kube-apiserver refuses it: 422 Invalid ListOptions, the field named.
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    let status = r.json();
    assert_eq!(status["reason"], "Invalid", "{status}");
    assert_eq!(status["details"]["kind"], "ListOptions", "{status}");
    assert_eq!(
        status["details"]["causes"][0]["field"], "sendInitialEvents",
        "{status}"
    );
    assert!(r.text().contains("WatchList"));
    let srv = TestServer::start_with(|o| o.feature_gates.set(Feature::WatchList, true)).await;
    let c = srv.admin();
    setup(&c).await;
    for n in ["a", "b"] {
        create(&c, n).await;
    }
    // sendInitialEvents needs resourceVersionMatch=NotOlderThan.
    let r = c
        .request(
            http::Method::GET,
            &format!("{SA}?watch=1&sendInitialEvents=true"),
            "",
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    let mut w = c
        .watch(&format!("{SA}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"))
        .await;
    // The initial events (in key order) hold the namespace's `default` account too, the
    // controller's; then the bookmark that ends them.
    let mut initial = Vec::new();
    let bm = loop {
        let ev = w.next_within(T).await.unwrap();
        if ev["type"] == "BOOKMARK" {
            break ev;
        }
        let e = summary(&ev);
        assert_eq!(e.0, "ADDED", "{e:?}");
        initial.push(e.1);
    };
    assert_eq!(initial, ["a", "b", "default"]);
    assert_eq!(
        bm["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    create(&c, "c").await;
    let live = summary(&w.next_within(T).await.unwrap());
    assert_eq!((live.0.as_str(), live.1.as_str()), ("ADDED", "c"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_from_history_that_is_gone_gives_410() {
    let srv = TestServer::start_with(|o| o.watch_cache_history_max_events = 5).await;
    let c = srv.admin();
    setup(&c).await;
    let first = create(&c, "first").await;
    for i in 0..20 {
        create(&c, &format!("n{i}")).await;
    }
    let mut w = c
        .watch(&format!("{SA}?watch=1&resourceVersion={}", rv(&first)))
        .await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(ev["type"], "ERROR", "{ev}");
    assert_eq!(ev["object"]["kind"], "Status");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
    assert!(
        w.next_within(T).await.is_none(),
        "the stream must end after the ERROR event"
    );
    // A version still inside the ring works: it replays what came after it.
    let last = create(&c, "last").await;
    let mut ok = c
        .watch(&format!("{SA}?watch=1&resourceVersion={}", rv(&last) - 1))
        .await;
    let ev = ok.next_within(T).await.unwrap();
    assert_eq!(summary(&ev).0, "ADDED", "{ev}");
    assert_eq!(ev["object"]["metadata"]["name"], "last");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_lists_fall_back_to_the_store_then_expire() {
    let srv = TestServer::start_with(|o| {
        o.list_snapshot_window = Duration::from_millis(200);
        // Far longer than the first phase takes even on a loaded machine.
        o.storage_history_retention = Duration::from_secs(6);
    })
    .await;
    let c = srv.admin();
    setup(&c).await;
    let a = create(&c, "a").await;
    let old = rv(&a);
    for i in 0..3 {
        create(&c, &format!("later{i}")).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Past the cache's snapshot window but inside the store's history: still exact.
    let (s, l) = c
        .get(&format!(
            "{SA}?resourceVersion={old}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(s, StatusCode::OK, "{l}");
    assert_eq!(l["metadata"]["resourceVersion"], old.to_string());
    assert_eq!(names(&l), ["a"]);
    // Once the store has compacted that revision too: 410.
    let mut gone = false;
    for _ in 0..150 {
        let (s, st) = c
            .get(&format!(
                "{SA}?resourceVersion={old}&resourceVersionMatch=Exact"
            ))
            .await;
        if s == StatusCode::GONE {
            assert_eq!(st["reason"], "Expired");
            gone = true;
            break;
        }
        // Keep writing: compaction trims history older than the retention behind the head.
        create(&c, &format!("tick{}", rand_suffix())).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        gone,
        "an Exact list older than every kept revision never returned 410"
    );
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Store range reads of service accounts so far (`etcd_requests_total`).
async fn store_lists(c: &Client) -> f64 {
    let text = c
        .request(http::Method::GET, "/metrics", "", &[])
        .await
        .text();
    let sample = "etcd_requests_total{operation=\"list\",group=\"\",resource=\"serviceaccounts\"} ";
    text.lines()
        .find_map(|l| l.strip_prefix(sample))
        .map_or(0.0, |v| v.parse().unwrap())
}

/// `ListFromCacheSnapshot` decides where Exact lists and continue tokens are read: with it, a
/// revision the store has already compacted is still served from the cache's snapshot; without
/// it, the same requests read the store's history, so they get 410 once it is compacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_from_cache_snapshot_gate_decides_where_past_revisions_are_read() {
    for snapshots in [true, false] {
        let srv = TestServer::start_with(|o| {
            o.feature_gates
                .set(Feature::ListFromCacheSnapshot, snapshots);
            // Compaction soon after the writes; the cache's 75 s window outlives it.
            o.storage_history_retention = Duration::from_millis(500);
        })
        .await;
        let c = srv.admin();
        setup(&c).await;
        create(&c, "a").await;
        let old = rv(&create(&c, "b").await);
        // An Exact list at the newest revision: from the cache's current state with the gate,
        // from the store without it.
        let lists_before = store_lists(&c).await;
        let (s, exact) = c
            .get(&format!(
                "{SA}?resourceVersion={old}&resourceVersionMatch=Exact"
            ))
            .await;
        assert_eq!(s, StatusCode::OK, "{exact}");
        assert_eq!(names(&exact), ["a", "b"]);
        let store_reads = store_lists(&c).await - lists_before;
        assert_eq!(store_reads > 0.0, !snapshots, "{store_reads} store lists");

        let (s, first) = c.get(&format!("{SA}?limit=1")).await;
        assert_eq!(s, StatusCode::OK, "{first}");
        assert_eq!(names(&first), ["a"]);
        let token = first["metadata"]["continue"].as_str().unwrap().to_string();
        let pinned: i64 = first["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();

        // Write until the store has compacted both revisions away.
        let store = srv.own().registry.store.clone();
        let key = bytes::Bytes::from_static(b"/registry/serviceaccounts/lw/a");
        let mut compacted = false;
        for i in 0..200 {
            if matches!(
                store.get(key.clone(), Some(old.max(pinned))).await,
                Err(svc_storage::StoreError::Compacted { .. })
            ) {
                compacted = true;
                break;
            }
            create(&c, &format!("tick{i}")).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(compacted, "the store never compacted revision {old}");

        let (s, exact) = c
            .get(&format!(
                "{SA}?resourceVersion={old}&resourceVersionMatch=Exact"
            ))
            .await;
        let (s2, next) = c.get(&format!("{SA}?limit=1&continue={token}")).await;
        if snapshots {
            assert_eq!(s, StatusCode::OK, "{exact}");
            assert_eq!(names(&exact), ["a", "b"]);
            assert_eq!(exact["metadata"]["resourceVersion"], old.to_string());
            assert_eq!(s2, StatusCode::OK, "{next}");
            assert_eq!(names(&next), ["b"]);
            assert_eq!(next["metadata"]["resourceVersion"], pinned.to_string());
        } else {
            assert_eq!(
                s,
                StatusCode::GONE,
                "Exact list not read from the store: {exact}"
            );
            assert_eq!(exact["reason"], "Expired");
            assert_eq!(
                s2,
                StatusCode::GONE,
                "continue not read from the store: {next}"
            );
            assert_eq!(next["reason"], "Expired");
            // The cache kept no snapshots at all.
            let stats = srv
                .own()
                .registry
                .caches
                .get(<svc_core::kinds::ServiceAccount as svc_core::Resource>::INFO)
                .stats();
            assert_eq!(stats.snapshots, 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_watch_timeout_neither_panics_nor_leaks_the_watcher_gauge() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    setup(&c).await;
    let open = |text: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("apiserver_registered_watchers{")
                    && l.contains("kind=\"ServiceAccount\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    {
        let mut w = c
            .watch(&format!("{SA}?watch=1&timeoutSeconds=9223372036854775807"))
            .await;
        create(&c, "late").await;
        let ev = loop {
            let ev = w.next_within(T).await.unwrap();
            if ev["object"]["metadata"]["name"] == "late" {
                break ev;
            }
        };
        assert_eq!(ev["type"], "ADDED");
        let text = c
            .request(http::Method::GET, "/metrics", "", &[])
            .await
            .text();
        assert_eq!(open(&text), 1.0, "{text}");
    }
    // The stream is dropped: the gauge goes back down.
    eventually(T, "the watcher gauge returns to 0", || async {
        open(
            &c.request(http::Method::GET, "/metrics", "", &[])
                .await
                .text(),
        ) == 0.0
    })
    .await;
    let (s, _) = c.get(&format!("{SA}?watch=1&timeoutSeconds=-1")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

/// Whole lists at one revision share one body while a response holds it: lists that run
/// beside writes, in JSON and protobuf, of one namespace and of all, each hold exactly the
/// objects written up to their own resourceVersion, and two JSON lists at one revision and
/// scope are the same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_lists_at_one_revision_are_the_same_bytes_and_never_stale() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    setup(&c).await;
    create_namespace(&c, "lw2").await;
    let mut written: Vec<(i64, String)> = Vec::new();
    let mut seen: std::collections::HashMap<(String, &str, i64), bytes::Bytes> =
        std::collections::HashMap::new();
    for round in 0..6 {
        let v = create(&c, &format!("sa-{round}")).await;
        written.push((rv(&v), format!("sa-{round}")));
        let paths = [
            SA,
            "/api/v1/serviceaccounts",
            "/api/v1/namespaces/lw2/serviceaccounts",
        ];
        let lists = paths.iter().flat_map(|p| {
            ["application/json", "application/vnd.kubernetes.protobuf"]
                .into_iter()
                .map(move |accept| (*p, accept))
        });
        let c = &c;
        let mut asks = Vec::new();
        for (p, accept) in lists {
            for _ in 0..3 {
                asks.push(async move {
                    let r = c
                        .request(http::Method::GET, p, "", &[("accept", accept)])
                        .await;
                    (p, accept, r)
                });
            }
        }
        let answers = futures::future::join_all(asks).await;
        for (p, accept, r) in answers {
            assert_eq!(r.status, StatusCode::OK, "{p} {accept}");
            // The revision, and (JSON) every object written up to it in lw, none after.
            let at = if accept == "application/json" {
                let list: Value = serde_json::from_slice(&r.body).unwrap();
                let at: i64 = list["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                let got: Vec<String> = list["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|i| i["metadata"]["namespace"] == "lw")
                    .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
                    .filter(|n| n.starts_with("sa-"))
                    .collect();
                let want: Vec<String> = written
                    .iter()
                    .filter(|(w, _)| *w <= at)
                    .map(|(_, n)| n.clone())
                    .collect();
                if p.contains("lw2") {
                    assert!(got.is_empty(), "{p}: {got:?}");
                } else {
                    assert_eq!(got, want, "{p} at {at}");
                }
                at
            } else {
                assert!(r.body.starts_with(b"k8s\0"), "{p}: not protobuf");
                // A consistent list holds the write made before it was asked for.
                let newest = format!("sa-{round}");
                let holds = r.body.windows(newest.len()).any(|w| w == newest.as_bytes());
                assert_eq!(
                    holds,
                    !p.contains("lw2"),
                    "{p}: {newest} in the protobuf list"
                );
                continue;
            };
            let key = (p.to_string(), accept, at);
            if let Some(before) = seen.get(&key) {
                assert_eq!(before, &r.body, "{p} {accept} at {at}: two bodies");
            }
            seen.insert(key, r.body);
        }
    }
}
