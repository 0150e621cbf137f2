//! Service-account tokens: issued by a ServiceAccount's `token` subresource as ES256 JWTs laid
//! out the way Kubernetes lays them out, and verified on every request that carries one.
//! Verification caches the result of the signature check (bounded, keyed by a hash of the
//! token, never past the token's expiry); the account (and the bound Secret) are looked up
//! every time, so deleting or recreating one revokes its tokens at once.

use std::collections::hash_map::RandomState;
use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use lru::LruCache;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use svc_core::kinds::{Secret, ServiceAccount};
use svc_core::user::{GROUP_AUTHENTICATED, UserInfo};
use svc_core::{ApiError, Resource};
use svc_storage::Store;
use time::OffsetDateTime;

use crate::base::flags::Options;
use crate::registry::caches::Caches;

/// Verified tokens kept; past this the oldest are dropped.
pub(crate) const CACHE_CAPACITY: usize = 16_384;
/// Clock skew allowed on `exp` and `nbf`.
const LEEWAY_SECONDS: u64 = 60;
/// Extra key carrying the token's ID, as Kubernetes' `authentication.kubernetes.io/credential-id`.
pub const CREDENTIAL_ID_EXTRA: &str = "authentication.svc.io/credential-id";
pub const GROUP_SERVICE_ACCOUNTS: &str = "system:serviceaccounts";
pub const USER_PREFIX: &str = "system:serviceaccount:";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Ref {
    name: String,
    uid: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Private {
    namespace: String,
    serviceaccount: Ref,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<Ref>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    aud: Vec<String>,
    exp: i64,
    iat: i64,
    nbf: i64,
    jti: String,
    #[serde(rename = "svc.io")]
    private: Private,
}

/// A token as issued.
#[derive(Debug)]
pub struct Issued {
    pub token: String,
    pub expiration: OffsetDateTime,
}

/// What a bound token names besides its account.
#[derive(Clone, Debug)]
pub struct BoundSecret {
    pub name: String,
    pub uid: String,
}

/// An authenticated token: the user and the audiences both sides share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authenticated {
    pub user: UserInfo,
    pub audiences: Vec<String>,
}

/// Why a token is not a credential (the text TokenReview reports in `status.error`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Rejected(pub String);

/// Recently verified tokens by their SHA-256 (never the token itself), least recently used
/// evicted first, in a randomly keyed map (so lookup timing says nothing about a token).
pub(crate) struct HashCache<V> {
    entries: LruCache<[u8; 32], V, RandomState>,
}

/// At most [`CACHE_CAPACITY`] entries.
impl<V> Default for HashCache<V> {
    fn default() -> Self {
        Self::with_capacity(CACHE_CAPACITY)
    }
}

impl<V> HashCache<V> {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self {
            entries: LruCache::with_hasher(capacity, RandomState::new()),
        }
    }
}

impl<V: Clone> HashCache<V> {
    /// The entry for `hash` while `live` holds for it; a dead one is dropped.
    pub(crate) fn get(&mut self, hash: &[u8; 32], live: impl FnOnce(&V) -> bool) -> Option<V> {
        let value = self.entries.get(hash)?;
        if !live(value) {
            self.entries.pop(hash);
            return None;
        }
        Some(value.clone())
    }

    pub(crate) fn insert(&mut self, hash: [u8; 32], value: V) {
        self.entries.put(hash, value);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, hash: &[u8; 32]) -> bool {
        self.entries.contains(hash)
    }
}

/// Verified service-account claims, served until `exp` plus the allowed skew (as the
/// signature check judges it).
type VerifiedCache = HashCache<Arc<Claims>>;

fn unexpired(claims: &Claims, now: i64) -> bool {
    claims.exp.saturating_add(LEEWAY_SECONDS as i64) > now
}

/// The issuer and verifier of service-account tokens.
pub struct Tokens {
    issuer: String,
    audiences: Vec<String>,
    max_expiration: Option<Duration>,
    signing: EncodingKey,
    signing_kid: String,
    verifying: Vec<(String, DecodingKey)>,
    cache: Mutex<VerifiedCache>,
}

