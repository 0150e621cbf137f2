//! `metadata.managedFields`: who owns which fields. `apply` is server-side apply (merge the
//! applied configuration, detect conflicts with other managers, take ownership, remove what
//! the manager stopped applying); `update` records a non-apply write as an `Update` entry.
//! The rules follow structured-merge-diff as the Kubernetes API server runs it.

use serde_json::{Map, Value};

use super::fieldset::{FieldSet, Path, all_paths, remove_at, to_field_set, value_at};
use super::strategy::{MergeStrategies, Strategy, child};
use crate::meta::{ManagedFieldsEntry, Time};
use crate::status::{ApiError, StatusCause};

pub const OPERATION_APPLY: &str = "Apply";
pub const OPERATION_UPDATE: &str = "Update";
pub const FIELDS_V1: &str = "FieldsV1";

/// Who is writing, and when; `kind` is the merge strategies of the object's kind.
#[derive(Clone, Debug)]
pub struct Writer<'a> {
    pub kind: MergeStrategies,
    pub api_version: &'a str,
    pub manager: &'a str,
    pub now: Time,
}

/// What a write changed, by path.
#[derive(Debug, Default)]
pub struct Comparison {
    pub added: FieldSet,
    pub removed: FieldSet,
    pub modified: FieldSet,
}

impl Comparison {
    pub fn changed(&self) -> FieldSet {
        self.added.union(&self.modified)
    }
}

/// Diffs two objects: paths only in `new`, only in `old`, and leaves whose value changed.
pub fn compare(kind: MergeStrategies, old: &Value, new: &Value) -> Comparison {
    let a = all_paths(kind, old);
    let b = all_paths(kind, new);
    let modified = FieldSet(
        a.0.intersection(&b.0)
            .filter(|p| match (value_at(old, p), value_at(new, p)) {
                (Some(Value::Object(x)), Some(Value::Object(y))) => {
                    // Structs differ through their children; only an emptied or filled object
                    // changes itself.
                    x.is_empty() != y.is_empty()
                }
                (x, y) => x != y,
            })
            .cloned()
            .collect(),
    );
    Comparison {
        added: b.difference(&a),
        removed: a.difference(&b),
        modified,
    }
}

/// A decoded entry: its identity and set.
#[derive(Clone, Debug)]
struct Owner {
    entry: ManagedFieldsEntry,
    set: FieldSet,
}

fn decode_entries(entries: &[ManagedFieldsEntry]) -> Result<Vec<Owner>, ApiError> {
    entries
        .iter()
        .map(|e| {
            let set = match &e.fields_v1 {
                Some(v) => FieldSet::from_fields_v1(v)
                    .map_err(|m| ApiError::bad_request(format!("metadata.managedFields: {m}")))?,
                None => FieldSet::default(),
            };
            Ok(Owner {
                entry: e.clone(),
                set,
            })
        })
        .collect()
}

fn encode_entries(owners: Vec<Owner>) -> Vec<ManagedFieldsEntry> {
    let mut entries: Vec<ManagedFieldsEntry> = owners
        .into_iter()
        .filter(|o| !o.set.is_empty())
        .map(|mut o| {
            o.entry.fields_type = FIELDS_V1.into();
            o.entry.fields_v1 = Some(o.set.to_fields_v1());
            o.entry
        })
        .collect();
    sort_entries(&mut entries);
    entries
}

/// Kubernetes' order of `managedFields` (`sortEncodedManagedFields`): by operation (`Apply`
/// before `Update`), then time in whole seconds (older first; none counts as 0), then manager,
/// then subresource.
fn sort_entries(entries: &mut [ManagedFieldsEntry]) {
    let seconds = |e: &ManagedFieldsEntry| e.time.as_ref().map_or(0, |t| t.0.unix_timestamp());
    entries.sort_by(|p, q| {
        p.operation
            .cmp(&q.operation)
            .then_with(|| seconds(p).cmp(&seconds(q)))
            .then_with(|| p.manager.cmp(&q.manager))
            .then_with(|| p.subresource.cmp(&q.subresource))
    });
}

fn is(o: &Owner, manager: &str, operation: &str) -> bool {
    o.entry.manager == manager && o.entry.operation == operation && o.entry.subresource.is_empty()
}

/// Whether a write's `managedFields` asks for a reset: exactly one empty entry.
pub fn is_reset(entries: &[ManagedFieldsEntry]) -> bool {
    matches!(entries, [only] if *only == ManagedFieldsEntry::default())
}

