//! AuthenticationConfiguration: one valid document, then invalid ones, each naming its fields.

use super::*;
use crate::load;

const CA: &str = "-----BEGIN CERTIFICATE-----
MIIBdzCCAR2gAwIBAgIUJ0VEtJn6X3lCIXo1P0U8tmW3C+gwCgYIKoZIzj0EAwIw
ETEPMA0GA1UEAwwGdGVzdGNhMB4XDTI0MDEwMTAwMDAwMFoXDTM0MDEwMTAwMDAw
MFowETEPMA0GA1UEAwwGdGVzdGNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE
-----END CERTIFICATE-----
";

fn doc(jwt: &str) -> String {
    format!("apiVersion: apiserver.svc.io/v1beta1\nkind: AuthenticationConfiguration\njwt:\n{jwt}")
}

const VALID: &str = "\
- issuer:
    url: https://issuer.example.com
    audiences: [a, b]
    audienceMatchPolicy: MatchAny
  claimValidationRules:
  - claim: hd
    requiredValue: example.com
  - expression: claims.email_verified == true
    message: email must be verified
  claimMappings:
    username:
      expression: claims.email
    groups:
      claim: groups
      prefix: ''
    uid:
      claim: sub
    extra:
    - key: example.com/tenant
      valueExpression: claims.tenant
  userValidationRules:
  - expression: \"!user.username.startsWith('system:')\"
    message: no system users
- issuer:
    url: https://other.example.com/path
    discoveryURL: https://discovery.example.com/.well-known/openid-configuration
    audiences: [c]
  claimMappings:
    username:
      claim: sub
      prefix: 'other:'
";

/// The field paths (and the first words of each message) of a document's errors.
fn check(jwt: &str, expected: &[(&str, &str)]) {
    let err = load::<AuthenticationConfiguration>(doc(jwt).as_bytes())
        .expect_err("the document must be refused");
    let got: Vec<(String, String)> = err
        .errors
        .0
        .iter()
        .map(|c| (c.field.clone(), c.message.clone()))
        .collect();
    assert_eq!(got.len(), expected.len(), "{got:#?}");
    for ((field, message), (want_field, want)) in got.iter().zip(expected) {
        assert_eq!(field, want_field, "{got:#?}");
        assert!(
            message.contains(want),
            "{field}: {message:?} lacks {want:?}"
        );
    }
}

#[test]
fn a_complete_document_is_accepted_in_every_version() {
    for version in ["v1beta1", "v1", "v1alpha1"] {
        let text = doc(VALID).replace("v1beta1", version);
        let c = load::<AuthenticationConfiguration>(text.as_bytes()).unwrap();
        assert_eq!(c.jwt.len(), 2);
        let m = &c.jwt[0].claim_mappings;
        assert_eq!(m.groups.prefix.as_deref(), Some(""));
        assert_eq!(m.extra[0].key, "example.com/tenant");
        assert_eq!(c.jwt[1].issuer.discovery_url.len(), 62);
        // No defaulting: an unset prefix stays unset.
        assert_eq!(m.username.prefix, None);
    }
    let anon = "apiVersion: apiserver.svc.io/v1beta1\nkind: AuthenticationConfiguration\n\
                anonymous:\n  enabled: true\n  conditions:\n  - path: /livez\n";
    let c = load::<AuthenticationConfiguration>(anon.as_bytes()).unwrap();
    assert!(c.jwt.is_empty());
    assert_eq!(c.anonymous.unwrap().conditions[0].path, "/livez");
}

