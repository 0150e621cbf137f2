//! Strategic merge patch for the built-in kinds: a merge patch whose lists merge by the
//! strategies of `strategy.rs` (keyed lists item by item, sets by value, the rest whole),
//! with the directives kubectl sends: `$patch: replace|delete|merge`, `$retainKeys`,
//! `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>`.

use serde_json::{Map, Value};

use super::strategy::{MergeStrategies, Strategy, child};
use crate::status::ApiError;

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// Applies strategic merge patch `patch` to `original`, an object of the kind whose merge
/// strategies are `kind`.
pub fn apply(kind: MergeStrategies, original: &Value, patch: &Value) -> Result<Value, ApiError> {
    let (Value::Object(o), Value::Object(p)) = (original, patch) else {
        return Err(ApiError::bad_request(
            "error decoding patch: a strategic merge patch must be a JSON object",
        ));
    };
    match merge_map(kind, "", o, p).map_err(ApiError::bad_request)? {
        Some(m) => Ok(Value::Object(m)),
        None => Err(ApiError::bad_request(
            "a strategic merge patch may not delete the whole object",
        )),
    }
}

/// Merges `patch` into `orig`; `None` when the patch says `$patch: delete`.
fn merge_map(
    kind: MergeStrategies,
    path: &str,
    orig: &Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<Option<Map<String, Value>>, String> {
    match patch.get(PATCH) {
        None => {}
        Some(Value::String(s)) if s == "merge" => {}
        Some(Value::String(s)) if s == "delete" => return Ok(None),
        Some(Value::String(s)) if s == "replace" => {
            let mut rest = patch.clone();
            rest.remove(PATCH);
            return merge_map(kind, path, &Map::new(), &rest);
        }
        Some(other) => return Err(format!("Unknown patch type: {other} in map at {path:?}")),
    }
    let mut out = orig.clone();
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            let Value::Array(gone) = v else {
                return Err(format!("{k}: the value must be a list"));
            };
            if let Some(Value::Array(items)) = out.get_mut(field) {
                items.retain(|i| !gone.contains(i));
            }
        }
    }
    for (k, pv) in patch {
        if k.starts_with('$') {
            continue;
        }
        let cp = child(path, k);
        let strat = kind.get(&cp);
        match pv {
            Value::Null => {
                out.remove(k);
            }
            Value::Object(pm) if strat != Some(Strategy::Atomic) => {
                let base = out
                    .get(k)
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                match merge_map(kind, &cp, &base, pm)? {
                    Some(m) => out.insert(k.clone(), Value::Object(m)),
                    None => out.remove(k),
                };
            }
            Value::Array(items) => {
                let base = out
                    .get(k)
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let merged = match strat {
                    Some(Strategy::Keyed(key)) => merge_keyed(kind, &cp, &base, items, key)?,
                    Some(Strategy::Set) => merge_set(&base, items),
                    _ => items.clone(),
                };
                out.insert(k.clone(), Value::Array(merged));
            }
            other => {
                out.insert(k.clone(), other.clone());
            }
        }
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix(SET_ELEMENT_ORDER) {
            let Value::Array(order) = v else {
                return Err(format!("{k}: the value must be a list"));
            };
            let key = match kind.get(&child(path, field)) {
                Some(Strategy::Keyed(key)) => Some(key),
                _ => None,
            };
            if let Some(Value::Array(items)) = out.get_mut(field) {
                reorder(items, order, key);
            }
        }
    }
    match patch.get(RETAIN_KEYS) {
        None => {}
        Some(Value::Array(keep)) => {
            let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
            out.retain(|k, _| keep.contains(&k.as_str()));
        }
        Some(_) => {
            return Err(format!(
                "{RETAIN_KEYS} at {path:?} must be a list of strings"
            ));
        }
    }
    Ok(Some(out))
}

/// Merges a list of objects on `key`: items with the same key merge, `$patch: delete` items
/// remove theirs, new ones are appended, and a `{"$patch": "replace"}` item replaces all.
fn merge_keyed(
    kind: MergeStrategies,
    path: &str,
    base: &[Value],
    items: &[Value],
    key: &str,
) -> Result<Vec<Value>, String> {
    let replace = items
        .iter()
        .any(|i| i.get(PATCH).and_then(Value::as_str) == Some("replace"));
    let mut out: Vec<Value> = if replace { vec![] } else { base.to_vec() };
    for item in items {
        let Value::Object(im) = item else {
            return Err(format!(
                "{path}: expected a list of objects merged on {key:?}"
            ));
        };
        if replace && im.len() == 1 && im.contains_key(PATCH) {
            continue;
        }
        let Some(kv) = im.get(key) else {
            return Err(format!(
                "map: {item} does not contain declared merge key: {key}"
            ));
        };
        let pos = out.iter().position(|o| o.get(key) == Some(kv));
        if im.get(PATCH).and_then(Value::as_str) == Some("delete") {
            if let Some(p) = pos {
                out.remove(p);
            }
            continue;
        }
        let orig = pos
            .and_then(|p| out.get(p))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        match (merge_map(kind, path, &orig, im)?, pos) {
            (Some(m), Some(p)) => {
                if let Some(slot) = out.get_mut(p) {
                    *slot = Value::Object(m);
                }
            }
            (Some(m), None) => out.push(Value::Object(m)),
            (None, Some(p)) => {
                out.remove(p);
            }
            (None, None) => {}
        }
    }
    Ok(out)
}

/// A set of scalars: the union, in first-seen order.
fn merge_set(base: &[Value], items: &[Value]) -> Vec<Value> {
    let mut out = base.to_vec();
    for i in items {
        if !out.contains(i) {
            out.push(i.clone());
        }
    }
    out
}

/// Orders `items` as `order` lists them (by merge key for keyed lists); items the order does
/// not name keep their relative order after the named ones.
fn reorder(items: &mut Vec<Value>, order: &[Value], key: Option<&str>) {
    let rank = |item: &Value| {
        order.iter().position(|o| match key {
            Some(k) => o.get(k).is_some() && o.get(k) == item.get(k),
            None => o == item,
        })
    };
    let mut ranked: Vec<(usize, Value)> = items
        .drain(..)
        .enumerate()
        .map(|(i, v)| (rank(&v).unwrap_or(order.len().saturating_add(i)), v))
        .collect();
    ranked.sort_by_key(|(r, _)| *r);
    items.extend(ranked.into_iter().map(|(_, v)| v));
}
