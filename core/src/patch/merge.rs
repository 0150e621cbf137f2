//! JSON merge patch (RFC 7386): objects merge key by key, `null` deletes, everything else
//! (arrays included) replaces. `create` computes the patch that turns one value into another.

use serde_json::{Map, Value};

/// Applies merge patch `patch` to `target`.
pub fn apply(target: &Value, patch: &Value) -> Value {
    let Value::Object(p) = patch else {
        return patch.clone();
    };
    let mut out = match target {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    for (k, v) in p {
        if v.is_null() {
            out.remove(k);
        } else {
            let merged = apply(out.get(k).unwrap_or(&Value::Null), v);
            out.insert(k.clone(), merged);
        }
    }
    Value::Object(out)
}

/// The merge patch that turns `from` into `to`: `apply(from, &create(from, to)) == to` for
/// every `to` free of `null`s inside objects (RFC 7386 cannot set a member to `null`).
pub fn create(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => {
            let mut patch = Map::new();
            for k in a.keys() {
                if !b.contains_key(k) {
                    patch.insert(k.clone(), Value::Null);
                }
            }
            for (k, bv) in b {
                match a.get(k) {
                    Some(av) if av == bv => {}
                    Some(av @ Value::Object(_)) if bv.is_object() => {
                        patch.insert(k.clone(), create(av, bv));
                    }
                    _ => {
                        patch.insert(k.clone(), bv.clone());
                    }
                }
            }
            Value::Object(patch)
        }
        _ => to.clone(),
    }
}
