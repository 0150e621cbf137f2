//! OIDC discovery and signing keys of one issuer: `{url}/.well-known/openid-configuration`
//! (or `discoveryURL`, used as given) names the issuer, which must equal `url`, and its
//! `jwks_uri`, whose keys verify tokens. Connections are verified with the issuer's
//! `certificateAuthority`, else the operating system's roots, and never go through egress
//! selection. Keys are fetched in the background (retried with backoff until the first success,
//! then refreshed periodically) and on a token whose key id is unknown (at most once per
//! [`MIN_ON_DEMAND_INTERVAL`]); until the first fetch the issuer's tokens are refused, and no
//! other issuer waits for it. Responses are bounded in size and time.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};
use rustls::ClientConfig;
use rustls_pki_types::{CertificateDer, ServerName};
use serde::Deserialize;
use svc_config::authentication::{Issuer, ca_certificates};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Largest discovery document or key set read.
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// One whole request (connect, TLS, response) to the issuer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Keys are fetched again this long after a success.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(300);
/// Tokens with an unknown key id fetch the keys at most this often.
pub const MIN_ON_DEMAND_INTERVAL: Duration = Duration::from_secs(2);
const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// A verification key and the algorithms it may verify.
pub struct Key {
    pub key: DecodingKey,
    pub algorithms: Vec<Algorithm>,
}

/// The issuer's keys, by key id (keys without one are tried for tokens without one).
#[derive(Default)]
pub struct KeySet {
    pub by_kid: HashMap<String, Arc<Key>>,
    pub without_kid: Vec<Arc<Key>>,
}

impl KeySet {
    /// The keys that may verify a token with header `kid`: the one with that id, or every key
    /// when the token names none.
    pub fn candidates(&self, kid: Option<&str>) -> Vec<Arc<Key>> {
        match kid {
            Some(kid) => self.by_kid.get(kid).cloned().into_iter().collect(),
            None => self
                .by_kid
                .values()
                .chain(self.without_kid.iter())
                .cloned()
                .collect(),
        }
    }

    fn from_jwks(set: JwkSet) -> Result<Self, String> {
        let mut keys = KeySet::default();
        for jwk in set.keys {
            // Keys for encryption, or of kinds we cannot verify with, are skipped as go-jose does.
            if matches!(
                jwk.common.public_key_use,
                Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
            ) {
                continue;
            }
            let Some(key) = key_of(&jwk) else { continue };
            let key = Arc::new(key);
            match &jwk.common.key_id {
                Some(kid) => {
                    keys.by_kid.insert(kid.clone(), key);
                }
                None => keys.without_kid.push(key),
            }
        }
        if keys.by_kid.is_empty() && keys.without_kid.is_empty() {
            return Err("the issuer's key set has no usable signing key".into());
        }
        Ok(keys)
    }
}

fn key_of(jwk: &Jwk) -> Option<Key> {
    use jsonwebtoken::jwk::{EllipticCurve, KeyAlgorithm as K};
    let family: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(_) => vec![Algorithm::EdDSA],
        // Runtime secrets are never an issuer's public key.
        AlgorithmParameters::OctetKey(_) => return None,
    };
    let algorithms = match jwk.common.key_algorithm {
        None => family,
        Some(named) => {
            let a = match named {
                K::RS256 => Algorithm::RS256,
                K::RS384 => Algorithm::RS384,
                K::RS512 => Algorithm::RS512,
                K::PS256 => Algorithm::PS256,
                K::PS384 => Algorithm::PS384,
                K::PS512 => Algorithm::PS512,
                K::ES256 => Algorithm::ES256,
                K::ES384 => Algorithm::ES384,
                K::EdDSA => Algorithm::EdDSA,
                _ => return None,
            };
            if !family.contains(&a) {
                return None;
            }
            vec![a]
        }
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key { key, algorithms })
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

/// The identity of a key source: issuers configured alike share one across reloads.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourceId {
    url: String,
    discovery_url: String,
    certificate_authority: String,
}

impl SourceId {
    pub fn of(issuer: &Issuer) -> Self {
        SourceId {
            url: issuer.url.clone(),
            discovery_url: issuer.discovery_url.clone(),
            certificate_authority: issuer.certificate_authority.clone(),
        }
    }
}

