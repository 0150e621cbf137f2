//! Protobuf for the built-in kinds of a schema-agnostic cache: the upstream's JSON object is
//! written as the message Kubernetes' `generated.proto` describes, with the schema in
//! `builtin.schema` (field numbers, presence and types of every message the built-in kinds
//! use, generated from client-go's types by `interop/cmd/protoschema`).
//!
//! The bytes follow Kubernetes' own encoder where the JSON allows it, so a client decodes the
//! same object either way: fields in number order; a Go value field (`string`, `int32`, a
//! struct) written even when the JSON leaves it out, as Go cannot tell its zero value from unset;
//! a pointer, slice or map only when present; map entries sorted by key; `Time` as seconds,
//! `MicroTime` with nanoseconds, `Quantity` as its string, `IntOrString` with all three fields,
//! `RawExtension` and `FieldsV1` as the JSON value's bytes.

use std::collections::HashMap;
use std::sync::LazyLock;

use base64::Engine;
use prost::encoding::{WireType, encode_key, encode_varint};
use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::status::ApiError;

static SCHEMA: LazyLock<Result<Schema, String>> =
    LazyLock::new(|| Schema::parse(include_str!("builtin.schema")));

/// Whether the schema knows `kind` of `api_version` (`v1`, `apps/v1`).
pub fn has_kind(api_version: &str, kind: &str) -> bool {
    SCHEMA
        .as_ref()
        .is_ok_and(|s| s.kinds.contains_key(&(api_version.into(), kind.into())))
}

