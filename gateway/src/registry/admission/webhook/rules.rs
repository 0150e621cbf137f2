//! Which webhooks a request reaches, as Kubernetes' `rules.Matcher` and its namespace and
//! object matchers decide: any rule matching operation, group, version, resource (with
//! subresource: `pods/status`, `*/status`, `pods/*`, `*`, `*/*`) and scope; then the
//! namespace selector (the namespace's labels; a Namespace's own labels; cluster-scoped
//! objects always match) and the object selector (the new or the old object's labels).

use std::collections::BTreeMap;

use serde_json::Value;
use svc_core::kinds::admission_registration::{LabelSelectorSpec, RuleWithOperations};
use svc_core::resource::Scope;

/// What matching reads of a request.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: &'a str,
    pub group: &'a str,
    pub version: &'a str,
    /// The plural (`namespaces`).
    pub resource: &'a str,
    /// Empty when the request is to the resource itself.
    pub subresource: &'a str,
    pub scope: Scope,
}

/// Whether `rule` covers the request (Kubernetes' `Matcher.Matches`).
pub fn rule_matches(rule: &RuleWithOperations, t: &Target<'_>) -> bool {
    let listed = |items: &[String], v: &str| items.iter().any(|i| i == "*" || i == v);
    listed(&rule.operations, t.operation)
        && listed(&rule.api_groups, t.group)
        && listed(&rule.api_versions, t.version)
        && rule.resources.iter().any(|r| {
            let (res, sub) = r.split_once('/').unwrap_or((r, ""));
            (res == "*" || res == t.resource) && (sub == "*" || sub == t.subresource)
        })
        && match rule.scope.as_deref() {
            None | Some("*") | Some("") => true,
            // Namespaces are cluster-scoped, whatever namespace their requests name.
            Some("Cluster") => t.scope == Scope::Cluster,
            Some("Namespaced") => t.scope == Scope::Namespaced,
            Some(_) => false,
        }
}

/// Whether any of `rules` covers the request.
pub fn rules_match(rules: &[RuleWithOperations], t: &Target<'_>) -> bool {
    rules.iter().any(|r| rule_matches(r, t))
}

/// The labels of an object's JSON (`metadata.labels`), `None` for a missing object.
pub fn labels_of(obj: Option<&Value>) -> Option<BTreeMap<String, String>> {
    let obj = obj?;
    let labels = obj
        .get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object);
    Some(
        labels
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
    )
}

