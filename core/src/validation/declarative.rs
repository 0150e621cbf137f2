//! Declarative validation (spec: gates `DeclarativeValidation` and
//! `DeclarativeValidationTakeover`). A kind declares its rules as data
//! ([`Resource::declarative_rules`]): required, maximum length, a string format, an enum, and
//! immutable on update, each at a path in the object's JSON form. One generic evaluator turns
//! them into field errors; [`Validator`] runs it beside the hand-written validation on create
//! and update, compares the two error sets by field path and error type, reports mismatches,
//! and returns the hand-written result, or the declarative one under takeover.
//!
//! Only hand-written errors the rules *cover* (a rule at the same path that produces the same
//! error type) take part in the comparison, and under takeover only those are replaced: errors
//! no rule speaks for (labels, annotations, finalizers) stay hand-written in every mode, as in
//! Kubernetes, where each hand-written error is marked covered or not.
//!
//! [`Resource::declarative_rules`]: crate::resource::Resource::declarative_rules

use std::fmt;

use serde_json::Value;

use super::{ErrorList, dns1123_label, dns1123_subdomain};
use crate::resource::Resource;

/// A format a string value must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Dns1123Label,
    Dns1123Subdomain,
}

impl Format {
    fn check(self, value: &str) -> Result<(), String> {
        match self {
            Format::Dns1123Label => dns1123_label(value),
            Format::Dns1123Subdomain => dns1123_subdomain(value),
        }
    }
}

/// What a rule checks. Each check produces exactly one error type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Present and not empty (`FieldValueRequired`), with a detail for the message.
    Required(&'static str),
    /// At most this many bytes (`FieldValueTooLong`).
    MaxLength(usize),
    /// The string has the format (`FieldValueInvalid`).
    Format(Format),
    /// One of these values (`FieldValueNotSupported`).
    Enum(&'static [&'static str]),
    /// Unchanged by an update (`FieldValueInvalid`).
    Immutable,
}

impl Check {
    /// The `reason` of the errors this check produces.
    pub fn error_type(self) -> &'static str {
        match self {
            Check::Required(_) => "FieldValueRequired",
            Check::MaxLength(_) => "FieldValueTooLong",
            Check::Format(_) | Check::Immutable => "FieldValueInvalid",
            Check::Enum(_) => "FieldValueNotSupported",
        }
    }
}

/// One rule: a check at a path of the object's JSON form. Segments are separated by dots;
/// `name[*]` stands for every item of the list `name` (`secrets[*].name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub path: &'static str,
    pub check: Check,
}

impl Rule {
    pub const fn new(path: &'static str, check: Check) -> Self {
        Rule { path, check }
    }
}

/// Every value at `path` in `obj`, with its concrete field path (`secrets[1].name`). A
/// missing value is `None`; a list that is missing has no items.
fn resolve<'a>(obj: &'a Value, path: &str) -> Vec<(String, Option<&'a Value>)> {
    let mut found: Vec<(String, Option<&'a Value>)> = vec![(String::new(), Some(obj))];
    for segment in path.split('.') {
        let (name, each) = match segment.strip_suffix("[*]") {
            Some(name) => (name, true),
            None => (segment, false),
        };
        let mut next = Vec::with_capacity(found.len());
        for (at, value) in found {
            let field = if at.is_empty() {
                name.to_string()
            } else {
                format!("{at}.{name}")
            };
            let child = value.and_then(|v| v.get(name)).filter(|v| !v.is_null());
            if each {
                for (i, item) in child
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    next.push((format!("{field}[{i}]"), Some(item)));
                }
            } else {
                next.push((field, child));
            }
        }
        found = next;
    }
    found
}

/// The value at a concrete field path (`secrets[1].name`).
fn lookup<'a>(obj: &'a Value, field: &str) -> Option<&'a Value> {
    let mut at = obj;
    for segment in field.split('.') {
        let (name, index) = match segment.split_once('[') {
            Some((name, rest)) => (name, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (segment, None),
        };
        at = at.get(name)?;
        if let Some(i) = index {
            at = at.get(i)?;
        }
    }
    (!at.is_null()).then_some(at)
}

