//! The one decoder of object bodies: every create, update and subresource action reads its
//! body here, in the format its `Content-Type` names (JSON, YAML, CBOR or protobuf), with
//! field validation (`fieldValidation`: unknown and duplicate fields warned about, refused
//! under `Strict`, or ignored) and the body's `apiVersion` and `kind` checked.

use serde_json::Value;
use svc_core::codec;
use svc_core::registry::Kind;
use svc_core::strict as decode;
use svc_core::{ApiError, object};

use super::call::RestRequest;
use crate::http::api::Standalone;
use crate::http::negotiate::{self, Format};

/// Which `apiVersion` a body may name (an empty one always passes: the path says the type).
#[derive(Clone, Copy)]
pub enum Versions {
    /// The kind's own only.
    Own,
    /// Any the predicate accepts: the review kinds also take Kubernetes' name of their group.
    Accepted(fn(&str) -> bool),
}

/// A decoded body.
pub struct Decoded<T> {
    pub object: T,
    /// Field validation's warnings (unknown and duplicate fields under `Warn`).
    pub warnings: Vec<String>,
    /// The `apiVersion` the body named, or the kind's own when it named none.
    pub api_version: String,
}

/// Decodes the request body as a `T`.
pub fn decode_object<T: Kind>(
    app: &Standalone,
    call: &RestRequest,
    versions: Versions,
) -> Result<Decoded<T>, ApiError> {
    let format = negotiate::request_format(&call.parts.headers, &app.api.opts.feature_gates)?;
    let validation = call.field_validation()?;
    if call.body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let bad = |e: &dyn std::fmt::Display| {
        ApiError::bad_request(format!("error decoding {} body: {e}", T::INFO.kind))
    };
    // YAML and CBOR go through a JSON value, so unknown fields are found the same way (both
    // parsers refuse duplicate keys themselves).
    let (value, mut problems) = match format {
        Format::Json => decode::parse_json(&call.body).map_err(|e| bad(&e))?,
        Format::Yaml => (codec::yaml::decode(&call.body)?, vec![]),
        Format::Cbor => (codec::cbor::decode(&call.body)?, vec![]),
        Format::Protobuf(_) => {
            let (tm, raw) = codec::decode_envelope(&call.body)?;
            check_type::<T>(&tm.api_version, &tm.kind, versions)?;
            let mut obj = T::from_proto_bytes(&raw)?;
            obj.set_type_meta();
            return Ok(Decoded {
                object: obj,
                warnings: vec![],
                api_version: named_or_own::<T>(tm.api_version),
            });
        }
        Format::Table | Format::PartialMetadata { .. } => {
            return Err(ApiError::UnsupportedMediaType(
                "a Table or partial metadata is not a request body".into(),
            ));
        }
    };
    let text = |k: &str| {
        value
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let (mut obj, unknown): (T, _) = decode::decode_value(value).map_err(|e| bad(&e))?;
    problems.extend(unknown);
    let warnings = validation.check(problems)?;
    check_type::<T>(&api_version, &kind, versions)?;
    obj.set_type_meta();
    Ok(Decoded {
        object: obj,
        warnings,
        api_version: named_or_own::<T>(api_version),
    })
}

fn named_or_own<T: Kind>(api_version: String) -> String {
    if api_version.is_empty() {
        T::INFO.api_version()
    } else {
        api_version
    }
}

/// Refuses a body whose `kind` or `apiVersion` names another type.
fn check_type<T: Kind>(api_version: &str, kind: &str, versions: Versions) -> Result<(), ApiError> {
    match versions {
        Versions::Own => object::check_type_header::<T>(api_version, kind),
        Versions::Accepted(accepts) => {
            // The kind is checked as for any type; the version by the predicate.
            object::check_type_header::<T>("", kind)?;
            if !api_version.is_empty() && !accepts(api_version) {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({api_version}) does not match the expected \
                     API version ({})",
                    T::INFO.api_version()
                )));
            }
            Ok(())
        }
    }
}
