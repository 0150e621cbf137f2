//! `/openapi/v2`: the Swagger 2.0 document, in JSON and in the protobuf form of
//! `gnostic`'s `openapi.v2.Document`, which client-go's `OpenAPISchema` asks for and kubectl
//! falls back to.
//!
//! It is derived from the OpenAPI v3 documents of `openapi.rs`, so both describe the same
//! kinds. kubectl checks a kind's PATCH operation in `/openapi/v3` to learn whether the server
//! validates fields itself; a kind that is only created (a `TokenReview`) has no PATCH there,
//! so kubectl reads this document and validates the object against its definition on the
//! client, as it does with kube-apiserver.
//!
//! The `fieldValidation` parameter is advertised in v3 only. kubectl's v2 check, when a kind
//! has no PATCH operation, falls back to asking whether the Namespace PATCH takes
//! `fieldValidation` and, if so, lists CustomResourceDefinitions to see whether the kind is
//! one; this server serves none, so that list would fail the whole command. Without the
//! parameter here, the v2 check answers "unsupported" and kubectl validates on the client
//! against the definitions below, the same outcome as against kube-apiserver. Kinds with a
//! PATCH operation are decided by v3, where server-side validation is advertised.

use std::sync::OnceLock;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde_json::{Map, Value, json};
use svc_core::ApiError;

use crate::http::openapi;
use crate::http::respond::{self, Body};

/// The protobuf media type as clients ask for it.
pub const PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
/// The other spelling, accepted too, and the one answered: `@` is not allowed in a media
/// type's subtype, so Go's `mime.ParseMediaType` (client-go) refuses the first one in a
/// `Content-Type`.
const PROTOBUF_ALT: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

struct Encoded {
    json: Bytes,
    protobuf: Bytes,
    /// One tag per representation, as each encoding is a different body.
    json_etag: String,
    protobuf_etag: String,
}

fn encoded() -> &'static Encoded {
    static DOC: OnceLock<Encoded> = OnceLock::new();
    DOC.get_or_init(|| {
        let doc = document();
        let mut json = serde_json::to_vec(&doc).unwrap_or_default();
        json.push(b'\n');
        let protobuf = encode_document(&doc);
        // The content decides the tag, so a client's cached copy stays valid across restarts
        // of the same build.
        let tag = |b: &[u8]| format!("\"{:016X}\"", fnv1a(b));
        Encoded {
            json_etag: tag(&json),
            protobuf_etag: tag(&protobuf),
            json: json.into(),
            protobuf: protobuf.into(),
        }
    })
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Which encoding an `Accept` header asks for: `Some(true)` protobuf, `Some(false)` JSON,
/// `None` neither (406). Quality values order the choices; the first listed wins a tie.
fn wants_protobuf(accept: Option<&str>) -> Option<bool> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(false);
    };
    let mut best: Option<(f32, bool)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|v| v.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        if q <= 0.0 {
            continue;
        }
        let choice = match essence.as_str() {
            PROTOBUF | PROTOBUF_ALT => true,
            "application/json" | "application/*" | "*/*" => false,
            _ => continue,
        };
        if best.is_none_or(|(bq, _)| q > bq) {
            best = Some((q, choice));
        }
    }
    best.map(|(_, p)| p)
}

/// Serves the document in the encoding `accept` asks for, or 304 when `if_none_match` holds
/// its current tag.
pub fn serve(accept: Option<&str>, if_none_match: Option<&str>) -> Response<Body> {
    let Some(protobuf) = wants_protobuf(accept) else {
        return respond::error(&ApiError::NotAcceptable(format!(
            "only the following media types are accepted: application/json, {PROTOBUF}"
        )));
    };
    let doc = encoded();
    let (content_type, body, etag) = if protobuf {
        (PROTOBUF_ALT, &doc.protobuf, &doc.protobuf_etag)
    } else {
        ("application/json", &doc.json, &doc.json_etag)
    };
    let mut resp = if if_none_match.is_some_and(|t| t.split(',').any(|t| t.trim() == etag)) {
        let mut r = respond::bytes_response(StatusCode::NOT_MODIFIED, content_type, Bytes::new());
        r.headers_mut().remove(header::CONTENT_LENGTH);
        r
    } else {
        respond::bytes_response(StatusCode::OK, content_type, body.clone())
    };
    let headers = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, v);
    }
    headers.insert(header::VARY, HeaderValue::from_static("Accept"));
    resp
}

