//! Field sets: the paths of an object a manager owns, and their `FieldsV1` encoding
//! (`{"f:metadata":{"f:labels":{".":{},"f:app":{}}}}`): `f:<name>` a field, `k:<json>` a list
//! item by its key, `v:<json>` a set item by value, `i:<n>` an item by position, and `.` the
//! node itself when it also has children.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

use super::strategy::{MergeStrategies, Strategy, child};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathElement {
    Field(String),
    /// The canonical JSON of the item's key fields (`{"name":"a"}`).
    Key(String),
    /// The canonical JSON of a set item.
    Value(String),
    Index(usize),
}

impl PathElement {
    fn encode(&self) -> String {
        match self {
            PathElement::Field(f) => format!("f:{f}"),
            PathElement::Key(k) => format!("k:{k}"),
            PathElement::Value(v) => format!("v:{v}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    fn decode(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid FieldsV1 path element {s:?}");
        let (tag, rest) = s.split_once(':').ok_or_else(bad)?;
        let json = |r: &str| -> Result<String, String> {
            let v: Value = serde_json::from_str(r).map_err(|_| bad())?;
            Ok(v.to_string())
        };
        match tag {
            "f" => Ok(PathElement::Field(rest.to_string())),
            "k" => Ok(PathElement::Key(json(rest)?)),
            "v" => Ok(PathElement::Value(json(rest)?)),
            "i" => rest.parse().map(PathElement::Index).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

/// A path from the object root, printed as Kubernetes prints it in conflicts:
/// `.metadata.labels.app`, `.secrets[name="a"].name`, `.metadata.finalizers[="x"]`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Path(pub Vec<PathElement>);

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for pe in &self.0 {
            match pe {
                PathElement::Field(name) => write!(f, ".{name}")?,
                PathElement::Key(k) => {
                    let parts: Vec<String> = match serde_json::from_str::<Map<String, Value>>(k) {
                        Ok(m) => m.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                        Err(_) => vec![k.clone()],
                    };
                    write!(f, "[{}]", parts.join(","))?;
                }
                PathElement::Value(v) => write!(f, "[={v}]")?,
                PathElement::Index(i) => write!(f, "[{i}]")?,
            }
        }
        Ok(())
    }
}

impl Path {
    pub fn fields(names: &[&str]) -> Path {
        Path(
            names
                .iter()
                .map(|n| PathElement::Field(n.to_string()))
                .collect(),
        )
    }

    pub fn starts_with(&self, prefix: &Path) -> bool {
        self.0.starts_with(&prefix.0)
    }
}

/// A set of paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet(pub BTreeSet<Path>);

impl FieldSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn contains(&self, p: &Path) -> bool {
        self.0.contains(p)
    }
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.union(&other.0).cloned().collect())
    }
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.difference(&other.0).cloned().collect())
    }
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.intersection(&other.0).cloned().collect())
    }
    /// Whether `p` or any path below it is in the set.
    pub fn has_prefix(&self, p: &Path) -> bool {
        self.0
            .range(p.clone()..)
            .next()
            .is_some_and(|q| q.starts_with(p))
    }

    /// The `FieldsV1` JSON of the set.
    pub fn to_fields_v1(&self) -> Value {
        let mut root = Map::new();
        'paths: for path in &self.0 {
            let mut node = &mut root;
            for pe in &path.0 {
                // Every value this builds is an object, so the `else` is never taken.
                let Some(child) = node
                    .entry(pe.encode())
                    .or_insert_with(|| Value::Object(Map::new()))
                    .as_object_mut()
                else {
                    continue 'paths;
                };
                node = child;
            }
            node.insert(".".into(), Value::Object(Map::new()));
        }
        fn collapse(m: &mut Map<String, Value>) {
            for v in m.values_mut() {
                if let Value::Object(c) = v {
                    collapse(c);
                    if c.len() == 1 && c.contains_key(".") {
                        c.clear();
                    }
                }
            }
        }
        collapse(&mut root);
        root.remove(".");
        Value::Object(root)
    }

    /// Parses `FieldsV1` JSON.
    pub fn from_fields_v1(v: &Value) -> Result<FieldSet, String> {
        fn walk(
            m: &Map<String, Value>,
            path: &mut Vec<PathElement>,
            out: &mut BTreeSet<Path>,
        ) -> Result<(), String> {
            for (k, c) in m {
                if k == "." {
                    out.insert(Path(path.clone()));
                    continue;
                }
                let Value::Object(cm) = c else {
                    return Err(format!("FieldsV1 node {k:?} is not an object"));
                };
                path.push(PathElement::decode(k)?);
                if cm.is_empty() {
                    out.insert(Path(path.clone()));
                } else {
                    walk(cm, path, out)?;
                }
                path.pop();
            }
            Ok(())
        }
        let Value::Object(m) = v else {
            return Err("FieldsV1 must be an object".into());
        };
        let mut out = BTreeSet::new();
        walk(m, &mut vec![], &mut out)?;
        Ok(FieldSet(out))
    }
}

