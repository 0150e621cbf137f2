//! JWT authenticators of `--authentication-config` (OIDC issuers), and the anonymous access
//! that file configures. A bearer token goes to the authenticator whose issuer `url` equals
//! its `iss` (issuers are unique and never the service-account issuer, so at most one can
//! verify it); that one checks the signature with the issuer's keys (`oidc`), `iss`, `aud`
//! per `audienceMatchPolicy`, `exp`, `nbf` and `iat` with a small skew, then runs the claim
//! rules and mappings (`claims`). Accepted tokens are cached (bounded, keyed by a hash of the
//! token, until the earlier of their expiry and [`CACHE_TTL`]), so neither signatures nor
//! expressions are evaluated again for a token seen a moment ago.

pub mod claims;
pub mod oidc;

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use base64::Engine as _;
use jsonwebtoken::{Algorithm, Validation};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::Value;
use svc_config::authentication::{AnonymousAuthConfig, AuthenticationConfiguration};
use svc_config::{ConfigError, Path};
use svc_core::user::{GROUP_AUTHENTICATED, UserInfo};
use svc_core::validation::ErrorList;

use self::claims::Mapper;
use self::oidc::{KeySource, SourceId};
use crate::base::deadline::Deadline;

/// How long an accepted token is trusted without being checked again (a reload empties the
/// cache at once, since the new configuration gets its own).
pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// Clock skew allowed on `exp`, `nbf` and `iat`.
pub const LEEWAY_SECONDS: u64 = 60;
/// Algorithms a token may be signed with; `none` and shared secrets never verify.
const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];
/// Buckets of `apiserver_authentication_jwt_authenticator_latency_seconds`.
const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    result: &'static str,
    jwt_issuer_hash: String,
}

/// The JWT authenticators' own metrics, and the issuers' key sources shared across reloads.
#[derive(Clone)]
pub struct Runtime {
    latency: Family<LatencyLabels, Histogram>,
    sources: Arc<Mutex<HashMap<SourceId, Weak<KeySource>>>>,
}

impl Runtime {
    pub fn register(registry: &mut Registry) -> Self {
        let latency = Family::<LatencyLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(LATENCY_BUCKETS)
        });
        registry.register(
            "apiserver_authentication_jwt_authenticator_latency_seconds",
            "Latency of jwt authentication operations in seconds. This is the time spent \
             authenticating a token for cache miss only (i.e. when the token is not found in \
             the cache).",
            latency.clone(),
        );
        Runtime {
            latency,
            sources: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The running key source for `issuer`, or a new one (fetching in the background).
    fn source(
        &self,
        issuer: &svc_config::authentication::Issuer,
    ) -> Result<Arc<KeySource>, String> {
        let id = SourceId::of(issuer);
        let mut sources = self.sources.lock();
        sources.retain(|_, s| s.strong_count() > 0);
        if let Some(s) = sources.get(&id).and_then(Weak::upgrade) {
            return Ok(s);
        }
        let s = Arc::new(KeySource::new(issuer)?);
        s.start();
        sources.insert(id, Arc::downgrade(&s));
        Ok(s)
    }
}

/// `sha256:<hex>` of the issuer, Kubernetes' `jwt_issuer_hash` label.
fn issuer_hash(url: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, url.as_bytes());
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

struct Authenticator {
    url: String,
    audiences: Vec<String>,
    keys: Arc<KeySource>,
    mapper: Mapper,
    hash: String,
}

/// What the JWT authenticators say about a bearer token.
#[derive(Debug)]
pub enum Verdict {
    /// No authenticator's issuer is the token's `iss` (or it is no JWT).
    NotOurs,
    Accepted(Arc<UserInfo>),
    Refused(String),
}

/// Accepted tokens' users, each with the instant it stops being served.
type TokenCache = crate::security::tokens::HashCache<(Arc<UserInfo>, Instant)>;

