//! `POST serviceaccounts/<name>/token` (a TokenRequest answered with a signed token) and
//! `POST tokenreviews` (is this token a credential, and whose: service-account tokens and the
//! JWT authenticators of `--authentication-config`). Both kinds belong to
//! `authentication.svc.io/v1`; Kubernetes' clients send them as `authentication.k8s.io/v1`,
//! so either name is accepted and the answer uses the one the client sent.

use std::sync::Arc;

use http::{Response, StatusCode};
use serde_json::Value;
use svc_core::codec;
use svc_core::kinds::auth::{DEFAULT_EXPIRATION_SECONDS, is_authentication_v1};
use svc_core::kinds::{Secret, ServiceAccount, TokenRequest, TokenRequestStatus, TokenReview};
use svc_core::meta::Time;
use svc_core::{ApiError, ObjectMeta, Resource};

use super::body::{self, Versions};
use super::call::{RestRequest, path_namespace, response_warnings};
use crate::http::api::Standalone;
use crate::http::negotiate::Format;
use crate::http::respond::{self, Body};
use crate::registry::admission::{Operation, Outcome};
use crate::registry::write::read_current;
use crate::security::jwt::Verdict;
use crate::security::tokens::BoundSecret;
use svc_core::registry::Kind;

/// A request body of `T`, with the `apiVersion` it named (either of the group's names).
fn decode<T: Kind>(
    app: &Standalone,
    call: &RestRequest,
) -> Result<(T, String, Vec<String>), ApiError> {
    let decoded = body::decode_object::<T>(app, call, Versions::Accepted(is_authentication_v1))?;
    Ok((decoded.object, decoded.api_version, decoded.warnings))
}

/// `obj` as a 201 in the negotiated format, under the `apiVersion` the client used.
fn created<T: Kind>(call: &RestRequest, obj: &T, api_version: &str) -> Response<Body> {
    match call.format {
        Format::Protobuf(ct) => respond::bytes_response(
            StatusCode::CREATED,
            ct,
            codec::encode_envelope(api_version, T::INFO.kind, &obj.to_proto_bytes()),
        ),
        format => {
            let mut value = match serde_json::to_value(obj) {
                Ok(v) => v,
                Err(e) => return respond::error(&ApiError::internal(e)),
            };
            if let Some(fields) = value.as_object_mut() {
                fields.insert("apiVersion".into(), Value::String(api_version.to_string()));
            }
            match format {
                Format::Json | Format::Table => {
                    respond::json(StatusCode::CREATED, &value, call.query.pretty())
                }
                Format::Yaml => match codec::yaml::encode(&value) {
                    Ok(b) => respond::bytes_response(StatusCode::CREATED, "application/yaml", b),
                    Err(e) => respond::error(&e),
                },
                _ => match codec::cbor::encode(&value) {
                    Ok(b) => respond::bytes_response(StatusCode::CREATED, "application/cbor", b),
                    Err(e) => respond::error(&e),
                },
            }
        }
    }
}

fn invalid<T: Resource>(obj: &T, errs: svc_core::validation::ErrorList) -> ApiError {
    ApiError::Invalid {
        kind: T::INFO.kind.into(),
        group: T::INFO.group.into(),
        name: obj.meta().name.clone(),
        causes: errs.0,
    }
}

