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

use super::call::{Call, admission_attributes, path_namespace, read_current, response_warnings};
use crate::http::api::Api;
use crate::http::negotiate::{self, Format};
use crate::http::respond::{self, Body};
use crate::registry::admission::{Operation, Outcome};
use crate::security::jwt::Outcome as JwtOutcome;
use crate::security::tokens::BoundSecret;
use svc_core::registry::Kind;

/// A request body of `T`, with the `apiVersion` it named (either of the group's names).
fn decode<T: Kind>(app: &Api, call: &Call) -> Result<(T, String), ApiError> {
    let format = negotiate::request_format(&call.parts.headers, &app.opts.feature_gates)?;
    if call.body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let bad = |e: &dyn std::fmt::Display| {
        ApiError::bad_request(format!("error decoding {} body: {e}", T::INFO.kind))
    };
    let (mut obj, api_version, kind): (T, String, String) = match format {
        Format::Json | Format::Yaml | Format::Cbor => {
            let value: Value = match format {
                Format::Json => serde_json::from_slice(&call.body).map_err(|e| bad(&e))?,
                Format::Yaml => codec::yaml::decode(&call.body)?,
                _ => codec::cbor::decode(&call.body)?,
            };
            let text = |k: &str| {
                value
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            let (av, kind) = (text("apiVersion"), text("kind"));
            (
                serde_json::from_value(value).map_err(|e| bad(&e))?,
                av,
                kind,
            )
        }
        Format::Protobuf(_) => {
            let (tm, raw) = codec::decode_envelope(&call.body)?;
            (T::from_proto_bytes(&raw)?, tm.api_version, tm.kind)
        }
        Format::Table => {
            return Err(ApiError::UnsupportedMediaType(
                "a Table is not a request body".into(),
            ));
        }
    };
    if !kind.is_empty() && kind != T::INFO.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the body ({kind}) does not match the expected kind ({})",
            T::INFO.kind
        )));
    }
    if !api_version.is_empty() && !is_authentication_v1(&api_version) {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API \
             version ({})",
            T::INFO.api_version()
        )));
    }
    let api_version = if api_version.is_empty() {
        T::INFO.api_version()
    } else {
        api_version
    };
    obj.set_type_meta();
    Ok((obj, api_version))
}

/// `obj` as a 201 in the negotiated format, under the `apiVersion` the client used.
fn created<T: Kind>(call: &Call, obj: &T, api_version: &str) -> Response<Body> {
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
    app: &Arc<Api>,
    call: &Call,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let (mut req, api_version) = decode::<TokenRequest>(app, call)?;
    let dry_run = call.query.dry_run()?;
    let ns = path_namespace::<ServiceAccount>(&call.route)?.to_string();
    // Admission sees a create of `serviceaccounts/token` whose object is the TokenRequest.
    let mut outcome = Outcome::default();
    let attrs = admission_attributes::<ServiceAccount>(call, Operation::Create, &ns, name, dry_run);
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
    let (sa, _) = read_current::<ServiceAccount>(app, &sa_key, name).await?;
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
        let (secret, _) = read_current::<Secret>(app, &key, &b.name).await?;
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
        &response_warnings(&[], &outcome),
    ))
}

/// `POST tokenreviews`: a bad or foreign token is an answer (`authenticated: false` with
/// the reason), not an HTTP error.
pub(super) async fn review_token(app: &Arc<Api>, call: &Call) -> Result<Response<Body>, ApiError> {
    let (mut review, api_version) = decode::<TokenReview>(app, call)?;
    if review.spec.token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    call.query.dry_run()?;
    review.status = Default::default();
    // The JWT authenticators know no audiences of their own: as Kubernetes wraps them
    // (audience-agnostic), a token they accept answers for this server's audiences that the
    // review asks about (all of them when it names none).
    let authentication = app.security.authentication();
    match authentication.authenticate(&review.spec.token).await {
        JwtOutcome::NotOurs => {}
        JwtOutcome::Accepted(user) => {
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
            return Ok(created(call, &review, &api_version));
        }
        JwtOutcome::Refused(e) => {
            review.status.error = e;
            review.metadata.creation_timestamp = Some(Time::now());
            return Ok(created(call, &review, &api_version));
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
    Ok(created(call, &review, &api_version))
}
