//! What proxy mode can cache, read from the upstream's aggregated discovery (`/api` and
//! `/apis` as `apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`): each group's preferred
//! version's resources that can be listed and watched, chosen by `--cache-resources`, and
//! each described as a run-time kind (`ResourceInfo`) the watch cache can hold.

use std::collections::HashMap;
use std::sync::LazyLock;

use parking_lot::Mutex;

use serde::Deserialize;
use svc_core::ResourceInfo;
use svc_core::resource::{Scope, no_schema};
use svc_core::validation::NameRule;
use svc_core::watch::unstructured::selectable_fields;

/// The media type of aggregated discovery.
pub const ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Resources left out of `*`, and why: Secrets are credentials, and a copy of every one in
/// every proxy's memory widens what a compromised proxy gives away. Naming them in
/// `--cache-resources` caches them too.
pub const LEFT_OUT_BY_DEFAULT: &[&str] = &["secrets"];

/// One resource the upstream serves that the proxy may cache.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Discovered {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub kind: String,
    pub singular: String,
    pub namespaced: bool,
    pub verbs: Vec<String>,
    pub short_names: Vec<String>,
}

impl Discovered {
    /// `resource` for the core group, `resource.group` otherwise: how `--cache-resources`
    /// names it.
    pub fn name(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

#[derive(Deserialize)]
struct GroupList {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    items: Vec<Group>,
}

#[derive(Deserialize)]
struct Group {
    #[serde(default)]
    metadata: GroupMeta,
    #[serde(default)]
    versions: Vec<Version>,
}

#[derive(Default, Deserialize)]
struct GroupMeta {
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct Version {
    #[serde(default)]
    version: String,
    #[serde(default)]
    resources: Vec<Resource>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Resource {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    response_kind: Option<ResponseKind>,
    #[serde(default)]
    scope: String,
    #[serde(default)]
    singular_resource: String,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    short_names: Vec<String>,
}

#[derive(Deserialize)]
struct ResponseKind {
    #[serde(default)]
    kind: String,
}

/// The listable and watchable resources of each group's preferred (first) version in one
/// aggregated discovery document.
pub fn parse(body: &[u8]) -> Result<Vec<Discovered>, String> {
    let list: GroupList = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if list.kind != "APIGroupDiscoveryList" {
        return Err(format!(
            "expected an APIGroupDiscoveryList, got {:?} (the upstream must serve aggregated \
             discovery, Kubernetes 1.30 or later)",
            list.kind
        ));
    }
    let mut out = Vec::new();
    for group in list.items {
        let Some(version) = group.versions.into_iter().next() else {
            continue;
        };
        for r in version.resources {
            let listable = ["list", "watch"]
                .iter()
                .all(|v| r.verbs.iter().any(|have| have == v));
            let Some(kind) = r.response_kind.map(|k| k.kind).filter(|k| !k.is_empty()) else {
                continue;
            };
            if !listable || r.resource.is_empty() || r.resource.contains('/') {
                continue;
            }
            out.push(Discovered {
                group: group.metadata.name.clone(),
                version: version.version.clone(),
                resource: r.resource,
                kind,
                singular: r.singular_resource,
                namespaced: r.scope == "Namespaced",
                verbs: r.verbs,
                short_names: r.short_names,
            });
        }
    }
    Ok(out)
}

/// Which resources `--cache-resources` chooses: `*` is every one discovered but those
/// [`LEFT_OUT_BY_DEFAULT`]; a name (`pods`, `deployments.apps`) adds one; `-name` takes one
/// away. Empty: none (every request passes through).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceFilter {
    all: bool,
    add: Vec<String>,
    remove: Vec<String>,
}

impl ResourceFilter {
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut f = ResourceFilter::default();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry == "*" {
                f.all = true;
            } else if let Some(name) = entry.strip_prefix('-') {
                f.remove.push(check_name(name)?);
            } else {
                f.add.push(check_name(entry)?);
            }
        }
        Ok(f)
    }

    pub fn chooses(&self, r: &Discovered) -> bool {
        let name = r.name();
        if self.remove.contains(&name) {
            return false;
        }
        self.add.contains(&name)
            || (self.all && !(r.group.is_empty() && LEFT_OUT_BY_DEFAULT.contains(&&*r.resource)))
    }
}

fn check_name(name: &str) -> Result<String, String> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if ok {
        Ok(name.to_string())
    } else {
        Err(format!(
            "--cache-resources: {name:?} is not a resource name (`pods`, `deployments.apps`, \
             `-secrets`, `*`)"
        ))
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// Run-time kinds, one per distinct description: a resource seen again (every discovery
/// round) reuses its description, so only a new or changed resource costs memory, once.
static KINDS: LazyLock<Mutex<HashMap<Discovered, &'static ResourceInfo>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The kind the watch cache holds for a discovered resource.
pub fn kind_of(d: &Discovered) -> &'static ResourceInfo {
    let mut kinds = KINDS.lock();
    if let Some(info) = kinds.get(d) {
        return info;
    }
    let verbs: Vec<&'static str> = d.verbs.iter().map(|v| leak(v)).collect();
    let short: Vec<&'static str> = d.short_names.iter().map(|v| leak(v)).collect();
    let fields: Vec<&'static str> = selectable_fields(&d.group, &d.kind)
        .iter()
        .map(|f| f.name)
        .collect();
    let info: &'static ResourceInfo = Box::leak(Box::new(ResourceInfo {
        group: leak(&d.group),
        version: leak(&d.version),
        kind: leak(&d.kind),
        list_kind: leak(&format!("{}List", d.kind)),
        plural: leak(&d.resource),
        singular: leak(&d.singular),
        short_names: Box::leak(short.into_boxed_slice()),
        scope: if d.namespaced {
            Scope::Namespaced
        } else {
            Scope::Cluster
        },
        verbs: Box::leak(verbs.into_boxed_slice()),
        name_rule: NameRule::PathSegment,
        extra_fields: Box::leak(fields.into_boxed_slice()),
        allow_create_on_update: false,
        delete_returns_object: false,
        merge_strategies: &[],
        columns: &[],
        schema: no_schema,
        subresources: &[],
        stored: true,
        expires: false,
    }));
    kinds.insert(d.clone(), info);
    info
}

