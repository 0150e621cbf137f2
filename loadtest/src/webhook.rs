//! `svc-loadtest webhook-server`: a no-op HTTPS webhook for measuring what calling webhooks
//! costs a server (so that the webhook itself is not the bottleneck). It answers an
//! `AdmissionReview` with `allowed: true` and the request's `uid`, and a `SubjectAccessReview`
//! with `status.allowed: true`, in the request's `apiVersion`; anything else is 400. HTTP/1.1
//! and h2 (ALPN) over rustls with the given certificate chain and key. `GET /stats` answers
//! how many reviews of each kind were answered (to check that a cache spares the calls).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Largest request body read (a review carries one object; Kubernetes caps requests at 3 MiB).
const MAX_BODY: usize = 4 << 20;

/// Reviews answered, by kind.
#[derive(Default)]
struct Counts {
    admission: AtomicU64,
    subject_access: AtomicU64,
}

/// Serves until killed (or, with `exit_with_stdin`, until standard input closes). The first
/// line printed names the bound address.
pub async fn serve_main(
    listen: SocketAddr,
    cert: &Path,
    key: &Path,
    exit_with_stdin: bool,
) -> Result<()> {
    let tls = TlsAcceptor::from(Arc::new(server_config(cert, key)?));
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    println!("listening on {}", listener.local_addr()?);
    if exit_with_stdin {
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            std::process::exit(0);
        });
    }
    let counts = Arc::new(Counts::default());
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            continue;
        };
        let _ = sock.set_nodelay(true);
        let (tls, counts) = (tls.clone(), counts.clone());
        tokio::spawn(async move {
            let Ok(stream) = tls.accept(sock).await else {
                return;
            };
            let svc = hyper::service::service_fn(move |req| {
                let counts = counts.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(req, &counts).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", cert.display()))?;
    if chain.is_empty() {
        return Err(anyhow!("{}: no certificate", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the private key {}", key.display()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .context("certificate and key")?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

async fn answer(req: Request<Incoming>, counts: &Counts) -> Response<Full<Bytes>> {
    if req.method() == Method::GET && req.uri().path() == "/stats" {
        let v = json!({
            "admissionReviews": counts.admission.load(Relaxed),
            "subjectAccessReviews": counts.subject_access.load(Relaxed),
        });
        return reply(StatusCode::OK, &v);
    }
    if req.method() != Method::POST {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({"error": "POST a review"}),
        );
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return reply(StatusCode::BAD_REQUEST, &json!({"error": e.to_string()})),
    };
    match review(&body) {
        Ok((v, kind)) => {
            match kind {
                Kind::Admission => counts.admission.fetch_add(1, Relaxed),
                Kind::SubjectAccess => counts.subject_access.fetch_add(1, Relaxed),
            };
            reply(StatusCode::OK, &v)
        }
        Err(e) => reply(StatusCode::BAD_REQUEST, &json!({"error": e})),
    }
}

enum Kind {
    Admission,
    SubjectAccess,
}

/// The answer to one review: allowed, whatever it asks.
fn review(body: &[u8]) -> Result<(Value, Kind), String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let api_version = v["apiVersion"].as_str().unwrap_or_default();
    match v["kind"].as_str() {
        Some("AdmissionReview") => {
            let uid = v["request"]["uid"]
                .as_str()
                .ok_or("AdmissionReview without request.uid")?;
            Ok((
                json!({
                    "apiVersion": api_version,
                    "kind": "AdmissionReview",
                    "response": {"uid": uid, "allowed": true},
                }),
                Kind::Admission,
            ))
        }
        Some("SubjectAccessReview") => Ok((
            json!({
                "apiVersion": api_version,
                "kind": "SubjectAccessReview",
                "status": {"allowed": true},
            }),
            Kind::SubjectAccess,
        )),
        other => Err(format!(
            "kind {other:?}: AdmissionReview or SubjectAccessReview expected"
        )),
    }
}

fn reply(status: StatusCode, v: &Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admission_review_is_allowed_with_its_uid() {
        let (v, _) = review(
            br#"{"apiVersion":"admission.svc.io/v1","kind":"AdmissionReview","request":{"uid":"u-1"}}"#,
        )
        .unwrap();
        assert_eq!(v["response"]["uid"], "u-1");
        assert_eq!(v["response"]["allowed"], true);
        assert_eq!(v["apiVersion"], "admission.svc.io/v1");
    }

    #[test]
    fn a_subject_access_review_is_allowed() {
        let (v, _) = review(
            br#"{"apiVersion":"authorization.svc.io/v1","kind":"SubjectAccessReview","spec":{}}"#,
        )
        .unwrap();
        assert_eq!(v["status"]["allowed"], true);
        assert_eq!(v["kind"], "SubjectAccessReview");
    }

    #[test]
    fn anything_else_is_refused() {
        assert!(review(b"not json").is_err());
        assert!(review(br#"{"kind":"AdmissionReview","request":{}}"#).is_err());
        assert!(review(br#"{"kind":"Pod"}"#).is_err());
    }
}
