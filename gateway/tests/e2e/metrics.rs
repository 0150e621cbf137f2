//! `/metrics` through a real TLS socket with the admin certificate, read by Python's
//! `prometheus_client` (the test command installs it; without python3 or the package this
//! fails): kube-apiserver's families and labels after reads, writes and a watch, with
//! plausible values; and `declarative_validation_mismatch_total`, which moves only when the
//! declarative and hand-written validations disagree.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::client::{Client, TestServer, create_namespace};
use http::{Method, StatusCode};
use serde_json::{Map, Value, json};

const SA: &str = "/api/v1/namespaces/m/serviceaccounts";
const T: Duration = Duration::from_secs(10);

/// The families of one scrape, as Python's parser read them.
struct Families(Map<String, Value>);

impl Families {
    fn family(&self, name: &str) -> &Value {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("no family {name}; have {:?}", self.0.keys()))
    }

    fn kind(&self, name: &str) -> &str {
        self.family(name)["type"].as_str().unwrap()
    }

    /// Samples named `sample` whose labels include every pair of `labels`.
    fn samples(&self, family: &str, sample: &str, labels: &[(&str, &str)]) -> Vec<&Value> {
        self.family(family)["samples"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["name"] == sample)
            .filter(|s| labels.iter().all(|(k, v)| s["labels"][*k] == *v))
            .collect()
    }

    /// The value of the one sample named `sample` with exactly these labels (plus `le`
    /// for buckets).
    fn value(&self, family: &str, sample: &str, labels: &[(&str, &str)]) -> f64 {
        let found = self.samples(family, sample, labels);
        assert_eq!(
            found.len(),
            1,
            "{sample}{labels:?}: want one sample, found {found:?}"
        );
        found[0]["value"].as_f64().unwrap()
    }

    /// Like [`Families::value`], with 0 for a series not yet there.
    fn value_or_zero(&self, family: &str, sample: &str, labels: &[(&str, &str)]) -> f64 {
        if !self.0.contains_key(family) {
            return 0.0;
        }
        let found = self.samples(family, sample, labels);
        found.first().map_or(0.0, |s| s["value"].as_f64().unwrap())
    }
}