// ---- the Swagger 2.0 document, from the v3 ones ----

/// The value at `path` in nested objects, or null.
fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    static NULL: Value = Value::Null;
    path.iter().try_fold(v, |v, k| v.get(*k)).unwrap_or(&NULL)
}

const CONSUMES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.svc.protobuf",
];
const PATCH_CONSUMES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];
const PRODUCES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.svc.protobuf",
];

fn document() -> Value {
    let mut paths = Map::new();
    let mut definitions = Map::new();
    for (g, v) in openapi::group_versions() {
        let Some(v3) = openapi::document(g, v) else {
            continue;
        };
        if let Some(p) = at(&v3, &["paths"]).as_object() {
            for (path, item) in p {
                paths.insert(path.clone(), path_item(item));
            }
        }
        if let Some(s) = at(&v3, &["components", "schemas"]).as_object() {
            for (name, schema) in s {
                definitions.insert(name.clone(), refs_to_definitions(schema.clone()));
            }
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "svc", "version": crate::http::discovery::version().get("gitVersion").cloned().unwrap_or_default()},
        "paths": paths,
        "definitions": definitions,
    })
}

/// `#/components/schemas/X` becomes `#/definitions/X`; keywords Swagger 2.0 lacks go.
fn refs_to_definitions(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| !matches!(k.as_str(), "nullable" | "oneOf" | "anyOf" | "not"))
                .map(|(k, v)| match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => {
                        let r = r.replace("#/components/schemas/", "#/definitions/");
                        (k, Value::String(r))
                    }
                    (_, v) => (k, refs_to_definitions(v)),
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(refs_to_definitions).collect()),
        other => other,
    }
}

fn parameter(p: &Value) -> Option<Value> {
    let name = at(p, &["name"]).as_str()?;
    if name == "fieldValidation" {
        return None; // see the module's documentation
    }
    let mut out = json!({
        "name": name,
        "in": at(p, &["in"]),
        "type": at(p, &["schema", "type"]).as_str().unwrap_or("string"),
    });
    for flag in ["required", "uniqueItems"] {
        if at(p, &[flag]) == &Value::Bool(true)
            && let Some(o) = out.as_object_mut()
        {
            o.insert(flag.into(), Value::Bool(true));
        }
    }
    Some(out)
}

fn parameters(v: &Value) -> Vec<Value> {
    v.as_array()
        .map(|a| a.iter().filter_map(parameter).collect())
        .unwrap_or_default()
}

fn operation(method: &str, op: &Value) -> Value {
    let mut params = parameters(at(op, &["parameters"]));
    let schema_ref = at(
        op,
        &["responses", "200", "content", "application/json", "schema"],
    )
    .clone();
    if matches!(method, "post" | "put" | "patch") {
        let schema = if method == "patch" {
            json!({"type": "object"})
        } else {
            refs_to_definitions(schema_ref.clone())
        };
        params.insert(
            0,
            json!({"name": "body", "in": "body", "required": true, "schema": schema}),
        );
    }
    let mut out = json!({
        "operationId": at(op, &["operationId"]),
        "consumes": if method == "patch" { PATCH_CONSUMES } else { CONSUMES },
        "produces": PRODUCES,
        "parameters": params,
        "responses": {"200": {"description": "OK", "schema": refs_to_definitions(schema_ref)}},
    });
    if let (Some(o), Some(src)) = (out.as_object_mut(), op.as_object()) {
        for (k, v) in src.iter().filter(|(k, _)| k.starts_with("x-")) {
            o.insert(k.clone(), v.clone());
        }
    }
    out
}

fn path_item(item: &Value) -> Value {
    let mut out = Map::new();
    if let Some(m) = item.as_object() {
        for (k, v) in m {
            match k.as_str() {
                "parameters" => {
                    out.insert(k.clone(), Value::Array(parameters(v)));
                }
                "get" | "put" | "post" | "delete" | "patch" => {
                    out.insert(k.clone(), operation(k, v));
                }
                _ => {}
            }
        }
    }
    Value::Object(out)
}

// ---- protobuf: gnostic's openapi.v2 messages, field numbers from OpenAPIv2.proto ----

fn key(buf: &mut Vec<u8>, field: u32, wire: u8) {
    varint(buf, u64::from(field << 3 | u32::from(wire)));
}

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn bytes_field(buf: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(buf, field, 2);
    varint(buf, b.len() as u64);
    buf.extend_from_slice(b);
}