/// Kubernetes' key ID: base64url (no padding) of SHA-256 over the DER public key.
fn key_id(public_pem: &str) -> Result<String, String> {
    use base64::Engine;
    let der = pem_body(public_pem)?;
    let digest = ring::digest::digest(&ring::digest::SHA256, &der);
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest.as_ref()))
}

fn pem_body(pem: &str) -> Result<Vec<u8>, String> {
    use base64::Engine;
    let body: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::trim)
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| format!("not a PEM key: {e}"))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

impl Tokens {
    /// The issuer of this server: the signing key (the PKI's, or `--service-account-signing-
    /// key-file`) and every verification key (its own public key plus
    /// `--service-account-key-file`s).
    pub fn new(opts: &Options, pki_key: &str, pki_public: &str) -> Result<Self, String> {
        let (signing_pem, own_public) = match &opts.service_account_signing_key_file {
            Some(path) => {
                let key = read(path)?;
                let public = public_key_of(&key)?;
                (key, public)
            }
            None => (pki_key.to_string(), pki_public.to_string()),
        };
        let signing = EncodingKey::from_ec_pem(signing_pem.as_bytes())
            .map_err(|e| format!("the service-account signing key: {e}"))?;
        let signing_kid = key_id(&own_public)?;
        let mut verifying = vec![(
            signing_kid.clone(),
            DecodingKey::from_ec_pem(own_public.as_bytes())
                .map_err(|e| format!("the service-account public key: {e}"))?,
        )];
        for path in &opts.service_account_key_files {
            let pem = read(path)?;
            let key = DecodingKey::from_ec_pem(pem.as_bytes()).map_err(|e| {
                format!(
                    "{}: {e} (an ECDSA P-256 public key is needed)",
                    path.display()
                )
            })?;
            verifying.push((key_id(&pem)?, key));
        }
        Ok(Tokens {
            issuer: opts.service_account_issuer.clone(),
            audiences: opts.api_audiences(),
            max_expiration: (!opts.service_account_max_token_expiration.is_zero())
                .then_some(opts.service_account_max_token_expiration),
            signing_kid,
            signing,
            verifying,
            cache: Mutex::new(VerifiedCache::default()),
        })
    }

    /// This server's own audiences (what a token must name to be a credential here).
    pub fn api_audiences(&self) -> &[String] {
        &self.audiences
    }

    /// The validity a request for `requested` seconds is granted.
    pub fn granted_seconds(&self, requested: i64) -> i64 {
        match self.max_expiration {
            Some(max) => requested.min(i64::try_from(max.as_secs()).unwrap_or(i64::MAX)),
            None => requested,
        }
    }

