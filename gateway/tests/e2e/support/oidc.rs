//! Test support: an OIDC issuer on 127.0.0.1 over TLS (its own CA, discovery document and
//! JWKS), whose signing keys the test rotates, and tokens signed with them.

use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use parking_lot::Mutex;
use rcgen::{
    BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, PKCS_ECDSA_P256_SHA256,
    PKCS_ECDSA_P384_SHA384, SanType,
};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A signing key the issuer publishes (or has stopped publishing).
#[derive(Clone)]
pub struct SigningKey {
    pub kid: String,
    alg: Algorithm,
    encoding: Arc<EncodingKey>,
    jwk: Value,
}

impl SigningKey {
    /// A new ES256 (or ES384) key named `kid`.
    pub fn generate(kid: &str, alg: Algorithm) -> Self {
        let (curve_alg, crv, coord) = match alg {
            Algorithm::ES384 => (&PKCS_ECDSA_P384_SHA384, "P-384", 48),
            _ => (&PKCS_ECDSA_P256_SHA256, "P-256", 32),
        };
        let key = KeyPair::generate_for(curve_alg).unwrap();
        let raw = key.public_key_raw();
        assert_eq!(raw.len(), 1 + 2 * coord, "an uncompressed point");
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let jwk = json!({
            "kty": "EC", "crv": crv, "use": "sig", "kid": kid,
            "x": b64(&raw[1..1 + coord]), "y": b64(&raw[1 + coord..]),
        });
        SigningKey {
            kid: kid.to_string(),
            alg,
            encoding: Arc::new(EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).unwrap()),
            jwk,
        }
    }

    /// Signs `claims` with this key (its `kid` in the header).
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }
}

pub struct TestIssuer {
    pub url: String,
    /// PEM of the CA that signed the issuer's serving certificate.
    pub ca_pem: String,
    keys: Arc<Mutex<Vec<SigningKey>>>,
    /// How many times the key set was served.
    pub jwks_fetches: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestIssuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestIssuer {
    /// Serves discovery and the key set of `keys` until dropped.
    pub async fn start(keys: Vec<SigningKey>) -> Self {
        let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        leaf.subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf_cert.der().clone()],
                rustls_pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap(),
            )
            .unwrap();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let url = format!("https://127.0.0.1:{}", addr.port());
        let keys = Arc::new(Mutex::new(keys));
        let fetches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (served_keys, served_url, served_fetches) =
            (keys.clone(), url.clone(), fetches.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let (keys, url, fetches) = (
                    served_keys.clone(),
                    served_url.clone(),
                    served_fetches.clone(),
                );
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let body = match req.uri().path() {
                            "/.well-known/openid-configuration" => {
                                json!({"issuer": url, "jwks_uri": format!("{url}/keys")})
                            }
                            "/keys" => {
                                fetches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let keys: Vec<Value> =
                                    keys.lock().iter().map(|k| k.jwk.clone()).collect();
                                json!({ "keys": keys })
                            }
                            _ => Value::Null,
                        };
                        let status = if body.is_null() { 404 } else { 200 };
                        let resp = http::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(body.to_string())))
                            .unwrap();
                        std::future::ready(Ok::<_, std::convert::Infallible>(resp))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        TestIssuer {
            url,
            ca_pem: ca_cert.pem(),
            keys,
            jwks_fetches: fetches,
            task,
        }
    }

    /// Publishes exactly `keys` from now on.
    pub fn publish(&self, keys: Vec<SigningKey>) {
        *self.keys.lock() = keys;
    }

    /// Claims valid for an hour from now for `aud`, plus `extra`.
    pub fn claims(&self, aud: &str, extra: Value) -> Value {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let mut c = json!({"iss": self.url, "aud": [aud], "iat": now, "nbf": now, "exp": now + 3600,
                           "jti": uuid::Uuid::new_v4().to_string()});
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            c[k] = v;
        }
        c
    }

    /// The `certificateAuthority` block of a YAML issuer, indented by `indent` spaces.
    pub fn ca_yaml(&self, indent: usize) -> String {
        let pad = " ".repeat(indent);
        let mut out = format!("{pad}certificateAuthority: |\n");
        for l in self.ca_pem.lines() {
            out.push_str(&format!("{pad}  {l}\n"));
        }
        out
    }
}
