//! OpenAPI v3 documents generated from the registry (`/openapi/v3` and one per group
//! version), so kubectl's validation, `kubectl explain` and schema-driven tools work.

use std::collections::BTreeMap;

use http::{Response, StatusCode};
use serde_json::{Value, json};
use svc_core::{ApiError, ResourceInfo, registry};

use crate::http::respond::{self, Body};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Schema names in Kubernetes' style (`io.k8s.api.core.v1.ServiceAccount`).
fn schema_name(r: &ResourceInfo) -> String {
    let group = if r.group.is_empty() {
        "core"
    } else {
        r.group.split('.').next().unwrap_or(r.group)
    };
    format!("io.svc.api.{group}.{}.{}", r.version, r.kind)
}

fn gvk(r: &ResourceInfo) -> Value {
    json!({"group": r.group, "version": r.version, "kind": r.kind})
}

fn string() -> Value {
    json!({"type": "string"})
}

fn string_map() -> Value {
    json!({"type": "object", "additionalProperties": {"type": "string"}})
}

fn object_meta() -> Value {
    json!({
        "type": "object",
        "description": "Standard object metadata.",
        "properties": {
            "name": string(), "generateName": string(), "namespace": string(),
            "selfLink": string(), "uid": string(), "resourceVersion": string(),
            "generation": {"type": "integer", "format": "int64"},
            "creationTimestamp": {"type": "string", "format": "date-time"},
            "deletionTimestamp": {"type": "string", "format": "date-time"},
            "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
            "labels": string_map(), "annotations": string_map(),
            "ownerReferences": {"type": "array", "items": {"type": "object", "properties": {
                "apiVersion": string(), "kind": string(), "name": string(), "uid": string(),
                "controller": {"type": "boolean"}, "blockOwnerDeletion": {"type": "boolean"}},
                "required": ["apiVersion", "kind", "name", "uid"]},
                "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uid"],
                "x-kubernetes-patch-merge-key": "uid", "x-kubernetes-patch-strategy": "merge"},
            "finalizers": {"type": "array", "items": string(), "x-kubernetes-list-type": "set",
                "x-kubernetes-patch-strategy": "merge"},
            "managedFields": {"type": "array", "items": {"type": "object", "properties": {
                "manager": string(), "operation": string(), "apiVersion": string(),
                "time": {"type": "string", "format": "date-time"}, "fieldsType": string(),
                "fieldsV1": {"type": "object"}, "subresource": string()}}},
        },
    })
}

fn list_meta() -> Value {
    json!({"type": "object", "properties": {
        "resourceVersion": string(), "continue": string(), "selfLink": string(),
        "remainingItemCount": {"type": "integer", "format": "int64"}}})
}

fn kind_schema(r: &ResourceInfo) -> Value {
    let mut props = json!({
        "apiVersion": string(),
        "kind": string(),
        "metadata": {"$ref": "#/components/schemas/ObjectMeta"},
    });
    if let (Some(p), Value::Object(extra)) = (props.as_object_mut(), (r.schema)()) {
        p.extend(extra);
    }
    json!({"type": "object", "properties": props, "x-kubernetes-group-version-kind": [gvk(r)]})
}

fn list_schema(r: &ResourceInfo) -> Value {
    json!({
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": string(), "kind": string(),
            "metadata": {"$ref": "#/components/schemas/ListMeta"},
            "items": {"type": "array", "items": {"$ref": format!("#/components/schemas/{}", schema_name(r))}},
        },
        "x-kubernetes-group-version-kind": [{"group": r.group, "version": r.version, "kind": r.list_kind}],
    })
}

fn query_params(names: &[&str]) -> Vec<Value> {
    names
        .iter()
        .map(|n| {
            let ty = match *n {
                "limit" | "timeoutSeconds" | "gracePeriodSeconds" => "integer",
                "watch"
                | "allowWatchBookmarks"
                | "sendInitialEvents"
                | "force"
                | "ignoreStoreReadErrorWithClusterBreakingPotential" => "boolean",
                _ => "string",
            };
            json!({"name": n, "in": "query", "schema": {"type": ty}, "uniqueItems": true})
        })
        .collect()
}

const LIST: &[&str] = &[
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "pretty",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
];
const WRITE: &[&str] = &["dryRun", "fieldManager", "fieldValidation", "pretty"];
const PATCH: &[&str] = &[
    "dryRun",
    "fieldManager",
    "fieldValidation",
    "pretty",
    "force",
];
const DELETE: &[&str] = &[
    "dryRun",
    "gracePeriodSeconds",
    "ignoreStoreReadErrorWithClusterBreakingPotential",
    "pretty",
    "propagationPolicy",
];