    /// Signs a token for `sa` (which must carry its uid) valid for `seconds` to `audiences`.
    pub fn issue(
        &self,
        sa: &ServiceAccount,
        audiences: Vec<String>,
        seconds: i64,
        bound: Option<&BoundSecret>,
    ) -> Result<Issued, ApiError> {
        let now = OffsetDateTime::now_utc();
        let exp = now
            .checked_add(time::Duration::seconds(seconds))
            .ok_or_else(|| ApiError::bad_request("expirationSeconds is out of range"))?;
        let ns = &sa.metadata.namespace;
        let claims = Claims {
            iss: self.issuer.clone(),
            sub: format!("{USER_PREFIX}{ns}:{}", sa.metadata.name),
            aud: audiences,
            exp: exp.unix_timestamp(),
            iat: now.unix_timestamp(),
            nbf: now.unix_timestamp(),
            jti: uuid::Uuid::new_v4().to_string(),
            private: Private {
                namespace: ns.clone(),
                serviceaccount: Ref {
                    name: sa.metadata.name.clone(),
                    uid: sa.metadata.uid.clone(),
                },
                secret: bound.map(|b| Ref {
                    name: b.name.clone(),
                    uid: b.uid.clone(),
                }),
            },
        };
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.signing_kid.clone());
        let token = jsonwebtoken::encode(&header, &claims, &self.signing)
            .map_err(|e| ApiError::internal(format!("signing a token: {e}")))?;
        Ok(Issued {
            token,
            expiration: exp.replace_nanosecond(0).unwrap_or(exp),
        })
    }

    /// Checks signature, issuer and validity period, through the cache.
    fn verified_claims(&self, token: &str) -> Result<Arc<Claims>, Rejected> {
        let hash: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .map_err(|_| Rejected("hashing the token".into()))?;
        let now = OffsetDateTime::now_utc().unix_timestamp();
        if let Some(c) = self.cache.lock().get(&hash, |c| unexpired(c, now)) {
            return Ok(c);
        }
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| Rejected(format!("invalid bearer token: {e}")))?;
        if header.alg != Algorithm::ES256 {
            return Err(Rejected(format!(
                "invalid bearer token: unexpected signing algorithm {:?}",
                header.alg
            )));
        }
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_issuer(&[&self.issuer]);
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_nbf = true;
        // Audiences are checked by the caller against what it needs.
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp", "iss", "sub", "nbf"]);
        let candidates = self
            .verifying
            .iter()
            .filter(|(kid, _)| header.kid.as_deref().is_none_or(|k| k == kid));
        let mut last = Rejected("invalid bearer token: no key verifies it".into());
        for (_, key) in candidates {
            match jsonwebtoken::decode::<Claims>(token, key, &validation) {
                Ok(data) => {
                    let claims = Arc::new(data.claims);
                    self.cache.lock().insert(hash, claims.clone());
                    return Ok(claims);
                }
                Err(e) => last = Rejected(format!("invalid bearer token: {e}")),
            }
        }
        Err(last)
    }

    /// Authenticates `token` for `audiences` (this server's when empty): the signature and
    /// validity (cached), the audiences both sides share (at least one), and the account and
    /// bound Secret as they are now (from the watch caches, else the store).
    pub async fn authenticate(
        &self,
        token: &str,
        audiences: &[String],
        caches: &Caches,
        store: &dyn Store,
    ) -> Result<Authenticated, Rejected> {
        let claims = self.verified_claims(token)?;
        let wanted = if audiences.is_empty() {
            &self.audiences[..]
        } else {
            audiences
        };
        let shared: Vec<String> = wanted
            .iter()
            .filter(|a| claims.aud.contains(a))
            .cloned()
            .collect();
        if shared.is_empty() {
            return Err(Rejected(format!(
                "token audiences {:?} are invalid for the target audiences {:?}",
                claims.aud, wanted
            )));
        }
        let p = &claims.private;
        let sa_uid =
            current_uid::<ServiceAccount>(caches, store, &p.namespace, &p.serviceaccount.name)
                .await?
                .ok_or_else(|| {
                    Rejected(format!(
                        "service account {}/{} has been deleted",
                        p.namespace, p.serviceaccount.name
                    ))
                })?;
        if sa_uid != p.serviceaccount.uid {
            return Err(Rejected(format!(
                "service account UID ({}) does not match claim ({})",
                sa_uid, p.serviceaccount.uid
            )));
        }
        if let Some(secret) = &p.secret {
            let uid = current_uid::<Secret>(caches, store, &p.namespace, &secret.name)
                .await?
                .ok_or_else(|| {
                    Rejected(format!(
                        "secret {}/{} bound to this token has been deleted",
                        p.namespace, secret.name
                    ))
                })?;
            if uid != secret.uid {
                return Err(Rejected(format!(
                    "secret {}/{} bound to this token was recreated",
                    p.namespace, secret.name
                )));
            }
        }
        let mut extra = std::collections::BTreeMap::new();
        extra.insert(
            CREDENTIAL_ID_EXTRA.to_string(),
            vec![format!("JTI={}", claims.jti)],
        );
        Ok(Authenticated {
            user: UserInfo {
                username: format!("{USER_PREFIX}{}:{}", p.namespace, p.serviceaccount.name),
                uid: sa_uid,
                groups: vec![
                    GROUP_SERVICE_ACCOUNTS.into(),
                    format!("{GROUP_SERVICE_ACCOUNTS}:{}", p.namespace),
                    GROUP_AUTHENTICATED.into(),
                ],
                extra,
            },
            audiences: shared,
        })
    }
}

