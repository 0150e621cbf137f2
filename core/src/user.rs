//! Who made a request, as the object model sees it (Kubernetes' `user.Info`): kinds that
//! record their requester (a CertificateSigningRequest's `spec.username`, ...) read it on
//! create through `Resource::prepare_for_create_by`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Every authenticated user is in this group.
pub const GROUP_AUTHENTICATED: &str = "system:authenticated";

/// An authenticated identity, shaped like Kubernetes' `authentication.k8s.io/v1` UserInfo.
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

impl UserInfo {
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// The protobuf form (`authentication.k8s.io.v1.UserInfo`, tags from its generated.proto).
pub(crate) mod wire {
    use std::collections::BTreeMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct ExtraValue {
        #[prost(string, repeated, tag = "1")]
        pub items: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct UserInfo {
        #[prost(string, tag = "1")]
        pub username: String,
        #[prost(string, tag = "2")]
        pub uid: String,
        #[prost(string, repeated, tag = "3")]
        pub groups: Vec<String>,
        #[prost(btree_map = "string, message", tag = "4")]
        pub extra: BTreeMap<String, ExtraValue>,
    }

    pub(crate) fn to_wire(u: &super::UserInfo) -> UserInfo {
        UserInfo {
            username: u.username.clone(),
            uid: u.uid.clone(),
            groups: u.groups.clone(),
            extra: u
                .extra
                .iter()
                .map(|(k, v)| (k.clone(), ExtraValue { items: v.clone() }))
                .collect(),
        }
    }

    pub(crate) fn from_wire(u: UserInfo) -> super::UserInfo {
        super::UserInfo {
            username: u.username,
            uid: u.uid,
            groups: u.groups,
            extra: u.extra.into_iter().map(|(k, v)| (k, v.items)).collect(),
        }
    }
}
