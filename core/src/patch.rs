//! Patches and server-side apply over JSON values, without I/O: JSON Patch (RFC 6902), JSON
//! merge patch (RFC 7386), strategic merge patch for the built-in kinds, field sets in the
//! `FieldsV1` format and the `managedFields` bookkeeping of server-side apply.
//!
//! Everything here works on `serde_json::Value`: typed objects go through JSON on the way in
//! and out (`serde_json::to_value`, then `object::decode_json`-style checks), which is what
//! Kubernetes does too (it patches the versioned JSON and decodes the result).

pub mod fieldset;
pub mod json_patch;
pub mod managed;
pub mod merge;
pub mod strategic;
pub mod strategy;

#[cfg(test)]
mod tests;

use crate::status::ApiError;

/// Which patch a `PATCH` body is, from its `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    /// The patch type of a media type (parameters such as `charset` ignored); `None` when it
    /// is not one of the four.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let essence = ct.split(';').next().unwrap_or_default().trim();
        match essence.to_ascii_lowercase().as_str() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Applies a non-apply patch to `original`, an object of the kind whose merge strategies are
/// `kind`.
pub fn apply_patch(
    kind: strategy::MergeStrategies,
    patch_type: PatchType,
    original: &serde_json::Value,
    patch: &[u8],
) -> Result<serde_json::Value, ApiError> {
    match patch_type {
        PatchType::Json => json_patch::apply(original, patch),
        PatchType::Merge => {
            let p = parse_object_patch(patch)?;
            Ok(merge::apply(original, &p))
        }
        PatchType::Strategic => {
            let p = parse_object_patch(patch)?;
            strategic::apply(kind, original, &p)
        }
        PatchType::Apply => Err(ApiError::internal(
            "apply patches go through managed::apply, not apply_patch",
        )),
    }
}

/// A merge or strategic patch body: a JSON object (Kubernetes answers 400 otherwise).
fn parse_object_patch(patch: &[u8]) -> Result<serde_json::Value, ApiError> {
    let v: serde_json::Value = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "error decoding patch: a merge patch must be a JSON object",
        ));
    }
    Ok(v)
}