/// The bare protobuf message of an object's JSON, its kind read from its `apiVersion` and
/// `kind`.
pub fn encode(json: &[u8]) -> Result<Vec<u8>, ApiError> {
    let schema = SCHEMA.as_ref().map_err(|e| ApiError::Internal(e.clone()))?;
    let value: Value = serde_json::from_slice(json)
        .map_err(|e| ApiError::Internal(format!("an object could not be read: {e}")))?;
    let text = |k: &str| value.get(k).and_then(Value::as_str).unwrap_or("");
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let Some(&message) = schema.kinds.get(&(api_version.into(), kind.into())) else {
        return Err(ApiError::Internal(format!(
            "{kind} of {api_version} has no protobuf encoding"
        )));
    };
    let mut out = Vec::with_capacity(json.len());
    schema.message(message, &value, &mut out)?;
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Card {
    /// A Go value: written even when absent.
    Value,
    /// A Go pointer (or `[]byte`): written when present.
    Pointer,
    Repeated,
    /// `map<string, _>`.
    Map,
}

#[derive(Debug, Clone, PartialEq)]
enum Ty {
    String,
    Bytes,
    Int32,
    Int64,
    Uint32,
    Uint64,
    Bool,
    Double,
    Time,
    MicroTime,
    Duration,
    Quantity,
    IntOrString,
    Raw,
    /// A named slice Kubernetes wraps in a message of one repeated field 1.
    List(Box<Ty>),
    Message(usize),
}

#[derive(Debug)]
struct Field {
    number: u32,
    /// `None`: a struct inlined in the JSON (its fields sit in the enclosing object).
    json: Option<Box<str>>,
    card: Card,
    ty: Ty,
}

#[derive(Debug, Default)]
struct Schema {
    kinds: HashMap<(Box<str>, Box<str>), usize>,
    messages: Vec<Vec<Field>>,
}

impl Schema {
    fn parse(text: &str) -> Result<Schema, String> {
        let mut schema = Schema::default();
        let mut ids: HashMap<&str, usize> = HashMap::new();
        // First pass: number the messages, so a field can name one declared later.
        for line in text.lines() {
            if let Some(name) = line.strip_prefix("message ") {
                let next = ids.len();
                ids.entry(name).or_insert(next);
            }
        }
        schema.messages.resize_with(ids.len(), Vec::new);
        let mut current: Option<usize> = None;
        for (n, line) in text.lines().enumerate() {
            let bad = || format!("builtin.schema line {}: {line:?}", n.saturating_add(1));
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                [] | [""] => {}
                [first, ..] if first.starts_with('#') => {}
                ["kind", api_version, kind, message] => {
                    let m = *ids.get(message).ok_or_else(bad)?;
                    schema
                        .kinds
                        .insert(((*api_version).into(), (*kind).into()), m);
                }
                ["message", name] => current = ids.get(name).copied(),
                ["field", number, json, card, ty] => {
                    let m = current.ok_or_else(bad)?;
                    let field = Field {
                        number: number.parse().map_err(|_| bad())?,
                        json: (*json != "~").then(|| (*json).into()),
                        card: match *card {
                            "v" => Card::Value,
                            "p" => Card::Pointer,
                            "r" => Card::Repeated,
                            "m:string" => Card::Map,
                            _ => return Err(bad()),
                        },
                        ty: parse_ty(ty, &ids).ok_or_else(bad)?,
                    };
                    schema.messages.get_mut(m).ok_or_else(bad)?.push(field);
                }
                _ => return Err(bad()),
            }
        }
        Ok(schema)
    }

    /// Writes `value` (a JSON object, or anything else read as an empty one) as message `m`.
    fn message(&self, m: usize, value: &Value, out: &mut Vec<u8>) -> Result<(), ApiError> {
        static EMPTY: LazyLock<Map<String, Value>> = LazyLock::new(Map::new);
        let object = value.as_object().unwrap_or(&EMPTY);
        let fields = self
            .messages
            .get(m)
            .ok_or_else(|| ApiError::Internal("a message the schema lacks".into()))?;
        for f in fields {
            let v = match &f.json {
                None => Some(value),
                Some(name) => object.get(&**name).filter(|v| !v.is_null()),
            };
            match (f.card, v) {
                (Card::Value, None) => self.value(f.number, &f.ty, &Value::Null, out)?,
                (Card::Value | Card::Pointer, Some(v)) => self.value(f.number, &f.ty, v, out)?,
                (_, None) => {}
                (Card::Repeated, Some(v)) => {
                    for item in v.as_array().map(Vec::as_slice).unwrap_or_default() {
                        self.value(f.number, &f.ty, item, out)?;
                    }
                }
                (Card::Map, Some(v)) => {
                    let Some(map) = v.as_object() else { continue };
                    let mut keys: Vec<&String> = map.keys().collect();
                    keys.sort_unstable();
                    for k in keys {
                        let mut entry = Vec::new();
                        write_bytes(1, k.as_bytes(), &mut entry);
                        let item = map.get(k).unwrap_or(&Value::Null);
                        self.value(2, &f.ty, item, &mut entry)?;
                        write_bytes(f.number, &entry, out);
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes one value of type `ty` as field `number`; `Null` writes the type's zero value.
    fn value(&self, number: u32, ty: &Ty, v: &Value, out: &mut Vec<u8>) -> Result<(), ApiError> {
        match ty {
            Ty::String => write_bytes(number, text(v).as_bytes(), out),
            Ty::Bytes => {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(text(v))
                    .map_err(|e| ApiError::Internal(format!("a bytes field: {e}")))?;
                write_bytes(number, &raw, out);
            }
            // Go writes `uint64(int32)`: a negative value sign-extends to ten bytes.
            Ty::Int32 | Ty::Int64 => write_varint_field(number, integer(v) as u64, out),
            Ty::Uint32 | Ty::Uint64 => {
                write_varint_field(number, v.as_u64().unwrap_or_default(), out)
            }
            Ty::Bool => write_varint_field(number, u64::from(v.as_bool().unwrap_or(false)), out),
            Ty::Double => {
                encode_key(number, WireType::SixtyFourBit, out);
                out.extend_from_slice(&v.as_f64().unwrap_or_default().to_le_bytes());
            }
            Ty::Time | Ty::MicroTime => {
                let mut m = Vec::new();
                if let Some(s) = v.as_str().filter(|s| !s.is_empty()) {
                    let t = OffsetDateTime::parse(s, &Rfc3339)
                        .map_err(|e| ApiError::Internal(format!("a time {s:?}: {e}")))?;
                    // Time keeps seconds only, as its JSON does; MicroTime keeps nanoseconds.
                    let nanos = if *ty == Ty::MicroTime {
                        t.nanosecond()
                    } else {
                        0
                    };
                    write_varint_field(1, t.unix_timestamp() as u64, &mut m);
                    write_varint_field(2, u64::from(nanos), &mut m);
                }
                write_bytes(number, &m, out);
            }
            Ty::Duration => {
                let mut m = Vec::new();
                if let Some(s) = v.as_str() {
                    let nanos = go_duration(s)
                        .ok_or_else(|| ApiError::Internal(format!("a duration {s:?}")))?;
                    write_varint_field(1, nanos as u64, &mut m);
                }
                write_bytes(number, &m, out);
            }
            Ty::Quantity => {
                let s = match v {
                    Value::Number(n) => n.to_string(),
                    Value::String(s) => s.clone(),
                    _ => "0".to_string(),
                };
                let mut m = Vec::new();
                write_bytes(1, s.as_bytes(), &mut m);
                write_bytes(number, &m, out);
            }
            Ty::IntOrString => {
                let mut m = Vec::new();
                let (kind, int, s) = match v {
                    Value::String(s) => (1, 0, s.as_str()),
                    _ => (0, integer(v), ""),
                };
                write_varint_field(1, kind, &mut m);
                write_varint_field(2, int as u64, &mut m);
                write_bytes(3, s.as_bytes(), &mut m);
                write_bytes(number, &m, out);
            }
            Ty::Raw => {
                let mut m = Vec::new();
                if !v.is_null() {
                    let raw = serde_json::to_vec(v).map_err(ApiError::internal)?;
                    write_bytes(1, &raw, &mut m);
                }
                write_bytes(number, &m, out);
            }
            Ty::List(item) => {
                let mut m = Vec::new();
                for i in v.as_array().map(Vec::as_slice).unwrap_or_default() {
                    self.value(1, item, i, &mut m)?;
                }
                write_bytes(number, &m, out);
            }
            Ty::Message(id) => {
                let mut m = Vec::new();
                self.message(*id, v, &mut m)?;
                write_bytes(number, &m, out);
            }
        }
        Ok(())
    }
}

fn parse_ty(word: &str, ids: &HashMap<&str, usize>) -> Option<Ty> {
    Some(match word {
        "string" => Ty::String,
        "bytes" => Ty::Bytes,
        "int32" => Ty::Int32,
        "int64" => Ty::Int64,
        "uint32" => Ty::Uint32,
        "uint64" => Ty::Uint64,
        "bool" => Ty::Bool,
        "double" => Ty::Double,
        "time" => Ty::Time,
        "microtime" => Ty::MicroTime,
        "duration" => Ty::Duration,
        "quantity" => Ty::Quantity,
        "intstr" => Ty::IntOrString,
        "raw" => Ty::Raw,
        _ => match word.strip_prefix("list:") {
            Some(item) => Ty::List(Box::new(parse_ty(item, ids)?)),
            None => Ty::Message(*ids.get(word)?),
        },
    })
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// A JSON integer (or an integral float, as some clients write them) as i64.
fn integer(v: &Value) -> i64 {
    v.as_i64()
        .or_else(|| v.as_u64().map(|u| u as i64))
        .or_else(|| v.as_f64().map(|f| f as i64))
        .unwrap_or_default()
}

fn write_varint_field(number: u32, v: u64, out: &mut Vec<u8>) {
    encode_key(number, WireType::Varint, out);
    encode_varint(v, out);
}

fn write_bytes(number: u32, b: &[u8], out: &mut Vec<u8>) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

/// Go's `time.ParseDuration` for what `metav1.Duration` writes (`1h2m3.5s`, `-40ms`), in
/// nanoseconds.
fn go_duration(s: &str) -> Option<i64> {
    let (negative, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0);
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&i| i > 0)?;
        let (number, after) = rest.split_at(digits);
        let number: f64 = number.parse().ok()?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += number * scale;
        rest = after;
    }
    let nanos = total.round() as i64;
    Some(if negative {
        nanos.saturating_neg()
    } else {
        nanos
    })
}

#[cfg(test)]
mod tests;
