//! From verified claims to a user: an authenticator's claim validation rules, claim mappings
//! (username, groups, uid, extra) and user validation rules, compiled once when the
//! configuration is loaded and run per token, as Kubernetes' OIDC authenticator runs them.
//! CEL expressions see `claims` (the token's payload) or `user` (`username`, `uid`, `groups`,
//! `extra`); an evaluation past its cost budget refuses the token.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use svc_cel::{Activation, Env, EvalError, Program, Type};
use svc_config::Path;
use svc_config::authentication::{
    ClaimMappings, ClaimValidationRule, JwtAuthenticator, PrefixedClaimOrExpression,
    UserValidationRule,
};
use svc_core::user::UserInfo;
use svc_core::validation::ErrorList;

/// What an expression must produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Produces {
    Bool,
    String,
    StringOrList,
}

/// A CEL expression, compiled and type-checked, over `claims` or `user`.
pub struct Expr {
    program: Program,
}

impl Expr {
    /// Compiles `text` over the variable `input` (`claims` or `user`, each a map from string
    /// keys) and checks that it can produce what is asked for.
    pub fn compile(text: &str, input: &'static str, produces: Produces) -> Result<Self, String> {
        let env = Env::new().var(input, Type::map(Type::String, Type::Dyn));
        let program = svc_cel::compile(text, &env).map_err(|e| e.to_string())?;
        let allowed = match produces {
            Produces::Bool => vec![Type::Bool],
            Produces::String => vec![Type::String],
            Produces::StringOrList => vec![Type::String, Type::list(Type::String)],
        };
        program.expect(&allowed).map_err(|e| e.to_string())?;
        Ok(Expr { program })
    }

    fn text(&self) -> &str {
        self.program.source()
    }

    /// Evaluates with `vars` bound, within the cost budget, as JSON. An evaluation that runs
    /// out of budget is logged: it is a token built to be expensive, or a rule to rewrite.
    pub fn eval(&self, vars: &Activation) -> Result<Value, String> {
        match self.program.eval(vars, svc_cel::DEFAULT_BUDGET) {
            Ok(v) => Ok(v.to_json()),
            Err(e @ EvalError::CostLimitExceeded) => {
                tracing::warn!(
                    expression = self.text(),
                    "a JWT expression ran out of its cost budget; the token is refused"
                );
                Err(format!("oidc: expression {:?}: {e}", self.text()))
            }
            Err(e) => Err(format!("oidc: expression {:?}: {e}", self.text())),
        }
    }
}

enum Field {
    Claim { claim: String, prefix: String },
    Expr(Expr),
}

enum ClaimRule {
    Required { claim: String, value: String },
    Expr { expr: Expr, message: String },
}

/// One authenticator's rules and mappings, ready to run.
pub struct Mapper {
    claim_rules: Vec<ClaimRule>,
    username: Field,
    groups: Option<Field>,
    uid: Option<Field>,
    extra: Vec<(String, Expr)>,
    user_rules: Vec<(Expr, String)>,
}

fn compile(
    errors: &mut ErrorList,
    path: &Path,
    text: &str,
    input: &'static str,
    produces: Produces,
) -> Option<Expr> {
    match Expr::compile(text, input, produces) {
        Ok(e) => Some(e),
        Err(e) => {
            errors.invalid(path.as_str(), text, &e);
            None
        }
    }
}

fn field(
    errors: &mut ErrorList,
    path: &Path,
    m: &PrefixedClaimOrExpression,
    produces: Produces,
) -> Option<Field> {
    if !m.expression.is_empty() {
        return compile(
            errors,
            &path.child("expression"),
            &m.expression,
            "claims",
            produces,
        )
        .map(Field::Expr);
    }
    (!m.claim.is_empty()).then(|| Field::Claim {
        claim: m.claim.clone(),
        prefix: m.prefix.clone().unwrap_or_default(),
    })
}

