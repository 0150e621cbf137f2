//! `AuthenticationConfiguration` (`apiserver.svc.io/v1beta1`, also `v1` and `v1alpha1`): JWT
//! authenticators and anonymous access, with the rules of Kubernetes'
//! `ValidateAuthenticationConfiguration` (field paths and wording as it prints them).
//!
//! No field has a default: the spec says the file format never defaults the username claim or
//! prefix. CEL expressions are checked here for what can be seen without compiling them (set
//! or not, exclusive with `claim`, duplicates, the `claims.email` rule); the gateway compiles
//! and type-checks them when it loads the file, with the same field paths.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::{ConfigKind, Path};
use svc_core::validation::{ErrorList, dns1123_subdomain};

/// JWT authenticators past this many are refused (Kubernetes' limit).
pub const MAX_JWT_AUTHENTICATORS: usize = 64;

/// The one `audienceMatchPolicy` there is.
pub const AUDIENCE_MATCH_ANY: &str = "MatchAny";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticationConfiguration {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jwt: Vec<JwtAuthenticator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anonymous: Option<AnonymousAuthConfig>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AnonymousAuthConfig {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<AnonymousAuthCondition>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AnonymousAuthCondition {
    #[serde(default)]
    pub path: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JwtAuthenticator {
    #[serde(default)]
    pub issuer: Issuer,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claim_validation_rules: Vec<ClaimValidationRule>,
    #[serde(default)]
    pub claim_mappings: ClaimMappings,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_validation_rules: Vec<UserValidationRule>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Issuer {
    #[serde(default)]
    pub url: String,
    #[serde(
        default,
        rename = "discoveryURL",
        skip_serializing_if = "String::is_empty"
    )]
    pub discovery_url: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub certificate_authority: String,
    #[serde(default)]
    pub audiences: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub audience_match_policy: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimValidationRule {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub required_value: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub expression: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimMappings {
    #[serde(default)]
    pub username: PrefixedClaimOrExpression,
    #[serde(default)]
    pub groups: PrefixedClaimOrExpression,
    #[serde(default)]
    pub uid: ClaimOrExpression,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<ExtraMapping>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrefixedClaimOrExpression {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim: String,
    /// `None` (unset) differs from `Some("")` (no prefix): with `claim` it must be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub expression: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimOrExpression {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub expression: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtraMapping {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub value_expression: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserValidationRule {
    #[serde(default)]
    pub expression: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl ConfigKind for AuthenticationConfiguration {
    const API_VERSIONS: &'static [&'static str] = &[
        "apiserver.svc.io/v1beta1",
        "apiserver.svc.io/v1",
        "apiserver.svc.io/v1alpha1",
    ];
    const KIND: &'static str = "AuthenticationConfiguration";

    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        let root = Path::root("jwt");
        // No authenticator at all is allowed (anonymous-only files), as in Kubernetes.
        if self.jwt.len() > MAX_JWT_AUTHENTICATORS {
            errors.push(
                root.as_str(),
                "FieldValueTooMany",
                format!(
                    "Too many: {}: must have at most {MAX_JWT_AUTHENTICATORS} items",
                    self.jwt.len()
                ),
            );
        }
        let mut urls = HashSet::new();
        let mut discovery_urls = HashSet::new();
        for (i, a) in self.jwt.iter().enumerate() {
            let path = root.index(i);
            errors.extend(validate_jwt_authenticator(a, &path));
            let issuer = path.child("issuer");
            if !urls.insert(a.issuer.url.as_str()) {
                errors.duplicate(issuer.child("url").as_str(), &a.issuer.url);
            }
            if !a.issuer.discovery_url.is_empty()
                && !discovery_urls.insert(a.issuer.discovery_url.as_str())
            {
                errors.duplicate(
                    issuer.child("discoveryURL").as_str(),
                    &a.issuer.discovery_url,
                );
            }
        }
        if let Some(anon) = &self.anonymous
            && !anon.enabled
            && !anon.conditions.is_empty()
        {
            let paths: Vec<&str> = anon.conditions.iter().map(|c| c.path.as_str()).collect();
            errors.invalid(
                "anonymous.conditions",
                &format!("{paths:?}"),
                "enabled should be set to true when conditions are defined",
            );
        }
        if let Some(anon) = &self.anonymous {
            for (i, c) in anon.conditions.iter().enumerate() {
                let path = Path::root("anonymous").child("conditions").index(i);
                if c.path.is_empty() {
                    errors.required(path.child("path").as_str(), "");
                }
            }
        }
        errors
    }
}

fn validate_jwt_authenticator(a: &JwtAuthenticator, path: &Path) -> ErrorList {
    let mut errors = ErrorList::default();
    errors.extend(validate_issuer(&a.issuer, &path.child("issuer")));
    let mut uses = EmailUse::default();
    errors.extend(validate_claim_rules(
        &a.claim_validation_rules,
        &path.child("claimValidationRules"),
        &mut uses,
    ));
    errors.extend(validate_claim_mappings(
        &a.claim_mappings,
        &path.child("claimMappings"),
        &mut uses,
    ));
    errors.extend(validate_user_rules(
        &a.user_validation_rules,
        &path.child("userValidationRules"),
    ));
    errors
}

fn validate_issuer(issuer: &Issuer, path: &Path) -> ErrorList {
    let mut errors = ErrorList::default();
    let url = path.child("url");
    if issuer.url.is_empty() {
        errors.required(url.as_str(), "");
    } else {
        errors.extend(validate_url(&issuer.url, &url));
    }
    if !issuer.discovery_url.is_empty() {
        let field = path.child("discoveryURL");
        if !issuer.url.is_empty()
            && issuer.url.trim_end_matches('/') == issuer.discovery_url.trim_end_matches('/')
        {
            errors.invalid(
                field.as_str(),
                &issuer.discovery_url,
                "discoveryURL must be different from URL",
            );
        }
        errors.extend(validate_url(&issuer.discovery_url, &field));
    }
    errors.extend(validate_audiences(issuer, path));
    if !issuer.certificate_authority.is_empty()
        && let Err(e) = ca_certificates(issuer.certificate_authority.as_bytes())
    {
        errors.invalid(path.child("certificateAuthority").as_str(), "<omitted>", &e);
    }
    errors
}

/// The rules Kubernetes' `validateURL` applies to issuer and discovery URLs.
fn validate_url(url: &str, path: &Path) -> ErrorList {
    let mut errors = ErrorList::default();
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    if scheme != "https" {
        errors.invalid(path.as_str(), url, "URL scheme must be https");
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        errors.invalid(
            path.as_str(),
            url,
            "URL must not contain a username or password",
        );
    }
    let before_fragment = rest.split('#').next().unwrap_or_default();
    if before_fragment
        .split_once('?')
        .is_some_and(|(_, q)| !q.is_empty())
    {
        errors.invalid(path.as_str(), url, "URL must not contain a query");
    }
    if rest.split_once('#').is_some_and(|(_, f)| !f.is_empty()) {
        errors.invalid(path.as_str(), url, "URL must not contain a fragment");
    }
    if scheme == "https" && authority.is_empty() {
        errors.invalid(path.as_str(), url, "URL must have a host");
    }
    errors
}

fn validate_audiences(issuer: &Issuer, path: &Path) -> ErrorList {
    let mut errors = ErrorList::default();
    let field = path.child("audiences");
    let policy = path.child("audienceMatchPolicy");
    if issuer.audiences.is_empty() {
        errors.required(field.as_str(), &format!("at least one {field} is required"));
        return errors;
    }
    let mut seen = HashSet::new();
    for (i, aud) in issuer.audiences.iter().enumerate() {
        if aud.is_empty() {
            errors.required(field.index(i).as_str(), "");
        }
        if !seen.insert(aud.as_str()) {
            errors.duplicate(field.index(i).as_str(), aud);
        }
    }
    let p = issuer.audience_match_policy.as_str();
    if issuer.audiences.len() > 1 && p != AUDIENCE_MATCH_ANY {
        errors.invalid(
            policy.as_str(),
            p,
            "audienceMatchPolicy must be MatchAny for multiple audiences",
        );
    }
    if issuer.audiences.len() == 1 && !p.is_empty() && p != AUDIENCE_MATCH_ANY {
        errors.invalid(
            policy.as_str(),
            p,
            "audienceMatchPolicy must be empty or MatchAny for single audience",
        );
    }
    errors
}

/// The DER certificates of a PEM bundle; an error worded as Go's `NewPoolFromBytes` when
/// there is none or one does not parse.
pub fn ca_certificates(pem: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    use svc_core::pem::decode_pem;
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some((block, after)) = decode_pem(rest) {
        rest = after;
        if block.label != "CERTIFICATE" {
            continue;
        }
        x509_parser::parse_x509_certificate(&block.der)
            .map_err(|e| format!("error reading certificate: {e}"))?;
        out.push(block.der);
    }
    if out.is_empty() {
        return Err("data does not contain any valid RSA or ECDSA certificates".into());
    }
    Ok(out)
}

/// Whether expressions read `claims.email` and `claims.email_verified`.
#[derive(Default)]
struct EmailUse {
    verified: bool,
}

/// Whether `expr` reads the claim `name` (`claims.name`, or `claims["name"]`), not a longer
/// name that starts with it.
pub fn reads_claim(expr: &str, name: &str) -> bool {
    let dotted = format!("claims.{name}");
    let found = expr.match_indices(&dotted).any(|(at, _)| {
        let before_ok = at == 0
            || !expr[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.');
        let after = &expr[at.saturating_add(dotted.len())..];
        before_ok
            && !after
                .chars()
                .next()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
    });
    found
        || expr.contains(&format!("claims[\"{name}\"]"))
        || expr.contains(&format!("claims['{name}']"))
}

fn validate_claim_rules(
    rules: &[ClaimValidationRule],
    path: &Path,
    uses: &mut EmailUse,
) -> ErrorList {
    let mut errors = ErrorList::default();
    let mut claims = HashSet::new();
    let mut expressions = HashSet::new();
    for (i, rule) in rules.iter().enumerate() {
        let p = path.index(i);
        match (rule.claim.is_empty(), rule.expression.is_empty()) {
            (false, false) => errors.invalid(
                p.as_str(),
                &rule.claim,
                "claim and expression can't both be set",
            ),
            (true, true) => errors.required(p.as_str(), "claim or expression is required"),
            (false, true) => {
                if !rule.message.is_empty() {
                    errors.invalid(
                        p.child("message").as_str(),
                        &rule.message,
                        "message can't be set when claim is set",
                    );
                }
                if !claims.insert(rule.claim.as_str()) {
                    errors.duplicate(p.child("claim").as_str(), &rule.claim);
                }
            }
            (true, false) => {
                if !rule.required_value.is_empty() {
                    errors.invalid(
                        p.child("requiredValue").as_str(),
                        &rule.required_value,
                        "requiredValue can't be set when expression is set",
                    );
                }
                if !expressions.insert(rule.expression.as_str()) {
                    errors.duplicate(p.child("expression").as_str(), &rule.expression);
                }
                uses.verified |= reads_claim(&rule.expression, "email_verified");
            }
        }
    }
    errors
}

fn validate_prefixed(m: &PrefixedClaimOrExpression, path: &Path, required: bool) -> ErrorList {
    let mut errors = ErrorList::default();
    match (m.claim.is_empty(), m.expression.is_empty()) {
        (false, false) => {
            errors.invalid(path.as_str(), "", "claim and expression can't both be set")
        }
        (true, true) if required => {
            errors.required(path.as_str(), "claim or expression is required")
        }
        _ => {}
    }
    if !m.expression.is_empty()
        && let Some(prefix) = &m.prefix
    {
        errors.invalid(
            path.child("prefix").as_str(),
            prefix,
            "may not be specified when expression is set",
        );
    }
    if !m.claim.is_empty() && m.prefix.is_none() {
        errors.required(
            path.child("prefix").as_str(),
            "required when claim is set. It can be set to an empty string to disable prefixing",
        );
    }
    errors
}

fn validate_claim_mappings(m: &ClaimMappings, path: &Path, uses: &mut EmailUse) -> ErrorList {
    let mut errors = ErrorList::default();
    errors.extend(validate_prefixed(
        &m.username,
        &path.child("username"),
        true,
    ));
    errors.extend(validate_prefixed(&m.groups, &path.child("groups"), false));
    if !m.uid.claim.is_empty() && !m.uid.expression.is_empty() {
        errors.invalid(
            path.child("uid").as_str(),
            "",
            "claim and expression can't both be set",
        );
    }
    uses.verified |= reads_claim(&m.username.expression, "email_verified");
    let mut keys = HashSet::new();
    for (i, extra) in m.extra.iter().enumerate() {
        let p = path.child("extra").index(i);
        let key = p.child("key");
        errors.extend(domain_prefixed_path(&key, &extra.key));
        if extra.key != extra.key.to_lowercase() {
            errors.invalid(key.as_str(), &extra.key, "key must be lowercase");
        }
        if reserved_domain(&extra.key) {
            errors.forbidden(
                key.as_str(),
                "svc.io and its subdomains are reserved for the server's own use",
            );
        }
        if !keys.insert(extra.key.as_str()) {
            errors.duplicate(key.as_str(), &extra.key);
            continue;
        }
        if extra.value_expression.is_empty() {
            errors.required(
                p.child("valueExpression").as_str(),
                "valueExpression is required",
            );
            continue;
        }
        uses.verified |= reads_claim(&extra.value_expression, "email_verified");
    }
    if reads_claim(&m.username.expression, "email") && !uses.verified {
        errors.invalid(
            path.child("username").child("expression").as_str(),
            &m.username.expression,
            "claims.email_verified must be used in claimMappings.username.expression or \
             claimMappings.extra[*].valueExpression or claimValidationRules[*].expression when \
             claims.email is used in claimMappings.username.expression",
        );
    }
    errors
}

/// Kubernetes reserves `k8s.io` and `kubernetes.io` (and their subdomains) for extra keys it
/// sets itself; ours is `svc.io`.
fn reserved_domain(key: &str) -> bool {
    let domain = key.split('/').next().unwrap_or_default();
    domain == "svc.io" || domain.ends_with(".svc.io")
}

/// Apimachinery's `IsDomainPrefixedPath`: `<RFC 1123 subdomain>/<HTTP path characters>`.
fn domain_prefixed_path(path: &Path, value: &str) -> ErrorList {
    let mut errors = ErrorList::default();
    if value.is_empty() {
        errors.required(path.as_str(), "");
        return errors;
    }
    let Some((host, rest)) = value
        .split_once('/')
        .filter(|(h, r)| !h.is_empty() && !r.is_empty())
    else {
        errors.invalid(
            path.as_str(),
            value,
            "must be a domain-prefixed path (such as \"acme.io/foo\")",
        );
        return errors;
    };
    if let Err(e) = dns1123_subdomain(host) {
        errors.invalid(path.as_str(), host, &e);
    }
    let path_char = |c: char| c.is_ascii_alphanumeric() || "/-._~%!$&'()*+,;=:".contains(c);
    if !rest.chars().all(path_char) {
        errors.invalid(
            path.as_str(),
            rest,
            "Invalid path (regex used for validation is '[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')",
        );
    }
    errors
}

fn validate_user_rules(rules: &[UserValidationRule], path: &Path) -> ErrorList {
    let mut errors = ErrorList::default();
    let mut seen = HashSet::new();
    for (i, rule) in rules.iter().enumerate() {
        let p = path.index(i).child("expression");
        if rule.expression.is_empty() {
            errors.required(p.as_str(), "expression is required");
            continue;
        }
        if !seen.insert(rule.expression.as_str()) {
            errors.duplicate(p.as_str(), &rule.expression);
        }
    }
    errors
}

#[cfg(test)]
#[path = "authentication/tests.rs"]
mod tests;
