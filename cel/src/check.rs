//! The checker: resolves names and functions of a parsed CEL expression, checks the types
//! that are statically known, and lowers the `cel` crate's AST to the tree we evaluate.

use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, SourceInfo};

use super::functions::CompiledRegex;
use super::overloads::{self, Func};
use super::{CompileError, Env, MAX_EXPRESSION_LENGTH, MAX_NESTING_DEPTH, Type, Value};

/// A compiled expression: the tree to evaluate, its output type and its source.
#[derive(Debug)]
pub(crate) struct Checked {
    pub root: Node,
    pub output: Type,
    pub source: String,
}

/// The evaluated tree. Every name and function is resolved; regex literals are compiled.
#[derive(Debug)]
pub(crate) enum Node {
    Const(Value),
    /// A variable: a comprehension's local or one of the activation's.
    Var(Arc<str>),
    Select(Box<Node>, Arc<str>),
    /// `has(a.b)`.
    Has(Box<Node>, Arc<str>),
    /// `a.?b`.
    OptSelect(Box<Node>, Arc<str>),
    List(Vec<Node>),
    Map(Vec<(Node, Node)>),
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Not(Box<Node>),
    Cond(Box<Node>, Box<Node>, Box<Node>),
    /// True unless the operand is `false` (errors count as true): macros' loop condition.
    NotStrictlyFalse(Box<Node>),
    Call(Func, Vec<Node>),
    /// `s.matches('literal')`, with the regex compiled at load.
    MatchesLiteral(Box<Node>, Arc<CompiledRegex>),
    Comprehension(Box<Comprehension>),
}

