//! Name and metadata validation, with messages in Kubernetes' wording so clients and people
//! recognise them; every error names its field.

pub mod declarative;
mod path;

pub use path::Path;

use crate::ambient::Ambient;
use crate::meta::ObjectMeta;
use crate::status::StatusCause;

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;
const QUALIFIED_NAME_MAX: usize = 63;
const LABEL_VALUE_MAX: usize = 63;
/// Kubernetes' limit on the total size of all annotations of an object.
pub const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;
const GENERATE_PREFIX_MAX: usize = DNS1123_SUBDOMAIN_MAX - crate::ambient::SUFFIX_LEN;

/// Collects field errors; becomes the `causes` of a 422 `Invalid` error.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ErrorList(pub Vec<StatusCause>);

impl ErrorList {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn required(&mut self, field: &str, detail: &str) {
        self.push(
            field,
            "FieldValueRequired",
            format!("Required value{}", suffix(detail)),
        );
    }

    pub fn invalid(&mut self, field: &str, value: &str, detail: &str) {
        self.push(
            field,
            "FieldValueInvalid",
            format!("Invalid value: {value:?}{}", suffix(detail)),
        );
    }

    pub fn forbidden(&mut self, field: &str, detail: &str) {
        self.push(
            field,
            "FieldValueForbidden",
            format!("Forbidden{}", suffix(detail)),
        );
    }

    pub fn duplicate(&mut self, field: &str, value: &str) {
        self.push(
            field,
            "FieldValueDuplicate",
            format!("Duplicate value: {value:?}"),
        );
    }

    pub fn too_long(&mut self, field: &str, max: usize) {
        self.push(
            field,
            "FieldValueTooLong",
            format!("Too long: may not be more than {max} bytes"),
        );
    }

    pub fn not_supported(&mut self, field: &str, value: &str, allowed: &[&str]) {
        let allowed: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
        self.push(
            field,
            "FieldValueNotSupported",
            format!(
                "Unsupported value: {value:?}: supported values: {}",
                allowed.join(", ")
            ),
        );
    }

    pub fn push(&mut self, field: &str, reason: &str, message: String) {
        self.0.push(StatusCause {
            reason: reason.into(),
            message,
            field: field.into(),
        });
    }

    pub fn extend(&mut self, other: ErrorList) {
        self.0.extend(other.0);
    }
}

fn suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

fn is_alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// A lowercase RFC 1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn dns1123_label(value: &str) -> Result<(), String> {
    let b = value.as_bytes();
    if b.len() > DNS1123_LABEL_MAX {
        return Err(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters"
        ));
    }
    let ok = !b.is_empty()
        && b.first().is_some_and(|&c| is_alnum_lower(c))
        && b.last().is_some_and(|&c| is_alnum_lower(c))
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'-');
    if ok {
        Ok(())
    } else {
        Err(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \
             '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or \
             '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
                .into(),
        )
    }
}

/// A lowercase RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub fn dns1123_subdomain(value: &str) -> Result<(), String> {
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        return Err(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    let ok = !value.is_empty()
        && value.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.first().is_some_and(|&c| is_alnum_lower(c))
                && b.last().is_some_and(|&c| is_alnum_lower(c))
                && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character (e.g. \
             'example.com', regex used for validation is \
             '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                .into(),
        )
    }
}

fn qualified_part(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= QUALIFIED_NAME_MAX
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// A label or annotation key: `[prefix/]name`, prefix a DNS subdomain, name at most 63 characters.
pub fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err("prefix part must be non-empty".into());
        }
        dns1123_subdomain(p).map_err(|e| format!("prefix part {e}"))?;
    }
    if qualified_part(name) {
        Ok(())
    } else {
        Err(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start \
             and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or \
             '123-abc', regex used for validation is \
             '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]'), at most 63 characters"
                .into(),
        )
    }
}

/// A label value: empty, or at most 63 characters of the qualified-name alphabet.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || (value.len() <= LABEL_VALUE_MAX && qualified_part(value)) {
        Ok(())
    } else {
        Err(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', \
             '_' or '.', and must start and end with an alphanumeric character, at most 63 \
             characters"
                .into(),
        )
    }
}

/// How a kind's names are validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    Dns1123Label,
    Dns1123Subdomain,
    /// Any name that is a valid path segment (events use this).
    PathSegment,
}

impl NameRule {
    pub fn check(self, name: &str) -> Result<(), String> {
        match self {
            NameRule::Dns1123Label => dns1123_label(name),
            NameRule::Dns1123Subdomain => dns1123_subdomain(name),
            NameRule::PathSegment => path_segment(name),
        }
    }
}

/// A name usable as one URL path segment: not `.`/`..`, without `/` or `%`.
pub fn path_segment(name: &str) -> Result<(), String> {
    if name == "." || name == ".." {
        return Err(format!("may not be '{name}'"));
    }
    if name.contains('/') || name.contains('%') {
        return Err("may not contain '/' or '%'".into());
    }
    Ok(())
}

