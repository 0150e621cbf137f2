//! The `Resource` trait every served kind implements, and `ResourceInfo`, the static facts
//! (names, scope, verbs) that routing, discovery and storage keys are derived from.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::meta::ObjectMeta;
use crate::patch::strategy::{MergeStrategies, Strategy};
use crate::user::UserInfo;
use crate::validation::declarative::Rule;
use crate::validation::{ErrorList, NameRule};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Namespaced,
    Cluster,
}

/// Static description of one resource type.
#[derive(Debug)]
pub struct ResourceInfo {
    /// API group; empty for the core group (`/api/v1`).
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    /// Resource name in paths (`serviceaccounts`).
    pub plural: &'static str,
    pub singular: &'static str,
    pub short_names: &'static [&'static str],
    pub scope: Scope,
    pub verbs: &'static [&'static str],
    pub name_rule: NameRule,
    /// Field selectors beyond `metadata.name` and `metadata.namespace`.
    pub extra_fields: &'static [&'static str],
    /// Whether a PUT of a missing object creates it (Kubernetes' `AllowCreateOnUpdate`).
    pub allow_create_on_update: bool,
    /// Whether a DELETE that removes the object answers with it (Kubernetes'
    /// `ReturnDeletedObject`); otherwise with a `Status` naming it. An object that finalizers
    /// keep is answered itself either way.
    pub delete_returns_object: bool,
    /// How fields beyond `metadata` merge (strategic merge patch and apply): dotted paths.
    pub merge_strategies: &'static [(&'static str, Strategy)],
    /// `Table` columns after `Name`; empty means Kubernetes' default (`Created At`).
    pub columns: &'static [Column],
    /// The OpenAPI properties of the kind beyond `apiVersion`, `kind` and `metadata`.
    pub schema: fn() -> serde_json::Value,
    /// Subresources (`status`, `approval`, `token`) and the verbs each serves.
    pub subresources: &'static [SubresourceInfo],
    /// Whether objects are kept in the store (and so listed, watched and cached); a review
    /// (`TokenReview`) is only created and answered.
    pub stored: bool,
    /// Whether every write of an object gives it the server's time to live for the kind
    /// (`--event-ttl` for Events), after which the store removes it on its own.
    pub expires: bool,
}

/// One `Table` column of a kind: its definition and how a cell is read from the object's
/// JSON form.
#[derive(Debug)]
pub struct Column {
    pub name: &'static str,
    /// `string`, `integer`, `date`, ...
    pub ty: &'static str,
    pub format: &'static str,
    pub priority: u32,
    pub description: &'static str,
    /// The cell of an object (its JSON form); `now` is when the table is built, for ages.
    pub cell: fn(&serde_json::Value, time::OffsetDateTime) -> serde_json::Value,
}

/// A subresource of a kind, as discovery lists it (`certificatesigningrequests/approval`).
#[derive(Debug)]
pub struct SubresourceInfo {
    pub name: &'static str,
    pub verbs: &'static [&'static str],
    /// The kind the subresource reads and writes (`TokenRequest` for `serviceaccounts/token`).
    pub kind: &'static str,
    /// Its group and version, when they are not the parent's.
    pub group_version: Option<(&'static str, &'static str)>,
}

/// Where every key of the store starts, as in Kubernetes' etcd layout.
const REGISTRY: &str = "/registry/";

/// Verbs of a status-like subresource: read and write a part of the parent object.
pub const SUBRESOURCE_VERBS: &[&str] = &["get", "patch", "update"];

/// An empty schema: a kind with no properties beyond its metadata.
pub fn no_schema() -> serde_json::Value {
    serde_json::json!({})
}

pub const STANDARD_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

impl ResourceInfo {
    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn namespaced(&self) -> bool {
        self.scope == Scope::Namespaced
    }

    /// The merge strategies strategic merge patch and apply use for this kind.
    pub const fn strategies(&self) -> MergeStrategies {
        MergeStrategies::new(self.merge_strategies)
    }

    /// The store key of one object: `/registry/<plural>/[<namespace>/]<name>`.
    pub fn key(&self, namespace: &str, name: &str) -> Vec<u8> {
        let mut k = self.prefix_with_room(Some(namespace), name.len());
        k.extend_from_slice(name.as_bytes());
        k
    }

    /// The key prefix of a collection: every object of the type, or of one namespace.
    /// Ends in `/` so `ns-a` never matches `ns-ab`.
    pub fn prefix(&self, namespace: Option<&str>) -> Vec<u8> {
        self.prefix_with_room(namespace, 0)
    }