/// Records a non-apply write (create, update, non-apply patch) of `new` over `old` (`None` on
/// create). `body_entries` are the `managedFields` the writer sent: `[{}]` resets ownership
/// first, another non-empty list replaces it, an empty one keeps `current_entries`.
pub fn update(
    w: &Writer<'_>,
    old: Option<&Value>,
    new: &Value,
    current_entries: &[ManagedFieldsEntry],
    body_entries: &[ManagedFieldsEntry],
) -> Result<Vec<ManagedFieldsEntry>, ApiError> {
    let base: &[ManagedFieldsEntry] = if is_reset(body_entries) {
        &[]
    } else if !body_entries.is_empty() {
        body_entries
    } else {
        current_entries
    };
    let mut owners = decode_entries(base)?;
    let empty = Value::Object(Map::new());
    let cmp = compare(w.kind, old.unwrap_or(&empty), new);
    let changed = cmp.changed();
    if changed.is_empty() && cmp.removed.is_empty() {
        return Ok(encode_entries(owners));
    }
    for o in &mut owners {
        o.set = o.set.difference(&changed).difference(&cmp.removed);
    }
    let pos = owners
        .iter()
        .position(|o| is(o, w.manager, OPERATION_UPDATE));
    let idx = match pos {
        Some(i) => i,
        None => {
            owners.push(Owner {
                entry: ManagedFieldsEntry {
                    manager: w.manager.into(),
                    operation: OPERATION_UPDATE.into(),
                    ..Default::default()
                },
                set: FieldSet::default(),
            });
            owners.len().saturating_sub(1)
        }
    };
    let me = owners
        .get_mut(idx)
        .ok_or_else(|| ApiError::internal("managed fields: the writer's entry is missing"))?;
    me.set = me.set.union(&changed);
    me.entry.api_version = w.api_version.into();
    me.entry.time = Some(w.now);
    Ok(encode_entries(owners))
}

/// Server-side apply of `config` by `w.manager` onto `live` (the stored object, or a stub
/// with only name and namespace when the object is created). Returns the new object, with
/// the new `managedFields` set in its metadata.
pub fn apply(
    w: &Writer<'_>,
    live: &Value,
    config: &Value,
    entries: &[ManagedFieldsEntry],
    force: bool,
) -> Result<Value, ApiError> {
    check_applied_config(config)?;
    let mut owners = decode_entries(entries)?;
    let new_set = to_field_set(w.kind, config);
    let mut merged = merge(w.kind, "", live, config);
    let cmp = compare(w.kind, live, &merged);
    let changed = cmp.changed();
    take_from_others(&mut owners, w.manager, &changed, force)?;
    drop_no_longer_applied(&owners, w.manager, &new_set, &mut merged);

    let diff = compare(w.kind, live, &merged);
    let object_changed = !diff.changed().is_empty() || !diff.removed.is_empty();
    let removed = diff.removed;
    for o in &mut owners {
        o.set = o.set.difference(&removed);
    }
    record_apply(&mut owners, w, new_set, object_changed);
    let encoded = serde_json::to_value(encode_entries(owners)).map_err(ApiError::internal)?;
    if let Some(meta) = merged
        .as_object_mut()
        .and_then(|m| m.get_mut("metadata"))
        .and_then(Value::as_object_mut)
    {
        meta.insert("managedFields".into(), encoded);
    }
    Ok(merged)
}

/// An applied configuration is an object and leaves `managedFields` out.
fn check_applied_config(config: &Value) -> Result<(), ApiError> {
    if !config.is_object() {
        return Err(ApiError::bad_request(
            "an applied configuration must be an object",
        ));
    }
    if config
        .pointer("/metadata/managedFields")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    Ok(())
}

/// Fields `changed` that other managers own are a conflict unless `force`d, which takes them
/// from those managers.
fn take_from_others(
    owners: &mut [Owner],
    manager: &str,
    changed: &FieldSet,
    force: bool,
) -> Result<(), ApiError> {
    let mut conflicts: Vec<(String, Path)> = vec![];
    for o in owners.iter().filter(|o| !is(o, manager, OPERATION_APPLY)) {
        for p in &o.set.intersection(changed).0 {
            conflicts.push((print_manager(&o.entry), p.clone()));
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(conflicts));
    }
    for o in owners
        .iter_mut()
        .filter(|o| !is(o, manager, OPERATION_APPLY))
    {
        o.set = o.set.difference(changed);
    }
    Ok(())
}