/// `POST serviceaccounts/<name>/token`.
pub(super) async fn create_token(
    app: &Arc<Standalone>,
    call: &RestRequest,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let (mut req, api_version, warnings) = decode::<TokenRequest>(app, call)?;
    let dry_run = call.dry_run()?;
    let ns = path_namespace::<ServiceAccount>(&call.route)?.to_string();
    // Admission sees a create of `serviceaccounts/token` whose object is the TokenRequest.
    let mut outcome = Outcome::default();
    let write = call.write_request(dry_run);
    let attrs = write.attributes::<ServiceAccount>(Operation::Create, &ns, name);
    app.registry
        .admission
        .mutate(&attrs, &mut req, None, &mut outcome)
        .await?;
    let errs = req.validate();
    if !errs.is_empty() {
        return Err(invalid(&req, errs));
    }
    app.registry
        .admission
        .validate(&attrs, Some(&req), None, &mut outcome)
        .await?;
    let sa_key = bytes::Bytes::from(ServiceAccount::INFO.key(&ns, name));
    let (sa, _) = read_current::<ServiceAccount>(&app.registry, &sa_key, name).await?;
    let audiences = if req.spec.audiences.is_empty() {
        app.security.tokens.api_audiences().to_vec()
    } else {
        req.spec.audiences.clone()
    };
    let seconds = app.security.tokens.granted_seconds(
        req.spec
            .expiration_seconds
            .unwrap_or(DEFAULT_EXPIRATION_SECONDS),
    );
    let mut bound = None;
    if let Some(b) = &mut req.spec.bound_object_ref {
        let key = bytes::Bytes::from(Secret::INFO.key(&ns, &b.name));
        let (secret, _) = read_current::<Secret>(&app.registry, &key, &b.name).await?;
        if !b.uid.is_empty() && b.uid != secret.metadata.uid {
            return Err(ApiError::Conflict {
                subject: svc_core::status::Subject::new("", "secrets", &b.name),
                message: format!(
                    "the UID in the bound object reference ({}) does not match the UID in \
                     record. The object might have been deleted and then recreated",
                    b.uid
                ),
            });
        }
        b.uid = secret.metadata.uid.clone();
        b.api_version = "v1".into();
        bound = Some(BoundSecret {
            name: b.name.clone(),
            uid: secret.metadata.uid.clone(),
        });
    }
    let issued = app
        .security
        .tokens
        .issue(&sa, audiences.clone(), seconds, bound.as_ref())?;
    req.metadata = ObjectMeta {
        name: sa.metadata.name.clone(),
        namespace: ns,
        creation_timestamp: Some(Time::now()),
        ..Default::default()
    };
    req.spec.audiences = audiences;
    req.spec.expiration_seconds = Some(seconds);
    req.status = TokenRequestStatus {
        token: issued.token,
        expiration_timestamp: Some(Time(issued.expiration)),
    };
    Ok(respond::with_warnings(
        created(call, &req, &api_version),
        &response_warnings(&warnings, &outcome),
    ))
}

/// `POST tokenreviews`: a bad or foreign token is an answer (`authenticated: false` with
/// the reason), not an HTTP error.
pub(super) async fn review_token(
    app: &Arc<Standalone>,
    call: &RestRequest,
) -> Result<Response<Body>, ApiError> {
    let (mut review, api_version, warnings) = decode::<TokenReview>(app, call)?;
    if review.spec.token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    call.dry_run()?;
    review.status = Default::default();
    // The JWT authenticators know no audiences of their own: as Kubernetes wraps them
    // (audience-agnostic), a token they accept answers for this server's audiences that the
    // review asks about (all of them when it names none).
    let authentication = app.security.authentication();
    match authentication.authenticate(&review.spec.token).await {
        Verdict::NotOurs => {}
        Verdict::Accepted(user) => {
            let ours = app.security.tokens.api_audiences();
            let audiences: Vec<String> = if review.spec.audiences.is_empty() {
                ours.to_vec()
            } else {
                ours.iter()
                    .filter(|a| review.spec.audiences.contains(a))
                    .cloned()
                    .collect()
            };
            if audiences.is_empty() {
                review.status.error = format!(
                    "token audiences {:?} are invalid for the target audiences {:?}",
                    ours, review.spec.audiences
                );
            } else {
                review.status.authenticated = true;
                review.status.user = Some(svc_core::user::UserInfo::clone(&user));
                review.status.audiences = audiences;
            }
            review.metadata.creation_timestamp = Some(Time::now());
            return Ok(respond::with_warnings(
                created(call, &review, &api_version),
                &warnings,
            ));
        }
        Verdict::Refused(e) => {
            review.status.error = e;
            review.metadata.creation_timestamp = Some(Time::now());
            return Ok(respond::with_warnings(
                created(call, &review, &api_version),
                &warnings,
            ));
        }
    }
    match app
        .security
        .tokens
        .authenticate(
            &review.spec.token,
            &review.spec.audiences,
            &app.registry.caches,
            app.registry.store.as_ref(),
        )
        .await
    {
        Ok(a) => {
            review.status.authenticated = true;
            review.status.user = Some(a.user);
            review.status.audiences = a.audiences;
        }
        Err(e) => review.status.error = e.to_string(),
    }
    review.metadata.creation_timestamp = Some(Time::now());
    Ok(respond::with_warnings(
        created(call, &review, &api_version),
        &warnings,
    ))
}