/// One issuer's discovery and keys.
pub struct KeySource {
    url: String,
    discovery_url: String,
    tls: Arc<ClientConfig>,
    keys: parking_lot::RwLock<Option<Arc<KeySet>>>,
    /// When keys were last fetched (held while fetching, so concurrent refreshes coalesce).
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
}

impl KeySource {
    /// A source for `issuer` (not yet fetching: see [`KeySource::start`]).
    pub fn new(issuer: &Issuer) -> Result<Self, String> {
        let discovery_url = if issuer.discovery_url.is_empty() {
            format!(
                "{}/.well-known/openid-configuration",
                issuer.url.trim_end_matches('/')
            )
        } else {
            issuer.discovery_url.clone()
        };
        Ok(KeySource {
            url: issuer.url.clone(),
            discovery_url,
            tls: client_config(&issuer.certificate_authority)?,
            keys: parking_lot::RwLock::new(None),
            last_fetch: tokio::sync::Mutex::new(None),
        })
    }

    /// Fetches keys in the background until the source is dropped: retried with backoff
    /// until they arrive, then every [`REFRESH_INTERVAL`].
    pub fn start(self: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut retry = FIRST_RETRY;
            loop {
                let Some(source) = weak.upgrade() else { return };
                let wait = match source.refresh(Duration::ZERO).await {
                    Ok(()) => {
                        retry = FIRST_RETRY;
                        REFRESH_INTERVAL
                    }
                    Err(e) => {
                        tracing::warn!(issuer = %source.url, error = %e, "fetching the issuer's keys");
                        let w = retry;
                        retry = retry.saturating_mul(2).min(MAX_RETRY);
                        w
                    }
                };
                drop(source);
                tokio::time::sleep(wait).await;
            }
        });
    }

    /// The keys, once fetched.
    pub fn keys(&self) -> Option<Arc<KeySet>> {
        self.keys.read().clone()
    }

    /// Fetches the keys again for a token naming a key id we do not know, unless they were
    /// fetched less than [`MIN_ON_DEMAND_INTERVAL`] ago; returns the keys then in force.
    pub async fn refresh_for_unknown_kid(&self) -> Option<Arc<KeySet>> {
        if let Err(e) = self.refresh(MIN_ON_DEMAND_INTERVAL).await {
            tracing::warn!(issuer = %self.url, error = %e, "fetching the issuer's keys");
        }
        self.keys()
    }

    async fn refresh(&self, min_age: Duration) -> Result<(), String> {
        let mut last = self.last_fetch.lock().await;
        if last.is_some_and(|t| t.elapsed() < min_age) {
            return Ok(());
        }
        *last = Some(Instant::now());
        let set = self.fetch().await?;
        *self.keys.write() = Some(Arc::new(set));
        Ok(())
    }

    async fn fetch(&self) -> Result<KeySet, String> {
        let body = get(&self.discovery_url, &self.tls).await?;
        let d: Discovery = serde_json::from_slice(&body)
            .map_err(|e| format!("oidc: failed to decode provider discovery object: {e}"))?;
        if d.issuer != self.url {
            return Err(format!(
                "oidc: issuer did not match the issuer returned by provider, expected {:?} got {:?}",
                self.url, d.issuer
            ));
        }
        let body = get(&d.jwks_uri, &self.tls).await?;
        let set: JwkSet = serde_json::from_slice(&body)
            .map_err(|e| format!("oidc: failed to decode keys: {e}"))?;
        KeySet::from_jwks(set)
    }
}

