//! The resource registry: every served kind, one line each in `kinds!` below. Routing,
//! discovery, OpenAPI, caches, codecs, Table, apply and field selectors all read it; nothing
//! else in the workspace keeps a table of these kinds (`core/tests/architecture.rs` checks).

use crate::codec::ProtoKind;
use crate::kinds::{
    CertificateSigningRequest, Event, MutatingWebhookConfiguration, Namespace, Secret,
    ServiceAccount, TokenReview, ValidatingWebhookConfiguration,
};
use crate::resource::{Resource, ResourceInfo};

/// Every served kind: the object model plus its protobuf form.
pub trait Kind: Resource + ProtoKind {}
impl<T: Resource + ProtoKind> Kind for T {}

/// Generic code run for one kind chosen at run time: `visit` is called with the kind's type.
pub trait KindVisitor {
    type Output;
    fn visit<T: Kind>(self) -> Self::Output;
}

macro_rules! kinds {
    ($($kind:ty),+ $(,)?) => {
        /// Every served resource type, in discovery order.
        pub fn all() -> &'static [&'static ResourceInfo] {
            static ALL: &[&ResourceInfo] = &[$(<$kind as Resource>::INFO),+];
            ALL
        }

        /// Runs `visitor` with the type of the kind `info` describes (None if it is not
        /// registered).
        pub fn visit<V: KindVisitor>(info: &ResourceInfo, visitor: V) -> Option<V::Output> {
            $(
                if std::ptr::eq(info, <$kind as Resource>::INFO) {
                    return Some(visitor.visit::<$kind>());
                }
            )+
            None
        }
    };
}

kinds!(
    Namespace,
    ServiceAccount,
    Secret,
    Event,
    CertificateSigningRequest,
    TokenReview,
    ValidatingWebhookConfiguration,
    MutatingWebhookConfiguration
);

/// The registered type whose `kind` is `kind` (`ServiceAccount`).
pub fn by_kind(kind: &str) -> Option<&'static ResourceInfo> {
    all().iter().copied().find(|r| r.kind == kind)
}

/// The type served at `/api/v1/<plural>` (group "") or `/apis/<group>/<version>/<plural>`.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    all()
        .iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The API groups served under `/apis` (the core group is served at `/api`), with versions.
pub fn groups() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for r in all().iter().filter(|r| !r.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, vs)) if !vs.contains(&r.version) => vs.push(r.version),
            Some(_) => {}
            None => out.push((r.group, vec![r.version])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_namespaces_apart() {
        let sa = lookup("", "v1", "serviceaccounts").unwrap();
        assert_eq!(sa.key("ns", "a"), b"/registry/serviceaccounts/ns/a");
        assert_eq!(sa.prefix(Some("ns")), b"/registry/serviceaccounts/ns/");
        assert_eq!(sa.prefix(None), b"/registry/serviceaccounts/");
        let ns = lookup("", "v1", "namespaces").unwrap();
        assert_eq!(
            ns.key("", "kube-system"),
            b"/registry/namespaces/kube-system"
        );
        assert!(lookup("", "v1", "pods").is_none());
    }
}