/// Fields this manager applied before but not now are removed unless someone else owns
/// them (or something below them), or the new configuration still sets something below.
fn drop_no_longer_applied(owners: &[Owner], manager: &str, new_set: &FieldSet, merged: &mut Value) {
    let previous = owners
        .iter()
        .find(|o| is(o, manager, OPERATION_APPLY))
        .map(|o| o.set.clone())
        .unwrap_or_default();
    let others = owners
        .iter()
        .filter(|o| !is(o, manager, OPERATION_APPLY))
        .fold(FieldSet::default(), |acc, o| acc.union(&o.set));
    let mut dropped: Vec<Path> = previous
        .difference(new_set)
        .0
        .into_iter()
        .filter(|p| !others.has_prefix(p) && !new_set.has_prefix(p))
        .collect();
    // Shallowest first: an item goes before its fields, which are then gone with it (the
    // other order would strip the key an item is found by).
    dropped.sort_by_key(|p| p.0.len());
    for p in &dropped {
        remove_at(merged, p);
    }
}

/// Records this apply in the manager's entry, creating it on its first apply.
fn record_apply(owners: &mut Vec<Owner>, w: &Writer<'_>, new_set: FieldSet, object_changed: bool) {
    match owners
        .iter_mut()
        .find(|o| is(o, w.manager, OPERATION_APPLY))
    {
        Some(o) => {
            // An apply that changes neither the object nor what this manager owns keeps its
            // entry as it was, time included, so applying the same manifest again writes
            // nothing (no new resourceVersion, no watch event), as in Kubernetes.
            if object_changed || o.set != new_set || o.entry.api_version != w.api_version {
                o.entry.time = Some(w.now);
            }
            o.set = new_set;
            o.entry.api_version = w.api_version.into();
        }
        None => owners.push(Owner {
            entry: ManagedFieldsEntry {
                manager: w.manager.into(),
                operation: OPERATION_APPLY.into(),
                api_version: w.api_version.into(),
                time: Some(w.now),
                ..Default::default()
            },
            set: new_set,
        }),
    }
}

/// How Kubernetes names a manager in conflicts: `"mgr"` for appliers, `"mgr" using v1 at
/// <time>` for updaters.
fn print_manager(e: &ManagedFieldsEntry) -> String {
    let mut s = format!("{:?}", e.manager);
    if !e.subresource.is_empty() {
        s = format!("{s} with subresource {:?}", e.subresource);
    }
    if e.operation == OPERATION_UPDATE {
        s = match &e.time {
            Some(t) => format!("{s} using {} at {}", e.api_version, t.to_rfc3339()),
            None => format!("{s} using {}", e.api_version),
        };
    }
    s
}

/// The 409 Kubernetes returns for apply conflicts (`NewApplyConflict`).
fn conflict_error(conflicts: Vec<(String, Path)>) -> ApiError {
    let causes = conflicts
        .iter()
        .map(|(m, p)| StatusCause {
            reason: "FieldManagerConflict".into(),
            message: format!("conflict with {m}"),
            field: p.to_string(),
        })
        .collect();
    let message = if let [(m, p)] = conflicts.as_slice() {
        format!("Apply failed with 1 conflict: conflict with {m}: {p}")
    } else {
        let mut managers: Vec<&String> = conflicts.iter().map(|(m, _)| m).collect();
        managers.sort();
        managers.dedup();
        let mut lines = vec![];
        for m in managers {
            lines.push(format!("conflicts with {m}:"));
            for (_, p) in conflicts.iter().filter(|(x, _)| x == m) {
                lines.push(format!("- {p}"));
            }
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    ApiError::ApplyConflict { message, causes }
}

/// Merges an applied configuration into the live object: objects field by field, keyed
/// lists item by item, sets by value, everything else replaced. `null` removes.
pub fn merge(kind: MergeStrategies, path: &str, live: &Value, config: &Value) -> Value {
    match (live, config) {
        (Value::Object(l), Value::Object(c)) if kind.get(path) != Some(Strategy::Atomic) => {
            let mut out = l.clone();
            for (k, cv) in c {
                if cv.is_null() {
                    out.remove(k);
                    continue;
                }
                let merged = match out.get(k) {
                    Some(lv) => merge(kind, &child(path, k), lv, cv),
                    None => cv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(c)) => match kind.get(path) {
            Some(Strategy::Keyed(key)) => {
                let mut out = l.clone();
                for item in c {
                    match out
                        .iter_mut()
                        .find(|o| item.get(key).is_some() && o.get(key) == item.get(key))
                    {
                        Some(o) => *o = merge(kind, path, o, item),
                        None => out.push(item.clone()),
                    }
                }
                Value::Array(out)
            }
            Some(Strategy::Set) => {
                let mut out = l.clone();
                for item in c {
                    if !out.contains(item) {
                        out.push(item.clone());
                    }
                }
                Value::Array(out)
            }
            _ => config.clone(),
        },
        _ => config.clone(),
    }
}