impl Node {
    /// Whether this tree reads `field` of variable `var`: `var.field`, `has(var.field)`,
    /// `var.?field` or `var['field']`. A comprehension variable of the same name shadows it.
    pub fn selects(&self, var: &str, field: &str) -> bool {
        let is_var = |n: &Node| matches!(n, Node::Var(v) if &**v == var);
        match self {
            Node::Select(o, f) | Node::Has(o, f) | Node::OptSelect(o, f) => {
                (is_var(o) && &**f == field) || o.selects(var, field)
            }
            Node::Call(func, args) => {
                let indexed = matches!(func, Func::Index | Func::OptIndex)
                    && matches!(&args[..], [c, Node::Const(Value::String(k))] if is_var(c) && &**k == field);
                indexed || args.iter().any(|a| a.selects(var, field))
            }
            Node::Const(_) | Node::Var(_) => false,
            Node::List(items) => items.iter().any(|a| a.selects(var, field)),
            Node::Map(entries) => entries
                .iter()
                .any(|(k, v)| k.selects(var, field) || v.selects(var, field)),
            Node::And(a, b) | Node::Or(a, b) => a.selects(var, field) || b.selects(var, field),
            Node::Not(a) | Node::NotStrictlyFalse(a) | Node::MatchesLiteral(a, _) => {
                a.selects(var, field)
            }
            Node::Cond(a, b, c) => {
                a.selects(var, field) || b.selects(var, field) || c.selects(var, field)
            }
            Node::Comprehension(c) => {
                let shadowed = &*c.iter_var == var
                    || c.iter_var2.as_deref() == Some(var)
                    || &*c.accu_var == var;
                let body = match &c.step {
                    Step::Generic(n) => n.selects(var, field),
                    Step::Append { cond, elem } => {
                        elem.selects(var, field)
                            || cond.as_ref().is_some_and(|n| n.selects(var, field))
                    }
                };
                c.range.selects(var, field)
                    || c.init.selects(var, field)
                    || (!shadowed
                        && (body || c.cond.selects(var, field) || c.result.selects(var, field)))
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct Comprehension {
    pub range: Node,
    pub iter_var: Arc<str>,
    pub iter_var2: Option<Arc<str>>,
    pub accu_var: Arc<str>,
    pub init: Node,
    pub cond: Node,
    pub step: Step,
    pub result: Node,
}

/// The loop step of a comprehension.
#[derive(Debug)]
pub(crate) enum Step {
    Generic(Node),
    /// `map` and `filter`: append `elem` to the accumulated list (when `cond` holds), done
    /// in place rather than by copying the list on every iteration.
    Append {
        cond: Option<Node>,
        elem: Node,
    },
}

pub(crate) fn compile(expr: &str, env: &Env) -> Result<Checked, CompileError> {
    let len = expr.chars().count();
    if len > MAX_EXPRESSION_LENGTH {
        return Err(CompileError::new(format!(
            "ERROR: <input>:1:1: expression of {len} code points exceeds the limit of {MAX_EXPRESSION_LENGTH}"
        )));
    }
    // The parser recurses once per chained operator (`1 + 1 + ...`), which its nesting limit
    // does not see: bound the operators before parsing.
    let operators = expr.chars().filter(|c| OPERATOR_CHARS.contains(*c)).count();
    if operators > MAX_OPERATOR_CHARS {
        return Err(CompileError::new(format!(
            "ERROR: <input>:1:1: expression has {operators} operator characters, more than the limit of {MAX_OPERATOR_CHARS}"
        )));
    }
    let parsed = cel::parser::Parser::new()
        .max_recursion_depth(MAX_NESTING_DEPTH)
        .enable_optional_syntax(true)
        .parse_with_source_info(expr);
    let (ast, info) = match parsed {
        Ok(ok) => ok,
        Err(errs) => {
            let errors = errs
                .errors
                .iter()
                .map(|e| {
                    format!(
                        "ERROR: <input>:{}:{}: {}",
                        e.pos.0.max(1),
                        e.pos.1.max(1),
                        e.msg
                    )
                })
                .collect();
            return Err(CompileError { errors });
        }
    };
    let depth = ast_depth(&ast);
    if depth > MAX_NESTING_DEPTH as usize {
        return Err(CompileError::new(format!(
            "ERROR: <input>:1:1: expression nested {depth} levels deep, more than the limit of {MAX_NESTING_DEPTH}"
        )));
    }
    let mut checker = Checker {
        env,
        info: &info,
        source: expr,
        locals: Vec::new(),
        depth: 0,
    };
    let (root, output) = checker.check(&ast)?;
    Ok(Checked {
        root,
        output,
        source: expr.to_owned(),
    })
}

struct Checker<'a> {
    env: &'a Env,
    info: &'a SourceInfo,
    source: &'a str,
    locals: Vec<(String, Type)>,
    depth: usize,
}

/// Characters that may start an operator, a selection, an index or a call.
const OPERATOR_CHARS: &str = "+-*/%<>=!&|.[(?";

/// Most operator characters an expression may hold: the parser handles twice as many
/// chained operators on a 2 MiB stack.
const MAX_OPERATOR_CHARS: usize = 1000;

/// Deepest tree the checker walks (defence in depth: [`ast_depth`] is checked first).
const MAX_TREE_DEPTH: usize = 2 * MAX_NESTING_DEPTH as usize;

/// The depth of the parsed tree, macro expansions included, found without recursion. Chains
/// count: `1 + 1 + 1` is three levels deep, as cel-go's parser counts them.
fn ast_depth<'a>(root: &'a IdedExpr) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&'a IdedExpr, usize)> = vec![(root, 1)];
    while let Some((e, d)) = stack.pop() {
        deepest = deepest.max(d);
        let mut push = |c: &'a IdedExpr| stack.push((c, d.saturating_add(1)));
        match &e.expr {
            Expr::Call(c) => {
                if let Some(t) = &c.target {
                    push(t);
                }
                c.args.iter().for_each(&mut push);
            }
            Expr::Comprehension(c) => {
                for x in [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ] {
                    push(x);
                }
            }
            Expr::List(l) => l.elements.iter().for_each(&mut push),
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        push(&me.key);
                        push(&me.value);
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        push(&f.value);
                    }
                }
            }
            Expr::Select(sel) => push(&sel.operand),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
    deepest
}

