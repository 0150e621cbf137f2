//! Admission through TLS: a server started with `--enable-admission-plugins=EventRateLimit`
//! and `--admission-control-config-file` (a per-namespace limit with a small burst) refuses the
//! event create past the burst with 429, `Retry-After` and a Status; other namespaces keep
//! their own buckets; dry runs are admitted and never charged (as Kubernetes' plugin skips
//! them); patches and applies of events are charged; a bad configuration stops the start naming its field.

use std::time::Instant;

use clap::Parser;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use svc_gateway::base::flags::Options;

use crate::support::client::{Client, Resp, TestServer, create_namespace};

const BURST: usize = 3;

fn event(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "events.svc.io/v1",
        "kind": "Event",
        "metadata": {"name": name},
        "eventTime": "2024-05-06T07:08:09.123456Z",
        "reportingController": "svc.io/test",
        "reportingInstance": "test-1",
        "action": "Testing",
        "reason": "Tested",
        "regarding": {"kind": "ServiceAccount", "namespace": ns, "name": "x", "apiVersion": "v1"},
        "type": "Normal",
    })
}

fn events(ns: &str) -> String {
    format!("/apis/events.svc.io/v1/namespaces/{ns}/events")
}

async fn create(c: &Client, ns: &str, name: &str, dry_run: bool) -> Resp {
    let query = if dry_run { "?dryRun=All" } else { "" };
    c.request(
        Method::POST,
        &format!("{}{query}", events(ns)),
        &event(ns, name).to_string(),
        &[("content-type", "application/json")],
    )
    .await
}

/// Writes the two configuration files and returns the flags that name them.
fn flags(dir: &std::path::Path, limits: &str) -> Options {
    std::fs::write(dir.join("limits.yaml"), limits).unwrap();
    std::fs::write(
        dir.join("admission.yaml"),
        "apiVersion: apiserver.svc.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
         - name: EventRateLimit\n  path: limits.yaml\n",
    )
    .unwrap();
    Options::parse_from([
        "svc-gateway".to_string(),
        "--enable-admission-plugins=EventRateLimit".to_string(),
        format!(
            "--admission-control-config-file={}",
            dir.join("admission.yaml").display()
        ),
    ])
}

fn limits(qps: i32, burst: usize) -> String {
    format!(
        "apiVersion: eventratelimit.admission.svc.io/v1alpha1\nkind: Configuration\nlimits:\n\
         - type: Namespace\n  qps: {qps}\n  burst: {burst}\n"
    )
}

fn assert_too_many(r: &Resp, key: &str) {
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert_eq!(r.headers["retry-after"], "1");
    let status = r.json();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(status["code"], 429);
    assert_eq!(
        status["message"],
        format!("Too many requests: limit reached on type Namespace for key {key}")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_rate_limit_refuses_the_create_past_the_burst_per_namespace() {
    let conf = tempfile::tempdir().unwrap();
    let parsed = flags(conf.path(), &limits(1, BURST));
    let server = TestServer::start_with(|o| {
        o.enable_admission_plugins = parsed.enable_admission_plugins.clone();
        o.admission_control_config_file = parsed.admission_control_config_file.clone();
    })
    .await;
    assert_eq!(
        server.own().registry.admission.names(),
        [
            "EventRateLimit",
            "MutatingAdmissionWebhook",
            "ValidatingAdmissionWebhook"
        ]
    );
    let c = server.admin();
    create_namespace(&c, "team-a").await;
    create_namespace(&c, "team-b").await;

    // Dry runs are admitted and cost nothing.
    for i in 0..BURST + 2 {
        let r = create(&c, "team-a", &format!("dry-{i}"), true).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    }

    // The burst is accepted, then the next create is refused. The bucket gains one a second,
    // so creates slower than that may be accepted past the burst: count them.
    let started = Instant::now();
    let mut accepted = 0;
    let refused = loop {
        let r = create(&c, "team-a", &format!("e-{accepted}"), false).await;
        if r.status != StatusCode::CREATED {
            break r;
        }
        accepted += 1;
        assert!(accepted <= BURST + 30, "never refused");
    };
    let refill = started.elapsed().as_secs() as usize + 1;
    assert!(
        (BURST..=BURST + refill).contains(&accepted),
        "{accepted} accepted before the refusal"
    );
    assert_too_many(&refused, "team-a");

    // Still admitted while the bucket is empty: a dry run, and another namespace.
    let r = create(&c, "team-a", "dry-late", true).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let r = create(&c, "team-b", "e-0", false).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let (s, list) = c.get(&events("team-a")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        accepted,
        "dry runs stored nothing"
    );

    // Updates are charged too (a patch is an update): patching an event soon meets a 429.
    let path = format!("{}/e-0", events("team-b"));
    let mut patched = 0;
    let refused = loop {
        let r = c
            .request(
                Method::PATCH,
                &path,
                &json!({"metadata": {"labels": {"patched": patched.to_string()}}}).to_string(),
                &[("content-type", "application/merge-patch+json")],
            )
            .await;
        if r.status != StatusCode::OK {
            break r;
        }
        patched += 1;
        assert!(patched <= BURST + 30, "patches never refused");
    };
    assert_too_many(&refused, "team-b");

    // Server-side apply that creates is a create: charged the same way.
    let mut applied = 0;
    let refused = loop {
        let name = format!("applied-{applied}");
        let r = c
            .request(
                Method::PATCH,
                &format!("{}/{name}?fieldManager=test", events("team-b")),
                &event("team-b", &name).to_string(),
                &[("content-type", "application/apply-patch+yaml")],
            )
            .await;
        if r.status != StatusCode::CREATED {
            break r;
        }
        applied += 1;
        assert!(applied <= BURST + 30, "applies never refused");
    };
    assert_too_many(&refused, "team-b");
}

#[tokio::test]
async fn a_bad_admission_configuration_stops_the_start_naming_the_field() {
    let conf = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let parsed = flags(conf.path(), &limits(1, 0));
    let mut opts = Options::for_tests(data.path().to_path_buf());
    opts.enable_admission_plugins = parsed.enable_admission_plugins;
    opts.admission_control_config_file = parsed.admission_control_config_file;
    let err = match svc_gateway::run::start(opts.clone()).await {
        Ok(_) => panic!("started with burst 0"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("limits.yaml"), "{err}");
    assert!(
        err.contains(r#"limits[0].burst: Invalid value: "0": must be positive"#),
        "{err}"
    );

    opts.enable_admission_plugins = vec!["NoSuchPlugin".into()];
    let err = match svc_gateway::run::start(opts).await {
        Ok(_) => panic!("started with an unknown plugin"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(r#"unknown admission plugin "NoSuchPlugin""#),
        "{err}"
    );
}
