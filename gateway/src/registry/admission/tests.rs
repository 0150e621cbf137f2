//! Tests of the admission chain: flag checks, plugin configuration inline and by path, the
//! order of the phases (validating plugins see what mutating ones made), and the bounds on
//! what plugins add to a response.

use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Value, json};
use svc_core::kinds::{Event, Namespace};
use svc_core::{ApiError, Resource};

use super::*;

/// The plugins on by default.
const WEBHOOKS: [&str; 2] = ["MutatingAdmissionWebhook", "ValidatingAdmissionWebhook"];

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn flags_name_known_plugins_and_never_both_ways() {
    let webhooks = WEBHOOKS;
    assert_eq!(enabled_plugins(&[], &[]).unwrap(), webhooks);
    assert_eq!(
        enabled_plugins(&strings(&["EventRateLimit"]), &[]).unwrap(),
        ["EventRateLimit", webhooks[0], webhooks[1]]
    );
    assert_eq!(
        enabled_plugins(&[], &strings(&webhooks)).unwrap(),
        Vec::<&str>::new()
    );
    let err = enabled_plugins(&strings(&["NoSuchPlugin"]), &[]).unwrap_err();
    assert!(
        err.contains(r#"--enable-admission-plugins: unknown admission plugin "NoSuchPlugin""#),
        "{err}"
    );
    let err = enabled_plugins(&[], &strings(&["Nope"])).unwrap_err();
    assert!(err.contains("--disable-admission-plugins"), "{err}");
    let err =
        enabled_plugins(&strings(&["EventRateLimit"]), &strings(&["EventRateLimit"])).unwrap_err();
    assert!(err.contains(r#"["EventRateLimit"] in both"#), "{err}");
    assert_eq!(
        enabled_plugins(&[], &strings(&["EventRateLimit"])).unwrap(),
        webhooks
    );
}

fn options(dir: &std::path::Path, enable: &[&str], file: Option<&str>) -> Options {
    let mut o = Options::for_tests(dir.to_path_buf());
    o.enable_admission_plugins = strings(enable);
    o.admission_control_config_file = file.map(|f| dir.join(f));
    o
}

const LIMITS: &str = "apiVersion: eventratelimit.admission.svc.io/v1alpha1\nkind: Configuration\n\
                      limits:\n- type: Namespace\n  qps: 1\n  burst: 2\n";

#[test]
fn plugins_are_configured_inline_or_by_a_path_relative_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf")).unwrap();
    std::fs::write(dir.path().join("conf/limits.yaml"), LIMITS).unwrap();
    std::fs::write(
        dir.path().join("conf/admission.yaml"),
        "apiVersion: apiserver.svc.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
         - name: EventRateLimit\n  path: limits.yaml\n",
    )
    .unwrap();
    let chain = Chain::from_options(&options(
        dir.path(),
        &["EventRateLimit"],
        Some("conf/admission.yaml"),
    ))
    .unwrap();
    assert_eq!(chain.names(), ["EventRateLimit", WEBHOOKS[0], WEBHOOKS[1]]);

    let inline = format!(
        "apiVersion: apiserver.svc.io/v1alpha1\nkind: AdmissionConfiguration\nplugins:\n\
         - name: EventRateLimit\n  configuration:\n{}",
        LIMITS
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    );
    std::fs::write(dir.path().join("inline.yaml"), inline).unwrap();
    let chain = Chain::from_options(&options(
        dir.path(),
        &["EventRateLimit"],
        Some("inline.yaml"),
    ))
    .unwrap();
    assert_eq!(chain.names(), ["EventRateLimit", WEBHOOKS[0], WEBHOOKS[1]]);
    // Configured but not enabled: only the default plugins run.
    let chain = Chain::from_options(&options(dir.path(), &[], Some("inline.yaml"))).unwrap();
    assert_eq!(chain.names(), WEBHOOKS);
}

#[test]
fn bad_configurations_stop_the_start_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write("bad-limits.yaml", &LIMITS.replace("qps: 1", "qps: 0"));
    write(
        "a.yaml",
        "apiVersion: apiserver.svc.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
         - name: EventRateLimit\n  path: bad-limits.yaml\n",
    );
    write(
        "missing.yaml",
        "apiVersion: apiserver.svc.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
         - name: EventRateLimit\n  path: nowhere.yaml\n",
    );
    write(
        "typo.yaml",
        "apiVersion: apiserver.svc.io/v1\nkind: AdmissionConfiguration\nplugin: []\n",
    );
    for (file, expected) in [
        (
            "a.yaml",
            r#"bad-limits.yaml: Configuration: limits[0].qps: Invalid value: "0": must be positive"#,
        ),
        ("missing.yaml", "nowhere.yaml"),
        ("typo.yaml", r#"plugin: unknown field "plugin""#),
        ("absent.yaml", "--admission-control-config-file"),
    ] {
        let err =
            Chain::from_options(&options(dir.path(), &["EventRateLimit"], Some(file))).unwrap_err();
        assert!(err.contains(expected), "{file}: {err}");
    }
    let err = Chain::from_options(&options(dir.path(), &["EventRateLimit"], None)).unwrap_err();
    assert!(
        err.contains("EventRateLimit: a configuration is required"),
        "{err}"
    );
}

/// Adds a label when the object has none; counts the requests it saw.
struct Labeller;

#[async_trait]
impl Mutating for Labeller {
    fn handles(&self, attrs: &Attributes<'_>) -> bool {
        attrs.operation != Operation::Delete
    }
    async fn admit(
        &self,
        attrs: &Attributes<'_>,
        object: &mut Value,
        old: Option<&dyn AdmissionObject>,
        out: &mut Outcome,
    ) -> Result<bool, ApiError> {
        out.warn(format!("labelled on {}", attrs.operation.as_str()));
        out.annotate("labeller/old", old.is_some().to_string());
        object["metadata"]["labels"]["admitted"] = json!("yes");
        Ok(true)
    }
}

/// Records the label it sees and refuses objects named `refuse`.
#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

#[async_trait]
impl Validating for Arc<Recorder> {
    fn handles(&self, _: &Attributes<'_>) -> bool {
        true
    }
    async fn validate(
        &self,
        attrs: &Attributes<'_>,
        object: Option<&dyn AdmissionObject>,
        old: Option<&dyn AdmissionObject>,
        _out: &mut Outcome,
    ) -> Result<(), ApiError> {
        let seen = match object {
            Some(o) => {
                let ns = o.as_any().downcast_ref::<Namespace>().expect("a Namespace");
                ns.metadata
                    .labels
                    .get("admitted")
                    .cloned()
                    .unwrap_or_default()
            }
            None => format!("old={}", old.is_some()),
        };
        self.0
            .lock()
            .push(format!("{} {seen}", attrs.operation.as_str()));
        if attrs.name == "refuse" {
            return Err(ApiError::forbidden("refused by the recorder"));
        }
        Ok(())
    }
}

fn attrs<'a>(op: Operation, name: &'a str, user: &'a UserInfo) -> Attributes<'a> {
    Attributes {
        operation: op,
        info: Namespace::INFO,
        subresource: None,
        namespace: "",
        name,
        user,
        dry_run: false,
        audit: None,
    }
}

#[tokio::test]
async fn validating_plugins_see_what_mutating_ones_made() {
    let recorder = Arc::new(Recorder::default());
    let chain = Chain::new(vec![
        (
            "Labeller",
            Plugin {
                mutating: Some(Arc::new(Labeller)),
                validating: None,
            },
        ),
        (
            "Recorder",
            Plugin {
                mutating: None,
                validating: Some(Arc::new(recorder.clone())),
            },
        ),
    ]);
    let user = UserInfo::default();
    let mut ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap();
    let mut out = Outcome::default();
    let a = attrs(Operation::Create, "a", &user);
    chain.mutate(&a, &mut ns, None, &mut out).await.unwrap();
    assert_eq!(ns.metadata.labels["admitted"], "yes");
    assert_eq!(
        (ns.kind.as_str(), ns.api_version.as_str()),
        ("Namespace", "v1")
    );
    chain.validate(&a, Some(&ns), None, &mut out).await.unwrap();
    let old = ns.clone();
    let u = attrs(Operation::Update, "a", &user);
    chain
        .mutate(&u, &mut ns, Some(&old), &mut out)
        .await
        .unwrap();
    chain
        .validate(&u, Some(&ns), Some(&old), &mut out)
        .await
        .unwrap();
    let d = attrs(Operation::Delete, "refuse", &user);
    let err = chain
        .validate::<Namespace>(&d, None, Some(&old), &mut out)
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::Forbidden { .. }));
    assert_eq!(
        *recorder.0.lock(),
        ["CREATE yes", "UPDATE yes", "DELETE old=true"]
    );
    assert_eq!(out.warnings, ["labelled on CREATE", "labelled on UPDATE"]);
    assert_eq!(
        out.audit_annotations["labeller/old"], "false",
        "the first value stays"
    );
}

