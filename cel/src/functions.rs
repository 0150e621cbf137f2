//! CEL function implementations with their costs: what the evaluator runs for a resolved call.

use std::sync::Arc;

use regex::Regex;

use super::eval::Meter;
use super::overloads::{Func, arg_list};
use super::value::{Key, Value, compare, map_get};
use super::{EvalError, MAX_LIST_LEN, MAX_STRING_BYTES, Type};
fn overload(func: Func, args: &[Value]) -> EvalError {
    let types: Vec<Type> = args.iter().map(Value::type_of).collect();
    EvalError::runtime(format!("no such overload: {func:?}{}", arg_list(&types)))
}

/// Cost of traversing `n` bytes: a tenth of them, at least 1.
pub(crate) fn traversal(n: usize) -> u64 {
    (n as u64 / 10).saturating_add(1)
}

fn string(s: String) -> Result<Value, EvalError> {
    if s.len() > MAX_STRING_BYTES {
        return Err(EvalError::runtime(format!(
            "string of {} bytes exceeds the limit of {MAX_STRING_BYTES}",
            s.len()
        )));
    }
    Ok(Value::String(s.into()))
}

fn check_list_len(n: usize) -> Result<(), EvalError> {
    if n > MAX_LIST_LEN {
        return Err(EvalError::runtime(format!(
            "list of {n} elements exceeds the limit of {MAX_LIST_LEN}"
        )));
    }
    Ok(())
}

fn overflow() -> EvalError {
    EvalError::runtime("integer overflow")
}

fn int_arg(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::Uint(u) => i64::try_from(*u).ok(),
        _ => None,
    }
}

/// Compiles a regex with bounded size (the `regex` crate matches in linear time).
pub(crate) fn compile_regex(pattern: &str) -> Result<Regex, String> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .dfa_size_limit(1 << 20)
        .nest_limit(100)
        .build()
        .map_err(|e| format!("invalid regular expression '{pattern}': {e}"))
}

/// Cost of a `matches` call: length of the regex times length of the input.
pub(crate) fn regex_cost(pattern_len: usize, input_len: usize) -> u64 {
    (pattern_len.max(1) as u64).saturating_mul(input_len.max(1) as u64)
}

/// Calls `func` on evaluated `args` (receiver first), charging its cost to `meter`.
pub(crate) fn call(func: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    meter.charge(1)?;
    match func {
        Func::Add | Func::Sub | Func::Mul | Func::Div | Func::Mod | Func::Neg => {
            arithmetic(func, args, meter)
        }
        Func::Eq
        | Func::Ne
        | Func::Lt
        | Func::Le
        | Func::Gt
        | Func::Ge
        | Func::In
        | Func::Index
        | Func::OptIndex
        | Func::Size => comparison_or_container(func, args, meter),
        Func::Contains
        | Func::StartsWith
        | Func::EndsWith
        | Func::Matches
        | Func::LowerAscii
        | Func::UpperAscii
        | Func::Trim
        | Func::Split
        | Func::Join
        | Func::Replace
        | Func::IndexOf
        | Func::LastIndexOf
        | Func::Substring => strings(func, args, meter),
        Func::ToInt | Func::ToUint | Func::ToDouble => to_number(func, args),
        Func::ToString
        | Func::ToBool
        | Func::ToBytes
        | Func::TypeOf
        | Func::Dyn
        | Func::ToDuration
        | Func::ToTimestamp => convert(func, args, meter),
        Func::SetsContains | Func::SetsEquivalent | Func::SetsIntersects => sets(func, args, meter),
        Func::OptionalOf | Func::OptionalNone | Func::OrValue | Func::HasValue | Func::OptValue => {
            optionals(func, args)
        }
    }
}