/// TLS to the issuer: its `certificateAuthority` when given, else the system's roots.
fn client_config(ca_pem: &str) -> Result<Arc<ClientConfig>, String> {
    let roots = if ca_pem.is_empty() {
        // The system's store, read once for every client of the gateway. Without one the
        // issuer's fetches fail (and say why) instead of the configuration.
        crate::outbound::egress::system_roots().unwrap_or_else(|e| {
            tracing::debug!(error = %e, "reading the system's trusted certificates");
            rustls::RootCertStore::empty()
        })
    } else {
        let mut roots = rustls::RootCertStore::empty();
        for der in ca_certificates(ca_pem.as_bytes())? {
            roots
                .add(CertificateDer::from(der))
                .map_err(|e| format!("certificateAuthority: {e}"))?;
        }
        roots
    };
    let mut config = ClientConfig::builder_with_provider(crate::outbound::egress::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// GETs an `https` URL over HTTP/1.1: 200 only (no redirects), at most
/// [`MAX_RESPONSE_BYTES`], within [`REQUEST_TIMEOUT`].
pub async fn get(url: &str, tls: &Arc<ClientConfig>) -> Result<Bytes, String> {
    tokio::time::timeout(REQUEST_TIMEOUT, get_unbounded_in_time(url, tls))
        .await
        .map_err(|_| format!("GET {url}: timed out after {REQUEST_TIMEOUT:?}"))?
}

async fn get_unbounded_in_time(url: &str, tls: &Arc<ClientConfig>) -> Result<Bytes, String> {
    let fail = |e: &dyn std::fmt::Display| format!("GET {url}: {e}");
    let uri: http::Uri = url.parse().map_err(|e| fail(&e))?;
    if uri.scheme_str() != Some("https") {
        return Err(fail(&"only https is used"));
    }
    let host = uri.host().ok_or_else(|| fail(&"no host"))?;
    let port = uri.port_u16().unwrap_or(443);
    let name = host.trim_start_matches('[').trim_end_matches(']');
    let server_name = ServerName::try_from(name.to_string()).map_err(|e| fail(&e))?;
    let tcp = TcpStream::connect((name, port))
        .await
        .map_err(|e| fail(&e))?;
    let stream = TlsConnector::from(tls.clone())
        .connect(server_name, tcp)
        .await
        .map_err(|e| fail(&e))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| fail(&e))?;
    let driver = tokio::spawn(conn);
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or(host);
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let req = http::Request::get(path)
        .header(http::header::HOST, authority)
        .header(http::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(&e))?;
    let resp = send.send_request(req).await.map_err(|e| fail(&e))?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| fail(&e))?
        .to_bytes();
    driver.abort();
    if status != http::StatusCode::OK {
        return Err(fail(&format!(
            "{status}: {}",
            String::from_utf8_lossy(body.get(..200).unwrap_or(&body))
        )));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(keys: serde_json::Value) -> Result<KeySet, String> {
        KeySet::from_jwks(serde_json::from_value(serde_json::json!({ "keys": keys })).unwrap())
    }

    #[test]
    fn key_sets_keep_signing_keys_by_id_and_skip_the_rest() {
        let ec = |kid: &str| {
            serde_json::json!({"kty": "EC", "crv": "P-256", "kid": kid,
                "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
                "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"})
        };
        let mut enc = ec("enc");
        enc["use"] = "enc".into();
        let mut wrong_alg = ec("wrong");
        wrong_alg["alg"] = "RS256".into();
        let mut es256 = ec("named");
        es256["alg"] = "ES256".into();
        let rsa = serde_json::json!({"kty": "RSA", "kid": "r", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw", "e": "AQAB"});
        let oct = serde_json::json!({"kty": "oct", "kid": "secret", "k": "c2VjcmV0"});
        let keys = set(serde_json::json!([
            ec("a"),
            enc,
            wrong_alg,
            es256,
            rsa,
            oct
        ]))
        .unwrap();
        let mut kids: Vec<&str> = keys.by_kid.keys().map(String::as_str).collect();
        kids.sort();
        assert_eq!(kids, ["a", "named", "r"]);
        assert_eq!(keys.by_kid["named"].algorithms, [Algorithm::ES256]);
        assert_eq!(keys.by_kid["r"].algorithms.len(), 6);
        assert_eq!(keys.candidates(Some("a")).len(), 1);
        assert!(keys.candidates(Some("secret")).is_empty());
        assert_eq!(keys.candidates(None).len(), 3);
        assert!(set(serde_json::json!([oct_only()])).is_err());
    }

    fn oct_only() -> serde_json::Value {
        serde_json::json!({"kty": "oct", "k": "c2VjcmV0"})
    }

    #[tokio::test]
    async fn an_unreachable_or_plain_http_issuer_is_an_error_not_a_hang() {
        let tls = client_config("").unwrap();
        let e = get("http://127.0.0.1:1/x", &tls).await.unwrap_err();
        assert!(e.contains("only https"), "{e}");
        let e = get("https://127.0.0.1:1/x", &tls).await.unwrap_err();
        assert!(e.starts_with("GET https://127.0.0.1:1/x: "), "{e}");
    }
}
