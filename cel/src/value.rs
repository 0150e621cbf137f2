//! CEL runtime values: conversion from and to JSON, equality and ordering as CEL defines them.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::Type;

/// A CEL value. Aggregates are reference-counted, so cloning a value is cheap.
#[derive(Clone, Debug)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    String(Arc<str>),
    Bytes(Arc<[u8]>),
    List(Arc<[Value]>),
    Map(Arc<BTreeMap<Key, Value>>),
    /// Nanoseconds since the Unix epoch, UTC.
    Timestamp(i128),
    /// Nanoseconds.
    Duration(i128),
    /// A type value, as `type(x)` returns and `int` names.
    Type(Type),
    /// The value of `a.?b` or `m[?k]`: present or absent.
    Optional(Option<Box<Value>>),
}

/// A map key: CEL allows bool, int, uint and string keys.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    Bool(bool),
    Int(i64),
    Uint(u64),
    String(Arc<str>),
}

impl Key {
    /// The key a value stands for, if it may be one.
    pub fn from_value(v: &Value) -> Option<Key> {
        Some(match v {
            Value::Bool(b) => Key::Bool(*b),
            Value::Int(i) => Key::Int(*i),
            Value::Uint(u) => Key::Uint(*u),
            Value::String(s) => Key::String(s.clone()),
            _ => return None,
        })
    }

    pub fn to_value(&self) -> Value {
        match self {
            Key::Bool(b) => Value::Bool(*b),
            Key::Int(i) => Value::Int(*i),
            Key::Uint(u) => Value::Uint(*u),
            Key::String(s) => Value::String(s.clone()),
        }
    }
}

/// Looks `key` up in `map`, finding numeric keys across int, uint and double as CEL does.
pub fn map_get<'m>(map: &'m BTreeMap<Key, Value>, key: &Value) -> Option<&'m Value> {
    match key {
        Value::Double(d) => {
            if d.fract() != 0.0 || !d.is_finite() {
                return None;
            }
            if *d >= 0.0
                && *d < 18446744073709551616.0
                && let Some(v) = map.get(&Key::Uint(*d as u64))
            {
                return Some(v);
            }
            if *d >= -9223372036854775808.0 && *d < 9223372036854775808.0 {
                return map.get(&Key::Int(*d as i64));
            }
            None
        }
        Value::Int(i) => map
            .get(&Key::Int(*i))
            .or_else(|| u64::try_from(*i).ok().and_then(|u| map.get(&Key::Uint(u)))),
        Value::Uint(u) => map
            .get(&Key::Uint(*u))
            .or_else(|| i64::try_from(*u).ok().and_then(|i| map.get(&Key::Int(i)))),
        other => Key::from_value(other).and_then(|k| map.get(&k)),
    }
}

impl Value {
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_list(&self) -> Option<&[Value]> {
        match self {
            Value::List(l) => Some(l),
            _ => None,
        }
    }

    /// The CEL type of this value.
    pub fn type_of(&self) -> Type {
        match self {
            Value::Null => Type::Null,
            Value::Bool(_) => Type::Bool,
            Value::Int(_) => Type::Int,
            Value::Uint(_) => Type::Uint,
            Value::Double(_) => Type::Double,
            Value::String(_) => Type::String,
            Value::Bytes(_) => Type::Bytes,
            Value::List(_) => Type::List(Box::new(Type::Dyn)),
            Value::Map(_) => Type::Map(Box::new(Type::Dyn), Box::new(Type::Dyn)),
            Value::Timestamp(_) => Type::Timestamp,
            Value::Duration(_) => Type::Duration,
            Value::Type(_) => Type::Type,
            Value::Optional(_) => Type::Optional(Box::new(Type::Dyn)),
        }
    }

    /// The value as JSON. Timestamps and durations become their CEL string forms, bytes
    /// become base64, as the protobuf JSON mapping does.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Uint(u) => J::from(*u),
            Value::Double(d) => serde_json::Number::from_f64(*d).map_or(J::Null, J::Number),
            Value::String(s) => J::String(s.to_string()),
            Value::Bytes(b) => {
                use base64::Engine;
                J::String(base64::engine::general_purpose::STANDARD.encode(b))
            }
            Value::List(l) => J::Array(l.iter().map(Value::to_json).collect()),
            Value::Map(m) => J::Object(
                m.iter()
                    .map(|(k, v)| {
                        let key = match k {
                            Key::String(s) => s.to_string(),
                            Key::Bool(b) => b.to_string(),
                            Key::Int(i) => i.to_string(),
                            Key::Uint(u) => u.to_string(),
                        };
                        (key, v.to_json())
                    })
                    .collect(),
            ),
            Value::Timestamp(_) | Value::Duration(_) | Value::Type(_) => {
                J::String(self.to_string())
            }
            Value::Optional(o) => o.as_ref().map_or(J::Null, |v| v.to_json()),
        }
    }
}

