//! The validation of Kubernetes' `certificates/validation` for our group: the request must
//! be a signed PKCS#10 request in a `CERTIFICATE REQUEST` PEM block, usages come from the
//! known list without repeats, the signer name is `<domain>/<path>`, `expirationSeconds` is
//! at least 600, conditions are one per type, `True` only for the known types, Approved and
//! Denied never together, and the certificate is PEM `CERTIFICATE` blocks. Updates may not
//! change the spec or remove a known condition; only `/approval` changes Approved and Denied,
//! and only `/status` sets the certificate, once, after approval and not after failure.

use super::{
    CONDITION_APPROVED, CONDITION_DENIED, CONDITION_FAILED, CertificateSigningRequest,
    CertificateSigningRequestCondition, KEY_USAGES, MIN_EXPIRATION_SECONDS,
};
use crate::pem::{parse_request, validate_certificate};
use crate::validation::{ErrorList, dns1123_label, dns1123_subdomain};

/// Condition types that may only be `True`.
const TRUE_ONLY: &[&str] = &[CONDITION_APPROVED, CONDITION_DENIED, CONDITION_FAILED];
const TRUE_STATUS: &[&str] = &["True"];
const ALL_STATUSES: &[&str] = &["False", "True", "Unknown"];

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// `<fqdn>/<namespace>.<name>`: a subdomain, a label and a subdomain, a `/` and a `.`.
const SIGNER_NAME_MAX: usize = DNS1123_SUBDOMAIN_MAX * 2 + DNS1123_LABEL_MAX + 2;

/// Which write an update came through: each may change a different part of the status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum UpdatePath {
    Object,
    Approval,
    Status,
}

/// Everything a stored object must satisfy (metadata is validated generically).
pub(super) fn validate_create(csr: &CertificateSigningRequest) -> ErrorList {
    let mut errs = ErrorList::default();
    let spec = &csr.spec;
    if let Err(e) = parse_request(&spec.request) {
        errs.push(
            "spec.request",
            "FieldValueInvalid",
            format!("Invalid value: \"<certificate request>\": {e}"),
        );
    }
    if spec.usages.is_empty() {
        errs.required("spec.usages", "");
    }
    for (i, usage) in spec.usages.iter().enumerate() {
        if !KEY_USAGES.contains(&usage.as_str()) {
            errs.not_supported(&format!("spec.usages[{i}]"), usage, KEY_USAGES);
        }
    }
    for (i, usage) in spec.usages.iter().enumerate() {
        if spec.usages.iter().take(i).any(|u| u == usage) {
            errs.duplicate(&format!("spec.usages[{i}]"), usage);
        }
    }
    validate_signer_name(&mut errs, "spec.signerName", &spec.signer_name);
    if let Some(secs) = spec.expiration_seconds
        && secs < MIN_EXPIRATION_SECONDS
    {
        errs.invalid(
            "spec.expirationSeconds",
            &secs.to_string(),
            "may not specify a duration less than 600 seconds (10 minutes)",
        );
    }
    validate_conditions(&mut errs, &csr.status.conditions);
    if !csr.status.certificate.is_empty()
        && let Err(e) = validate_certificate(&csr.status.certificate)
    {
        errs.push(
            "status.certificate",
            "FieldValueInvalid",
            format!("Invalid value: \"<certificate data>\": {e}"),
        );
    }
    errs
}

/// Kubernetes' `ValidateSignerName`: `example.com/signer-name`, the domain of at least two
/// DNS labels, the path of dot-separated DNS subdomains.
pub(super) fn validate_signer_name(errs: &mut ErrorList, field: &str, name: &str) {
    if name.is_empty() {
        errs.required(field, "");
        return;
    }
    let segments: Vec<&str> = name.split('/').collect();
    let [domain, path] = segments[..] else {
        errs.invalid(
            field,
            name,
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        );
        return;
    };
    if domain.len() > DNS1123_SUBDOMAIN_MAX {
        errs.too_long(field, DNS1123_SUBDOMAIN_MAX);
    }
    let labels: Vec<&str> = domain.split('.').collect();
    if let Some((label, e)) = labels
        .iter()
        .find_map(|l| dns1123_label(l).err().map(|e| (l, e)))
    {
        errs.invalid(field, domain, &format!("validating label {label:?}: {e}"));
    }
    if labels.len() < 2 {
        errs.invalid(
            field,
            domain,
            "should be a domain with at least two segments separated by dots",
        );
    }
    if let Some((label, e)) = path
        .split('.')
        .find_map(|l| dns1123_subdomain(l).err().map(|e| (l, e)))
    {
        errs.invalid(field, path, &format!("validating label {label:?}: {e}"));
    }
    if name.len() > SIGNER_NAME_MAX {
        errs.too_long(field, SIGNER_NAME_MAX);
    }
}

