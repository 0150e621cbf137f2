//! Configuration files and plugin payloads of the second spec document: strict decoding by
//! `apiVersion` and `kind`, field paths, and the Go-style durations they are written with.
//!
//! Every kind implements [`ConfigKind`]. [`load`] decodes a YAML or JSON document into it,
//! refuses unknown fields (all of them are listed, each with its path), then runs the kind's
//! own validation; the errors read as Kubernetes prints them:
//! `jwt[0].issuer.url: Invalid value: "http://x": must be https`.
//!
//! The server runs the same code on its own files at start as `svc-gateway validate-config`
//! does on any file.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::validation::ErrorList;

pub mod admission;
pub mod admission_review;
pub mod audit;
pub mod authentication;
pub mod authorization;
pub mod component;
pub mod controller_manager;
pub mod egress;
pub mod event_rate_limit;
pub mod exec_credential;
pub mod image_review;
pub mod kubeconfig;
pub mod proxy;
pub mod registry;
pub mod scheduler;
pub mod subject_access_review;
pub mod tracing;

/// A configuration kind: its versions, its name, its rules and its defaults.
pub trait ConfigKind: DeserializeOwned + Serialize {
    /// The `apiVersion` values this type decodes, the preferred first.
    const API_VERSIONS: &'static [&'static str];
    /// The `kind` field.
    const KIND: &'static str;

    /// Every rule of the spec's field tables and Limits table; each error names its path.
    fn validate(&self) -> ErrorList;

    /// Fills the spec's defaults (for `--print-defaults`, and before the server uses it).
    fn apply_defaults(&mut self) {}
}

/// Why a document was refused: every error found, each naming its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// What was being read, for example a file path or `AuthenticationConfiguration`.
    pub subject: String,
    pub errors: ErrorList,
}

impl ConfigError {
    pub fn new(subject: impl Into<String>, errors: ErrorList) -> Self {
        Self {
            subject: subject.into(),
            errors,
        }
    }

    fn one(subject: &str, field: &str, reason: &str, message: String) -> Self {
        let mut errors = ErrorList::default();
        errors.push(field, reason, message);
        Self::new(subject, errors)
    }

    /// Each error as Kubernetes prints a field error: `path: message`.
    pub fn lines(&self) -> Vec<String> {
        self.errors
            .0
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines = self.lines();
        write!(f, "{}: ", self.subject)?;
        if let [only] = lines.as_slice() {
            write!(f, "{only}")
        } else {
            write!(f, "[{}]", lines.join(", "))
        }
    }
}

impl std::error::Error for ConfigError {}

/// Parses one YAML or JSON document (JSON is YAML) into a JSON value. Duplicate keys are
/// refused.
pub fn parse_document(bytes: &[u8]) -> Result<Value, ConfigError> {
    let trimmed = bytes.trim_ascii_start();
    if trimmed.first() == Some(&b'{') {
        return serde_json::from_slice(trimmed)
            .map_err(|e| ConfigError::one("document", "", "FieldValueInvalid", e.to_string()));
    }
    crate::codec::yaml::decode::<Value>(bytes)
        .map_err(|e| ConfigError::one("document", "", "FieldValueInvalid", e.to_string()))
}

/// The `apiVersion` and `kind` of a parsed document (empty strings where absent).
pub fn type_meta(doc: &Value) -> (String, String) {
    let field = |k: &str| {
        doc.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (field("apiVersion"), field("kind"))
}

/// Decodes `bytes` as `T`: the type meta must name `T`, no field may be unknown, and `T`'s
/// rules must hold. Defaults are applied after validation of what was written.
pub fn load<T: ConfigKind>(bytes: &[u8]) -> Result<T, ConfigError> {
    let doc = parse_document(bytes)?;
    load_value(doc)
}

/// [`load`] for an already parsed document.
pub fn load_value<T: ConfigKind>(doc: Value) -> Result<T, ConfigError> {
    check_type_meta::<T>(&doc)?;
    let mut value: T = decode_strict(doc).map_err(|e| ConfigError::new(T::KIND, e))?;
    let errors = value.validate();
    if !errors.is_empty() {
        return Err(ConfigError::new(T::KIND, errors));
    }
    value.apply_defaults();
    Ok(value)
}

/// Refuses a document whose `apiVersion` or `kind` is not `T`'s.
pub fn check_type_meta<T: ConfigKind>(doc: &Value) -> Result<(), ConfigError> {
    let (api_version, kind) = type_meta(doc);
    let mut errors = ErrorList::default();
    if api_version.is_empty() {
        errors.required("apiVersion", "");
    } else if !T::API_VERSIONS.contains(&api_version.as_str()) {
        errors.not_supported("apiVersion", &api_version, T::API_VERSIONS);
    }
    if kind.is_empty() {
        errors.required("kind", "");
    } else if kind != T::KIND {
        errors.not_supported("kind", &kind, &[T::KIND]);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::new(T::KIND, errors))
    }
}

