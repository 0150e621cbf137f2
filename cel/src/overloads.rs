//! CEL function and operator overloads: what the checker resolves a call to, and its result type.

use super::Type;

/// A resolved function or operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Func {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Neg,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    Index,
    OptIndex,
    Size,
    Contains,
    StartsWith,
    EndsWith,
    Matches,
    LowerAscii,
    UpperAscii,
    Trim,
    Split,
    Join,
    Replace,
    IndexOf,
    LastIndexOf,
    Substring,
    ToInt,
    ToUint,
    ToDouble,
    ToString,
    ToBool,
    ToBytes,
    TypeOf,
    Dyn,
    ToDuration,
    ToTimestamp,
    SetsContains,
    SetsEquivalent,
    SetsIntersects,
    OptionalOf,
    OptionalNone,
    OrValue,
    HasValue,
    OptValue,
}

/// One overload: whether it is called on a receiver, parameter types (receiver first), result.
struct Sig(bool, Vec<Type>, Type);

fn sig(receiver: bool, params: &[Type], result: Type) -> Sig {
    Sig(receiver, params.to_vec(), result)
}

fn both(out: &mut Vec<Sig>, params: &[Type], result: Type) {
    out.push(sig(true, params, result.clone()));
    out.push(sig(false, params, result));
}

/// The named (non-operator) functions: `sets.*` and `optional.*` are spelt with their
/// namespace, as `sets.contains`.
fn named(name: &str) -> Option<(Func, Vec<Sig>)> {
    let mut o = Vec::new();
    let f = if let Some(f) = named_string(name, &mut o) {
        f
    } else if let Some(f) = named_conversion(name, &mut o) {
        f
    } else {
        named_set_or_optional(name, &mut o)?
    };
    Some((f, o))
}

/// `size` and the string extension functions, pushing their overloads onto `o`.
fn named_string(name: &str, o: &mut Vec<Sig>) -> Option<Func> {
    use Type as T;
    let s = T::String;
    let i = T::Int;
    let dl = T::list(T::Dyn);
    let f = match name {
        "size" => {
            for t in [T::String, T::Bytes, dl.clone(), T::map(T::Dyn, T::Dyn)] {
                both(o, &[t], T::Int);
            }
            Func::Size
        }
        "contains" | "startsWith" | "endsWith" => {
            o.push(sig(true, &[s.clone(), s.clone()], T::Bool));
            match name {
                "contains" => Func::Contains,
                "startsWith" => Func::StartsWith,
                _ => Func::EndsWith,
            }
        }
        "matches" => {
            both(o, &[s.clone(), s.clone()], T::Bool);
            Func::Matches
        }
        "lowerAscii" | "upperAscii" | "trim" => {
            o.push(sig(true, std::slice::from_ref(&s), s.clone()));
            match name {
                "lowerAscii" => Func::LowerAscii,
                "upperAscii" => Func::UpperAscii,
                _ => Func::Trim,
            }
        }
        "split" => {
            o.push(sig(true, &[s.clone(), s.clone()], T::list(s.clone())));
            o.push(sig(
                true,
                &[s.clone(), s.clone(), i.clone()],
                T::list(s.clone()),
            ));
            Func::Split
        }
        "join" => {
            o.push(sig(true, &[T::list(s.clone())], s.clone()));
            o.push(sig(true, &[T::list(s.clone()), s.clone()], s.clone()));
            Func::Join
        }
        "replace" => {
            o.push(sig(true, &[s.clone(), s.clone(), s.clone()], s.clone()));
            o.push(sig(
                true,
                &[s.clone(), s.clone(), s.clone(), i.clone()],
                s.clone(),
            ));
            Func::Replace
        }
        "indexOf" | "lastIndexOf" => {
            o.push(sig(true, &[s.clone(), s.clone()], i.clone()));
            o.push(sig(true, &[s.clone(), s.clone(), i.clone()], i.clone()));
            if name == "indexOf" {
                Func::IndexOf
            } else {
                Func::LastIndexOf
            }
        }
        "substring" => {
            o.push(sig(true, &[s.clone(), i.clone()], s.clone()));
            o.push(sig(true, &[s.clone(), i.clone(), i.clone()], s.clone()));
            Func::Substring
        }
        _ => return None,
    };
    Some(f)
}