fn validate_conditions(errs: &mut ErrorList, conditions: &[CertificateSigningRequestCondition]) {
    let (mut approved, mut denied) = (false, false);
    for (i, c) in conditions.iter().enumerate() {
        let at = format!("status.conditions[{i}]");
        if c.type_.is_empty() {
            errs.required(&format!("{at}.type"), "");
        }
        let allowed = if TRUE_ONLY.contains(&c.type_.as_str()) {
            TRUE_STATUS
        } else {
            ALL_STATUSES
        };
        if c.status.is_empty() {
            errs.required(&format!("{at}.status"), "");
        } else if !allowed.contains(&c.status.as_str()) {
            errs.not_supported(&format!("{at}.status"), &c.status, allowed);
        }
        let exclusive = match c.type_.as_str() {
            CONDITION_APPROVED => {
                approved = true;
                denied
            }
            CONDITION_DENIED => {
                denied = true;
                approved
            }
            _ => false,
        };
        if exclusive {
            errs.invalid(
                &format!("{at}.type"),
                &c.type_,
                "Approved and Denied conditions are mutually exclusive",
            );
        }
        if conditions.iter().take(i).any(|o| o.type_ == c.type_) {
            errs.duplicate(&format!("{at}.type"), &c.type_);
        }
    }
}

/// The rules of an update beyond what every stored object must satisfy (`validate_create`,
/// which the update also passes).
pub(super) fn validate_update(
    new: &CertificateSigningRequest,
    old: &CertificateSigningRequest,
    path: UpdatePath,
) -> ErrorList {
    let mut errs = ErrorList::default();
    if path == UpdatePath::Object {
        validate_spec_unchanged(&mut errs, new, old);
    }
    for ty in TRUE_ONLY {
        if of_type(new, ty).len() < of_type(old, ty).len() {
            errs.forbidden(
                "status.conditions",
                &format!("updates may not remove a condition of type {ty:?}"),
            );
        }
    }
    if path != UpdatePath::Approval {
        for ty in [CONDITION_APPROVED, CONDITION_DENIED] {
            let (before, after) = (of_type(old, ty), of_type(new, ty));
            if after.len() > before.len() {
                errs.forbidden(
                    "status.conditions",
                    &format!("updates may not add a condition of type {ty:?}"),
                );
            } else if after.len() == before.len() && after != before {
                errs.forbidden(
                    "status.conditions",
                    &format!("updates may not modify a condition of type {ty:?}"),
                );
            }
        }
    }
    if new.status.certificate != old.status.certificate {
        let problem = if path != UpdatePath::Status {
            Some("updates may not set certificate content")
        } else if !old.status.certificate.is_empty() {
            Some("updates may not modify existing certificate content")
        } else if !new.status.has_true(CONDITION_APPROVED) {
            Some("may only be set once the request is Approved")
        } else if new.status.has_true(CONDITION_FAILED) {
            Some("may not be set on a request that has Failed")
        } else {
            None
        };
        if let Some(p) = problem {
            errs.forbidden("status.certificate", p);
        }
    }
    errs
}

/// The spec is fixed at creation: each changed field is named.
fn validate_spec_unchanged(
    errs: &mut ErrorList,
    new: &CertificateSigningRequest,
    old: &CertificateSigningRequest,
) {
    let (n, o) = (&new.spec, &old.spec);
    let immutable = "field is immutable";
    if n.request != o.request {
        errs.invalid("spec.request", "<certificate request>", immutable);
    }
    if n.signer_name != o.signer_name {
        errs.invalid("spec.signerName", &n.signer_name, immutable);
    }
    if n.expiration_seconds != o.expiration_seconds {
        let v = n
            .expiration_seconds
            .map(|s| s.to_string())
            .unwrap_or_default();
        errs.invalid("spec.expirationSeconds", &v, immutable);
    }
    if n.usages != o.usages {
        errs.invalid("spec.usages", &n.usages.join(","), immutable);
    }
    if n.username != o.username {
        errs.invalid("spec.username", &n.username, immutable);
    }
    if n.uid != o.uid {
        errs.invalid("spec.uid", &n.uid, immutable);
    }
    if n.groups != o.groups {
        errs.invalid("spec.groups", &n.groups.join(","), immutable);
    }
    if n.extra != o.extra {
        errs.invalid("spec.extra", "", immutable);
    }
}

fn of_type<'a>(
    csr: &'a CertificateSigningRequest,
    ty: &str,
) -> Vec<&'a CertificateSigningRequestCondition> {
    csr.status
        .conditions
        .iter()
        .filter(|c| c.type_ == ty)
        .collect()
}
