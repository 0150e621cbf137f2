//! Discovery documents (`/api`, `/apis`, group and group-version resource lists) and
//! `/version`, so that kubectl and client libraries find what is served.

use http::{Response, StatusCode};
use serde_json::{Value, json};
use svc_core::{ApiError, ResourceInfo, registry};

use crate::base::router::Route;
use crate::http::respond::{self, Body};

/// The Kubernetes release whose API this server speaks (clients check for skew).
pub const KUBE_MAJOR: &str = "1";
pub const KUBE_MINOR: &str = "32";

fn resource_entries(group: &str, version: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for r in registry::all()
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        out.push(entry(r));
        for s in r.subresources {
            let mut e = json!({
                "name": format!("{}/{}", r.plural, s.name),
                "singularName": "",
                "namespaced": r.namespaced(),
                "kind": s.kind,
                "verbs": s.verbs,
            });
            if let Some((g, v)) = s.group_version
                && let Some(e) = e.as_object_mut()
            {
                e.insert("group".into(), json!(g));
                e.insert("version".into(), json!(v));
            }
            out.push(e);
        }
    }
    out
}

fn entry(r: &ResourceInfo) -> Value {
    let mut e = json!({
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced(),
        "kind": r.kind,
        "verbs": r.verbs,
    });
    if !r.short_names.is_empty()
        && let Some(e) = e.as_object_mut()
    {
        e.insert("shortNames".into(), json!(r.short_names));
    }
    e
}

fn group_entry(group: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

pub fn version() -> Value {
    json!({
        "major": KUBE_MAJOR,
        "minor": KUBE_MINOR,
        "gitVersion": format!("v{KUBE_MAJOR}.{KUBE_MINOR}.0+svc-{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        }),
    })
}

pub fn serve(route: &Route, pretty: bool) -> Response<Body> {
    let doc = match route {
        Route::Version => version(),
        Route::CoreVersions => json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [],
        }),
        Route::Groups => {
            let groups: Vec<Value> = registry::groups()
                .iter()
                .map(|(g, vs)| group_entry(g, vs))
                .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        Route::Group(g) => match registry::groups().iter().find(|(name, _)| name == g) {
            Some((name, vs)) => {
                let mut e = group_entry(name, vs);
                if let Some(fields) = e.as_object_mut() {
                    fields.insert("kind".into(), json!("APIGroup"));
                    fields.insert("apiVersion".into(), json!("v1"));
                }
                e
            }
            None => return not_found(),
        },
        Route::ResourceList { group, version } => {
            let resources = resource_entries(group, version);
            if resources.is_empty() {
                return not_found();
            }
            let gv = if group.is_empty() {
                version.clone()
            } else {
                format!("{group}/{version}")
            };
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
        }
        _ => return not_found(),
    };
    respond::json(StatusCode::OK, &doc, pretty)
}

fn not_found() -> Response<Body> {
    respond::error(&ApiError::NotFound(Default::default()))
}