fn string(buf: &mut Vec<u8>, field: u32, v: &Value) {
    if let Some(s) = v.as_str().filter(|s| !s.is_empty()) {
        bytes_field(buf, field, s.as_bytes());
    }
}

fn boolean(buf: &mut Vec<u8>, field: u32, v: &Value) {
    if v.as_bool() == Some(true) {
        key(buf, field, 0);
        buf.push(1);
    }
}

fn int64(buf: &mut Vec<u8>, field: u32, v: &Value) {
    if let Some(n) = v.as_i64().filter(|n| *n != 0) {
        key(buf, field, 0);
        varint(buf, n as u64);
    }
}

fn double(buf: &mut Vec<u8>, field: u32, v: &Value) {
    if let Some(n) = v.as_f64().filter(|n| *n != 0.0) {
        key(buf, field, 1);
        buf.extend_from_slice(&n.to_le_bytes());
    }
}

fn message(buf: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    body(&mut inner);
    bytes_field(buf, field, &inner);
}

fn strings(buf: &mut Vec<u8>, field: u32, v: &Value) {
    for s in v.as_array().into_iter().flatten() {
        if let Some(s) = s.as_str() {
            bytes_field(buf, field, s.as_bytes());
        }
    }
}

/// `Any { yaml = 2 }`: JSON is YAML, and readers parse it with a YAML parser.
fn any(buf: &mut Vec<u8>, field: u32, v: &Value) {
    message(buf, field, |b| {
        bytes_field(b, 2, v.to_string().as_bytes());
    });
}

/// `repeated NamedAny vendor_extension`: every `x-` key.
fn extensions(buf: &mut Vec<u8>, field: u32, m: &Map<String, Value>) {
    for (k, v) in m.iter().filter(|(k, _)| k.starts_with("x-")) {
        message(buf, field, |b| {
            bytes_field(b, 1, k.as_bytes());
            any(b, 2, v);
        });
    }
}

fn encode_document(doc: &Value) -> Vec<u8> {
    let mut buf = Vec::new();
    string(&mut buf, 1, at(doc, &["swagger"]));
    message(&mut buf, 2, |b| {
        string(b, 1, at(doc, &["info", "title"]));
        string(b, 2, at(doc, &["info", "version"]));
    });
    message(&mut buf, 8, |b| {
        for (name, item) in at(doc, &["paths"]).as_object().into_iter().flatten() {
            // Paths.path = 2: NamedPathItem { name = 1, value = 2 }
            message(b, 2, |b| {
                bytes_field(b, 1, name.as_bytes());
                message(b, 2, |b| encode_path_item(b, item));
            });
        }
    });
    message(&mut buf, 9, |b| {
        for (name, schema) in at(doc, &["definitions"]).as_object().into_iter().flatten() {
            // Definitions.additional_properties = 1: NamedSchema { name = 1, value = 2 }
            message(b, 1, |b| {
                bytes_field(b, 1, name.as_bytes());
                message(b, 2, |b| encode_schema(b, schema));
            });
        }
    });
    buf
}

fn encode_path_item(buf: &mut Vec<u8>, item: &Value) {
    for (method, field) in [
        ("get", 2),
        ("put", 3),
        ("post", 4),
        ("delete", 5),
        ("patch", 8),
    ] {
        if item.get(method).is_some() {
            message(buf, field, |b| encode_operation(b, at(item, &[method])));
        }
    }
    for p in at(item, &["parameters"]).as_array().into_iter().flatten() {
        message(buf, 9, |b| encode_parameter(b, p));
    }
}

fn encode_operation(buf: &mut Vec<u8>, op: &Value) {
    string(buf, 5, at(op, &["operationId"]));
    strings(buf, 6, at(op, &["produces"]));
    strings(buf, 7, at(op, &["consumes"]));
    for p in at(op, &["parameters"]).as_array().into_iter().flatten() {
        message(buf, 8, |b| encode_parameter(b, p));
    }
    message(buf, 9, |b| {
        for (code, resp) in at(op, &["responses"]).as_object().into_iter().flatten() {
            // Responses.response_code = 1: NamedResponseValue { name = 1, value = 2 }
            message(b, 1, |b| {
                bytes_field(b, 1, code.as_bytes());
                // ResponseValue.response = 1: Response { description = 1, schema = 2 }
                message(b, 2, |b| {
                    message(b, 1, |b| {
                        string(b, 1, at(resp, &["description"]));
                        if resp.get("schema").is_some() {
                            // SchemaItem.schema = 1
                            message(b, 2, |b| {
                                message(b, 1, |b| encode_schema(b, at(resp, &["schema"])))
                            });
                        }
                    });
                });
            });
        }
    });
    if let Some(m) = op.as_object() {
        extensions(buf, 13, m);
    }
}

