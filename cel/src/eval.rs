//! The evaluator: walks a checked tree, charging every step against the budget.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::check::{Comprehension, Node, Step};
use super::functions::{CompiledRegex, call, no_such_key_error, regex_cost};
use super::value::{Key, Value, map_get};
use super::{Activation, EvalError, MAX_LIST_LEN};

/// Cost of a list literal, besides its elements (the spec's figure).
pub(crate) const LIST_LITERAL_COST: u64 = 40;
/// Cost of a map literal, besides its entries (cel-go's `MapCreateBaseCost`).
pub(crate) const MAP_LITERAL_COST: u64 = 30;

/// Counts cost spent against a budget.
#[derive(Debug)]
pub(crate) struct Meter {
    used: u64,
    budget: u64,
}

impl Meter {
    /// Adds `n`; fails once the total is over the budget.
    pub fn charge(&mut self, n: u64) -> Result<(), EvalError> {
        self.used = self.used.saturating_add(n);
        if self.used > self.budget {
            return Err(EvalError::CostLimitExceeded);
        }
        Ok(())
    }
}

pub(crate) fn run(root: &Node, vars: &Activation, budget: u64) -> Result<(Value, u64), EvalError> {
    let mut ev = Evaluator {
        vars,
        locals: Vec::new(),
        meter: Meter { used: 0, budget },
    };
    let v = ev.eval(root)?;
    charge_output(&v, &mut ev.meter)?;
    Ok((v, ev.meter.used))
}

/// Charges for the size of the result once flattened: values are shared, so a list of a
/// thousand references to one large string is cheap to build but not to use (as JSON, as
/// user names). Each element or entry costs 1, each string a tenth of its bytes.
fn charge_output(v: &Value, meter: &mut Meter) -> Result<(), EvalError> {
    match v {
        Value::String(s) => meter.charge(s.len() as u64 / 10),
        Value::Bytes(b) => meter.charge(b.len() as u64 / 10),
        Value::List(l) => l.iter().try_for_each(|x| {
            meter.charge(1)?;
            charge_output(x, meter)
        }),
        Value::Map(m) => m.iter().try_for_each(|(k, x)| {
            meter.charge(1)?;
            charge_output(&k.to_value(), meter)?;
            charge_output(x, meter)
        }),
        Value::Optional(Some(x)) => charge_output(x, meter),
        _ => Ok(()),
    }
}

struct Evaluator<'a> {
    vars: &'a Activation,
    locals: Vec<(Arc<str>, Result<Value, EvalError>)>,
    meter: Meter,
}

fn no_overload(what: &str, v: &Value) -> EvalError {
    EvalError::runtime(format!(
        "no such overload: {what} applied to {}",
        v.type_of()
    ))
}

