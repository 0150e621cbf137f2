//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!key`, `>`/`<`) and field
//! selectors (`=`, `==`, `!=`), parsed once per request and matched per object.

use std::collections::BTreeMap;

use crate::validation::{label_value, qualified_name};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Op {
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    GreaterThan(i64),
    LessThan(i64),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
}

impl LabelSelector {
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        let mut p = Parser {
            s: s.as_bytes(),
            i: 0,
            src: s,
        };
        let mut reqs = Vec::new();
        p.skip_ws();
        if p.at_end() {
            return Ok(LabelSelector { reqs });
        }
        loop {
            reqs.push(p.requirement()?);
            p.skip_ws();
            if p.at_end() {
                break;
            }
            p.expect(b',')?;
        }
        Ok(LabelSelector { reqs })
    }

    pub fn matches<L: LabelLookup + ?Sized>(&self, labels: &L) -> bool {
        self.reqs.iter().all(|r| {
            let v = labels.label(&r.key);
            match &r.op {
                Op::Equals(x) => v == Some(x.as_str()),
                Op::NotEquals(x) => v != Some(x.as_str()),
                Op::In(xs) => v.is_some_and(|v| xs.iter().any(|x| x == v)),
                Op::NotIn(xs) => v.is_none_or(|v| !xs.iter().any(|x| x == v)),
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
                Op::GreaterThan(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v > *n),
                Op::LessThan(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v < *n),
            }
        })
    }
}

/// Where a label selector reads an object's labels from.
pub trait LabelLookup {
    fn label(&self, key: &str) -> Option<&str>;
}

impl LabelLookup for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// An object's labels as the watch cache keeps them: sorted pairs in one boxed slice. A
/// `BTreeMap<String, String>` costs a node of eleven slots (over 500 bytes) however few the
/// labels; three labels here take 96 bytes and their strings.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Labels(Box<[(Box<str>, Box<str>)]>);

impl Labels {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .and_then(|i| self.0.get(i))
            .map(|(_, v)| &**v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<BTreeMap<String, String>> for Labels {
    fn from(map: BTreeMap<String, String>) -> Self {
        // A BTreeMap iterates in key order: the slice is sorted.
        Labels(map.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}

impl std::fmt::Debug for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl LabelLookup for Labels {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    src: &'a str,
}

impl Parser<'_> {
    fn at_end(&self) -> bool {
        self.i >= self.s.len()
    }
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    /// Moves past the current byte (`i` never passes the end, so it cannot overflow).
    fn bump(&mut self) {
        self.i = self.i.saturating_add(1);
    }
    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.bump();
        }
    }
    fn expect(&mut self, c: u8) -> Result<(), String> {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.bump();
            Ok(())
        } else {
            Err(format!(
                "unable to parse requirement: expected '{}' at position {} in {:?}",
                c as char, self.i, self.src
            ))
        }
    }
    /// A key or value: everything up to whitespace or an operator character.
    fn word(&mut self) -> String {
        self.skip_ws();
        let start = self.i;
        while let Some(c) = self.peek() {
            if c.is_ascii_whitespace() || b",()=!<>".contains(&c) {
                break;
            }
            self.bump();
        }
        self.src[start..self.i].to_string()
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        self.skip_ws();
        let negated = self.peek() == Some(b'!');
        if negated {
            self.bump();
        }
        let key = self.word();
        qualified_name(&key).map_err(|e| format!("invalid label key {key:?}: {e}"))?;
        if negated {
            return Ok(Requirement {
                key,
                op: Op::DoesNotExist,
            });
        }
        self.skip_ws();
        let op = match self.peek() {
            None | Some(b',') => Op::Exists,
            Some(b'=') => {
                self.bump();
                if self.peek() == Some(b'=') {
                    self.bump();
                }
                Op::Equals(self.value()?)
            }
            Some(b'!') => {
                self.bump();
                self.expect(b'=')?;
                Op::NotEquals(self.value()?)
            }
            Some(c @ (b'>' | b'<')) => {
                self.bump();
                let v = self.word();
                let n = v.parse::<i64>().map_err(|_| {
                    format!(
                        "invalid value {v:?} for '{}': an integer is required",
                        c as char
                    )
                })?;
                if c == b'>' {
                    Op::GreaterThan(n)
                } else {
                    Op::LessThan(n)
                }
            }
            _ => {
                let w = self.word();
                match w.as_str() {
                    "in" => Op::In(self.set()?),
                    "notin" => Op::NotIn(self.set()?),
                    _ => {
                        return Err(format!(
                            "unable to parse requirement: found {w:?}, expected: in, notin, =, \
                             ==, !=, gt, lt"
                        ));
                    }
                }
            }
        };
        Ok(Requirement { key, op })
    }

    fn value(&mut self) -> Result<String, String> {
        let v = self.word();
        label_value(&v).map_err(|e| format!("invalid label value {v:?}: {e}"))?;
        Ok(v)
    }

    fn set(&mut self) -> Result<Vec<String>, String> {
        self.expect(b'(')?;
        let mut vals = Vec::new();
        loop {
            self.skip_ws();
            if self.peek() == Some(b')') {
                self.bump();
                break;
            }
            vals.push(self.value()?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.bump(),
                Some(b')') => {}
                _ => {
                    return Err(format!(
                        "unable to parse set in {:?}: expected ',' or ')'",
                        self.src
                    ));
                }
            }
        }
        if vals.is_empty() {
            return Err("for 'in', 'notin' operators, values set can't be empty".into());
        }
        Ok(vals)
    }
}

