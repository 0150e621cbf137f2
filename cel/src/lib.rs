//! svc-cel: CEL expressions in configuration, compiled and type-checked at load, evaluated
//! under a cost budget.
//!
//! [`compile`] parses an expression with the `cel` crate's parser (its public AST only),
//! resolves every identifier and function against an [`Env`], checks types where they are
//! statically known, and lowers the result to our own tree ([`check`]). [`Program::eval`]
//! walks that tree ([`eval`]) charging every step against a budget, as Kubernetes' runtime
//! cost limit does: comparisons and arithmetic cost 1, each variable or field access 1, a
//! list literal 40 and a map literal 30 plus their elements, string functions about a tenth
//! of the bytes they traverse, `matches` the length of the regex times the length of the
//! input, every macro iteration 1 plus its body, and the result its flattened size (values
//! are shared, so a list of many references to one large string is cheap to build but not
//! to use). Running out stops evaluation at once with [`EvalError::CostLimitExceeded`].
//!
//! ```
//! use svc_cel::{Activation, DEFAULT_BUDGET, Env, Type, compile};
//!
//! let env = Env::new().var("claims", Type::map(Type::String, Type::Dyn));
//! let program = compile("claims.groups.map(g, 'oidc:' + g)", &env).unwrap();
//! program.expect(&[Type::String, Type::list(Type::String)]).unwrap();
//! let claims = serde_json::json!({"groups": ["dev"]});
//! let out = program.eval(&Activation::new().bind("claims", claims), DEFAULT_BUDGET).unwrap();
//! assert_eq!(out.to_json(), serde_json::json!(["oidc:dev"]));
//! ```
//!
//! Nothing here loops or allocates without bound: expressions longer than
//! [`MAX_EXPRESSION_LENGTH`] or nested deeper than [`MAX_NESTING_DEPTH`] do not compile, and
//! strings and lists built at run time are capped ([`MAX_STRING_BYTES`], [`MAX_LIST_LEN`]).
//! [`Duration`] is Go's duration syntax, which CEL's `duration()` takes and configuration
//! files write.
//!
//! **Invariant:** the interpreter knows no objects, no configuration kinds and no I/O; it
//! depends on no crate of ours, and every step of an evaluation is charged to its budget.

mod check;
pub mod duration;
mod eval;
mod functions;
mod overloads;
mod value;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

pub use duration::Duration;
pub use value::{Key, Value};

/// Kubernetes' per-call cost limit for one CEL evaluation (`celconfig.PerCallLimit`).
pub const DEFAULT_BUDGET: u64 = 1_000_000;

/// Longest expression accepted, in code points (cel-go's parser limit, which Kubernetes keeps).
pub const MAX_EXPRESSION_LENGTH: usize = 100_000;

/// Deepest nesting of sub-expressions accepted by the parser.
pub const MAX_NESTING_DEPTH: u16 = 100;

/// Largest string or bytes value an evaluation may build (Kubernetes' request size limit).
pub const MAX_STRING_BYTES: usize = 3 * 1024 * 1024;

/// Longest list an evaluation may build.
pub const MAX_LIST_LEN: usize = 100_000;

/// A CEL type, as the checker knows it. `Dyn` is checked at run time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Type {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    List(Box<Type>),
    Map(Box<Type>, Box<Type>),
    Dyn,
    Timestamp,
    Duration,
    /// The type of type values (`type(x)`, `int`).
    Type,
    /// The type of `a.?b`.
    Optional(Box<Type>),
}

impl Type {
    pub fn list(elem: Type) -> Type {
        Type::List(Box::new(elem))
    }

    pub fn map(key: Type, value: Type) -> Type {
        Type::Map(Box::new(key), Box::new(value))
    }

    /// The name CEL prints for this type: `int`, `list(string)`, `map(string, dyn)`.
    pub fn name(&self) -> String {
        match self {
            Type::Bool => "bool".into(),
            Type::Int => "int".into(),
            Type::Uint => "uint".into(),
            Type::Double => "double".into(),
            Type::String => "string".into(),
            Type::Bytes => "bytes".into(),
            Type::Null => "null_type".into(),
            Type::List(e) => format!("list({})", e.name()),
            Type::Map(k, v) => format!("map({}, {})", k.name(), v.name()),
            Type::Dyn => "dyn".into(),
            Type::Timestamp => "google.protobuf.Timestamp".into(),
            Type::Duration => "google.protobuf.Duration".into(),
            Type::Type => "type".into(),
            Type::Optional(t) => format!("optional_type({})", t.name()),
        }
    }

