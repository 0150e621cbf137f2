//! `ImageReview` (`imagepolicy.svc.io/v1alpha1`): what an image-policy backend is asked about
//! a pod's images, and its answer. This server serves no pods, so nothing sends one; the
//! types and their rules exist for `validate-config` and for tools that speak the protocol.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ConfigKind, Path};
use svc_core::meta::ObjectMeta;
use svc_core::validation::{self, ErrorList};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageReview {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<ImageReviewSpec>,
    /// Filled by the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ImageReviewStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageReviewSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<ImageReviewContainerSpec>,
    /// The pod's annotations that match the configured pattern.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageReviewContainerSpec {
    /// `image:tag` or `image@<digest>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageReviewStatus {
    /// Required: whether every image is allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<bool>,
    /// Empty unless not allowed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Keys without a prefix: the admission controller adds its own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
}

impl ConfigKind for ImageReview {
    const API_VERSIONS: &'static [&'static str] = &["imagepolicy.svc.io/v1alpha1"];
    const KIND: &'static str = "ImageReview";

    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        let spec_path = Path::root("spec");
        match &self.spec {
            None => errors.required(spec_path.as_str(), ""),
            Some(spec) => {
                let containers = spec_path.child("containers");
                for (i, c) in spec.containers.iter().enumerate() {
                    let at = containers.index(i).child("image");
                    if c.image.is_empty() {
                        errors.required(at.as_str(), "");
                    } else if let Some(problem) = image_problem(&c.image) {
                        errors.invalid(at.as_str(), &c.image, problem);
                    }
                }
                if !spec.namespace.is_empty()
                    && let Err(e) = validation::dns1123_label(&spec.namespace)
                {
                    errors.invalid(spec_path.child("namespace").as_str(), &spec.namespace, &e);
                }
            }
        }
        if let Some(status) = &self.status {
            let at = Path::root("status");
            match status.allowed {
                None => errors.required(at.child("allowed").as_str(), ""),
                Some(true) if !status.reason.is_empty() => errors.invalid(
                    at.child("reason").as_str(),
                    &status.reason,
                    "must be empty when the images are allowed",
                ),
                _ => {}
            }
            let annotations = at.child("auditAnnotations");
            for key in status.audit_annotations.keys() {
                if key.is_empty() || key.contains('/') {
                    errors.invalid(
                        annotations.key(key).as_str(),
                        key,
                        "must be a non-empty key without a prefix (the admission controller adds it)",
                    );
                }
            }
        }
        errors
    }
}

/// Why `image` is not an image reference of the form `name[:tag]` or `name@<digest>`.
fn image_problem(image: &str) -> Option<&'static str> {
    if image.chars().any(char::is_whitespace) {
        return Some("must not contain whitespace");
    }
    if let Some((name, digest)) = image.split_once('@') {
        let (algorithm, hex) = digest.split_once(':').unwrap_or(("", ""));
        if name.is_empty() || algorithm.is_empty() || hex.is_empty() {
            return Some("a digest reference is written name@<algorithm>:<hex>");
        }
        return None;
    }
    if image.starts_with(':') || image.ends_with(':') || image.ends_with('/') {
        return Some("must be name:tag or name@<digest>");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load;

    const HEAD: &str = "apiVersion: imagepolicy.svc.io/v1alpha1\nkind: ImageReview\n";

    #[test]
    fn valid_reviews_load() {
        let r: ImageReview = load(
            format!(
                "{HEAD}spec:\n  containers:\n  - image: nginx:1.27\n  - image: \
                 registry.example/app@sha256:0123abcd\n  annotations:\n    \
                 policy.example/mode: strict\n  namespace: team-a\nstatus:\n  allowed: false\n  \
                 reason: unsigned image\n  auditAnnotations:\n    checked: \"2\"\n"
            )
            .as_bytes(),
        )
        .unwrap();
        let spec = r.spec.unwrap();
        assert_eq!(spec.containers.len(), 2);
        assert_eq!(r.status.unwrap().allowed, Some(false));
        load::<ImageReview>(format!("{HEAD}spec: {{}}\n").as_bytes()).unwrap();
    }

    #[test]
    fn invalid_reviews_name_their_fields() {
        for (body, expected) in [
            ("metadata: {}\n", vec!["spec"]),
            (
                "spec:\n  containers:\n  - {}\n",
                vec!["spec.containers[0].image"],
            ),
            (
                "spec:\n  containers:\n  - image: nginx\n  - image: \"a b\"\n",
                vec!["spec.containers[1].image"],
            ),
            (
                "spec:\n  containers:\n  - image: app@sha256\n",
                vec!["spec.containers[0].image"],
            ),
            ("spec:\n  namespace: Team_A\n", vec!["spec.namespace"]),
            ("spec: {}\nstatus:\n  reason: x\n", vec!["status.allowed"]),
            (
                "spec: {}\nstatus:\n  allowed: true\n  reason: x\n",
                vec!["status.reason"],
            ),
            (
                "spec: {}\nstatus:\n  allowed: true\n  auditAnnotations:\n    a/b: c\n",
                vec!["status.auditAnnotations[a/b]"],
            ),
            ("spec:\n  images: []\n", vec!["spec.images"]),
        ] {
            let err = load::<ImageReview>(format!("{HEAD}{body}").as_bytes()).unwrap_err();
            let fields: Vec<&str> = err.errors.0.iter().map(|c| c.field.as_str()).collect();
            assert_eq!(fields, expected, "{body}");
        }
    }
}