impl Mapper {
    /// Compiles an authenticator's expressions; errors name `path` (`jwt[0]`) and the field.
    pub fn compile(a: &JwtAuthenticator, path: &Path) -> Result<Self, ErrorList> {
        let mut errors = ErrorList::default();
        let rules_path = path.child("claimValidationRules");
        let claim_rules = a
            .claim_validation_rules
            .iter()
            .enumerate()
            .filter_map(|(i, r): (usize, &ClaimValidationRule)| {
                if r.expression.is_empty() {
                    return Some(ClaimRule::Required {
                        claim: r.claim.clone(),
                        value: r.required_value.clone(),
                    });
                }
                let p = rules_path.index(i).child("expression");
                compile(&mut errors, &p, &r.expression, "claims", Produces::Bool).map(|expr| {
                    ClaimRule::Expr {
                        expr,
                        message: r.message.clone(),
                    }
                })
            })
            .collect();
        let m: &ClaimMappings = &a.claim_mappings;
        let mp = path.child("claimMappings");
        let username = field(
            &mut errors,
            &mp.child("username"),
            &m.username,
            Produces::String,
        );
        let groups = field(
            &mut errors,
            &mp.child("groups"),
            &m.groups,
            Produces::StringOrList,
        );
        let uid = if !m.uid.expression.is_empty() {
            let p = mp.child("uid").child("expression");
            compile(
                &mut errors,
                &p,
                &m.uid.expression,
                "claims",
                Produces::String,
            )
            .map(Field::Expr)
        } else {
            (!m.uid.claim.is_empty()).then(|| Field::Claim {
                claim: m.uid.claim.clone(),
                prefix: String::new(),
            })
        };
        let extra = m
            .extra
            .iter()
            .enumerate()
            .filter_map(|(i, x)| {
                let p = mp.child("extra").index(i).child("valueExpression");
                compile(
                    &mut errors,
                    &p,
                    &x.value_expression,
                    "claims",
                    Produces::StringOrList,
                )
                .map(|e| (x.key.clone(), e))
            })
            .collect();
        let user_path = path.child("userValidationRules");
        let user_rules = a
            .user_validation_rules
            .iter()
            .enumerate()
            .filter_map(|(i, r): (usize, &UserValidationRule)| {
                let p = user_path.index(i).child("expression");
                compile(&mut errors, &p, &r.expression, "user", Produces::Bool)
                    .map(|e| (e, r.message.clone()))
            })
            .collect();
        match username {
            Some(username) if errors.is_empty() => Ok(Mapper {
                claim_rules,
                username,
                groups,
                uid,
                extra,
                user_rules,
            }),
            _ => {
                if errors.is_empty() {
                    errors.required(
                        mp.child("username").as_str(),
                        "claim or expression is required",
                    );
                }
                Err(errors)
            }
        }
    }

    /// The user the verified `claims` map to, or why the token is refused. The caller adds
    /// `system:authenticated`.
    pub fn user(&self, claims: &Value) -> Result<UserInfo, String> {
        // Claims are converted for CEL once per token, and only when an expression needs them.
        let vars = std::cell::OnceCell::new();
        let vars = || vars.get_or_init(|| Activation::new().bind("claims", claims.clone()));
        for rule in &self.claim_rules {
            check_claim_rule(rule, claims, vars)?;
        }
        let username = self.username(claims, vars)?;
        let groups = match &self.groups {
            None => Vec::new(),
            Some(Field::Claim { claim, prefix }) => strings(claims.get(claim), claim)?
                .into_iter()
                .map(|g| format!("{prefix}{g}"))
                .collect(),
            Some(Field::Expr(e)) => strings(Some(&e.eval(vars())?), "groups expression")?,
        };
        let uid = match &self.uid {
            None => String::new(),
            Some(Field::Claim { claim, .. }) => string_claim(claims, claim, "uid")?,
            Some(Field::Expr(e)) => match e.eval(vars())? {
                Value::String(s) => s,
                other => return Err(format!("oidc: uid expression produced {other}")),
            },
        };
        let mut extra = BTreeMap::new();
        for (key, e) in &self.extra {
            let values = strings(Some(&e.eval(vars())?), key)?;
            if !values.is_empty() {
                extra.insert(key.clone(), values);
            }
        }
        let user = UserInfo {
            username,
            uid,
            groups,
            extra,
        };
        self.check_user_rules(&user)?;
        Ok(user)
    }

