//! Who made a request, as the object model sees it (Kubernetes' `user.Info`): kinds that
//! record their requester (a CertificateSigningRequest's `spec.username`, ...) read it on
//! create through `Resource::prepare_for_create_by`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// An authenticated identity, shaped like `authentication.svc.io/v1` UserInfo.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}