#[test]
fn issuers_are_checked_as_kubernetes_checks_them() {
    check(
        "- issuer:\n    url: http://x\n    audiences: [a]\n  claimMappings:\n    username: {claim: sub, prefix: ''}\n",
        &[(
            "jwt[0].issuer.url",
            "Invalid value: \"http://x\": URL scheme must be https",
        )],
    );
    check(
        "- issuer:\n    url: https://u:p@x?q=1#f\n    audiences: []\n  claimMappings:\n    username: {claim: sub, prefix: ''}\n",
        &[
            (
                "jwt[0].issuer.url",
                "must not contain a username or password",
            ),
            ("jwt[0].issuer.url", "must not contain a query"),
            ("jwt[0].issuer.url", "must not contain a fragment"),
            (
                "jwt[0].issuer.audiences",
                "Required value: at least one jwt[0].issuer.audiences is required",
            ),
        ],
    );
    check(
        "- issuer:\n    url: https://x\n    discoveryURL: https://x/\n    audiences: [a, a]\n  claimMappings:\n    username: {claim: sub, prefix: ''}\n",
        &[
            (
                "jwt[0].issuer.discoveryURL",
                "discoveryURL must be different from URL",
            ),
            ("jwt[0].issuer.audiences[1]", "Duplicate value: \"a\""),
            (
                "jwt[0].issuer.audienceMatchPolicy",
                "must be MatchAny for multiple audiences",
            ),
        ],
    );
    check(
        "- issuer:\n    url: https://x\n    audiences: [a]\n    audienceMatchPolicy: MatchAll\n    certificateAuthority: nonsense\n  claimMappings:\n    username: {claim: sub, prefix: ''}\n",
        &[
            (
                "jwt[0].issuer.audienceMatchPolicy",
                "must be empty or MatchAny for single audience",
            ),
            (
                "jwt[0].issuer.certificateAuthority",
                "data does not contain any valid RSA or ECDSA certificates",
            ),
        ],
    );
    check(
        &format!(
            "- issuer:\n    url: https://x\n    audiences: [a]\n    certificateAuthority: |\n{}  claimMappings:\n    username: {{claim: sub, prefix: ''}}\n",
            CA.lines()
                .map(|l| format!("      {l}\n"))
                .collect::<String>()
        ),
        &[(
            "jwt[0].issuer.certificateAuthority",
            "Invalid value: \"<omitted>\"",
        )],
    );
}

#[test]
fn urls_and_discovery_urls_are_unique() {
    let one = "- issuer:\n    url: https://x\n    discoveryURL: https://d\n    audiences: [a]\n  claimMappings:\n    username: {claim: sub, prefix: ''}\n";
    check(
        &format!("{one}{one}"),
        &[
            ("jwt[1].issuer.url", "Duplicate value: \"https://x\""),
            (
                "jwt[1].issuer.discoveryURL",
                "Duplicate value: \"https://d\"",
            ),
        ],
    );
}

#[test]
fn claim_rules_and_mappings_follow_the_spec() {
    let issuer = "- issuer:\n    url: https://x\n    audiences: [a]\n";
    check(
        &format!(
            "{issuer}  claimValidationRules:\n  - {{claim: a, expression: 'true'}}\n  - {{}}\n  \
             - {{claim: b, message: m}}\n  - {{claim: b}}\n  - {{expression: 'true', requiredValue: v}}\n  \
             - {{expression: 'true'}}\n  claimMappings:\n    username: {{claim: sub}}\n"
        ),
        &[
            (
                "jwt[0].claimValidationRules[0]",
                "claim and expression can't both be set",
            ),
            (
                "jwt[0].claimValidationRules[1]",
                "Required value: claim or expression is required",
            ),
            (
                "jwt[0].claimValidationRules[2].message",
                "message can't be set when claim is set",
            ),
            (
                "jwt[0].claimValidationRules[3].claim",
                "Duplicate value: \"b\"",
            ),
            (
                "jwt[0].claimValidationRules[4].requiredValue",
                "requiredValue can't be set when expression is set",
            ),
            (
                "jwt[0].claimValidationRules[5].expression",
                "Duplicate value: \"true\"",
            ),
            (
                "jwt[0].claimMappings.username.prefix",
                "required when claim is set",
            ),
        ],
    );
    check(
        &format!(
            "{issuer}  claimMappings:\n    username: {{claim: sub, expression: claims.sub}}\n    \
             groups: {{expression: claims.g, prefix: 'x:'}}\n    uid: {{claim: sub, expression: claims.sub}}\n"
        ),
        &[
            (
                "jwt[0].claimMappings.username",
                "claim and expression can't both be set",
            ),
            (
                "jwt[0].claimMappings.username.prefix",
                "required when claim is set",
            ),
            (
                "jwt[0].claimMappings.groups.prefix",
                "may not be specified when expression is set",
            ),
            (
                "jwt[0].claimMappings.uid",
                "claim and expression can't both be set",
            ),
        ],
    );
    check(
        &format!("{issuer}  claimMappings:\n    groups: {{claim: g, prefix: ''}}\n"),
        &[(
            "jwt[0].claimMappings.username",
            "claim or expression is required",
        )],
    );
}