impl From<serde_json::Value> for Value {
    fn from(v: serde_json::Value) -> Self {
        use serde_json::Value as J;
        match v {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(b),
            J::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Double(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => Value::String(s.into()),
            J::Array(a) => Value::List(a.into_iter().map(Value::from).collect()),
            J::Object(o) => Value::Map(Arc::new(
                o.into_iter()
                    .map(|(k, v)| (Key::String(k.into()), Value::from(v)))
                    .collect(),
            )),
        }
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

impl From<u64> for Value {
    fn from(u: u64) -> Self {
        Value::Uint(u)
    }
}

impl From<f64> for Value {
    fn from(d: f64) -> Self {
        Value::Double(d)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.into())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(s.into())
    }
}

impl<T: Into<Value>> From<Vec<T>> for Value {
    fn from(v: Vec<T>) -> Self {
        Value::List(v.into_iter().map(Into::into).collect())
    }
}

/// Numeric comparison across int, uint and double, as CEL defines it.
fn cmp_numeric(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::Uint(x), Value::Uint(y)) => Some(x.cmp(y)),
        (Value::Double(x), Value::Double(y)) => x.partial_cmp(y),
        (Value::Int(x), Value::Uint(y)) => Some(i128::from(*x).cmp(&i128::from(*y))),
        (Value::Uint(x), Value::Int(y)) => Some(i128::from(*x).cmp(&i128::from(*y))),
        (Value::Int(x), Value::Double(y)) => cmp_int_double(i128::from(*x), *y),
        (Value::Uint(x), Value::Double(y)) => cmp_int_double(i128::from(*x), *y),
        (Value::Double(x), Value::Int(y)) => {
            cmp_int_double(i128::from(*y), *x).map(Ordering::reverse)
        }
        (Value::Double(x), Value::Uint(y)) => {
            cmp_int_double(i128::from(*y), *x).map(Ordering::reverse)
        }
        _ => None,
    }
}

fn cmp_int_double(i: i128, d: f64) -> Option<Ordering> {
    if d.is_nan() {
        return None;
    }
    // i128 -> f64 may round, but only beyond 2^53 where the ordering of such a value and a
    // double is the ordering of the rounded value except at equality, which is then checked
    // exactly.
    let id = i as f64;
    match id.partial_cmp(&d)? {
        Ordering::Equal if d.fract() == 0.0 && d.abs() < 1.7e38 => Some(i.cmp(&(d as i128))),
        o => Some(o),
    }
}

/// Ordering for `<`, `<=`, `>`, `>=`; `None` when the operands are not comparable.
pub fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        (Value::Bytes(x), Value::Bytes(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        (Value::Timestamp(x), Value::Timestamp(y)) => Some(x.cmp(y)),
        (Value::Duration(x), Value::Duration(y)) => Some(x.cmp(y)),
        _ => cmp_numeric(a, b),
    }
}

/// Whether `a` and `b` are comparable for ordering at all (a type error otherwise).
pub fn orderable(a: &Value, b: &Value) -> bool {
    let num = |v: &Value| matches!(v, Value::Int(_) | Value::Uint(_) | Value::Double(_));
    (num(a) && num(b))
        || matches!(
            (a, b),
            (Value::String(_), Value::String(_))
                | (Value::Bytes(_), Value::Bytes(_))
                | (Value::Bool(_), Value::Bool(_))
                | (Value::Timestamp(_), Value::Timestamp(_))
                | (Value::Duration(_), Value::Duration(_))
        )
}

impl PartialEq for Value {
    /// CEL equality: numbers compare by value across types, aggregates element-wise, values
    /// of different types are unequal.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::String(a), Value::String(b)) => a == b,
            (Value::Bytes(a), Value::Bytes(b)) => a == b,
            (Value::List(a), Value::List(b)) => {
                a.len() == b.len() && a.iter().zip(b.iter()).all(|(x, y)| x == y)
            }
            (Value::Map(a), Value::Map(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .all(|(k, v)| map_get(b, &k.to_value()).is_some_and(|w| v == w))
            }
            (Value::Timestamp(a), Value::Timestamp(b)) => a == b,
            (Value::Duration(a), Value::Duration(b)) => a == b,
            (Value::Type(a), Value::Type(b)) => a.name() == b.name(),
            (Value::Optional(a), Value::Optional(b)) => a == b,
            _ => cmp_numeric(self, other) == Some(Ordering::Equal),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Uint(u) => write!(f, "{u}u"),
            Value::Double(d) => write!(f, "{d}"),
            Value::String(s) => write!(f, "{s:?}"),
            Value::Bytes(b) => write!(f, "b{:?}", String::from_utf8_lossy(b)),
            Value::List(l) => {
                f.write_str("[")?;
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Value::Map(m) => {
                f.write_str("{")?;
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{}: {v}", k.to_value())?;
                }
                f.write_str("}")
            }
            Value::Timestamp(ns) => f.write_str(&super::functions::format_timestamp(*ns)),
            Value::Duration(ns) => f.write_str(&super::functions::format_duration(*ns)),
            Value::Type(t) => f.write_str(&t.name()),
            Value::Optional(None) => f.write_str("optional.none()"),
            Value::Optional(Some(v)) => write!(f, "optional.of({v})"),
        }
    }
}