/// Paths the server owns; they are never in a manager's set (Kubernetes' strip set).
const STRIPPED: &[&[&str]] = &[
    &["apiVersion"],
    &["kind"],
    &["metadata", "name"],
    &["metadata", "namespace"],
    &["metadata", "generateName"],
    &["metadata", "uid"],
    &["metadata", "resourceVersion"],
    &["metadata", "generation"],
    &["metadata", "creationTimestamp"],
    &["metadata", "deletionTimestamp"],
    &["metadata", "deletionGracePeriodSeconds"],
    &["metadata", "selfLink"],
    &["metadata", "managedFields"],
    // Status is reset on writes to the main resource, so nobody owns it there.
    &["status"],
];

fn stripped(p: &Path) -> bool {
    p.0 == [PathElement::Field("metadata".into())]
        || STRIPPED.iter().any(|s| p.starts_with(&Path::fields(s)))
}

/// The field set of an applied configuration, by the rules of structured-merge-diff's
/// `ToFieldSet`: scalars, atomic values, list items and free-form map entries are members;
/// struct fields holding a non-empty object are only parents.
pub fn to_field_set(kind: MergeStrategies, v: &Value) -> FieldSet {
    let mut out = BTreeSet::new();
    walk(kind, "", v, &mut vec![], &mut out, false);
    FieldSet(out.into_iter().filter(|p| !stripped(p)).collect())
}

/// Every path that holds a value, parents included: what `compare` diffs.
pub fn all_paths(kind: MergeStrategies, v: &Value) -> FieldSet {
    let mut out = BTreeSet::new();
    walk(kind, "", v, &mut vec![], &mut out, true);
    FieldSet(out.into_iter().filter(|p| !stripped(p)).collect())
}

fn walk(
    kind: MergeStrategies,
    spath: &str,
    v: &Value,
    prefix: &mut Vec<PathElement>,
    out: &mut BTreeSet<Path>,
    full: bool,
) {
    let strat = kind.get(spath);
    match v {
        Value::Object(m) => {
            if strat == Some(Strategy::Atomic) {
                out.insert(Path(prefix.clone()));
                return;
            }
            for (k, c) in m {
                prefix.push(PathElement::Field(k.clone()));
                walk(kind, &child(spath, k), c, prefix, out, full);
                let empty = c.is_null() || c.as_object().is_some_and(Map::is_empty);
                if full || empty || strat == Some(Strategy::Map) {
                    out.insert(Path(prefix.clone()));
                }
                prefix.pop();
            }
        }
        Value::Array(items) => match strat {
            Some(Strategy::Keyed(key)) => {
                for item in items {
                    let Some(pe) = key_element(item, key) else {
                        continue;
                    };
                    prefix.push(pe);
                    walk(kind, spath, item, prefix, out, full);
                    out.insert(Path(prefix.clone()));
                    prefix.pop();
                }
            }
            Some(Strategy::Set) => {
                for item in items {
                    prefix.push(PathElement::Value(item.to_string()));
                    out.insert(Path(prefix.clone()));
                    prefix.pop();
                }
            }
            _ => {
                out.insert(Path(prefix.clone()));
            }
        },
        _ => {
            out.insert(Path(prefix.clone()));
        }
    }
}

/// The `k:` element of a keyed-list item, `None` when the item lacks its key.
pub fn key_element(item: &Value, key: &str) -> Option<PathElement> {
    let kv = item.get(key)?;
    let mut m = Map::new();
    m.insert(key.to_string(), kv.clone());
    Some(PathElement::Key(Value::Object(m).to_string()))
}

/// Whether list `item` is the one `pe` names.
fn item_matches(item: &Value, pe: &PathElement) -> bool {
    match pe {
        PathElement::Key(k) => match serde_json::from_str::<Map<String, Value>>(k) {
            Ok(keys) => keys.iter().all(|(k, v)| item.get(k) == Some(v)),
            Err(_) => false,
        },
        PathElement::Value(s) => serde_json::from_str::<Value>(s).is_ok_and(|v| &v == item),
        _ => false,
    }
}

/// The value at `p`, if present.
pub fn value_at<'a>(v: &'a Value, p: &Path) -> Option<&'a Value> {
    let mut cur = v;
    for pe in &p.0 {
        cur = match (pe, cur) {
            (PathElement::Field(f), Value::Object(m)) => m.get(f)?,
            (PathElement::Index(i), Value::Array(a)) => a.get(*i)?,
            (pe, Value::Array(a)) => a.iter().find(|i| item_matches(i, pe))?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Removes the value at `p`; false when there was none.
pub fn remove_at(v: &mut Value, p: &Path) -> bool {
    let Some((last, parent)) = p.0.split_last() else {
        return false;
    };
    let mut cur = v;
    for pe in parent {
        let next = match (pe, cur) {
            (PathElement::Field(f), Value::Object(m)) => m.get_mut(f),
            (PathElement::Index(i), Value::Array(a)) => a.get_mut(*i),
            (pe, Value::Array(a)) => a.iter_mut().find(|i| item_matches(i, pe)),
            _ => None,
        };
        match next {
            Some(n) => cur = n,
            None => return false,
        }
    }
    match (last, cur) {
        (PathElement::Field(f), Value::Object(m)) => m.remove(f).is_some(),
        (PathElement::Index(i), Value::Array(a)) if *i < a.len() => {
            a.remove(*i);
            true
        }
        (pe, Value::Array(a)) => {
            let before = a.len();
            a.retain(|i| !item_matches(i, pe));
            a.len() != before
        }
        _ => false,
    }
}