impl Checker<'_> {
    fn error(&self, id: u64, msg: impl std::fmt::Display) -> CompileError {
        let (line, col) = match self.info.offset_for(id) {
            Some((start, _)) => line_col(self.source, start as usize),
            None => (1, 1),
        };
        CompileError::new(format!("ERROR: <input>:{line}:{col}: {msg}"))
    }

    fn check(&mut self, e: &IdedExpr) -> Result<(Node, Type), CompileError> {
        self.depth = self.depth.saturating_add(1);
        if self.depth > MAX_TREE_DEPTH {
            return Err(self.error(e.id, "expression nested too deeply"));
        }
        let r = self.check_inner(e);
        self.depth = self.depth.saturating_sub(1);
        r
    }

    fn check_inner(&mut self, e: &IdedExpr) -> Result<(Node, Type), CompileError> {
        match &e.expr {
            Expr::Literal(l) => Ok(literal(l)),
            Expr::Ident(name) => self.ident(e.id, name),
            Expr::Select(sel) => {
                let (operand, ty) = self.check(&sel.operand)?;
                let field: Arc<str> = sel.field.as_str().into();
                let out = match &ty {
                    Type::Map(k, v) if k.assignable_to(&Type::String) => (**v).clone(),
                    Type::Dyn => Type::Dyn,
                    // `a.?b.c` selects within the optional.
                    Type::Optional(_) if !sel.test => Type::Optional(Box::new(Type::Dyn)),
                    other => {
                        return Err(self.error(
                            e.id,
                            format!("type '{}' does not support field selection", other.name()),
                        ));
                    }
                };
                if sel.test {
                    Ok((Node::Has(Box::new(operand), field), Type::Bool))
                } else {
                    Ok((Node::Select(Box::new(operand), field), out))
                }
            }
            Expr::List(list) => {
                if !list.optional_indices.is_empty() {
                    return Err(self.error(e.id, "optional list elements are not supported"));
                }
                let mut nodes = Vec::with_capacity(list.elements.len());
                let mut elem: Option<Type> = None;
                for x in &list.elements {
                    let (n, t) = self.check(x)?;
                    nodes.push(n);
                    elem = Some(join(elem, t));
                }
                Ok((Node::List(nodes), Type::list(elem.unwrap_or(Type::Dyn))))
            }
            Expr::Map(map) => {
                let mut entries = Vec::with_capacity(map.entries.len());
                let (mut kt, mut vt): (Option<Type>, Option<Type>) = (None, None);
                for entry in &map.entries {
                    let EntryExpr::MapEntry(me) = &entry.expr else {
                        return Err(self.error(entry.id, "unsupported map entry"));
                    };
                    if me.optional {
                        return Err(self.error(entry.id, "optional map entries are not supported"));
                    }
                    let (k, ktype) = self.check(&me.key)?;
                    if !matches!(
                        ktype,
                        Type::String | Type::Int | Type::Uint | Type::Bool | Type::Dyn
                    ) {
                        return Err(self.error(
                            me.key.id,
                            format!("unsupported map key type '{}'", ktype.name()),
                        ));
                    }
                    let (v, vtype) = self.check(&me.value)?;
                    kt = Some(join(kt, ktype));
                    vt = Some(join(vt, vtype));
                    entries.push((k, v));
                }
                Ok((
                    Node::Map(entries),
                    Type::map(kt.unwrap_or(Type::Dyn), vt.unwrap_or(Type::Dyn)),
                ))
            }
            Expr::Struct(s) => {
                Err(self.error(e.id, format!("undeclared reference to '{}'", s.type_name)))
            }
            Expr::Comprehension(c) => self.comprehension(e.id, c),
            Expr::Call(call) => {
                self.call(e.id, &call.func_name, call.target.as_deref(), &call.args)
            }
            Expr::Unspecified => Err(self.error(e.id, "unsupported expression")),
        }
    }

    fn ident(&self, id: u64, name: &str) -> Result<(Node, Type), CompileError> {
        if let Some((_, t)) = self.locals.iter().rev().find(|(n, _)| n == name) {
            return Ok((Node::Var(name.into()), t.clone()));
        }
        if let Some(t) = self.env.lookup(name) {
            return Ok((Node::Var(name.into()), t.clone()));
        }
        let ty = match name {
            "int" => Type::Int,
            "uint" => Type::Uint,
            "double" => Type::Double,
            "string" => Type::String,
            "bytes" => Type::Bytes,
            "bool" => Type::Bool,
            "null_type" => Type::Null,
            "list" => Type::list(Type::Dyn),
            "map" => Type::map(Type::Dyn, Type::Dyn),
            "type" => Type::Type,
            "google.protobuf.Timestamp" => Type::Timestamp,
            "google.protobuf.Duration" => Type::Duration,
            _ => return Err(self.error(id, format!("undeclared reference to '{name}'"))),
        };
        Ok((Node::Const(Value::Type(ty)), Type::Type))
    }

    fn bool_operand(&mut self, e: &IdedExpr, op: &str) -> Result<Node, CompileError> {
        let (n, t) = self.check(e)?;
        if !t.assignable_to(&Type::Bool) {
            return Err(self.error(
                e.id,
                format!(
                    "found no matching overload for '{op}' applied to '{}'",
                    t.name()
                ),
            ));
        }
        Ok(n)
    }

    fn call(
        &mut self,
        id: u64,
        name: &str,
        target: Option<&IdedExpr>,
        args: &[IdedExpr],
    ) -> Result<(Node, Type), CompileError> {
        if let Some(special) = self.special_form(id, name, target, args)? {
            return Ok(special);
        }
        let qualified = self.qualified_name(name, target);
        let receiver = target.is_some() && qualified.is_none();
        let mut nodes = Vec::with_capacity(args.len().saturating_add(1));
        let mut types = Vec::with_capacity(args.len().saturating_add(1));
        if let (Some(t), true) = (target, receiver) {
            let (n, ty) = self.check(t)?;
            nodes.push(n);
            types.push(ty);
        }
        for a in args {
            let (n, ty) = self.check(a)?;
            nodes.push(n);
            types.push(ty);
        }
        let resolved = if name.starts_with('_') || name.starts_with('@') || name == "-_" {
            overloads::resolve_operator(name, &types)
        } else {
            overloads::resolve_named(qualified.as_deref().unwrap_or(name), receiver, &types)
        };
        let (func, out) = resolved.map_err(|m| self.error(id, m))?;
        // A literal pattern is compiled once, here, and a bad one is a compile error.
        if func == Func::Matches {
            let pattern_arg = if receiver { args.first() } else { args.get(1) };
            if let Some(IdedExpr {
                expr: Expr::Literal(LiteralValue::String(p)),
                id: pid,
            }) = pattern_arg
            {
                let re = CompiledRegex::new(p.inner()).map_err(|m| self.error(*pid, m))?;
                let input = nodes.swap_remove(0);
                return Ok((Node::MatchesLiteral(Box::new(input), re), out));
            }
        }
        Ok((Node::Call(func, nodes), out))
    }

    /// The calls that are not functions: `&&`, `||`, `!`, `@not_strictly_false`, `?:` and
    /// `?.`; `None` for any other call.
    fn special_form(
        &mut self,
        id: u64,
        name: &str,
        target: Option<&IdedExpr>,
        args: &[IdedExpr],
    ) -> Result<Option<(Node, Type)>, CompileError> {
        let b = Box::new;
        let out = match (name, target, args) {
            ("_&&_" | "_||_", None, [l, r]) => {
                let op = if name == "_&&_" { "&&" } else { "||" };
                let l = self.bool_operand(l, op)?;
                let r = self.bool_operand(r, op)?;
                let node = if name == "_&&_" {
                    Node::And(b(l), b(r))
                } else {
                    Node::Or(b(l), b(r))
                };
                (node, Type::Bool)
            }
            ("!_", None, [x]) => (Node::Not(b(self.bool_operand(x, "!")?)), Type::Bool),
            ("@not_strictly_false", None, [x]) => (
                Node::NotStrictlyFalse(b(self.bool_operand(x, "@not_strictly_false")?)),
                Type::Bool,
            ),
            ("_?_:_", None, [c, t, f]) => self.conditional(id, c, t, f)?,
            ("_?._", None, [operand, field]) => self.optional_select(id, operand, field)?,
            _ => return Ok(None),
        };
        Ok(Some(out))
    }

    /// `c ? t : f`: both branches of one type, or `dyn` where one is assignable to the other.
    fn conditional(
        &mut self,
        id: u64,
        c: &IdedExpr,
        t: &IdedExpr,
        f: &IdedExpr,
    ) -> Result<(Node, Type), CompileError> {
        let c = self.bool_operand(c, "_?_:_")?;
        let (tn, tt) = self.check(t)?;
        let (fnode, ft) = self.check(f)?;
        let out = if tt == ft {
            tt
        } else if tt.assignable_to(&ft) || ft.assignable_to(&tt) {
            Type::Dyn
        } else {
            return Err(self.error(
                id,
                format!(
                    "found no matching overload for '_?_:_' applied to '(bool, {}, {})'",
                    tt.name(),
                    ft.name()
                ),
            ));
        };
        Ok((Node::Cond(Box::new(c), Box::new(tn), Box::new(fnode)), out))
    }

    /// `operand.?field`.
    fn optional_select(
        &mut self,
        id: u64,
        operand: &IdedExpr,
        field: &IdedExpr,
    ) -> Result<(Node, Type), CompileError> {
        let Expr::Literal(LiteralValue::String(field)) = &field.expr else {
            return Err(self.error(id, "unsupported optional selection"));
        };
        let (n, t) = self.check(operand)?;
        let out = match &t {
            Type::Map(_, v) => (**v).clone(),
            Type::Dyn | Type::Optional(_) => Type::Dyn,
            other => {
                return Err(self.error(
                    id,
                    format!("type '{}' does not support field selection", other.name()),
                ));
            }
        };
        Ok((
            Node::OptSelect(Box::new(n), field.inner().into()),
            Type::Optional(Box::new(out)),
        ))
    }

    /// Namespaced functions: `sets.contains(a, b)` parses as a call on the identifier `sets`;
    /// the qualified name when `target` is such a namespace and not a variable.
    fn qualified_name(&self, name: &str, target: Option<&IdedExpr>) -> Option<String> {
        let Some(IdedExpr {
            expr: Expr::Ident(ns),
            ..
        }) = target
        else {
            return None;
        };
        let q = format!("{ns}.{name}");
        (self.env.lookup(ns).is_none()
            && !self.locals.iter().any(|(n, _)| n == ns)
            && overloads::is_known(&q))
        .then_some(q)
    }

    fn comprehension(
        &mut self,
        id: u64,
        c: &cel::common::ast::ComprehensionExpr,
    ) -> Result<(Node, Type), CompileError> {
        let (range, range_t) = self.check(&c.iter_range)?;
        let (t1, t2) = match (&range_t, c.iter_var2.is_some()) {
            (Type::List(e), false) => ((**e).clone(), Type::Dyn),
            (Type::List(e), true) => (Type::Int, (**e).clone()),
            (Type::Map(k, v), _) => ((**k).clone(), (**v).clone()),
            (Type::Dyn, _) => (Type::Dyn, Type::Dyn),
            (other, _) => {
                return Err(self.error(
                    id,
                    format!("expression of type '{}' cannot be the range of a comprehension (must be list, map, or dynamic)", other.name()),
                ));
            }
        };
        let (init, accu_t) = self.check(&c.accu_init)?;
        let base = self.locals.len();
        // The accumulator's type follows the step: an empty list literal starts as list(dyn).
        self.locals.push((c.accu_var.clone(), accu_t.clone()));
        self.locals.push((c.iter_var.clone(), t1));
        if let Some(v2) = &c.iter_var2 {
            self.locals.push((v2.clone(), t2));
        }
        let checked = (|| {
            let (cond, _) = (self.check(&c.loop_cond))?;
            let step = self.step(c)?;
            Ok::<_, CompileError>((cond, step))
        })();
        self.locals.truncate(base);
        let (cond, (step, step_t)) = checked?;
        let result_accu_t = if accu_t == step_t || matches!(step, Step::Append { .. }) {
            step_t
        } else {
            join(Some(accu_t), step_t)
        };
        self.locals.push((c.accu_var.clone(), result_accu_t));
        let result = self.check(&c.result);
        self.locals.truncate(base);
        let (result, out) = result?;
        let node = Comprehension {
            range,
            iter_var: c.iter_var.as_str().into(),
            iter_var2: c.iter_var2.as_deref().map(Into::into),
            accu_var: c.accu_var.as_str().into(),
            init,
            cond,
            step,
            result,
        };
        Ok((Node::Comprehension(Box::new(node)), out))
    }

    /// Lowers the loop step, recognising the `accu + [elem]` shape of `map` and `filter`.
    fn step(
        &mut self,
        c: &cel::common::ast::ComprehensionExpr,
    ) -> Result<(Step, Type), CompileError> {
        let accu = c.accu_var.as_str();
        let is_accu = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(n) if n == accu);
        let append_of = |e: &IdedExpr| -> Option<IdedExpr> {
            match &e.expr {
                Expr::Call(call) if call.func_name == "_+_" && call.target.is_none() => match &call
                    .args[..]
                {
                    [
                        a,
                        IdedExpr {
                            expr: Expr::List(l),
                            ..
                        },
                    ] if is_accu(a) && l.elements.len() == 1 && l.optional_indices.is_empty() => {
                        l.elements.first().cloned()
                    }
                    _ => None,
                },
                _ => None,
            }
        };
        let empty_init = matches!(&c.accu_init.expr, Expr::List(l) if l.elements.is_empty());
        let result_is_accu = is_accu(&c.result);
        if empty_init && result_is_accu {
            if let Some(elem) = append_of(&c.loop_step) {
                let (elem, t) = self.check(&elem)?;
                return Ok((Step::Append { cond: None, elem }, Type::list(t)));
            }
            if let Expr::Call(call) = &c.loop_step.expr
                && let ("_?_:_", None, [cond, then, otherwise]) =
                    (call.func_name.as_str(), &call.target, &call.args[..])
                && let (Some(elem), true) = (append_of(then), is_accu(otherwise))
            {
                let cond = self.bool_operand(cond, "_?_:_")?;
                let (elem, t) = self.check(&elem)?;
                return Ok((
                    Step::Append {
                        cond: Some(cond),
                        elem,
                    },
                    Type::list(t),
                ));
            }
        }
        let (n, t) = self.check(&c.loop_step)?;
        Ok((Step::Generic(n), t))
    }
}