    /// [`Self::prefix`] in a buffer sized for it and `room` more bytes, exactly: a key is kept
    /// for its object's life (store writes, the cache), and a buffer grown by doubling would
    /// keep up to twice its length.
    fn prefix_with_room(&self, namespace: Option<&str>, room: usize) -> Vec<u8> {
        let ns = match (self.scope, namespace) {
            (Scope::Namespaced, Some(ns)) => ns,
            _ => "",
        };
        let len = [REGISTRY.len(), self.plural.len(), ns.len(), room, 2]
            .iter()
            .fold(0usize, |n, l| n.saturating_add(*l));
        let mut k = Vec::with_capacity(len);
        k.extend_from_slice(REGISTRY.as_bytes());
        k.extend_from_slice(self.plural.as_bytes());
        k.push(b'/');
        if !ns.is_empty() {
            k.extend_from_slice(ns.as_bytes());
            k.push(b'/');
        }
        k
    }

    /// Whether `field` may be used in a field selector on this type.
    pub fn supports_field(&self, field: &str) -> bool {
        field == "metadata.name"
            || (field == "metadata.namespace" && self.namespaced())
            || self.extra_fields.contains(&field)
    }
}

/// A served kind. Generic machinery (REST handlers, the watch cache) is written once over it,
/// so adding a kind is one struct, one `impl Resource`, and one line in the registry.
pub trait Resource: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {
    const INFO: &'static ResourceInfo;

    fn meta(&self) -> &ObjectMeta;
    fn meta_mut(&mut self) -> &mut ObjectMeta;

    /// Sets `apiVersion` and `kind` to this type's.
    fn set_type_meta(&mut self);
    /// The `apiVersion` and `kind` the object carries, to reject a body of the wrong type.
    fn type_meta(&self) -> (&str, &str);

    /// Server-side defaulting and clearing on create (e.g. status a client may not set).
    fn prepare_for_create(&mut self) {}
    /// What a create records about its requester (a CertificateSigningRequest's
    /// `spec.username`, `groups`, ...); runs after `prepare_for_create`, before validation.
    fn prepare_for_create_by(&mut self, _user: &UserInfo) {}
    /// The same on update; `old` is the stored object.
    fn prepare_for_update(&mut self, _old: &Self) {}

    /// Kind-specific validation; metadata is validated generically.
    fn validate(&self) -> ErrorList {
        ErrorList::default()
    }
    /// Kind-specific update validation (immutable fields); defaults to `validate`.
    fn validate_update(&self, _old: &Self) -> ErrorList {
        self.validate()
    }
    /// The kind's declarative validation rules (metadata included), run beside the
    /// hand-written validation per the `DeclarativeValidation` gates; none by default.
    fn declarative_rules() -> &'static [Rule] {
        &[]
    }

    /// Whether kind-specific finalizers (a Namespace's `spec.finalizers`) still hold deletion,
    /// the way `metadata.finalizers` does for every kind.
    fn has_kind_finalizers(&self) -> bool {
        false
    }
    /// Called when deletion is requested and the object is kept until finalized.
    fn mark_terminating(&mut self) {}

    /// Value of a kind-specific field selector listed in `INFO.extra_fields`.
    fn field_value(&self, _field: &str) -> Option<String> {
        None
    }

    /// A write through the subresource `sub` (listed in `INFO.subresources`): `self` is the
    /// object as sent, `old` the stored one; keep from `self` only what the subresource may
    /// change, and stamp what it records with `now`. The default refuses: a kind serves no
    /// writable subresource unless it says so.
    fn prepare_for_subresource_update(
        &mut self,
        sub: &str,
        _old: &Self,
        _now: crate::meta::Time,
    ) -> Result<(), crate::status::ApiError> {
        Err(crate::status::ApiError::MethodNotAllowed(format!(
            "the server does not allow updates through the {sub} subresource of {}",
            Self::INFO.plural
        )))
    }
    /// Validation of a write through the subresource `sub`; defaults to `validate_update`.
    fn validate_subresource_update(&self, _sub: &str, old: &Self) -> ErrorList {
        self.validate_update(old)
    }
}

/// The accessors of every kind whose struct has `api_version`, `kind` and `metadata` fields;
/// the type header comes from the kind's `INFO`, so the two cannot disagree.
macro_rules! object_accessors {
    () => {
        fn meta(&self) -> &$crate::meta::ObjectMeta {
            &self.metadata
        }
        fn meta_mut(&mut self) -> &mut $crate::meta::ObjectMeta {
            &mut self.metadata
        }
        fn set_type_meta(&mut self) {
            self.api_version = <Self as $crate::resource::Resource>::INFO.api_version();
            self.kind = <Self as $crate::resource::Resource>::INFO.kind.into();
        }
        fn type_meta(&self) -> (&str, &str) {
            (&self.api_version, &self.kind)
        }
    };
}
pub(crate) use object_accessors;

/// The value of any supported field selector of `obj`.
pub fn field_value<T: Resource>(obj: &T, field: &str) -> Option<String> {
    match field {
        "metadata.name" => Some(obj.meta().name.clone()),
        "metadata.namespace" => Some(obj.meta().namespace.clone()),
        _ => obj.field_value(field),
    }
}