    /// The username: a claim with its prefix (`email` only when verified), or an expression
    /// that must give a non-empty string.
    fn username<'c>(
        &self,
        claims: &Value,
        vars: impl Fn() -> &'c Activation,
    ) -> Result<String, String> {
        match &self.username {
            Field::Claim { claim, prefix } => {
                let name = string_claim(claims, claim, "username")?;
                if claim == "email" {
                    check_email_verified(claims)?;
                }
                Ok(format!("{prefix}{name}"))
            }
            Field::Expr(e) => match e.eval(vars())? {
                Value::String(s) if !s.is_empty() => Ok(s),
                Value::String(_) => {
                    Err("oidc: empty username via CEL expression is not allowed".into())
                }
                other => Err(format!("oidc: username expression produced {other}")),
            },
        }
    }

    /// The user validation rules, run on the mapped user.
    fn check_user_rules(&self, user: &UserInfo) -> Result<(), String> {
        if self.user_rules.is_empty() {
            return Ok(());
        }
        let value = json!({
            "username": user.username,
            "uid": user.uid,
            "groups": user.groups,
            "extra": user.extra,
        });
        let user_vars = Activation::new().bind("user", value);
        for (expr, message) in &self.user_rules {
            if expr.eval(&user_vars)? != Value::Bool(true) {
                return Err(rule_failed(
                    message,
                    "oidc: error evaluating user info validation rule",
                    expr,
                ));
            }
        }
        Ok(())
    }
}

/// Why a validation rule refused a token: its own message, else `what` and its expression.
fn rule_failed(message: &str, what: &str, expr: &Expr) -> String {
    if message.is_empty() {
        format!("{what}: {:?}", expr.text())
    } else {
        message.to_string()
    }
}

/// One claim validation rule: a required claim value, or an expression that must be true.
fn check_claim_rule<'c>(
    rule: &ClaimRule,
    claims: &Value,
    vars: impl Fn() -> &'c Activation,
) -> Result<(), String> {
    match rule {
        ClaimRule::Required { claim, value } => {
            let got = match claims.get(claim) {
                None => "",
                Some(Value::String(s)) => s.as_str(),
                Some(_) => return Err(format!("oidc: parse claim {claim}: not a string")),
            };
            if got != value {
                return Err(format!(
                    "oidc: required claim {claim} value does not match. Got = {got}, want = {value}"
                ));
            }
        }
        ClaimRule::Expr { expr, message } => {
            if expr.eval(vars())? != Value::Bool(true) {
                return Err(rule_failed(
                    message,
                    "oidc: error evaluating claim validation expression",
                    expr,
                ));
            }
        }
    }
    Ok(())
}

fn string_claim(claims: &Value, claim: &str, what: &str) -> Result<String, String> {
    match claims.get(claim) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(format!(
            "oidc: empty {what} via claim {claim:?} is not allowed"
        )),
        Some(_) => Err(format!("oidc: parse {what} claim {claim:?}: not a string")),
        None => Err(format!(
            "oidc: parse {what} claim {claim:?}: claim not present"
        )),
    }
}

/// Kubernetes: with the `email` claim as username, an `email_verified` claim, when present,
/// must be `true`.
fn check_email_verified(claims: &Value) -> Result<(), String> {
    match claims.get("email_verified") {
        None => Ok(()),
        Some(Value::Bool(true)) => Ok(()),
        Some(Value::Bool(false)) => Err("oidc: email not verified".into()),
        Some(_) => Err("oidc: parse 'email_verified' claim: not a boolean".into()),
    }
}

/// A string or an array of strings; `""`, `[]` and null are nothing, and empty strings inside
/// an array are dropped.
fn strings(value: Option<&Value>, what: &str) -> Result<Vec<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) if s.is_empty() => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .filter(|v| v.as_str() != Some(""))
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("oidc: {what}: not a string or an array of strings"))
            })
            .collect(),
        Some(_) => Err(format!("oidc: {what}: not a string or an array of strings")),
    }
}
