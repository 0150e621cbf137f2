//! Merge strategies: which maps are granular (labels), which lists are atomic, sets, or keyed
//! by a field. `metadata`'s are here; each kind declares its own in its `ResourceInfo`.
//! Strategic merge patch and server-side apply both read them, as Kubernetes derives both
//! from the same struct tags (`patchStrategy`/`patchMergeKey` and `listType`/`listMapKey`).

/// How a field is merged. Fields not in the table are structs (objects: merged field by
/// field) or atomic (lists and scalars: replaced whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// A map with free-form keys (`metadata.labels`): each entry is owned and merged apart.
    Map,
    /// A list of scalars merged as a set (`metadata.finalizers`).
    Set,
    /// A list of objects merged on a key field (`secrets` on `name`).
    Keyed(&'static str),
    /// Replaced whole (`imagePullSecrets`).
    Atomic,
}

/// Paths are field names joined by `.`; list items add nothing to the path, so
/// `secrets.name` is the `name` of every item of `secrets`.
const OBJECT_META: &[(&str, Strategy)] = &[
    ("metadata.labels", Strategy::Map),
    ("metadata.annotations", Strategy::Map),
    ("metadata.finalizers", Strategy::Set),
    ("metadata.ownerReferences", Strategy::Keyed("uid")),
    ("metadata.managedFields", Strategy::Atomic),
];

/// The declared strategy of the field at `path` (dotted field names) of `kind`, if any.
pub fn strategy(kind: &str, path: &str) -> Option<Strategy> {
    let kind_table = crate::registry::by_kind(kind).map_or(&[][..], |r| r.merge_strategies);
    OBJECT_META
        .iter()
        .chain(kind_table)
        .find(|(p, _)| *p == path)
        .map(|(_, s)| *s)
}

/// `path` extended by `field`.
pub fn child(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lookups() {
        assert_eq!(
            strategy("ServiceAccount", "secrets"),
            Some(Strategy::Keyed("name"))
        );
        assert_eq!(
            strategy("ServiceAccount", "imagePullSecrets"),
            Some(Strategy::Atomic)
        );
        assert_eq!(
            strategy("Namespace", "metadata.finalizers"),
            Some(Strategy::Set)
        );
        assert_eq!(strategy("Namespace", "secrets"), None);
        assert_eq!(child("", "metadata"), "metadata");
        assert_eq!(child("metadata", "labels"), "metadata.labels");
    }
}
