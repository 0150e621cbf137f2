//! Crash safety of the whole server: concurrent writers commit through HTTPS, the server
//! process is killed with SIGKILL at a random moment and restarted; every acknowledged write
//! is there, nothing that was never attempted is, and revisions continue upward.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::support::client::Client;
use crate::support::process::{ServerProcess, admin_client, free_port};
use http::StatusCode;
use parking_lot::Mutex;
use rand::Rng;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut acked: BTreeMap<String, i64> = BTreeMap::new();
    let mut attempted: BTreeSet<String> = BTreeSet::new();
    let mut max_acked = 0i64;
    let mut rng = rand::rng();

    for round in 0..3 {
        let mut child = ServerProcess::spawn(dir.path(), port);
        let c = admin_client(dir.path(), port).await;

        // Everything acknowledged before is still there, exactly as acknowledged.
        let (s, list) = c.get("/api/v1/namespaces/default/serviceaccounts").await;
        assert_eq!(s, StatusCode::OK);
        // The namespace's `default` account is the service-account controller's, not a write
        // of this test.
        let present: BTreeMap<String, i64> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["metadata"]["name"] != "default")
            .map(|i| {
                (
                    i["metadata"]["name"].as_str().unwrap().to_string(),
                    i["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap()
                        .parse()
                        .unwrap(),
                )
            })
            .collect();
        for (name, rv) in &acked {
            assert_eq!(
                present.get(name),
                Some(rv),
                "round {round}: acknowledged {name}@{rv} lost"
            );
        }
        for name in present.keys() {
            assert!(
                attempted.contains(name),
                "round {round}: {name} was never written"
            );
        }
        let list_rv: i64 = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            list_rv >= max_acked,
            "round {round}: revision went back from {max_acked} to {list_rv}"
        );
        acked = present;

        // Writers hammer the server; the process dies at a random moment.
        let log = Arc::new(Mutex::new(Vec::<(String, Option<i64>)>::new()));
        let mut writers = Vec::new();
        for w in 0..16 {
            let c = c.clone();
            let log = log.clone();
            writers.push(tokio::spawn(async move {
                for n in 0.. {
                    let name = format!("r{round}-w{w}-{n}");
                    log.lock().push((name.clone(), None));
                    let body = json!({"metadata": {"name": name}}).to_string();
                    let req = Client::build(
                        http::Method::POST,
                        "/api/v1/namespaces/default/serviceaccounts",
                        body,
                        &[("content-type", "application/json")],
                    );
                    let Ok(mut conn) = c.connect().await else {
                        return;
                    };
                    let Ok(resp) = conn.send(req).await else {
                        return;
                    };
                    if resp.status() != StatusCode::CREATED {
                        return;
                    }
                    use http_body_util::BodyExt;
                    let Ok(body) = resp.into_body().collect().await else {
                        return;
                    };
                    let v: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
                    let rv = v["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap()
                        .parse()
                        .unwrap();
                    log.lock().push((name, Some(rv)));
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1200))).await;
        child.kill(); // SIGKILL
        for w in writers {
            let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
        }
        let log = log.lock();
        let mut round_acked = 0;
        for (name, rv) in log.iter() {
            attempted.insert(name.clone());
            if let Some(rv) = rv {
                acked.insert(name.clone(), *rv);
                max_acked = max_acked.max(*rv);
                round_acked += 1;
            }
        }
        eprintln!(
            "round {round}: {round_acked} writes acknowledged before SIGKILL, {} attempted",
            log.len() - round_acked
        );
        assert!(
            round_acked > 0,
            "round {round}: no write was acknowledged before the kill"
        );
    }

    // A final start: the last round's acknowledged writes are there and revisions continue.
    let mut child = ServerProcess::spawn(dir.path(), port);
    let c = admin_client(dir.path(), port).await;
    let (_, list) = c.get("/api/v1/namespaces/default/serviceaccounts").await;
    let present: BTreeSet<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    for name in acked.keys() {
        assert!(present.contains(name), "acknowledged {name} lost");
    }
    let (s, fresh) = c
        .post(
            "/api/v1/namespaces/default/serviceaccounts",
            json!({"metadata": {"name": "after"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let rv: i64 = fresh["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        rv > max_acked,
        "revision {rv} did not continue above {max_acked}"
    );
    child.kill();
}