#[test]
fn an_email_username_needs_email_verified_somewhere() {
    let issuer = "- issuer:\n    url: https://x\n    audiences: [a]\n";
    check(
        &format!("{issuer}  claimMappings:\n    username: {{expression: claims.email}}\n"),
        &[(
            "jwt[0].claimMappings.username.expression",
            "claims.email_verified must be used",
        )],
    );
    for verified in [
        "  claimValidationRules:\n  - expression: claims.email_verified\n  claimMappings:\n    username: {expression: claims.email}\n",
        "  claimMappings:\n    username: {expression: \"claims.email_verified ? claims.email : ''\"}\n",
        "  claimMappings:\n    username: {expression: claims.email}\n    extra:\n    - {key: a.io/v, valueExpression: 'string(claims.email_verified)'}\n",
    ] {
        let text = doc(&format!("{issuer}{verified}"));
        load::<AuthenticationConfiguration>(text.as_bytes()).unwrap();
    }
    // A claim named email_address is not email.
    let text = doc(&format!(
        "{issuer}  claimMappings:\n    username: {{expression: claims.email_address}}\n"
    ));
    load::<AuthenticationConfiguration>(text.as_bytes()).unwrap();
    assert!(reads_claim("claims['email']", "email"));
    assert!(!reads_claim("xclaims.email", "email"));
}

#[test]
fn extra_keys_and_user_rules() {
    let issuer = "- issuer:\n    url: https://x\n    audiences: [a]\n";
    check(
        &format!(
            "{issuer}  claimMappings:\n    username: {{claim: sub, prefix: ''}}\n    extra:\n    \
             - {{key: nodomain, valueExpression: x}}\n    - {{key: Example.com/A, valueExpression: x}}\n    \
             - {{key: a.svc.io/b, valueExpression: x}}\n    - {{key: e.io/k}}\n    - {{key: e.io/k, valueExpression: q}}\n  \
             userValidationRules:\n  - {{message: m}}\n  - {{expression: x}}\n  - {{expression: x}}\n"
        ),
        &[
            (
                "jwt[0].claimMappings.extra[0].key",
                "must be a domain-prefixed path",
            ),
            (
                "jwt[0].claimMappings.extra[1].key",
                "Invalid value: \"Example.com\"",
            ),
            ("jwt[0].claimMappings.extra[1].key", "key must be lowercase"),
            ("jwt[0].claimMappings.extra[2].key", "Forbidden"),
            (
                "jwt[0].claimMappings.extra[3].valueExpression",
                "valueExpression is required",
            ),
            (
                "jwt[0].claimMappings.extra[4].key",
                "Duplicate value: \"e.io/k\"",
            ),
            ("jwt[0].userValidationRules[0].expression", "Required value"),
            (
                "jwt[0].userValidationRules[2].expression",
                "Duplicate value: \"x\"",
            ),
        ],
    );
}

#[test]
fn anonymous_conditions_need_enabled_and_unknown_fields_are_listed() {
    let text = "apiVersion: apiserver.svc.io/v1beta1\nkind: AuthenticationConfiguration\n\
                anonymous:\n  enabled: false\n  conditions:\n  - path: /livez\n  - {}\n";
    let err = load::<AuthenticationConfiguration>(text.as_bytes()).unwrap_err();
    let fields: Vec<&str> = err.errors.0.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        ["anonymous.conditions", "anonymous.conditions[1].path"]
    );

    let text = doc(
        "- issuer:\n    url: https://x\n    audience: [a]\n  claimMappings:\n    username: {claim: sub, prefix: '', colour: red}\n",
    );
    let err = load::<AuthenticationConfiguration>(text.as_bytes()).unwrap_err();
    assert_eq!(
        err.lines(),
        [
            "jwt[0].issuer.audience: unknown field \"audience\"",
            "jwt[0].claimMappings.username.colour: unknown field \"colour\""
        ]
    );
}