/// `ParametersItem.parameter = 1`: a body parameter (`Parameter.body_parameter = 1`) or a
/// query or path one (`Parameter.non_body_parameter = 2`).
fn encode_parameter(buf: &mut Vec<u8>, p: &Value) {
    message(buf, 1, |b| {
        if at(p, &["in"]) == "body" {
            message(b, 1, |b| {
                string(b, 2, at(p, &["name"]));
                string(b, 3, at(p, &["in"]));
                boolean(b, 4, at(p, &["required"]));
                message(b, 5, |b| encode_schema(b, at(p, &["schema"])));
            });
            return;
        }
        message(b, 2, |b| {
            if at(p, &["in"]) == "path" {
                // PathParameterSubSchema: required 1, in 2, name 4, type 5
                message(b, 4, |b| {
                    boolean(b, 1, at(p, &["required"]));
                    string(b, 2, at(p, &["in"]));
                    string(b, 4, at(p, &["name"]));
                    string(b, 5, at(p, &["type"]));
                });
            } else {
                // QueryParameterSubSchema: required 1, in 2, name 4, type 6, unique_items 20
                message(b, 3, |b| {
                    boolean(b, 1, at(p, &["required"]));
                    string(b, 2, at(p, &["in"]));
                    string(b, 4, at(p, &["name"]));
                    string(b, 6, at(p, &["type"]));
                    boolean(b, 20, at(p, &["uniqueItems"]));
                });
            }
        });
    });
}

fn encode_schema(buf: &mut Vec<u8>, s: &Value) {
    let Some(m) = s.as_object() else {
        return;
    };
    string(buf, 1, at(s, &["$ref"]));
    string(buf, 2, at(s, &["format"]));
    string(buf, 3, at(s, &["title"]));
    string(buf, 4, at(s, &["description"]));
    if let Some(d) = m.get("default") {
        any(buf, 5, d);
    }
    double(buf, 7, at(s, &["maximum"]));
    double(buf, 9, at(s, &["minimum"]));
    int64(buf, 11, at(s, &["maxLength"]));
    int64(buf, 12, at(s, &["minLength"]));
    string(buf, 13, at(s, &["pattern"]));
    int64(buf, 14, at(s, &["maxItems"]));
    int64(buf, 15, at(s, &["minItems"]));
    boolean(buf, 16, at(s, &["uniqueItems"]));
    strings(buf, 19, at(s, &["required"]));
    for e in at(s, &["enum"]).as_array().into_iter().flatten() {
        any(buf, 20, e);
    }
    match m.get("additionalProperties") {
        Some(Value::Bool(b)) => message(buf, 21, |w| {
            key(w, 2, 0);
            w.push(u8::from(*b));
        }),
        Some(sub @ Value::Object(_)) => {
            message(buf, 21, |w| message(w, 1, |w| encode_schema(w, sub)))
        }
        _ => {}
    }
    match m.get("type") {
        Some(t @ Value::String(_)) => message(buf, 22, |w| string(w, 1, t)),
        Some(ts @ Value::Array(_)) => message(buf, 22, |w| strings(w, 1, ts)),
        _ => {}
    }
    match m.get("items") {
        Some(one @ Value::Object(_)) => {
            message(buf, 23, |w| message(w, 1, |w| encode_schema(w, one)))
        }
        Some(Value::Array(many)) => message(buf, 23, |w| {
            for one in many {
                message(w, 1, |w| encode_schema(w, one));
            }
        }),
        _ => {}
    }
    for sub in at(s, &["allOf"]).as_array().into_iter().flatten() {
        message(buf, 24, |w| encode_schema(w, sub));
    }
    if let Some(props) = m.get("properties").and_then(Value::as_object) {
        message(buf, 25, |w| {
            for (name, sub) in props {
                message(w, 1, |w| {
                    bytes_field(w, 1, name.as_bytes());
                    message(w, 2, |w| encode_schema(w, sub));
                });
            }
        });
    }
    boolean(buf, 27, at(s, &["readOnly"]));
    extensions(buf, 31, m);
}