/// The object selector: empty matches everything; otherwise the new or the old object must
/// match (a missing object never does).
pub fn object_selector_matches(
    sel: Option<&LabelSelectorSpec>,
    object: Option<&Value>,
    old: Option<&Value>,
) -> bool {
    let Some(sel) = sel.filter(|s| !s.is_empty()) else {
        return true;
    };
    [object, old]
        .into_iter()
        .any(|o| labels_of(o).is_some_and(|l| sel.matches(&l)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(
        ops: &[&str],
        groups: &[&str],
        versions: &[&str],
        res: &[&str],
        scope: Option<&str>,
    ) -> RuleWithOperations {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
        RuleWithOperations {
            operations: s(ops),
            api_groups: s(groups),
            api_versions: s(versions),
            resources: s(res),
            scope: scope.map(str::to_string),
        }
    }

    fn target<'a>(op: &'a str, resource: &'a str, sub: &'a str, scope: Scope) -> Target<'a> {
        Target {
            operation: op,
            group: "",
            version: "v1",
            resource,
            subresource: sub,
            scope,
        }
    }

    #[test]
    fn rules_match_as_kubernetes_matches_them() {
        let ns = Scope::Namespaced;
        let cl = Scope::Cluster;
        for (r, t, expected) in [
            (
                rule(&["CREATE"], &[""], &["v1"], &["pods"], None),
                target("CREATE", "pods", "", ns),
                true,
            ),
            (
                rule(&["CREATE"], &[""], &["v1"], &["pods"], None),
                target("UPDATE", "pods", "", ns),
                false,
            ),
            (
                rule(&["*"], &[""], &["v1"], &["pods"], None),
                target("DELETE", "pods", "", ns),
                true,
            ),
            (
                rule(&["CREATE"], &["apps"], &["v1"], &["pods"], None),
                target("CREATE", "pods", "", ns),
                false,
            ),
            (
                rule(&["CREATE"], &["*"], &["*"], &["pods"], None),
                target("CREATE", "pods", "", ns),
                true,
            ),
            (
                rule(&["CREATE"], &[""], &["v2"], &["pods"], None),
                target("CREATE", "pods", "", ns),
                false,
            ),
            // A plain resource does not cover its subresources; `*` neither.
            (
                rule(&["UPDATE"], &[""], &["v1"], &["pods"], None),
                target("UPDATE", "pods", "status", ns),
                false,
            ),
            (
                rule(&["UPDATE"], &[""], &["v1"], &["*"], None),
                target("UPDATE", "pods", "status", ns),
                false,
            ),
            (
                rule(&["UPDATE"], &[""], &["v1"], &["*"], None),
                target("UPDATE", "pods", "", ns),
                true,
            ),
            (
                rule(&["UPDATE"], &[""], &["v1"], &["pods/status"], None),
                target("UPDATE", "pods", "status", ns),
                true,
            ),
            (
                rule(&["UPDATE"], &[""], &["v1"], &["pods/status"], None),
                target("UPDATE", "pods", "", ns),
                false,
            ),
            (
                rule(&["UPDATE"], &[""], &["v1"], &["*/status"], None),
                target("UPDATE", "nodes", "status", cl),
                true,
            ),
            (
                rule(&["UPDATE"], &[""], &["v1"], &["*/status"], None),
                target("UPDATE", "pods", "log", ns),
                false,
            ),
            (
                rule(&["UPDATE"], &[""], &["v1"], &["pods/*"], None),
                target("UPDATE", "pods", "status", ns),
                true,
            ),
            (
                rule(&["UPDATE"], &[""], &["v1"], &["pods/*"], None),
                target("UPDATE", "pods", "", ns),
                true,
            ),
            (
                rule(&["UPDATE"], &[""], &["v1"], &["*/*"], None),
                target("UPDATE", "secrets", "x", ns),
                true,
            ),
            (
                rule(&["CREATE"], &[""], &["v1"], &["*"], Some("Cluster")),
                target("CREATE", "namespaces", "", cl),
                true,
            ),
            (
                rule(&["CREATE"], &[""], &["v1"], &["*"], Some("Cluster")),
                target("CREATE", "pods", "", ns),
                false,
            ),
            (
                rule(&["CREATE"], &[""], &["v1"], &["*"], Some("Namespaced")),
                target("CREATE", "namespaces", "", cl),
                false,
            ),
            (
                rule(&["CREATE"], &[""], &["v1"], &["*"], Some("Namespaced")),
                target("CREATE", "pods", "", ns),
                true,
            ),
            (
                rule(&["CREATE"], &[""], &["v1"], &["*"], Some("*")),
                target("CREATE", "pods", "", ns),
                true,
            ),
        ] {
            assert_eq!(rule_matches(&r, &t), expected, "{r:?} {t:?}");
        }
        assert!(!rules_match(&[], &target("CREATE", "pods", "", ns)));
    }

    #[test]
    fn the_object_selector_matches_the_new_or_the_old_object() {
        let sel: LabelSelectorSpec = serde_json::from_value(serde_json::json!({
            "matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}))
        .unwrap();
        let a = serde_json::json!({"metadata": {"labels": {"team": "a"}}});
        let b = serde_json::json!({"metadata": {"labels": {"team": "b"}}});
        let none = serde_json::json!({"metadata": {}});
        assert!(object_selector_matches(Some(&sel), Some(&a), None));
        assert!(object_selector_matches(Some(&sel), Some(&b), Some(&a)));
        assert!(!object_selector_matches(Some(&sel), Some(&b), None));
        assert!(!object_selector_matches(Some(&sel), Some(&none), None));
        assert!(!object_selector_matches(Some(&sel), None, None));
        assert!(object_selector_matches(
            Some(&LabelSelectorSpec::default()),
            None,
            None
        ));
        assert!(object_selector_matches(None, None, None));
        let not_in: LabelSelectorSpec = serde_json::from_value(serde_json::json!({
            "matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}],
            "matchLabels": {"tier": "web"}}))
        .unwrap();
        let web = serde_json::json!({"metadata": {"labels": {"tier": "web"}}});
        assert!(object_selector_matches(Some(&not_in), Some(&web), None));
        assert!(!object_selector_matches(Some(&not_in), Some(&b), None));
    }
}