fn is_empty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        Some(_) => false,
    }
}

fn shown(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// Evaluates `rules` on the JSON form of an object; `old` is the stored object on update
/// (immutability is checked only then). Checks other than `Required` pass over empty values.
pub fn evaluate(rules: &[Rule], obj: &Value, old: Option<&Value>) -> ErrorList {
    let mut errs = ErrorList::default();
    for rule in rules {
        for (field, value) in resolve(obj, rule.path) {
            match rule.check {
                Check::Required(detail) => {
                    if is_empty(value) {
                        errs.required(&field, detail);
                    }
                }
                Check::Immutable => {
                    if let Some(old) = old
                        && value != lookup(old, &field)
                    {
                        errs.invalid(&field, &shown(value), "field is immutable");
                    }
                }
                _ if is_empty(value) => {}
                Check::MaxLength(max) => {
                    if shown(value).len() > max {
                        errs.too_long(&field, max);
                    }
                }
                Check::Format(format) => match value.and_then(Value::as_str) {
                    Some(s) => {
                        if let Err(e) = format.check(s) {
                            errs.invalid(&field, s, &e);
                        }
                    }
                    None => errs.invalid(&field, &shown(value), "must be a string"),
                },
                Check::Enum(allowed) => {
                    let v = shown(value);
                    if !allowed.contains(&v.as_str()) {
                        errs.not_supported(&field, &v, allowed);
                    }
                }
            }
        }
    }
    errs
}

/// `secrets[3].name` → `secrets[*].name`: the rule path a concrete field falls under.
fn pattern_of(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..=open]);
        let after = &rest[open.saturating_add(1)..];
        let close = after.find(']').unwrap_or(after.len());
        if !after[..close].is_empty() && after[..close].bytes().all(|b| b.is_ascii_digit()) {
            out.push('*');
        } else {
            out.push_str(&after[..close]);
        }
        rest = &after[close..];
    }
    out.push_str(rest);
    out
}

/// Whether some rule speaks for a hand-written error: same path, same error type.
fn covered(rules: &[Rule], field: &str, error_type: &str) -> bool {
    let pattern = pattern_of(field);
    rules
        .iter()
        .any(|r| r.path == pattern && r.check.error_type() == error_type)
}

/// Errors by (field path, error type), sorted: what the comparison looks at.
type Keys = Vec<(String, String)>;

/// How the two validations of one object disagreed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mismatch {
    /// The kind validated.
    pub kind: &'static str,
    /// `create` or `update`.
    pub operation: &'static str,
    pub name: String,
    /// Covered errors only the hand-written validation found, as (field, type).
    pub handwritten_only: Keys,
    /// Errors only the declarative validation found.
    pub declarative_only: Keys,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {:?}: hand-written only {:?}, declarative only {:?}",
            self.operation, self.kind, self.name, self.handwritten_only, self.declarative_only
        )
    }
}

/// Compares the hand-written errors the rules cover with the declarative errors, as multisets
/// of (field, type): the (hand-written only, declarative only) differences.
pub fn compare(rules: &[Rule], handwritten: &ErrorList, declarative: &ErrorList) -> (Keys, Keys) {
    let mut hand: Keys = handwritten
        .0
        .iter()
        .filter(|c| covered(rules, &c.field, &c.reason))
        .map(|c| (c.field.clone(), c.reason.clone()))
        .collect();
    let mut decl: Keys = declarative
        .0
        .iter()
        .map(|c| (c.field.clone(), c.reason.clone()))
        .collect();
    hand.sort();
    decl.sort();
    let mut hand_only = Vec::new();
    let mut decl_only = Vec::new();
    let (mut i, mut j) = (0usize, 0usize);
    while i < hand.len() || j < decl.len() {
        match (hand.get(i), decl.get(j)) {
            (Some(h), Some(d)) if h == d => {
                i = i.saturating_add(1);
                j = j.saturating_add(1);
            }
            (Some(h), Some(d)) if h < d => {
                hand_only.push(h.clone());
                i = i.saturating_add(1);
            }
            (Some(h), None) => {
                hand_only.push(h.clone());
                i = i.saturating_add(1);
            }
            (_, Some(d)) => {
                decl_only.push(d.clone());
                j = j.saturating_add(1);
            }
            (None, None) => break,
        }
    }
    (hand_only, decl_only)
}