#[tokio::test]
async fn an_empty_chain_changes_nothing() {
    let chain = Chain::default();
    let user = UserInfo::default();
    let mut ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap();
    let before = ns.clone();
    let mut out = Outcome::default();
    let a = attrs(Operation::Create, "a", &user);
    chain.mutate(&a, &mut ns, None, &mut out).await.unwrap();
    chain.validate(&a, Some(&ns), None, &mut out).await.unwrap();
    assert_eq!((ns, out), (before, Outcome::default()));
}

#[tokio::test]
async fn event_rate_limit_charges_event_creates_and_updates_but_not_dry_runs() {
    let config = LIMITS.replace("Namespace", "Server");
    let plugin =
        event_rate_limit::build(Some(svc_config::parse_document(config.as_bytes()).unwrap()))
            .unwrap();
    let chain = Chain::new(vec![("EventRateLimit", plugin)]);
    let user = UserInfo::default();
    let event = Event::default();
    let at = |op, dry_run| Attributes {
        operation: op,
        info: Event::INFO,
        subresource: None,
        namespace: "ns",
        name: "e",
        user: &user,
        dry_run,
        audit: None,
    };
    let mut out = Outcome::default();
    let check = |op, dry_run| {
        let a = at(op, dry_run);
        let chain = chain.clone();
        let event = event.clone();
        async move {
            let mut out = Outcome::default();
            chain.validate(&a, Some(&event), None, &mut out).await
        }
    };
    // Dry runs and deletes are never charged.
    for _ in 0..5 {
        check(Operation::Create, true).await.unwrap();
        check(Operation::Delete, false).await.unwrap();
    }
    check(Operation::Create, false).await.unwrap();
    check(Operation::Update, false).await.unwrap();
    let err = check(Operation::Create, false).await.unwrap_err();
    assert_eq!(err.retry_after(), Some(1));
    assert_eq!(
        err.to_string(),
        "Too many requests: limit reached on type Server for key "
    );
    // Other kinds are not the plugin's business.
    let user2 = UserInfo::default();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap();
    chain
        .validate(
            &attrs(Operation::Create, "a", &user2),
            Some(&ns),
            None,
            &mut out,
        )
        .await
        .unwrap();
}

#[test]
fn warnings_and_annotations_are_bounded() {
    let mut out = Outcome::default();
    out.warn("");
    out.warn("same");
    out.warn("same");
    assert_eq!(out.warnings, ["same"]);
    for i in 0..1000 {
        out.warn(format!("{i} {}", "x".repeat(1000)));
    }
    let total: usize = out.warnings.iter().map(|w| w.chars().count()).sum();
    assert!(total <= 2 * WARNINGS_TOTAL_CHARS, "{total}");
    assert!(
        out.warnings
            .iter()
            .skip(5)
            .all(|w| w.chars().count() <= WARNING_ITEM_CHARS)
    );
    for i in 0..1000 {
        out.annotate(format!("k{i}"), "v");
    }
    assert_eq!(out.audit_annotations.len(), MAX_AUDIT_ANNOTATIONS);
}