/// Decodes `doc` into `T`, listing every unknown field with its path (`apiVersion` and
/// `kind` at the top are allowed whether or not `T` names them). A type error names its
/// path too.
pub fn decode_strict<T: DeserializeOwned>(doc: Value) -> Result<T, ErrorList> {
    let mut unknown = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(doc, &mut track);
    let decoded = serde_ignored::deserialize(de, |p| {
        let path = format_path(&p);
        if path != "apiVersion" && path != "kind" {
            unknown.push(path);
        }
    });
    let mut errors = ErrorList::default();
    match decoded {
        Ok(value) if unknown.is_empty() => Ok(value),
        Ok(_) => {
            for path in unknown {
                let name = path.rsplit('.').next().unwrap_or(&path).to_string();
                errors.push(
                    &path,
                    "FieldValueInvalid",
                    format!("unknown field {name:?}"),
                );
            }
            Err(errors)
        }
        Err(e) => {
            let path = track.path().to_string();
            let field = if path == "." { String::new() } else { path };
            errors.push(&field, "FieldValueInvalid", format!("Invalid value: {e}"));
            Err(errors)
        }
    }
}

fn format_path(p: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path as P;
    match p {
        P::Root => String::new(),
        P::Seq { parent, index } => format!("{}[{index}]", format_path(parent)),
        P::Map { parent, key } => {
            let parent = format_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            format_path(parent)
        }
    }
}

/// A field path under construction, as validation code walks a document:
/// `Path::root("jwt").index(0).child("issuer").child("url")` is `jwt[0].issuer.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    pub fn root(name: &str) -> Self {
        Self(name.to_string())
    }

    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            Self(name.to_string())
        } else {
            Self(format!("{}.{name}", self.0))
        }
    }

    pub fn index(&self, i: usize) -> Self {
        Self(format!("{}[{i}]", self.0))
    }

    pub fn key(&self, k: &str) -> Self {
        Self(format!("{}[{k}]", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A `metav1.Duration`: written as Go writes durations (`1h2m3.5s`, `300ms`, `0s`),
/// held in nanoseconds (negative values are representable so validation can refuse them
/// with the field's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Duration(pub i64);

impl Duration {
    pub const fn from_secs(s: i64) -> Self {
        Self(s.saturating_mul(1_000_000_000))
    }

    pub const fn from_millis(ms: i64) -> Self {
        Self(ms.saturating_mul(1_000_000))
    }

    pub fn nanos(self) -> i64 {
        self.0
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// As a `std` duration; negative values become zero.
    pub fn to_std(self) -> std::time::Duration {
        std::time::Duration::from_nanos(u64::try_from(self.0).unwrap_or(0))
    }

    /// Parses Go's `time.ParseDuration` syntax: a sign, then one or more decimal numbers
    /// each with a unit of `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`. Overflow is an error.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("time: invalid duration {text:?}");
        let (neg, mut rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        if rest == "0" {
            return Ok(Self(0));
        }
        if rest.is_empty() {
            return Err(bad());
        }
        let mut total: i128 = 0;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit() && c != '.')
                .ok_or_else(bad)?;
            if digits == 0 {
                return Err(bad());
            }
            let number = &rest[..digits];
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let unit: i128 = match &rest[..unit_len] {
                "ns" => 1,
                "us" | "µs" | "μs" => 1_000,
                "ms" => 1_000_000,
                "s" => 1_000_000_000,
                "m" => 60_000_000_000,
                "h" => 3_600_000_000_000,
                _ => return Err(bad()),
            };
            rest = &rest[unit_len..];
            let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
            if whole.is_empty() && frac.is_empty() {
                return Err(bad());
            }
            let whole: i128 = if whole.is_empty() {
                0
            } else {
                whole.parse().map_err(|_| bad())?
            };
            let mut part = whole.checked_mul(unit).ok_or_else(bad)?;
            let mut scale = unit;
            for d in frac.bytes().take(18) {
                scale /= 10;
                // A second '.' ("1.2.3s") is not a digit.
                let digit = d.checked_sub(b'0').filter(|d| *d <= 9).ok_or_else(bad)?;
                part = part
                    .checked_add(i128::from(digit).saturating_mul(scale))
                    .ok_or_else(bad)?;
            }
            total = total.checked_add(part).ok_or_else(bad)?;
            if total > i128::from(i64::MAX) {
                return Err(bad());
            }
        }
        let total = i64::try_from(total).map_err(|_| bad())?;
        Ok(Self(if neg { total.saturating_neg() } else { total }))
    }
}

impl fmt::Display for Duration {
    /// Go's `Duration.String()`: `1h2m3s`, `1.5s`, `300ms`, `0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n == 0 {
            return f.write_str("0s");
        }
        let sign = if n < 0 { "-" } else { "" };
        let u = n.unsigned_abs();
        if u < 1_000 {
            return write!(f, "{sign}{u}ns");
        }
        if u < 1_000_000 {
            return write!(f, "{sign}{}µs", trim_fraction(u, 1_000));
        }
        if u < 1_000_000_000 {
            return write!(f, "{sign}{}ms", trim_fraction(u, 1_000_000));
        }
        let secs_total = u / 1_000_000_000;
        let h = secs_total / 3600;
        let m = (secs_total % 3600) / 60;
        let rem = u % 60_000_000_000;
        let secs = trim_fraction(rem, 1_000_000_000);
        if h > 0 {
            write!(f, "{sign}{h}h{m}m{secs}s")
        } else if m > 0 {
            write!(f, "{sign}{m}m{secs}s")
        } else {
            write!(f, "{sign}{secs}s")
        }
    }
}