/// The conversion functions (`int`, `string`, `timestamp`, ...), pushing their overloads onto `o`.
fn named_conversion(name: &str, o: &mut Vec<Sig>) -> Option<Func> {
    use Type as T;
    let f = match name {
        "int" => {
            for t in [
                T::Int,
                T::Uint,
                T::Double,
                T::String,
                T::Timestamp,
                T::Duration,
            ] {
                o.push(sig(false, &[t], T::Int));
            }
            Func::ToInt
        }
        "uint" => {
            for t in [T::Int, T::Uint, T::Double, T::String] {
                o.push(sig(false, &[t], T::Uint));
            }
            Func::ToUint
        }
        "double" => {
            for t in [T::Int, T::Uint, T::Double, T::String] {
                o.push(sig(false, &[t], T::Double));
            }
            Func::ToDouble
        }
        "string" => {
            for t in [
                T::Int,
                T::Uint,
                T::Double,
                T::String,
                T::Bool,
                T::Bytes,
                T::Timestamp,
                T::Duration,
            ] {
                o.push(sig(false, &[t], T::String));
            }
            Func::ToString
        }
        "bool" => {
            for t in [T::Bool, T::String] {
                o.push(sig(false, &[t], T::Bool));
            }
            Func::ToBool
        }
        "bytes" => {
            for t in [T::Bytes, T::String] {
                o.push(sig(false, &[t], T::Bytes));
            }
            Func::ToBytes
        }
        "type" => {
            o.push(sig(false, &[T::Dyn], T::Type));
            Func::TypeOf
        }
        "dyn" => {
            o.push(sig(false, &[T::Dyn], T::Dyn));
            Func::Dyn
        }
        "duration" => {
            for t in [T::String, T::Duration] {
                o.push(sig(false, &[t], T::Duration));
            }
            Func::ToDuration
        }
        "timestamp" => {
            for t in [T::String, T::Timestamp, T::Int] {
                o.push(sig(false, &[t], T::Timestamp));
            }
            Func::ToTimestamp
        }
        _ => return None,
    };
    Some(f)
}

/// `sets.*`, `optional.*` and the optional methods, pushing their overloads onto `o`.
fn named_set_or_optional(name: &str, o: &mut Vec<Sig>) -> Option<Func> {
    use Type as T;
    let dl = T::list(T::Dyn);
    let f = match name {
        "sets.contains" | "sets.equivalent" | "sets.intersects" => {
            o.push(sig(false, &[dl.clone(), dl.clone()], T::Bool));
            match name {
                "sets.contains" => Func::SetsContains,
                "sets.equivalent" => Func::SetsEquivalent,
                _ => Func::SetsIntersects,
            }
        }
        "optional.of" => {
            o.push(sig(false, &[T::Dyn], T::Optional(Box::new(T::Dyn))));
            Func::OptionalOf
        }
        "optional.none" => {
            o.push(sig(false, &[], T::Optional(Box::new(T::Dyn))));
            Func::OptionalNone
        }
        "orValue" => {
            o.push(sig(true, &[T::Optional(Box::new(T::Dyn)), T::Dyn], T::Dyn));
            Func::OrValue
        }
        "hasValue" => {
            o.push(sig(true, &[T::Optional(Box::new(T::Dyn))], T::Bool));
            Func::HasValue
        }
        "value" => {
            o.push(sig(true, &[T::Optional(Box::new(T::Dyn))], T::Dyn));
            Func::OptValue
        }
        _ => return None,
    };
    Some(f)
}

/// Whether `name` is a function we know (for "undeclared reference" versus "no overload").
pub(crate) fn is_known(name: &str) -> bool {
    named(name).is_some()
}

pub(crate) fn arg_list(args: &[Type]) -> String {
    let names: Vec<String> = args.iter().map(Type::name).collect();
    format!("({})", names.join(", "))
}

fn no_overload(name: &str, args: &[Type]) -> String {
    format!(
        "found no matching overload for '{name}' applied to '{}'",
        arg_list(args)
    )
}

/// Resolves a named function call to its implementation and result type.
pub(crate) fn resolve_named(
    name: &str,
    receiver: bool,
    args: &[Type],
) -> Result<(Func, Type), String> {
    let Some((func, sigs)) = named(name) else {
        return Err(format!("undeclared reference to '{name}'"));
    };
    let mut result: Option<Type> = None;
    for Sig(recv, params, out) in &sigs {
        if *recv != receiver || params.len() != args.len() {
            continue;
        }
        if args.iter().zip(params).all(|(a, p)| a.assignable_to(p)) {
            let out = refine(func, args, out.clone());
            result = Some(match result {
                None => out,
                Some(prev) if prev == out => prev,
                Some(_) => Type::Dyn,
            });
        }
    }
    match result {
        Some(t) => Ok((func, t)),
        None => Err(no_overload(name, args)),
    }
}

/// Result types that depend on the argument types.
fn refine(func: Func, args: &[Type], out: Type) -> Type {
    match (func, args) {
        (Func::OptionalOf, [t]) => Type::Optional(Box::new(t.clone())),
        (Func::OrValue | Func::OptValue, [Type::Optional(t), ..]) => (**t).clone(),
        _ => out,
    }
}

fn numeric(t: &Type) -> bool {
    matches!(t, Type::Int | Type::Uint | Type::Double | Type::Dyn)
}

/// How an operator is spelt in error messages.
fn operator_display(op: &str) -> &str {
    match op {
        "_+_" => "+",
        "_-_" | "-_" => "-",
        "_*_" => "*",
        "_/_" => "/",
        "_%_" => "%",
        "_==_" => "==",
        "_!=_" => "!=",
        "_<_" => "<",
        "_<=_" => "<=",
        "_>_" => ">",
        "_>=_" => ">=",
        "@in" => "in",
        "_[_]" | "_[?_]" => "[]",
        other => other,
    }
}