impl Evaluator<'_> {
    fn eval(&mut self, n: &Node) -> Result<Value, EvalError> {
        match n {
            Node::Const(v) => Ok(v.clone()),
            Node::Var(name) => self.var(name),
            Node::Select(operand, field) => {
                let v = self.eval(operand)?;
                self.meter.charge(1)?;
                match v {
                    Value::Optional(o) => Ok(Value::Optional(match o {
                        Some(inner) => select(&inner, field)?.map(Box::new),
                        None => None,
                    })),
                    other => select(&other, field)?.ok_or_else(|| no_such_key_error(field)),
                }
            }
            Node::OptSelect(operand, field) => {
                let v = self.eval(operand)?;
                self.meter.charge(1)?;
                Ok(Value::Optional(match v {
                    Value::Optional(None) => None,
                    Value::Optional(Some(inner)) => select(&inner, field)?.map(Box::new),
                    other => select(&other, field)?.map(Box::new),
                }))
            }
            Node::Has(operand, field) => {
                let v = self.eval(operand)?;
                self.meter.charge(1)?;
                match &v {
                    Value::Map(m) => Ok(Value::Bool(m.contains_key(&Key::String(field.clone())))),
                    other => Err(no_overload("has()", other)),
                }
            }
            Node::List(items) => {
                self.meter.charge(LIST_LITERAL_COST)?;
                let mut out = Vec::with_capacity(items.len());
                for i in items {
                    out.push(self.eval(i)?);
                }
                Ok(Value::List(out.into()))
            }
            Node::Map(entries) => self.map_literal(entries),
            Node::And(l, r) => self.logic(l, r, false),
            Node::Or(l, r) => self.logic(l, r, true),
            Node::Not(x) => {
                let v = self.eval(x)?;
                self.meter.charge(1)?;
                match v {
                    Value::Bool(b) => Ok(Value::Bool(!b)),
                    other => Err(no_overload("!_", &other)),
                }
            }
            Node::NotStrictlyFalse(x) => match self.eval(x) {
                Ok(Value::Bool(false)) => Ok(Value::Bool(false)),
                Err(EvalError::CostLimitExceeded) => Err(EvalError::CostLimitExceeded),
                _ => Ok(Value::Bool(true)),
            },
            Node::Cond(c, t, f) => {
                let cv = self.eval(c)?;
                self.meter.charge(1)?;
                match cv {
                    Value::Bool(true) => self.eval(t),
                    Value::Bool(false) => self.eval(f),
                    other => Err(no_overload("_?_:_", &other)),
                }
            }
            Node::Call(func, args) => {
                let mut vals = Vec::with_capacity(args.len());
                for a in args {
                    vals.push(self.eval(a)?);
                }
                call(*func, &vals, &mut self.meter)
            }
            Node::MatchesLiteral(input, re) => self.matches_literal(input, re),
            Node::Comprehension(c) => self.comprehension(c),
        }
    }

    /// A variable: comprehension locals shadow the activation.
    fn var(&mut self, name: &Arc<str>) -> Result<Value, EvalError> {
        self.meter.charge(1)?;
        if let Some((_, v)) = self.locals.iter().rev().find(|(n, _)| n == name) {
            return v.clone();
        }
        self.vars
            .get(name)
            .cloned()
            .ok_or_else(|| EvalError::runtime(format!("no such attribute: {name}")))
    }

    /// `{k: v, ...}`: keys must be of a key type and distinct.
    fn map_literal(&mut self, entries: &[(Node, Node)]) -> Result<Value, EvalError> {
        self.meter.charge(MAP_LITERAL_COST)?;
        let mut out = BTreeMap::new();
        for (k, v) in entries {
            let kv = self.eval(k)?;
            let key = Key::from_value(&kv).ok_or_else(|| {
                EvalError::runtime(format!("unsupported key type: {}", kv.type_of()))
            })?;
            let vv = self.eval(v)?;
            if out.insert(key, vv).is_some() {
                return Err(EvalError::runtime(format!(
                    "Failed with repeated key: {kv}"
                )));
            }
        }
        Ok(Value::Map(Arc::new(out)))
    }

    /// `input.matches(re)` with a pattern compiled at check time.
    fn matches_literal(&mut self, input: &Node, re: &CompiledRegex) -> Result<Value, EvalError> {
        let v = self.eval(input)?;
        match &v {
            Value::String(s) => {
                self.meter.charge(regex_cost(re.len, s.len()))?;
                Ok(Value::Bool(re.regex.is_match(s)))
            }
            other => Err(no_overload("matches", other)),
        }
    }

    /// `&&` (`absorb == false`) and `||` (`absorb == true`): the absorbing value wins over an
    /// error on either side, as CEL's commutative logic requires. Running out of budget is
    /// never absorbed.
    fn logic(&mut self, l: &Node, r: &Node, absorb: bool) -> Result<Value, EvalError> {
        let op = if absorb { "_||_" } else { "_&&_" };
        let as_bool = |v: Result<Value, EvalError>| -> Result<bool, EvalError> {
            match v? {
                Value::Bool(b) => Ok(b),
                other => Err(no_overload(op, &other)),
            }
        };
        let lv = self.eval(l);
        if matches!(lv, Err(EvalError::CostLimitExceeded)) {
            return Err(EvalError::CostLimitExceeded);
        }
        self.meter.charge(1)?;
        let lb = as_bool(lv);
        if matches!(lb, Ok(b) if b == absorb) {
            return Ok(Value::Bool(absorb));
        }
        let rv = self.eval(r);
        if matches!(rv, Err(EvalError::CostLimitExceeded)) {
            return Err(EvalError::CostLimitExceeded);
        }
        let rb = as_bool(rv);
        match (lb, rb) {
            (_, Ok(b)) if b == absorb => Ok(Value::Bool(absorb)),
            (Ok(_), Ok(_)) => Ok(Value::Bool(!absorb)),
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    }

    fn comprehension(&mut self, c: &Comprehension) -> Result<Value, EvalError> {
        let range = self.eval(&c.range)?;
        let items: Vec<(Value, Value)> = match &range {
            Value::List(l) => {
                if c.iter_var2.is_some() {
                    l.iter()
                        .enumerate()
                        .map(|(i, v)| (Value::Int(i as i64), v.clone()))
                        .collect()
                } else {
                    l.iter().map(|v| (v.clone(), Value::Null)).collect()
                }
            }
            Value::Map(m) => m.iter().map(|(k, v)| (k.to_value(), v.clone())).collect(),
            other => return Err(no_overload("comprehension range", other)),
        };
        let base = self.locals.len();
        let r = self.iterate(c, items);
        self.locals.truncate(base);
        r
    }

    fn iterate(
        &mut self,
        c: &Comprehension,
        items: Vec<(Value, Value)>,
    ) -> Result<Value, EvalError> {
        let base = self.locals.len();
        match &c.step {
            Step::Append { cond, elem } => {
                let mut out: Vec<Value> = Vec::new();
                for (v1, v2) in items {
                    self.meter.charge(1)?;
                    self.locals.truncate(base);
                    self.locals.push((c.iter_var.clone(), Ok(v1)));
                    if let Some(v) = &c.iter_var2 {
                        self.locals.push((v.clone(), Ok(v2)));
                    }
                    if let Some(cond) = cond {
                        match self.eval(cond)? {
                            Value::Bool(true) => {}
                            Value::Bool(false) => continue,
                            other => return Err(no_overload("_?_:_", &other)),
                        }
                    }
                    let v = self.eval(elem)?;
                    if out.len() >= MAX_LIST_LEN {
                        return Err(EvalError::runtime(format!(
                            "list exceeds the limit of {MAX_LIST_LEN} elements"
                        )));
                    }
                    out.push(v);
                }
                Ok(Value::List(out.into()))
            }
            Step::Generic(step) => {
                // The accumulator may hold an error, which a later step can absorb (`exists`).
                let mut accu = self.eval(&c.init);
                for (v1, v2) in items {
                    self.meter.charge(1)?;
                    self.locals.truncate(base);
                    self.locals.push((c.accu_var.clone(), accu.clone()));
                    self.locals.push((c.iter_var.clone(), Ok(v1)));
                    if let Some(v) = &c.iter_var2 {
                        self.locals.push((v.clone(), Ok(v2)));
                    }
                    match self.eval(&c.cond)? {
                        Value::Bool(true) => {}
                        Value::Bool(false) => break,
                        other => return Err(no_overload("loop condition", &other)),
                    }
                    accu = self.eval(step);
                    if matches!(accu, Err(EvalError::CostLimitExceeded)) {
                        return accu;
                    }
                }
                self.locals.truncate(base);
                self.locals.push((c.accu_var.clone(), accu));
                self.eval(&c.result)
            }
        }
    }
}

/// `v.field`: `Ok(None)` when a map lacks the key.
fn select(v: &Value, field: &str) -> Result<Option<Value>, EvalError> {
    match v {
        Value::Map(m) => Ok(map_get(m, &Value::String(field.into())).cloned()),
        other => Err(EvalError::runtime(format!(
            "type '{}' does not support field selection",
            other.type_of()
        ))),
    }
}