fn trim_fraction(value: u64, unit: u64) -> String {
    let whole = value.checked_div(unit).unwrap_or_default();
    let frac = value.checked_rem(unit).unwrap_or_default();
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Duration::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Sample {
        #[serde(default)]
        items: Vec<Item>,
        #[serde(default)]
        timeout: Option<Duration>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Item {
        name: String,
        #[serde(default)]
        count: i32,
    }

    impl ConfigKind for Sample {
        const API_VERSIONS: &'static [&'static str] =
            &["sample.svc.io/v1", "sample.svc.io/v1beta1"];
        const KIND: &'static str = "Sample";

        fn validate(&self) -> ErrorList {
            let mut errors = ErrorList::default();
            let items = Path::root("items");
            for (i, item) in self.items.iter().enumerate() {
                if item.count < 0 {
                    errors.invalid(
                        items.index(i).child("count").as_str(),
                        &item.count.to_string(),
                        "must be greater than or equal to 0",
                    );
                }
            }
            errors
        }

        fn apply_defaults(&mut self) {
            self.timeout.get_or_insert(Duration::from_secs(10));
        }
    }

    #[test]
    fn every_unknown_field_is_listed_with_its_path() {
        let doc = br#"{"apiVersion":"sample.svc.io/v1","kind":"Sample","extra":1,
            "items":[{"name":"a"},{"name":"b","colour":"red"}]}"#;
        let err = load::<Sample>(doc).unwrap_err();
        assert_eq!(
            err.lines(),
            [
                r#"extra: unknown field "extra""#,
                r#"items[1].colour: unknown field "colour""#
            ]
        );
    }

    #[test]
    fn type_errors_name_their_path() {
        let doc = b"apiVersion: sample.svc.io/v1\nkind: Sample\nitems:\n- name: a\n  count: lots\n";
        let err = load::<Sample>(doc).unwrap_err();
        assert_eq!(err.errors.0.len(), 1);
        assert_eq!(err.errors.0[0].field, "items[0].count");
    }

    #[test]
    fn validation_errors_read_as_kubernetes_prints_them() {
        let doc =
            b"apiVersion: sample.svc.io/v1beta1\nkind: Sample\nitems:\n- name: a\n  count: -2\n";
        let err = load::<Sample>(doc).unwrap_err();
        assert_eq!(
            err.lines(),
            [r#"items[0].count: Invalid value: "-2": must be greater than or equal to 0"#]
        );
        assert!(err.to_string().starts_with("Sample: items[0].count"));
    }

    #[test]
    fn wrong_type_meta_is_refused_and_defaults_fill_what_is_unset() {
        let err = load::<Sample>(b"apiVersion: v1\nkind: Other\n").unwrap_err();
        let fields: Vec<&str> = err.errors.0.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["apiVersion", "kind"]);
        let ok = load::<Sample>(b"apiVersion: sample.svc.io/v1\nkind: Sample\n").unwrap();
        assert_eq!(ok.timeout, Some(Duration::from_secs(10)));
    }

    #[test]
    fn durations_parse_and_print_as_go_does() {
        for (text, nanos, printed) in [
            ("0", 0, "0s"),
            ("0s", 0, "0s"),
            ("300ms", 300_000_000, "300ms"),
            ("1.5s", 1_500_000_000, "1.5s"),
            ("1h2m3s", 3_723_000_000_000, "1h2m3s"),
            ("2m", 120_000_000_000, "2m0s"),
            ("-5s", -5_000_000_000, "-5s"),
            ("1us", 1_000, "1µs"),
            (".5s", 500_000_000, "500ms"),
        ] {
            let d = Duration::parse(text).unwrap();
            assert_eq!(d.nanos(), nanos, "{text}");
            assert_eq!(d.to_string(), printed, "{text}");
        }
        for bad in [
            "",
            "5",
            "s",
            "1x",
            "1.s.",
            "9999999999999999999h",
            "--1s",
            "1.2.3s",
        ] {
            assert!(Duration::parse(bad).is_err(), "{bad}");
        }
    }
}
