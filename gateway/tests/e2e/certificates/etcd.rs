//! Two gateways on one etcd, both running the signing controller: every approved request
//! is issued exactly once. A watch on one gateway sees, per request, its creation, its
//! approval and one write with a certificate, and nothing after it; the gateways' metrics
//! count one successful status write per request, the signer that lost a race having got
//! 409 and found the request issued.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::Value;
use svc_gateway::base::flags::StorageBackend;
use svc_storage::etcd::testing::EtcdCluster;

use super::{BASE, body, certificate, decide, request};
use crate::support::client::{Client, TestServer};

const REQUESTS: usize = 12;

async fn gateway(endpoints: Vec<String>, cert_dir: &Path) -> TestServer {
    let cert_dir = cert_dir.to_path_buf();
    TestServer::start_with(move |o| {
        o.storage_backend = StorageBackend::Etcd;
        o.etcd_servers = endpoints;
        o.cert_dir = Some(cert_dir);
    })
    .await
}

/// How many PUTs to `certificatesigningrequests/status` a gateway answered with `code`.
async fn status_writes(c: &Client, code: &str) -> u64 {
    let r = c.request(Method::GET, "/metrics", "", &[]).await;
    r.text()
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains("verb=\"PUT\"")
                && l.contains("resource=\"certificatesigningrequests\"")
                && l.contains("subresource=\"status\"")
                && l.contains(&format!("code=\"{code}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// One event of one request: its type and certificate (empty while not issued).
type Seen = (String, String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_issue_each_request_once() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 1).await;
    let certs = dir.path().join("pki");
    let a = gateway(etcd.endpoints(), &certs).await;
    let b = gateway(etcd.endpoints(), &certs).await;
    let on_a = a.admin();
    let on_b = Client {
        addr: b.handle().addr,
        ..on_a.clone()
    };
    let (s, list) = on_a.get(BASE).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watch = on_a
        .watch(&format!("{BASE}?watch=1&resourceVersion={rv}"))
        .await;

    // Created on one gateway, approved on either: both signers see each approval.
    let names: Vec<String> = (0..REQUESTS).map(|i| format!("race-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let (_, pem) = request(name, None, &[]);
        let c = if i % 2 == 0 { &on_a } else { &on_b };
        let (s, v) = c
            .post(
                BASE,
                body(
                    name,
                    &pem,
                    "svc.io/apiserver-client",
                    &["client auth"],
                    None,
                ),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    // All approved at once, half on each gateway: both signers find several approved
    // requests in one pass and go through them in the same order, racing for each.
    let approvals = names.iter().enumerate().map(|(i, name)| {
        let c = if i % 2 == 0 { &on_b } else { &on_a };
        decide(c, name, "Approved")
    });
    for (s, v) in futures::future::join_all(approvals).await {
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    // Then one more, named to sort last: once it is issued, both signers have made passes
    // that went over all the others after they were issued.
    let (_, pem) = request("zz-sync", None, &[]);
    let (s, v) = on_b
        .post(
            BASE,
            body(
                "zz-sync",
                &pem,
                "svc.io/apiserver-client",
                &["client auth"],
                None,
            ),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    let mut seen: BTreeMap<String, Vec<Seen>> = BTreeMap::new();
    let mut sync_approved = false;
    loop {
        let issued = names
            .iter()
            .filter(|n| {
                seen.get(*n)
                    .is_some_and(|e| e.iter().any(|(_, c)| !c.is_empty()))
            })
            .count();
        if issued == REQUESTS && !sync_approved {
            let (s, v) = decide(&on_a, "zz-sync", "Approved").await;
            assert_eq!(s, StatusCode::OK, "{v}");
            sync_approved = true;
        }
        let ev = watch
            .next_within(Duration::from_secs(20))
            .await
            .expect("the watch ended");
        let obj: &Value = &ev["object"];
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let cert = certificate(obj).unwrap_or_default();
        let done = name == "zz-sync" && !cert.is_empty();
        seen.entry(name)
            .or_default()
            .push((ev["type"].as_str().unwrap().to_string(), cert));
        if done {
            break;
        }
    }
    for name in &names {
        let events = &seen[name];
        let kinds: Vec<&str> = events.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(
            kinds,
            ["ADDED", "MODIFIED", "MODIFIED"],
            "{name}: {events:?}"
        );
        assert!(
            events[1].1.is_empty(),
            "{name}: approval carried no certificate"
        );
        assert!(
            !events[2].1.is_empty(),
            "{name}: the last write is the issuance"
        );
        // Both gateways serve the one certificate.
        let (_, from_b) = on_b.get(&format!("{BASE}/{name}")).await;
        assert_eq!(certificate(&from_b).unwrap(), events[2].1, "{name}");
    }
    // And in the gateways' own accounting: one successful status write per request, the
    // losers' attempts answered 409.
    let (mut written, mut lost) = (0, 0);
    for g in [&on_a, &on_b] {
        written += status_writes(g, "200").await;
        lost += status_writes(g, "409").await;
    }
    assert_eq!(written, REQUESTS as u64 + 1, "{lost} lost the race");
    eprintln!("{written} certificates written, {lost} writes lost the race");
    drop(etcd);
}