/// Validates the metadata every object shares. `namespaced` says whether the kind lives in a
/// namespace (then `metadata.namespace` must be set by the time this runs).
pub fn validate_object_meta(meta: &ObjectMeta, namespaced: bool, rule: NameRule) -> ErrorList {
    let mut errs = ErrorList::default();
    if meta.name.is_empty() {
        errs.required("metadata.name", "name or generateName is required");
    } else if let Err(e) = rule.check(&meta.name) {
        errs.invalid("metadata.name", &meta.name, &e);
    }
    if namespaced {
        if meta.namespace.is_empty() {
            errs.required("metadata.namespace", "");
        } else if let Err(e) = dns1123_label(&meta.namespace) {
            errs.invalid("metadata.namespace", &meta.namespace, &e);
        }
    } else if !meta.namespace.is_empty() {
        errs.forbidden("metadata.namespace", "not allowed on this type");
    }
    for (k, v) in &meta.labels {
        if let Err(e) = qualified_name(k) {
            errs.invalid("metadata.labels", k, &e);
        }
        if let Err(e) = label_value(v) {
            errs.invalid(&format!("metadata.labels[{k}]"), v, &e);
        }
    }
    let mut total = 0usize;
    for (k, v) in &meta.annotations {
        if let Err(e) = qualified_name(&k.to_ascii_lowercase()) {
            errs.invalid("metadata.annotations", k, &e);
        }
        total = total.saturating_add(k.len()).saturating_add(v.len());
    }
    if total > ANNOTATIONS_MAX_BYTES {
        errs.too_long("metadata.annotations", ANNOTATIONS_MAX_BYTES);
    }
    for (i, f) in meta.finalizers.iter().enumerate() {
        if let Err(e) = qualified_name(f) {
            errs.invalid(&format!("metadata.finalizers[{i}]"), f, &e);
        }
    }
    errs
}

/// Checks the metadata fields an update may not change.
pub fn validate_object_meta_update(new: &ObjectMeta, old: &ObjectMeta) -> ErrorList {
    let mut errs = ErrorList::default();
    if new.name != old.name {
        errs.invalid("metadata.name", &new.name, "field is immutable");
    }
    if new.namespace != old.namespace {
        errs.invalid("metadata.namespace", &new.namespace, "field is immutable");
    }
    if !new.uid.is_empty() && new.uid != old.uid {
        errs.invalid("metadata.uid", &new.uid, "field is immutable");
    }
    if new.creation_timestamp.is_some() && new.creation_timestamp != old.creation_timestamp {
        errs.invalid("metadata.creationTimestamp", "", "field is immutable");
    }
    // As Kubernetes' ValidateNoNewFinalizers: a terminating object only loses finalizers.
    if old.deletion_timestamp.is_some() {
        let mut added: Vec<&String> = new
            .finalizers
            .iter()
            .filter(|f| !old.finalizers.contains(f))
            .collect();
        added.sort();
        added.dedup();
        if !added.is_empty() {
            let list = added
                .iter()
                .map(|f| format!("{f:?}"))
                .collect::<Vec<_>>()
                .join(", ");
            errs.forbidden(
                "metadata.finalizers",
                &format!(
                    "no new finalizers can be added if the object is being deleted, found new \
                     finalizers []string{{{list}}}"
                ),
            );
        }
    }
    errs
}

/// A name for `generateName`: the prefix (trimmed so the result fits) plus a random suffix
/// drawn from `ambient`.
pub fn generate_name(prefix: &str, ambient: &dyn Ambient) -> String {
    let mut end = prefix.len().min(GENERATE_PREFIX_MAX);
    while !prefix.is_char_boundary(end) {
        end = end.saturating_sub(1);
    }
    format!("{}{}", &prefix[..end], ambient.random_suffix())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(rule: NameRule, name: &str, ok: bool) {
        assert_eq!(rule.check(name).is_ok(), ok, "{rule:?} {name:?}");
    }

    #[test]
    fn dns_names() {
        check(NameRule::Dns1123Label, "kube-system", true);
        check(NameRule::Dns1123Label, "a", true);
        check(NameRule::Dns1123Label, "Default", false);
        check(NameRule::Dns1123Label, "-a", false);
        check(NameRule::Dns1123Label, "a.b", false);
        check(NameRule::Dns1123Label, &"a".repeat(63), true);
        check(NameRule::Dns1123Label, &"a".repeat(64), false);
        check(NameRule::Dns1123Subdomain, "a.b-c.d", true);
        check(NameRule::Dns1123Subdomain, "a..b", false);
        check(NameRule::Dns1123Subdomain, "a_b", false);
        check(NameRule::Dns1123Subdomain, "", false);
        check(NameRule::PathSegment, "Any Name:1", true);
        check(NameRule::PathSegment, "..", false);
        check(NameRule::PathSegment, "a/b", false);
    }

    #[test]
    fn labels() {
        assert!(qualified_name("app").is_ok());
        assert!(qualified_name("svc.io/enforce-mountable-secrets").is_ok());
        assert!(qualified_name("/x").is_err());
        assert!(qualified_name("Bad Key").is_err());
        assert!(label_value("").is_ok());
        assert!(label_value("v1.2_3").is_ok());
        assert!(label_value("-x").is_err());
        assert!(label_value(&"v".repeat(64)).is_err());
    }

    #[test]
    fn meta_errors_name_fields() {
        let mut m = ObjectMeta {
            name: "Bad".into(),
            ..Default::default()
        };
        m.labels.insert("ok".into(), "not ok!".into());
        let errs = validate_object_meta(&m, true, NameRule::Dns1123Subdomain);
        let fields: Vec<&str> = errs.0.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            ["metadata.name", "metadata.namespace", "metadata.labels[ok]"]
        );
        let cluster = ObjectMeta {
            name: "x".into(),
            namespace: "n".into(),
            ..Default::default()
        };
        assert_eq!(
            validate_object_meta(&cluster, false, NameRule::Dns1123Label)
                .0
                .len(),
            1
        );
    }

    #[test]
    fn generated_names_fit_and_vary() {
        let sys = crate::ambient::System;
        let a = generate_name("web-", &sys);
        assert!(a.starts_with("web-") && a.len() == 9, "{a}");
        assert_ne!(generate_name("web-", &sys), generate_name("web-", &sys));
        let long = generate_name(&"p".repeat(300), &sys);
        assert_eq!(long.len(), 253);
        assert!(dns1123_subdomain(&long).is_ok());
    }
}