/// A core-group (`v1`) resource that can be listed and watched, as discovery would describe
/// it, made a run-time kind: for tests of what caches such kinds.
#[cfg(test)]
pub fn core_kind(resource: &str, kind: &str, namespaced: bool) -> &'static ResourceInfo {
    kind_of(&Discovered {
        group: String::new(),
        version: "v1".into(),
        resource: resource.into(),
        kind: kind.into(),
        singular: kind.to_lowercase(),
        namespaced,
        verbs: vec!["list".into(), "watch".into()],
        short_names: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[
      {"metadata":{"name":""},"versions":[{"version":"v1","resources":[
        {"resource":"pods","responseKind":{"group":"","version":"v1","kind":"Pod"},"scope":"Namespaced","singularResource":"pod","verbs":["create","get","list","watch"],"shortNames":["po"]},
        {"resource":"secrets","responseKind":{"kind":"Secret"},"scope":"Namespaced","verbs":["list","watch"]},
        {"resource":"bindings","responseKind":{"kind":"Binding"},"scope":"Namespaced","verbs":["create"]},
        {"resource":"nodes","responseKind":{"kind":"Node"},"scope":"Cluster","verbs":["list","watch","get"]}]}]},
      {"metadata":{"name":"example.com"},"versions":[
        {"version":"v2","resources":[{"resource":"widgets","responseKind":{"kind":"Widget"},"scope":"Namespaced","verbs":["list","watch"]}]},
        {"version":"v1","resources":[{"resource":"widgets","responseKind":{"kind":"Widget"},"scope":"Namespaced","verbs":["list","watch"]}]}]}]}"#;

    #[test]
    fn preferred_versions_listable_and_watchable_only() {
        let found = parse(DOC.as_bytes()).unwrap();
        let names: Vec<String> = found
            .iter()
            .map(|d| format!("{}@{}", d.name(), d.version))
            .collect();
        assert_eq!(
            names,
            [
                "pods@v1",
                "secrets@v1",
                "nodes@v1",
                "widgets.example.com@v2"
            ]
        );
        assert!(found[0].namespaced && !found[2].namespaced);
        assert!(parse(br#"{"kind":"APIGroupList"}"#).is_err());
    }

    #[test]
    fn the_filter_leaves_secrets_out_unless_named() {
        let found = parse(DOC.as_bytes()).unwrap();
        let chosen = |spec: &str| -> Vec<String> {
            let f = ResourceFilter::parse(spec).unwrap();
            found
                .iter()
                .filter(|d| f.chooses(d))
                .map(Discovered::name)
                .collect()
        };
        assert_eq!(chosen("*"), ["pods", "nodes", "widgets.example.com"]);
        assert_eq!(
            chosen("*,secrets,-nodes"),
            ["pods", "secrets", "widgets.example.com"]
        );
        assert_eq!(chosen("widgets.example.com"), ["widgets.example.com"]);
        assert!(chosen("").is_empty());
        assert!(ResourceFilter::parse("Pods").is_err());
    }

    #[test]
    fn kinds_are_described_once() {
        let found = parse(DOC.as_bytes()).unwrap();
        let a = kind_of(&found[0]);
        let b = kind_of(&found[0].clone());
        assert!(std::ptr::eq(a, b));
        assert_eq!((a.kind, a.list_kind, a.plural), ("Pod", "PodList", "pods"));
        assert!(a.extra_fields.contains(&"spec.nodeName"));
        assert_eq!(a.prefix(Some("ns")), b"/registry/pods/ns/".to_vec());
    }
}