/// Scrapes `/metrics` and parses the text with Python's `prometheus_client`.
async fn scrape(c: &Client) -> Families {
    let r = c.request(Method::GET, "/metrics", "", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        r.headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/clients/parse_metrics.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/test.sh installs what the tests need)");
    child.stdin.take().unwrap().write_all(&r.body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client could not read /metrics (scripts/test.sh installs the \
         `prometheus_client` package):\n{}\n--- exposition ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        r.text()
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    Families(v.as_object().unwrap().clone())
}

const KUBE_LATENCY_BUCKETS: [&str; 24] = [
    "0.005", "0.025", "0.05", "0.1", "0.2", "0.4", "0.6", "0.8", "1.0", "1.25", "1.5", "2.0",
    "3.0", "4.0", "5.0", "6.0", "8.0", "10.0", "15.0", "20.0", "30.0", "45.0", "60.0", "+Inf",
];

/// The `le` bounds of one histogram series, in order, checked to be cumulative and to end at
/// the series' `_count`.
fn buckets(f: &Families, family: &str, labels: &[(&str, &str)]) -> Vec<String> {
    let bucket = format!("{family}_bucket");
    let found = f.samples(family, &bucket, labels);
    let mut last = 0.0;
    for s in &found {
        let v = s["value"].as_f64().unwrap();
        assert!(v >= last, "{bucket}{labels:?} is not cumulative: {found:?}");
        last = v;
    }
    assert_eq!(
        last,
        f.value(family, &format!("{family}_count"), labels),
        "{family}{labels:?}: +Inf bucket and count differ"
    );
    found
        .iter()
        .map(|s| s["labels"]["le"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_kube_apiserver_names_and_labels() {
    let srv = TestServer::start().await;
    let c = srv.admin();
    // Waits for the namespace's own `default` account, so the counts below are fixed.
    create_namespace(&c, "m").await;
    let (s, list) = c.get(SA).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    // Request counts below are what this test did: the server's own start-up requests (its
    // controllers' writes, the test support's readiness polls) come before this scrape.
    let before = scrape(&c).await;
    let mut w = c.watch(&format!("{SA}?watch=1&resourceVersion={rv}")).await;
    let (s, first) = c.post(SA, json!({"metadata": {"name": "first"}})).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    let ev = w.next_within(T).await.expect("the watch saw the create");
    assert_eq!(ev["object"]["metadata"]["name"], "first");
    let (s, _) = c.post(SA, json!({"metadata": {"name": "second"}})).await;
    assert_eq!(s, StatusCode::CREATED);
    w.next_within(T)
        .await
        .expect("the watch saw the second create");
    let (s, _) = c
        .post(
            &format!("{SA}?dryRun=All"),
            json!({"metadata": {"name": "dry"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(c.get(SA).await.0, StatusCode::OK);
    assert_eq!(c.get(&format!("{SA}/first")).await.0, StatusCode::OK);
    assert_eq!(c.get(&format!("{SA}/none")).await.0, StatusCode::NOT_FOUND);

    let f = scrape(&c).await;
    let core = |extra: &[(&'static str, &'static str)]| {
        let mut l = vec![
            ("group", ""),
            ("version", "v1"),
            ("resource", "serviceaccounts"),
            ("subresource", ""),
            ("component", "apiserver"),
        ];
        l.extend_from_slice(extra);
        l
    };

    // apiserver_request_total{verb,dry_run,group,version,resource,subresource,scope,component,code}
    assert_eq!(f.kind("apiserver_request"), "counter");
    let req = |extra: &[(&'static str, &'static str)]| {
        f.value("apiserver_request", "apiserver_request_total", &core(extra))
            - before.value_or_zero("apiserver_request", "apiserver_request_total", &core(extra))
    };
    let post = [("verb", "POST"), ("scope", "resource"), ("code", "201")];
    assert_eq!(req(&[post.as_slice(), &[("dry_run", "")]].concat()), 2.0);
    assert_eq!(req(&[post.as_slice(), &[("dry_run", "All")]].concat()), 1.0);
    assert_eq!(
        req(&[
            ("verb", "LIST"),
            ("scope", "namespace"),
            ("code", "200"),
            ("dry_run", "")
        ]),
        1.0
    );
    assert_eq!(
        req(&[
            ("verb", "GET"),
            ("scope", "resource"),
            ("code", "200"),
            ("dry_run", "")
        ]),
        1.0
    );
    assert_eq!(
        req(&[
            ("verb", "GET"),
            ("scope", "resource"),
            ("code", "404"),
            ("dry_run", "")
        ]),
        1.0
    );
    assert_eq!(
        req(&[
            ("verb", "WATCH"),
            ("scope", "namespace"),
            ("code", "200"),
            ("dry_run", "")
        ]),
        1.0
    );

    // apiserver_request_duration_seconds: kube-apiserver's buckets, no code label.
    assert_eq!(f.kind("apiserver_request_duration_seconds"), "histogram");
    let list = core(&[("verb", "LIST"), ("scope", "namespace"), ("dry_run", "")]);
    assert_eq!(
        buckets(&f, "apiserver_request_duration_seconds", &list),
        KUBE_LATENCY_BUCKETS
    );
    let count = f.value(
        "apiserver_request_duration_seconds",
        "apiserver_request_duration_seconds_count",
        &list,
    ) - before.value_or_zero(
        "apiserver_request_duration_seconds",
        "apiserver_request_duration_seconds_count",
        &list,
    );
    let sum = f.value(
        "apiserver_request_duration_seconds",
        "apiserver_request_duration_seconds_sum",
        &list,
    ) - before.value_or_zero(
        "apiserver_request_duration_seconds",
        "apiserver_request_duration_seconds_sum",
        &list,
    );
    assert_eq!(count, 1.0);
    assert!(sum > 0.0 && sum < 10.0, "a list took {sum} s");
    assert!(
        f.samples(
            "apiserver_request_duration_seconds",
            "apiserver_request_duration_seconds_count",
            &[("code", "200")]
        )
        .is_empty()
    );

    // Requests in flight: this scrape itself is one, and no write is running.
    assert_eq!(f.kind("apiserver_current_inflight_requests"), "gauge");
    let inflight = |kind| {
        f.value(
            "apiserver_current_inflight_requests",
            "apiserver_current_inflight_requests",
            &[("request_kind", kind)],
        )
    };
    assert_eq!(inflight("readOnly"), 1.0);
    assert_eq!(inflight("mutating"), 0.0);
    // Flow control (`limits.rs`): nothing queued; the admin (exempt) holds no seat.
    for family in [
        "apiserver_flowcontrol_current_inqueue_requests",
        "apiserver_flowcontrol_current_executing_requests",
    ] {
        assert_eq!(f.kind(family), "gauge");
        for level in ["readOnly", "mutating"] {
            assert_eq!(f.value(family, family, &[("priority_level", level)]), 0.0);
        }
    }
    assert_eq!(f.kind("apiserver_flowcontrol_rejected_requests"), "counter");
    assert_eq!(
        f.kind("apiserver_flowcontrol_request_wait_duration_seconds"),
        "histogram"
    );

    // The open watch.
    assert_eq!(
        f.value(
            "apiserver_registered_watchers",
            "apiserver_registered_watchers",
            &[("group", ""), ("version", "v1"), ("kind", "ServiceAccount")]
        ),
        1.0
    );
    assert_eq!(
        f.value(
            "apiserver_longrunning_requests",
            "apiserver_longrunning_requests",
            &core(&[("verb", "WATCH"), ("scope", "namespace")])
        ),
        1.0
    );

    // Watch events sent: the two creates, and their sizes in kube-apiserver's buckets.
    let gvr = [
        ("group", ""),
        ("version", "v1"),
        ("resource", "serviceaccounts"),
    ];
    assert_eq!(f.kind("apiserver_watch_events"), "counter");
    assert_eq!(
        f.value(
            "apiserver_watch_events",
            "apiserver_watch_events_total",
            &gvr
        ),
        2.0
    );
    assert_eq!(f.kind("apiserver_watch_events_sizes"), "histogram");
    assert_eq!(
        buckets(&f, "apiserver_watch_events_sizes", &gvr),
        [
            "1024.0", "2048.0", "4096.0", "8192.0", "16384.0", "32768.0", "65536.0", "131072.0",
            "+Inf"
        ]
    );
    assert_eq!(
        f.value(
            "apiserver_watch_events_sizes",
            "apiserver_watch_events_sizes_count",
            &gvr
        ),
        2.0
    );
    let bytes = f.value(
        "apiserver_watch_events_sizes",
        "apiserver_watch_events_sizes_sum",
        &gvr,
    );
    assert!(
        (200.0..4096.0).contains(&bytes),
        "two small events took {bytes} bytes"
    );

    // Storage: objects, and calls timed around the Store trait.
    let sa_objects = f.value(
        "apiserver_storage_objects",
        "apiserver_storage_objects",
        &[("resource", "serviceaccounts")],
    );
    // Ours and the `default` accounts of the four built-in namespaces and of `m`.
    assert_eq!(sa_objects, 2.0 + 5.0);
    assert_eq!(
        f.value(
            "apiserver_resource_objects",
            "apiserver_resource_objects",
            &[("group", ""), ("resource", "serviceaccounts")]
        ),
        2.0 + 5.0
    );
    assert!(
        f.value(
            "apiserver_storage_objects",
            "apiserver_storage_objects",
            &[("resource", "namespaces")]
        ) >= 4.0,
        "default, kube-system, kube-public, kube-node-lease and m"
    );
    assert_eq!(f.kind("etcd_request_duration_seconds"), "histogram");
    // Proxy mode's own family is a proxy's only.
    assert!(
        !f.0.contains_key("svc_proxy_cache_reads"),
        "{:?}",
        f.0.keys()
    );
    let create = [
        ("operation", "create"),
        ("group", ""),
        ("resource", "serviceaccounts"),
    ];
    assert_eq!(
        buckets(&f, "etcd_request_duration_seconds", &create),
        KUBE_LATENCY_BUCKETS
    );
    assert_eq!(
        f.value(
            "etcd_request_duration_seconds",
            "etcd_request_duration_seconds_count",
            &create
        ) - before.value_or_zero(
            "etcd_request_duration_seconds",
            "etcd_request_duration_seconds_count",
            &create
        ),
        2.0,
        "the dry run wrote nothing"
    );
    assert_eq!(
        f.value("etcd_requests", "etcd_requests_total", &create)
            - before.value_or_zero("etcd_requests", "etcd_requests_total", &create),
        2.0
    );
    // Creating in a namespace reads the namespace first; the cache lists each type.
    assert!(
        f.value(
            "etcd_requests",
            "etcd_requests_total",
            &[
                ("operation", "get"),
                ("group", ""),
                ("resource", "namespaces")
            ]
        ) >= 3.0
    );
    assert!(
        f.value(
            "etcd_requests",
            "etcd_requests_total",
            &[
                ("operation", "list"),
                ("group", ""),
                ("resource", "serviceaccounts")
            ]
        ) >= 1.0
    );

    // The watch cache.
    let gr = [("group", ""), ("resource", "serviceaccounts")];
    assert_eq!(
        f.value(
            "apiserver_watch_cache_events_received",
            "apiserver_watch_cache_events_received_total",
            &gr
        ) - before.value_or_zero(
            "apiserver_watch_cache_events_received",
            "apiserver_watch_cache_events_received_total",
            &gr
        ),
        2.0
    );
    let second_rv: f64 = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let cache_rv = f.value(
        "apiserver_watch_cache_resource_version",
        "apiserver_watch_cache_resource_version",
        &gr,
    );
    assert!(
        cache_rv > second_rv,
        "cache at {cache_rv}, second write after {second_rv}"
    );
    assert_eq!(
        f.value(
            "apiserver_watch_cache_initializations",
            "apiserver_watch_cache_initializations_total",
            &gr
        ),
        1.0
    );
    assert_eq!(
        f.value(
            "apiserver_watch_cache_encodings",
            "apiserver_watch_cache_encodings_total",
            &[
                ("group", ""),
                ("resource", "serviceaccounts"),
                ("format", "json")
            ]
        ),
        2.0,
        "one JSON encoding per event"
    );
    assert_eq!(
        f.value(
            "apiserver_watch_cache_watchers",
            "apiserver_watch_cache_watchers",
            &gr
        ),
        1.0
    );
    assert_eq!(
        f.value(
            "apiserver_watch_cache_history_events",
            "apiserver_watch_cache_history_events",
            &gr
        ),
        2.0 + 5.0,
        "our two creates and the five default accounts'"
    );
    for family in [
        "apiserver_watch_cache_history_bytes",
        "apiserver_watch_cache_snapshots",
        "apiserver_watch_cache_snapshot_bytes",
    ] {
        assert_eq!(f.kind(family), "gauge");
        f.value(family, family, &gr);
    }
    f.value(
        "apiserver_watch_cache_dispatch_visits",
        "apiserver_watch_cache_dispatch_visits_total",
        &gr,
    );
    assert_eq!(f.kind("svc_http2_watch_held_bytes"), "gauge");
    f.value(
        "svc_http2_watch_held_bytes",
        "svc_http2_watch_held_bytes",
        &[],
    );
    assert_eq!(f.kind("svc_http2_writes"), "counter");
    f.value("svc_http2_writes", "svc_http2_writes_total", &[]);

    // Nothing disagreed in validation.
    assert_eq!(
        f.value(
            "declarative_validation_mismatch",
            "declarative_validation_mismatch_total",
            &[]
        ),
        0.0
    );

    // Closing the watch takes it off the gauges.
    drop(w);
    let mut open = 1.0;
    for _ in 0..100 {
        let f = scrape(&c).await;
        open = f.value(
            "apiserver_registered_watchers",
            "apiserver_registered_watchers",
            &[("group", ""), ("version", "v1"), ("kind", "ServiceAccount")],
        );
        if open == 0.0 {
            assert_eq!(
                f.value(
                    "apiserver_longrunning_requests",
                    "apiserver_longrunning_requests",
                    &core(&[("verb", "WATCH"), ("scope", "namespace")])
                ),
                0.0
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(open, 0.0, "the closed watch is still counted");
}

async fn mismatches(c: &Client) -> f64 {
    scrape(c).await.value(
        "declarative_validation_mismatch",
        "declarative_validation_mismatch_total",
        &[],
    )
}

fn causes(status: &Value) -> Vec<(String, String)> {
    status["details"]["causes"]
        .as_array()
        .unwrap_or_else(|| panic!("no causes: {status}"))
        .iter()
        .map(|c| {
            (
                c["field"].as_str().unwrap().to_string(),
                c["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn cause(field: &str, reason: &str) -> Vec<(String, String)> {
    vec![(field.to_string(), reason.to_string())]
}

/// The shipped rules agree with the hand-written validation, so to see a mismatch the test adds
/// a rule the hand-written side does not have (names of at most 7 bytes, through
/// `Options::extra_declarative_rules`, which no flag sets; 7 so that the `default` account
/// the service-account controller creates in every namespace still agrees). Agreement, valid or invalid, never
/// moves the counter; the disagreement moves it whenever declarative validation runs, and
/// decides the answer only under takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declarative_validation_mismatches_are_counted_and_takeover_answers() {
    use svc_core::validation::declarative::{Check, Rule};
    use svc_gateway::base::features::Feature;
    const DV: &str = "/api/v1/namespaces/dv/serviceaccounts";
    let stricter = Rule::new("metadata.name", Check::MaxLength(7));
    for (declarative, takeover) in [(true, false), (true, true), (false, true)] {
        let mode = format!("DeclarativeValidation={declarative} Takeover={takeover}");
        let srv = TestServer::start_with(|o| {
            o.feature_gates
                .set(Feature::DeclarativeValidation, declarative);
            o.feature_gates
                .set(Feature::DeclarativeValidationTakeover, takeover);
            o.extra_declarative_rules.push(("ServiceAccount", stricter));
        })
        .await;
        let c = srv.admin();
        let (s, _) = c
            .post("/api/v1/namespaces", json!({"metadata": {"name": "dv"}}))
            .await;
        assert_eq!(s, StatusCode::CREATED);
        assert_eq!(mismatches(&c).await, 0.0, "{mode}");

        // Both validations agree: a valid object, an invalid name, a secret without a name,
        // and an update.
        let (s, ok) = c.post(DV, json!({"metadata": {"name": "ok"}})).await;
        assert_eq!(s, StatusCode::CREATED, "{mode}: {ok}");
        let (s, st) = c.post(DV, json!({"metadata": {"name": "B_d"}})).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{mode}");
        assert_eq!(causes(&st), cause("metadata.name", "FieldValueInvalid"));
        let (s, st) = c
            .post(DV, json!({"metadata": {"name": "sec"}, "secrets": [{}]}))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{mode}");
        assert_eq!(causes(&st), cause("secrets[0].name", "FieldValueRequired"));
        let mut labelled = ok.clone();
        labelled["metadata"]["labels"] = json!({"a": "b"});
        let (s, v) = c.put(&format!("{DV}/ok"), labelled).await;
        assert_eq!(s, StatusCode::OK, "{mode}: {v}");
        assert_eq!(mismatches(&c).await, 0.0, "{mode}: agreement counted");

        // They disagree: a name the hand-written validation accepts and the rule refuses.
        let (s, v) = c.post(DV, json!({"metadata": {"name": "too-long"}})).await;
        if declarative && takeover {
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{mode}: {v}");
            assert_eq!(causes(&v), cause("metadata.name", "FieldValueTooLong"));
        } else {
            assert_eq!(s, StatusCode::CREATED, "{mode}: {v}");
        }
        let want = if declarative { 1.0 } else { 0.0 };
        assert_eq!(mismatches(&c).await, want, "{mode}");
    }
}