    /// Whether a value of this type may be used where `want` is expected: `Dyn` on either
    /// side matches anything, aggregates match element-wise.
    pub fn assignable_to(&self, want: &Type) -> bool {
        match (self, want) {
            (Type::Dyn, _) | (_, Type::Dyn) => true,
            (Type::List(a), Type::List(b)) | (Type::Optional(a), Type::Optional(b)) => {
                a.assignable_to(b)
            }
            (Type::Map(ka, va), Type::Map(kb, vb)) => ka.assignable_to(kb) && va.assignable_to(vb),
            (a, b) => a == b,
        }
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The variables an expression may use, with their types.
#[derive(Clone, Debug, Default)]
pub struct Env {
    vars: HashMap<String, Type>,
}

impl Env {
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares variable `name` of type `ty`.
    pub fn var(mut self, name: &str, ty: Type) -> Self {
        self.vars.insert(name.to_owned(), ty);
        self
    }

    fn lookup(&self, name: &str) -> Option<&Type> {
        self.vars.get(name)
    }
}

/// An expression that failed to compile, with every problem found.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("compilation failed: {}", .errors.join("\n"))]
pub struct CompileError {
    /// One line per problem, as cel-go prints them: `ERROR: <input>:1:5: undeclared reference to 'foo'`.
    pub errors: Vec<String>,
}

impl CompileError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            errors: vec![message.into()],
        }
    }
}

/// An evaluation that did not produce a value.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EvalError {
    /// The budget ran out; evaluation stopped there.
    #[error("operation cancelled: actual cost limit exceeded")]
    CostLimitExceeded,
    /// A runtime error: no such key, overflow, division by zero, no matching overload.
    #[error("{0}")]
    Runtime(String),
}

impl EvalError {
    fn runtime(message: impl Into<String>) -> Self {
        EvalError::Runtime(message.into())
    }
}

/// A compiled, type-checked expression. Cheap to clone and shared across threads.
#[derive(Clone, Debug)]
pub struct Program {
    inner: Arc<check::Checked>,
}

/// Compiles `expr` against the variables of `env`: parse, resolve, type-check.
pub fn compile(expr: &str, env: &Env) -> Result<Program, CompileError> {
    let checked = check::compile(expr, env)?;
    Ok(Program {
        inner: Arc::new(checked),
    })
}

impl Program {
    /// The type the expression produces; `Dyn` when not statically known.
    pub fn output_type(&self) -> &Type {
        &self.inner.output
    }

    /// Refuses a program whose output type is none of `allowed` (a `Dyn` output passes and is
    /// checked by the caller at run time).
    pub fn expect(&self, allowed: &[Type]) -> Result<(), CompileError> {
        let out = &self.inner.output;
        if *out == Type::Dyn || allowed.iter().any(|t| out.assignable_to(t)) {
            return Ok(());
        }
        let names: Vec<String> = allowed.iter().map(Type::name).collect();
        Err(CompileError::new(format!(
            "ERROR: <input>:1:1: expression must evaluate to {}, got {}",
            names.join(" or "),
            out.name()
        )))
    }

    /// Whether the expression reads `field` of variable `var` (`claims.email`,
    /// `has(claims.email)`, `claims.?email`, `claims['email']`), as Kubernetes checks that an
    /// expression using `claims.email` also uses `claims.email_verified`.
    pub fn selects(&self, var: &str, field: &str) -> bool {
        self.inner.root.selects(var, field)
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    /// Evaluates the program with `vars` bound, spending at most `budget` cost units.
    pub fn eval(&self, vars: &Activation, budget: u64) -> Result<Value, EvalError> {
        self.eval_with_cost(vars, budget).map(|(v, _)| v)
    }

    /// Evaluates a program that must produce a bool (claim validation rules, match
    /// conditions): any other value, possible when the output type is `Dyn`, is an error.
    pub fn eval_bool(&self, vars: &Activation, budget: u64) -> Result<bool, EvalError> {
        match self.eval(vars, budget)? {
            Value::Bool(b) => Ok(b),
            other => Err(EvalError::runtime(format!(
                "expression must evaluate to bool, got {}",
                other.type_of()
            ))),
        }
    }

    /// As [`eval`](Self::eval), also returning the cost spent.
    pub fn eval_with_cost(
        &self,
        vars: &Activation,
        budget: u64,
    ) -> Result<(Value, u64), EvalError> {
        eval::run(&self.inner.root, vars, budget)
    }
}

/// Values for the variables of one evaluation.
#[derive(Clone, Debug, Default)]
pub struct Activation {
    vars: HashMap<String, Value>,
}

impl Activation {
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds variable `name` to `v`.
    pub fn bind(mut self, name: &str, v: impl Into<Value>) -> Self {
        self.vars.insert(name.to_owned(), v.into());
        self
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.vars.get(name)
    }
}