/// The uid of the object `namespace/name` of kind `T` as it is now: from its watch cache, or
/// from the store when the cache does not have it (it may not have caught up with a create).
async fn current_uid<T: Resource>(
    caches: &Caches,
    store: &dyn Store,
    namespace: &str,
    name: &str,
) -> Result<Option<String>, Rejected> {
    #[derive(Deserialize)]
    struct Meta {
        #[serde(default)]
        uid: String,
    }
    #[derive(Deserialize)]
    struct Obj {
        metadata: Meta,
    }
    let key = T::INFO.key(namespace, name);
    let uid_of = |json: &[u8]| -> Result<String, Rejected> {
        serde_json::from_slice::<Obj>(json)
            .map(|o| o.metadata.uid)
            .map_err(|e| Rejected(format!("reading {}: {e}", T::INFO.kind)))
    };
    if let Ok((Some(obj), _)) = caches.get(T::INFO).get(&key) {
        return uid_of(&obj.json).map(Some);
    }
    match store.get(Bytes::from(key), None).await {
        Ok((Some(kv), _)) => uid_of(&kv.value).map(Some),
        Ok((None, _)) => Ok(None),
        Err(e) => Err(Rejected(format!("looking up the {}: {e}", T::INFO.kind))),
    }
}

/// The PEM public key of a PEM ECDSA P-256 private key (PKCS#8 or SEC1).
fn public_key_of(private_pem: &str) -> Result<String, String> {
    let key = rcgen::KeyPair::from_pem(private_pem)
        .map_err(|e| format!("the service-account signing key: {e}"))?;
    Ok(key.public_key_pem())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let dir = std::env::temp_dir();
        let opts = Options::for_tests(dir);
        Tokens::new(&opts, &key.serialize_pem(), &key.public_key_pem()).unwrap()
    }

    fn sa() -> ServiceAccount {
        let mut sa = ServiceAccount::default();
        sa.metadata.name = "builder".into();
        sa.metadata.namespace = "demo".into();
        sa.metadata.uid = "u-1".into();
        sa
    }

    #[test]
    fn issued_tokens_carry_kubernetes_claims_and_verify() {
        let t = tokens();
        let issued = t
            .issue(&sa(), vec!["a".into(), "b".into()], 3600, None)
            .unwrap();
        let claims = t.verified_claims(&issued.token).unwrap();
        assert_eq!(claims.sub, "system:serviceaccount:demo:builder");
        assert_eq!(claims.aud, ["a", "b"]);
        assert_eq!(claims.exp - claims.iat, 3600);
        assert_eq!(claims.private.serviceaccount.uid, "u-1");
        let header = jsonwebtoken::decode_header(&issued.token).unwrap();
        assert_eq!(header.alg, Algorithm::ES256);
        assert_eq!(header.kid.as_deref(), Some(t.signing_kid.as_str()));
    }

    #[test]
    fn expired_tampered_foreign_and_garbage_tokens_are_refused() {
        let t = tokens();
        let mut claims = Claims {
            iss: t.issuer.clone(),
            sub: "system:serviceaccount:demo:builder".into(),
            aud: vec!["a".into()],
            exp: OffsetDateTime::now_utc().unix_timestamp() - 3600,
            iat: 0,
            nbf: 0,
            jti: "j".into(),
            private: Private {
                namespace: "demo".into(),
                serviceaccount: Ref {
                    name: "builder".into(),
                    uid: "u".into(),
                },
                secret: None,
            },
        };
        let sign = |c: &Claims| {
            jsonwebtoken::encode(&Header::new(Algorithm::ES256), c, &t.signing).unwrap()
        };
        assert!(
            t.verified_claims(&sign(&claims))
                .unwrap_err()
                .0
                .contains("Expired")
        );
        claims.exp += 7200;
        let good = sign(&claims);
        assert!(t.verified_claims(&good).is_ok());
        let mut tampered = good.clone();
        tampered.replace_range(tampered.len() - 4.., "AAAA");
        assert!(t.verified_claims(&tampered).is_err());
        claims.iss = "https://elsewhere".into();
        assert!(t.verified_claims(&sign(&claims)).is_err());
        assert!(t.verified_claims("not.a.token").is_err());
        assert!(t.verified_claims("").is_err());
        // Another issuer's key: the signature does not verify.
        let other = tokens();
        let foreign = other.issue(&sa(), vec!["a".into()], 3600, None).unwrap();
        assert!(t.verified_claims(&foreign.token).is_err());
    }

    #[test]
    fn the_cache_is_bounded_and_never_serves_an_expired_token() {
        let mut c = VerifiedCache::default();
        let claims = |exp| {
            Arc::new(Claims {
                iss: String::new(),
                sub: String::new(),
                aud: vec![],
                exp,
                iat: 0,
                nbf: 0,
                jti: String::new(),
                private: Private {
                    namespace: String::new(),
                    serviceaccount: Ref {
                        name: String::new(),
                        uid: String::new(),
                    },
                    secret: None,
                },
            })
        };
        for i in 0..(CACHE_CAPACITY + 10) {
            let mut h = [0u8; 32];
            h[..8].copy_from_slice(&(i as u64).to_le_bytes());
            c.insert(h, claims(1_000));
        }
        assert_eq!(c.len(), CACHE_CAPACITY);
        let mut h = [0u8; 32];
        h[..8].copy_from_slice(&((CACHE_CAPACITY + 9) as u64).to_le_bytes());
        assert!(c.get(&h, |c| unexpired(c, 0)).is_some());
        // Expired once past `exp` plus the allowed skew, as the signature check judges it.
        assert!(
            c.get(&h, |c| unexpired(c, 1_000 + LEEWAY_SECONDS as i64 - 1))
                .is_some()
        );
        assert!(
            c.get(&h, |c| unexpired(c, 1_000 + LEEWAY_SECONDS as i64))
                .is_none(),
            "expired entries are not served"
        );
        assert!(!c.contains(&h), "and are dropped");
    }

    /// A token dropped when it expired and cached again must stay cached: the old queue-based
    /// cache kept a stale place for it in its eviction order, which later evicted the live
    /// entry while newer ones stayed.
    #[test]
    fn a_token_cached_again_after_expiring_is_not_evicted_by_its_old_place() {
        let mut c: HashCache<i64> = HashCache::with_capacity(3);
        let key = |i: u8| [i; 32];
        c.insert(key(1), 1);
        assert!(c.get(&key(1), |_| false).is_none(), "expired: dropped");
        c.insert(key(1), 2);
        c.insert(key(2), 2);
        c.insert(key(3), 2);
        // Full: the next entry evicts the least recently used one, key 1 (cached again first),
        // and only it.
        assert_eq!(c.get(&key(1), |_| true), Some(2));
        c.insert(key(4), 2);
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&key(1), |_| true), Some(2), "used last: kept");
        assert!(
            c.get(&key(2), |_| true).is_none(),
            "least recently used: evicted"
        );
        for k in [3, 4] {
            assert_eq!(c.get(&key(k), |_| true), Some(2), "key {k}");
        }
    }

    #[test]
    fn max_expiration_caps_the_grant() {
        let mut t = tokens();
        assert_eq!(t.granted_seconds(7200), 7200);
        t.max_expiration = Some(Duration::from_secs(3600));
        assert_eq!(t.granted_seconds(7200), 3600);
        assert_eq!(t.granted_seconds(600), 600);
    }
}