/// `+ - * / %` and unary `-`.
fn arithmetic(func: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    use Value as V;
    let bad = || overload(func, args);
    match (func, args) {
        (Func::Add, [a, b]) => add(a, b, meter),
        (Func::Sub, [a, b]) => match (a, b) {
            (V::Int(x), V::Int(y)) => x.checked_sub(*y).map(V::Int).ok_or_else(overflow),
            (V::Uint(x), V::Uint(y)) => x.checked_sub(*y).map(V::Uint).ok_or_else(overflow),
            (V::Double(x), V::Double(y)) => Ok(V::Double(x - y)),
            (V::Timestamp(x), V::Timestamp(y)) => {
                x.checked_sub(*y).ok_or_else(overflow).and_then(duration)
            }
            (V::Timestamp(x), V::Duration(y)) => {
                x.checked_sub(*y).ok_or_else(overflow).and_then(timestamp)
            }
            (V::Duration(x), V::Duration(y)) => {
                x.checked_sub(*y).ok_or_else(overflow).and_then(duration)
            }
            _ => Err(bad()),
        },
        (Func::Mul, [a, b]) => match (a, b) {
            (V::Int(x), V::Int(y)) => x.checked_mul(*y).map(V::Int).ok_or_else(overflow),
            (V::Uint(x), V::Uint(y)) => x.checked_mul(*y).map(V::Uint).ok_or_else(overflow),
            (V::Double(x), V::Double(y)) => Ok(V::Double(x * y)),
            _ => Err(bad()),
        },
        (Func::Div, [a, b]) => match (a, b) {
            (V::Int(_), V::Int(0)) | (V::Uint(_), V::Uint(0)) => {
                Err(EvalError::runtime("division by zero"))
            }
            (V::Int(x), V::Int(y)) => x.checked_div(*y).map(V::Int).ok_or_else(overflow),
            (V::Uint(x), V::Uint(y)) => x.checked_div(*y).map(V::Uint).ok_or_else(overflow),
            (V::Double(x), V::Double(y)) => Ok(V::Double(x / y)),
            _ => Err(bad()),
        },
        (Func::Mod, [a, b]) => match (a, b) {
            (V::Int(_), V::Int(0)) | (V::Uint(_), V::Uint(0)) => {
                Err(EvalError::runtime("modulus by zero"))
            }
            (V::Int(x), V::Int(y)) => x.checked_rem(*y).map(V::Int).ok_or_else(overflow),
            (V::Uint(x), V::Uint(y)) => x.checked_rem(*y).map(V::Uint).ok_or_else(overflow),
            _ => Err(bad()),
        },
        (Func::Neg, [a]) => match a {
            V::Int(x) => x.checked_neg().map(V::Int).ok_or_else(overflow),
            V::Double(x) => Ok(V::Double(-x)),
            V::Duration(x) => x.checked_neg().ok_or_else(overflow).and_then(duration),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// Equality, ordering, `in`, indexing and `size`.
fn comparison_or_container(
    func: Func,
    args: &[Value],
    meter: &mut Meter,
) -> Result<Value, EvalError> {
    use Value as V;
    let bad = || overload(func, args);
    match (func, args) {
        (Func::Eq | Func::Ne, [a, b]) => {
            let eq = equal(a, b, meter)?;
            Ok(V::Bool(if func == Func::Eq { eq } else { !eq }))
        }
        (Func::Lt | Func::Le | Func::Gt | Func::Ge, [a, b]) => {
            if !super::value::orderable(a, b) {
                return Err(bad());
            }
            if let (V::String(x), V::String(y)) = (a, b) {
                meter.charge(traversal(x.len().min(y.len())))?;
            }
            let Some(o) = compare(a, b) else {
                return Ok(V::Bool(false)); // NaN compares false
            };
            Ok(V::Bool(match func {
                Func::Lt => o.is_lt(),
                Func::Le => o.is_le(),
                Func::Gt => o.is_gt(),
                _ => o.is_ge(),
            }))
        }
        (Func::In, [a, c]) => match c {
            V::List(l) => {
                for x in l.iter() {
                    meter.charge(1)?;
                    if equal(a, x, meter)? {
                        return Ok(V::Bool(true));
                    }
                }
                Ok(V::Bool(false))
            }
            V::Map(m) => Ok(V::Bool(map_get(m, a).is_some())),
            _ => Err(bad()),
        },
        (Func::Index, [c, i]) => index(c, i).and_then(|v| v.ok_or_else(|| no_such_key(i))),
        (Func::OptIndex, [c, i]) => match c {
            V::Optional(None) => Ok(V::Optional(None)),
            V::Optional(Some(inner)) => Ok(V::Optional(index(inner, i)?.map(Box::new))),
            _ => Ok(V::Optional(index(c, i)?.map(Box::new))),
        },
        (Func::Size, [a]) => match a {
            V::String(s) => {
                meter.charge(traversal(s.len()))?;
                Ok(V::Int(s.chars().count() as i64))
            }
            V::Bytes(b) => Ok(V::Int(b.len() as i64)),
            V::List(l) => Ok(V::Int(l.len() as i64)),
            V::Map(m) => Ok(V::Int(m.len() as i64)),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// The string extension functions.
fn strings(func: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    use Value as V;
    let bad = || overload(func, args);
    match (func, args) {
        (Func::Contains | Func::StartsWith | Func::EndsWith, [V::String(s), V::String(p)]) => {
            meter.charge(traversal(s.len().saturating_add(p.len())))?;
            Ok(V::Bool(match func {
                Func::Contains => s.contains(&**p),
                Func::StartsWith => s.starts_with(&**p),
                _ => s.ends_with(&**p),
            }))
        }
        (Func::Matches, [V::String(s), V::String(p)]) => {
            meter.charge(regex_cost(p.len(), s.len()))?;
            let re = compile_regex(p).map_err(EvalError::Runtime)?;
            Ok(V::Bool(re.is_match(s)))
        }
        (Func::LowerAscii | Func::UpperAscii | Func::Trim, [V::String(s)]) => {
            meter.charge(traversal(s.len()))?;
            Ok(V::String(match func {
                Func::LowerAscii => s.to_ascii_lowercase().into(),
                Func::UpperAscii => s.to_ascii_uppercase().into(),
                _ => s.trim().into(),
            }))
        }
        (Func::Split, [V::String(s), V::String(sep), rest @ ..]) => split(s, sep, rest, meter, bad),
        (Func::Join, [V::List(l), rest @ ..]) => join(l, rest, meter, bad),
        (Func::Replace, [V::String(s), V::String(from), V::String(to), rest @ ..]) => {
            replace(s, from, to, rest, meter, bad)
        }
        (Func::IndexOf | Func::LastIndexOf, [V::String(s), V::String(sub), rest @ ..]) => {
            index_of(func, s, sub, rest, meter, bad)
        }
        (Func::Substring, [V::String(s), rest @ ..]) => substring(s, rest, meter, bad),
        _ => Err(bad()),
    }
}

/// `s.split(sep)` and `s.split(sep, limit)`.
fn split(
    s: &str,
    sep: &str,
    rest: &[Value],
    meter: &mut Meter,
    bad: impl Fn() -> EvalError,
) -> Result<Value, EvalError> {
    use Value as V;
    meter.charge(traversal(s.len()))?;
    let limit = match rest {
        [] => -1,
        [n] => int_arg(n).ok_or_else(&bad)?,
        _ => return Err(bad()),
    };
    // Bound the output before building it.
    let pieces = if sep.is_empty() {
        s.chars().count()
    } else {
        s.matches(sep).count().saturating_add(1)
    };
    let pieces = if limit < 0 {
        pieces
    } else {
        pieces.min(usize::try_from(limit).unwrap_or(usize::MAX))
    };
    check_list_len(pieces)?;
    meter.charge(pieces as u64)?;
    let parts: Vec<Value> = match limit {
        0 => Vec::new(),
        n if n < 0 => {
            if sep.is_empty() {
                s.chars().map(|c| V::String(c.to_string().into())).collect()
            } else {
                s.split(sep).map(V::from).collect()
            }
        }
        n => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if sep.is_empty() {
                let mut out: Vec<Value> = Vec::new();
                let mut rest_str = s;
                while out.len().saturating_add(1) < n {
                    let Some(c) = rest_str.chars().next() else {
                        break;
                    };
                    out.push(V::String(c.to_string().into()));
                    rest_str = &rest_str[c.len_utf8()..];
                }
                if !rest_str.is_empty() {
                    out.push(V::from(rest_str));
                }
                out
            } else {
                s.splitn(n, sep).map(V::from).collect()
            }
        }
    };
    Ok(V::List(parts.into()))
}

/// `list.join()` and `list.join(sep)`.
fn join(
    l: &[Value],
    rest: &[Value],
    meter: &mut Meter,
    bad: impl Fn() -> EvalError,
) -> Result<Value, EvalError> {
    use Value as V;
    let sep = match rest {
        [] => "",
        [V::String(sep)] => sep,
        _ => return Err(bad()),
    };
    let mut out = String::new();
    for (i, v) in l.iter().enumerate() {
        let V::String(part) = v else {
            return Err(bad());
        };
        if i > 0 {
            out.push_str(sep);
        }
        out.push_str(part);
        if out.len() > MAX_STRING_BYTES {
            return string(out);
        }
    }
    meter.charge(traversal(out.len()))?;
    string(out)
}

/// `s.replace(from, to)` and `s.replace(from, to, n)`.
fn replace(
    s: &str,
    from: &str,
    to: &str,
    rest: &[Value],
    meter: &mut Meter,
    bad: impl Fn() -> EvalError,
) -> Result<Value, EvalError> {
    let n = match rest {
        [] => -1,
        [n] => int_arg(n).ok_or_else(&bad)?,
        _ => return Err(bad()),
    };
    // Bound the output before building it.
    let count = if from.is_empty() {
        s.chars().count().saturating_add(1)
    } else {
        s.matches(from).count()
    };
    let count = if n < 0 {
        count
    } else {
        count.min(usize::try_from(n).unwrap_or(usize::MAX))
    };
    let size = (count as u128)
        .saturating_mul(to.len() as u128)
        .saturating_add(s.len() as u128);
    if size > MAX_STRING_BYTES as u128 {
        return Err(EvalError::runtime(format!(
            "string of {size} bytes exceeds the limit of {MAX_STRING_BYTES}"
        )));
    }
    meter.charge(traversal(size as usize))?;
    string(if n < 0 {
        s.replace(from, to)
    } else {
        s.replacen(from, to, count)
    })
}

/// `s.indexOf(sub[, start])` and `s.lastIndexOf(sub[, start])`, counted in characters.
fn index_of(
    func: Func,
    s: &str,
    sub: &str,
    rest: &[Value],
    meter: &mut Meter,
    bad: impl Fn() -> EvalError,
) -> Result<Value, EvalError> {
    use Value as V;
    meter.charge(traversal(s.len().saturating_add(sub.len())))?;
    let chars: Vec<char> = s.chars().collect();
    let needle: Vec<char> = sub.chars().collect();
    let start = match rest {
        [] => None,
        [n] => Some(int_arg(n).ok_or_else(&bad)?),
        _ => return Err(bad()),
    };
    if let Some(st) = start
        && (st < 0 || st as usize > chars.len())
    {
        return Err(EvalError::runtime(format!("index out of range: {st}")));
    }
    let fits = |i: usize| chars.get(i..).is_some_and(|rest| rest.starts_with(&needle));
    let found = if func == Func::IndexOf {
        let from = start.unwrap_or(0) as usize;
        (from..=chars.len()).find(|&i| fits(i))
    } else {
        let to = start.map_or(chars.len(), |s| s as usize);
        (0..=to).rev().find(|&i| fits(i))
    };
    Ok(V::Int(found.map_or(-1, |i| i as i64)))
}

/// `s.substring(start[, end])`, counted in characters.
fn substring(
    s: &str,
    rest: &[Value],
    meter: &mut Meter,
    bad: impl Fn() -> EvalError,
) -> Result<Value, EvalError> {
    use Value as V;
    meter.charge(traversal(s.len()))?;
    let chars: Vec<char> = s.chars().collect();
    let (start, end) = match rest {
        [a] => (int_arg(a).ok_or_else(&bad)?, chars.len() as i64),
        [a, b] => (int_arg(a).ok_or_else(&bad)?, int_arg(b).ok_or_else(&bad)?),
        _ => return Err(bad()),
    };
    let range = usize::try_from(start).ok().zip(usize::try_from(end).ok());
    let Some(sub) = range.and_then(|(start, end)| chars.get(start..end)) else {
        return Err(EvalError::runtime(format!(
            "substring out of range: [{start}:{end}]"
        )));
    };
    Ok(V::String(sub.iter().collect::<String>().into()))
}

/// `int()`, `uint()` and `double()`.
fn to_number(func: Func, args: &[Value]) -> Result<Value, EvalError> {
    use Value as V;
    let bad = || overload(func, args);
    match (func, args) {
        (Func::ToInt, [a]) => match a {
            V::Int(i) => Ok(V::Int(*i)),
            V::Uint(u) => i64::try_from(*u).map(V::Int).map_err(|_| range()),
            V::Double(d)
                if d.is_finite() && *d >= -9223372036854775808.0 && *d < 9223372036854775808.0 =>
            {
                Ok(V::Int(*d as i64))
            }
            V::Double(_) => Err(range()),
            V::String(s) => s
                .parse()
                .map(V::Int)
                .map_err(|_| EvalError::runtime(format!("cannot convert {s:?} to int"))),
            V::Timestamp(ns) => Ok(V::Int(ns.div_euclid(1_000_000_000) as i64)),
            V::Duration(ns) => Ok(V::Int((ns / 1_000_000_000) as i64)),
            _ => Err(bad()),
        },
        (Func::ToUint, [a]) => match a {
            V::Uint(u) => Ok(V::Uint(*u)),
            V::Int(i) => u64::try_from(*i).map(V::Uint).map_err(|_| range()),
            V::Double(d) if d.is_finite() && *d > -1.0 && *d < 18446744073709551616.0 => {
                Ok(V::Uint(*d as u64))
            }
            V::Double(_) => Err(range()),
            V::String(s) => s
                .parse()
                .map(V::Uint)
                .map_err(|_| EvalError::runtime(format!("cannot convert {s:?} to uint"))),
            _ => Err(bad()),
        },
        (Func::ToDouble, [a]) => match a {
            V::Double(d) => Ok(V::Double(*d)),
            V::Int(i) => Ok(V::Double(*i as f64)),
            V::Uint(u) => Ok(V::Double(*u as f64)),
            V::String(s) => s
                .parse()
                .map(V::Double)
                .map_err(|_| EvalError::runtime(format!("cannot convert {s:?} to double"))),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// The other conversions: `string()`, `bool()`, `bytes()`, `type()`, `dyn()`, `duration()`,
/// `timestamp()`.
fn convert(func: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    use Value as V;
    let bad = || overload(func, args);
    match (func, args) {
        (Func::ToString, [a]) => match a {
            V::String(_) => Ok(a.clone()),
            V::Int(i) => Ok(V::from(i.to_string())),
            V::Uint(u) => Ok(V::from(u.to_string())),
            V::Double(d) => Ok(V::from(d.to_string())),
            V::Bool(b) => Ok(V::from(b.to_string())),
            V::Bytes(b) => {
                meter.charge(traversal(b.len()))?;
                std::str::from_utf8(b)
                    .map(V::from)
                    .map_err(|_| EvalError::runtime("invalid UTF-8 in bytes"))
            }
            V::Timestamp(ns) => Ok(V::from(format_timestamp(*ns))),
            V::Duration(ns) => Ok(V::from(format_duration(*ns))),
            _ => Err(bad()),
        },
        (Func::ToBool, [a]) => match a {
            V::Bool(b) => Ok(V::Bool(*b)),
            V::String(s) => match &**s {
                "true" | "True" | "TRUE" | "t" | "1" => Ok(V::Bool(true)),
                "false" | "False" | "FALSE" | "f" | "0" => Ok(V::Bool(false)),
                _ => Err(EvalError::runtime(format!("cannot convert {s:?} to bool"))),
            },
            _ => Err(bad()),
        },
        (Func::ToBytes, [a]) => match a {
            V::Bytes(_) => Ok(a.clone()),
            V::String(s) => Ok(V::Bytes(s.as_bytes().into())),
            _ => Err(bad()),
        },
        (Func::TypeOf, [a]) => Ok(V::Type(a.type_of())),
        (Func::Dyn, [a]) => Ok(a.clone()),
        (Func::ToDuration, [a]) => match a {
            V::Duration(_) => Ok(a.clone()),
            V::String(s) => crate::Duration::parse(s)
                .map(|d| V::Duration(i128::from(d.nanos())))
                .map_err(|e| EvalError::runtime(format!("invalid duration {s:?}: {e}"))),
            _ => Err(bad()),
        },
        (Func::ToTimestamp, [a]) => match a {
            V::Timestamp(_) => Ok(a.clone()),
            V::Int(secs) => timestamp(i128::from(*secs).saturating_mul(1_000_000_000)),
            V::String(s) => {
                let t =
                    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                        .map_err(|e| EvalError::runtime(format!("invalid timestamp {s:?}: {e}")))?;
                timestamp(t.unix_timestamp_nanos())
            }
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// `sets.contains`, `sets.equivalent` and `sets.intersects`.
fn sets(func: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    use Value as V;
    let bad = || overload(func, args);
    match (func, args) {
        (
            Func::SetsContains | Func::SetsEquivalent | Func::SetsIntersects,
            [V::List(a), V::List(b)],
        ) => {
            // Every pair compared costs 1, plus what comparing it costs.
            let member = |v: &Value, set: &[Value], meter: &mut Meter| -> Result<bool, EvalError> {
                for w in set {
                    meter.charge(1)?;
                    if equal(v, w, meter)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            };
            let all_in = |x: &[Value], y: &[Value], meter: &mut Meter| -> Result<bool, EvalError> {
                for v in x {
                    if !member(v, y, meter)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            };
            let out = match func {
                Func::SetsContains => all_in(b, a, meter)?,
                Func::SetsEquivalent => all_in(a, b, meter)? && all_in(b, a, meter)?,
                _ => {
                    let mut any = false;
                    for v in a.iter() {
                        if member(v, b, meter)? {
                            any = true;
                            break;
                        }
                    }
                    any
                }
            };
            Ok(V::Bool(out))
        }
        _ => Err(bad()),
    }
}

/// `optional.of`, `optional.none`, `orValue`, `hasValue` and `value`.
fn optionals(func: Func, args: &[Value]) -> Result<Value, EvalError> {
    use Value as V;
    let bad = || overload(func, args);
    match (func, args) {
        (Func::OptionalOf, [a]) => Ok(V::Optional(Some(Box::new(a.clone())))),
        (Func::OptionalNone, []) => Ok(V::Optional(None)),
        (Func::OrValue, [V::Optional(o), other]) => Ok(o.as_deref().unwrap_or(other).clone()),
        (Func::HasValue, [V::Optional(o)]) => Ok(V::Bool(o.is_some())),
        (Func::OptValue, [V::Optional(o)]) => o
            .as_deref()
            .cloned()
            .ok_or_else(|| EvalError::runtime("optional.none() dereference")),
        _ => Err(bad()),
    }
}

fn range() -> EvalError {
    EvalError::runtime("range error converting value")
}

fn no_such_key(k: &Value) -> EvalError {
    match k {
        Value::String(s) => EvalError::runtime(format!("no such key: {s}")),
        other => EvalError::runtime(format!("no such key: {other}")),
    }
}

/// `c[i]`: `Ok(None)` when the key or index is absent.
fn index(c: &Value, i: &Value) -> Result<Option<Value>, EvalError> {
    match c {
        Value::List(l) => {
            let idx = match i {
                Value::Int(x) => *x,
                Value::Uint(x) => i64::try_from(*x).unwrap_or(i64::MAX),
                Value::Double(d) if d.fract() == 0.0 && d.is_finite() => *d as i64,
                _ => return Err(overload(Func::Index, &[c.clone(), i.clone()])),
            };
            let Some(item) = usize::try_from(idx).ok().and_then(|i| l.get(i)) else {
                return Err(EvalError::runtime(format!(
                    "index out of bounds: {idx}, list of size {}",
                    l.len()
                )));
            };
            Ok(Some(item.clone()))
        }
        Value::Map(m) => {
            if Key::from_value(i).is_none() && !matches!(i, Value::Double(_)) {
                return Err(EvalError::runtime(format!(
                    "unsupported key type: {}",
                    i.type_of()
                )));
            }
            Ok(map_get(m, i).cloned())
        }
        _ => Err(overload(Func::Index, &[c.clone(), i.clone()])),
    }
}

pub(crate) fn no_such_key_error(field: &str) -> EvalError {
    EvalError::runtime(format!("no such key: {field}"))
}

/// CEL equality, charging 1 per element or entry compared and a tenth of the bytes of each
/// string compared, so comparing large aggregates costs what it does.
pub(crate) fn equal(a: &Value, b: &Value, meter: &mut Meter) -> Result<bool, EvalError> {
    match (a, b) {
        (Value::String(x), Value::String(y)) => {
            meter.charge(traversal(x.len().min(y.len())).saturating_sub(1))?;
            Ok(x == y)
        }
        (Value::Bytes(x), Value::Bytes(y)) => {
            meter.charge(traversal(x.len().min(y.len())).saturating_sub(1))?;
            Ok(x == y)
        }
        (Value::List(x), Value::List(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (p, q) in x.iter().zip(y.iter()) {
                meter.charge(1)?;
                if !equal(p, q, meter)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        (Value::Map(x), Value::Map(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (k, v) in x.iter() {
                meter.charge(1)?;
                match map_get(y, &k.to_value()) {
                    Some(w) if equal(v, w, meter)? => {}
                    _ => return Ok(false),
                }
            }
            Ok(true)
        }
        (Value::Optional(Some(x)), Value::Optional(Some(y))) => equal(x, y, meter),
        _ => Ok(a == b),
    }
}

fn add(a: &Value, b: &Value, meter: &mut Meter) -> Result<Value, EvalError> {
    use Value as V;
    match (a, b) {
        (V::Int(x), V::Int(y)) => x.checked_add(*y).map(V::Int).ok_or_else(overflow),
        (V::Uint(x), V::Uint(y)) => x.checked_add(*y).map(V::Uint).ok_or_else(overflow),
        (V::Double(x), V::Double(y)) => Ok(V::Double(x + y)),
        (V::String(x), V::String(y)) => {
            let n = x.len().saturating_add(y.len());
            if n > MAX_STRING_BYTES {
                return Err(EvalError::runtime(format!(
                    "string of {n} bytes exceeds the limit of {MAX_STRING_BYTES}"
                )));
            }
            meter.charge(traversal(n))?;
            let mut s = String::with_capacity(n);
            s.push_str(x);
            s.push_str(y);
            Ok(V::String(s.into()))
        }
        (V::Bytes(x), V::Bytes(y)) => {
            let n = x.len().saturating_add(y.len());
            if n > MAX_STRING_BYTES {
                return Err(EvalError::runtime(format!(
                    "bytes of {n} exceed the limit of {MAX_STRING_BYTES}"
                )));
            }
            meter.charge(traversal(n))?;
            Ok(V::Bytes(x.iter().chain(y.iter()).copied().collect()))
        }
        (V::List(x), V::List(y)) => {
            let n = x.len().saturating_add(y.len());
            check_list_len(n)?;
            meter.charge(traversal(n))?;
            Ok(V::List(x.iter().chain(y.iter()).cloned().collect()))
        }
        (V::Duration(x), V::Duration(y)) => {
            x.checked_add(*y).ok_or_else(overflow).and_then(duration)
        }
        (V::Timestamp(x), V::Duration(y)) | (V::Duration(y), V::Timestamp(x)) => {
            x.checked_add(*y).ok_or_else(overflow).and_then(timestamp)
        }
        _ => Err(overload(Func::Add, &[a.clone(), b.clone()])),
    }
}

/// CEL durations span about ±10000 years; timestamps years 1 to 9999.
const MAX_DURATION_NANOS: i128 = 315_576_000_000 * 1_000_000_000;
const MIN_TIMESTAMP_NANOS: i128 = -62_135_596_800 * 1_000_000_000;
const MAX_TIMESTAMP_NANOS: i128 = 253_402_300_799 * 1_000_000_000 + 999_999_999;

fn duration(ns: i128) -> Result<Value, EvalError> {
    if ns.abs() > MAX_DURATION_NANOS {
        return Err(EvalError::runtime("duration out of range"));
    }
    Ok(Value::Duration(ns))
}

fn timestamp(ns: i128) -> Result<Value, EvalError> {
    if !(MIN_TIMESTAMP_NANOS..=MAX_TIMESTAMP_NANOS).contains(&ns) {
        return Err(EvalError::runtime("timestamp out of range"));
    }
    Ok(Value::Timestamp(ns))
}

/// RFC 3339 in UTC, as `string(timestamp)` prints it.
pub(crate) fn format_timestamp(ns: i128) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(ns)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("timestamp({ns}ns)"))
}

/// Seconds with a fraction, as `string(duration)` prints it: `90s`, `1.5s`.
pub(crate) fn format_duration(ns: i128) -> String {
    let secs = ns / 1_000_000_000;
    let frac = (ns % 1_000_000_000).abs();
    let sign = if ns < 0 && secs == 0 { "-" } else { "" };
    if frac == 0 {
        format!("{sign}{secs}s")
    } else {
        let f = format!("{frac:09}");
        format!("{sign}{secs}.{}s", f.trim_end_matches('0'))
    }
}

/// A regex literal compiled once at load, with its length for the cost model.
#[derive(Debug)]
pub(crate) struct CompiledRegex {
    pub regex: Regex,
    pub len: usize,
}

impl CompiledRegex {
    pub fn new(pattern: &str) -> Result<Arc<Self>, String> {
        Ok(Arc::new(Self {
            regex: compile_regex(pattern)?,
            len: pattern.len(),
        }))
    }
}