fn op(r: &ResourceInfo, action: &str, id: &str, params: &[&str], schema: &str) -> Value {
    json!({
        "operationId": format!("{id}{}", r.kind),
        "parameters": query_params(params),
        "responses": {"200": {"description": "OK", "content": {"application/json": {
            "schema": {"$ref": format!("#/components/schemas/{schema}")}}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk(r),
    })
}

fn paths(r: &ResourceInfo) -> Vec<(String, Value)> {
    let base = format!("/{}", gv_path(r.group, r.version));
    let scoped = if r.namespaced() {
        format!("{base}/namespaces/{{namespace}}/{}", r.plural)
    } else {
        format!("{base}/{}", r.plural)
    };
    let name = schema_name(r);
    let list_name = format!("{name}List");
    let path_params = |with_name: bool| {
        let mut p = Vec::new();
        if r.namespaced() {
            p.push(
                json!({"name": "namespace", "in": "path", "required": true, "schema": string()}),
            );
        }
        if with_name {
            p.push(json!({"name": "name", "in": "path", "required": true, "schema": string()}));
        }
        p
    };
    let mut out = vec![
        (
            scoped.clone(),
            json!({
                "get": op(r, "list", "list", LIST, &list_name),
                "post": op(r, "post", "create", WRITE, &name),
                "delete": op(r, "deletecollection", "deleteCollection", DELETE, "Status"),
                "parameters": path_params(false),
            }),
        ),
        (
            format!("{scoped}/{{name}}"),
            json!({
                "get": op(r, "get", "read", &["pretty"], &name),
                "put": op(r, "put", "replace", WRITE, &name),
                "patch": op(r, "patch", "patch", PATCH, &name),
                "delete": op(r, "delete", "delete", DELETE, &name),
                "parameters": path_params(true),
            }),
        ),
    ];
    if r.namespaced() {
        out.push((
            format!("{base}/{}", r.plural),
            json!({"get": op(r, "list", "listForAllNamespaces", LIST, &list_name)}),
        ));
    }
    for sub in r.subresources {
        let id = format!("{}{}", &sub.name[..1].to_uppercase(), &sub.name[1..]);
        let mut ops = json!({"parameters": path_params(true)});
        for (method, verb, action, prefix, params) in [
            ("get", "get", "get", "read", &["pretty"][..]),
            ("put", "update", "put", "replace", WRITE),
            ("patch", "patch", "patch", "patch", PATCH),
            ("post", "create", "post", "create", WRITE),
        ] {
            if sub.verbs.contains(&verb)
                && let Some(ops) = ops.as_object_mut()
            {
                ops.insert(
                    method.into(),
                    op(r, action, &format!("{prefix}{id}"), params, &name),
                );
            }
        }
        out.push((format!("{scoped}/{{name}}/{}", sub.name), ops));
    }
    // Only the operations the kind serves (a review is only created).
    for (path, ops) in &mut out {
        if path.contains("{name}/") {
            continue; // a subresource: its own verbs were applied above
        }
        let item = path.ends_with("{name}");
        for (method, verb) in [
            ("get", if item { "get" } else { "list" }),
            ("post", "create"),
            ("put", "update"),
            ("patch", "patch"),
            ("delete", if item { "delete" } else { "deletecollection" }),
        ] {
            if !r.verbs.contains(&verb)
                && let Some(m) = ops.as_object_mut()
            {
                m.remove(method);
            }
        }
    }
    out.retain(|(_, ops)| {
        ops.as_object()
            .is_some_and(|m| m.keys().any(|k| k != "parameters"))
    });
    out
}

pub(crate) fn document(group: &str, version: &str) -> Option<Value> {
    let types: Vec<&ResourceInfo> = registry::all()
        .iter()
        .copied()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if types.is_empty() {
        return None;
    }
    let mut all_paths = BTreeMap::new();
    let mut schemas = BTreeMap::new();
    schemas.insert("ObjectMeta".to_string(), object_meta());
    schemas.insert("ListMeta".to_string(), list_meta());
    schemas.insert(
        "Status".to_string(),
        json!({"type": "object", "properties": {
        "apiVersion": string(), "kind": string(), "status": string(), "message": string(),
        "reason": string(), "code": {"type": "integer"}, "details": {"type": "object"}}}),
    );
    for r in types {
        all_paths.extend(paths(r));
        schemas.insert(schema_name(r), kind_schema(r));
        schemas.insert(format!("{}List", schema_name(r)), list_schema(r));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "svc", "version": crate::http::discovery::version().get("gitVersion").cloned().unwrap_or_default()},
        "paths": all_paths,
        "components": {"schemas": schemas},
    }))
}

/// Every served group version, in the registry's order.
pub(crate) fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut gvs: Vec<(&str, &str)> = registry::all()
        .iter()
        .map(|r| (r.group, r.version))
        .collect();
    gvs.dedup();
    gvs
}

pub fn serve_index() -> Response<Body> {
    let mut paths = BTreeMap::new();
    for (g, v) in group_versions() {
        let p = gv_path(g, v);
        // The hash lets clients cache a document until it changes (the build version here).
        paths.insert(p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", env!("CARGO_PKG_VERSION"))}));
    }
    respond::json(StatusCode::OK, &json!({"paths": paths}), false)
}

pub fn serve_group_version(group: &str, version: &str) -> Response<Body> {
    match document(group, version) {
        Some(doc) => respond::json(StatusCode::OK, &doc, false),
        None => respond::error(&ApiError::NotFound(Default::default())),
    }
}
