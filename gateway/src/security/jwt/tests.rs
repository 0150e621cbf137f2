//! JWT authenticators unit by unit: picking the issuer, the token cache, and claim mappings
//! without expressions (the e2e suite signs real tokens against a real issuer).

use serde_json::json;
use svc_config::authentication::{
    ClaimMappings, ClaimValidationRule, JwtAuthenticator, PrefixedClaimOrExpression,
};

use super::*;

fn token_with(payload: serde_json::Value) -> String {
    let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    format!(
        "{}.{}.sig",
        b64(br#"{"alg":"ES256"}"#),
        b64(payload.to_string().as_bytes())
    )
}

#[test]
fn the_issuer_is_read_before_anything_is_verified() {
    assert_eq!(
        unverified_issuer(&token_with(json!({"iss": "https://a"}))).as_deref(),
        Some("https://a")
    );
    assert_eq!(unverified_issuer(&token_with(json!({"sub": "x"}))), None);
    assert_eq!(unverified_issuer("a.b"), None);
    assert_eq!(unverified_issuer("a.!!.c"), None);
    assert_eq!(
        unverified_issuer(&format!("{}.d", token_with(json!({"iss": "x"})))),
        None
    );
}

#[test]
fn the_token_cache_is_bounded_and_forgets_expired_entries() {
    let mut c = TokenCache::default();
    let user = Arc::new(UserInfo::default());
    let later = Instant::now() + Duration::from_secs(60);
    for i in 0..crate::security::tokens::CACHE_CAPACITY + 10 {
        let mut h = [0u8; 32];
        h[..8].copy_from_slice(&(i as u64).to_le_bytes());
        c.insert(h, (user.clone(), later));
    }
    assert_eq!(c.len(), crate::security::tokens::CACHE_CAPACITY);
    let live = |(_, until): &(Arc<UserInfo>, Instant)| *until > Instant::now();
    assert!(c.get(&[0; 32], live).is_none(), "the oldest went first");
    let h = [9; 32];
    c.insert(h, (user, Instant::now()));
    assert!(c.get(&h, live).is_none(), "expired");
}

fn authenticator(mappings: ClaimMappings, rules: Vec<ClaimValidationRule>) -> JwtAuthenticator {
    JwtAuthenticator {
        claim_mappings: mappings,
        claim_validation_rules: rules,
        ..Default::default()
    }
}

fn claim(claim: &str, prefix: &str) -> PrefixedClaimOrExpression {
    PrefixedClaimOrExpression {
        claim: claim.into(),
        prefix: Some(prefix.into()),
        expression: String::new(),
    }
}

#[test]
fn claims_map_to_a_user_as_kubernetes_maps_them() {
    let a = authenticator(
        ClaimMappings {
            username: claim("email", "oidc:"),
            groups: claim("groups", "g:"),
            uid: svc_config::authentication::ClaimOrExpression {
                claim: "sub".into(),
                expression: String::new(),
            },
            extra: vec![],
        },
        vec![ClaimValidationRule {
            claim: "hd".into(),
            required_value: "example.com".into(),
            ..Default::default()
        }],
    );
    let m = Mapper::compile(&a, &Path::root("jwt").index(0)).unwrap();
    let base = json!({"email": "a@example.com", "sub": "123", "hd": "example.com",
                      "groups": ["dev", "", "ops"]});
    let u = m.user(&base).unwrap();
    assert_eq!(u.username, "oidc:a@example.com");
    assert_eq!(u.uid, "123");
    assert_eq!(u.groups, ["g:dev", "g:ops"]);

    let with = |k: &str, v: serde_json::Value| {
        let mut c = base.clone();
        c[k] = v;
        c
    };
    assert_eq!(
        m.user(&with("groups", json!("one"))).unwrap().groups,
        ["g:one"]
    );
    assert!(
        m.user(&with("groups", json!(null)))
            .unwrap()
            .groups
            .is_empty()
    );
    assert!(m.user(&with("groups", json!(5))).is_err());
    let e = m.user(&with("hd", json!("other.com"))).unwrap_err();
    assert!(e.contains("required claim hd value does not match"), "{e}");
    assert!(m.user(&with("email_verified", json!(true))).is_ok());
    assert_eq!(
        m.user(&with("email_verified", json!(false))).unwrap_err(),
        "oidc: email not verified"
    );
    let e = m.user(&with("email", json!(""))).unwrap_err();
    assert!(e.contains("empty username"), "{e}");
    let mut no_sub = base.clone();
    no_sub.as_object_mut().unwrap().remove("sub");
    assert!(m.user(&no_sub).unwrap_err().contains("claim not present"));
}

#[test]
fn anonymous_conditions_are_exact_paths() {
    use svc_config::authentication::AnonymousAuthCondition;
    let c = AnonymousAuthConfig {
        enabled: true,
        conditions: vec![AnonymousAuthCondition {
            path: "/livez".into(),
        }],
    };
    assert!(anonymous_allowed_by(&c, "/livez"));
    assert!(!anonymous_allowed_by(&c, "/livez/ping"));
    assert_eq!(issuer_hash("https://a").len(), 7 + 64);
}

#[test]
fn expressions_map_claims_and_stop_at_their_budget() {
    let mut a = authenticator(
        ClaimMappings {
            username: PrefixedClaimOrExpression {
                expression: "'x:' + claims.sub".into(),
                ..Default::default()
            },
            groups: PrefixedClaimOrExpression {
                expression: "claims.groups".into(),
                ..Default::default()
            },
            ..Default::default()
        },
        vec![ClaimValidationRule {
            expression:
                "!has(claims.items) || claims.items.all(x, claims.items.all(y, x == y || x != y))"
                    .into(),
            ..Default::default()
        }],
    );
    a.user_validation_rules = vec![svc_config::authentication::UserValidationRule {
        expression: "user.groups.all(g, g != 'banned')".into(),
        message: "banned".into(),
    }];
    let m = Mapper::compile(&a, &Path::root("jwt").index(0)).unwrap();
    let u = m
        .user(&json!({"sub": "s", "groups": ["a", "", "b"]}))
        .unwrap();
    assert_eq!(u.username, "x:s");
    assert_eq!(u.groups, ["a", "b"]);
    assert_eq!(
        m.user(&json!({"sub": "s", "groups": ["banned"]}))
            .unwrap_err(),
        "banned"
    );
    let items: Vec<u32> = (0..1500).collect();
    let e = m
        .user(&json!({"sub": "s", "groups": [], "items": items}))
        .unwrap_err();
    assert!(e.contains("cost limit exceeded"), "{e}");

    // Types are checked at load where they are known.
    a.claim_mappings.username.expression = "1 + 2".into();
    let errors = Mapper::compile(&a, &Path::root("jwt").index(0))
        .err()
        .unwrap();
    assert_eq!(
        errors.0[0].field,
        "jwt[0].claimMappings.username.expression"
    );
}