/// The authentication configuration in force: JWT authenticators and the file's anonymous
/// settings. Replaced whole on reload.
#[derive(Default)]
pub struct Authentication {
    authenticators: Vec<Authenticator>,
    /// The file's `anonymous`; `None` leaves anonymous access to `--anonymous-auth`.
    pub anonymous: Option<AnonymousAuthConfig>,
    cache: Mutex<TokenCache>,
    latency: Option<Family<LatencyLabels, Histogram>>,
}

/// What loading checks besides the file itself.
pub struct LoadContext<'a> {
    /// Issuers of service-account tokens, which no JWT authenticator may claim.
    pub service_account_issuers: &'a [String],
    /// Whether `--anonymous-auth` was given (the file's `anonymous` may then not be set).
    pub anonymous_flag_set: bool,
}

impl Authentication {
    /// Decodes, validates and compiles a configuration file's content; every error is listed
    /// with its field path. Issuers already known keep their fetched keys.
    pub fn load(
        bytes: &[u8],
        ctx: &LoadContext<'_>,
        shared: &Runtime,
    ) -> Result<Self, ConfigError> {
        let config: AuthenticationConfiguration = svc_config::load(bytes)?;
        Self::from_config(&config, ctx, shared)
    }

    pub fn from_config(
        config: &AuthenticationConfiguration,
        ctx: &LoadContext<'_>,
        shared: &Runtime,
    ) -> Result<Self, ConfigError> {
        let mut errors = ErrorList::default();
        if config.anonymous.is_some() && ctx.anonymous_flag_set {
            errors.forbidden(
                "anonymous",
                "--anonymous-auth flag cannot be set when anonymous field is configured in \
                 authentication configuration file",
            );
        }
        let mut mappers = Vec::new();
        for (i, a) in config.jwt.iter().enumerate() {
            let path = Path::root("jwt").index(i);
            if ctx.service_account_issuers.contains(&a.issuer.url) {
                errors.invalid(
                    path.child("issuer").child("url").as_str(),
                    &a.issuer.url,
                    &format!(
                        "URL must not overlap with disallowed issuers: {:?}",
                        ctx.service_account_issuers
                    ),
                );
            }
            match Mapper::compile(a, &path) {
                Ok(m) => mappers.push(m),
                Err(e) => errors.extend(e),
            }
        }
        if !errors.is_empty() {
            return Err(ConfigError::new("AuthenticationConfiguration", errors));
        }
        let mut authenticators = Vec::new();
        for (a, mapper) in config.jwt.iter().zip(mappers) {
            let keys = shared.source(&a.issuer).map_err(|e| {
                let mut errors = ErrorList::default();
                errors.push("jwt", "FieldValueInvalid", e);
                ConfigError::new("AuthenticationConfiguration", errors)
            })?;
            authenticators.push(Authenticator {
                url: a.issuer.url.clone(),
                audiences: a.issuer.audiences.clone(),
                keys,
                mapper,
                hash: issuer_hash(&a.issuer.url),
            });
        }
        Ok(Authentication {
            authenticators,
            anonymous: config.anonymous.clone(),
            cache: Mutex::new(TokenCache::default()),
            latency: Some(shared.latency.clone()),
        })
    }

    /// Whether any JWT authenticator is configured.
    pub fn has_authenticators(&self) -> bool {
        !self.authenticators.is_empty()
    }

    /// Authenticates a bearer token with the authenticator of its issuer.
    pub async fn authenticate(&self, token: &str) -> Verdict {
        if self.authenticators.is_empty() {
            return Verdict::NotOurs;
        }
        let hash: [u8; 32] = {
            let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
            let mut h = [0; 32];
            h.copy_from_slice(d.as_ref());
            h
        };
        let cached = self
            .cache
            .lock()
            .get(&hash, |(_, until)| *until > Instant::now());
        if let Some((user, _)) = cached {
            return Verdict::Accepted(user);
        }
        let Some(iss) = unverified_issuer(token) else {
            return Verdict::NotOurs;
        };
        let Some(a) = self.authenticators.iter().find(|a| a.url == iss) else {
            return Verdict::NotOurs;
        };
        let started = Instant::now();
        let result = a.verify(token).await;
        if let Some(latency) = &self.latency {
            let labels = LatencyLabels {
                result: if result.is_ok() { "success" } else { "failure" },
                jwt_issuer_hash: a.hash.clone(),
            };
            latency
                .get_or_create(&labels)
                .observe(started.elapsed().as_secs_f64());
        }
        match result {
            Ok((user, exp)) => {
                let user = Arc::new(user);
                let now_unix = unix_now();
                let left = u64::try_from(exp.saturating_sub(now_unix)).unwrap_or(0);
                let until = Instant::now().later(Duration::from_secs(left).min(CACHE_TTL));
                self.cache.lock().insert(hash, (user.clone(), until));
                Verdict::Accepted(user)
            }
            Err(e) => Verdict::Refused(e),
        }
    }
}

fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// The `iss` of a JWT's payload, read without verifying anything (to pick the authenticator).
fn unverified_issuer(token: &str) -> Option<String> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    #[derive(serde::Deserialize)]
    struct Iss {
        iss: Option<String>,
    }
    serde_json::from_slice::<Iss>(&bytes).ok()?.iss
}

impl Authenticator {
    /// The user of a token whose `iss` is this issuer, and the token's `exp`.
    async fn verify(&self, token: &str) -> Result<(UserInfo, i64), String> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| format!("oidc: malformed jwt: {e}"))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(format!(
                "oidc: malformed jwt: unsupported signing algorithm {:?}",
                header.alg
            ));
        }
        let keys = self.keys.keys().ok_or_else(|| {
            format!(
                "oidc: authenticator for issuer {:?} is not initialized",
                self.url
            )
        })?;
        let kid = header.kid.as_deref();
        let mut candidates = keys.candidates(kid);
        if candidates.is_empty() && kid.is_some() {
            // Perhaps the issuer rotated its keys since we fetched them.
            if let Some(keys) = self.keys.refresh_for_unknown_kid().await {
                candidates = keys.candidates(kid);
            }
        }
        if candidates.is_empty() {
            return Err(format!(
                "oidc: verify token: failed to verify signature: no key with id {:?}",
                kid.unwrap_or_default()
            ));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.url]);
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_nbf = true;
        // Audiences are matched below per `audienceMatchPolicy` (aud may be a string or a list).
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp", "iss"]);
        let mut last = String::from("oidc: verify token: failed to verify signature");
        let mut claims = None;
        for key in candidates {
            if !key.algorithms.contains(&header.alg) {
                continue;
            }
            match jsonwebtoken::decode::<Value>(token, &key.key, &validation) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(e) => last = format!("oidc: verify token: {e}"),
            }
        }
        let claims = claims.ok_or(last)?;
        let now = unix_now();
        let leeway = LEEWAY_SECONDS as i64;
        if let Some(iat) = claims.get("iat").and_then(Value::as_i64)
            && iat > now.saturating_add(leeway)
        {
            return Err("oidc: verify token: token used before issued (iat)".into());
        }
        let aud: Vec<&str> = match claims.get("aud") {
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        // MatchAny, the only policy (and the meaning of an unset one with one audience).
        if !self
            .audiences
            .iter()
            .any(|want| aud.contains(&want.as_str()))
        {
            return Err(format!(
                "oidc: verify token: expected audience in {:?} got {:?}",
                self.audiences, aud
            ));
        }
        let exp = claims.get("exp").and_then(Value::as_i64).unwrap_or(now);
        let mut user = self.mapper.user(&claims)?;
        if !user.in_group(GROUP_AUTHENTICATED) {
            user.groups.push(GROUP_AUTHENTICATED.into());
        }
        Ok((user, exp))
    }
}

/// Whether a request without a credential may go on as anonymous under the file's
/// `anonymous`: when enabled, everywhere without conditions, else on the listed paths.
pub fn anonymous_allowed_by(config: &AnonymousAuthConfig, path: &str) -> bool {
    config.enabled
        && (config.conditions.is_empty() || config.conditions.iter().any(|c| c.path == path))
}

#[cfg(test)]
#[path = "jwt/tests.rs"]
mod tests;