/// The type of a list or map literal holding values of types `a` and `b`.
fn join(a: Option<Type>, b: Type) -> Type {
    match a {
        None => b,
        Some(a) if a == b => a,
        Some(Type::List(x)) if matches!(b, Type::List(_)) => {
            let Type::List(y) = b else { unreachable!() };
            Type::list(join(Some(*x), *y))
        }
        Some(_) => Type::Dyn,
    }
}

fn literal(l: &LiteralValue) -> (Node, Type) {
    let (v, t) = match l {
        LiteralValue::Boolean(b) => (Value::Bool(**b), Type::Bool),
        LiteralValue::Int(i) => (Value::Int(**i), Type::Int),
        LiteralValue::UInt(u) => (Value::Uint(**u), Type::Uint),
        LiteralValue::Double(d) => (Value::Double(**d), Type::Double),
        LiteralValue::String(s) => (Value::String(s.inner().into()), Type::String),
        LiteralValue::Bytes(b) => (Value::Bytes(b.inner().into()), Type::Bytes),
        LiteralValue::Null => (Value::Null, Type::Null),
    };
    (Node::Const(v), t)
}

/// 1-based line and column of code point `offset` in `source`.
fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let (mut line, mut col) = (1usize, 1usize);
    for c in source.chars().take(offset) {
        if c == '\n' {
            line = line.saturating_add(1);
            col = 1;
        } else {
            col = col.saturating_add(1);
        }
    }
    (line, col)
}
