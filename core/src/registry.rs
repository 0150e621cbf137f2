//! The resource registry: every served type, looked up by group, version and plural name.

use crate::kinds::{Namespace, ServiceAccount};
use crate::resource::{Resource, ResourceInfo};

/// Every served resource type, in discovery order.
pub fn all() -> &'static [&'static ResourceInfo] {
    static ALL: [&ResourceInfo; 2] = [Namespace::INFO, ServiceAccount::INFO];
    &ALL
}

/// The type served at `/api/v1/<plural>` (group "") or `/apis/<group>/<version>/<plural>`.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    all()
        .iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The API groups served under `/apis` (the core group is served at `/api`), with versions.
pub fn groups() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for r in all().iter().filter(|r| !r.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, vs)) if !vs.contains(&r.version) => vs.push(r.version),
            Some(_) => {}
            None => out.push((r.group, vec![r.version])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_namespaces_apart() {
        let sa = lookup("", "v1", "serviceaccounts").unwrap();
        assert_eq!(sa.key("ns", "a"), b"/registry/serviceaccounts/ns/a");
        assert_eq!(sa.prefix(Some("ns")), b"/registry/serviceaccounts/ns/");
        assert_eq!(sa.prefix(None), b"/registry/serviceaccounts/");
        let ns = lookup("", "v1", "namespaces").unwrap();
        assert_eq!(
            ns.key("", "kube-system"),
            b"/registry/namespaces/kube-system"
        );
        assert!(lookup("", "v1", "pods").is_none());
    }
}
