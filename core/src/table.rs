//! The `Table` representation (`meta.svc.io/v1`): rows of cells for kinds without their own
//! columns (`Name`, `Created At`), each row with the object as `includeObject` asks.

use serde_json::{Value, json};

use crate::meta::ListMeta;
use crate::status::ApiError;

pub const TABLE_API_VERSION: &str = "meta.svc.io/v1";

/// What each row carries besides its cells (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    /// A `PartialObjectMetadata` (the default, as in Kubernetes).
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(v: Option<&str>) -> Result<Self, ApiError> {
        match v {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(ApiError::bad_request(format!(
                "includeObject: Unsupported value: {other:?}: supported values: \"None\", \
                 \"Metadata\", \"Object\""
            ))),
        }
    }
}

fn columns() -> Value {
    json!([
        {"name": "Name", "type": "string", "format": "name", "priority": 0,
         "description": "Name must be unique within a namespace. It is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically."},
        {"name": "Created At", "type": "date", "format": "", "priority": 0,
         "description": "CreationTimestamp is a timestamp representing the server time when this object was created."},
    ])
}

fn row(object: Value, include: IncludeObject) -> Value {
    let meta = object.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let cells = json!([
        meta.get("name")
            .cloned()
            .unwrap_or(Value::String(String::new())),
        meta.get("creationTimestamp")
            .cloned()
            .unwrap_or(Value::Null),
    ]);
    let mut r = json!({"cells": cells});
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            r["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": TABLE_API_VERSION, "metadata": meta});
        }
        IncludeObject::Object => r["object"] = object,
    }
    r
}

/// A table of the objects given as JSON values, with the list's metadata.
pub fn table(meta: &ListMeta, objects: Vec<Value>, include: IncludeObject) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": TABLE_API_VERSION,
        "metadata": meta,
        "columnDefinitions": columns(),
        "rows": objects.into_iter().map(|o| row(o, include)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_columns_and_rows() {
        let obj = json!({"kind": "ServiceAccount", "metadata": {"name": "a", "creationTimestamp": "2024-01-02T03:04:05Z", "uid": "u"}});
        let meta = ListMeta {
            resource_version: "7".into(),
            ..Default::default()
        };
        let t = table(&meta, vec![obj.clone()], IncludeObject::Metadata);
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["apiVersion"], "meta.svc.io/v1");
        assert_eq!(t["columnDefinitions"][0]["name"], "Name");
        assert_eq!(t["columnDefinitions"][1]["type"], "date");
        assert_eq!(t["rows"][0]["cells"], json!(["a", "2024-01-02T03:04:05Z"]));
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["rows"][0]["object"]["metadata"]["uid"], "u");
        assert_eq!(t["metadata"]["resourceVersion"], "7");
        let none = table(&meta, vec![obj.clone()], IncludeObject::None);
        assert!(none["rows"][0].get("object").is_none());
        let full = table(&meta, vec![obj.clone()], IncludeObject::Object);
        assert_eq!(full["rows"][0]["object"], obj);
        assert!(IncludeObject::parse(Some("Everything")).is_err());
    }
}