#[cfg(test)]
mod tests {
    use super::*;
    use svc_core::registry;

    #[test]
    fn negotiates_protobuf_json_or_nothing() {
        assert_eq!(wants_protobuf(None), Some(false));
        assert_eq!(wants_protobuf(Some(PROTOBUF)), Some(true));
        assert_eq!(wants_protobuf(Some(PROTOBUF_ALT)), Some(true));
        assert_eq!(wants_protobuf(Some("application/json")), Some(false));
        assert_eq!(
            wants_protobuf(Some(&format!("application/json;q=0.5, {PROTOBUF}"))),
            Some(true)
        );
        assert_eq!(
            wants_protobuf(Some(&format!("{PROTOBUF};q=0, */*"))),
            Some(false)
        );
        assert_eq!(wants_protobuf(Some("text/html")), None);
    }

    #[test]
    fn answers_each_encoding_with_its_own_tag_and_304_when_it_matches() {
        let pb = serve(Some(PROTOBUF), None);
        assert_eq!(pb.status(), StatusCode::OK);
        assert_eq!(pb.headers()[header::CONTENT_TYPE], PROTOBUF_ALT);
        let tag = pb.headers()[header::ETAG].to_str().unwrap().to_string();
        let js = serve(Some("application/json"), None);
        assert_eq!(js.headers()[header::CONTENT_TYPE], "application/json");
        assert_ne!(js.headers()[header::ETAG], tag.as_str());
        let again = serve(Some(PROTOBUF), Some(&tag));
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(again.headers()[header::CONTENT_TYPE], PROTOBUF_ALT);
        assert_eq!(
            serve(Some("application/json"), Some(&tag)).status(),
            StatusCode::OK
        );
        assert_eq!(
            serve(Some("text/html"), None).status(),
            StatusCode::NOT_ACCEPTABLE
        );
    }

    #[test]
    fn every_kind_has_a_definition_with_its_group_version_kind() {
        let doc = document();
        for r in registry::all() {
            let found = doc["definitions"].as_object().unwrap().values().any(|d| {
                d["x-kubernetes-group-version-kind"]
                    .as_array()
                    .is_some_and(|a| {
                        a.iter()
                            .any(|g| g["kind"] == r.kind && g["group"] == r.group)
                    })
            });
            assert!(found, "no definition for {}", r.kind);
        }
        let text = doc.to_string();
        assert!(!text.contains("#/components/"), "a v3 reference is left");
        assert!(!text.contains("fieldValidation"));
    }

    #[test]
    fn a_create_only_kind_has_no_patch_and_a_body_parameter() {
        let doc = document();
        let (_, item) = doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(p, _)| p.ends_with("/tokenreviews"))
            .expect("tokenreviews path");
        assert!(item.get("patch").is_none());
        let post = &item["post"];
        assert_eq!(post["parameters"][0]["in"], "body");
        assert!(
            post["parameters"][0]["schema"]["$ref"]
                .as_str()
                .unwrap()
                .starts_with("#/definitions/")
        );
        assert_eq!(
            post["x-kubernetes-group-version-kind"]["kind"],
            "TokenReview"
        );
    }

    #[test]
    fn protobuf_is_well_formed() {
        // Walk the top level: every field is a known tag with a length that fits.
        let bytes = encode_document(&document());
        let (mut i, mut seen) = (0, Vec::new());
        while i < bytes.len() {
            let (k, n) = read_varint(&bytes[i..]);
            i += n;
            assert_eq!(k & 7, 2, "top-level fields are length-delimited");
            let (len, n) = read_varint(&bytes[i..]);
            i += n + len as usize;
            seen.push(k >> 3);
        }
        assert_eq!(i, bytes.len());
        assert_eq!(seen, vec![1, 2, 8, 9]);
    }

    fn read_varint(b: &[u8]) -> (u64, usize) {
        let mut v = 0u64;
        for (i, byte) in (0u32..).zip(b) {
            v |= u64::from(byte & 0x7f).wrapping_shl(i.wrapping_mul(7));
            if byte & 0x80 == 0 {
                return (v, i.wrapping_add(1) as usize);
            }
        }
        panic!("truncated varint");
    }
}