/// Which validation runs and which one answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Hand-written only (`DeclarativeValidation=false`).
    HandwrittenOnly,
    /// Both; mismatches reported; the hand-written result is returned (the default).
    #[default]
    Compare,
    /// Both; mismatches reported; the declarative result replaces the covered hand-written
    /// errors (`DeclarativeValidationTakeover=true`).
    Takeover,
}

type MismatchSink = Box<dyn Fn(&Mismatch) + Send + Sync>;

/// Runs declarative validation beside the hand-written one, per [`Mode`].
pub struct Validator {
    mode: Mode,
    /// Rules added to a kind's own, by kind name (embedding and tests: this is how a test makes
    /// the two validations disagree on purpose).
    extra: Vec<(&'static str, Rule)>,
    on_mismatch: MismatchSink,
}

impl fmt::Debug for Validator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Validator")
            .field("mode", &self.mode)
            .field("extra", &self.extra)
            .finish_non_exhaustive()
    }
}

impl Default for Validator {
    fn default() -> Self {
        Validator::new(Mode::default(), |_| {})
    }
}

impl Validator {
    /// `on_mismatch` is called for every create or update whose validations disagree.
    pub fn new(mode: Mode, on_mismatch: impl Fn(&Mismatch) + Send + Sync + 'static) -> Self {
        Validator {
            mode,
            extra: Vec::new(),
            on_mismatch: Box::new(on_mismatch),
        }
    }

    /// Adds a rule to the kind named `kind` (see [`Validator::extra`](Self)).
    pub fn with_rule(mut self, kind: &'static str, rule: Rule) -> Self {
        self.extra.push((kind, rule));
        self
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The errors to answer with for `obj` (`old`: the stored object on update), given the
    /// hand-written ones.
    pub fn validate<T: Resource>(
        &self,
        obj: &T,
        old: Option<&T>,
        handwritten: ErrorList,
    ) -> ErrorList {
        if self.mode == Mode::HandwrittenOnly {
            return handwritten;
        }
        let kind = T::INFO.kind;
        let rules: Vec<Rule> = T::declarative_rules()
            .iter()
            .copied()
            .chain(
                self.extra
                    .iter()
                    .filter(|(k, _)| *k == kind)
                    .map(|(_, r)| *r),
            )
            .collect();
        if rules.is_empty() {
            return handwritten;
        }
        let (Ok(new), Ok(old)) = (
            serde_json::to_value(obj),
            old.map(serde_json::to_value).transpose(),
        ) else {
            // Our own types always serialize; were one not to, the hand-written answer stands.
            return handwritten;
        };
        let declarative = evaluate(&rules, &new, old.as_ref());
        let (handwritten_only, declarative_only) = compare(&rules, &handwritten, &declarative);
        if !handwritten_only.is_empty() || !declarative_only.is_empty() {
            (self.on_mismatch)(&Mismatch {
                kind,
                operation: if old.is_some() { "update" } else { "create" },
                name: obj.meta().name.clone(),
                handwritten_only,
                declarative_only,
            });
        }
        match self.mode {
            Mode::Takeover => {
                let mut out = declarative;
                out.0.extend(
                    handwritten
                        .0
                        .into_iter()
                        .filter(|c| !covered(&rules, &c.field, &c.reason)),
                );
                out
            }
            _ => handwritten,
        }
    }
}

#[cfg(test)]
mod tests;
