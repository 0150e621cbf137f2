//! The one strict decoder, for request bodies and configuration files alike: decoding a JSON
//! value into a type while collecting every field the type does not know, with its path
//! (`spec.foo`, `items[1].colour`), naming the path of a type error, and finding duplicate
//! keys in JSON. Request bodies turn what it finds into `fieldValidation=Strict|Warn|Ignore`
//! as Kubernetes does (`unknown field "spec.foo"`, `duplicate field "metadata.name"`);
//! svc-config turns it into field errors, always strict.

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::status::{ApiError, StatusCause};

/// The `fieldValidation` directive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    /// Parses the query parameter; Kubernetes' default is `Warn`. An unknown value is the
    /// cause of a 422 of the write's options (the caller knows which: `CreateOptions`, ...).
    pub fn parse(v: Option<&str>) -> Result<Self, StatusCause> {
        match v {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some(other) => Err(StatusCause {
                reason: "FieldValueNotSupported".into(),
                message: format!(
                    "Unsupported value: {other:?}: supported values: \"\", \"Ignore\", \
                     \"Strict\", \"Warn\""
                ),
                field: "fieldValidation".into(),
            }),
        }
    }

    /// Turns the problems found into warnings (Warn), nothing (Ignore) or a 400 (Strict).
    pub fn check(self, problems: Vec<String>) -> Result<Vec<String>, ApiError> {
        match self {
            _ if problems.is_empty() => Ok(vec![]),
            FieldValidation::Ignore => Ok(vec![]),
            FieldValidation::Warn => Ok(problems),
            FieldValidation::Strict => Err(ApiError::bad_request(format!(
                "strict decoding error: {}",
                problems.join(", ")
            ))),
        }
    }
}

/// Parses JSON into a `Value` (the last of duplicate keys wins, as in Go) and reports each
/// duplicate as `duplicate field "<path>"`.
pub fn parse_json(bytes: &[u8]) -> Result<(Value, Vec<String>), serde_json::Error> {
    let found = RefCell::new(vec![]);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = Dups {
        path: String::new(),
        found: &found,
    }
    .deserialize(&mut de)?;
    de.end()?;
    let dups = found
        .into_inner()
        .into_iter()
        .map(|p| format!("duplicate field {p:?}"))
        .collect();
    Ok((v, dups))
}

/// A value that does not fit the type: the path of the field at fault (empty for the
/// whole document) and serde's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeError {
    pub path: String,
    pub message: String,
}

/// Decodes `value` into `T`, returning with it the path of every field `T` does not know
/// (`spec.foo`, `items[1].colour`), in document order.
pub fn decode<T: DeserializeOwned>(value: Value) -> Result<(T, Vec<String>), TypeError> {
    let mut unknown = vec![];
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(value, &mut track);
    match serde_ignored::deserialize(de, |p| unknown.push(format_path(&p))) {
        Ok(obj) => Ok((obj, unknown)),
        Err(e) => {
            let path = track.path().to_string();
            Err(TypeError {
                path: if path == "." { String::new() } else { path },
                message: e.to_string(),
            })
        }
    }
}

/// Decodes a request body's `value` into `T` and reports each field `T` does not know as
/// `unknown field "<path>"`, as Kubernetes words it for `fieldValidation`.
pub fn decode_value<T: DeserializeOwned>(value: Value) -> Result<(T, Vec<String>), String> {
    let (obj, unknown) = decode(value).map_err(|e| e.message)?;
    Ok((
        obj,
        unknown
            .into_iter()
            .map(|p| format!("unknown field {p:?}"))
            .collect(),
    ))
}

/// The path of a field as `serde_ignored` reports it: names joined by `.`, list items as
/// `[i]`.
fn format_path(p: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path as P;
    match p {
        P::Root => String::new(),
        P::Seq { parent, index } => format!("{}[{index}]", format_path(parent)),
        P::Map { parent, key } => join(&format_path(parent), key),
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            format_path(parent)
        }
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// A seed that builds a `Value` and records the paths of duplicate keys.
struct Dups<'a> {
    path: String,
    found: &'a RefCell<Vec<String>>,
}

impl<'de> DeserializeSeed<'de> for Dups<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Dups<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = vec![];
        while let Some(v) = seq.next_element_seed(Dups {
            path: format!("{}[{}]", self.path, out.len()),
            found: self.found,
        })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let path = join(&self.path, &k);
            let v = map.next_value_seed(Dups {
                path: path.clone(),
                found: self.found,
            })?;
            if out.insert(k, v).is_some() {
                self.found.borrow_mut().push(path);
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Doc {
        #[serde(default)]
        items: Vec<Item>,
    }

    #[derive(Debug, Deserialize)]
    struct Item {
        #[serde(default)]
        count: i32,
    }

    #[test]
    fn unknown_fields_and_type_errors_carry_their_paths() {
        let (doc, unknown) =
            decode::<Doc>(json!({"extra": 1, "items": [{"count": 1}, {"colour": "red"}]})).unwrap();
        assert_eq!(doc.items.len(), 2);
        assert_eq!(doc.items[0].count, 1);
        assert_eq!(unknown, ["extra", "items[1].colour"]);
        let err = decode::<Doc>(json!({"items": [{"count": "lots"}]})).unwrap_err();
        assert_eq!(err.path, "items[0].count");
        let err = decode::<Doc>(json!("text")).unwrap_err();
        assert_eq!(err.path, "");
        // Request bodies read the same findings in Kubernetes' words.
        let (_, problems) = decode_value::<Doc>(json!({"extra": 1})).unwrap();
        assert_eq!(problems, [r#"unknown field "extra""#]);
    }
}