/// A parsed field selector: `field=value`, `field==value`, `field!=value`, comma-separated.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldSelector {
    pub terms: Vec<FieldTerm>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldTerm {
    pub field: String,
    pub value: String,
    pub negated: bool,
}

impl FieldSelector {
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Parses and checks every field against `supported`.
    pub fn parse(s: &str, supported: impl Fn(&str) -> bool) -> Result<Self, String> {
        let mut terms = Vec::new();
        for part in split_unescaped(s) {
            // Spaces around terms are tolerated; only ASCII ones, so that a value made of
            // other white space (U+00A0, ...) is kept as it is.
            let part = trim_ascii(part);
            if part.is_empty() {
                continue;
            }
            let (field, value, negated) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, false)
            } else {
                return Err(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                ));
            };
            let field = trim_ascii(field);
            if !supported(field) {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push(FieldTerm {
                field: field.into(),
                value: unescape(trim_ascii(value)),
                negated,
            });
        }
        Ok(FieldSelector { terms })
    }

    pub fn matches(&self, value_of: impl Fn(&str) -> Option<String>) -> bool {
        self.terms.iter().all(|t| {
            let v = value_of(&t.field).unwrap_or_default();
            (v == t.value) != t.negated
        })
    }

    /// The value a term pins `field` to with `=`, for index lookups (`metadata.name=x`).
    pub fn exact(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && !t.negated)
            .map(|t| t.value.as_str())
    }
}

fn trim_ascii(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_ascii_whitespace())
}

/// Splits on commas not escaped with a backslash (Kubernetes escapes `,` `=` `\` in values).
fn split_unescaped(s: &str) -> Vec<&str> {
    let mut escaped = false;
    s.split(|c: char| {
        let split = !escaped && c == ',';
        escaped = !escaped && c == '\\';
        split
    })
    .collect()
}

fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_labels_answer_as_the_map_they_came_from() {
        let map = labels(&[("tier", "web"), ("app", "x"), ("n", "7"), ("zone", "")]);
        let compact = Labels::from(map.clone());
        assert_eq!(compact.len(), 4);
        let keys: Vec<&str> = compact.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["app", "n", "tier", "zone"], "sorted");
        for key in ["app", "n", "tier", "zone", "missing", "", "a", "zz"] {
            assert_eq!(compact.get(key), map.get(key).map(String::as_str), "{key}");
        }
        for sel in [
            "app=x",
            "app!=x",
            "tier in (web,api)",
            "tier notin (web)",
            "zone",
            "!zone",
            "missing",
            "!missing",
            "n>5",
            "n<5",
            "zone=",
            "app=x,tier=web,n>6",
        ] {
            let s = LabelSelector::parse(sel).unwrap();
            assert_eq!(s.matches(&compact), s.matches(&map), "{sel}");
        }
        assert!(Labels::default().is_empty());
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn check(sel: &str, l: &[(&str, &str)], expected: bool) {
        let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
        assert_eq!(s.matches(&labels(l)), expected, "{sel} on {l:?}");
    }

    #[test]
    fn label_selector_operators() {
        check("", &[], true);
        check("app=web", &[("app", "web")], true);
        check("app==web", &[("app", "db")], false);
        check("app!=web", &[], true);
        check("app!=web", &[("app", "web")], false);
        check("env in (prod, staging)", &[("env", "staging")], true);
        check("env in (prod)", &[], false);
        check("env notin (prod)", &[], true);
        check("env notin (prod,dev)", &[("env", "dev")], false);
        check("app", &[("app", "")], true);
        check("!app", &[("app", "x")], false);
        check("!app", &[], true);
        check(
            "tier=fe, app in (a,b),!legacy",
            &[("tier", "fe"), ("app", "b")],
            true,
        );
        check("replicas>2", &[("replicas", "3")], true);
        check("replicas<2", &[("replicas", "3")], false);
        check("svc.io/role=agent", &[("svc.io/role", "agent")], true);
    }

    #[test]
    fn label_selector_rejects_garbage() {
        for bad in [
            "app=",
            "=x",
            "app in ()",
            "app in (a",
            "app ~ b",
            "a b",
            "app=x y",
            "bad key=1",
        ] {
            if bad == "app=" {
                // An empty value is a valid label value.
                assert!(LabelSelector::parse(bad).is_ok());
                continue;
            }
            assert!(LabelSelector::parse(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn field_selectors() {
        let ok = |f: &str| f.starts_with("metadata.");
        let s =
            FieldSelector::parse("metadata.name=a,metadata.namespace!=kube-system", ok).unwrap();
        assert!(s.matches(|f| Some(if f == "metadata.name" { "a" } else { "default" }.into())));
        assert!(!s.matches(|_| Some("kube-system".into())));
        assert_eq!(s.exact("metadata.name"), Some("a"));
        assert!(FieldSelector::parse("spec.nodeName=x", ok).is_err());
        assert!(FieldSelector::parse("metadata.name", ok).is_err());
        let esc = FieldSelector::parse(r"metadata.name=a\,b", ok).unwrap();
        assert_eq!(esc.terms[0].value, "a,b");
    }
}