/// The type both operands share, `Dyn` standing for any.
fn same(a: &Type, b: &Type) -> Option<Type> {
    use Type as T;
    match (a, b) {
        (T::Dyn, x) | (x, T::Dyn) => Some(x.clone()),
        (x, y) if x == y => Some(x.clone()),
        (x, y) if x.assignable_to(y) => Some(T::Dyn),
        _ => None,
    }
}

fn undeclared(op: &str) -> String {
    format!("undeclared reference to '{op}'")
}

/// Resolves an operator (`_+_`, `_==_`, `@in`, `_[_]`, ...) by the types of its operands.
pub(crate) fn resolve_operator(op: &str, args: &[Type]) -> Result<(Func, Type), String> {
    match op {
        "_+_" | "_-_" | "_*_" | "_/_" | "_%_" | "-_" => resolve_arithmetic(op, args),
        _ => resolve_comparison_or_index(op, args),
    }
}

/// `+ - * / %` and unary `-`.
fn resolve_arithmetic(op: &str, args: &[Type]) -> Result<(Func, Type), String> {
    use Type as T;
    let fail = || no_overload(operator_display(op), args);
    match (op, args) {
        ("_+_", [a, b]) => {
            match (a, b) {
                (T::Timestamp, T::Duration) | (T::Duration, T::Timestamp) => {
                    return Ok((Func::Add, T::Timestamp));
                }
                _ => {}
            }
            let t = same(a, b).ok_or_else(fail)?;
            let ok = matches!(
                &t,
                T::Int
                    | T::Uint
                    | T::Double
                    | T::String
                    | T::Bytes
                    | T::List(_)
                    | T::Dyn
                    | T::Duration
            );
            if ok { Ok((Func::Add, t)) } else { Err(fail()) }
        }
        ("_-_", [a, b]) => match (a, b) {
            (T::Timestamp, T::Timestamp) => Ok((Func::Sub, T::Duration)),
            (T::Timestamp, T::Duration) => Ok((Func::Sub, T::Timestamp)),
            _ => match same(a, b) {
                Some(t @ (T::Int | T::Uint | T::Double | T::Duration | T::Dyn)) => {
                    Ok((Func::Sub, t))
                }
                _ => Err(fail()),
            },
        },
        ("_*_" | "_/_", [a, b]) => match same(a, b) {
            Some(t @ (T::Int | T::Uint | T::Double | T::Dyn)) => {
                Ok((if op == "_*_" { Func::Mul } else { Func::Div }, t))
            }
            _ => Err(fail()),
        },
        ("_%_", [a, b]) => match same(a, b) {
            Some(t @ (T::Int | T::Uint | T::Dyn)) => Ok((Func::Mod, t)),
            _ => Err(fail()),
        },
        ("-_", [a]) => match a {
            T::Int | T::Double | T::Duration | T::Dyn => Ok((Func::Neg, a.clone())),
            _ => Err(fail()),
        },
        _ => Err(undeclared(op)),
    }
}

/// Equality, ordering, `in` and indexing.
fn resolve_comparison_or_index(op: &str, args: &[Type]) -> Result<(Func, Type), String> {
    use Type as T;
    let fail = || no_overload(operator_display(op), args);
    match (op, args) {
        ("_==_" | "_!=_", [a, b]) => {
            if a.assignable_to(b)
                || b.assignable_to(a)
                || (numeric(a) && numeric(b))
                || *a == T::Null
                || *b == T::Null
            {
                Ok((if op == "_==_" { Func::Eq } else { Func::Ne }, T::Bool))
            } else {
                Err(fail())
            }
        }
        ("_<_" | "_<=_" | "_>_" | "_>=_", [a, b]) => {
            let ok = (numeric(a) && numeric(b))
                || matches!(
                    same(a, b),
                    Some(T::String | T::Bytes | T::Bool | T::Timestamp | T::Duration | T::Dyn)
                );
            if !ok {
                return Err(fail());
            }
            let f = match op {
                "_<_" => Func::Lt,
                "_<=_" => Func::Le,
                "_>_" => Func::Gt,
                _ => Func::Ge,
            };
            Ok((f, T::Bool))
        }
        ("@in", [a, c]) => match c {
            T::List(e) if a.assignable_to(e) || (numeric(a) && numeric(e)) => {
                Ok((Func::In, T::Bool))
            }
            T::Map(k, _) if a.assignable_to(k) || (numeric(a) && numeric(k)) => {
                Ok((Func::In, T::Bool))
            }
            T::Dyn => Ok((Func::In, T::Bool)),
            _ => Err(fail()),
        },
        ("_[_]" | "_[?_]", [c, i]) => {
            let elem = match c {
                T::List(e) if matches!(i, T::Int | T::Uint | T::Dyn) => (**e).clone(),
                T::Map(k, v) if i.assignable_to(k) || (numeric(i) && numeric(k)) => (**v).clone(),
                T::Dyn => T::Dyn,
                T::Optional(_) if op == "_[?_]" => T::Dyn,
                _ => return Err(fail()),
            };
            if op == "_[_]" {
                Ok((Func::Index, elem))
            } else {
                Ok((Func::OptIndex, T::Optional(Box::new(elem))))
            }
        }
        _ => Err(undeclared(op)),
    }
}
