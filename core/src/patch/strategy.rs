//! Merge strategies: which maps are granular (labels), which lists are atomic, sets, or keyed
//! by a field. `metadata`'s are here; each kind declares its own in its `ResourceInfo`.
//! Strategic merge patch and server-side apply both read them, as Kubernetes derives both
//! from the same struct tags (`patchStrategy`/`patchMergeKey` and `listType`/`listMapKey`).
//!
//! The patch algorithms receive a kind's table as a `MergeStrategies` value, looked up once
//! by their caller (`ResourceInfo::strategies`); nothing here reaches the registry, so the
//! patch code sits below the kinds rather than in a circle with them.

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

/// A kind's declared merge strategies; metadata's, shared by every kind, are added on
/// lookup. The default is a kind that declares none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MergeStrategies {
    kind: &'static [(&'static str, Strategy)],
}

impl MergeStrategies {
    /// The strategies of a kind whose own table is `kind` (`ResourceInfo.merge_strategies`).
    pub const fn new(kind: &'static [(&'static str, Strategy)]) -> Self {
        MergeStrategies { kind }
    }

    /// The declared strategy of the field at `path` (dotted field names), if any.
    pub fn get(&self, path: &str) -> Option<Strategy> {
        OBJECT_META
            .iter()
            .chain(self.kind)
            .find(|(p, _)| *p == path)
            .map(|(_, s)| *s)
    }
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
        const SA: MergeStrategies = MergeStrategies::new(&[
            ("secrets", Strategy::Keyed("name")),
            ("imagePullSecrets", Strategy::Atomic),
        ]);
        assert_eq!(SA.get("secrets"), Some(Strategy::Keyed("name")));
        assert_eq!(SA.get("imagePullSecrets"), Some(Strategy::Atomic));
        let none = MergeStrategies::default();
        assert_eq!(none.get("metadata.finalizers"), Some(Strategy::Set));
        assert_eq!(none.get("secrets"), None);
        assert_eq!(child("", "metadata"), "metadata");
        assert_eq!(child("metadata", "labels"), "metadata.labels");
    }
}
